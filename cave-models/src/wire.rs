//! The OpenAI chat-completions wire format, as far as the adapters read and write it.

use serde::ser::{SerializeMap as _, SerializeSeq as _};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value as Json};

/// The request body, written straight from the conversation (no copy of it is made: a long
/// conversation is sent at every step). The user's extra parameters are sent as given and
/// replace a field of the same name.
pub(crate) struct RequestBody<'a> {
    pub(crate) model: &'a str,
    pub(crate) messages: &'a [cave_core::ChatMessage],
    pub(crate) stream_usage: bool,
    pub(crate) max_tokens: Option<u32>,
    pub(crate) send_reasoning: bool,
    pub(crate) extra: &'a Map<String, Json>,
}

impl Serialize for RequestBody<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let ours = |key: &str| !self.extra.contains_key(key);
        let mut map = serializer.serialize_map(None)?;
        if ours("model") {
            map.serialize_entry("model", self.model)?;
        }
        if ours("messages") {
            map.serialize_entry("messages", &Messages(self))?;
        }
        if ours("stream") {
            map.serialize_entry("stream", &true)?;
        }
        if self.stream_usage && ours("stream_options") {
            map.serialize_entry("stream_options", &StreamOptions)?;
        }
        if let Some(max) = self.max_tokens
            && ours("max_tokens")
        {
            // `max_tokens` is what OpenAI-compatible servers read (OpenAI's own API too).
            map.serialize_entry("max_tokens", &max)?;
        }
        for (key, value) in self.extra {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// `{"include_usage": true}`.
struct StreamOptions;

impl Serialize for StreamOptions {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry("include_usage", &true)?;
        map.end()
    }
}

struct Messages<'a, 'b>(&'b RequestBody<'a>);

impl Serialize for Messages<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use cave_core::ChatRole;
        let body = self.0;
        let mut seq = serializer.serialize_seq(Some(body.messages.len()))?;
        for message in body.messages {
            let reasoning = match message.reasoning.as_deref() {
                Some(reasoning) if body.send_reasoning && message.role == ChatRole::Assistant => {
                    Some(reasoning)
                }
                _ => None,
            };
            seq.serialize_element(&WireMessage { message, reasoning })?;
        }
        seq.end()
    }
}

/// One message: its role and content, and for an assistant turn its reasoning when asked to.
struct WireMessage<'a> {
    message: &'a cave_core::ChatMessage,
    reasoning: Option<&'a str>,
}

impl Serialize for WireMessage<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use cave_core::ChatRole;
        let message = self.message;
        let role = match message.role {
            ChatRole::System => "system",
            ChatRole::User => "user",
            ChatRole::Assistant => "assistant",
        };
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("role", role)?;
        if message.role == ChatRole::User && !message.images.is_empty() {
            map.serialize_entry("content", &UserParts(message))?;
        } else {
            map.serialize_entry("content", &message.content)?;
        }
        if let Some(reasoning) = self.reasoning {
            map.serialize_entry("reasoning_content", reasoning)?;
        }
        map.end()
    }
}

/// A user message with images: its text, then each image as a `data:` URL.
struct UserParts<'a>(&'a cave_core::ChatMessage);

impl Serialize for UserParts<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let message = self.0;
        let mut seq = serializer.serialize_seq(Some(1 + message.images.len()))?;
        seq.serialize_element(&serde_json::json!({"type": "text", "text": message.content}))?;
        for image in &message.images {
            seq.serialize_element(&serde_json::json!({
                "type": "image_url",
                "image_url": {"url": image.data_url()},
            }))?;
        }
        seq.end()
    }
}

/// One streamed chunk. Every field is optional: providers differ, and metadata chunks (Azure
/// filter annotations) carry none of them.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ChatCompletionChunk {
    #[serde(default)]
    pub(crate) choices: Vec<ChunkChoice>,
    #[serde(default)]
    pub(crate) usage: Option<WireUsage>,
    /// Some proxies report a failure inside the stream.
    #[serde(default)]
    pub(crate) error: Option<ErrorObject>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ChunkChoice {
    /// A whole completion's `message` reads as the one delta it amounts to.
    #[serde(default, alias = "message")]
    pub(crate) delta: Option<ChunkDelta>,
    #[serde(default)]
    pub(crate) finish_reason: Option<String>,
}

/// A chunk's delta: the fields the adapters read (others, such as `role`, are ignored).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ChunkDelta {
    #[serde(default)]
    pub(crate) content: Option<String>,
    #[serde(default)]
    pub(crate) refusal: Option<String>,
    /// DeepSeek, vLLM and others.
    #[serde(default)]
    pub(crate) reasoning_content: Option<String>,
    /// OpenRouter, Ollama and others.
    #[serde(default)]
    pub(crate) reasoning: Option<String>,
    /// Tools the model called unasked (the agent answers them; the request offers none).
    #[serde(default)]
    pub(crate) tool_calls: Option<Vec<WireToolCall>>,
}

/// A tool call, or a piece of one in a stream (`index` says which call it continues).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct WireToolCall {
    #[serde(default)]
    pub(crate) index: Option<u32>,
    #[serde(default)]
    pub(crate) id: Option<String>,
    #[serde(default)]
    pub(crate) function: Option<WireFunction>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct WireFunction {
    #[serde(default)]
    pub(crate) name: Option<String>,
    /// A JSON text as the model wrote it (some servers send an object instead).
    #[serde(default)]
    pub(crate) arguments: Option<Json>,
}

impl WireToolCall {
    /// The core's piece of a tool call; `position` is the call's place when no index came.
    pub(crate) fn into_delta(self, position: usize) -> cave_core::ToolCallDelta {
        let index = self
            .index
            .unwrap_or_else(|| u32::try_from(position).unwrap_or(u32::MAX));
        let mut piece = cave_core::ToolCallDelta::new(index);
        piece.id = self.id;
        if let Some(function) = self.function {
            piece.name = function.name;
            piece.arguments = match function.arguments {
                Some(Json::String(text)) => text,
                Some(Json::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
        }
        piece
    }
}

/// A list of tool calls as the core's pieces.
pub(crate) fn tool_call_deltas(calls: Option<Vec<WireToolCall>>) -> Vec<cave_core::ToolCallDelta> {
    calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(position, call)| call.into_delta(position))
        .collect()
}

#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    pub(crate) prompt_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) completion_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) total_tokens: Option<u64>,
    /// OpenAI's breakdown of the prompt: `cached_tokens`.
    #[serde(default)]
    pub(crate) prompt_tokens_details: Option<serde_json::Value>,
    /// OpenAI's breakdown of the completion: `reasoning_tokens`.
    #[serde(default)]
    pub(crate) completion_tokens_details: Option<serde_json::Value>,
    /// The call's cost in US dollars, where the server says (OpenRouter; a LiteLLM proxy with
    /// `include_cost_in_streaming_usage`).
    #[serde(default)]
    pub(crate) cost: Option<serde_json::Value>,
}

impl WireUsage {
    /// Usage with a total: the provider's if it reported a non-zero one, else the sum.
    pub(crate) fn to_usage(&self) -> cave_core::Usage {
        let prompt = self.prompt_tokens.unwrap_or(0);
        let completion = self.completion_tokens.unwrap_or(0);
        let total = match self.total_tokens {
            Some(t) if t != 0 => t,
            _ => prompt + completion,
        };
        // Read leniently: a field of another type is no breakdown, not a broken chunk.
        let detail = |details: &Option<serde_json::Value>, key: &str| {
            details
                .as_ref()
                .and_then(|d| d.get(key))
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0)
        };
        cave_core::Usage::new(prompt, completion)
            .with_total(total)
            .with_cached(detail(&self.prompt_tokens_details, "cached_tokens"))
            .with_reasoning(detail(&self.completion_tokens_details, "reasoning_tokens"))
    }

    /// The cost the server reported in the usage, when it is a number of dollars.
    pub(crate) fn cost(&self) -> Option<f64> {
        let cost = match self.cost.as_ref()? {
            serde_json::Value::Number(n) => n.as_f64()?,
            serde_json::Value::String(s) => s.trim().parse().ok()?,
            _ => return None,
        };
        (cost.is_finite() && cost >= 0.0).then_some(cost)
    }
}

/// `{"error": {...}}`, the error body of OpenAI-compatible servers and LiteLLM.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ErrorBody {
    #[serde(default)]
    pub(crate) error: Option<ErrorObject>,
    /// Some servers put the message at the top level.
    #[serde(default)]
    pub(crate) message: Option<String>,
    #[serde(default)]
    pub(crate) detail: Option<Json>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ErrorObject {
    #[serde(default)]
    pub(crate) message: Option<String>,
    #[serde(default, rename = "type")]
    pub(crate) kind: Option<Json>,
    #[serde(default)]
    pub(crate) code: Option<Json>,
    /// An HTTP status some providers give with an error they report in the stream.
    #[serde(default)]
    pub(crate) status: Option<Json>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use cave_core::{ChatMessage, ChatRole, ImagePart};

    /// A user message with images is an array of parts: the text, then each image as a
    /// `data:` URL; without images it stays a string.
    #[test]
    fn images_go_as_image_url_parts_after_the_text() {
        let mut with_image = ChatMessage::new(ChatRole::User, "Output:\nfigure");
        with_image.images = vec![ImagePart::new("image/png", b"\x89PNG", 1, 1)];
        let messages = [ChatMessage::new(ChatRole::User, "plain"), with_image];
        let extra = Map::new();
        let body = RequestBody {
            model: "m",
            messages: &messages,
            stream_usage: false,
            max_tokens: None,
            send_reasoning: false,
            extra: &extra,
        };
        let json: Json = serde_json::from_slice(&serde_json::to_vec(&body).unwrap()).unwrap();
        assert_eq!(json["messages"][0]["content"], "plain");
        assert_eq!(
            json["messages"][1]["content"],
            serde_json::json!([
                {"type": "text", "text": "Output:\nfigure"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}}
            ])
        );
    }

    /// Every kind of message, reasoning sent or not, usage asked or not, extra parameters
    /// replacing a field: the body as async-openai's request types wrote it before.
    #[test]
    fn the_body_is_the_chat_completions_format() {
        let mut with_image = ChatMessage::new(ChatRole::User, "Output:\nfigure");
        with_image.images = vec![ImagePart::new("image/png", b"\x89PNG", 1, 1)];
        let mut assistant = ChatMessage::new(ChatRole::Assistant, "Sure \"x\" \u{1F600}");
        assistant.reasoning = Some("thought".into());
        let messages = [
            ChatMessage::new(ChatRole::System, "sys"),
            ChatMessage::new(ChatRole::User, "plain"),
            with_image,
            assistant,
            ChatMessage::new(ChatRole::Assistant, ""),
        ];
        let mut extra = Map::new();
        extra.insert("temperature".into(), serde_json::json!(0.2));
        extra.insert("max_tokens".into(), serde_json::json!(7));
        let none = Map::new();
        let cases = [
            (true, Some(100), true, &extra),
            (true, Some(100), true, &none),
            (false, None, false, &extra),
            (false, None, false, &none),
        ];
        for (case, golden) in cases.into_iter().zip(GOLDEN) {
            let (stream_usage, max_tokens, send_reasoning, extra) = case;
            let body = RequestBody {
                model: "m",
                messages: &messages,
                stream_usage,
                max_tokens,
                send_reasoning,
                extra,
            };
            let written: Json =
                serde_json::from_slice(&serde_json::to_vec(&body).unwrap()).unwrap();
            let expected: Json = serde_json::from_str(golden).unwrap();
            assert_eq!(written, expected);
        }
    }

    const GOLDEN: [&str; 4] = [
        r#"{"max_tokens":7,"messages":[{"content":"sys","role":"system"},{"content":"plain","role":"user"},{"content":[{"text":"Output:\nfigure","type":"text"},{"image_url":{"url":"data:image/png;base64,iVBORw=="},"type":"image_url"}],"role":"user"},{"content":"Sure \"x\" 😀","reasoning_content":"thought","role":"assistant"},{"content":"","role":"assistant"}],"model":"m","stream":true,"stream_options":{"include_usage":true},"temperature":0.2}"#,
        r#"{"max_tokens":100,"messages":[{"content":"sys","role":"system"},{"content":"plain","role":"user"},{"content":[{"text":"Output:\nfigure","type":"text"},{"image_url":{"url":"data:image/png;base64,iVBORw=="},"type":"image_url"}],"role":"user"},{"content":"Sure \"x\" 😀","reasoning_content":"thought","role":"assistant"},{"content":"","role":"assistant"}],"model":"m","stream":true,"stream_options":{"include_usage":true}}"#,
        r#"{"max_tokens":7,"messages":[{"content":"sys","role":"system"},{"content":"plain","role":"user"},{"content":[{"text":"Output:\nfigure","type":"text"},{"image_url":{"url":"data:image/png;base64,iVBORw=="},"type":"image_url"}],"role":"user"},{"content":"Sure \"x\" 😀","role":"assistant"},{"content":"","role":"assistant"}],"model":"m","stream":true,"temperature":0.2}"#,
        r#"{"messages":[{"content":"sys","role":"system"},{"content":"plain","role":"user"},{"content":[{"text":"Output:\nfigure","type":"text"},{"image_url":{"url":"data:image/png;base64,iVBORw=="},"type":"image_url"}],"role":"user"},{"content":"Sure \"x\" 😀","role":"assistant"},{"content":"","role":"assistant"}],"model":"m","stream":true}"#,
    ];
}

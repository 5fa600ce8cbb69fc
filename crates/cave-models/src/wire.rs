//! The OpenAI chat-completions wire format, as far as the adapters read and write it.

use serde::Deserialize;
use serde_json::{Map, Value as Json};

/// The request body: async-openai's `CreateChatCompletionRequest`, with what it does not
/// model added beside it (an assistant turn's `reasoning_content`, and the user's extra
/// parameters, sent as given).
pub(crate) struct RequestBody<'a> {
    pub(crate) model: &'a str,
    pub(crate) messages: &'a [cave_core::ChatMessage],
    pub(crate) stream_usage: bool,
    pub(crate) max_tokens: Option<u32>,
    pub(crate) send_reasoning: bool,
    pub(crate) extra: &'a Map<String, Json>,
}

/// A user message's content: its text, and its images as `data:` URLs after it.
fn user_content(
    message: &cave_core::ChatMessage,
) -> async_openai::types::chat::ChatCompletionRequestUserMessageContent {
    use async_openai::types::chat::{
        ChatCompletionRequestMessageContentPartImage, ChatCompletionRequestMessageContentPartText,
        ChatCompletionRequestUserMessageContent as Content,
        ChatCompletionRequestUserMessageContentPart as Part, ImageUrl,
    };
    if message.images.is_empty() {
        return Content::Text(message.content.clone());
    }
    let text = Part::Text(ChatCompletionRequestMessageContentPartText {
        text: message.content.clone(),
        prompt_cache_breakpoint: None,
    });
    let images = message.images.iter().map(|image| {
        Part::ImageUrl(ChatCompletionRequestMessageContentPartImage {
            image_url: ImageUrl {
                url: image.data_url(),
                detail: None,
            },
            prompt_cache_breakpoint: None,
        })
    });
    Content::Array(std::iter::once(text).chain(images).collect())
}

impl RequestBody<'_> {
    pub(crate) fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        use async_openai::types::chat::{
            ChatCompletionRequestAssistantMessage, ChatCompletionRequestMessage,
            ChatCompletionRequestSystemMessage, ChatCompletionRequestUserMessage,
            ChatCompletionStreamOptions, CreateChatCompletionRequest,
        };
        use cave_core::ChatRole;
        let messages = self
            .messages
            .iter()
            .map(|m| match m.role {
                ChatRole::System => {
                    ChatCompletionRequestMessage::System(ChatCompletionRequestSystemMessage {
                        content: m.content.as_str().into(),
                        name: None,
                    })
                }
                ChatRole::User => {
                    ChatCompletionRequestMessage::User(ChatCompletionRequestUserMessage {
                        content: user_content(m),
                        name: None,
                    })
                }
                ChatRole::Assistant => {
                    ChatCompletionRequestMessage::Assistant(ChatCompletionRequestAssistantMessage {
                        content: Some(m.content.as_str().into()),
                        ..Default::default()
                    })
                }
            })
            .collect();
        // `max_tokens` is what OpenAI-compatible servers read (OpenAI's own API takes it too).
        #[allow(deprecated)]
        let request = CreateChatCompletionRequest {
            model: self.model.to_owned(),
            messages,
            stream: Some(true),
            stream_options: self.stream_usage.then(|| ChatCompletionStreamOptions {
                include_usage: Some(true),
                ..Default::default()
            }),
            max_tokens: self.max_tokens,
            ..Default::default()
        };
        let mut body = serde_json::to_value(&request)?;
        if let Some(object) = body.as_object_mut() {
            if self.send_reasoning
                && let Some(Json::Array(wire)) = object.get_mut("messages")
            {
                for (message, ours) in wire.iter_mut().zip(self.messages) {
                    if let (Some(reasoning), Some(message)) =
                        (ours.reasoning.as_deref(), message.as_object_mut())
                        && ours.role == ChatRole::Assistant
                    {
                        message.insert("reasoning_content".to_owned(), reasoning.into());
                    }
                }
            }
            for (key, value) in self.extra {
                object.insert(key.clone(), value.clone());
            }
        }
        serde_json::to_vec(&body)
    }
}

/// A whole completion, as a server that ignores `stream: true` answers.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ChatCompletion {
    #[serde(default)]
    pub(crate) choices: Vec<CompletionChoice>,
    #[serde(default)]
    pub(crate) usage: Option<WireUsage>,
    #[serde(default)]
    pub(crate) error: Option<ErrorObject>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct CompletionChoice {
    #[serde(default)]
    pub(crate) message: Option<CompletionMessage>,
    #[serde(default)]
    pub(crate) finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct CompletionMessage {
    #[serde(default)]
    pub(crate) content: Option<String>,
    #[serde(default)]
    pub(crate) reasoning_content: Option<String>,
    #[serde(default)]
    pub(crate) reasoning: Option<String>,
    #[serde(default)]
    pub(crate) refusal: Option<String>,
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
    #[serde(default)]
    pub(crate) delta: Option<ChunkDelta>,
    #[serde(default)]
    pub(crate) finish_reason: Option<String>,
}

/// A chunk's delta: async-openai's, with the reasoning fields it does not model read beside it.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ChunkDelta {
    #[serde(flatten)]
    pub(crate) standard: async_openai::types::chat::ChatCompletionStreamResponseDelta,
    /// DeepSeek, vLLM and others.
    #[serde(default)]
    pub(crate) reasoning_content: Option<String>,
    /// OpenRouter, Ollama and others.
    #[serde(default)]
    pub(crate) reasoning: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    pub(crate) prompt_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) completion_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) total_tokens: Option<u64>,
}

impl WireUsage {
    /// Usage with a total: the provider's if it reported a non-zero one, else the sum.
    pub(crate) fn to_usage(self) -> cave_core::Usage {
        let prompt = self.prompt_tokens.unwrap_or(0);
        let completion = self.completion_tokens.unwrap_or(0);
        let total = match self.total_tokens {
            Some(t) if t != 0 => t,
            _ => prompt + completion,
        };
        cave_core::Usage::new(prompt, completion).with_total(total)
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
        let json: Json = serde_json::from_slice(&body.to_json().unwrap()).unwrap();
        assert_eq!(json["messages"][0]["content"], "plain");
        assert_eq!(
            json["messages"][1]["content"],
            serde_json::json!([
                {"type": "text", "text": "Output:\nfigure"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}}
            ])
        );
    }
}

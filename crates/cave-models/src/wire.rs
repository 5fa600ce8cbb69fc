//! The OpenAI chat-completions wire format, as far as the adapters read and write it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

/// A chat-completions request.
#[derive(Debug, Serialize)]
pub(crate) struct ChatCompletionRequest<'a> {
    pub(crate) model: &'a str,
    pub(crate) messages: Vec<WireMessage<'a>>,
    pub(crate) stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_tokens: Option<u32>,
    /// Extra parameters, sent as given (`temperature`, provider-specific fields, …).
    #[serde(flatten)]
    pub(crate) extra: &'a Map<String, Json>,
}

#[derive(Debug, Serialize)]
pub(crate) struct StreamOptions {
    pub(crate) include_usage: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct WireMessage<'a> {
    pub(crate) role: &'static str,
    pub(crate) content: &'a str,
    /// An assistant turn's reasoning, for providers that want it back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reasoning_content: Option<&'a str>,
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

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ChunkDelta {
    #[serde(default)]
    pub(crate) content: Option<String>,
    /// DeepSeek, vLLM and others.
    #[serde(default)]
    pub(crate) reasoning_content: Option<String>,
    /// OpenRouter, Ollama and others.
    #[serde(default)]
    pub(crate) reasoning: Option<String>,
    #[serde(default)]
    pub(crate) refusal: Option<String>,
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
        cave_core::Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: total,
        }
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
}

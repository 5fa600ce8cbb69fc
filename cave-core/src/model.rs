//! The `Model` seam: a chat model that streams.

use crate::{ChatMessage, Usage};
use async_trait::async_trait;
use futures_core::Stream;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// A chat model that streams its answer.
///
/// One required method, [`stream`](Model::stream), and [`info`](Model::info) for what the agent
/// needs to know about it. Implementations map provider failures into [`ModelError`] kinds;
/// the agent routes on those kinds (a prompt that is too long is compacted and retried, an
/// answer cut mid-stream is resumed). For retries before the first output, wrap the model in
/// `cave_models::Retrying` (and classify HTTP failures with `cave_models::classify_http`), as
/// the built-in adapters do.
///
/// # How a stream ends
///
/// A complete answer ends with a delta carrying a [`FinishReason`] (`Stop` for a normal end,
/// `Length` when the output cap cut it), optionally followed by a delta with the [`Usage`]; then
/// the stream ends. What the agent does otherwise:
/// - the stream ends without a finish reason: the answer was interrupted
///   ([`ModelErrorKind::StreamInterrupted`]); the partial answer is kept and resumed (up to
///   [`MAX_OUTPUT_RECOVERIES`](crate::MAX_OUTPUT_RECOVERIES) times), and a code block that was
///   already closed still runs;
/// - an `Err` item after content: the same, with that error's kind;
/// - an `Err` (from `stream` or as the first item) before any content: nothing was generated;
///   the run ends with `model_error` unless the kind is `PromptTooLong` (compacted and retried
///   once);
/// - no delta within the agent's `stream_idle_timeout`: `StreamStalled` (announce deliberate
///   waits with [`Delta::backoff`]);
/// - `Length`: the answer is resumed where it was cut.
#[async_trait]
pub trait Model: Send + Sync {
    /// Sends the request and returns the stream of deltas.
    ///
    /// An error here (or as the stream's first item) means nothing was generated.
    async fn stream(&self, request: ChatRequest) -> Result<DeltaStream, ModelError>;

    /// What the agent needs to know about this model.
    fn info(&self) -> ModelInfo;
}

/// The deltas of one streamed answer. Dropping it closes the underlying connection.
pub type DeltaStream = Pin<Box<dyn Stream<Item = Result<Delta, ModelError>> + Send>>;

/// A request to a chat model: the conversation, already in wire form.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ChatRequest {
    /// The messages, system prompt first.
    pub messages: Vec<ChatMessage>,
}

impl ChatRequest {
    /// A request for these messages.
    pub fn new(messages: Vec<ChatMessage>) -> Self {
        Self { messages }
    }
}

/// What a model declares about itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModelInfo {
    /// The model's identifier, e.g. `gpt-4o`.
    pub id: String,
    /// The output-token cap it is called with, if any (compaction reserves room for it).
    pub max_output_tokens: Option<u32>,
    /// The provider may withdraw an answer after streaming it (Azure-style asynchronous
    /// content filtering): the agent then reads the whole answer before running its code.
    pub filters_asynchronously: bool,
}

impl ModelInfo {
    /// Info with this identifier and no declarations.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            ..Self::default()
        }
    }
    /// Declares the output-token cap.
    pub fn with_max_output_tokens(mut self, tokens: Option<u32>) -> Self {
        self.max_output_tokens = tokens;
        self
    }
    /// Declares asynchronous content filtering.
    pub fn with_filters_asynchronously(mut self, yes: bool) -> Self {
        self.filters_asynchronously = yes;
        self
    }
}

/// Why a model stopped generating.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FinishReason {
    /// A natural end.
    Stop,
    /// The output-token cap cut the answer.
    Length,
    /// The provider filtered the answer.
    ContentFilter,
    /// The answer ended in tool calls (which the agent answers: it advertises no tools).
    ToolCalls,
    /// Any other reason the provider gave.
    Other(String),
}

impl FinishReason {
    /// Maps a provider's finish reason string.
    pub fn from_provider(reason: &str) -> Self {
        match reason {
            "stop" | "end_turn" | "stop_sequence" => FinishReason::Stop,
            "length" | "max_tokens" => FinishReason::Length,
            "content_filter" => FinishReason::ContentFilter,
            "tool_calls" | "function_call" => FinishReason::ToolCalls,
            other => FinishReason::Other(other.to_owned()),
        }
    }
}

/// One piece of a streamed answer. Every field is optional; several may come together.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Delta {
    /// Answer text (empty if none).
    pub text: String,
    /// Reasoning text (empty if none).
    pub reasoning: String,
    /// Refusal text (empty if none); a refusal is the answer when no text came.
    pub refusal: String,
    /// Set on the terminal delta.
    pub finish_reason: Option<FinishReason>,
    /// Set when the provider reports usage (usually on the terminal delta).
    pub usage: Option<Usage>,
    /// What the provider says the call cost, in US dollars (a LiteLLM proxy's
    /// `x-litellm-response-cost`, a `cost` in the usage), when it says: the ledger takes it in
    /// place of a computed price.
    pub reported_cost: Option<f64>,
    /// The model is waiting this long before retrying a failed connection: the agent's idle
    /// watchdog extends its deadline by it.
    pub backoff: Option<Duration>,
    /// Why it is retrying (the status and the provider's message, with secrets removed).
    pub backoff_reason: Option<String>,
    /// Pieces of tool calls (models trained on tools call them unasked).
    pub tool_calls: Vec<ToolCallDelta>,
}

/// A piece of a streamed tool call: the call it belongs to (`index`), its id and name when
/// they first come, and a fragment of its arguments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ToolCallDelta {
    /// Which call of the answer this piece belongs to.
    pub index: u32,
    /// The call's id (usually on its first piece only).
    pub id: Option<String>,
    /// The tool's name (usually on its first piece only).
    pub name: Option<String>,
    /// A fragment of the arguments (JSON for most tools; raw code for some).
    pub arguments: String,
}

impl ToolCallDelta {
    /// A piece of call `index`.
    pub fn new(index: u32) -> Self {
        Self {
            index,
            ..Self::default()
        }
    }
    /// With the call's id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }
    /// With the tool's name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
    /// With a fragment of the arguments.
    pub fn with_arguments(mut self, arguments: impl Into<String>) -> Self {
        self.arguments = arguments.into();
        self
    }
}

impl Delta {
    /// A delta of answer text.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            ..Self::default()
        }
    }
    /// A delta of reasoning.
    pub fn reasoning(text: impl Into<String>) -> Self {
        Self {
            reasoning: text.into(),
            ..Self::default()
        }
    }
    /// A delta of refusal text.
    pub fn refusal(text: impl Into<String>) -> Self {
        Self {
            refusal: text.into(),
            ..Self::default()
        }
    }
    /// A terminal delta.
    pub fn finish(reason: FinishReason) -> Self {
        Self {
            finish_reason: Some(reason),
            ..Self::default()
        }
    }
    /// A backoff announcement.
    pub fn backoff(delay: Duration) -> Self {
        Self {
            backoff: Some(delay),
            ..Self::default()
        }
    }
    /// Says why the model is retrying.
    pub fn with_backoff_reason(mut self, reason: impl Into<String>) -> Self {
        self.backoff_reason = Some(reason.into());
        self
    }
    /// Adds usage to this delta.
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = Some(usage);
        self
    }
    /// Adds the cost the provider reported for the call, in US dollars.
    pub fn with_reported_cost(mut self, usd: f64) -> Self {
        self.reported_cost = Some(usd);
        self
    }
    /// A delta with pieces of tool calls.
    pub fn tool_calls(calls: impl IntoIterator<Item = ToolCallDelta>) -> Self {
        Self {
            tool_calls: calls.into_iter().collect(),
            ..Self::default()
        }
    }
    /// Adds a finish reason to this delta.
    pub fn with_finish(mut self, reason: FinishReason) -> Self {
        self.finish_reason = Some(reason);
        self
    }
}

/// What kind of failure a [`ModelError`] is; the agent routes on it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelErrorKind {
    /// Worth retrying (rate limit, overload, connection); `retry_after` if the provider said.
    Transient {
        /// The provider's requested wait.
        retry_after: Option<Duration>,
    },
    /// The account has no credit left; never retried.
    BillingExhausted,
    /// The request does not fit the context window; the agent compacts and retries once.
    PromptTooLong,
    /// The credentials were refused.
    Auth,
    /// The provider refused the request as malformed.
    InvalidRequest,
    /// No delta arrived within the idle timeout.
    StreamStalled,
    /// The stream ended or broke before a finish reason.
    StreamInterrupted,
    /// The provider filtered the answer.
    ContentFiltered,
    /// The model finished without an answer (empty, whitespace-only or reasoning-only).
    EmptyAnswer,
    /// The answer was cut by the output cap and could not be resumed.
    Truncated,
    /// Anything else.
    Other,
}

/// A model failure: a kind to route on and a message for people (never containing secrets).
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct ModelError {
    kind: ModelErrorKind,
    message: String,
    #[source]
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl ModelError {
    /// An error of this kind.
    pub fn new(kind: ModelErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }
    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }
    /// What kind of failure this is.
    pub fn kind(&self) -> &ModelErrorKind {
        &self.kind
    }
    /// The message, for people.
    pub fn message(&self) -> &str {
        &self.message
    }
    /// Returns true if and only if the request did not fit the context window.
    pub fn is_prompt_too_long(&self) -> bool {
        self.kind == ModelErrorKind::PromptTooLong
    }
}

macro_rules! forward_model {
    ($($ptr:ty),*) => {$(
        #[async_trait]
        impl<M: Model + ?Sized> Model for $ptr {
            async fn stream(&self, request: ChatRequest) -> Result<DeltaStream, ModelError> {
                (**self).stream(request).await
            }
            fn info(&self) -> ModelInfo {
                (**self).info()
            }
        }
    )*};
}
forward_model!(&M, Box<M>, Arc<M>);

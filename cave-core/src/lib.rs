//! The core of cave-agent: an LLM that operates a live, stateful Python runtime.
//!
//! The model writes one Python block per turn; the block runs in a persistent namespace the
//! host controls; what it prints goes back to the model; the host reads the objects the code
//! changed. This crate holds the vocabulary, the seams and the one agent loop. It knows no
//! Python interpreter, no HTTP and no syntax tree: those live behind its traits.
//!
//! # Brief overview
//!
//! - [`Agent`] (built with [`AgentBuilder::new`]) runs prompts: [`Agent::stream`] yields
//!   [`Event`]s and [`Agent::run`] drains them into an [`AgentResponse`].
//! - [`Model`] is a chat model that streams [`Delta`]s (implemented in `cave-models`).
//! - [`Runtime`] is the Python namespace (implemented in `cave-runtime-inproc` and
//!   `cave-runtime-kernel`); [`Resources`] is what a host injects into it, and [`Value`] what
//!   crosses it, converted with serde by [`to_value`] and [`from_value`].
//! - [`CodePolicy`] screens code before it runs (`cave-security`); [`Compactor`] and
//!   [`TokenEstimator`] keep the history within the context window (`cave-compact`).
//! - [`FenceParser`] finds the first closed code block in a streamed answer.
//! - [`Message`] is the history, serializable, and [`prompt`] holds every model-facing text.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use cave_testing::{EchoRuntime, Reply, ScriptedModel};
//! use cave_core::{AgentBuilder, StopReason};
//!
//! let model = ScriptedModel::new([Reply::text("```python\nprint(6 * 7)\n```"), Reply::text("It is 42.")]);
//! let mut agent = AgentBuilder::new(model, EchoRuntime::new()).build().unwrap();
//! let response = agent.run("What is 6 times 7?").await;
//! assert_eq!(response.stop_reason, StopReason::Completed);
//! assert_eq!(response.content, "It is 42.");
//! assert_eq!(response.code_snippets, ["print(6 * 7)"]);
//! # });
//! ```
//!
//! The test kit (a scripted model, a runtime without Python, the runtime contract) is the
//! `cave-testing` crate.
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

mod agent;
mod approval;
mod compact;
mod display;
mod error;
mod event;
mod ledger;
mod message;
mod model;
mod parser;
mod policy;
pub mod prompt;
mod redact;
mod registry;
mod resource;
mod runtime;
mod shape;
mod spooled;
mod sync;
mod text;
mod tool_search;
mod usage;
mod value;

pub use agent::{
    Agent, AgentBuilder, AgentResponse, BuildError, DEFAULT_IMAGE_TOKENS, DEFAULT_MAX_EXEC_OUTPUT,
    DEFAULT_PERSISTED_PREFIX, DEFAULT_PREVIEW_CHARS, EventStream, INTERRUPT_GRACE,
    MAX_OUTPUT_RECOVERIES, SubAgent,
};
pub use approval::{Approval, ApprovalRequest, Approver};
pub use compact::{
    ByteEstimator, Compactor, NoCompaction, Prepared, Summarized, SummaryError, TokenAnchor,
    TokenEstimator, estimate_history, estimate_message, image_tokens,
};
pub use display::{
    DEFAULT_MAX_DISPLAY, DisplayData, DisplayItem, MAX_DISPLAY_ITEMS, file_extension, image_size,
};
pub use error::{RuntimeError, error_chain};
pub use event::{
    EVENT_FORMAT_VERSION, Event, EventObserver, Status, StopError, StopErrorKind, StopReason,
};
pub use ledger::{
    Cost, EgressTotals, HostCallMeter, Ledger, MAX_LEDGER_TOOLS, OTHER_TOOLS, Price, format_usd,
};
pub use message::{
    ChatMessage, ChatRole, HISTORY_FORMAT_VERSION, HistoryError, ImagePart, Message, MessageKind,
    PersistedOutput, SavedHistory,
};
pub use model::{
    ChatRequest, Delta, DeltaStream, FinishReason, Model, ModelError, ModelErrorKind, ModelInfo,
    ToolCallDelta,
};
pub use parser::{FenceParser, Parsed, ThinkSplit, ThinkSplitter};
pub use policy::{CodePolicy, Violation, ViolationKind, refusal_message};
pub use prompt::format_size;
pub use redact::{MIN_SECRET_CHARS, SecretRedactor, StreamRedaction};
pub use registry::{COMPACT_FUNCTIONS, Description, Entry, Registry, unique_prefix};
pub use resource::{
    Args, Field, Function, FunctionBody, HostError, HostFunction, HostObject, Method, NameError,
    NameKind, NameProblem, ObjectBinding, Param, ParamDefault, ParamKind, Resource, Resources,
    Signature, TypeSchema, TypeShape, Variable, calls_mcp, is_identifier, normalize_name,
    validate_name,
};
pub use runtime::{
    BoundName, Connection, Connections, DEFAULT_MAX_HELD_OUTPUT, DiscardOutput, Execution,
    ExecutionError, Interrupt, Interruption, Layer, LayerState, LiveOutput, OutputSink,
    ResourceUsage, Runtime, RuntimeExt, downcast_object,
};
pub use shape::{
    Persisted, highest_persisted_index, persist_output, persisted_marker, strip_persisted_preview,
};
pub use spooled::SpooledOutput;
pub use sync::lock;
pub use text::{one_line, preview, shorten};
pub use tokio_util::sync::CancellationToken;
pub use tool_search::{
    DEFAULT_TOOL_LISTING_BUDGET, MAX_SEARCH_RESULTS, SEARCH_TOOLS, ToolEntry, ToolIndex, ToolSearch,
};
pub use usage::Usage;
pub use value::{Value, ValueError, from_value, to_value};

#[doc(no_inline)]
pub use async_trait::async_trait;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! Context compaction for cave-agent: what keeps a long session inside the model's window.
//!
//! cave-core holds the seams ([`Compactor`](cave_core::Compactor),
//! [`TokenEstimator`](cave_core::TokenEstimator)) and gives a program on the core alone no
//! compaction; this crate holds the compaction every facade agent gets
//! (`cave_agent::Agent::builder` sets it):
//!
//! - [`ContextCompactor`]: old execution results cleared first (all but the
//!   [`KEEP_RECENT_RESULTS`] most recent), a summary the model writes only when that is not
//!   enough, never separating a code message from its result, behind a circuit breaker;
//! - [`ScriptEstimator`]: a script-aware estimate that never under-counts CJK, other scripts
//!   or emoji;
//! - with the `tiktoken` feature (on by default), [`TiktokenEstimator`] counts exactly with an
//!   OpenAI encoding, and [`estimator_for`] picks it for OpenAI model ids and the script-aware
//!   estimate otherwise.
//!
//! The agent hands its own estimator to its compactor at every call, so both count in one unit:
//!
//! ```
//! use cave_compact::{ContextCompactor, ScriptEstimator};
//! use cave_core::{AgentBuilder, Model, TokenEstimator};
//! use cave_testing::{EchoRuntime, ScriptedModel};
//! use std::sync::Arc;
//!
//! assert_eq!(ScriptEstimator.estimate("hello world"), 2);
//! // Other scripts cost more per character, and are never under-counted.
//! assert_eq!(ScriptEstimator.estimate(&"你好".repeat(4)), 10);
//!
//! let model: Arc<dyn Model> = Arc::new(ScriptedModel::new([]));
//! let compactor = ContextCompactor::new(model.clone()).with_context_window(32_000);
//! assert_eq!(compactor.threshold(), 32_000 - 16_000 - 13_000);
//! let mut builder = AgentBuilder::new(model, EchoRuntime::new());
//! builder.compactor(compactor).estimator(ScriptEstimator);
//! let _agent = builder.build().unwrap();
//! ```
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

mod script;
mod summary;
#[cfg(feature = "tiktoken")]
mod tiktoken;

pub use script::ScriptEstimator;
pub use summary::{
    COMPACT_BUFFER_TOKENS, COOLDOWN_ATTEMPTS, ContextCompactor, DEFAULT_CONTEXT_WINDOW,
    FALLBACK_OUTPUT_RESERVE, KEEP_RECENT_RESULTS, MAX_CONSECUTIVE_FAILURES,
};
#[cfg(feature = "tiktoken")]
pub use tiktoken::{Encoding, TiktokenEstimator, estimator_for};

/// The README's example, compiled and run as a doctest.
#[cfg(all(doctest, feature = "tiktoken"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

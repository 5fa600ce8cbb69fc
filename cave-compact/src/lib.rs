//! Exact token counts for cave-agent: OpenAI's tokenizers (tiktoken, built in).
//!
//! Every agent estimates with cave-core's [`ScriptEstimator`](cave_core::ScriptEstimator) and
//! compacts with its `ContextCompactor`; this crate adds exact counts where the tokenizer is
//! known. [`TiktokenEstimator`] counts with an OpenAI encoding; [`estimator_for`] picks it for
//! OpenAI model ids and the script-aware heuristic otherwise. Give it to the agent, which
//! hands it to its compactor at every call:
//!
//! ```
//! use cave_compact::estimator_for;
//! use cave_core::TokenEstimator;
//!
//! assert_eq!(estimator_for("gpt-4o").estimate("hello world"), 2);
//! // Other models: the heuristic, which never under-counts.
//! assert_eq!(estimator_for("llama-3").estimate(&"你好".repeat(4)), 10);
//! ```
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

mod estimate;

pub use estimate::{Encoding, TiktokenEstimator, estimator_for};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! cave-agent's context compaction and token estimation.
//!
//! # Brief overview
//!
//! - [`ContextCompactor`] implements [`cave_core::Compactor`]: it clears old execution results
//!   first and asks a model for a summary only when that is not enough; it also recovers when a
//!   provider rejects a prompt as too long.
//! - [`ScriptEstimator`] estimates tokens by character class without under-counting CJK, other
//!   scripts or emoji; [`TiktokenEstimator`] counts exactly with an OpenAI tokenizer, chosen
//!   automatically for OpenAI model ids ([`estimator_for`]).
//!
//! ```
//! use cave_compact::ScriptEstimator;
//! use cave_core::TokenEstimator;
//!
//! assert_eq!(ScriptEstimator.estimate("hello world"), 2);
//! assert_eq!(ScriptEstimator.estimate(&"你好世界".repeat(10)), 50);
//! ```
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

mod compactor;
mod estimate;
pub mod prompts;

pub use compactor::{
    COMPACT_BUFFER_TOKENS, COOLDOWN_ATTEMPTS, ContextCompactor, DEFAULT_CONTEXT_WINDOW,
    FALLBACK_OUTPUT_RESERVE, KEEP_RECENT_RESULTS, MAX_CONSECUTIVE_FAILURES,
};
pub use estimate::{Encoding, ScriptEstimator, TiktokenEstimator, estimator_for};
#[doc(hidden)]
pub use estimate::{RANGES, rate};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! cave-agent's model adapters: chat models over HTTP, behind the core's [`cave_core::Model`].
//!
//! # Brief overview
//!
//! - [`OpenAiModel`]: any OpenAI-compatible server (OpenAI, vLLM, llama.cpp, Ollama, DeepSeek…),
//!   through async-openai's client (our own request and chunk types, with its `byot` calls);
//!   [`OpenAiModel::from_client`] takes a configured `async_openai::Client` (Azure included).
//! - [`LiteLlmModel`]: a LiteLLM proxy, routing `provider/model` names.
//! - [`ModelConfig`]: where, who, what to send, how to retry ([`RetryPolicy`]); the key is an
//!   [`ApiKey`], which never prints.
//! - [`RecordingModel`] and [`ReplayModel`]: record a run's model traffic to a JSON Lines
//!   cassette and play it back offline, failing loudly when the conversation diverges.
//!
//! Failures are classified into [`cave_core::ModelErrorKind`]s: a prompt that is too long
//! (413, `context_length_exceeded`, the providers' phrasings), billing (402,
//! `insufficient_quota`, …), auth (401/403), invalid requests, and transient failures (408,
//! 429, 5xx, timeouts, resets), which alone are retried, and only before any output.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use cave_models::{ApiKey, ModelConfig, OpenAiModel};
//!
//! let model = OpenAiModel::new(
//!     ModelConfig::new("gpt-4o-mini")
//!         .api_key(ApiKey::new(std::env::var("LLM_API_KEY")?))
//!         .max_output_tokens(4096),
//! )?;
//! # let _ = model; Ok(()) }
//! ```
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

mod classify;
mod client;
mod config;
mod model;
mod record;
mod retry;
mod transport;
mod wire;

pub use classify::{classify_http, retry_after};
pub use config::{ApiKey, ConfigError, ModelConfig, RetryPolicy};
pub use model::{LiteLlmModel, OpenAiModel};
pub use record::{CassetteError, RecordingModel, ReplayModel};
pub use retry::Retrying;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

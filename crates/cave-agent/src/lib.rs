#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

pub use cave_core::*;

/// The in-process runtime: CPython embedded in this process (feature `inproc`, on by default).
#[cfg(feature = "inproc")]
pub mod inproc {
    pub use cave_runtime_inproc::*;
}

#[cfg(feature = "inproc")]
pub use cave_runtime_inproc::InProcRuntime;

/// Model adapters: OpenAI-compatible servers and LiteLLM proxies (feature `models`, on by default).
#[cfg(feature = "models")]
pub mod models {
    pub use cave_models::*;
}

#[cfg(feature = "models")]
pub use cave_models::{LiteLlmModel, ModelConfig, OpenAiModel};

/// The code policy: rules checked before code runs (feature `security`, on by default).
#[cfg(feature = "security")]
pub use cave_security::{PolicyError, SecurityPolicy};

/// Context compaction and token estimation (feature `compact`, on by default).
#[cfg(feature = "compact")]
pub mod compact {
    pub use cave_compact::*;
}

#[cfg(feature = "compact")]
pub use cave_compact::ContextCompactor;

/// The workspace README's hello world, compiled and run as a doctest.
#[cfg(all(doctest, feature = "inproc", feature = "testing"))]
#[doc = include_str!("../../../README.md")]
struct WorkspaceReadme;

#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

pub use cave_core::*;

/// Context compaction, on in every agent `Agent::builder` makes: old results cleared, then a
/// summary the model writes; script-aware estimates, and exact ones for OpenAI models (feature
/// `tiktoken`, on by default).
pub mod compact {
    pub use cave_compact::*;
}

pub use cave_compact::{ContextCompactor, ScriptEstimator};

mod agent;
mod spawned;

pub use agent::AgentExt;
pub use spawned::RunHandle;

/// What every runtime does around a running cell: output held and spooled, host calls in
/// their spans, `show_from_host`.
pub use cave_cell::*;

/// Rust types as the model sees them: `PythonType`, `ObjectClass`, `ObjectMethods`,
/// `Shared`.
pub use cave_pytype::{ObjectClass, ObjectMethods, PythonType, Shared, push_schema};

/// What `cave-macros` output calls (not a public API).
#[doc(hidden)]
pub use cave_pytype::macro_support;

/// Approvals before host calls, the audit log, method filters: cave-guards.
pub use cave_guards::*;

/// Rust functions, structs and impl blocks as host resources (feature `macros`, on by
/// default): see [`function`], [`object`] and [`PythonType`](derive@PythonType).
#[cfg(feature = "macros")]
pub use cave_macros::{PythonType, function, object};

/// The in-process runtime: CPython embedded in this process (feature `inproc`, on by default).
#[cfg(feature = "inproc")]
pub mod inproc {
    pub use cave_runtime_inproc::*;
}

#[cfg(feature = "inproc")]
pub use cave_runtime_inproc::{InProcRuntime, StdioCapture};

/// The kernel runtime: Python in a child process (feature `kernel`, on by default).
#[cfg(feature = "kernel")]
pub mod kernel {
    pub use cave_runtime_kernel::*;
}

#[cfg(feature = "jupyter")]
pub use cave_runtime_kernel::JupyterConfig;
#[cfg(feature = "kernel")]
pub use cave_runtime_kernel::{
    KernelConfig, KernelPool, KernelRuntime, Limits, PoolConfig, Sandbox,
};

/// Model adapters: OpenAI-compatible servers and LiteLLM proxies (feature `models`, on by default).
#[cfg(feature = "models")]
pub mod models {
    pub use cave_models::*;
}

#[cfg(feature = "models")]
pub use cave_models::{
    ApiKey, LiteLlmModel, ModelConfig, OpenAiModel, RecordingModel, ReplayModel, RetryPolicy,
    Retrying,
};

/// The code policy: rules checked before code runs (feature `security`, on by default).
#[cfg(feature = "security")]
pub use cave_security::{PolicyError, SecurityPolicy};

/// MCP servers' tools as host objects (feature `mcp`).
#[cfg(feature = "mcp")]
pub mod mcp {
    pub use cave_mcp::*;
}

/// Agent Skills: SKILL.md discovery, checks and progressive disclosure (feature `skills`, on
/// by default).
#[cfg(feature = "skills")]
pub mod skills {
    pub use cave_skills::*;
}

#[cfg(feature = "skills")]
pub use cave_skills::{Skill, SkillSet};

/// Traces to any OpenTelemetry backend over OTLP/HTTP (feature `otel`, off by default).
#[cfg(feature = "otel")]
pub mod otel {
    pub use cave_otel::*;
}

/// Sessions that outlive their host: the conversation, the host's registration and the
/// model's namespace saved to a directory and restored (feature `session`, on by default).
#[cfg(feature = "session")]
pub mod session {
    pub use cave_session::*;
}

/// The test kit: a scripted model, a runtime without Python, the runtime contract (feature
/// `testing`).
#[cfg(feature = "testing")]
pub mod testing {
    pub use cave_testing::*;
}

/// docs/JUPYTER.md's example, compiled as a doctest.
#[cfg(all(doctest, feature = "jupyter"))]
#[doc = include_str!("../../docs/JUPYTER.md")]
struct JupyterGuide;

/// The workspace README's hello world, compiled and run as a doctest.
#[cfg(all(doctest, feature = "inproc", feature = "testing", feature = "macros"))]
#[doc = include_str!("../../README.md")]
struct WorkspaceReadme;

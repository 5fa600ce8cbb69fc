//! What a run reports, step by step.

use crate::Usage;
use serde::{Deserialize, Serialize};

/// Why a run stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StopReason {
    /// The model gave its final answer.
    Completed,
    /// The step limit was reached.
    MaxSteps,
    /// The run-time limit was reached (checked between steps).
    Timeout,
    /// A token budget was spent (checked between steps).
    BudgetExhausted,
    /// The run was cancelled.
    Cancelled,
    /// The model failed: a provider error, a stall, an answer that could not be recovered.
    ModelError,
    /// The runtime failed as infrastructure (not the model's code raising).
    RuntimeError,
    /// A defect: a panic in the agent, the model or the runtime.
    InternalError,
}

impl StopReason {
    /// The snake_case name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Completed => "completed",
            StopReason::MaxSteps => "max_steps",
            StopReason::Timeout => "timeout",
            StopReason::BudgetExhausted => "budget_exhausted",
            StopReason::Cancelled => "cancelled",
            StopReason::ModelError => "model_error",
            StopReason::RuntimeError => "runtime_error",
            StopReason::InternalError => "internal_error",
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a status event announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Status {
    /// History is being summarized.
    Compacting,
    /// History was summarized (`before` and `after` count messages).
    Compacted,
    /// The answer was cut off; the model is asked to resume (`recovery` of `max_recoveries`).
    OutputRecovery,
}

/// One thing that happened during a run.
///
/// Serialized with serde, an event is one JSON object with a snake_case `"type"` and the field
/// names below: this is the JSON Lines format the CLI prints, and it is kept stable. A run that
/// is consumed to its end always starts with `UserPrompt` and ends with `Stopped`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// The prompt this run answers; always first.
    UserPrompt {
        /// The prompt.
        content: String,
    },
    /// Prose from the model, as it streams (never reasoning).
    Text {
        /// The new text.
        content: String,
    },
    /// A piece of the model's reasoning, as it streams.
    ThinkingChunk {
        /// The new reasoning text.
        content: String,
    },
    /// The model's whole reasoning for a call, once its answer starts.
    Thinking {
        /// The reasoning.
        content: String,
        /// From the first reasoning delta to the first answer delta.
        duration_ms: u64,
    },
    /// The code about to run (dedented and stripped).
    Code {
        /// The code.
        code: String,
    },
    /// Output of the running code, live, where the runtime can stream it.
    ExecutionOutput {
        /// The new output.
        chunk: String,
    },
    /// The execution finished (the code may have raised: see `success`).
    ExecutionResult {
        /// The whole output, before it was shortened for the model.
        output: String,
        /// Returns true if and only if the code ran without raising.
        success: bool,
        /// The output was too large and was stored in the runtime instead.
        persisted: bool,
        /// The runtime variable holding it, when persisted.
        persisted_variable: Option<String>,
        /// Stopping the execution lost the runtime's non-registered state.
        state_lost: bool,
    },
    /// The execution passed `max_exec_timeout` and was stopped.
    ExecutionTimeout {
        /// The limit, in seconds.
        timeout: f64,
        /// Stopping it lost the runtime's non-registered state.
        state_lost: bool,
    },
    /// The code policy refused the code; nothing ran.
    SecurityError {
        /// What was refused, as told to the model.
        message: String,
    },
    /// Compaction and recovery progress.
    Status {
        /// What happens.
        status: Status,
        /// Messages before compaction.
        before: Option<usize>,
        /// Messages after compaction.
        after: Option<usize>,
        /// This recovery's number.
        recovery: Option<u32>,
        /// The recovery limit.
        max_recoveries: Option<u32>,
    },
    /// The model call failed and is retried after `delay` seconds (nothing was streamed yet).
    Backoff {
        /// The wait, in seconds.
        delay: f64,
    },
    /// The model's final answer.
    FinalResponse {
        /// The answer (all fragments, when it was resumed after a cut).
        content: String,
    },
    /// The run ended; always last.
    Stopped {
        /// The final answer, or the last thing the model said.
        content: String,
        /// Why it ended.
        stop_reason: StopReason,
        /// Model calls made.
        steps: u32,
        /// Seconds since the run started.
        elapsed: f64,
        /// Tokens spent by the run.
        usage: Usage,
        /// What failed, for the error stop reasons (never contains secrets).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

//! What a run reports, step by step.

use crate::{ModelError, ModelErrorKind, RuntimeError, Usage};
use serde::{Deserialize, Serialize};
use std::fmt;

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
    /// A budget was spent: tokens (checked between steps), money, processor time or host
    /// calls (checked before each step and cell; see the error's kind).
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

/// The version of the event format (the JSON Lines `cave --json` prints). It changes only
/// when a change would break a reader: a removed or renamed field or type, or a field whose
/// meaning changes. New event types and new fields do not change it: readers ignore what they
/// do not know. See `docs/FORMATS.md`.
pub const EVENT_FORMAT_VERSION: u32 = 1;

fn event_format_version() -> u32 {
    EVENT_FORMAT_VERSION
}

/// What ended a run early, as data: a kind to match on and a message for people (never
/// containing secrets). In JSON: `{"kind": "auth", "message": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StopError {
    /// What failed.
    pub kind: StopErrorKind,
    /// The failure, for display.
    pub message: String,
}

impl StopError {
    /// A failure of this kind.
    pub fn new(kind: StopErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for StopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StopError {}

impl From<&ModelError> for StopError {
    fn from(e: &ModelError) -> Self {
        let kind = match e.kind() {
            ModelErrorKind::Transient { .. } => StopErrorKind::Transient,
            ModelErrorKind::BillingExhausted => StopErrorKind::BillingExhausted,
            ModelErrorKind::PromptTooLong => StopErrorKind::PromptTooLong,
            ModelErrorKind::Auth => StopErrorKind::Auth,
            ModelErrorKind::InvalidRequest => StopErrorKind::InvalidRequest,
            ModelErrorKind::StreamStalled => StopErrorKind::StreamStalled,
            ModelErrorKind::StreamInterrupted => StopErrorKind::StreamInterrupted,
            ModelErrorKind::ContentFiltered => StopErrorKind::ContentFiltered,
            ModelErrorKind::EmptyAnswer => StopErrorKind::EmptyAnswer,
            ModelErrorKind::Truncated => StopErrorKind::Truncated,
            _ => StopErrorKind::ModelOther,
        };
        Self::new(kind, e.to_string())
    }
}

impl From<&RuntimeError> for StopError {
    fn from(e: &RuntimeError) -> Self {
        Self::new(StopErrorKind::Runtime, e.to_string())
    }
}

/// The kinds of [`StopError`]: the model's failures (as [`ModelErrorKind`] names them), the
/// runtime's, a defect, and the budget that ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StopErrorKind {
    /// The model: still failing after the retries (rate limit, overload, connection).
    Transient,
    /// The model: the account has no credit left.
    BillingExhausted,
    /// The model: the prompt did not fit even after compaction.
    PromptTooLong,
    /// The model: the credentials were refused.
    Auth,
    /// The model: the provider refused the request as malformed.
    InvalidRequest,
    /// The model: no delta arrived within the idle timeout.
    StreamStalled,
    /// The model: the stream broke before a finish reason.
    StreamInterrupted,
    /// The model: the provider filtered the answer.
    ContentFiltered,
    /// The model: no answer (empty, whitespace-only or reasoning-only), even after retries.
    EmptyAnswer,
    /// The model: the answer was cut by the output cap and could not be resumed.
    Truncated,
    /// The model: any other failure.
    ModelOther,
    /// The runtime failed as infrastructure.
    Runtime,
    /// A defect (a panic).
    Internal,
    /// `max_total_tokens` was spent.
    MaxTotalTokens,
    /// `max_input_tokens` was spent.
    MaxInputTokens,
    /// `max_output_tokens` was spent.
    MaxOutputTokens,
    /// `max_cost` was spent.
    MaxCost,
    /// `max_cpu_time` was spent.
    MaxCpuTime,
    /// `max_host_calls` were made.
    MaxHostCalls,
}

impl StopErrorKind {
    /// Returns true if and only if the model failed (as opposed to the runtime, a defect or a
    /// budget).
    pub fn is_model(self) -> bool {
        !matches!(
            self,
            Self::Runtime
                | Self::Internal
                | Self::MaxTotalTokens
                | Self::MaxInputTokens
                | Self::MaxOutputTokens
                | Self::MaxCost
                | Self::MaxCpuTime
                | Self::MaxHostCalls
        )
    }
}

/// What a status event announces, with what it means. In JSON, beside `"type": "status"`:
/// `"status": "compacting"`, `"status": "compacted", "before": 40, "after": 12`, or
/// `"status": "output_recovery", "recovery": 1, "max_recoveries": 3`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Status {
    /// History is being summarized.
    Compacting,
    /// History was summarized.
    Compacted {
        /// Messages before.
        before: usize,
        /// Messages after.
        after: usize,
    },
    /// A summary was tried and failed: the history is kept as it was.
    CompactionFailed {
        /// Why.
        message: String,
    },
    /// How the runtime isolates the model's code, one line per layer (`network: active
    /// (...)`): said at the start of a run when it is new (the first run, a new process).
    Isolation {
        /// The layers.
        layers: Vec<String>,
    },
    /// The answer called tools that carry no code: the model is told there are none to call,
    /// and the run goes on.
    ToolCallsAnswered {
        /// The tools it called, by name.
        tools: Vec<String>,
    },
    /// The answer was cut off; the model is asked to resume.
    OutputRecovery {
        /// This recovery's number (from 1).
        recovery: u32,
        /// The most recoveries a run makes.
        max_recoveries: u32,
    },
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
        /// The version of this event format ([`EVENT_FORMAT_VERSION`]), so that a reader of
        /// a stream knows what follows.
        #[serde(default = "event_format_version")]
        format_version: u32,
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
        /// The block had no closing fence: the answer ended normally inside it (small models
        /// often stop there), and it runs as the turn's block. In JSON only when true.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        unclosed: bool,
        /// The code came from the arguments of a call of this tool (a model trained on tools
        /// called one unasked), and runs as the turn's block. In JSON only when set.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_call: Option<String>,
    },
    /// Output of the running code, live, where the runtime can stream it.
    ExecutionOutput {
        /// The new output.
        chunk: String,
    },
    /// An item the running code showed (`display(obj)`, a last value with a rich form, a
    /// matplotlib figure), in order with its output (whose text has the item's text form).
    Display {
        /// Its MIME types, `text/plain` always among them.
        mime_types: Vec<String>,
        /// Its text form.
        text: String,
        /// The file each rich form was written to, by MIME type (with a display directory set:
        /// [`AgentBuilder::display_dir`](crate::AgentBuilder::display_dir)).
        files: std::collections::BTreeMap<String, String>,
        /// The item itself, every form (not in JSON: the files hold the forms).
        #[serde(skip)]
        item: Option<Box<crate::DisplayItem>>,
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
    /// The network connections the cell's code made through the runtime's egress proxy (and
    /// any that ended since the last cell), allowed or refused: said before the cell's result,
    /// when there were any.
    Egress(crate::Connections),
    /// The execution passed `max_exec_timeout` and was stopped.
    ExecutionTimeout {
        /// The limit, in seconds.
        timeout: f64,
        /// Stopping it lost the runtime's non-registered state.
        state_lost: bool,
    },
    /// The host's approver is asked whether this may happen (the answer follows: the cell's
    /// result, or `execution_refused`).
    ApprovalRequested {
        /// What is asked about.
        request: crate::ApprovalRequest,
    },
    /// The host refused the cell (its approver, or a budget of the session that is spent);
    /// nothing ran, and the model is told.
    ExecutionRefused {
        /// The reason given, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The code policy refused the code; nothing ran.
    SecurityError {
        /// What was refused, as told to the model.
        message: String,
        /// Each rule that refused it: kind, rule, line (for programs; `message` says the same
        /// in words).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        violations: Vec<crate::Violation>,
    },
    /// Compaction and recovery progress.
    Status(Status),
    /// The model call failed and is retried after `delay` seconds (nothing was streamed yet).
    Backoff {
        /// The wait, in seconds.
        delay: f64,
        /// Why: the status and the provider's message, when the model said (in JSON only when
        /// known).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// An event of a sub-agent the model's code is running (see
    /// [`SubAgent`](crate::SubAgent)), while this agent's execution waits for it. In JSON:
    /// `{"type": "sub_agent", "agent": "cleaner", "event": {...}}`.
    SubAgent {
        /// The sub-agent's name.
        agent: String,
        /// Its event (which may itself be a sub-agent's).
        event: Box<Event>,
    },
    /// The model's final answer.
    FinalResponse {
        /// The answer (all fragments, when it was resumed after a cut).
        content: String,
    },
    /// A step ended: one model call, and the cell its answer ran, if any. Says what the step
    /// cost, so that a viewer can show tokens and timings per step. A step whose model call
    /// failed has none (the run's `Stopped` follows).
    Step {
        /// The step's number in the run (from 1).
        step: u32,
        /// The tokens of this step's model call (estimated, and marked so, when the provider
        /// reported none).
        usage: Usage,
        /// Seconds the model call took, from the request to the end of the answer.
        model_seconds: f64,
        /// Seconds the cell took to run, screens and approval included; absent when the step
        /// ran none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        execution_seconds: Option<f64>,
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
        /// What failed, for the error stop reasons and `budget_exhausted` (never contains
        /// secrets).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<StopError>,
        /// What the session has cost so far, this run included (see [`Ledger`](crate::Ledger)).
        #[serde(default)]
        ledger: Box<crate::Ledger>,
    },
}
impl Event {
    /// Returns true if and only if this event says the runtime lost the names the code had
    /// bound (a cell's result or time-out whose stop ended the runtime's process): what a
    /// session saved after the run must know ([`AgentResponse::state_lost`](crate::AgentResponse)).
    pub fn lost_state(&self) -> bool {
        matches!(
            self,
            Event::ExecutionResult {
                state_lost: true,
                ..
            } | Event::ExecutionTimeout {
                state_lost: true,
                ..
            }
        )
    }
}

/// A run as a person reads it in a terminal: `print!("{event}")` for each event of a stream
/// gives a transcript (the prompt, the model's prose as it streams, each cell's code and its
/// output, refusals and retries, a closing line), with no printer to write. Each event ends its
/// own lines; the model's prose is printed as its chunks arrive. A cell's output is printed
/// once, whole, with its result (`execution_output` chunks print nothing: a program that shows
/// output live prints their `chunk` itself); reasoning is one shortened line. A sub-agent's
/// events are indented under its name. Events are redacted before they are emitted, so the
/// transcript holds no registered secret. The CLI's renderer adds colour, Markdown, images and
/// a spinner.
impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::UserPrompt { content, .. } => writeln!(f, "> {content}"),
            Event::Text { content } => f.write_str(content),
            Event::ThinkingChunk { .. }
            | Event::ExecutionOutput { .. }
            | Event::Step { .. }
            | Event::ApprovalRequested { .. } => Ok(()),
            Event::Thinking {
                content,
                duration_ms,
            } => writeln!(
                f,
                "[thought for {:.1} s] {}",
                *duration_ms as f64 / 1000.0,
                crate::one_line(content, 200)
            ),
            Event::Code { code, .. } => writeln!(f, "\n```python\n{code}\n```"),
            Event::Display {
                mime_types, files, ..
            } => {
                write!(f, "[shown: {}]", mime_types.join(", "))?;
                for file in files.values() {
                    write!(f, " {file}")?;
                }
                writeln!(f)
            }
            Event::ExecutionResult {
                output,
                success,
                persisted_variable,
                state_lost,
                ..
            } => {
                f.write_str(output)?;
                if !output.is_empty() && !output.ends_with('\n') {
                    writeln!(f)?;
                }
                let mut notes = vec![if *success { "ran" } else { "raised" }.to_owned()];
                if let Some(variable) = persisted_variable {
                    notes.push(format!("whole output in {variable}"));
                }
                if *state_lost {
                    notes.push("the runtime's state was lost".to_owned());
                }
                writeln!(f, "[{}]", notes.join("; "))
            }
            Event::Egress(connections) => {
                for connection in &connections.list {
                    writeln!(f, "[network: {connection}]")?;
                }
                if connections.omitted > 0 {
                    writeln!(f, "[network: {} more connections]", connections.omitted)?;
                }
                Ok(())
            }
            Event::ExecutionTimeout {
                timeout,
                state_lost,
            } => writeln!(
                f,
                "[stopped after {timeout} s{}]",
                if *state_lost {
                    "; the runtime's state was lost"
                } else {
                    ""
                }
            ),
            Event::ExecutionRefused { reason } => match reason {
                Some(reason) => writeln!(f, "[refused by the host: {reason}]"),
                None => writeln!(f, "[refused by the host]"),
            },
            Event::SecurityError { message, .. } => {
                writeln!(f, "[refused by the code policy] {message}")
            }
            Event::Status(status) => match status {
                Status::Compacting => writeln!(f, "[summarizing the history]"),
                Status::Compacted { before, after } => {
                    writeln!(f, "[history summarized: {before} messages to {after}]")
                }
                Status::CompactionFailed { message } => {
                    writeln!(f, "[summary failed, history kept: {message}]")
                }
                Status::Isolation { layers } => {
                    writeln!(f, "[isolation: {}]", layers.join("; "))
                }
                Status::ToolCallsAnswered { tools } => {
                    writeln!(f, "[tools called, none to call: {}]", tools.join(", "))
                }
                Status::OutputRecovery {
                    recovery,
                    max_recoveries,
                } => writeln!(f, "[answer cut off, resuming {recovery}/{max_recoveries}]"),
            },
            Event::Backoff { delay, reason } => match reason {
                Some(reason) => writeln!(f, "[retrying in {delay:.1} s: {reason}]"),
                None => writeln!(f, "[retrying in {delay:.1} s]"),
            },
            Event::SubAgent { agent, event } => {
                // Its prose is shown once, whole, with its final answer.
                let inner = match &**event {
                    Event::Text { .. } => return Ok(()),
                    Event::FinalResponse { content } => format!("{content}\n"),
                    other => other.to_string(),
                };
                for line in inner.lines() {
                    writeln!(f, "  {agent} | {line}")?;
                }
                Ok(())
            }
            // The answer streamed as `text`: this ends its line.
            Event::FinalResponse { .. } => writeln!(f),
            Event::Stopped {
                stop_reason,
                steps,
                elapsed,
                usage,
                error,
                ledger,
                ..
            } => {
                write!(
                    f,
                    "[{stop_reason} after {steps} step{}, {} tokens, {elapsed:.1} s",
                    if *steps == 1 { "" } else { "s" },
                    usage.total_tokens
                )?;
                if ledger.cost.usd > 0.0 {
                    write!(f, "; session ${}", crate::format_usd(ledger.cost.usd))?;
                }
                match error {
                    Some(error) => writeln!(f, ": {error}]"),
                    None => writeln!(f, "]"),
                }
            }
        }
    }
}

/// Sees every event of every run as it happens, before the run's consumer does (sub-agents'
/// events nested in theirs): the seam for an audit log (`cave_guards::AuditLog`) or any record
/// kept beside the stream. Called on the run's task: keep it short.
pub trait EventObserver: Send + Sync {
    /// One event.
    fn observe(&self, event: &Event);
}

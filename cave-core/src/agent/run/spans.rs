//! The run's spans, named and attributed after the OpenTelemetry GenAI semantic conventions,
//! so that any `tracing` subscriber shows a run as a tree (`tracing-opentelemetry` maps
//! `otel.name`, `otel.kind` and `otel.status_code`, and exports the rest as attributes):
//!
//! ```text
//! invoke_agent cave-agent          gen_ai.operation.name, gen_ai.request.model, usage, stop
//! ├─ step                          cave.step
//! │  ├─ chat MODEL                 gen_ai.request.model, gen_ai.usage.{input,output}_tokens
//! │  └─ execute_tool python        the cell: success, state lost; code and output opt-in
//! └─ compaction                    a summary written to make room
//! ```
//!
//! What the spans never hold unless the host opts in ([`AgentBuilder::trace_content`]): the
//! prompt, the answers, cells' code and output. Secrets never: what is recorded is what the
//! events carry, redacted the same way.
//!
//! [`AgentBuilder::trace_content`]: crate::AgentBuilder::trace_content

use crate::{StopReason, Usage};
use tracing::Span;
use tracing::field::Empty;

/// The agent's name in `gen_ai.agent.name`.
const AGENT: &str = "cave-agent";

/// A run: `invoke_agent cave-agent`.
pub(crate) fn run(model: &str) -> Span {
    tracing::info_span!(
        "invoke_agent",
        otel.name = %format!("invoke_agent {AGENT}"),
        otel.kind = "internal",
        otel.status_code = Empty,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = AGENT,
        gen_ai.request.model = model,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        cave.stop_reason = Empty,
        cave.steps = Empty,
        error.type = Empty,
    )
}

/// A count as an integer attribute (OpenTelemetry's integers are signed; exporters send
/// unsigned ones as text).
fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The end of a run, on its span.
pub(super) fn finish_run(span: &Span, usage: Usage, steps: u32, reason: StopReason) {
    span.record("gen_ai.usage.input_tokens", int(usage.prompt_tokens));
    span.record("gen_ai.usage.output_tokens", int(usage.completion_tokens));
    span.record("cave.steps", i64::from(steps));
    let reason = reason.as_str();
    span.record("cave.stop_reason", reason);
    if !matches!(reason, "completed") {
        span.record("error.type", reason);
        if matches!(reason, "model_error" | "runtime_error" | "internal_error") {
            span.record("otel.status_code", "ERROR");
        }
    }
}

/// One step: a model call and what came of it.
pub(super) fn step(number: u32) -> Span {
    tracing::info_span!("step", otel.name = "step", cave.step = i64::from(number))
}

/// A model call: `chat MODEL`.
pub(super) fn chat(model: &str) -> Span {
    tracing::info_span!(
        "chat",
        otel.name = %format!("chat {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.request.model = model,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        cave.usage.estimated = Empty,
        error.type = Empty,
    )
}

/// The end of a model call, on its span.
pub(super) fn finish_chat(span: &Span, usage: Usage, error: Option<&crate::ModelError>) {
    span.record("gen_ai.usage.input_tokens", int(usage.prompt_tokens));
    span.record("gen_ai.usage.output_tokens", int(usage.completion_tokens));
    span.record("cave.usage.estimated", usage.estimated);
    if let Some(error) = error {
        span.record("error.type", error_kind(error).as_str());
        span.record("otel.status_code", "ERROR");
    }
}

/// The error's kind as the `stopped` event names it (`stream_stalled`, `auth`, …).
fn error_kind(error: &crate::ModelError) -> String {
    let kind = crate::StopError::from(error).kind;
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "model_error".to_owned())
}

/// A cell: `execute_tool python`, with its (redacted) code when the host opted in.
pub(super) fn cell(code: Option<&str>) -> Span {
    let span = tracing::info_span!(
        "execute_tool",
        otel.name = "execute_tool python",
        otel.kind = "internal",
        otel.status_code = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = "python",
        gen_ai.tool.type = "extension",
        gen_ai.tool.call.arguments = Empty,
        gen_ai.tool.call.result = Empty,
        cave.cell.success = Empty,
        cave.cell.state_lost = Empty,
        error.type = Empty,
    );
    if let Some(code) = code {
        span.record("gen_ai.tool.call.arguments", code);
    }
    span
}

/// The end of a cell, on its span: the event it ended with (its output only with `content`).
pub(super) fn finish_cell(span: &Span, event: &crate::Event, content: bool) {
    match event {
        crate::Event::ExecutionResult {
            output,
            success,
            state_lost,
            ..
        } => {
            span.record("cave.cell.success", *success);
            span.record("cave.cell.state_lost", *state_lost);
            if !success {
                span.record("error.type", "python_exception");
            }
            if content {
                span.record("gen_ai.tool.call.result", output.as_str());
            }
        }
        crate::Event::ExecutionTimeout { state_lost, .. } => {
            span.record("cave.cell.success", false);
            span.record("cave.cell.state_lost", *state_lost);
            span.record("error.type", "timeout");
        }
        crate::Event::ExecutionRefused { .. } => {
            span.record("cave.cell.success", false);
            span.record("error.type", "refused");
        }
        _ => {}
    }
}

/// A summary written to make room in the context.
pub(super) fn compaction() -> Span {
    tracing::info_span!(
        "compaction",
        otel.name = "compaction",
        otel.kind = "internal"
    )
}

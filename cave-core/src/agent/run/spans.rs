//! The run's spans, named and attributed after the OpenTelemetry GenAI semantic conventions,
//! so that any `tracing` subscriber shows a run as a tree (`tracing-opentelemetry` maps
//! `otel.name`, `otel.kind` and `otel.status_code`, and exports the rest as attributes):
//!
//! ```text
//! invoke_agent cave-agent          gen_ai.operation.name, gen_ai.request.model, usage, stop,
//! │                                the session's ledger (cave.ledger.*)
//! ├─ step                          cave.step
//! │  ├─ chat MODEL                 gen_ai.request.model, gen_ai.usage.{input,output}_tokens,
//! │                                gen_ai.usage.cache_read.input_tokens,
//! │                                gen_ai.usage.reasoning.output_tokens, cave.cost.usd
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
        gen_ai.usage.cache_read.input_tokens = Empty,
        gen_ai.usage.reasoning.output_tokens = Empty,
        cave.stop_reason = Empty,
        cave.steps = Empty,
        cave.ledger.cost_usd = Empty,
        cave.ledger.cost_reported_usd = Empty,
        cave.ledger.total_tokens = Empty,
        cave.ledger.cells = Empty,
        cave.ledger.cell_seconds = Empty,
        cave.ledger.cpu_seconds = Empty,
        cave.ledger.peak_memory = Empty,
        cave.ledger.host_calls = Empty,
        cave.ledger.mcp_calls = Empty,
        cave.ledger.egress_bytes = Empty,
        error.type = Empty,
    )
}

/// A count as an integer attribute (OpenTelemetry's integers are signed; exporters send
/// unsigned ones as text).
fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The end of a run, on its span: the run's tokens in the GenAI attributes, the session's
/// ledger in `cave.ledger.*` (the conventions have no names for money or processor time).
pub(super) fn finish_run(
    span: &Span,
    usage: Usage,
    steps: u32,
    reason: StopReason,
    ledger: &crate::Ledger,
) {
    record_usage(span, usage);
    span.record("cave.steps", i64::from(steps));
    span.record("cave.ledger.cost_usd", ledger.cost.usd);
    span.record("cave.ledger.cost_reported_usd", ledger.cost.reported);
    span.record("cave.ledger.total_tokens", int(ledger.tokens.total_tokens));
    span.record("cave.ledger.cells", int(ledger.cells));
    span.record("cave.ledger.cell_seconds", ledger.cell_seconds);
    if let Some(cpu) = ledger.cpu_seconds {
        span.record("cave.ledger.cpu_seconds", cpu);
    }
    if let Some(peak) = ledger.peak_memory {
        span.record("cave.ledger.peak_memory", int(peak));
    }
    let calls = |map: &std::collections::BTreeMap<String, u64>| {
        int(map.values().fold(0u64, |a, n| a.saturating_add(*n)))
    };
    span.record("cave.ledger.host_calls", calls(&ledger.host_calls));
    span.record("cave.ledger.mcp_calls", calls(&ledger.mcp_calls));
    span.record(
        "cave.ledger.egress_bytes",
        int(ledger.egress.sent.saturating_add(ledger.egress.received)),
    );
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
        gen_ai.usage.cache_read.input_tokens = Empty,
        gen_ai.usage.reasoning.output_tokens = Empty,
        cave.usage.estimated = Empty,
        cave.cost.usd = Empty,
        cave.cost.source = Empty,
        error.type = Empty,
    )
}

/// Tokens on a span: the GenAI attributes, the cached and reasoning ones when there are any.
fn record_usage(span: &Span, usage: Usage) {
    span.record("gen_ai.usage.input_tokens", int(usage.prompt_tokens));
    span.record("gen_ai.usage.output_tokens", int(usage.completion_tokens));
    if usage.cached_tokens > 0 {
        span.record(
            "gen_ai.usage.cache_read.input_tokens",
            int(usage.cached_tokens),
        );
    }
    if usage.reasoning_tokens > 0 {
        span.record(
            "gen_ai.usage.reasoning.output_tokens",
            int(usage.reasoning_tokens),
        );
    }
}

/// The end of a model call, on its span: its tokens and, when known, its cost (`reported` by
/// the provider, else `computed` from the price).
pub(super) fn finish_chat(
    span: &Span,
    usage: Usage,
    cost: Option<(f64, &'static str)>,
    error: Option<&crate::ModelError>,
) {
    record_usage(span, usage);
    span.record("cave.usage.estimated", usage.estimated);
    if let Some((usd, source)) = cost {
        span.record("cave.cost.usd", usd);
        span.record("cave.cost.source", source);
    }
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

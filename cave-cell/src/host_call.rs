//! A host call as every runtime makes it for a cell: in its span, able to show items in the
//! cell's output, a panic turned into the cell's exception.

use cave_core::DisplayItem;

tokio::task_local! {
    /// Where an item a host call shows goes: the running cell's output.
    static HOST_DISPLAY: std::sync::Arc<dyn Fn(DisplayItem) + Send + Sync>;
}

/// Shows `item` among the running cell's output, from inside a host function the cell called
/// (an MCP tool's image, say). Returns false outside a cell's host call, where nothing can
/// show it (the caller then says it in words).
pub fn show_from_host(item: DisplayItem) -> bool {
    HOST_DISPLAY.try_with(move |show| show(item)).is_ok()
}

/// The span of a host call a cell makes: see [`run_host_call`].
fn host_call_span(cell: &tracing::Span, name: &str) -> tracing::Span {
    tracing::info_span!(
        parent: cell,
        "execute_tool",
        otel.name = %format!("execute_tool {name}"),
        otel.kind = "internal",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = name,
        gen_ai.tool.type = "function",
        error.type = tracing::field::Empty,
    )
}

/// The cell a host call is made for, as [`run_host_call`] takes it.
#[derive(Clone)]
pub struct HostCallCell {
    /// The cell's span ([`CellOutput::span`](crate::CellOutput::span)), the parent of the
    /// call's.
    pub span: tracing::Span,
    /// Where what the call shows goes (see [`show_from_host`]).
    pub show: std::sync::Arc<dyn Fn(DisplayItem) + Send + Sync>,
    /// What counts the cell's calls and refuses those past the budget
    /// ([`CellOutput::host_calls`](crate::CellOutput::host_calls)).
    pub meter: Option<std::sync::Arc<cave_core::HostCallMeter>>,
}

impl std::fmt::Debug for HostCallCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCallCell")
            .field("span", &self.span)
            .field("meter", &self.meter)
            .finish_non_exhaustive()
    }
}

/// Runs a host call the way a runtime does around each call a cell makes: admitted by the
/// cell's meter first (counted; refused with the meter's error past the session's budget, the
/// function not called), then inside its span (`execute_tool NAME` after the OpenTelemetry
/// GenAI conventions, a child of the cell's span; `name` is the function's or
/// `object.method`, `mcp` whether it is an MCP server's tool; the error's Python type is
/// recorded when it raises), with [`show_from_host`] reaching the cell's `show`. A function
/// that panics fails its call with a `RuntimeError` naming it, instead of taking down whatever
/// runs the call.
pub async fn run_host_call<F>(
    cell: HostCallCell,
    name: &str,
    mcp: bool,
    call: F,
) -> Result<cave_core::Value, cave_core::HostError>
where
    F: std::future::Future<Output = Result<cave_core::Value, cave_core::HostError>>,
{
    if let Some(meter) = &cell.meter {
        meter.admit(name, mcp)?;
    }
    let HostCallCell {
        span: cell, show, ..
    } = cell;
    let span = host_call_span(&cell, name);
    let call = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(call));
    let result = tracing::Instrument::instrument(HOST_DISPLAY.scope(show, call), span.clone())
        .await
        .unwrap_or_else(|panic| Err(panicked(name, panic.as_ref())));
    if let Err(error) = &result {
        span.record("error.type", error.python_type.as_str());
    }
    result
}

/// The error of a host call whose function panicked, with the panic's message.
fn panicked(name: &str, panic: &(dyn std::any::Any + Send)) -> cave_core::HostError {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned());
    cave_core::HostError::new(
        "RuntimeError",
        format!("the host function {name} panicked: {message}"),
    )
}

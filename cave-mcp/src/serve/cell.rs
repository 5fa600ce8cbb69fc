//! One cell of a served session: screened by the code policy, asked about, run within its time
//! limit, and its result made MCP content (the output as the agent's runtimes give it, each
//! image a cell showed as an image).

use super::Shared;
use base64::Engine as _;
use cave_core::{
    Approval, ApprovalRequest, DisplayItem, Event, Execution, Interruption, OutputSink, Runtime,
    RuntimeExt, SecretRedactor, lock, prompt,
};
use rmcp::model::{CallToolResult, ContentBlock};
use std::sync::Mutex;
use std::time::Duration;

/// What a cell came to, for the client.
#[derive(Debug, PartialEq)]
pub(crate) struct CellResult {
    /// The output (redacted, and shortened past the inline limit), or why nothing ran.
    pub(crate) text: String,
    /// The PNG and JPEG images the cell showed: MIME type and bytes.
    pub(crate) images: Vec<(String, Vec<u8>)>,
    /// The cell raised, was refused, or was stopped.
    pub(crate) is_error: bool,
}

impl CellResult {
    fn error(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            images: Vec::new(),
            is_error: true,
        }
    }

    /// The `tools/call` result.
    pub(crate) fn into_tool_result(self) -> CallToolResult {
        let mut content = vec![ContentBlock::text(self.text)];
        for (mime, data) in self.images {
            let data = base64::engine::general_purpose::STANDARD.encode(data);
            content.push(ContentBlock::image(data, mime));
        }
        if self.is_error {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        }
    }
}

/// Keeps what a cell shows (its output comes with its result).
#[derive(Default)]
struct Shown(Mutex<Vec<DisplayItem>>);

impl OutputSink for Shown {
    fn write(&self, _chunk: &str) {}

    fn display(&self, item: DisplayItem) {
        let mut items = lock(&self.0);
        if items.len() < cave_core::MAX_DISPLAY_ITEMS {
            items.push(item);
        }
    }
}

/// Runs `code` as the session's next cell.
pub(crate) async fn run(shared: &Shared, code: String) -> CellResult {
    shared.observe(Event::Code {
        code: code.clone(),
        unclosed: false,
        tool_call: None,
    });
    if let Some(policy) = &shared.policy {
        let violations = policy.check(&code);
        if !violations.is_empty() {
            let message = cave_core::refusal_message(&violations);
            shared.observe(Event::SecurityError {
                message: message.clone(),
                violations,
            });
            return CellResult::error(message);
        }
    }
    if shared.approve_cells
        && let Some(approvals) = &shared.approvals
    {
        let request = ApprovalRequest::Cell { code: code.clone() };
        shared.observe(Event::ApprovalRequested {
            request: request.clone(),
        });
        if let Approval::Refused(reason) =
            cave_core::Approver::approve(approvals.as_ref(), &request).await
        {
            let text = prompt::cell_refused(reason.as_deref());
            shared.observe(Event::ExecutionRefused { reason });
            return CellResult::error(text.trim());
        }
    }
    let shown = Shown::default();
    let runtime = shared.runtime.as_ref();
    let execution = runtime.execute(&code, &shown);
    tokio::pin!(execution);
    let finished = match shared.cell_timeout {
        None => Some(execution.as_mut().await),
        Some(limit) => tokio::time::timeout(limit, execution.as_mut()).await.ok(),
    };
    let Some(result) = finished else {
        let limit = shared.cell_timeout.unwrap_or_default();
        return timed_out(shared, execution, limit).await;
    };
    match result {
        Ok(execution) => finished_cell(shared, execution, &shown).await,
        Err(e) => CellResult::error(format!("the runtime failed: {e}")),
    }
}

/// The cell passed its time limit: interrupted, given a moment to unwind.
async fn timed_out<F>(
    shared: &Shared,
    execution: std::pin::Pin<&mut F>,
    limit: Duration,
) -> CellResult
where
    F: Future<Output = Result<Execution, cave_core::RuntimeError>>,
{
    let interruption = shared.runtime.interrupter().map(|i| i.interrupt());
    let settled = tokio::time::timeout(cave_core::INTERRUPT_GRACE, execution).await;
    let mut state_lost = interruption == Some(Interruption::StateLost);
    if let Ok(Ok(execution)) = &settled {
        state_lost |= execution.state_lost;
    }
    let mut text = prompt::execution_timeout(limit.as_secs_f64());
    if state_lost {
        text.push_str("\n\n");
        text.push_str(prompt::STATE_LOST_NOTICE);
    }
    if settled.is_err() {
        text.push_str("\n\n");
        text.push_str(prompt::INTERRUPT_PENDING_NOTICE);
    }
    shared.observe(Event::ExecutionTimeout {
        timeout: limit.as_secs_f64(),
        state_lost,
    });
    CellResult::error(text)
}

/// A cell that ran (and may have raised): its output redacted, stored in the runtime past the
/// inline limit, and the images it showed.
async fn finished_cell(shared: &Shared, execution: Execution, shown: &Shown) -> CellResult {
    let success = execution.success();
    let output = match (execution.output.is_empty(), &execution.error) {
        (false, _) => execution.output.clone(),
        (true, Some(error)) => format!("{}: {}", error.python_type, error.message),
        (true, None) => prompt::EMPTY_OUTPUT.to_owned(),
    };
    let output = SecretRedactor::new(shared.runtime.secrets()).redact(&output);
    let spooled = execution.spooled.as_deref();
    let (mut text, persisted_variable) =
        if spooled.is_some() || output.chars().count() > shared.max_output {
            match store(
                shared.runtime.as_ref(),
                &output,
                spooled,
                &shared.persisted_floor,
            )
            .await
            {
                Ok(persisted) => (persisted.marker, Some(persisted.variable)),
                // Not stored: the whole output, rather than none of it.
                Err(e) => {
                    tracing::warn!(error = %e, "a long output could not be stored in the runtime");
                    (output.clone(), None)
                }
            }
        } else {
            (output.clone(), None)
        };
    if execution.state_lost {
        text.push_str("\n\n");
        text.push_str(prompt::STATE_LOST_NOTICE);
    }
    shared.observe(Event::ExecutionResult {
        output,
        success,
        persisted: persisted_variable.is_some(),
        persisted_variable,
        state_lost: execution.state_lost,
    });
    let images = std::mem::take(&mut *lock(&shown.0))
        .iter()
        .filter_map(|item| {
            ["image/png", "image/jpeg"].into_iter().find_map(|mime| {
                let data = item.get(mime)?;
                Some((mime.to_owned(), data.as_bytes().to_vec()))
            })
        })
        .collect();
    CellResult {
        text,
        images,
        is_error: !success,
    }
}

/// Binds a long output (the whole of it, when the runtime kept it in a file) to the next
/// `_output_N`.
async fn store(
    runtime: &dyn Runtime,
    output: &str,
    spooled: Option<&cave_core::SpooledOutput>,
    floor: &std::sync::atomic::AtomicU64,
) -> Result<cave_core::Persisted, cave_core::RuntimeError> {
    use std::sync::atomic::Ordering;
    let persisted = cave_core::persist_output(
        runtime,
        cave_core::DEFAULT_PERSISTED_PREFIX,
        output,
        spooled,
        floor.load(Ordering::SeqCst),
        cave_core::DEFAULT_PREVIEW_CHARS,
    )
    .await?;
    floor.fetch_max(persisted.index.saturating_add(1), Ordering::SeqCst);
    Ok(persisted)
}

//! The audit trail: one JSON object per line, with a UTC timestamp, for what an operator needs
//! to reconstruct a session: each run's prompt, every cell and its outcome (run, refused by the
//! policy, refused by the approver, timed out), approvals asked, host calls (through
//! [`audited`]), sandbox layers, and why each run stopped. Text fields are bounded; secrets are
//! already redacted from events.

use crate::gate::{CallGate, MethodFilter, Proceed, gate_function, gate_object};
use async_trait::async_trait;
use cave_core::lock;
use cave_core::{Args, Event, EventObserver, Function, HostError, ObjectBinding, Value};
use serde_json::{Value as Json, json};
use std::io::Write;
use std::sync::{Arc, Mutex};

/// The most characters of a text field (code, output, arguments) an audit record keeps.
pub const AUDIT_TEXT_CHARS: usize = 4000;

/// An append-only JSON Lines audit trail.
pub struct AuditLog {
    out: Mutex<Box<dyn Write + Send>>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog").finish_non_exhaustive()
    }
}

impl AuditLog {
    /// Appends to the file at `path` (created if missing).
    pub fn append(path: impl AsRef<std::path::Path>) -> std::io::Result<Arc<AuditLog>> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self::to_writer(file))
    }

    /// Writes to `out`.
    pub fn to_writer(out: impl Write + Send + 'static) -> Arc<AuditLog> {
        Arc::new(AuditLog {
            out: Mutex::new(Box::new(out)),
        })
    }

    /// Writes one record: `{"time": ..., "kind": kind, ...fields}`. A failure to write is
    /// logged, never raised: the session goes on.
    pub fn record(&self, kind: &str, fields: Json) {
        let mut record = json!({"time": timestamp(), "kind": kind});
        if let (Some(record), Json::Object(fields)) = (record.as_object_mut(), fields) {
            record.extend(fields);
        }
        let mut out = lock(&self.out);
        let written = serde_json::to_writer(&mut *out, &record)
            .map_err(std::io::Error::other)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
        if let Err(error) = written {
            tracing::error!(%error, "the audit record could not be written");
        }
    }

    /// The record of an event, for the events an audit keeps.
    pub fn event(&self, event: &Event) {
        match event {
            Event::UserPrompt { content, .. } => {
                self.record("run", json!({"prompt": bounded(content)}))
            }
            Event::Code { code, .. } => self.record("cell", json!({"code": bounded(code)})),
            Event::ApprovalRequested { request } => {
                self.record("approval_asked", json!({"request": request}));
            }
            Event::ExecutionRefused { reason } => {
                self.record("approval_refused", json!({"reason": reason}));
            }
            Event::SecurityError { message, .. } => {
                self.record("policy_refused", json!({"message": bounded(message)}));
            }
            Event::ExecutionResult {
                output,
                success,
                persisted_variable,
                state_lost,
                ..
            } => self.record(
                "cell_result",
                json!({
                    "success": success,
                    "output_chars": output.chars().count(),
                    "output": bounded(output),
                    "persisted_variable": persisted_variable,
                    "state_lost": state_lost,
                }),
            ),
            Event::ExecutionTimeout {
                timeout,
                state_lost,
            } => self.record(
                "cell_timeout",
                json!({"timeout": timeout, "state_lost": state_lost}),
            ),
            Event::SubAgent { agent, event } => {
                if matches!(
                    **event,
                    Event::UserPrompt { .. } | Event::Code { .. } | Event::Stopped { .. }
                ) {
                    self.record("sub_agent", json!({"agent": agent, "event": event}));
                }
            }
            Event::Stopped {
                stop_reason,
                steps,
                usage,
                error,
                elapsed,
                ..
            } => self.record(
                "stop",
                json!({
                    "reason": stop_reason,
                    "steps": steps,
                    "elapsed": elapsed,
                    "usage": usage,
                    "error": error,
                }),
            ),
            _ => {}
        }
    }
}

impl EventObserver for AuditLog {
    fn observe(&self, event: &Event) {
        self.event(event);
    }
}

/// At most [`AUDIT_TEXT_CHARS`] characters, with how many were left out.
fn bounded(text: &str) -> String {
    let chars = text.chars().count();
    if chars <= AUDIT_TEXT_CHARS {
        return text.to_owned();
    }
    let (kept, _) = cave_core::shorten(text, AUDIT_TEXT_CHARS);
    format!("{kept}… [{} more characters]", chars - kept.chars().count())
}

/// `2026-12-01T03:40:00.123Z`.
fn timestamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (year, month, day) = cave_core::prompt::civil_date(secs);
    let in_day = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3600,
        in_day % 3600 / 60,
        in_day % 60,
        now.subsec_millis()
    )
}

/// `function`, recording each call (its name and a bounded summary of its arguments) and
/// whether it raised. Only host functions can be audited: the calls of a Python function never
/// leave the runtime.
pub fn audited(function: Function, log: Arc<AuditLog>) -> Function {
    gate_function(function, Recording(log))
}

/// `object`, recording each call of the methods `methods` covers as a `host_call` record
/// naming `object.method`. The runtime still hands back the original object on retrieval.
pub fn audited_object(
    object: ObjectBinding,
    log: Arc<AuditLog>,
    methods: MethodFilter,
) -> ObjectBinding {
    gate_object(object, Recording(log), methods)
}

struct Recording(Arc<AuditLog>);

#[async_trait]
impl CallGate for Recording {
    async fn pass(&self, name: &str, args: Args, proceed: Proceed<'_>) -> Result<Value, HostError> {
        let arguments = args.summary(1000);
        let result = proceed(args).await;
        self.0.record(
            "host_call",
            json!({
                "function": name,
                "arguments": arguments,
                "error": result.as_ref().err().map(ToString::to_string),
            }),
        );
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn records_are_timestamped_bounded_json_lines() {
        let buffer = Shared::default();
        let log = AuditLog::to_writer(buffer.clone());
        log.event(&Event::Code {
            code: "x".repeat(AUDIT_TEXT_CHARS + 5),
            unclosed: false,
            tool_call: None,
        });
        log.event(&Event::Text {
            content: "not audited".into(),
        });
        log.record("sandbox", json!({"layers": ["network: active"]}));
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Json> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["kind"], "cell");
        assert!(
            lines[0]["code"]
                .as_str()
                .unwrap()
                .ends_with("… [5 more characters]")
        );
        let time = lines[0]["time"].as_str().unwrap();
        assert!(
            time.len() == 24 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
            "{time}"
        );
        assert_eq!(lines[1]["layers"][0], "network: active");
    }
}

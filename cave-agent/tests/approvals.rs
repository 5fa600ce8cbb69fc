//! Approvals through the agent: a refused cell is told to the model, which carries on; an
//! approved one runs; a guarded host function raises PermissionError when refused.

use cave_agent::AgentExt;
use cave_agent::RuntimeExt;
use cave_agent::testing::{Reply, ScriptedModel};
use cave_agent::{
    Agent, Approval, ApprovalRequest, Approver, Event, InProcRuntime, Resources, Runtime,
    StopReason, async_trait, requiring_approval,
};
use futures_util::StreamExt;
use std::sync::{Arc, Mutex};

/// Answers from a list, and remembers what it was asked.
struct Scripted {
    answers: Mutex<Vec<Approval>>,
    asked: Mutex<Vec<ApprovalRequest>>,
}

#[async_trait]
impl Approver for Scripted {
    async fn approve(&self, request: &ApprovalRequest) -> Approval {
        self.asked.lock().unwrap().push(request.clone());
        self.answers.lock().unwrap().remove(0)
    }
}

/// Audit records, one per line.
fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect()
}

fn scripted(answers: Vec<Approval>) -> Arc<Scripted> {
    Arc::new(Scripted {
        answers: Mutex::new(answers),
        asked: Mutex::new(Vec::new()),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_cell_is_told_to_the_model_and_an_approved_one_runs() {
    let runtime = InProcRuntime::new().expect("python");
    let approver = scripted(vec![
        Approval::Refused(Some("not the production database".into())),
        Approval::Approved,
    ]);
    let model = Arc::new(ScriptedModel::new([
        Reply::text("```python\nprint('drop everything')\n```"),
        Reply::text("```python\nprint('a dry run')\n```"),
        Reply::text("Did the dry run."),
    ]));
    let mut agent = Agent::builder(model.clone(), runtime)
        .approver(approver.clone())
        .build()
        .expect("builds");
    let events: Vec<Event> = agent.stream("Clean up.").collect().await;
    let Some(Event::Stopped { stop_reason, .. }) = events.last() else {
        panic!("{events:?}")
    };
    assert_eq!(*stop_reason, StopReason::Completed);
    let kinds: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::ApprovalRequested { .. } => Some("asked"),
            Event::ExecutionRefused { .. } => Some("refused"),
            Event::ExecutionResult { .. } => Some("ran"),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["asked", "refused", "asked", "ran"]);
    assert!(events.iter().any(|e| matches!(e, Event::ExecutionRefused { reason: Some(r) } if r == "not the production database")));
    // The model read the refusal and its reason; nothing of the refused cell ran.
    let second: String = model.requests()[1]
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect();
    assert!(
        second.contains("did not approve") && second.contains("not the production database"),
        "{second}"
    );
    assert!(!second.contains("drop everything\n"), "{second}");
    let asked = approver.asked.lock().unwrap().clone();
    assert_eq!(
        asked[0],
        ApprovalRequest::Cell {
            code: "print('drop everything')".into()
        }
    );
}

/// Sends an email (in a test, it only counts).
#[cave_agent::function]
fn send_email(to: String) -> String {
    format!("sent to {to}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_host_function_asks_first() {
    let runtime = InProcRuntime::new().expect("python");
    let approver = scripted(vec![Approval::Refused(None), Approval::Approved]);
    runtime
        .register(
            Resources::new().function(requiring_approval(send_email::function(), approver.clone())),
        )
        .await
        .expect("registers");
    let out = runtime
        .execute(
            "try:\n    send_email('a@example.org')\nexcept PermissionError as e:\n    print('refused:', e)\nprint(send_email(to='b@example.org'))",
            &cave_agent::DiscardOutput,
        )
        .await
        .expect("runs");
    assert_eq!(
        out.output,
        "refused: the user did not approve calling send_email\nsent to b@example.org\n"
    );
    let asked = approver.asked.lock().unwrap().clone();
    assert_eq!(
        asked,
        [
            ApprovalRequest::Call {
                function: "send_email".into(),
                arguments: "to='a@example.org'".into()
            },
            ApprovalRequest::Call {
                function: "send_email".into(),
                arguments: "to='b@example.org'".into()
            }
        ]
    );
    // The signature the model reads is the function's own.
    assert!(
        runtime
            .describe()
            .functions
            .contains("send_email(to: str) -> str")
    );
}

/// The audit trail of a session: its prompt, each cell and outcome, the approval asked and
/// refused, the host call with its arguments, and the stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_trail_records_the_session() {
    let path = std::env::temp_dir().join(format!("cave-audit-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let log = cave_agent::AuditLog::append(&path).expect("opens");
    let runtime = InProcRuntime::new().expect("python");
    runtime
        .register(
            Resources::new().function(cave_agent::audited(send_email::function(), log.clone())),
        )
        .await
        .expect("registers");
    let approver = scripted(vec![Approval::Approved, Approval::Refused(None)]);
    let model = ScriptedModel::new([
        Reply::text("```python\nprint(send_email('ops@example.org'))\n```"),
        Reply::text("```python\nprint('again')\n```"),
        Reply::text("Sent."),
    ]);
    let mut agent = Agent::builder(model, runtime)
        .approver(approver)
        .observer(log)
        .build()
        .expect("builds");
    let response = agent.run("Mail ops.").await;
    assert_eq!(response.stop_reason, StopReason::Completed);
    let records = json_lines(&std::fs::read_to_string(&path).expect("written"));
    let kinds: Vec<&str> = records
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "run",
            "cell",
            "approval_asked",
            "host_call",
            "cell_result",
            "cell",
            "approval_asked",
            "approval_refused",
            "stop"
        ]
    );
    assert_eq!(records[0]["prompt"], "Mail ops.");
    assert_eq!(records[3]["function"], "send_email");
    assert_eq!(records[3]["arguments"], "to='ops@example.org'");
    assert_eq!(records[4]["output"], "sent to ops@example.org\n");
    assert_eq!(records[8]["reason"], "completed");
    assert!(
        records
            .iter()
            .all(|r| r["time"].as_str().is_some_and(|t| t.ends_with('Z')))
    );
    let _ = std::fs::remove_file(&path);
}

/// A door lock: opening needs approval, reading its state does not.
#[cave_agent::object]
#[derive(Debug, Default)]
struct Door {
    /// Whether it is open.
    #[cave(get)]
    open: bool,
}

#[cave_agent::object]
impl Door {
    /// Opens the door for `who`.
    pub fn unlock(&mut self, who: String) -> String {
        self.open = true;
        format!("open for {who}")
    }
    /// Whether the door is open.
    pub fn is_open(&self) -> bool {
        self.open
    }
}

/// One method of a host object guarded and every call audited, on either runtime: the refusal
/// raises `PermissionError` in the cell, the unguarded method is not asked about, the audit
/// names `door.method`, and the host gets its own object back with the state the approved
/// call left.
async fn guarded_object_on(runtime: &impl Runtime) -> Arc<cave_agent::Shared<Door>> {
    let door = cave_agent::Shared::new(Door::default());
    let approver = scripted(vec![
        Approval::Refused(Some("at night".into())),
        Approval::Approved,
    ]);
    let buffer = SharedBuffer(Arc::new(Mutex::new(Vec::new())));
    let log = cave_agent::AuditLog::to_writer(buffer.clone());
    let binding = cave_agent::ObjectBinding::new("door", door.clone());
    let binding = cave_agent::audited_object(binding, log, cave_agent::MethodFilter::All);
    let binding = cave_agent::object_requiring_approval(
        binding,
        approver.clone(),
        cave_agent::MethodFilter::only(["unlock"]),
    );
    runtime
        .register(Resources::new().object(binding))
        .await
        .expect("registers");
    let out = runtime
        .execute(
            "try:\n    door.unlock('a stranger')\nexcept PermissionError as e:\n    print('refused:', e)\nprint(door.is_open())\nprint(door.unlock(who='the owner'))\nprint(door.open)",
            &cave_agent::DiscardOutput,
        )
        .await
        .expect("runs");
    assert_eq!(
        out.output,
        "refused: the user did not approve calling door.unlock: at night\nFalse\nopen for the owner\nTrue\n"
    );
    assert_eq!(
        approver.asked.lock().unwrap().clone(),
        [
            ApprovalRequest::Call {
                function: "door.unlock".into(),
                arguments: "who='a stranger'".into()
            },
            ApprovalRequest::Call {
                function: "door.unlock".into(),
                arguments: "who='the owner'".into()
            }
        ]
    );
    let records = json_lines(&String::from_utf8(buffer.0.lock().unwrap().clone()).expect("UTF-8"));
    let calls: Vec<&str> = records
        .iter()
        .filter(|r| r["kind"] == "host_call")
        .map(|r| r["function"].as_str().unwrap())
        .collect();
    // The refused call never reached the door, so the audit (inside the guard) did not see it;
    // reading a property is a host call too.
    assert_eq!(
        calls,
        ["door.is_open", "door.unlock", "door.open"],
        "{records:?}"
    );
    assert!(door.read().await.open);
    door
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_object_in_process() {
    let runtime = InProcRuntime::new().expect("python");
    let door = guarded_object_on(&runtime).await;
    let retrieved = runtime
        .retrieve_object::<cave_agent::Shared<Door>>("door")
        .await
        .expect("the original");
    assert!(Arc::ptr_eq(&retrieved, &door));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_object_across_the_process_boundary() {
    let runtime = cave_agent::KernelRuntime::new().expect("python");
    let door = guarded_object_on(&runtime).await;
    let retrieved = runtime
        .retrieve_object::<cave_agent::Shared<Door>>("door")
        .await
        .expect("the original");
    assert!(Arc::ptr_eq(&retrieved, &door));
    runtime.stop().await;
}

#[derive(Clone)]
struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for SharedBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A host function guarded with the agent's call approver: its request shows in the run's
/// events between the cell and its result; with `approve_cells(false)`, cells are not asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_approvals_are_announced_in_the_events() {
    let runtime = InProcRuntime::new().expect("python");
    let approver = scripted(vec![Approval::Refused(None)]);
    let model = ScriptedModel::new([
        Reply::text(
            "```python\ntry:\n    send_email('ops@example.org')\nexcept PermissionError as e:\n    print(e)\n```",
        ),
        Reply::text("Not sent."),
    ]);
    let mut builder = Agent::builder(model, runtime.clone());
    builder.approver(approver.clone()).approve_cells(false);
    let guard = builder.call_approver().expect("an approver is set");
    runtime
        .register(Resources::new().function(requiring_approval(send_email::function(), guard)))
        .await
        .expect("registers");
    let mut agent = builder.build().expect("builds");
    let events: Vec<Event> = agent.stream("Mail ops.").collect().await;
    let kinds: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::Code { .. } => Some("code"),
            Event::ApprovalRequested {
                request: ApprovalRequest::Call { function, .. },
            } => {
                assert_eq!(function, "send_email");
                Some("asked about the call")
            }
            Event::ApprovalRequested { .. } => Some("asked about something else"),
            Event::ExecutionResult { output, .. } => {
                assert_eq!(output, "the user did not approve calling send_email\n");
                Some("ran")
            }
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["code", "asked about the call", "ran"]);
    assert_eq!(approver.asked.lock().unwrap().len(), 1);
}

//! Approvals: the host decides, before it happens, whether a cell runs or a host function is
//! called. A refusal reaches the model as a refusal it can react to, not as an error.

use crate::Event;
use crate::gate::{CallGate, MethodFilter, Proceed, gate_function, gate_object};
use crate::lock;
use crate::{Args, Function, HostError, ObjectBinding, Value};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// What the agent asks about.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ApprovalRequest {
    /// Running a cell the code policy let through.
    Cell {
        /// The code.
        code: String,
    },
    /// Calling a host function, or a host object's method, that needs approval.
    Call {
        /// The function's name, or `object.method`.
        function: String,
        /// Its arguments, as Python would show them (shortened past 1000 characters).
        arguments: String,
    },
}

/// The host's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Approval {
    /// Go ahead.
    Approved,
    /// Do not; the reason, if any, is told to the model.
    Refused(Option<String>),
}

/// Decides whether the agent may run a cell or call a guarded host function.
#[async_trait]
pub trait Approver: Send + Sync {
    /// The answer to `request`.
    async fn approve(&self, request: &ApprovalRequest) -> Approval;
}

/// `function`, asking `approver` before each call; a refusal raises `PermissionError` (with
/// the reason) in the model's code. Only host functions can be guarded: a Python function runs
/// with the same powers as the model's own code, so there is nothing for a guard to hold back.
pub fn requiring_approval(function: Function, approver: Arc<dyn Approver>) -> Function {
    gate_function(function, Asking(approver))
}

/// `object`, asking `approver` before each call of the methods `methods` covers (the request
/// names the call `object.method`); a refusal raises `PermissionError` in the model's code.
/// The runtime still hands back the original object when the host retrieves it.
pub fn object_requiring_approval(
    object: ObjectBinding,
    approver: Arc<dyn Approver>,
    methods: MethodFilter,
) -> ObjectBinding {
    gate_object(object, Asking(approver), methods)
}

struct Asking(Arc<dyn Approver>);

#[async_trait]
impl CallGate for Asking {
    async fn pass(&self, name: &str, args: Args, proceed: Proceed<'_>) -> Result<Value, HostError> {
        let request = ApprovalRequest::Call {
            function: name.to_owned(),
            arguments: args.summary(1000),
        };
        match self.0.approve(&request).await {
            Approval::Approved => proceed(args).await,
            Approval::Refused(reason) => Err(HostError::new(
                "PermissionError",
                match reason {
                    Some(why) => format!("the user did not approve calling {name}: {why}"),
                    None => format!("the user did not approve calling {name}"),
                },
            )),
        }
    }
}

/// The agent's approver as host-call guards reach it: while the agent's code runs, each request
/// is also announced as an `approval_requested` event of the run.
pub(crate) struct Announcing {
    inner: Arc<dyn Approver>,
    events: Mutex<Option<mpsc::UnboundedSender<Event>>>,
}

impl Announcing {
    pub(crate) fn new(inner: Arc<dyn Approver>) -> Self {
        Self {
            inner,
            events: Mutex::new(None),
        }
    }

    /// The approver itself, for the requests the run announces on its own (cells).
    pub(crate) fn inner(&self) -> &Arc<dyn Approver> {
        &self.inner
    }

    /// Announces into `events` until the returned guard is dropped (the end of an execution,
    /// however it ends).
    pub(crate) fn announce_to(
        self: &Arc<Self>,
        events: mpsc::UnboundedSender<Event>,
    ) -> AnnounceScope {
        *lock(&self.events) = Some(events);
        AnnounceScope(self.clone())
    }
}

/// Ends an [`Announcing::announce_to`].
pub(crate) struct AnnounceScope(Arc<Announcing>);

impl Drop for AnnounceScope {
    fn drop(&mut self) {
        *lock(&self.0.events) = None;
    }
}

#[async_trait]
impl Approver for Announcing {
    async fn approve(&self, request: &ApprovalRequest) -> Approval {
        let events = lock(&self.events).clone();
        if let Some(events) = events {
            // The run forwards it before the answer matters; a finished run has no reader.
            let _ = events.send(Event::ApprovalRequested {
                request: request.clone(),
            });
        }
        self.inner.approve(request).await
    }
}

//! Approvals: the host decides, before it happens, whether a cell runs or a host function is
//! called. A refusal reaches the model as a refusal it can react to, not as an error.

use crate::{Args, Function, FunctionBody, HostError, HostFunction, Value};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

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
    /// Calling a host function that needs approval.
    Call {
        /// The function's name.
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
/// the reason) in the model's code. Only host functions can be guarded.
pub fn requiring_approval(function: Function, approver: Arc<dyn Approver>) -> Function {
    let FunctionBody::Host(inner) = function.body.clone() else {
        return function;
    };
    let guarded = Guarded {
        name: function.name.clone(),
        inner,
        approver,
    };
    function.with_body(guarded)
}

struct Guarded {
    name: String,
    inner: Arc<dyn HostFunction>,
    approver: Arc<dyn Approver>,
}

#[async_trait]
impl HostFunction for Guarded {
    async fn call(&self, args: Args) -> Result<Value, HostError> {
        let request = ApprovalRequest::Call {
            function: self.name.clone(),
            arguments: args.summary(1000),
        };
        match self.approver.approve(&request).await {
            Approval::Approved => self.inner.call(args).await,
            Approval::Refused(reason) => Err(HostError::new(
                "PermissionError",
                match reason {
                    Some(why) => format!("the user did not approve calling {}: {why}", self.name),
                    None => format!("the user did not approve calling {}", self.name),
                },
            )),
        }
    }
}

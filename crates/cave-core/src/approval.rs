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

/// Arguments as the model would read them: `name=value, ...`, at most 1000 characters.
fn summary(args: &Args) -> String {
    let mut text = args
        .values()
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect::<Vec<_>>()
        .join(", ");
    if text.chars().count() > 1000 {
        text = text.chars().take(1000).collect::<String>() + "…";
    }
    text
}

/// `function`, asking `approver` before each call; a refusal raises `PermissionError` (with
/// the reason) in the model's code. Only host functions can be guarded.
pub fn requiring_approval(function: Function, approver: Arc<dyn Approver>) -> Function {
    let FunctionBody::Host(inner) = function.body.clone() else {
        return function;
    };
    let name = function.name.clone();
    let guarded = Guarded {
        name,
        inner,
        approver,
    };
    let mut wrapped = Function::host(function.name.clone(), function.signature.clone(), guarded);
    wrapped.doc = function.doc;
    wrapped.description = function.description;
    wrapped.is_async = function.is_async;
    wrapped.hidden = function.hidden;
    wrapped.types = function.types;
    wrapped
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
            arguments: summary(&args),
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

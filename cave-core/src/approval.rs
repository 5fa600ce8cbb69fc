//! Approvals: the host decides, before it happens, whether a cell runs or a host function is
//! called. A refusal reaches the model as a refusal it can react to, not as an error.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

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

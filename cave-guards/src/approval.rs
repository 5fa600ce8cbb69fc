//! Approval before a host call: a refusal raises `PermissionError` in the model's code, which
//! can react to it.

use crate::gate::{CallGate, MethodFilter, Proceed, gate_function, gate_object};
use async_trait::async_trait;
use cave_core::{
    Approval, ApprovalRequest, Approver, Args, Function, HostError, ObjectBinding, Value,
};
use std::sync::Arc;

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
        let why = match self.0.approve(&request).await {
            Approval::Approved => return proceed(args).await,
            Approval::Refused(Some(why)) => format!(": {why}"),
            Approval::Refused(None) => String::new(),
            // An answer this version does not know is not an approval.
            _ => String::new(),
        };
        Err(HostError::new(
            "PermissionError",
            format!("the user did not approve calling {name}{why}"),
        ))
    }
}

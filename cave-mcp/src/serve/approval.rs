//! Approvals in a served session: asked of the MCP client whose `run_cell` is running, as MCP
//! elicitation.

use cave_core::{Approval, ApprovalRequest, Approver, async_trait, lock};
use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

/// A question for the client, and where its answer goes.
#[derive(Debug)]
pub(crate) struct Question {
    pub(crate) request: ApprovalRequest,
    pub(crate) answer: oneshot::Sender<Approval>,
}

/// The approver of a served session: each request (a cell with cells approved, a guarded host
/// call) goes to the client whose `run_cell` is running, as an elicitation; it is refused when
/// no request is running or the client cannot be asked. Guard the host's functions and objects
/// with it (`cave_guards`), and hand it to [`SessionServer::with_approvals`](super::SessionServer::with_approvals).
#[derive(Debug, Default)]
pub struct ClientApprovals {
    /// Where the running cell's questions go.
    asking: Mutex<Option<mpsc::UnboundedSender<Question>>>,
}

impl ClientApprovals {
    /// An approver with no cell running yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Sends the questions asked from now on to `to` (the running cell's driver).
    pub(crate) fn route(&self, to: mpsc::UnboundedSender<Question>) {
        *lock(&self.asking) = Some(to);
    }
}

#[async_trait]
impl Approver for ClientApprovals {
    async fn approve(&self, request: &ApprovalRequest) -> Approval {
        let Some(asking) = lock(&self.asking).clone() else {
            return refused("no MCP client request is running to ask");
        };
        let (answer, answered) = oneshot::channel();
        let question = Question {
            request: request.clone(),
            answer,
        };
        if asking.send(question).is_err() {
            return refused("the MCP client's request ended before it could be asked");
        }
        answered
            .await
            .unwrap_or_else(|_| refused("the MCP client's request ended before it answered"))
    }
}

/// A refusal with its reason.
pub(crate) fn refused(reason: &str) -> Approval {
    Approval::Refused(Some(reason.to_owned()))
}

/// The elicitation that asks about `request`: a form with no fields, accepted to allow.
pub(crate) fn elicitation(request: &ApprovalRequest) -> ElicitRequestParams {
    let message = match request {
        ApprovalRequest::Cell { code } => {
            format!("cave: run this Python cell? Accept to run it, decline to refuse.\n\n{code}")
        }
        ApprovalRequest::Call {
            function,
            arguments,
        } => format!(
            "cave: the running cell calls {function}({arguments}). Accept to allow the call, decline to refuse it."
        ),
        _ => "cave: allow this? Accept to allow, decline to refuse.".to_owned(),
    };
    ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: ElicitationSchema::new(Default::default()),
    }
}

/// The client's answer as an approval: only an accepted elicitation approves.
pub(crate) fn answer(result: &ElicitResult) -> Approval {
    match result.action {
        ElicitationAction::Accept => Approval::Approved,
        ElicitationAction::Decline => refused("the MCP client's user declined"),
        _ => refused("the MCP client's user cancelled"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_question_without_a_running_cell_is_refused() {
        let approvals = ClientApprovals::new();
        let request = ApprovalRequest::Call {
            function: "git.log".into(),
            arguments: "()".into(),
        };
        assert!(matches!(
            approvals.approve(&request).await,
            Approval::Refused(Some(_))
        ));
        let (to, mut questions) = mpsc::unbounded_channel();
        approvals.route(to);
        let asked = tokio::spawn({
            let approvals = approvals.clone();
            let request = request.clone();
            async move { approvals.approve(&request).await }
        });
        let question = questions.recv().await.unwrap();
        assert_eq!(question.request, request);
        question.answer.send(Approval::Approved).unwrap();
        assert_eq!(asked.await.unwrap(), Approval::Approved);
        // A driver gone without answering refuses.
        drop(questions);
        assert!(matches!(
            approvals.approve(&request).await,
            Approval::Refused(Some(_))
        ));
    }

    #[test]
    fn only_an_accepted_elicitation_approves() {
        assert_eq!(
            answer(&ElicitResult::new(ElicitationAction::Accept)),
            Approval::Approved
        );
        for action in [ElicitationAction::Decline, ElicitationAction::Cancel] {
            assert!(matches!(
                answer(&ElicitResult::new(action)),
                Approval::Refused(Some(_))
            ));
        }
        let ElicitRequestParams::FormElicitationParams { message, .. } =
            elicitation(&ApprovalRequest::Cell {
                code: "x = 1".into(),
            })
        else {
            panic!("not a form");
        };
        assert!(message.ends_with("x = 1"), "{message}");
    }
}

//! Approval requests announced as events of the run that asked them.

use crate::lock;
use crate::{Approval, ApprovalRequest, Approver, Event};
use async_trait::async_trait;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

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

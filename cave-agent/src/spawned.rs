//! The owned form of a run: the agent moves into a task, events arrive over a channel, and a
//! handle cancels the run and gives the agent back. For UIs and web handlers, where the code
//! that reads events is not the code that owns the agent.

use cave_core::{Agent, Event};
use futures_core::Stream;
use futures_util::StreamExt;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A run of an agent that was moved into its own task ([`AgentExt::spawn`](crate::AgentExt::spawn)).
///
/// It is a [`Stream`] of the run's [`Event`]s (the last one is always `Stopped`). The task
/// reads one event ahead of the handle at most, so a run whose handle is not read waits.
/// [`cancel`](RunHandle::cancel) stops the run (the execution in flight is interrupted where
/// the runtime can); [`into_agent`](RunHandle::into_agent) waits for the end of the run and
/// gives the agent back, its history valid, whether the run completed, was cancelled, or the
/// handle stopped reading.
#[must_use = "the run stops when its handle is dropped"]
pub struct RunHandle {
    events: mpsc::Receiver<Event>,
    cancel: CancellationToken,
    task: JoinHandle<Agent>,
}

impl RunHandle {
    /// Moves `agent` into a new tokio task that runs `prompt` (what
    /// [`AgentExt::spawn`](crate::AgentExt::spawn) calls). Must be called within a tokio
    /// runtime.
    pub fn spawn(agent: Agent, prompt: impl Into<String>) -> RunHandle {
        let cancel = CancellationToken::new();
        let (sender, events) = mpsc::channel(1);
        let prompt = prompt.into();
        let token = cancel.clone();
        let mut agent = agent;
        let task = tokio::spawn(async move {
            {
                let mut stream = agent.stream_until(prompt, token);
                while let Some(event) = stream.next().await {
                    if sender.send(event).await.is_err() {
                        // The handle is gone: dropping the stream stops the run cleanly.
                        break;
                    }
                }
            }
            agent
        });
        RunHandle {
            events,
            cancel,
            task,
        }
    }

    /// Stops the run: the next events end with `stopped{cancelled}`.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// A token that cancels the run, for another task (e.g. a "stop" button's handler).
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Stops reading, waits for the run to end (it is cancelled if it was still going), and
    /// gives the agent back. `None` only if the run's task panicked outside the run loop,
    /// which the loop's own guard makes a defect.
    pub async fn into_agent(self) -> Option<Agent> {
        let RunHandle {
            events,
            cancel,
            task,
        } = self;
        drop(events);
        cancel.cancel();
        task.await.ok()
    }
}

impl Stream for RunHandle {
    type Item = Event;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.events.poll_recv(cx)
    }
}

impl std::fmt::Debug for RunHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHandle")
            .field("cancelled", &self.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}

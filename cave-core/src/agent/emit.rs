//! A minimal generator: the run loop is plain async code that hands each event to the
//! consumer and waits until it is taken, so nothing runs ahead of what the consumer has seen.

use crate::Event;
use crate::lock;
use futures_core::Stream;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// The loop's handle for yielding events.
#[derive(Clone, Default)]
pub(crate) struct Emitter {
    slot: Arc<Mutex<Option<Event>>>,
    /// Who sees each event as it happens (an audit log).
    observer: Option<Arc<dyn crate::EventObserver>>,
}

impl Emitter {
    /// An emitter that shows each event to `observer`, if any.
    pub(crate) fn new(observer: Option<Arc<dyn crate::EventObserver>>) -> Self {
        Self {
            slot: Arc::default(),
            observer,
        }
    }

    /// Hands `event` to the consumer; resolves once the consumer asks for the next one.
    pub(crate) async fn emit(&self, event: Event) {
        if let Some(observer) = &self.observer {
            observer.observe(&event);
        }
        *lock(&self.slot) = Some(event);
        YieldOnce(false).await;
    }

    fn take(&self) -> Option<Event> {
        lock(&self.slot).take()
    }
}

impl std::fmt::Debug for Emitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emitter")
            .field("observed", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

/// Pending once (without a wake-up: the stream returns the event and is polled again).
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if std::mem::replace(&mut self.0, true) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// The events of one run, as a [`Stream`].
///
/// Dropping it stops the run: the in-flight execution is interrupted where the runtime can,
/// and the history is left valid for the next run.
#[must_use = "a run does nothing until its events are consumed"]
pub struct EventStream<'a> {
    run: Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>,
    emitter: Emitter,
}

impl<'a> EventStream<'a> {
    pub(crate) fn new<F>(emitter: Emitter, run: F) -> Self
    where
        F: Future<Output = ()> + Send + 'a,
    {
        Self {
            run: Some(Box::pin(run)),
            emitter,
        }
    }
}

impl Stream for EventStream<'_> {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let this = &mut *self;
        let Some(run) = this.run.as_mut() else {
            return Poll::Ready(None);
        };
        let finished = run.as_mut().poll(cx).is_ready();
        if finished {
            this.run = None;
        }
        match this.emitter.take() {
            Some(event) => Poll::Ready(Some(event)),
            None if finished => Poll::Ready(None),
            None => Poll::Pending,
        }
    }
}

impl std::fmt::Debug for EventStream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("finished", &self.run.is_none())
            .finish()
    }
}

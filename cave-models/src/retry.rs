//! `Retrying`: the built-in adapters' retries, for any `Model`.

use crate::RetryPolicy;
use crate::classify::is_retryable;
use async_trait::async_trait;
use cave_core::{ChatRequest, Delta, DeltaStream, Model, ModelError, ModelErrorKind, ModelInfo};
use futures_util::StreamExt;
use std::sync::Arc;

/// Wraps any [`Model`] with the retries the built-in adapters have: a failure of a retryable
/// kind ([`ModelErrorKind::Transient`]) before any content is retried after a backoff
/// ([`RetryPolicy`]: exponential with jitter, or the provider's `retry_after`), announced to
/// the agent as a [`Delta::backoff`] so that its idle watchdog waits. Once content has arrived,
/// a failure is passed through: the agent keeps the partial answer and resumes it.
///
/// Classify your provider's failures into [`ModelErrorKind`]s (for HTTP APIs,
/// [`classify_http`](crate::classify_http) does it as the built-in adapters do) and this
/// wrapper does the rest.
#[derive(Clone, Debug)]
pub struct Retrying<M> {
    inner: Arc<M>,
    policy: RetryPolicy,
}

impl<M: Model + 'static> Retrying<M> {
    /// `inner` with the default policy (5 retries, from 0.5 s, at most 32 s apart).
    pub fn new(inner: M) -> Self {
        Self::with_policy(inner, RetryPolicy::default())
    }

    /// `inner` with this policy.
    pub fn with_policy(inner: M, policy: RetryPolicy) -> Self {
        Self {
            inner: Arc::new(inner),
            policy,
        }
    }
}

/// Where one retrying stream is.
struct State<M> {
    inner: Arc<M>,
    policy: RetryPolicy,
    request: ChatRequest,
    current: Option<DeltaStream>,
    retries: u32,
    /// The backoff announced last, slept before the request is sent again.
    wait: Option<std::time::Duration>,
    content_seen: bool,
    done: bool,
}

impl<M: Model> State<M> {
    /// The backoff to announce for `error`, if it may be retried.
    fn backoff(&mut self, error: &ModelError) -> Option<std::time::Duration> {
        if self.content_seen
            || !is_retryable(error.kind())
            || self.retries >= self.policy.max_retries
        {
            return None;
        }
        let retry_after = match error.kind() {
            ModelErrorKind::Transient { retry_after } => *retry_after,
            _ => None,
        };
        let delay = self.policy.delay(self.retries, retry_after);
        self.retries += 1;
        tracing::warn!(attempt = self.retries, delay_s = delay.as_secs_f64(), error = %error, "model call failed; retrying");
        Some(delay)
    }

    async fn next(&mut self) -> Option<Result<Delta, ModelError>> {
        if self.done {
            return None;
        }
        if let Some(delay) = self.wait.take() {
            tokio::time::sleep(delay).await;
        }
        let stream = match self.current.as_mut() {
            Some(stream) => stream,
            None => match self.inner.stream(self.request.clone()).await {
                Ok(stream) => self.current.insert(stream),
                Err(error) => return Some(self.retry_or_fail(error)),
            },
        };
        match stream.next().await {
            None => {
                self.done = true;
                None
            }
            Some(Ok(delta)) => {
                self.content_seen |= !(delta.text.is_empty()
                    && delta.reasoning.is_empty()
                    && delta.refusal.is_empty());
                Some(Ok(delta))
            }
            Some(Err(error)) => {
                self.current = None;
                Some(self.retry_or_fail(error))
            }
        }
    }

    /// A backoff delta (after which the request is sent again), or the error.
    fn retry_or_fail(&mut self, error: ModelError) -> Result<Delta, ModelError> {
        match self.backoff(&error) {
            Some(delay) => {
                self.wait = Some(delay);
                Ok(Delta::backoff(delay))
            }
            None => {
                self.done = true;
                Err(error)
            }
        }
    }
}

#[async_trait]
impl<M: Model + 'static> Model for Retrying<M> {
    async fn stream(&self, request: ChatRequest) -> Result<DeltaStream, ModelError> {
        let state = State {
            inner: self.inner.clone(),
            policy: self.policy,
            request,
            current: None,
            retries: 0,
            wait: None,
            content_seen: false,
            done: false,
        };
        Ok(Box::pin(futures_util::stream::unfold(
            state,
            |mut state| async move {
                let item = state.next().await?;
                Some((item, state))
            },
        )))
    }

    fn info(&self) -> ModelInfo {
        self.inner.info()
    }
}

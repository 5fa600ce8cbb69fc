//! The HTTP/SSE client both adapters share: one streamed chat completion, with retries.

use crate::classify::{
    HttpFailure, classify_response, classify_stream_error, classify_transport, is_retryable,
    parse_retry_after,
};
use crate::config::{ApiKey, RetryPolicy};
use crate::wire::{ChatCompletion, ChatCompletionChunk, RequestBody};
use cave_core::{ChatRequest, Delta, DeltaStream, FinishReason, ModelError, ModelErrorKind};
use eventsource_stream::{EventStream, Eventsource};
use futures_util::stream::{BoxStream, StreamExt};
use serde_json::{Map, Value as Json};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// Everything a request needs; shared by the model and its streams.
#[derive(Debug)]
pub(crate) struct Client {
    pub(crate) http: reqwest::Client,
    pub(crate) endpoint: String,
    pub(crate) model: String,
    pub(crate) api_key: Option<ApiKey>,
    /// Removes the key from provider messages.
    pub(crate) redactor: cave_core::SecretRedactor,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) extra: Map<String, Json>,
    pub(crate) max_tokens: Option<u32>,
    /// Ask for usage in the stream; turned off for good if the server refuses the option.
    pub(crate) stream_usage: std::sync::atomic::AtomicBool,
    pub(crate) send_reasoning: bool,
    pub(crate) retry: RetryPolicy,
    /// The last stream's end being read (see [`Client::release`]); the next request waits for
    /// it briefly, so that it finds the connection back in the pool.
    pub(crate) releasing: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

type Events = EventStream<BoxStream<'static, Result<bytes::Bytes, reqwest::Error>>>;

/// The largest whole (non-streamed) completion read.
const MAX_WHOLE_BODY: usize = 32 << 20;

/// What a server answered with: an event stream, or a whole completion (a server that ignores
/// `stream: true`), read as the deltas it amounts to.
enum Body {
    Events(Events),
    Whole(Vec<Delta>),
}

impl Client {
    /// Removes the API key (and anything shaped like one) from text bound for errors and logs.
    pub(crate) fn redact(&self, text: &str) -> String {
        self.redactor.redact(text)
    }

    fn body(&self, request: &ChatRequest) -> Result<Vec<u8>, ModelError> {
        RequestBody {
            model: &self.model,
            messages: &request.messages,
            stream_usage: self.stream_usage.load(std::sync::atomic::Ordering::Relaxed),
            max_tokens: self.max_tokens,
            send_reasoning: self.send_reasoning,
            extra: &self.extra,
        }
        .to_json()
        .map_err(|e| {
            ModelError::new(
                ModelErrorKind::InvalidRequest,
                format!("could not encode the request: {e}"),
            )
        })
    }

    /// Reads the rest of a stream its reader is done with, so that the connection goes back
    /// to the pool: without it every step opened a new connection, which for a hosted model is
    /// a TLS handshake per step. After `[DONE]` only the terminating chunk is left; when the
    /// agent stops at the end of a code block, the model's last tokens, its finish and usage
    /// usually follow within milliseconds. What has already arrived is read at once, the rest
    /// in the background for at most `wait` and [`RELEASE_EVENTS`] events: a model that goes
    /// on talking past that loses the connection (closed, which stops its generation), as
    /// before.
    fn release(&self, mut events: Events, wait: Duration) {
        use futures_util::FutureExt as _;
        // Ended already (the connection is back in the pool when `events` is dropped), or broken.
        if let Some(None | Some(Err(_))) = events.next().now_or_never() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let task = runtime.spawn(async move {
            let drain = async {
                for _ in 0..RELEASE_EVENTS {
                    match events.next().await {
                        Some(Ok(_)) => {}
                        Some(Err(_)) | None => return,
                    }
                }
            };
            let _ = tokio::time::timeout(wait, drain).await;
        });
        *self.releasing.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
    }

    async fn connect(&self, body: &bytes::Bytes) -> Result<Body, ModelError> {
        let releasing = self
            .releasing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = releasing {
            let _ = tokio::time::timeout(RELEASE_BEFORE_NEXT, task).await;
        }
        let mut request = self
            .http
            .post(&self.endpoint)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .body(body.clone());
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key.expose());
        }
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        let response = request
            .send()
            .await
            .map_err(|e| classify_transport(&e, &|t| self.redact(t)))?;
        let status = response.status();
        if !status.is_success() {
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_retry_after);
            let text = response.text().await.unwrap_or_default();
            let failure = HttpFailure {
                status: status.as_u16(),
                body: &text,
                retry_after,
            };
            return Err(classify_response(&failure, &|t| self.redact(t)));
        }
        // The content type decides how the body is read.
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        if content_type.starts_with("application/json") {
            let text = self.read_bounded(response).await?;
            return self.whole(&text).map(Body::Whole);
        }
        if !content_type.is_empty() && !content_type.starts_with("text/event-stream") {
            let text = self.read_bounded(response).await.unwrap_or_default();
            let start: String = self.redact(&text).chars().take(200).collect();
            return Err(ModelError::new(
                ModelErrorKind::Other,
                format!(
                    "the model server answered with {content_type}, neither an event stream nor JSON (is the base URL the API's?); it began: {start:?}"
                ),
            ));
        }
        let bytes: BoxStream<'static, Result<bytes::Bytes, reqwest::Error>> =
            response.bytes_stream().boxed();
        Ok(Body::Events(bytes.eventsource()))
    }

    /// A body, up to [`MAX_WHOLE_BODY`] bytes.
    async fn read_bounded(&self, response: reqwest::Response) -> Result<String, ModelError> {
        let mut body = Vec::new();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| classify_transport(&e, &|t| self.redact(t)))?;
            if body.len() + chunk.len() > MAX_WHOLE_BODY {
                return Err(ModelError::new(
                    ModelErrorKind::Other,
                    format!(
                        "the model server's answer is larger than {} MiB",
                        MAX_WHOLE_BODY >> 20
                    ),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// A whole completion as the deltas a stream of it would have carried.
    fn whole(&self, text: &str) -> Result<Vec<Delta>, ModelError> {
        let completion: ChatCompletion = serde_json::from_str(text).map_err(|e| {
            let shown: String = self.redact(text).chars().take(200).collect();
            ModelError::new(
                ModelErrorKind::StreamInterrupted,
                format!("the model sent JSON that is not a chat completion ({e}): {shown}"),
            )
        })?;
        if let Some(error) = &completion.error {
            return Err(classify_stream_error(error, &|t| self.redact(t)));
        }
        let mut delta = Delta::default();
        if let Some(choice) = completion.choices.into_iter().next() {
            if let Some(message) = choice.message {
                delta.text = message.content.unwrap_or_default();
                delta.reasoning = message
                    .reasoning_content
                    .or(message.reasoning)
                    .unwrap_or_default();
                delta.refusal = message.refusal.unwrap_or_default();
                delta.tool_calls = crate::wire::tool_call_deltas(message.tool_calls);
            }
            delta.finish_reason = choice
                .finish_reason
                .as_deref()
                .map(FinishReason::from_provider);
        }
        delta.usage = completion
            .usage
            .map(|u| u.to_usage())
            .filter(|u| u.total_tokens > 0);
        Ok(vec![delta])
    }
}

/// Streams one chat completion: connects (retrying transient failures with backoff, each
/// announced as a `Delta::backoff`), then turns server-sent chunks into deltas. A stream that
/// breaks before any content reconnects; after content, the break is reported so the agent
/// can keep the partial answer; after the finish reason, it just ends.
pub(crate) fn stream(
    client: Arc<Client>,
    request: &ChatRequest,
) -> Result<DeltaStream, ModelError> {
    let body = client.body(request)?.into();
    let state = StreamState::new(client, body, None);
    Ok(Box::pin(futures_util::stream::unfold(
        state,
        |mut state| async move {
            let item = state.next().await?;
            Some((item, state))
        },
    )))
}

/// `body` without its `stream_options` (for a server that refuses them; rare enough that the
/// body is read back rather than the request kept for it).
fn without_stream_options(body: &[u8]) -> Result<bytes::Bytes, ModelError> {
    let invalid = |e: serde_json::Error| {
        ModelError::new(
            ModelErrorKind::InvalidRequest,
            format!("could not encode the request: {e}"),
        )
    };
    let mut json: Map<String, Json> = serde_json::from_slice(body).map_err(invalid)?;
    json.remove("stream_options");
    Ok(serde_json::to_vec(&json).map_err(invalid)?.into())
}

/// How long a stream's end is awaited after `[DONE]` to keep its connection.
const RELEASE_WAIT: Duration = Duration::from_secs(5);
/// How long the rest of an answer is read after its reader stopped early (at a code block's
/// end) to keep the connection: a model that stops there ends within this.
const TAIL_WAIT: Duration = Duration::from_millis(250);
/// How many events a stream's end may still bring (read and ignored) to keep the connection.
const RELEASE_EVENTS: usize = 16;
/// How long a request waits for the last stream's end before it opens a connection of its own.
const RELEASE_BEFORE_NEXT: Duration = Duration::from_millis(50);

struct StreamState {
    client: Arc<Client>,
    /// Sent again as it is by each attempt (the history, once serialised, is not copied).
    body: bytes::Bytes,
    events: Option<Events>,
    retries: u32,
    /// A backoff to sleep before the next connection attempt.
    wait: Option<Duration>,
    /// Content (text, reasoning or refusal) arrived: no more reconnects.
    content_seen: bool,
    /// The finish reason arrived: only usage may follow.
    finished: bool,
    done: bool,
    pending: VecDeque<Delta>,
}

impl Drop for StreamState {
    fn drop(&mut self) {
        if let Some(events) = self.events.take() {
            self.client.release(events, TAIL_WAIT);
        }
    }
}

impl StreamState {
    /// A stream about to connect (or reading `events` already).
    fn new(client: Arc<Client>, body: bytes::Bytes, events: Option<Events>) -> Self {
        Self {
            client,
            body,
            events,
            retries: 0,
            wait: None,
            content_seen: false,
            finished: false,
            done: false,
            pending: VecDeque::new(),
        }
    }

    async fn next(&mut self) -> Option<Result<Delta, ModelError>> {
        loop {
            if let Some(delta) = self.pending.pop_front() {
                return Some(Ok(delta));
            }
            if self.done {
                return None;
            }
            let Some(events) = self.events.as_mut() else {
                if let Some(delay) = self.wait.take() {
                    tokio::time::sleep(delay).await;
                }
                match self.client.connect(&self.body).await {
                    Ok(Body::Events(events)) => self.events = Some(events),
                    Ok(Body::Whole(deltas)) => {
                        self.content_seen = true;
                        self.pending.extend(deltas);
                        self.done = true;
                    }
                    Err(error) if self.refuses_stream_options(&error) => {
                        tracing::info!(error = %error, "the server refuses stream_options; asking again without (usage will be estimated)");
                        self.client
                            .stream_usage
                            .store(false, std::sync::atomic::Ordering::Relaxed);
                        match without_stream_options(&self.body) {
                            Ok(body) => self.body = body,
                            Err(e) => {
                                self.done = true;
                                return Some(Err(e));
                            }
                        }
                    }
                    Err(error) => {
                        if let Some(backoff) = self.backoff_for(&error) {
                            return Some(Ok(backoff));
                        }
                        self.done = true;
                        return Some(Err(error));
                    }
                }
                continue;
            };
            match events.next().await {
                None => {
                    self.done = true;
                    return None;
                }
                Some(Err(error)) => {
                    self.events = None;
                    if self.finished {
                        // Only optional usage was still to come.
                        self.done = true;
                        return None;
                    }
                    let error = match error {
                        eventsource_stream::EventStreamError::Transport(e) => {
                            let e = classify_transport(&e, &|t| self.client.redact(t));
                            ModelError::new(
                                ModelErrorKind::StreamInterrupted,
                                e.message().to_owned(),
                            )
                        }
                        other => ModelError::new(
                            ModelErrorKind::StreamInterrupted,
                            format!("the model's event stream is malformed: {other}"),
                        ),
                    };
                    if !self.content_seen
                        && let Some(backoff) = self.backoff_for(&ModelError::new(
                            ModelErrorKind::Transient { retry_after: None },
                            error.message().to_owned(),
                        ))
                    {
                        tracing::warn!(error = %error, "the model stream broke before any content; reconnecting");
                        return Some(Ok(backoff));
                    }
                    self.done = true;
                    return Some(Err(error));
                }
                Some(Ok(event)) => {
                    let data = event.data.trim();
                    if data == "[DONE]" {
                        self.done = true;
                        if let Some(events) = self.events.take() {
                            self.client.release(events, RELEASE_WAIT);
                        }
                        return None;
                    }
                    if data.is_empty() {
                        continue;
                    }
                    let chunk: ChatCompletionChunk = match serde_json::from_str(data) {
                        Ok(chunk) => chunk,
                        Err(e) => {
                            self.done = true;
                            let shown: String =
                                self.client.redact(data).chars().take(200).collect();
                            return Some(Err(ModelError::new(
                                ModelErrorKind::StreamInterrupted,
                                format!(
                                    "the model sent a chunk that is not a chat completion ({e}): {shown}"
                                ),
                            )));
                        }
                    };
                    if let Some(error) = &chunk.error {
                        self.done = true;
                        if self.finished {
                            return None;
                        }
                        return Some(Err(classify_stream_error(error, &|t| {
                            self.client.redact(t)
                        })));
                    }
                    self.absorb(chunk);
                }
            }
        }
    }

    /// Queues the deltas of one chunk.
    fn absorb(&mut self, chunk: ChatCompletionChunk) {
        let mut out = Delta::default();
        for choice in chunk.choices.into_iter().take(1) {
            if let Some(delta) = choice.delta {
                out.text = delta.content.unwrap_or_default();
                out.reasoning = delta
                    .reasoning_content
                    .or(delta.reasoning)
                    .unwrap_or_default();
                out.refusal = delta.refusal.unwrap_or_default();
                out.tool_calls = crate::wire::tool_call_deltas(delta.tool_calls);
            }
            out.finish_reason = choice
                .finish_reason
                .as_deref()
                .map(FinishReason::from_provider);
        }
        out.usage = chunk
            .usage
            .map(|u| u.to_usage())
            .filter(|u| u.total_tokens > 0);
        self.content_seen |= !(out.text.is_empty()
            && out.reasoning.is_empty()
            && out.refusal.is_empty()
            && out.tool_calls.is_empty());
        self.finished |= out.finish_reason.is_some();
        let empty = out == Delta::default();
        if !empty {
            self.pending.push_back(out);
        }
    }

    /// The server rejected the request because of `stream_options` (some providers behind a
    /// LiteLLM proxy do), and it was sent.
    fn refuses_stream_options(&self, error: &ModelError) -> bool {
        matches!(error.kind(), ModelErrorKind::InvalidRequest)
            && error.message().contains("stream_options")
            && self
                .client
                .stream_usage
                .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The backoff delta for a retryable failure, if a retry is left.
    fn backoff_for(&mut self, error: &ModelError) -> Option<Delta> {
        if self.content_seen
            || !is_retryable(error.kind())
            || self.retries >= self.client.retry.max_retries
        {
            return None;
        }
        let retry_after = match error.kind() {
            ModelErrorKind::Transient { retry_after } => *retry_after,
            _ => None,
        };
        let delay = self.client.retry.delay(self.retries, retry_after);
        self.retries += 1;
        tracing::warn!(attempt = self.retries, delay_s = delay.as_secs_f64(), error = %error, "model request failed; retrying");
        self.wait = Some(delay);
        // The message is already redacted (classify runs every provider text through `redact`).
        let backoff = Delta::backoff(delay);
        Some(match error.message() {
            "" => backoff,
            message => backoff.with_backoff_reason(message),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a model server could stream, cut into pieces as the network cuts it, read by the
    /// SSE parser and the chunk reader: every stream ends in deltas, an error or its end,
    /// never a panic or a reconnect loop (`cargo xtask fuzz` runs a million cases).
    #[test]
    fn fuzz_event_streams_from_the_server() {
        let client = Arc::new(Client {
            http: reqwest::Client::new(),
            endpoint: "http://127.0.0.1:9/chat/completions".to_owned(),
            model: "m".to_owned(),
            api_key: Some(ApiKey::new("sk-fuzz-secret")),
            redactor: cave_core::SecretRedactor::for_api_key(Some("sk-fuzz-secret")),
            headers: Vec::new(),
            extra: Map::new(),
            max_tokens: None,
            stream_usage: true.into(),
            send_reasoning: false,
            // No retry: a broken stream ends the case instead of reconnecting.
            retry: RetryPolicy {
                max_retries: 0,
                ..RetryPolicy::default()
            },
            releasing: Default::default(),
        });
        let chunk = |delta: &str| {
            format!(
                "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":null}}]}}\n\n"
            )
        };
        let seeds: Vec<Vec<u8>> = [
            chunk(r#"{"role":"assistant","content":"Hello ```python\nprint(1)\n```"}"#)
                + &chunk(r#"{"reasoning_content":"think"}"#)
                + "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"total_tokens\":7}}\n\n"
                + "data: [DONE]\n\n",
            chunk(r#"{"content":"partial"}"#)
                + "data: {\"error\":{\"message\":\"overloaded sk-abc\",\"type\":\"server_error\",\"code\":529}}\n\n",
            ": keep-alive\r\n\r\nevent: message\r\nid: 7\r\nretry: 10\r\ndata: {\"choices\":[]}\r\n\r\n".to_owned(),
        ]
        .into_iter()
        .map(String::into_bytes)
        .collect();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        // The harness reads what it is given: the first seed, whole, is an answer.
        let mut whole = StreamState::new(
            client.clone(),
            bytes::Bytes::new(),
            Some(
                futures_util::stream::iter([Ok(bytes::Bytes::from(seeds[0].clone()))])
                    .boxed()
                    .eventsource(),
            ),
        );
        let text = runtime.block_on(async {
            let mut text = String::new();
            while let Some(Ok(delta)) = whole.next().await {
                text.push_str(&delta.text);
            }
            text
        });
        assert_eq!(text, "Hello ```python\nprint(1)\n```");
        let mut cuts = cave_testing::fuzz::Rng::new(11);
        cave_testing::fuzz::soak("sse-stream", &seeds, |input| {
            // Cut as the network would: pieces of 1 to 64 bytes.
            let mut pieces = Vec::new();
            let mut rest = input;
            while !rest.is_empty() {
                let n = (1 + cuts.below(64)).min(rest.len());
                pieces.push(Ok(bytes::Bytes::copy_from_slice(&rest[..n])));
                rest = &rest[n..];
            }
            let events: Events = futures_util::stream::iter(pieces).boxed().eventsource();
            let mut state = StreamState::new(client.clone(), bytes::Bytes::new(), Some(events));
            runtime.block_on(async {
                // Bounded: a stream of n bytes yields at most n deltas and one end.
                for _ in 0..=input.len() + 1 {
                    match state.next().await {
                        None => return,
                        Some(Err(error)) => {
                            assert!(!error.message().contains("sk-fuzz-secret"));
                        }
                        Some(Ok(delta)) => {
                            assert!(delta.backoff.is_none(), "no retry was allowed");
                        }
                    }
                }
                panic!("the stream did not end");
            });
        });
    }
}

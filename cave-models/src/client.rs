//! One streamed chat completion through async-openai's client (its bring-your-own-types
//! call: our request body, written once from the conversation, and our chunk type), with
//! retries announced to the agent.

use crate::classify::{classify_stream_error, is_retryable};
use crate::transport::Transport;
use crate::wire::{ChatCompletionChunk, RequestBody};
use async_openai::error::OpenAIError;
use cave_core::{ChatRequest, Delta, DeltaStream, FinishReason, ModelError, ModelErrorKind};
use futures_util::future::BoxFuture;
use futures_util::stream::{Stream, StreamExt};
use serde_json::{Map, Value as Json};
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The chunks of one streamed completion, as async-openai yields them.
pub(crate) type Chunks =
    Pin<Box<dyn Stream<Item = Result<ChatCompletionChunk, OpenAIError>> + Send>>;

/// The chat-completions call of an async-openai client, whatever its configuration type
/// (`OpenAIConfig`, `AzureConfig`, ours): the adapters hold one without being generic.
pub(crate) trait ChatApi: Send + Sync {
    /// `create_stream_byot` with our body and chunk types.
    fn stream<'a>(
        &'a self,
        body: &'a RequestBody<'a>,
    ) -> BoxFuture<'a, Result<Chunks, OpenAIError>>;
}

impl<C: async_openai::config::Config + 'static> ChatApi for async_openai::Client<C> {
    fn stream<'a>(
        &'a self,
        body: &'a RequestBody<'a>,
    ) -> BoxFuture<'a, Result<Chunks, OpenAIError>> {
        Box::pin(async move { self.chat().create_stream_byot(body).await })
    }
}

/// Everything a request needs; shared by the model and its streams.
pub(crate) struct Client {
    pub(crate) api: Box<dyn ChatApi>,
    /// The HTTP layer under `api`: classifies failures and redacts what providers say.
    pub(crate) transport: Transport,
    pub(crate) model: String,
    pub(crate) extra: Map<String, Json>,
    pub(crate) max_tokens: Option<u32>,
    /// Ask for usage in the stream; turned off for good if the server refuses the option.
    pub(crate) stream_usage: AtomicBool,
    pub(crate) send_reasoning: bool,
    pub(crate) retry: crate::config::RetryPolicy,
}

impl std::fmt::Debug for Client {
    // The client's configuration holds the key: left out whole.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("model", &self.model)
            .field("max_tokens", &self.max_tokens)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// Streams one chat completion: connects (retrying transient failures with backoff, each
/// announced as a `Delta::backoff`), then turns server-sent chunks into deltas. A stream that
/// breaks before any content reconnects; after content, the break is reported so the agent
/// can keep the partial answer; after the finish reason, it just ends.
pub(crate) fn stream(client: Arc<Client>, request: ChatRequest) -> DeltaStream {
    let state = StreamState::new(client, request, None);
    Box::pin(futures_util::stream::unfold(
        state,
        |mut state| async move {
            let item = state.next().await?;
            Some((item, state))
        },
    ))
}

struct StreamState {
    client: Arc<Client>,
    /// Written into each attempt's body (once per attempt: the history is not copied).
    request: ChatRequest,
    chunks: Option<Chunks>,
    retries: u32,
    /// A backoff to sleep before the next connection attempt.
    wait: Option<Duration>,
    /// Content (text, reasoning or refusal) arrived: no more reconnects.
    content_seen: bool,
    /// The finish reason arrived: only usage may follow.
    finished: bool,
    done: bool,
    /// The cost a LiteLLM proxy put in the response's headers, told with the usage.
    header_cost: Option<f64>,
    pending: VecDeque<Delta>,
}

impl StreamState {
    /// A stream about to connect (or reading `chunks` already).
    fn new(client: Arc<Client>, request: ChatRequest, chunks: Option<Chunks>) -> Self {
        Self {
            client,
            request,
            chunks,
            retries: 0,
            wait: None,
            content_seen: false,
            finished: false,
            done: false,
            header_cost: None,
            pending: VecDeque::new(),
        }
    }

    /// Opens the stream. Takes the parts it reads, not `self`: a stream being read is not
    /// `Sync`, and the future must be `Send`.
    async fn connect(
        client: &Client,
        request: &ChatRequest,
    ) -> Result<(Chunks, Option<f64>), ModelError> {
        let body = RequestBody {
            model: &client.model,
            messages: &request.messages,
            stream_usage: client.stream_usage.load(Ordering::Relaxed),
            max_tokens: client.max_tokens,
            send_reasoning: client.send_reasoning,
            extra: &client.extra,
        };
        let cost = crate::transport::ResponseCost::default();
        let chunks = crate::transport::RESPONSE_COST
            .scope(cost.clone(), client.api.stream(&body))
            .await
            .map_err(|e| client.transport.model_error(e))?;
        Ok((chunks, cost.get()))
    }

    async fn next(&mut self) -> Option<Result<Delta, ModelError>> {
        loop {
            if let Some(delta) = self.pending.pop_front() {
                return Some(Ok(delta));
            }
            if self.done {
                return None;
            }
            let Some(chunks) = self.chunks.as_mut() else {
                if let Some(delay) = self.wait.take() {
                    tokio::time::sleep(delay).await;
                }
                match Self::connect(&self.client, &self.request).await {
                    Ok((chunks, cost)) => {
                        self.chunks = Some(chunks);
                        self.header_cost = cost;
                    }
                    Err(error) if self.refuses_stream_options(&error) => {
                        tracing::info!(error = %error, "the server refuses stream_options; asking again without (usage will be estimated)");
                        self.client.stream_usage.store(false, Ordering::Relaxed);
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
            match chunks.next().await {
                None => {
                    self.done = true;
                    return None;
                }
                // An event with no data, or `[DONE]` with spaces around it.
                Some(Err(OpenAIError::JSONDeserialize(_, data))) if data.trim().is_empty() => {}
                Some(Err(OpenAIError::JSONDeserialize(_, data))) if data.trim() == "[DONE]" => {
                    self.chunks = None;
                    self.done = true;
                    return None;
                }
                Some(Err(error @ OpenAIError::JSONDeserialize(..))) => {
                    self.chunks = None;
                    self.done = true;
                    return Some(Err(self.client.transport.model_error(error)));
                }
                Some(Err(error)) => {
                    self.chunks = None;
                    if self.finished {
                        // Only optional usage was still to come.
                        self.done = true;
                        return None;
                    }
                    let error = self.client.transport.model_error(error);
                    let error = ModelError::new(
                        ModelErrorKind::StreamInterrupted,
                        error.message().to_owned(),
                    );
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
                Some(Ok(chunk)) => {
                    if let Some(error) = &chunk.error {
                        self.done = true;
                        self.chunks = None;
                        if self.finished {
                            return None;
                        }
                        return Some(Err(classify_stream_error(error, &|t| {
                            self.client.transport.redact(t)
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
            .as_ref()
            .map(|u| u.to_usage())
            .filter(|u| u.total_tokens > 0);
        out.reported_cost = chunk
            .usage
            .as_ref()
            .and_then(|u| u.cost())
            .or_else(|| out.usage.and(self.header_cost.take()));
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
            && self.client.stream_usage.load(Ordering::Relaxed)
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
    use crate::config::{ApiKey, RetryPolicy};
    use crate::transport::Endpoint;
    use async_openai::middleware::HttpRequestFactory;
    use std::sync::Mutex;

    /// A transport that answers every request with the bytes it was given, in those pieces.
    #[derive(Clone, Default)]
    struct Canned(Arc<Mutex<Vec<bytes::Bytes>>>);

    impl tower::Service<HttpRequestFactory> for Canned {
        type Response = reqwest::Response;
        type Error = OpenAIError;
        type Future = BoxFuture<'static, Result<reqwest::Response, OpenAIError>>;

        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), OpenAIError>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: HttpRequestFactory) -> Self::Future {
            let pieces = std::mem::take(&mut *self.0.lock().unwrap());
            let body = futures_util::stream::iter(pieces.into_iter().map(Ok::<_, std::io::Error>));
            let mut response = http::Response::new(reqwest::Body::wrap_stream(body));
            response.headers_mut().insert(
                reqwest::header::CONTENT_TYPE,
                reqwest::header::HeaderValue::from_static("text/event-stream"),
            );
            Box::pin(async move { Ok(reqwest::Response::from(response)) })
        }
    }

    /// What a model server could stream, cut into pieces as the network cuts it, read by
    /// async-openai's SSE reader and our chunk reader: every stream ends in deltas, an error or
    /// its end, never a panic or a reconnect loop (`cargo xtask fuzz` runs a million cases).
    #[test]
    fn fuzz_event_streams_from_the_server() {
        let canned = Canned::default();
        let key = ApiKey::new("sk-fuzz-secret");
        let redactor = cave_core::SecretRedactor::for_api_key(Some(key.expose()));
        let endpoint = Endpoint::new("http://127.0.0.1:9/v1", Some(&key), None, None).unwrap();
        let http = reqwest::Client::new();
        let api =
            async_openai::Client::build(http.clone(), endpoint).with_http_service(canned.clone());
        let client = Arc::new(Client {
            api: Box::new(api),
            transport: Transport::new(http, redactor),
            model: "m".to_owned(),
            extra: Map::new(),
            max_tokens: None,
            stream_usage: true.into(),
            send_reasoning: false,
            // No retry: a broken stream ends the case instead of reconnecting.
            retry: RetryPolicy {
                max_retries: 0,
                ..RetryPolicy::default()
            },
        });
        let request = || {
            ChatRequest::new(vec![cave_core::ChatMessage::new(
                cave_core::ChatRole::User,
                "hi",
            )])
        };
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
        *canned.0.lock().unwrap() = vec![bytes::Bytes::from(seeds[0].clone())];
        let mut whole = StreamState::new(client.clone(), request(), None);
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
                pieces.push(bytes::Bytes::copy_from_slice(&rest[..n]));
                rest = &rest[n..];
            }
            *canned.0.lock().unwrap() = pieces;
            let mut state = StreamState::new(client.clone(), request(), None);
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

//! The HTTP layer under async-openai's client: a tower service that sends each request with
//! our `reqwest::Client`, classifies a failed response while its headers are at hand
//! (`Retry-After`), reads a whole JSON completion as the one event it amounts to, and keeps
//! the connection for the next step by reading a stream's end after its reader let it go.

use crate::classify::{HttpFailure, classify_response, classify_transport, parse_retry_after};
use async_openai::error::OpenAIError;
use async_openai::middleware::HttpRequestFactory;
use bytes::Bytes;
use cave_core::{ModelError, ModelErrorKind, SecretRedactor};
use futures_util::stream::{BoxStream, Stream, StreamExt};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

/// The largest whole (non-streamed) completion read.
const MAX_WHOLE_BODY: usize = 32 << 20;
/// How long a stream's end is awaited after `[DONE]` to keep its connection.
const RELEASE_WAIT: Duration = Duration::from_secs(5);
/// How long the rest of an answer is read after its reader stopped early (at a code block's
/// end) to keep the connection: a model that stops there ends within this.
const TAIL_WAIT: Duration = Duration::from_millis(250);
/// How many bytes a stream's end may still bring (read and ignored) to keep the connection.
const RELEASE_BYTES: usize = 64 << 10;
/// How long a request waits for the last stream's end before it opens a connection of its own.
const RELEASE_BEFORE_NEXT: Duration = Duration::from_millis(50);

/// The header a LiteLLM proxy says a response's cost in, US dollars (zero while a stream has
/// not ended: its cost then comes in the usage, with the proxy's
/// `include_cost_in_streaming_usage`).
const LITELLM_COST: &str = "x-litellm-response-cost";

/// Where a response's reported cost goes on its way from the transport, under async-openai,
/// back to the stream that sent the request (the request is sent within the caller's task).
#[derive(Clone, Debug, Default)]
pub(crate) struct ResponseCost(Arc<std::sync::Mutex<Option<f64>>>);

impl ResponseCost {
    fn set(&self, usd: f64) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(usd);
    }
    /// The cost the response reported, if it did.
    pub(crate) fn get(&self) -> Option<f64> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

tokio::task_local! {
    /// The slot of the request being sent (see [`ResponseCost`]).
    pub(crate) static RESPONSE_COST: ResponseCost;
}

/// What async-openai's client sends its requests through (installed with
/// `Client::with_http_service`); cheap to clone, one per model.
#[derive(Clone, Debug)]
pub(crate) struct Transport {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    http: reqwest::Client,
    /// Removes the key from provider messages.
    redactor: SecretRedactor,
    /// The last stream's end being read; the next request waits for it briefly, so that it
    /// finds the connection back in the pool.
    releasing: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// A failure the transport classified itself, carried through async-openai as
/// [`OpenAIError::Boxed`] and taken out again by [`model_error`].
#[derive(Debug)]
struct Classified(ModelError);

impl std::fmt::Display for Classified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Classified {}

fn classified(error: ModelError) -> OpenAIError {
    OpenAIError::Boxed(Box::new(Classified(error)))
}

impl Transport {
    /// Sends through `http`; `redactor` cleans what providers say before it is kept.
    pub(crate) fn new(http: reqwest::Client, redactor: SecretRedactor) -> Self {
        Self {
            inner: Arc::new(Inner {
                http,
                redactor,
                releasing: Mutex::new(None),
            }),
        }
    }

    /// Removes the API key (and anything shaped like one) from text bound for errors and logs.
    pub(crate) fn redact(&self, text: &str) -> String {
        self.inner.redactor.redact(text)
    }

    /// The model error an async-openai call failed with: ours as classified here, else the
    /// closest kind for what async-openai reports.
    pub(crate) fn model_error(&self, error: OpenAIError) -> ModelError {
        let redact = |t: &str| self.redact(t);
        match error {
            OpenAIError::Boxed(boxed) => match boxed.downcast::<Classified>() {
                Ok(ours) => ours.0,
                Err(other) => ModelError::new(
                    ModelErrorKind::Other,
                    redact(&cave_core::error_chain(other.as_ref())),
                ),
            },
            OpenAIError::Reqwest(e) => classify_transport(&e, &redact),
            OpenAIError::ApiError(response) => {
                // A client whose own transport answered (not ours): its error object as a body.
                let body = serde_json::json!({ "error": response.api_error }).to_string();
                classify_response(
                    &HttpFailure {
                        status: response.status_code.as_u16(),
                        body: &body,
                        retry_after: None,
                    },
                    &redact,
                )
            }
            OpenAIError::JSONDeserialize(e, content) => {
                let redacted = redact(&content);
                let (shown, _) = cave_core::shorten(&redacted, 200);
                ModelError::new(
                    ModelErrorKind::StreamInterrupted,
                    format!("the model sent a chunk that is not a chat completion ({e}): {shown}"),
                )
            }
            OpenAIError::StreamError(e) => ModelError::new(
                ModelErrorKind::StreamInterrupted,
                format!("the model's event stream broke: {}", redact(&e.to_string())),
            ),
            OpenAIError::InvalidArgument(message) => ModelError::new(
                ModelErrorKind::InvalidRequest,
                format!("could not encode the request: {}", redact(&message)),
            ),
            other => ModelError::new(ModelErrorKind::Other, redact(&other.to_string())),
        }
    }

    async fn send(self, factory: HttpRequestFactory) -> Result<reqwest::Response, OpenAIError> {
        let inner = &self.inner;
        let releasing = inner
            .releasing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = releasing {
            let _ = tokio::time::timeout(RELEASE_BEFORE_NEXT, task).await;
        }
        let mut request = factory.build().await?;
        request
            .headers_mut()
            .entry(reqwest::header::ACCEPT)
            .or_insert(reqwest::header::HeaderValue::from_static(
                "text/event-stream",
            ));
        let redact = |t: &str| self.redact(t);
        let response = inner
            .http
            .execute(request)
            .await
            .map_err(|e| classified(classify_transport(&e, &redact)))?;
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
            return Err(classified(classify_response(&failure, &redact)));
        }
        // Read while the headers are at hand, for the stream that asked (`RESPONSE_COST`).
        if let Some(cost) = response
            .headers()
            .get(LITELLM_COST)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|c| c.is_finite() && *c > 0.0)
        {
            let _ = RESPONSE_COST.try_with(|slot| slot.set(cost));
        }
        // The content type decides how the body is read.
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        if content_type.starts_with("application/json") {
            // A server that ignores `stream: true`: its completion is the stream's one event
            // (the chunk type reads a `message` as a `delta`).
            let text = self.read_bounded(response).await?;
            return Ok(event_stream_response(&text));
        }
        if !content_type.is_empty() && !content_type.starts_with("text/event-stream") {
            let text = self.read_bounded(response).await.unwrap_or_default();
            let redacted = self.redact(&text);
            let (start, _) = cave_core::shorten(&redacted, 200);
            return Err(classified(ModelError::new(
                ModelErrorKind::Other,
                format!(
                    "the model server answered with {content_type}, neither an event stream nor JSON (is the base URL the API's?); it began: {start:?}"
                ),
            )));
        }
        let mut parts = http::Response::builder().status(status);
        if let Some(headers) = parts.headers_mut() {
            *headers = response.headers().clone();
        }
        let body = Releasing {
            bytes: Some(response.bytes_stream().boxed()),
            transport: self.inner.clone(),
            tail: Vec::new(),
            done_seen: false,
        };
        let rebuilt = parts
            .body(reqwest::Body::wrap_stream(body))
            .map_err(|e| classified(ModelError::new(ModelErrorKind::Other, e.to_string())))?;
        Ok(reqwest::Response::from(rebuilt))
    }

    /// A body, up to [`MAX_WHOLE_BODY`] bytes.
    async fn read_bounded(&self, response: reqwest::Response) -> Result<String, OpenAIError> {
        let mut body = Vec::new();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk =
                chunk.map_err(|e| classified(classify_transport(&e, &|t| self.redact(t))))?;
            if body.len() + chunk.len() > MAX_WHOLE_BODY {
                return Err(classified(ModelError::new(
                    ModelErrorKind::Other,
                    format!(
                        "the model server's answer is larger than {} MiB",
                        MAX_WHOLE_BODY >> 20
                    ),
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
}

/// `text` (a JSON document) as an event stream of one event and `[DONE]`.
fn event_stream_response(text: &str) -> reqwest::Response {
    let mut events = String::with_capacity(text.len() + 32);
    for line in text.split(['\n', '\r']).filter(|l| !l.trim().is_empty()) {
        events.push_str("data: ");
        events.push_str(line);
        events.push('\n');
    }
    events.push_str("\ndata: [DONE]\n\n");
    let mut response = http::Response::new(reqwest::Body::from(events));
    response.headers_mut().insert(
        reqwest::header::CONTENT_TYPE,
        reqwest::header::HeaderValue::from_static("text/event-stream"),
    );
    reqwest::Response::from(response)
}

impl tower::Service<HttpRequestFactory> for Transport {
    type Response = reqwest::Response;
    type Error = OpenAIError;
    type Future = Pin<Box<dyn Future<Output = Result<reqwest::Response, OpenAIError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), OpenAIError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, factory: HttpRequestFactory) -> Self::Future {
        Box::pin(self.clone().send(factory))
    }
}

/// A streamed body that, dropped before its end, reads the rest in the background so the
/// connection goes back to the pool: without it every step opened a new connection, which for
/// a hosted model is a TLS handshake per step. After `[DONE]` only the terminating chunk is
/// left (awaited up to [`RELEASE_WAIT`]); when the agent stops at the end of a code block, the
/// model's last tokens, its finish and usage usually follow within milliseconds (awaited up to
/// [`TAIL_WAIT`]). A model that goes on talking past that loses the connection (closed, which
/// stops its generation).
struct Releasing {
    bytes: Option<BoxStream<'static, reqwest::Result<Bytes>>>,
    transport: Arc<Inner>,
    /// The last bytes seen, for a `[DONE]` split across reads.
    tail: Vec<u8>,
    done_seen: bool,
}

const DONE: &[u8] = b"[DONE]";

impl Releasing {
    /// Notes whether `chunk` (after the bytes before it) holds the `[DONE]` event.
    fn watch(&mut self, chunk: &[u8]) {
        if self.done_seen {
            return;
        }
        let keep = DONE.len() - 1;
        let mut seam = std::mem::take(&mut self.tail);
        seam.extend_from_slice(&chunk[..chunk.len().min(keep)]);
        self.done_seen = contains(&seam, DONE) || contains(chunk, DONE);
        self.tail = if chunk.len() >= keep {
            chunk[chunk.len() - keep..].to_vec()
        } else {
            seam.split_off(seam.len().saturating_sub(keep))
        };
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

impl Stream for Releasing {
    type Item = reqwest::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(bytes) = self.bytes.as_mut() else {
            return Poll::Ready(None);
        };
        let item = std::task::ready!(bytes.poll_next_unpin(cx));
        match &item {
            Some(Ok(chunk)) => self.watch(chunk),
            // Ended or broken: nothing to release.
            Some(Err(_)) | None => self.bytes = None,
        }
        Poll::Ready(item)
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        use futures_util::FutureExt as _;
        let Some(mut bytes) = self.bytes.take() else {
            return;
        };
        // Ended already (the connection is back in the pool when `bytes` is dropped), or broken.
        if let Some(None | Some(Err(_))) = bytes.next().now_or_never() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let wait = if self.done_seen {
            RELEASE_WAIT
        } else {
            TAIL_WAIT
        };
        let task = runtime.spawn(async move {
            let drain = async {
                let mut read = 0;
                while read < RELEASE_BYTES {
                    match bytes.next().await {
                        Some(Ok(chunk)) => read += chunk.len(),
                        Some(Err(_)) | None => return,
                    }
                }
            };
            let _ = tokio::time::timeout(wait, drain).await;
        });
        *self
            .transport
            .releasing
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(task);
    }
}

/// Where requests go and what headers they carry: async-openai's `Config` for a
/// [`ModelConfig`](crate::ModelConfig) (its own `OpenAIConfig` reads `OPENAI_*` environment
/// variables as defaults, and would send a key the program never gave; this reads nothing).
#[derive(Clone)]
pub(crate) struct Endpoint {
    base: String,
    key: secrecy::SecretString,
    headers: reqwest::header::HeaderMap,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// `base` (without its trailing `/`), with the key as a bearer token and the organisation
    /// and project headers when given.
    pub(crate) fn new(
        base: &str,
        key: Option<&crate::ApiKey>,
        organization: Option<&str>,
        project: Option<&str>,
    ) -> Result<Self, crate::ConfigError> {
        use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};
        let invalid = |name: &'static str| crate::ConfigError::Header { name };
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(key) = key {
            let mut value = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
                .map_err(|_| invalid("the API key"))?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        for (name, value, what) in [
            (
                async_openai::config::OPENAI_ORGANIZATION_HEADER,
                organization,
                "the organization",
            ),
            (
                async_openai::config::OPENAI_PROJECT_HEADER,
                project,
                "the project",
            ),
        ] {
            if let Some(value) = value {
                let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid(what))?;
                headers.insert(
                    name,
                    HeaderValue::from_str(value).map_err(|_| invalid(what))?,
                );
            }
        }
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            key: secrecy::SecretString::from(
                key.map(|k| k.expose().to_owned()).unwrap_or_default(),
            ),
            headers,
        })
    }
}

impl async_openai::config::Config for Endpoint {
    fn headers(&self) -> reqwest::header::HeaderMap {
        self.headers.clone()
    }
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
    fn query(&self) -> Vec<(&str, &str)> {
        Vec::new()
    }
    fn api_base(&self) -> &str {
        &self.base
    }
    fn api_key(&self) -> &secrecy::SecretString {
        &self.key
    }
}

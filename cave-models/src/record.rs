//! Recording a model's traffic to a cassette, and playing a cassette back.
//!
//! A cassette is JSON Lines, one object per line, in call order:
//! `{"call":1,"request":{"messages":[{"role":"system","content":"..."},...]}}`, then the call's
//! `{"call":1,"delta":{...}}` lines, then `{"call":1,"end":true}` or
//! `{"call":1,"error":{"kind":"transient","message":"..."}}`.

use async_trait::async_trait;
use cave_core::lock;
use cave_core::{
    ChatMessage, ChatRequest, ChatRole, Delta, DeltaStream, FinishReason, MessageKind, Model,
    ModelError, ModelErrorKind, ModelInfo, Usage,
};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One cassette line.
#[derive(Debug, Serialize, Deserialize)]
struct Line {
    call: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    request: Option<RecordedRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delta: Option<RecordedDelta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<RecordedError>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    end: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct RecordedRequest {
    messages: Vec<ChatMessage>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct RecordedDelta {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    text: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    reasoning: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    refusal: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    finish_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reported_cost: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backoff_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<RecordedToolCall>,
}

/// A piece of a tool call, as a cassette keeps it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct RecordedToolCall {
    index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    arguments: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct RecordedError {
    kind: String,
    message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
}

impl From<&Delta> for RecordedDelta {
    fn from(d: &Delta) -> Self {
        Self {
            text: d.text.clone(),
            reasoning: d.reasoning.clone(),
            refusal: d.refusal.clone(),
            finish_reason: d.finish_reason.as_ref().map(|f| match f {
                FinishReason::Stop => "stop".to_owned(),
                FinishReason::Length => "length".to_owned(),
                FinishReason::ContentFilter => "content_filter".to_owned(),
                FinishReason::ToolCalls => "tool_calls".to_owned(),
                FinishReason::Other(other) => other.clone(),
                _ => "other".to_owned(),
            }),
            usage: d.usage,
            reported_cost: d.reported_cost,
            backoff_ms: d.backoff.map(|b| b.as_millis() as u64),
            tool_calls: d
                .tool_calls
                .iter()
                .map(|call| RecordedToolCall {
                    index: call.index,
                    id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                })
                .collect(),
        }
    }
}

impl From<RecordedDelta> for Delta {
    fn from(r: RecordedDelta) -> Self {
        let mut d = Delta::text(r.text);
        d.reasoning = r.reasoning;
        d.refusal = r.refusal;
        d.finish_reason = r.finish_reason.as_deref().map(FinishReason::from_provider);
        d.usage = r.usage;
        d.reported_cost = r.reported_cost;
        d.backoff = r.backoff_ms.map(Duration::from_millis);
        d.tool_calls = r
            .tool_calls
            .into_iter()
            .map(|call| {
                let mut piece =
                    cave_core::ToolCallDelta::new(call.index).with_arguments(call.arguments);
                piece.id = call.id;
                piece.name = call.name;
                piece
            })
            .collect();
        d
    }
}

impl From<&ModelError> for RecordedError {
    fn from(e: &ModelError) -> Self {
        let (kind, retry_after_ms) = match e.kind() {
            ModelErrorKind::Transient { retry_after } => {
                ("transient", retry_after.map(|d| d.as_millis() as u64))
            }
            ModelErrorKind::BillingExhausted => ("billing_exhausted", None),
            ModelErrorKind::PromptTooLong => ("prompt_too_long", None),
            ModelErrorKind::Auth => ("auth", None),
            ModelErrorKind::InvalidRequest => ("invalid_request", None),
            ModelErrorKind::StreamStalled => ("stream_stalled", None),
            ModelErrorKind::StreamInterrupted => ("stream_interrupted", None),
            ModelErrorKind::ContentFiltered => ("content_filtered", None),
            ModelErrorKind::EmptyAnswer => ("empty_answer", None),
            ModelErrorKind::Truncated => ("truncated", None),
            _ => ("other", None),
        };
        Self {
            kind: kind.to_owned(),
            message: e.message().to_owned(),
            retry_after_ms,
        }
    }
}

impl From<RecordedError> for ModelError {
    fn from(r: RecordedError) -> Self {
        let kind = match r.kind.as_str() {
            "transient" => ModelErrorKind::Transient {
                retry_after: r.retry_after_ms.map(Duration::from_millis),
            },
            "billing_exhausted" => ModelErrorKind::BillingExhausted,
            "prompt_too_long" => ModelErrorKind::PromptTooLong,
            "auth" => ModelErrorKind::Auth,
            "invalid_request" => ModelErrorKind::InvalidRequest,
            "stream_stalled" => ModelErrorKind::StreamStalled,
            "stream_interrupted" => ModelErrorKind::StreamInterrupted,
            "content_filtered" => ModelErrorKind::ContentFiltered,
            "empty_answer" => ModelErrorKind::EmptyAnswer,
            "truncated" => ModelErrorKind::Truncated,
            _ => ModelErrorKind::Other,
        };
        ModelError::new(kind, r.message)
    }
}

/// A cassette could not be written or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CassetteError {
    /// Reading or writing the file failed.
    #[error("cassette {path}: {source}")]
    Io {
        /// The cassette.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line is not a cassette entry.
    #[error("cassette {path}, line {line}: {message}")]
    Format {
        /// The cassette.
        path: PathBuf,
        /// The 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

/// Wraps a model and writes every request and everything it streamed back to a cassette.
#[derive(Debug)]
pub struct RecordingModel<M> {
    inner: M,
    writer: Arc<Mutex<BufWriter<File>>>,
    calls: Mutex<usize>,
}

impl<M: Model> RecordingModel<M> {
    /// Records `inner`'s traffic into a new cassette at `path` (replacing any file there).
    pub fn create(inner: M, path: impl AsRef<Path>) -> Result<Self, CassetteError> {
        let path = path.as_ref();
        let file = File::create(path).map_err(|source| CassetteError::Io {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            inner,
            writer: Arc::new(Mutex::new(BufWriter::new(file))),
            calls: Mutex::new(0),
        })
    }
}

fn write_line(writer: &Mutex<BufWriter<File>>, line: &Line) {
    let mut w = lock(writer);
    // A cassette that cannot be written must not break the run it records.
    let written = serde_json::to_writer(&mut *w, line)
        .map_err(std::io::Error::other)
        .and_then(|()| {
            w.write_all(b"\n")?;
            w.flush()
        });
    if let Err(e) = written {
        tracing::error!(error = %e, "could not write to the cassette");
    }
}

#[async_trait]
impl<M: Model> Model for RecordingModel<M> {
    async fn stream(&self, request: ChatRequest) -> Result<DeltaStream, ModelError> {
        let call = {
            let mut calls = lock(&self.calls);
            *calls += 1;
            *calls
        };
        let recorded = RecordedRequest {
            messages: request.messages.clone(),
        };
        write_line(
            &self.writer,
            &Line {
                call,
                request: Some(recorded),
                delta: None,
                error: None,
                end: false,
            },
        );
        let stream = match self.inner.stream(request).await {
            Ok(stream) => stream,
            Err(error) => {
                write_line(
                    &self.writer,
                    &Line {
                        call,
                        request: None,
                        delta: None,
                        error: Some((&error).into()),
                        end: false,
                    },
                );
                return Err(error);
            }
        };
        let writer = self.writer.clone();
        let recorded = stream.map(move |item| {
            let line = match &item {
                Ok(delta) => Line {
                    call,
                    request: None,
                    delta: Some(delta.into()),
                    error: None,
                    end: false,
                },
                Err(error) => Line {
                    call,
                    request: None,
                    delta: None,
                    error: Some(error.into()),
                    end: false,
                },
            };
            write_line(&writer, &line);
            Some(item)
        });
        let writer = self.writer.clone();
        let ended = recorded.chain(futures_util::stream::once(async move {
            write_line(
                &writer,
                &Line {
                    call,
                    request: None,
                    delta: None,
                    error: None,
                    end: true,
                },
            );
            None
        }));
        Ok(Box::pin(ended.filter_map(|item| async move { item })))
    }

    fn info(&self) -> ModelInfo {
        self.inner.info()
    }
}

/// One recorded call.
#[derive(Debug, Clone)]
struct Call {
    request: RecordedRequest,
    items: Vec<Result<RecordedDelta, RecordedError>>,
}

/// Plays a cassette back. Each call must send the request that was recorded, compared by
/// what is stable: the same messages in the same order, of the same kind, with the same text,
/// except the date reminder (skipped) and execution results, whose text depends on the
/// interpreter that ran the code (a traceback's marks, a `repr`): one that differs is played
/// anyway and reported (see [`ReplayModel::on_difference`]). Anything else that differs fails
/// the call with a message naming the message and where its text differs.
pub struct ReplayModel {
    calls: Vec<Call>,
    next: Mutex<usize>,
    info: ModelInfo,
    report: Box<dyn Fn(&str) + Send + Sync>,
}

impl std::fmt::Debug for ReplayModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayModel")
            .field("calls", &self.calls.len())
            .field("next", &self.next)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl ReplayModel {
    /// Loads the cassette at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CassetteError> {
        let path = path.as_ref();
        let io = |source| CassetteError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let mut calls: Vec<Call> = Vec::new();
        for (index, line) in BufReader::new(file).lines().enumerate() {
            let line = line.map_err(io)?;
            if line.trim().is_empty() {
                continue;
            }
            let format = |message: String| CassetteError::Format {
                path: path.to_owned(),
                line: index + 1,
                message,
            };
            let entry: Line = serde_json::from_str(&line).map_err(|e| format(e.to_string()))?;
            if let Some(request) = entry.request {
                calls.push(Call {
                    request,
                    items: Vec::new(),
                });
                continue;
            }
            let call = calls
                .last_mut()
                .ok_or_else(|| format("an entry before any request".to_owned()))?;
            if let Some(delta) = entry.delta {
                call.items.push(Ok(delta));
            } else if let Some(error) = entry.error {
                call.items.push(Err(error));
            }
        }
        Ok(Self {
            calls,
            next: Mutex::new(0),
            info: ModelInfo::new("replay"),
            report: Box::new(|difference| tracing::warn!("{difference}")),
        })
    }

    /// Declares what the recorded model declared (output cap, asynchronous filtering).
    pub fn with_info(mut self, info: ModelInfo) -> Self {
        self.info = info;
        self
    }

    /// Where a difference that does not stop the replay is reported (an execution result
    /// whose text is not the recorded one); by default a `tracing` warning.
    pub fn on_difference(mut self, report: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.report = Box::new(report);
        self
    }
}

/// What a message is: as it says, or (a message recorded before kinds were) the date
/// reminder by its opening tag, or else what the message in its place says it is.
fn kind_of(message: &ChatMessage, counterpart: Option<&ChatMessage>) -> Option<MessageKind> {
    message.kind.or_else(|| {
        if message.role == ChatRole::User && message.content.starts_with("<system-reminder>") {
            Some(MessageKind::Reminder)
        } else {
            counterpart.and_then(|c| c.kind)
        }
    })
}

/// The messages that must match: all but the date reminder.
fn comparable(messages: &[ChatMessage]) -> Vec<&ChatMessage> {
    messages
        .iter()
        .filter(|m| kind_of(m, None) != Some(MessageKind::Reminder))
        .collect()
}

/// Where two texts first differ: the line, and a stretch of each from there.
fn first_difference(recorded: &str, sent: &str) -> String {
    let clip = |s: &str| -> String {
        match cave_core::shorten(s, 80) {
            (head, true) => format!("{head}…"),
            (whole, false) => whole.to_owned(),
        }
    };
    // A byte offset both texts share a prefix up to: a character boundary of each.
    let at = recorded
        .char_indices()
        .zip(sent.chars())
        .find(|((_, r), s)| r != s)
        .map_or(recorded.len().min(sent.len()), |((i, _), _)| i);
    let line = recorded[..at].matches('\n').count() + 1;
    let start = recorded[..at].rfind('\n').map_or(0, |i| i + 1);
    format!(
        "from line {line}: recorded {:?}, sent {:?}",
        clip(&recorded[start..]),
        clip(&sent[start..])
    )
}

/// How a request differs from the recorded one: `Err` stops the replay, `Ok` lists the
/// execution results whose text differs.
fn divergence(expected: &[ChatMessage], got: &[ChatMessage]) -> Result<Vec<String>, String> {
    let (expected, got) = (comparable(expected), comparable(got));
    let mut tolerated = Vec::new();
    for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
        let (recorded_kind, sent_kind) = (kind_of(e, Some(g)), kind_of(g, Some(e)));
        let name = |kind: Option<MessageKind>, role: ChatRole| {
            kind.map_or_else(
                || {
                    let role = match role {
                        ChatRole::System => "system",
                        ChatRole::User => "user",
                        ChatRole::Assistant => "assistant",
                    };
                    format!("a {role} message")
                },
                |k| k.describe().to_owned(),
            )
        };
        if e.role != g.role || recorded_kind != sent_kind {
            return Err(format!(
                "message {i} is {} in the recording, {} now",
                name(recorded_kind, e.role),
                name(sent_kind, g.role)
            ));
        }
        if e.content != g.content {
            let difference = first_difference(&e.content, &g.content);
            if sent_kind == Some(MessageKind::ExecutionResult) {
                tolerated.push(format!(
                    "message {i}, an execution result, differs from the recording {difference}"
                ));
            } else {
                return Err(format!(
                    "message {i} ({}) differs {difference}",
                    name(sent_kind, g.role)
                ));
            }
        } else if e.reasoning != g.reasoning {
            return Err(format!(
                "message {i} ({}) carries other reasoning than recorded",
                name(sent_kind, g.role)
            ));
        }
    }
    if expected.len() != got.len() {
        return Err(format!(
            "recorded {} messages, sent {}",
            expected.len(),
            got.len()
        ));
    }
    Ok(tolerated)
}

#[async_trait]
impl Model for ReplayModel {
    async fn stream(&self, request: ChatRequest) -> Result<DeltaStream, ModelError> {
        let index = {
            let mut next = lock(&self.next);
            *next += 1;
            *next - 1
        };
        let Some(call) = self.calls.get(index) else {
            return Err(ModelError::new(
                ModelErrorKind::Other,
                format!(
                    "replay diverged: the cassette has {} calls and the agent made another",
                    self.calls.len()
                ),
            ));
        };
        match divergence(&call.request.messages, &request.messages) {
            Err(difference) => {
                return Err(ModelError::new(
                    ModelErrorKind::Other,
                    format!("replay diverged at call {}: {difference}", index + 1),
                ));
            }
            Ok(tolerated) => {
                for difference in tolerated {
                    (self.report)(&format!(
                        "replay: call {}: {difference}; the recorded answer is played anyway",
                        index + 1
                    ));
                }
            }
        }
        // An error recorded before any delta is the call itself failing.
        if let Some(Err(error)) = call.items.first() {
            return Err(error.clone().into());
        }
        let items: Vec<Result<Delta, ModelError>> = call
            .items
            .iter()
            .cloned()
            .map(|item| item.map(Delta::from).map_err(ModelError::from))
            .collect();
        Ok(Box::pin(futures_util::stream::iter(items)))
    }

    fn info(&self) -> ModelInfo {
        self.info.clone()
    }
}

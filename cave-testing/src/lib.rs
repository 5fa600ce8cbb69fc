//! The test kit of cave-agent: a scripted [`Model`] and a Python-free [`Runtime`] for testing
//! agents offline, the runtime contract every runtime passes ([`contract`]), seeded
//! mutations for decoders ([`fuzz`]), whether a process is still there ([`process`]), a
//! question put to a real `python3` ([`python`]), and what
//! tests and benchmarks measure of processes ([`measure`]), and a `tracing` subscriber that
//! keeps spans ([`spans`]), a directory removed when a test is done with it ([`TestDir`]),
//! and how a test skips on a machine that lacks what it needs ([`machine`]).
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use cave_testing::{Reply, ScriptedModel};
//! use cave_core::{Model, ChatRequest, Message};
//! use futures_util::StreamExt;
//!
//! let model = ScriptedModel::new([Reply::text("Hello!").chunk_size(2)]);
//! let mut stream = model.stream(ChatRequest::new(vec![Message::user("hi").to_chat()])).await.unwrap();
//! let mut text = String::new();
//! while let Some(delta) = stream.next().await {
//!     text.push_str(&delta.unwrap().text);
//! }
//! assert_eq!(text, "Hello!");
//! assert_eq!(model.requests()[0].messages[0].content, "hi");
//! # });
//! ```

#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

pub mod contract;
mod dir;
pub mod fuzz;
pub mod machine;
pub mod measure;
pub mod phoenix;
pub mod process;
pub mod python;
pub mod spans;

pub use dir::TestDir;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

use async_trait::async_trait;
use cave_core::{
    ChatRequest, Delta, DeltaStream, Execution, FinishReason, Model, ModelError, ModelErrorKind,
    ModelInfo, OutputSink, Registry, Resource, Resources, Runtime, RuntimeError, ToolCallDelta,
    Usage, Value, lock,
};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A [`Model`] that plays scripted replies, one per call, and records the requests it got.
///
/// Each [`Reply`] streams its reasoning, then its text, in chunks of `chunk_size` characters,
/// then a terminal delta with the finish reason and usage (usage is omitted unless scripted,
/// so the agent's estimate is exercised). Errors, stalls and backoff announcements can be
/// placed anywhere in a reply. When the script runs out, the fallback reply is played if set,
/// else the call fails with a clear error.
#[derive(Debug)]
pub struct ScriptedModel {
    replies: Mutex<VecDeque<Reply>>,
    fallback: Option<Reply>,
    info: ModelInfo,
    requests: Mutex<Vec<ChatRequest>>,
    open_streams: Arc<AtomicUsize>,
    scripted: usize,
}

impl ScriptedModel {
    /// A model that plays these replies in order.
    pub fn new(replies: impl IntoIterator<Item = Reply>) -> Self {
        let replies: VecDeque<Reply> = replies.into_iter().collect();
        Self {
            scripted: replies.len(),
            replies: Mutex::new(replies),
            fallback: None,
            info: ModelInfo::new("scripted"),
            requests: Mutex::new(Vec::new()),
            open_streams: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A model that plays the same reply on every call.
    pub fn repeating(reply: Reply) -> Self {
        Self::new([]).with_fallback(reply)
    }

    /// Plays `reply` whenever the script has run out.
    pub fn with_fallback(mut self, reply: Reply) -> Self {
        self.fallback = Some(reply);
        self
    }

    /// Sets what the model declares (output cap, asynchronous filtering).
    pub fn with_info(mut self, info: ModelInfo) -> Self {
        self.info = info;
        self
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<ChatRequest> {
        lock(&self.requests).clone()
    }

    /// How many calls were made.
    pub fn calls(&self) -> usize {
        lock(&self.requests).len()
    }

    /// Streams handed out and not dropped yet (a consumer that stops reading must close them).
    pub fn open_streams(&self) -> usize {
        self.open_streams.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Model for ScriptedModel {
    async fn stream(&self, request: ChatRequest) -> Result<DeltaStream, ModelError> {
        lock(&self.requests).push(request);
        let next = lock(&self.replies).pop_front();
        let Some(reply) = next.or_else(|| self.fallback.clone()) else {
            return Err(ModelError::new(
                ModelErrorKind::Other,
                format!(
                    "ScriptedModel has no reply left: it was given {} and no fallback",
                    self.scripted
                ),
            ));
        };
        if let Some(error) = reply.open_error {
            return Err(error);
        }
        let items = reply.items();
        let guard = OpenGuard::new(self.open_streams.clone());
        let stream = futures_util::stream::unfold(
            (items.into_iter(), guard),
            |(mut items, guard)| async move {
                loop {
                    match items.next()? {
                        Item::Delta(delta) => return Some((Ok(delta), (items, guard))),
                        Item::Error(error) => return Some((Err(error), (items, guard))),
                        Item::Sleep(d) => tokio::time::sleep(d).await,
                        Item::Hang => std::future::pending::<()>().await,
                    }
                }
            },
        );
        Ok(Box::pin(stream))
    }

    fn info(&self) -> ModelInfo {
        self.info.clone()
    }
}

/// Counts a stream as open until it is dropped.
#[derive(Debug)]
struct OpenGuard(Arc<AtomicUsize>);

impl OpenGuard {
    fn new(counter: Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(counter)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One scripted answer.
#[derive(Clone, Debug)]
pub struct Reply {
    parts: Vec<Part>,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    cost: Option<f64>,
    open_error: Option<ModelError>,
    chunk_size: usize,
}

#[derive(Clone, Debug)]
enum Part {
    Reasoning(String),
    Text(String),
    Refusal(String),
    Error(ModelError),
    Stall(Duration),
    Hang,
    Backoff(Duration),
    Finish(FinishReason),
    ToolCall(String, String),
}

enum Item {
    Delta(Delta),
    Error(ModelError),
    Sleep(Duration),
    Hang,
}

impl Default for Reply {
    fn default() -> Self {
        Self {
            parts: Vec::new(),
            finish: Some(FinishReason::Stop),
            usage: None,
            cost: None,
            open_error: None,
            chunk_size: 13,
        }
    }
}

impl Reply {
    /// A reply that streams `text` and finishes with `stop`.
    pub fn text(text: impl Into<String>) -> Self {
        Self::default().then_text(text)
    }

    /// A reply whose call fails before streaming anything.
    pub fn fails(error: ModelError) -> Self {
        Self {
            open_error: Some(error),
            ..Self::default()
        }
    }

    /// Streams more text.
    pub fn then_text(mut self, text: impl Into<String>) -> Self {
        self.parts.push(Part::Text(text.into()));
        self
    }

    /// Streams reasoning (put it first for a reasoning model).
    pub fn reasoning(mut self, text: impl Into<String>) -> Self {
        self.parts.insert(0, Part::Reasoning(text.into()));
        self
    }

    /// Streams refusal text.
    pub fn refusal(mut self, text: impl Into<String>) -> Self {
        self.parts.push(Part::Refusal(text.into()));
        self
    }

    /// Fails the stream at this point (nothing after it is streamed).
    pub fn then_error(mut self, error: ModelError) -> Self {
        self.parts.push(Part::Error(error));
        self
    }

    /// Waits this long before streaming what follows.
    pub fn then_stall(mut self, delay: Duration) -> Self {
        self.parts.push(Part::Stall(delay));
        self
    }

    /// Never streams anything more.
    pub fn then_hang(mut self) -> Self {
        self.parts.push(Part::Hang);
        self
    }

    /// Announces a retry backoff (the agent's idle watchdog extends its deadline).
    pub fn then_backoff(mut self, delay: Duration) -> Self {
        self.parts.push(Part::Backoff(delay));
        self
    }

    /// Calls a tool (`arguments` as the model writes them: JSON, or raw code for some tools),
    /// streamed in pieces of the reply's chunk size, its id and name on the first; a reply
    /// with only tool calls finishes with `tool_calls`.
    pub fn then_tool_call(mut self, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        self.parts
            .push(Part::ToolCall(name.into(), arguments.into()));
        if self.finish == Some(FinishReason::Stop) {
            self.finish = Some(FinishReason::ToolCalls);
        }
        self
    }

    /// Sends a finish reason at this point (what follows, e.g. an error, comes after it);
    /// the reply then has no terminal delta of its own.
    pub fn then_finish(mut self, reason: FinishReason) -> Self {
        self.parts.push(Part::Finish(reason));
        self.finish = None;
        self
    }

    /// Sets the finish reason of the terminal delta.
    pub fn finish(mut self, reason: FinishReason) -> Self {
        self.finish = Some(reason);
        self
    }

    /// Ends without a finish reason (a stream that just stops).
    pub fn no_finish(mut self) -> Self {
        self.finish = None;
        self
    }

    /// Reports usage on the terminal delta.
    pub fn usage(mut self, usage: Usage) -> Self {
        self.usage = Some(usage);
        self
    }

    /// Reports the call's cost, in US dollars, on the terminal delta (as a LiteLLM proxy
    /// does).
    pub fn cost(mut self, usd: f64) -> Self {
        self.cost = Some(usd);
        self
    }

    /// Streams text and reasoning in chunks of this many characters (default 13; at least 1).
    pub fn chunk_size(mut self, chars: usize) -> Self {
        self.chunk_size = chars.max(1);
        self
    }

    fn items(&self) -> Vec<Item> {
        let mut items = Vec::new();
        let mut tool_calls = 0;
        for part in &self.parts {
            match part {
                Part::Reasoning(text) => items.extend(
                    chunks(text, self.chunk_size).map(|c| Item::Delta(Delta::reasoning(c))),
                ),
                Part::Text(text) => {
                    items.extend(chunks(text, self.chunk_size).map(|c| Item::Delta(Delta::text(c))))
                }
                Part::Refusal(text) => items.push(Item::Delta(Delta::refusal(text.clone()))),
                Part::Error(error) => {
                    items.push(Item::Error(error.clone()));
                    return items;
                }
                Part::Stall(delay) => items.push(Item::Sleep(*delay)),
                Part::Hang => items.push(Item::Hang),
                Part::Backoff(delay) => items.push(Item::Delta(Delta::backoff(*delay))),
                Part::Finish(reason) => items.push(Item::Delta(Delta::finish(reason.clone()))),
                Part::ToolCall(name, arguments) => {
                    let index = tool_calls;
                    tool_calls += 1;
                    let mut first = ToolCallDelta::new(index)
                        .with_id(format!("call_{index}"))
                        .with_name(name.clone());
                    let mut pieces = chunks(arguments, self.chunk_size);
                    if let Some(piece) = pieces.next() {
                        first = first.with_arguments(piece);
                    }
                    items.push(Item::Delta(Delta::tool_calls([first])));
                    items.extend(pieces.map(|piece| {
                        Item::Delta(Delta::tool_calls([
                            ToolCallDelta::new(index).with_arguments(piece)
                        ]))
                    }));
                }
            }
        }
        if self.finish.is_some() || self.usage.is_some() || self.cost.is_some() {
            let mut terminal = Delta::default();
            terminal.finish_reason = self.finish.clone();
            terminal.usage = self.usage;
            terminal.reported_cost = self.cost;
            items.push(Item::Delta(terminal));
        }
        items
    }
}

fn chunks(text: &str, size: usize) -> impl Iterator<Item = String> + '_ {
    let chars: Vec<char> = text.chars().collect();
    let pieces: Vec<String> = chars.chunks(size).map(|c| c.iter().collect()).collect();
    pieces.into_iter()
}

/// A [`Runtime`] without Python, for testing agent wiring: each cell's output is its own code
/// (plus a newline), and registered resources and bindings live in an in-memory namespace
/// with the real naming rules (a [`Registry`]).
#[derive(Debug, Default)]
pub struct EchoRuntime {
    registry: Mutex<Registry>,
    state: Mutex<EchoState>,
}

#[derive(Debug, Default)]
struct EchoState {
    /// Values bound by name: registered variables and bindings.
    namespace: BTreeMap<String, Value>,
    executed: Vec<String>,
    last_index: BTreeMap<String, u64>,
}

impl EchoRuntime {
    /// An empty runtime.
    pub fn new() -> Self {
        Self::default()
    }

    /// The cells executed so far.
    pub fn executed(&self) -> Vec<String> {
        lock(&self.state).executed.clone()
    }
}

/// The value a registered resource binds (functions and objects bind `None` here).
fn bound_value(resource: &Resource) -> Value {
    match resource {
        Resource::Variable(v) => v.value.clone(),
        Resource::Binding { value, .. } => value.clone(),
        _ => Value::None,
    }
}

// Lock order: the registry, then the state.
#[async_trait]
impl Runtime for EchoRuntime {
    async fn execute(
        &self,
        code: &str,
        output: &dyn OutputSink,
    ) -> Result<Execution, RuntimeError> {
        lock(&self.state).executed.push(code.to_owned());
        let text = format!("{code}\n");
        output.write(&text);
        Ok(Execution::ok(text))
    }

    async fn register(&self, batch: Resources) -> Result<(), RuntimeError> {
        let entries = lock(&self.registry).claim(batch)?;
        let mut state = lock(&self.state);
        for entry in entries {
            state
                .namespace
                .insert(entry.name.clone(), bound_value(&entry.resource));
        }
        Ok(())
    }

    fn registry(&self) -> &Mutex<Registry> {
        &self.registry
    }

    async fn update(&self, name: &str, value: Value) -> Result<(), RuntimeError> {
        let key = lock(&self.registry).update_variable(name, value.clone())?;
        lock(&self.state).namespace.insert(key, value);
        Ok(())
    }

    async fn get(&self, name: &str) -> Result<Value, RuntimeError> {
        let key = cave_core::normalize_name(name);
        lock(&self.state)
            .namespace
            .get(&key)
            .cloned()
            .ok_or_else(|| RuntimeError::Unbound {
                name: name.to_owned(),
            })
    }

    async fn object_bound(&self, name: &str) -> Result<bool, RuntimeError> {
        // Code here never rebinds a name: a registered object stays bound.
        Ok(lock(&self.registry).object(name).is_some())
    }

    async fn bind_unique(
        &self,
        prefix: &str,
        value: Value,
        start: u64,
    ) -> Result<String, RuntimeError> {
        let prefix = cave_core::unique_prefix(prefix, start)?;
        let prefix = prefix.as_str();
        let mut registry = lock(&self.registry);
        let mut state = lock(&self.state);
        let mut index = start.max(state.last_index.get(prefix).map_or(0, |last| last + 1));
        let taken =
            |s: &EchoState, r: &Registry, n: &str| s.namespace.contains_key(n) || r.is_bound(n);
        while taken(&state, &registry, &format!("{prefix}_{index}")) {
            index += 1;
        }
        let name = format!("{prefix}_{index}");
        registry.record_binding(&name, value.clone());
        state.namespace.insert(name.clone(), value);
        state.last_index.insert(prefix.to_owned(), index);
        Ok(name)
    }

    async fn reset(&self) -> Result<(), RuntimeError> {
        // Clear everything, then restore what was registered, as registered.
        let registry = lock(&self.registry);
        let restored: BTreeMap<String, Value> = registry
            .entries()
            .iter()
            .map(|e| (e.name.clone(), bound_value(&e.resource)))
            .collect();
        lock(&self.state).namespace = restored;
        Ok(())
    }
}

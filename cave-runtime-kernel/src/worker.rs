//! The worker's side of the runtime, whatever it runs in: the frames to and from it, the
//! requests and executions waiting for an answer, the host calls it makes, and how it ended.
//!
//! A worker is reached through a [`Link`] a [`Transport`](crate::link::Transport) started: the
//! frames are the same for a child process and a kernel behind a Jupyter server; what only a
//! transport can do (signals, a server's REST calls) is the link's.

use crate::KernelError;
use crate::link::{Link, Started};
use crate::marshal::{self, Data};
use cave_core::{Args, DisplayItem, HostError, HostFunction, HostObject, Value};
use cave_python::MIN_PYTHON;
use futures_util::StreamExt;
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{oneshot, watch};
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};

/// How long a rollback may take before the worker is given up.
const ROLLBACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the error of a start that timed out waiting for the worker's ready says (and how the
/// runtime recognizes it to try once more).
pub(crate) const NEVER_READY: &str = "did not start the worker within";

pub(crate) use cave_core::lock;

/// What a host call reaches.
#[derive(Clone)]
pub(crate) enum Callable {
    /// A function, by its name.
    Function(String, Arc<dyn HostFunction>),
    /// An object, by its name.
    Object(String, Arc<dyn HostObject>),
}

/// Host functions and objects by the handle the child knows them by.
pub(crate) type Callables = Arc<Mutex<HashMap<u64, Callable>>>;

/// The callables a worker's host calls reach: the runtime's, set when a runtime takes the
/// worker (a pool's worker is started before any runtime owns it).
type CallableSlot = Arc<Mutex<Callables>>;

/// A reply to a request: how the worker answered, and its payload.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: Status,
    pub(crate) payload: Value,
}

/// How the worker answered a request, decoded once from its frame (the `status` of
/// `cave_kernel.py`'s `_reply`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    /// Done; the payload is the answer.
    Ok,
    /// Refused or failed; the payload says why.
    Failed,
    /// The name is not bound.
    Unbound,
    /// The value has no counterpart on the seam; the payload names its Python type.
    Unsupported,
    /// The answer would be a frame over the limit; the payload is its size in bytes.
    TooLarge,
    /// A status this host does not know: a worker of another version, or a broken one.
    Unknown(String),
}

impl Status {
    fn decode(status: String) -> Self {
        match status.as_str() {
            "ok" => Status::Ok,
            "failed" => Status::Failed,
            "unbound" => Status::Unbound,
            "unsupported" => Status::Unsupported,
            "too_large" => Status::TooLarge,
            _ => Status::Unknown(status),
        }
    }
}

/// How an execution ended: the exception it raised, if any.
pub(crate) type Raised = Option<(String, String)>;

enum Pending {
    Reply(oneshot::Sender<Reply>),
    Execution {
        output: Arc<Mutex<cave_cell::CellOutput>>,
        done: oneshot::Sender<Raised>,
    },
}

/// How the worker ended.
#[derive(Clone, Debug)]
pub(crate) struct Death {
    /// What happened, for people and for the model.
    pub(crate) description: String,
    /// Output it had written and not sent, with the execution it belongs to.
    pub(crate) unsent: Option<(u64, String)>,
}
struct Shared {
    pending: Mutex<HashMap<u64, Pending>>,
    next_id: AtomicU64,
    /// The host ended it (stop, reset, a cell that ignored its interrupt).
    killed: AtomicBool,
    /// Why the host ended it, when it was not a stop.
    kill_reason: Mutex<Option<String>>,
    /// The outermost execution in progress (its request id).
    executing: Mutex<Option<u64>>,
    /// What was written while no execution ran, for the next one.
    stray: cave_cell::StrayOutput,
    /// Bytes read from the worker's socket so far.
    received: Arc<AtomicU64>,
    /// Bytes of the frames handled so far (each with its length prefix).
    handled: AtomicU64,
    /// Host calls answered on tasks of their own, by the execution they came from: cancelled
    /// (their futures dropped, `KeyboardInterrupt` sent to whoever still waits) when it ends,
    /// however it ends, and when the worker goes.
    host_tasks: Mutex<Vec<(u64, cave_core::CancellationToken)>>,
}

impl Shared {
    /// Drops the host calls of execution `id` still waiting (`None`: every one).
    fn abort_host_calls(&self, id: Option<u64>) {
        lock(&self.host_tasks).retain(|(from, task)| {
            let ends = id.is_none_or(|id| *from == id);
            if ends {
                task.cancel();
            }
            !ends && !task.is_cancelled()
        });
    }

    fn new() -> Self {
        Self {
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            killed: AtomicBool::new(false),
            kill_reason: Mutex::new(None),
            executing: Mutex::new(None),
            stray: cave_cell::StrayOutput::default(),
            received: Arc::new(AtomicU64::new(0)),
            handled: AtomicU64::new(0),
            host_tasks: Mutex::new(Vec::new()),
        }
    }

    /// Counts a frame of `len` bytes as handled.
    fn handled(&self, len: usize) {
        self.handled
            .fetch_add(len as u64 + FRAME_PREFIX, Ordering::SeqCst);
    }
}

/// The length prefix of each frame (tokio-util's default for `LengthDelimitedCodec`).
const FRAME_PREFIX: u64 = 4;

/// The read half of the worker's socket, counting what it reads.
struct Counting<R> {
    inner: R,
    received: Arc<AtomicU64>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Counting<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        self.received.fetch_add(read as u64, Ordering::SeqCst);
        polled
    }
}

/// A started worker, serving.
pub(crate) struct Worker {
    link: Box<dyn Link>,
    outgoing: Arc<Outgoing>,
    /// The host's end of the socket (for how much the worker sent that is not read yet).
    socket_fd: std::os::fd::RawFd,
    shared: Arc<Shared>,
    /// True once the worker has ended.
    ended: watch::Receiver<bool>,
    max_frame: usize,
    /// The interpreter's version.
    pub(crate) version: (u32, u32, u32),
    /// Where its host calls go.
    callables: CallableSlot,
    /// Held while a branch is forked: the descriptors handed over and the request that takes
    /// them go in the same order.
    forking: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("pid", &self.pid())
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// Hands a started worker the sources, waits for its `ready`, and serves its frames.
    /// (A branch has its sources: it is only waited for.)
    pub(crate) async fn handshake(
        started: Started,
        settings: &crate::config::WorkerSettings,
        callables: Callables,
    ) -> Result<Arc<Worker>, KernelError> {
        let max_frame = settings.max_frame;
        let Started {
            link,
            socket,
            ended,
            what,
            has_sources,
            precompiled,
        } = started;
        let setup = |e: std::io::Error| KernelError::Start {
            message: e.to_string(),
        };
        socket.set_nonblocking(true).map_err(setup)?;
        let socket_fd = std::os::fd::AsRawFd::as_raw_fd(&socket);
        let stream = tokio::net::UnixStream::from_std(socket).map_err(setup)?;
        let (read, write) = stream.into_split();
        let shared = Arc::new(Shared::new());
        let read = Counting {
            inner: read,
            received: shared.received.clone(),
        };
        let mut worker = Worker {
            link,
            outgoing: Outgoing::start(write),
            socket_fd,
            shared,
            ended,
            max_frame,
            version: (0, 0, 0),
            callables: Arc::new(Mutex::new(callables)),
            forking: tokio::sync::Mutex::new(()),
        };
        if !has_sources {
            // With the compiled code when there is some and the frame can carry it.
            let sent = match precompiled {
                Some(code) => worker
                    .send(&Data::Owned(crate::bytecode::frame(Some(&code))))
                    .or_else(|_| worker.send(&Data::Owned(crate::bytecode::frame(None)))),
                None => worker.send(&Data::Owned(crate::bytecode::frame(None))),
            };
            match sent {
                // A worker that has already ended (one that refused its interpreter) says why
                // below, from its last words.
                Ok(()) | Err(KernelError::Died) => {}
                Err(e) => {
                    return Err(KernelError::Start {
                        message: e.to_string(),
                    });
                }
            }
        }
        let mut reader = FramedRead::new(
            read,
            LengthDelimitedCodec::builder()
                .max_frame_length(max_frame)
                .new_codec(),
        );
        // Past the start timeout the worker is taken to have died while starting (a Jupyter
        // kernel that lost a port race to another starting at once, which its server keeps
        // nudging), and killed: a start always ends.
        let ready = match tokio::time::timeout(settings.start_timeout, reader.next()).await {
            Ok(Some(Ok(frame))) => {
                worker.shared.handled(frame.len());
                Ok(marshal::decode(&frame).ok().map(|(value, _)| value))
            }
            Ok(_) => Ok(None),
            Err(_) => Err(()),
        };
        let Some(version) = ready
            .as_ref()
            .ok()
            .and_then(Option::as_ref)
            .and_then(ready_version)
        else {
            worker.link.kill();
            let why = match ready {
                Ok(_) => worker.link.describe_failed_start().await,
                Err(()) => format!(
                    " within {} s (a kernel that died while starting, or a server too busy to start it)",
                    settings.start_timeout.as_secs_f64()
                ),
            };
            return Err(KernelError::Start {
                message: format!("{what} did not start the worker{why}"),
            });
        };
        worker.version = version;
        // Where a guard started the worker (`guard.rs`), the process serving is its child.
        if let (Some(copies), Some(pid)) = (
            worker.link.copies(),
            ready.ok().flatten().as_ref().and_then(ready_pid),
        ) {
            copies.started(pid);
        }
        tracing::info!(pid = ?worker.pid(), ?version, enforcement = ?worker.link.enforcement(), "kernel worker started");
        if (version.0, version.1) < MIN_PYTHON {
            worker.kill(None);
            return Err(KernelError::Start {
                message: format!(
                    "{what} is Python {}.{}; the kernel runtime needs Python {}.{} or later",
                    version.0, version.1, MIN_PYTHON.0, MIN_PYTHON.1
                ),
            });
        }
        let worker = Arc::new(worker);
        tokio::spawn(serve(
            reader,
            Arc::downgrade(&worker),
            worker.shared.clone(),
            worker.outgoing.clone(),
            worker.callables.clone(),
            max_frame,
        ));
        Ok(worker)
    }

    /// Sends its host calls to `callables` from now on: a pool's worker, taken by a runtime.
    pub(crate) fn adopt(&self, callables: Callables) {
        *lock(&self.callables) = callables;
    }

    /// What acts on the worker beyond its frames (its limits, sandbox and enforcement, for
    /// the runtime's reports).
    pub(crate) fn link(&self) -> &dyn Link {
        &*self.link
    }

    /// The id of the local process serving, when the worker is one.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.link.pid()
    }

    /// Forks a paused copy of the serving process: checkpoint `id`.
    pub(crate) async fn checkpoint(&self, id: u64) -> Result<(), KernelError> {
        let Some(copies) = self.link.copies() else {
            return Err(KernelError::Checkpoint {
                message: "checkpoints need a local kernel process; a kernel behind a Jupyter server cannot be copied".to_owned(),
            });
        };
        let reply = self
            .request("checkpoint", vec![Data::Owned(Value::Int(id.into()))])
            .await?;
        match (reply.status, reply.payload) {
            (Status::Ok, Value::Int(pid)) => {
                copies.hold(id, pid as i32);
                Ok(())
            }
            (_, payload) => Err(KernelError::Checkpoint {
                message: format!("the process could not make a copy of itself: {payload}"),
            }),
        }
    }

    /// Hands the socket to the copy of checkpoint `id`, which then serves (with a fresh copy
    /// of itself, so the checkpoint stays); the later checkpoints are dropped.
    pub(crate) async fn rollback(&self, id: u64) -> Result<(), KernelError> {
        let Some((copies, copy)) = self
            .link
            .copies()
            .and_then(|copies| Some((copies, copies.holder(id)?)))
        else {
            return Err(KernelError::Checkpoint {
                message: format!("checkpoint {id} is not held by this process"),
            });
        };
        let request = self.request("rollback", vec![Data::Owned(Value::Int(id.into()))]);
        // A copy that never answers (the process died before it handed over) is given up.
        let reply = match tokio::time::timeout(ROLLBACK_TIMEOUT, request).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(error)) => return Err(error),
            Err(_) => {
                self.kill(Some(
                    "the Python process did not finish a rollback".to_owned(),
                ));
                return Err(KernelError::Died);
            }
        };
        match (reply.status, reply.payload) {
            (Status::Ok, Value::Int(fresh)) => {
                copies.rolled_back(id, copy, fresh as i32);
                Ok(())
            }
            // Refused before any hand-over: the serving process goes on.
            (_, payload) => Err(KernelError::Checkpoint {
                message: format!("the rollback was refused: {payload}"),
            }),
        }
    }

    /// Forks a branch of the serving process: a worker of its own, started (its `ready` still
    /// to come: [`Worker::attach`]), with the transport of its later fresh processes.
    pub(crate) async fn fork(
        &self,
        start_timeout: std::time::Duration,
    ) -> Result<(Started, Box<dyn crate::link::Transport>), KernelError> {
        let _forking = self.forking.lock().await;
        let branch = self.link.prepare_branch()?;
        let (dir, source) = branch.dir().map_or_else(Default::default, |(dir, source)| {
            (
                dir.to_string_lossy().into_owned(),
                source.to_string_lossy().into_owned(),
            )
        });
        let reply = self
            .request(
                "fork",
                vec![Data::from(dir.as_str()), Data::from(source.as_str())],
            )
            .await?;
        let keeper = match (reply.status, reply.payload) {
            (Status::Ok, Value::Int(pid)) => pid as i32,
            (_, payload) => {
                return Err(KernelError::Fork {
                    message: format!("the process could not fork a branch: {payload}"),
                });
            }
        };
        branch.launch(keeper, start_timeout).await
    }

    /// Ends the copy of checkpoint `id` (nothing is answered).
    pub(crate) fn drop_checkpoint(&self, id: u64) {
        let held = self.link.copies().is_some_and(|c| c.release(id));
        if held && self.alive() {
            let message = Data::Owned(Value::Tuple(vec![
                "drop_checkpoint".into(),
                Value::Int(0),
                Value::Int(id.into()),
            ]));
            let _ = self.send(&message);
        }
    }
    /// Sends one message.
    fn send(&self, message: &Data<'_>) -> Result<(), KernelError> {
        let frame = framed(message, self.max_frame)?;
        self.outgoing.send(frame)
    }

    fn next_id(&self) -> u64 {
        self.shared.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends a request and waits for its reply.
    pub(crate) async fn request(
        &self,
        operation: &str,
        args: Vec<Data<'_>>,
    ) -> Result<Reply, KernelError> {
        let reply = self.begin(operation, args)?;
        reply.await.map_err(|_| KernelError::Died)
    }

    /// Sends a request now (its arguments may borrow from under a lock); the receiver gets
    /// the reply.
    pub(crate) fn begin(
        &self,
        operation: &str,
        args: Vec<Data<'_>>,
    ) -> Result<oneshot::Receiver<Reply>, KernelError> {
        let id = self.next_id();
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.pending).insert(id, Pending::Reply(tx));
        let mut message = vec![Data::from(operation), Data::Owned(Value::Int(id.into()))];
        message.extend(args);
        if let Err(e) = self.send(&Data::Tuple(message)) {
            lock(&self.shared.pending).remove(&id);
            return Err(e);
        }
        Ok(rx)
    }

    /// Runs a cell: live output goes to `live`; resolves to the exception it raised, or to
    /// `Died` when the process ended first. Returns the execution's id too.
    pub(crate) fn execute(
        &self,
        code: &str,
        number: u64,
        max_display: usize,
        output: Arc<Mutex<cave_cell::CellOutput>>,
    ) -> Result<(u64, oneshot::Receiver<Raised>), KernelError> {
        let id = self.next_id();
        let (done, rx) = oneshot::channel();
        lock(&self.shared.pending).insert(id, Pending::Execution { output, done });
        lock(&self.shared.executing).get_or_insert(id);
        // Where the trailing expression is, read here: the worker compiles the cell without
        // building its syntax tree (see `cave_python::executor_split`).
        let split = match cave_python::executor_split(code) {
            Some(None) => Value::Int(0),
            Some(Some((start, line))) => {
                Value::Tuple(vec![Value::Int(start as i128), Value::Int(line as i128)])
            }
            None => Value::None,
        };
        let message = Data::Owned(Value::Tuple(vec![
            "execute".into(),
            Value::Int(id.into()),
            code.into(),
            Value::Int(number.into()),
            Value::Int(max_display as i128),
            split,
        ]));
        if let Err(e) = self.send(&message) {
            lock(&self.shared.pending).remove(&id);
            let mut executing = lock(&self.shared.executing);
            if *executing == Some(id) {
                *executing = None;
            }
            return Err(e);
        }
        Ok((id, rx))
    }

    /// The outermost execution in progress, if any.
    pub(crate) fn executing(&self) -> Option<u64> {
        *lock(&self.shared.executing)
    }

    /// Where the stream of frames the worker has sent ends now: what was read from its socket,
    /// what waits there unread, and what its link holds on the way. Once [`handled`](Self::handled) reaches it, every frame the
    /// worker sent before this call has been handled.
    pub(crate) fn sent_so_far(&self) -> u64 {
        let mut unread: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int; the descriptor is the worker's socket, open while
        // the worker is (callers ask only of a live worker; a closed one fails harmlessly).
        let asked = unsafe { libc::ioctl(self.socket_fd, libc::FIONREAD, &mut unread) };
        let unread = if asked == 0 { unread.max(0) as u64 } else { 0 };
        self.shared.received.load(Ordering::SeqCst) + unread + self.link.in_transit()
    }

    /// The bytes of the frames handled so far.
    pub(crate) fn handled(&self) -> u64 {
        self.shared.handled.load(Ordering::SeqCst)
    }

    /// Returns true if and only if the worker has not ended.
    pub(crate) fn alive(&self) -> bool {
        !*self.ended.borrow() && !self.outgoing.is_closed()
    }

    /// Asks the running cell to stop (`KeyboardInterrupt` in the worker). A host call it waits
    /// on is dropped and answered with `KeyboardInterrupt` too: a worker whose signal cannot
    /// reach that wait (a Jupyter kernel, which takes interrupts through its server) stops as
    /// soon as the answer arrives.
    pub(crate) fn interrupt(&self) {
        self.link.interrupt();
        if let Some(execution) = self.executing() {
            self.shared.abort_host_calls(Some(execution));
        }
    }

    /// Ends the worker if `execution` is still running, and says whether it did. Decided under
    /// the lock its end is read under: a cell whose end arrives as it is killed is reported
    /// either as ended (and the worker lives) or as killed (its state lost), never ended with
    /// its worker killed behind it.
    pub(crate) fn kill_running(&self, execution: u64, reason: String) -> bool {
        {
            let executing = lock(&self.shared.executing);
            if *executing != Some(execution) {
                return false;
            }
            lock(&self.shared.kill_reason).get_or_insert(reason);
            self.shared.killed.store(true, Ordering::SeqCst);
        }
        self.link.kill();
        true
    }

    /// Ends the worker now. `reason` is what a running execution is told; `None` for a
    /// deliberate stop.
    pub(crate) fn kill(&self, reason: Option<String>) {
        if let Some(reason) = reason {
            lock(&self.shared.kill_reason).get_or_insert(reason);
        }
        self.shared.killed.store(true, Ordering::SeqCst);
        self.link.kill();
    }

    /// Lets go of the worker, its runtime being gone: killed, except where the link lets it
    /// go gracefully (an idle kernel the runtime attached to: the link's end tells its worker
    /// to stop, and the kernel stays with its namespace).
    pub(crate) fn release(&self) {
        if !self.link.let_go_on_release(self.executing().is_some()) {
            // Killed before the link closes: a worker that reads the end of its link exits,
            // and what its cells detached would then be orphaned beyond the walk from it.
            self.kill(None);
        }
        self.outgoing.close();
    }

    /// Asks the worker to exit, then kills it after `grace`.
    pub(crate) async fn stop(&self, grace: std::time::Duration) {
        if self.alive() {
            self.link.before_stop();
            let stop = self.request("stop", Vec::new());
            let _ = tokio::time::timeout(grace, stop).await;
            let mut ended = self.ended.clone();
            let exited = tokio::time::timeout(grace, ended.wait_for(|e| *e)).await;
            if exited.is_err() {
                self.kill(None);
            }
        }
        self.shared.killed.store(true, Ordering::SeqCst);
        self.link.after_stop();
        self.wait().await;
    }

    /// Waits for the worker to end.
    pub(crate) async fn wait(&self) {
        let mut ended = self.ended.clone();
        let _ = ended.wait_for(|e| *e).await;
    }

    /// What was written while no execution ran since the last call, as the next execution's
    /// output begins with it.
    pub(crate) fn take_stray_output(&self) -> Option<String> {
        self.shared.stray.take()
    }

    /// How the worker ended, once it has: a description for the execution that was running.
    pub(crate) async fn death(&self) -> Death {
        self.wait().await;
        let killed = self.shared.killed.load(Ordering::SeqCst);
        let reason = lock(&self.shared.kill_reason).clone();
        let description = match (reason, killed) {
            (Some(reason), _) => reason,
            (None, true) => "the Python process was stopped".to_owned(),
            (None, false) => self.link.describe_end().await,
        };
        Death {
            description,
            unsent: self.link.unsent(),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.release();
    }
}

/// The pid of the process serving, from the worker's `ready` message.
fn ready_pid(ready: &Value) -> Option<i32> {
    match ready {
        Value::Tuple(items) => match items.get(3) {
            Some(Value::Int(pid)) => i32::try_from(*pid).ok().filter(|&pid| pid > 0),
            _ => None,
        },
        _ => None,
    }
}

/// The interpreter's version from the worker's `ready` message.
fn ready_version(ready: &Value) -> Option<(u32, u32, u32)> {
    match ready {
        Value::Tuple(items) if items.first().and_then(Value::as_str) == Some("ready") => {
            match items.get(2) {
                Some(Value::Tuple(v)) => {
                    let part = |i: usize| match v.get(i) {
                        Some(Value::Int(n)) => u32::try_from(*n).ok(),
                        _ => None,
                    };
                    Some((part(0)?, part(1)?, part(2)?))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// The host's end of the socket, for writing. A frame is written at once when the socket takes
/// it (the common case: a reply to a child that waits for it), and otherwise queued for a
/// writer task; either way frames never interleave and are written whole, even when the
/// request that sent one is dropped.
pub(crate) struct Outgoing {
    half: tokio::net::unix::OwnedWriteHalf,
    queue: Mutex<Queue>,
    wake: tokio::sync::Notify,
}

#[derive(Default)]
struct Queue {
    frames: std::collections::VecDeque<Vec<u8>>,
    /// Bytes of the front frame already written.
    written: usize,
    closed: bool,
}

impl Outgoing {
    fn start(half: tokio::net::unix::OwnedWriteHalf) -> Arc<Self> {
        let outgoing = Arc::new(Self {
            half,
            queue: Mutex::new(Queue::default()),
            wake: tokio::sync::Notify::new(),
        });
        let writer = outgoing.clone();
        // Ends when the socket is closed: by the child's death (the reader sees it) or by the
        // process being dropped.
        tokio::spawn(async move {
            while writer.flush_queue().await {
                let woken = writer.wake.notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                let idle = {
                    let queue = lock(&writer.queue);
                    queue.frames.is_empty() && !queue.closed
                };
                if idle {
                    woken.await;
                }
            }
        });
        outgoing
    }

    /// Sends a frame: written now if nothing is queued and the socket takes it.
    fn send(&self, frame: Vec<u8>) -> Result<(), KernelError> {
        let mut queue = lock(&self.queue);
        if queue.closed {
            return Err(KernelError::Died);
        }
        let mut written = 0;
        if queue.frames.is_empty() {
            while written < frame.len() {
                match self.half.try_write(&frame[written..]) {
                    Ok(n) => written += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        queue.closed = true;
                        return Err(KernelError::Died);
                    }
                }
            }
            if written == frame.len() {
                return Ok(());
            }
            queue.written = written;
        }
        queue.frames.push_back(frame);
        drop(queue);
        self.wake.notify_one();
        Ok(())
    }

    /// Writes what is queued; false once the socket is closed.
    async fn flush_queue(&self) -> bool {
        loop {
            {
                let mut queue = lock(&self.queue);
                if queue.closed {
                    return false;
                }
                loop {
                    let Some(front) = queue.frames.front() else {
                        return true;
                    };
                    let at = queue.written;
                    match self.half.try_write(&front[at..]) {
                        Ok(n) if at + n == front.len() => {
                            queue.frames.pop_front();
                            queue.written = 0;
                        }
                        Ok(n) => queue.written = at + n,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(_) => {
                            queue.closed = true;
                            return false;
                        }
                    }
                }
            }
            if self.half.writable().await.is_err() {
                lock(&self.queue).closed = true;
                return false;
            }
        }
    }

    fn is_closed(&self) -> bool {
        lock(&self.queue).closed
    }

    /// Stops writing (what is queued is dropped) and ends the writer task.
    fn close(&self) {
        lock(&self.queue).closed = true;
        self.wake.notify_one();
        // The other end sees the end of the stream now, even while a task still holds this
        // half (the reader does, until the other end closes: a kernel the runtime attached to
        // is let go on this end of file).
        // SAFETY: shutdown on the socket this half owns; it stays open until dropped.
        unsafe {
            libc::shutdown(self.half.as_ref().as_raw_fd(), libc::SHUT_WR);
        }
    }
}

/// A message as one frame: its length (4 bytes, big-endian), then its marshal encoding.
pub(crate) fn framed(message: &Data<'_>, max_frame: usize) -> Result<Vec<u8>, KernelError> {
    let mut frame = vec![0; 4];
    marshal::encode(message, &mut frame).map_err(|e| KernelError::Invalid {
        message: e.to_string(),
    })?;
    let length = frame.len() - 4;
    if length > max_frame {
        return Err(KernelError::TooLarge {
            message: format!(
                "the message is {length} bytes once encoded, over the frame limit of {max_frame} bytes (KernelConfig::max_frame)"
            ),
        });
    }
    frame[..4].copy_from_slice(&(length as u32).to_be_bytes());
    Ok(frame)
}
/// Reads the worker's frames until it ends: replies, output, and host calls.
async fn serve(
    mut reader: FramedRead<Counting<tokio::net::unix::OwnedReadHalf>, LengthDelimitedCodec>,
    worker: std::sync::Weak<Worker>,
    shared: Arc<Shared>,
    outgoing: Arc<Outgoing>,
    callables: CallableSlot,
    max_frame: usize,
) {
    let served = Served {
        shared,
        outgoing,
        callables,
        max_frame,
    };
    while let Some(frame) = reader.next().await {
        let handled = frame
            .map_err(|e| e.to_string())
            .and_then(|frame| {
                let message = Message::decode(&frame);
                served.shared.handled(frame.len());
                message
            })
            .and_then(|message| served.handle(message));
        match handled {
            Ok(Handled::Answered) => read_soon(&reader),
            Ok(Handled::Taken) => {}
            Err(what) => {
                protocol_violation(&worker, what);
                break;
            }
        }
    }
    // The worker is gone (or broke the protocol): nobody will answer what is pending.
    lock(&served.shared.pending).clear();
    served.shared.abort_host_calls(None);
    served.outgoing.close();
}

/// How long the reader polls for the worker's next frame after answering one of its calls
/// before it parks. A cell that calls the host usually calls again, or ends, within
/// microseconds, while waking a parked thread costs tens of them on small machines; the
/// worker polls for the answer the same way.
const READ_SOON: std::time::Duration = std::time::Duration::from_micros(50);

/// Waits, spinning, up to [`READ_SOON`] for the worker's next frame to arrive.
fn read_soon(reader: &FramedRead<Counting<tokio::net::unix::OwnedReadHalf>, LengthDelimitedCodec>) {
    let started = std::time::Instant::now();
    while started.elapsed() < READ_SOON && !arrived(reader) {
        std::hint::spin_loop();
    }
}

/// Whether the socket holds something to read now (or its end, or an error): asked of the
/// descriptor itself, leaving the bytes where they are, because tokio learns of them only when
/// its reactor is polled, which it is not while this spins. The reader's next read then finds
/// them at once, or its reactor does without sleeping (the readiness is there to be seen).
fn arrived(
    reader: &FramedRead<Counting<tokio::net::unix::OwnedReadHalf>, LengthDelimitedCodec>,
) -> bool {
    let fd = reader.get_ref().inner.as_ref().as_raw_fd();
    let mut byte = 0u8;
    // SAFETY: a non-blocking peek of one byte into a valid buffer, on the socket the reader
    // owns.
    let n = unsafe {
        libc::recv(
            fd,
            (&raw mut byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock
}

/// What handling a message did.
enum Handled {
    /// Nothing the worker waits for now, or only later.
    Taken,
    /// A call answered at once: the worker goes on right away.
    Answered,
}

/// One message from the worker: its kind, the request it answers, the rest.
struct Message {
    kind: String,
    id: u64,
    items: std::vec::IntoIter<Value>,
    /// What the decoder could not hold (an int beyond 128 bits), if anything.
    unsupported: Option<String>,
}

impl Message {
    fn decode(frame: &[u8]) -> Result<Message, String> {
        let (items, unsupported) = match marshal::decode(frame).map_err(|e| e.to_string())? {
            (Value::Tuple(items), unsupported) => (items, unsupported),
            _ => return Err("a frame that is not a message".to_owned()),
        };
        let mut items = items.into_iter();
        let kind = match items.next() {
            Some(Value::Str(kind)) => kind,
            other => return Err(format!("an unknown message {other:?}")),
        };
        let id = match items.next() {
            Some(Value::Int(id)) => u64::try_from(id).unwrap_or(0),
            _ => 0,
        };
        Ok(Message {
            kind,
            id,
            items,
            unsupported,
        })
    }
}

/// What the reader of a worker's frames answers with.
struct Served {
    shared: Arc<Shared>,
    outgoing: Arc<Outgoing>,
    callables: CallableSlot,
    max_frame: usize,
}

impl Served {
    fn handle(&self, message: Message) -> Result<Handled, String> {
        match message.kind.as_str() {
            "out" => self.output(message),
            "display" => self.display(message)?,
            "done" => self.done(message),
            "reply" => self.reply(message),
            "call" => return Ok(self.call(message)),
            kind => return Err(format!("an unknown message {kind:?}")),
        }
        Ok(Handled::Taken)
    }

    /// Output of an execution.
    fn output(&self, mut message: Message) {
        let Some(Value::Str(text)) = message.items.next() else {
            return;
        };
        let pending = lock(&self.shared.pending);
        match pending.get(&message.id) {
            Some(Pending::Execution { output, .. }) => lock(output).push(&text),
            _ => {
                drop(pending);
                // Written outside any execution (a thread or subprocess a cell left behind):
                // kept, within a cap, for the next execution.
                self.shared.stray.push(&text);
            }
        }
    }

    /// An item an execution showed: `(bundle, omitted)`.
    fn display(&self, message: Message) -> Result<(), String> {
        let id = message.id;
        let item = DisplayItem::from_value(Value::Tuple(message.items.collect()))?;
        let pending = lock(&self.shared.pending);
        match pending.get(&id) {
            Some(Pending::Execution { output, .. }) => lock(output).display(item),
            _ => {
                drop(pending);
                // Shown outside any execution (a thread a cell left running): its text, for
                // the next execution.
                self.shared.stray.push(&format!("{}\n", item.text()));
            }
        }
        Ok(())
    }

    /// An execution ended, with the exception it raised if any.
    fn done(&self, mut message: Message) {
        let id = message.id;
        let raised = match message.items.next() {
            Some(Value::Tuple(pair)) => match <[Value; 2]>::try_from(pair) {
                Ok([Value::Str(t), Value::Str(m)]) => Some((t, m)),
                _ => Some(("BaseException".to_owned(), String::new())),
            },
            _ => None,
        };
        let killed = {
            let mut executing = lock(&self.shared.executing);
            if *executing == Some(id) {
                *executing = None;
            }
            self.shared.killed.load(Ordering::SeqCst)
        };
        // A call the cell no longer waits for (it was interrupted in it) is dropped: an MCP
        // call is cancelled, a sub-agent's run ends.
        self.shared.abort_host_calls(Some(id));
        if let Some(Pending::Execution { done, .. }) = lock(&self.shared.pending).remove(&id)
            && !killed
        {
            // The end of a cell whose worker was killed first is not sent: the execution
            // reports the kill (its state is lost), as its worker is gone.
            let _ = done.send(raised);
        }
    }

    /// The answer to a request.
    fn reply(&self, mut message: Message) {
        let Some(Value::Str(status)) = message.items.next() else {
            return;
        };
        let status = Status::decode(status);
        let payload = message.items.next().unwrap_or_default();
        // A value the host cannot hold (an int beyond 128 bits) is a refusal of the value, not
        // of the worker.
        let reply = match message.unsupported {
            Some(what) if status == Status::Ok => Reply {
                status: Status::Unsupported,
                payload: Value::Str(what),
            },
            _ => Reply { status, payload },
        };
        if let Some(Pending::Reply(tx)) = lock(&self.shared.pending).remove(&message.id) {
            let _ = tx.send(reply);
        }
    }

    /// A call of a host function or method, answered with a `return` frame: at once when it
    /// completes without waiting (most do), else on a task of its own (it may call back into
    /// the worker, whose replies this reader must go on reading).
    fn call(&self, mut message: Message) -> Handled {
        let id = message.id;
        let handle = match message.items.next() {
            Some(Value::Int(h)) => u64::try_from(h).unwrap_or(u64::MAX),
            _ => u64::MAX,
        };
        let method = match message.items.next() {
            Some(Value::Str(m)) => Some(m),
            _ => None,
        };
        let args = match message.items.next() {
            Some(Value::List(args)) => args,
            _ => Vec::new(),
        };
        let callables = lock(&self.callables).clone();
        let callable = lock(&callables).get(&handle).cloned();
        let outgoing = self.outgoing.clone();
        let max_frame = self.max_frame;
        let unsupported = message.unsupported;
        let shown = host_display(&self.shared);
        let name = match (&callable, &method) {
            (Some(Callable::Function(name, _)), _) => name.clone(),
            (Some(Callable::Object(name, _)), Some(method)) => format!("{name}.{method}"),
            _ => "unknown".to_owned(),
        };
        let mcp =
            matches!(&callable, Some(Callable::Object(_, object)) if cave_core::calls_mcp(object));
        let newest = newest_cell(&self.shared);
        let (span, meter) = newest.as_ref().map_or_else(
            || (tracing::Span::none(), None),
            |(_, o)| {
                let o = lock(o);
                (o.span(), o.host_calls())
            },
        );
        let cell = cave_cell::HostCallCell {
            span,
            show: shown,
            meter,
        };
        let from = newest.map(|(id, _)| id);
        let dropped = cave_core::CancellationToken::new();
        let dropping = dropped.clone();
        let call_name = name.clone();
        let mut answer = Box::pin(async move {
            let result = match unsupported {
                Some(what) => Err(HostError::new(
                    "TypeError",
                    format!(
                        "an argument holds a {what}, which cannot be passed to a host function"
                    ),
                )),
                // A panic fails the call (`run_host_call` catches it), never this reader.
                None => {
                    let call = cave_cell::run_host_call(
                        cell,
                        &name,
                        mcp,
                        host_call(callable, method, args),
                    );
                    tokio::select! {
                        biased;
                        result = call => result,
                        () = dropping.cancelled() => Err(HostError::new(
                            "KeyboardInterrupt",
                            format!("the host call {call_name} was dropped: its cell was interrupted or has ended"),
                        )),
                    }
                }
            };
            dropping.cancel();
            if let Ok(frame) = returned(id, result, max_frame) {
                let _ = outgoing.send(frame);
            }
        });
        // Polled once here (a future must register its waker again at every poll, so the
        // task's first poll repairs the no-op one of this).
        if futures_util::FutureExt::now_or_never(answer.as_mut()).is_some() {
            return Handled::Answered;
        }
        tokio::spawn(answer);
        if let Some(from) = from {
            let mut tasks = lock(&self.shared.host_tasks);
            // Kept bounded: the answered ones (their tokens cancelled as they end) go as new
            // ones come.
            tasks.retain(|(_, task)| !task.is_cancelled());
            tasks.push((from, dropped));
        }
        Handled::Taken
    }
}

/// Where items a host call shows go (see [`cave_cell::show_from_host`]): the execution that
/// began last among those waiting (the innermost, when a host function runs a cell of its
/// own), else the next one's output, as text.
fn host_display(shared: &Arc<Shared>) -> Arc<dyn Fn(DisplayItem) + Send + Sync> {
    let shared = Arc::downgrade(shared);
    Arc::new(move |item| {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        match newest_cell(&shared) {
            Some((_, output)) => lock(&output).display(item),
            None => shared.stray.push(&format!("{}\n", item.text())),
        }
    })
}

/// The output of the newest running cell: the one a host call comes from.
fn newest_cell(shared: &Shared) -> Option<(u64, Arc<Mutex<cave_cell::CellOutput>>)> {
    lock(&shared.pending)
        .iter()
        .filter_map(|(id, pending)| match pending {
            Pending::Execution { output, .. } => Some((*id, output.clone())),
            Pending::Reply(_) => None,
        })
        .max_by_key(|(id, _)| *id)
}

/// The `return` frame of host call `id`.
fn returned(
    id: u64,
    result: Result<Value, HostError>,
    max_frame: usize,
) -> Result<Vec<u8>, KernelError> {
    let frame = |ok: bool, payload: Value| {
        framed(
            &Data::Owned(Value::Tuple(vec![
                "return".into(),
                Value::Int(id.into()),
                Value::Bool(ok),
                payload,
            ])),
            max_frame,
        )
    };
    let raised =
        |python_type: &str, message: String| Value::Tuple(vec![python_type.into(), message.into()]);
    match result {
        Ok(value) => frame(true, value),
        Err(e) => frame(false, raised(&e.python_type, e.message)),
    }
    // Too large or too deep for the worker: it raises instead.
    .or_else(|e| frame(false, raised("ValueError", e.to_string())))
}

fn protocol_violation(worker: &std::sync::Weak<Worker>, what: String) {
    tracing::error!(%what, "the kernel worker broke the protocol; killing it");
    if let Some(worker) = worker.upgrade() {
        worker.kill(Some(format!(
            "the Python process broke the runtime's protocol ({what}) and was killed"
        )));
    }
}

async fn host_call(
    callable: Option<Callable>,
    method: Option<String>,
    args: Vec<Value>,
) -> Result<Value, HostError> {
    let mut values = Vec::with_capacity(args.len());
    for arg in args {
        match arg {
            Value::Tuple(pair) => match <[Value; 2]>::try_from(pair) {
                Ok([Value::Str(name), value]) => values.push((name, value)),
                _ => return Err(HostError::new("TypeError", "malformed arguments")),
            },
            _ => return Err(HostError::new("TypeError", "malformed arguments")),
        }
    }
    let args = Args::new(values);
    match (callable, method) {
        (Some(Callable::Function(_, f)), None) => f.call(args).await,
        (Some(Callable::Object(_, o)), Some(method)) => o.call(&method, args).await,
        _ => Err(HostError::new(
            "RuntimeError",
            "this host function or object is no longer registered",
        )),
    }
}

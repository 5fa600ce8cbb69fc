//! One child interpreter: starting it, the frames to and from it, and its death.

use crate::KernelError;
use crate::cgroup::ChildGroup;
use crate::config::KernelConfig;
use crate::marshal::{self, Data};
use cave_core::{Args, HostError, HostFunction, HostObject, Value};
use cave_python::MIN_PYTHON;
use futures_util::StreamExt;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::AsyncReadExt;
use tokio::sync::{oneshot, watch};
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};

/// The descriptor the child finds its socket on.
const CHILD_FD: i32 = 3;
/// The descriptor of the output shadow: a memory file where the child keeps a copy of the
/// output it has not sent yet, read by the host if the child dies (see `Shadow`).
const SHADOW_FD: i32 = 4;
/// The shadow's size: the child sends its buffered output before it holds this much.
const SHADOW_SIZE: usize = 1 << 20;
/// How much of the child's own stderr is kept for a crash report.
const LAST_WORDS: usize = 4096;

/// Refuses an interpreter the worker does not support (argv 6: the oldest version, argv 7:
/// why free-threaded builds are refused), reads the sources frame, loads the executor and the
/// worker as modules, and serves. Written in syntax any Python 3 parses, so that an old one
/// hears why it is refused.
const BOOTSTRAP: &str = "\
import os, sys
oldest = tuple(int(part) for part in sys.argv[6].split('.'))
if sys.version_info[:2] < oldest:
    sys.stderr.write('cave: this is Python %d.%d; the kernel runtime needs Python %s or later\\n'
                     % (sys.version_info[0], sys.version_info[1], sys.argv[6]))
    sys.exit(78)
if 't' in getattr(sys, 'abiflags', ''):
    sys.stderr.write('cave: this is a free-threaded build; %s\\n' % sys.argv[7])
    sys.exit(78)
import marshal, types
fd = int(sys.argv[1])
if sys.argv[5] != '-' and os.fork() == 0:
    # The keeper: once the host's end of the socket closes (stopped, dropped, or the host died),
    # it kills every process of the session's control group, whatever process group it left.
    import select, signal, time
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.closerange(0, fd)
    os.closerange(fd + 1, min(os.sysconf('SC_OPEN_MAX'), 1 << 16))
    poller = select.poll()
    poller.register(fd, getattr(select, 'POLLRDHUP', 0x2000))
    while not poller.poll():
        pass
    for _ in range(50):
        try:
            with open(sys.argv[5]) as members:
                others = [int(p) for p in members.read().split() if int(p) != os.getpid()]
        except (OSError, ValueError):
            break
        if not others:
            break
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)
    os._exit(0)
def read(n):
    data = bytearray()
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            os._exit(0)
        data += chunk
    return bytes(data)
for name, filename, source in marshal.loads(read(int.from_bytes(read(4), 'big'))):
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module
    exec(compile(source, filename, 'exec'), module.__dict__)
sys.modules['cave_kernel'].main(fd, int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
";

pub(crate) use cave_core::lock;

/// What a host call reaches.
#[derive(Clone)]
pub(crate) enum Callable {
    Function(Arc<dyn HostFunction>),
    Object(Arc<dyn HostObject>),
}

/// Host functions and objects by the handle the child knows them by.
pub(crate) type Callables = Arc<Mutex<HashMap<u64, Callable>>>;

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
        output: Arc<Mutex<cave_core::CellOutput>>,
        done: oneshot::Sender<Raised>,
    },
}

/// How the child ended.
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
    /// The host killed it (stop, reset, a cell that ignored its interrupt).
    killed: AtomicBool,
    /// Why the host killed it, when it was not a stop.
    kill_reason: Mutex<Option<String>>,
    last_words: Mutex<Vec<u8>>,
    /// The child's stderr reached its end (every process holding it exited).
    last_words_closed: AtomicBool,
    /// Wakes who waits for that.
    last_words_ended: tokio::sync::Notify,
    /// The outermost execution in progress (its request id).
    executing: Mutex<Option<u64>>,
    /// What was written while no execution ran, for the next one.
    stray: cave_core::StrayOutput,
}

impl Shared {
    fn new() -> Self {
        Self {
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            killed: AtomicBool::new(false),
            kill_reason: Mutex::new(None),
            last_words: Mutex::new(Vec::new()),
            last_words_closed: AtomicBool::new(false),
            last_words_ended: tokio::sync::Notify::new(),
            executing: Mutex::new(None),
            stray: cave_core::StrayOutput::default(),
        }
    }
}

/// A started child.
pub(crate) struct Process {
    /// The process serving now: the child, or the copy a rollback handed over to.
    pid: AtomicI32,
    /// The child's process group, which its copies share.
    pgid: i32,
    /// The pid of the paused copy of each checkpoint.
    checkpoints: Mutex<HashMap<u64, i32>>,
    outgoing: Arc<Outgoing>,
    shared: Arc<Shared>,
    /// `Some` once the process serving has exited (with its status, when it was our child).
    exit: watch::Receiver<Option<Option<ExitStatus>>>,
    max_frame: usize,
    /// The interpreter's version.
    pub(crate) version: (u32, u32, u32),
    /// The child's control group, when the host could make one.
    group: Option<Arc<ChildGroup>>,
    /// How each limit is enforced.
    pub(crate) enforcement: Vec<String>,
    /// The limits in force (`None` for a kernel behind a Jupyter server: the server's).
    pub(crate) limits: Option<crate::Limits>,
    /// Output the child buffered and had not sent when it died.
    shadow: Shadow,
    /// How each sandbox layer stands in this child.
    pub(crate) sandbox: Vec<crate::sandbox::Layer>,
    /// The kernel behind a Jupyter server this process is, when it is one.
    #[cfg(feature = "jupyter")]
    remote: Option<Arc<crate::jupyter::Remote>>,
}

/// The interpreter to start and the directories it reads.
#[derive(Clone, Debug)]
pub(crate) struct Interpreter {
    /// The real executable.
    pub(crate) executable: PathBuf,
    /// `sys.prefix` and `sys.path`, for the sandbox's read-only rules.
    pub(crate) dirs: Vec<PathBuf>,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("pid", &self.pid())
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Process {
    /// Starts an interpreter and waits until it is ready to serve.
    pub(crate) async fn start(
        config: &KernelConfig,
        interpreter: &Interpreter,
        work_dir: Option<PathBuf>,
        callables: Callables,
    ) -> Result<Arc<Process>, KernelError> {
        let python = interpreter.executable.as_path();
        let (host, child) = std::os::unix::net::UnixStream::pair().map_err(setup)?;
        let child: OwnedFd = child.into();
        let shadow = Shadow::create().map_err(setup)?;
        let shadow_fd = shadow.fd.as_raw_fd();
        let mut limits = config.limits_in_force();
        let wanted = crate::cgroup::Wanted {
            memory: limits.memory,
            processes: limits.processes,
        };
        // Made whether or not a limit asks for one: it holds every process the child starts.
        let group = if config.control_group {
            match ChildGroup::create(wanted) {
                Ok(group) => Some(Arc::new(group)),
                Err(why) if config.limits.is_none() => {
                    // The defaults are not worth losing the group for (a host that delegates
                    // `pids` but not `memory`): without them, then.
                    tracing::info!(%why, "no control group with the default limits");
                    limits.memory = None;
                    limits.processes = None;
                    ChildGroup::create(crate::cgroup::Wanted::default())
                        .map(Arc::new)
                        .map_err(
                            |why| tracing::info!(%why, "no control group for the kernel child"),
                        )
                        .ok()
                }
                Err(why) => {
                    tracing::info!(%why, "no control group for the kernel child; rlimits only");
                    None
                }
            }
        } else {
            None
        };
        let members = group.as_deref().map(ChildGroup::members);
        let mut command = Command::new(python);
        command
            .arg("-c")
            .arg(BOOTSTRAP)
            .arg(CHILD_FD.to_string())
            .arg(config.max_frame.to_string())
            .arg(SHADOW_FD.to_string())
            .arg(SHADOW_SIZE.to_string())
            .arg(members.as_deref().unwrap_or(std::path::Path::new("-")))
            .arg(format!("{}.{}", MIN_PYTHON.0, MIN_PYTHON.1))
            .arg(cave_python::FREE_THREADED_REFUSAL)
            .env_clear()
            .envs(crate::environment::inherited())
            .envs(config.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(dir) = &work_dir {
            command.current_dir(dir);
        }
        let sandbox = config.sandbox_in_force();
        let sandbox = (!sandbox.is_off()).then(|| {
            let dir = work_dir
                .clone()
                .unwrap_or_else(|| std::env::current_dir().unwrap_or_default());
            // The keeper reads who is in the group.
            let mut sandbox = sandbox;
            if let Some(members) = &members {
                sandbox = sandbox.readable(members);
            }
            crate::sandbox::Prepared::new(&sandbox, python, &interpreter.dirs, &dir)
        });
        let layers = sandbox
            .as_ref()
            .map(|s| s.layers.clone())
            .unwrap_or_default();
        for layer in &layers {
            match &layer.state {
                crate::sandbox::LayerState::Unavailable(_) => {
                    tracing::warn!(%layer, "sandbox layer")
                }
                _ => tracing::info!(%layer, "sandbox layer"),
            }
        }
        let mut enforcement = vec![crate::containment::describe(group.is_some())];
        if config.limits.is_none() && !config.sandbox_in_force().is_off() && group.is_none() {
            enforcement.push(
                "memory and processes: no default limit (the defaults hold through a control group, which this host cannot make; set them to have rlimits)".to_owned(),
            );
        }
        let in_force = limits.clone();
        let limits = rlimits(&limits, group.as_deref(), &mut enforcement);
        let joins = group.as_deref().map(ChildGroup::procs).unwrap_or_default();
        let hook = config.pre_exec.clone();
        let parent = std::process::id() as libc::pid_t;
        let fd = child.as_raw_fd();
        // SAFETY: the closure makes only async-signal-safe calls (setpgid, prctl, getppid,
        // dup2, fcntl, setrlimit) on values prepared before the fork; the user's hook carries
        // the same contract (`KernelConfig::pre_exec` is unsafe).
        unsafe {
            command.pre_exec(move || {
                // Its own process group, so that a kill reaches what it started.
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // It dies with the thread that started it, which lives exactly as long as it.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                // Join the control group before anything else runs in it.
                for procs in &joins {
                    let joined = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if joined < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let written = libc::write(joined, b"0".as_ptr().cast(), 1);
                    libc::close(joined);
                    if written != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // Above the targets first, so that one dup2 cannot overwrite the other's source.
                let socket = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10);
                let memory = libc::fcntl(shadow_fd, libc::F_DUPFD_CLOEXEC, 10);
                if socket < 0
                    || memory < 0
                    || libc::dup2(socket, CHILD_FD) < 0
                    || libc::dup2(memory, SHADOW_FD) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                for &(resource, value) in &limits {
                    let limit = libc::rlimit {
                        rlim_cur: value,
                        rlim_max: value,
                    };
                    if libc::setrlimit(resource, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // What its cells orphan stays its descendant.
                crate::containment::apply()?;
                if let Some(hook) = &hook {
                    hook()?;
                }
                // Last: the layers restrict what the steps above need.
                match &sandbox {
                    Some(sandbox) => sandbox.apply(),
                    None => Ok(()),
                }
            });
        }
        let (exit_tx, exit) = watch::channel(None);
        let (started_tx, started) = std::sync::mpsc::channel();
        let shared = Arc::new(Shared::new());
        let held = group.clone();
        // The thread that forks the child waits for it: the child's death signal is tied to
        // this thread, which therefore ends only after the child.
        std::thread::Builder::new()
            .name("cave-kernel-child".to_owned())
            .spawn(move || match command.spawn() {
                Ok(mut spawned) => {
                    drop(child);
                    let stderr = spawned.stderr.take();
                    let _ = started_tx.send(Ok((spawned.id(), stderr)));
                    // After a rollback the first worker is the reaper of the tree, and ends as
                    // the serving copy ends, with its status (`_REAPER` in cave_kernel.py).
                    let status = spawned.wait().ok();
                    // What is left of the group (paused copies, what cells started, detached
                    // or not) goes too.
                    // SAFETY: a signal to our child's process group.
                    unsafe {
                        libc::kill(-(spawned.id() as i32), libc::SIGKILL);
                    }
                    if let Some(group) = &held {
                        group.kill_all();
                    }
                    let _ = exit_tx.send(Some(status));
                }
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                }
            })
            .map_err(setup)?;
        let (pid, stderr) = tokio::task::spawn_blocking(move || started.recv())
            .await
            .map_err(|e| KernelError::Start {
                message: e.to_string(),
            })?
            .map_err(|_| KernelError::Start {
                message: "the thread starting the child ended".to_owned(),
            })?
            .map_err(|e| KernelError::Start {
                message: format!("could not run {}: {e}", python.display()),
            })?;
        let pid = pid as i32;
        if let Some(stderr) = stderr {
            spawn_last_words(stderr, shared.clone());
        }
        let max_frame = config.max_frame;
        let build = move |outgoing| Process {
            pid: AtomicI32::new(pid),
            pgid: pid,
            checkpoints: Mutex::new(HashMap::new()),
            outgoing,
            shared,
            exit,
            max_frame,
            version: (0, 0, 0),
            group,
            enforcement,
            limits: Some(in_force),
            shadow,
            sandbox: layers,
            #[cfg(feature = "jupyter")]
            remote: None,
        };
        Self::serve_on(build, host, &python.display().to_string(), callables).await
    }

    /// Starts (or attaches to) a kernel behind a Jupyter server and waits until the worker in
    /// it is ready to serve.
    #[cfg(feature = "jupyter")]
    pub(crate) async fn start_remote(
        config: &KernelConfig,
        jupyter: &crate::jupyter::JupyterConfig,
        callables: Callables,
    ) -> Result<Arc<Process>, KernelError> {
        let (remote, host) = crate::jupyter::connect(jupyter, config.max_frame).await?;
        let (exit_tx, exit) = watch::channel(None);
        let mut ended = remote.ended.clone();
        tokio::spawn(async move {
            let _ = ended.wait_for(Option::is_some).await;
            let _ = exit_tx.send(Some(None));
        });
        let shadow = Shadow::create().map_err(setup)?;
        let max_frame = config.max_frame;
        let build = move |outgoing| Process {
            pid: AtomicI32::new(0),
            pgid: 0,
            checkpoints: Mutex::new(HashMap::new()),
            outgoing,
            shared: Arc::new(Shared::new()),
            exit,
            max_frame,
            version: (0, 0, 0),
            group: None,
            enforcement: Vec::new(),
            limits: None,
            shadow,
            sandbox: Vec::new(),
            remote: Some(remote),
        };
        let what = format!("the Jupyter kernel at {}", jupyter.url());
        Self::serve_on(build, host, &what, callables).await
    }

    /// Sends the sources on `host`, waits for the worker's `ready`, and serves its frames.
    async fn serve_on(
        build: impl FnOnce(Arc<Outgoing>) -> Process,
        host: std::os::unix::net::UnixStream,
        what: &str,
        callables: Callables,
    ) -> Result<Arc<Process>, KernelError> {
        host.set_nonblocking(true).map_err(setup)?;
        let stream = tokio::net::UnixStream::from_std(host).map_err(setup)?;
        let (read, write) = stream.into_split();
        let outgoing = Outgoing::start(write);
        let mut process = build(outgoing);
        let sources = Value::List(vec![
            Value::Tuple(vec![
                cave_python::EXECUTOR_MODULE.into(),
                cave_python::EXECUTOR_FILE.into(),
                cave_python::EXECUTOR.into(),
            ]),
            Value::Tuple(vec![
                cave_python::KERNEL_MODULE.into(),
                cave_python::KERNEL_FILE.into(),
                cave_python::KERNEL.into(),
            ]),
        ]);
        process
            .send(&Data::Owned(sources))
            .map_err(|e| KernelError::Start {
                message: e.to_string(),
            })?;
        let mut reader = FramedRead::new(
            read,
            LengthDelimitedCodec::builder()
                .max_frame_length(process.max_frame)
                .new_codec(),
        );
        let ready = match reader.next().await {
            Some(Ok(frame)) => marshal::decode(&frame).ok().map(|(value, _)| value),
            _ => None,
        };
        let version = ready.as_ref().and_then(|ready| match ready {
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
        });
        let Some(version) = version else {
            process.kill(None);
            let status = process.wait().await;
            let words = process.final_words().await;
            return Err(KernelError::Start {
                message: format!(
                    "{what} did not start the worker ({}){}",
                    describe_status(status),
                    if words.is_empty() {
                        String::new()
                    } else {
                        format!(": {words}")
                    }
                ),
            });
        };
        process.version = version;
        tracing::info!(pid = process.pid(), ?version, enforcement = ?process.enforcement, "kernel child started");
        if (version.0, version.1) < MIN_PYTHON {
            process.kill(None);
            return Err(KernelError::Start {
                message: format!(
                    "{what} is Python {}.{}; the kernel runtime needs Python {}.{} or later",
                    version.0, version.1, MIN_PYTHON.0, MIN_PYTHON.1
                ),
            });
        }
        let process = Arc::new(process);
        tokio::spawn(serve(
            reader,
            Arc::downgrade(&process),
            process.shared.clone(),
            process.outgoing.clone(),
            callables,
            process.max_frame,
        ));
        Ok(process)
    }

    /// The process id of the process serving (the child, or a copy a rollback handed over
    /// to).
    pub(crate) fn pid(&self) -> i32 {
        self.pid.load(Ordering::SeqCst)
    }

    /// Forks a paused copy of the serving process: checkpoint `id`.
    pub(crate) async fn checkpoint(&self, id: u64) -> Result<(), KernelError> {
        #[cfg(feature = "jupyter")]
        if self.remote.is_some() {
            return Err(KernelError::Checkpoint {
                message: "checkpoints need a local kernel process; a kernel behind a Jupyter server cannot be copied".to_owned(),
            });
        }
        let reply = self
            .request("checkpoint", vec![Data::Owned(Value::Int(id.into()))])
            .await?;
        match (reply.status, reply.payload) {
            (Status::Ok, Value::Int(pid)) => {
                lock(&self.checkpoints).insert(id, pid as i32);
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
        let Some(copy) = lock(&self.checkpoints).get(&id).copied() else {
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
                self.pid.store(copy, Ordering::SeqCst);
                let mut checkpoints = lock(&self.checkpoints);
                checkpoints.retain(|&k, _| k <= id);
                checkpoints.insert(id, fresh as i32);
                Ok(())
            }
            (_, payload) => {
                // Refused before any hand-over: the serving process goes on.
                Err(KernelError::Checkpoint {
                    message: format!("the rollback was refused: {payload}"),
                })
            }
        }
    }

    /// Ends the copy of checkpoint `id` (nothing is answered).
    pub(crate) fn drop_checkpoint(&self, id: u64) {
        if lock(&self.checkpoints).remove(&id).is_some() && self.alive() {
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
        output: Arc<Mutex<cave_core::CellOutput>>,
    ) -> Result<(u64, oneshot::Receiver<Raised>), KernelError> {
        let id = self.next_id();
        let (done, rx) = oneshot::channel();
        lock(&self.shared.pending).insert(id, Pending::Execution { output, done });
        lock(&self.shared.executing).get_or_insert(id);
        let message = Data::Owned(Value::Tuple(vec![
            "execute".into(),
            Value::Int(id.into()),
            code.into(),
            Value::Int(number.into()),
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

    /// Returns true if and only if the child has not exited.
    pub(crate) fn alive(&self) -> bool {
        self.exit.borrow().is_none() && !self.outgoing.is_closed()
    }

    /// Sends `SIGINT` to the child (a remote kernel: asks its server to interrupt it).
    pub(crate) fn interrupt(&self) {
        #[cfg(feature = "jupyter")]
        if let Some(remote) = &self.remote {
            remote.interrupt();
            return;
        }
        // SAFETY: kill with a pid this runtime started; a stale pid is reaped only by our
        // waiter thread, after which `alive` is false and this is not called.
        unsafe {
            libc::kill(self.pid(), libc::SIGINT);
        }
    }

    /// Kills the child and everything in its process group. `reason` is what a running
    /// execution is told; `None` for a deliberate stop.
    pub(crate) fn kill(&self, reason: Option<String>) {
        if let Some(reason) = reason {
            lock(&self.shared.kill_reason).get_or_insert(reason);
        }
        self.shared.killed.store(true, Ordering::SeqCst);
        #[cfg(feature = "jupyter")]
        if let Some(remote) = &self.remote {
            remote.kill("the Python process was stopped");
            return;
        }
        if self.exit.borrow().is_none() {
            // While the first worker lives, what cells detached is its descendant (after a
            // rollback the first worker is the reaper, the serving copy one of its descendants).
            crate::containment::kill_descendants(self.pgid, None);
            // SAFETY: signals to our child's process group and to the child itself.
            unsafe {
                libc::kill(-self.pgid, libc::SIGKILL);
                libc::kill(self.pid(), libc::SIGKILL);
            }
        }
        if let Some(group) = &self.group {
            group.kill_all();
        }
    }

    /// Lets go of the process, its runtime being gone: killed, except an idle kernel the
    /// runtime attached to, which is let go gracefully (the link's end tells its worker to
    /// stop, and the kernel stays with its namespace).
    pub(crate) fn release(&self) {
        #[cfg(feature = "jupyter")]
        if let Some(remote) = &self.remote {
            self.outgoing.close();
            if remote.owned || self.executing().is_some() {
                self.kill(None);
            }
            return;
        }
        // Killed before the link closes: a worker that reads the end of its link exits, and
        // what its cells detached would then be orphaned beyond the walk from it.
        self.kill(None);
        self.outgoing.close();
    }

    /// Asks the child to exit, then kills it after `grace`.
    pub(crate) async fn stop(&self, grace: std::time::Duration) {
        if self.alive() {
            // First, while the first worker is still the ancestor of what cells detached (once
            // it exits, those are orphaned beyond its reach); the serving process is kept, to be
            // asked to exit.
            if self.pgid > 0 {
                crate::containment::kill_descendants(self.pgid, Some(self.pid()));
            }
            let stop = self.request("stop", Vec::new());
            let _ = tokio::time::timeout(grace, stop).await;
            let mut exit = self.exit.clone();
            let exited = tokio::time::timeout(grace, exit.wait_for(Option::is_some)).await;
            if exited.is_err() {
                self.kill(None);
            }
        }
        self.shared.killed.store(true, Ordering::SeqCst);
        #[cfg(feature = "jupyter")]
        if let Some(remote) = &self.remote {
            remote.end("the Python process was stopped");
        }
        // The group may still hold what a cell started (a remote kernel has none here).
        if self.pgid > 0 {
            if let Some(group) = &self.group {
                group.kill_all();
            }
            // SAFETY: signals to our child's process group.
            unsafe {
                libc::kill(-self.pgid, libc::SIGKILL);
            }
        }
        self.wait().await;
    }

    /// Waits for the child to exit.
    pub(crate) async fn wait(&self) -> Option<ExitStatus> {
        let mut exit = self.exit.clone();
        let status = exit.wait_for(Option::is_some).await.ok()?;
        status.flatten()
    }

    /// What was written while no execution ran since the last call, as the next execution's
    /// output begins with it.
    pub(crate) fn take_stray_output(&self) -> Option<String> {
        self.shared.stray.take()
    }

    /// What the child wrote to its own stderr last (a fatal error, a faulthandler dump).
    fn last_words(&self) -> String {
        let words = lock(&self.shared.last_words);
        String::from_utf8_lossy(&words).trim().to_owned()
    }

    /// The last words once the child has exited: read to the end of its stderr, which the
    /// reader may not have reached when the exit is seen (a process that inherited the pipe
    /// can hold it open: given up after a short wait).
    async fn final_words(&self) -> String {
        let shared = &self.shared;
        let _ = tokio::time::timeout(std::time::Duration::from_millis(500), async {
            loop {
                let ended = shared.last_words_ended.notified();
                if shared.last_words_closed.load(Ordering::SeqCst) {
                    return;
                }
                ended.await;
            }
        })
        .await;
        self.last_words()
    }

    /// How the process ended, once it has: a description for the execution that was running.
    pub(crate) async fn death(&self) -> Death {
        let status = self.wait().await;
        let killed = self.shared.killed.load(Ordering::SeqCst);
        let reason = lock(&self.shared.kill_reason).clone();
        #[cfg(feature = "jupyter")]
        let reason = reason.or_else(|| {
            self.remote
                .as_ref()
                .filter(|_| !killed)
                .and_then(|r| r.ended.borrow().clone())
        });
        let description = match (reason, killed) {
            (Some(reason), _) => reason,
            (None, true) => "the Python process was stopped".to_owned(),
            (None, false) if self.group.as_ref().is_some_and(|g| g.oom_kills() > 0) => {
                "the Python process was killed: out of memory (it reached its memory limit)"
                    .to_owned()
            }
            (None, false) => {
                let mut text = format!("the Python process {}", describe_status(status));
                let words = last_words_for_the_model(&self.final_words().await);
                if !words.is_empty() {
                    text.push_str(&format!("; Python said:\n{words}"));
                }
                text
            }
        };
        Death {
            description,
            unsent: self.shadow.unsent(),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.release();
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

/// A memory file shared with the child: the output it has buffered and not sent yet, as
/// `[execution id: u64 LE][length: u64 LE][UTF-8 text]`. The child updates it with every
/// write and clears it once the text is sent, so a child killed between the two leaves its
/// last words here instead of losing them.
struct Shadow {
    fd: OwnedFd,
}

impl Shadow {
    fn create() -> std::io::Result<Self> {
        // SAFETY: memfd_create with a valid C string; the descriptor is owned from here on.
        let raw = unsafe { libc::memfd_create(c"cave-kernel-output".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        // SAFETY: ftruncate on the descriptor just made.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), SHADOW_SIZE as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self { fd })
    }

    /// What a dead child left unsent: its execution id and text.
    fn unsent(&self) -> Option<(u64, String)> {
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::from(self.fd.try_clone().ok()?);
        let mut header = [0u8; 16];
        file.read_exact_at(&mut header, 0).ok()?;
        let execution = u64::from_le_bytes(header[..8].try_into().ok()?);
        let length = u64::from_le_bytes(header[8..].try_into().ok()?) as usize;
        if length == 0 || length > SHADOW_SIZE - 16 {
            return None;
        }
        let mut text = vec![0u8; length];
        file.read_exact_at(&mut text, 16).ok()?;
        Some((execution, marshal::python_text(&text)))
    }
}

/// What a dying interpreter wrote (a fatal error, a faulthandler dump), as the model should see
/// it: the error and the frames of its own code and libraries, not the runtime's.
fn last_words_for_the_model(words: &str) -> String {
    let kept: Vec<&str> = words
        .lines()
        .map(str::trim_end)
        .filter(|line| {
            let line = line.trim_start();
            line.starts_with("Fatal Python error")
                || (line.starts_with("File ")
                    && !line.contains("\"<cave-")
                    && !line.contains("\"<string>\""))
        })
        .collect();
    let start = kept.len().saturating_sub(6);
    kept[start..].join("\n")
}

/// How long a rollback may take before the process is given up.
const ROLLBACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How an exit status reads: "was killed by SIGSEGV (signal 11)", "exited with status 3".
pub(crate) fn describe_status(status: Option<ExitStatus>) -> String {
    match status {
        Some(status) => match (status.code(), status.signal()) {
            (Some(code), _) => format!("exited with status {code}"),
            (None, Some(signal)) => {
                format!("was killed by {} (signal {signal})", signal_name(signal))
            }
            _ => "ended".to_owned(),
        },
        None => "ended".to_owned(),
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGKILL => "SIGKILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGXCPU => "SIGXCPU (its CPU time limit)",
        libc::SIGXFSZ => "SIGXFSZ (its file size limit)",
        libc::SIGPIPE => "SIGPIPE",
        _ => "a signal",
    }
}

fn setup(e: std::io::Error) -> KernelError {
    KernelError::Start {
        message: e.to_string(),
    }
}

/// The rlimits to set, and how each limit is enforced (for the start-up report). Memory and
/// processes go to `group` when there is one.
fn rlimits(
    limits: &crate::Limits,
    group: Option<&ChildGroup>,
    enforcement: &mut Vec<String>,
) -> Vec<(libc::__rlimit_resource_t, libc::rlim_t)> {
    let mut address_space = limits.address_space;
    let mut processes = limits.processes;
    if let Some(bytes) = limits.memory {
        if group.is_some() {
            enforcement.push(format!(
                "memory: {bytes} bytes (control group; a kill when exceeded)"
            ));
        } else {
            enforcement.push(format!(
                "memory: {bytes} bytes (address space; MemoryError when exceeded)"
            ));
            address_space = Some(address_space.map_or(bytes, |a| a.min(bytes)));
        }
    }
    if let Some(n) = limits.processes {
        if group.is_some() {
            enforcement.push(format!("processes: {n} (control group)"));
            processes = None;
        } else {
            enforcement.push(format!(
                "processes: {n} (RLIMIT_NPROC; not applied to root)"
            ));
        }
    }
    let set = [
        ("address space", libc::RLIMIT_AS, address_space),
        ("cpu seconds", libc::RLIMIT_CPU, limits.cpu_seconds),
        ("open files", libc::RLIMIT_NOFILE, limits.open_files),
        ("processes", libc::RLIMIT_NPROC, processes),
        ("file size", libc::RLIMIT_FSIZE, limits.file_size),
    ];
    set.into_iter()
        .filter_map(|(name, resource, value)| {
            let value = value?;
            if resource != libc::RLIMIT_NPROC {
                enforcement.push(format!("{name}: {value} (rlimit)"));
            }
            Some((resource, value as libc::rlim_t))
        })
        .collect()
}

/// Keeps the tail of what the child writes to its own stderr.
fn spawn_last_words(stderr: std::process::ChildStderr, shared: Arc<Shared>) {
    let fd: OwnedFd = stderr.into();
    let Ok(mut pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return;
    };
    tokio::spawn(async move {
        let mut buffer = vec![0u8; 4096];
        while let Ok(n) = pipe.read(&mut buffer).await {
            if n == 0 {
                break;
            }
            let mut words = lock(&shared.last_words);
            words.extend_from_slice(&buffer[..n]);
            if words.len() > LAST_WORDS {
                let cut = words.len() - LAST_WORDS;
                words.drain(..cut);
            }
        }
        shared.last_words_closed.store(true, Ordering::SeqCst);
        shared.last_words_ended.notify_waiters();
    });
}

/// Reads the child's frames until it ends: replies, output, and host calls.
async fn serve(
    mut reader: FramedRead<tokio::net::unix::OwnedReadHalf, LengthDelimitedCodec>,
    process: std::sync::Weak<Process>,
    shared: Arc<Shared>,
    outgoing: Arc<Outgoing>,
    callables: Callables,
    max_frame: usize,
) {
    while let Some(frame) = reader.next().await {
        let decoded = frame
            .map_err(|e| e.to_string())
            .and_then(|f| marshal::decode(&f).map_err(|e| e.to_string()));
        let (message, unsupported) = match decoded {
            Ok((Value::Tuple(items), unsupported)) => (items, unsupported),
            Ok(_) => {
                protocol_violation(&process, "a frame that is not a message".to_owned());
                break;
            }
            Err(e) => {
                protocol_violation(&process, e);
                break;
            }
        };
        let mut items = message.into_iter();
        let kind = items.next();
        let id = match items.next() {
            Some(Value::Int(id)) => u64::try_from(id).unwrap_or(0),
            _ => 0,
        };
        match kind.as_ref().and_then(Value::as_str) {
            Some("out") => {
                let text = match items.next() {
                    Some(Value::Str(text)) => text,
                    _ => continue,
                };
                let pending = lock(&shared.pending);
                match pending.get(&id) {
                    Some(Pending::Execution { output, .. }) => lock(output).push(&text),
                    _ => {
                        drop(pending);
                        // Written outside any execution (a thread or subprocess a cell left
                        // behind): kept, within a cap, for the next execution.
                        shared.stray.push(&text);
                    }
                }
            }
            Some("done") => {
                let raised = match items.next() {
                    Some(Value::Tuple(pair)) => match <[Value; 2]>::try_from(pair) {
                        Ok([Value::Str(t), Value::Str(m)]) => Some((t, m)),
                        _ => Some(("BaseException".to_owned(), String::new())),
                    },
                    _ => None,
                };
                {
                    let mut executing = lock(&shared.executing);
                    if *executing == Some(id) {
                        *executing = None;
                    }
                }
                if let Some(Pending::Execution { done, .. }) = lock(&shared.pending).remove(&id) {
                    let _ = done.send(raised);
                }
            }
            Some("reply") => {
                let status = match items.next() {
                    Some(Value::Str(status)) => Status::decode(status),
                    _ => continue,
                };
                let payload = items.next().unwrap_or_default();
                // A value the host cannot hold (an int beyond 128 bits) is a refusal of the
                // value, not of the process.
                let reply = match unsupported.clone() {
                    Some(what) if status == Status::Ok => Reply {
                        status: Status::Unsupported,
                        payload: Value::Str(what),
                    },
                    _ => Reply { status, payload },
                };
                if let Some(Pending::Reply(tx)) = lock(&shared.pending).remove(&id) {
                    let _ = tx.send(reply);
                }
            }
            Some("call") => {
                let handle = match items.next() {
                    Some(Value::Int(h)) => u64::try_from(h).unwrap_or(u64::MAX),
                    _ => u64::MAX,
                };
                let method = match items.next() {
                    Some(Value::Str(m)) => Some(m),
                    _ => None,
                };
                let args = match items.next() {
                    Some(Value::List(args)) => args,
                    _ => Vec::new(),
                };
                let callable = lock(&callables).get(&handle).cloned();
                let outgoing = outgoing.clone();
                let unsupported = unsupported.clone();
                tokio::spawn(async move {
                    let result = match unsupported {
                        Some(what) => Err(HostError::new(
                            "TypeError",
                            format!(
                                "an argument holds a {what}, which cannot be passed to a host function"
                            ),
                        )),
                        None => host_call(callable, method, args).await,
                    };
                    let (ok, payload) = match result {
                        Ok(value) => (true, value),
                        Err(e) => (
                            false,
                            Value::Tuple(vec![e.python_type.into(), e.message.into()]),
                        ),
                    };
                    let reply = |ok: bool, payload: Value| {
                        Value::Tuple(vec![
                            "return".into(),
                            Value::Int(id.into()),
                            Value::Bool(ok),
                            payload,
                        ])
                    };
                    let sent = match framed(&Data::Owned(reply(ok, payload)), max_frame) {
                        Ok(frame) => Ok(frame),
                        // Too large or too deep for the child: it raises instead.
                        Err(e) => framed(
                            &Data::Owned(reply(
                                false,
                                Value::Tuple(vec!["ValueError".into(), e.to_string().into()]),
                            )),
                            max_frame,
                        ),
                    };
                    if let Ok(frame) = sent {
                        let _ = outgoing.send(frame);
                    }
                });
            }
            _ => {
                protocol_violation(&process, format!("an unknown message {kind:?}"));
                break;
            }
        }
    }
    // The child is gone (or broke the protocol): nobody will answer what is pending.
    lock(&shared.pending).clear();
    outgoing.close();
}

fn protocol_violation(process: &std::sync::Weak<Process>, what: String) {
    tracing::error!(%what, "the kernel child broke the protocol; killing it");
    if let Some(process) = process.upgrade() {
        process.kill(Some(format!(
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
        (Some(Callable::Function(f)), None) => f.call(args).await,
        (Some(Callable::Object(o)), Some(method)) => o.call(&method, args).await,
        _ => Err(HostError::new(
            "RuntimeError",
            "this host function or object is no longer registered",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_faulthandler_dump_reads_as_the_models_own_frames() {
        let dump = "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n  File \"/usr/lib/python3.11/ctypes/__init__.py\", line 519 in string_at\n  File \"<cell 4>\", line 3 in <module>\n  File \"<cave-executor>\", line 242 in run_cell\n  File \"<cave-kernel>\", line 400 in _execute\n  File \"<string>\", line 16 in <module>\n\nExtension modules: _cffi_backend (total: 1)\n";
        assert_eq!(
            last_words_for_the_model(dump),
            "Fatal Python error: Segmentation fault\n  File \"/usr/lib/python3.11/ctypes/__init__.py\", line 519 in string_at\n  File \"<cell 4>\", line 3 in <module>"
        );
    }
}

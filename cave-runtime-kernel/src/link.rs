//! The seam between the worker's frames and where the worker runs.
//!
//! A [`Transport`] starts workers: a child process ([`crate::child`]) or a kernel behind a
//! Jupyter server (`crate::jupyter`). Each started worker comes as a [`Started`]: the host's
//! end of a local socket its frames travel on (the child's own socket, or one end of the
//! Jupyter bridge), and a [`Link`] that does what frames cannot: interrupt, kill, tell how the
//! worker ended. Everything above (the registry, host calls, output) is the transport's
//! business nowhere: see [`crate::worker`].

use crate::KernelError;
use crate::config::WorkerSettings;
use crate::sandbox::Layer;
use async_trait::async_trait;
use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};
use tokio::sync::watch;

/// Starts workers.
#[async_trait]
pub(crate) trait Transport: Send + Sync + 'static {
    /// The settings the runtime applies to this transport's workers.
    fn settings(&self) -> &WorkerSettings;
    /// Starts a worker (not yet handed the sources: [`crate::worker::Worker::handshake`] does).
    async fn start(&self) -> Result<Started, KernelError>;
    /// Whether a spare worker can be kept: not when the worker is one given kernel.
    fn keeps_spares(&self) -> bool {
        true
    }
    /// The interpreter a local worker runs, when the host chooses it.
    fn python(&self) -> Option<&Path> {
        None
    }
    /// Whether its workers can be copied (forked, checkpointed): local processes can.
    fn copies_workers(&self) -> bool {
        false
    }
}

/// A worker started, before its handshake.
pub(crate) struct Started {
    /// What acts on the worker beyond its frames.
    pub(crate) link: Box<dyn Link>,
    /// The host's end of the socket the frames travel on.
    pub(crate) socket: UnixStream,
    /// Becomes true once the worker has ended (exited, or its link to the server ended).
    pub(crate) ended: watch::Receiver<bool>,
    /// What the worker is, for messages ("/usr/bin/python3", "the Jupyter kernel at …").
    pub(crate) what: String,
    /// The worker has its sources already (a branch, forked from a worker): the handshake
    /// only waits for its `ready`.
    pub(crate) has_sources: bool,
    /// The worker's code compiled by its interpreter, sent beside the sources when known.
    pub(crate) precompiled: Option<std::sync::Arc<crate::bytecode::Precompiled>>,
}

/// Acts on one started worker beyond its frames.
#[async_trait]
pub(crate) trait Link: Send + Sync + 'static {
    /// What the worker has used of the machine, read now: its control group's figures, else
    /// its process's. `None` where the host cannot see it (a kernel behind a server).
    fn resource_usage(&self) -> Option<cave_core::ResourceUsage> {
        None
    }
    /// The id of the local process serving, when the worker is one.
    fn pid(&self) -> Option<u32> {
        None
    }
    /// Asks the running cell to stop (`KeyboardInterrupt` in the worker). Callable from any
    /// thread, with or without an async runtime.
    fn interrupt(&self);
    /// Ends the worker now, whatever it runs.
    fn kill(&self);
    /// Bytes the worker sent that are on their way to the host's socket, not in it yet (held
    /// by a bridge in between).
    fn in_transit(&self) -> u64 {
        0
    }
    /// Whether the worker is let go gracefully (not killed) when its runtime is gone: a kernel
    /// the runtime attached to, idle, keeps its namespace.
    fn let_go_on_release(&self, _executing: bool) -> bool {
        false
    }
    /// Before the worker is asked to stop: ends what its cells detached (while the worker is
    /// still their ancestor).
    fn before_stop(&self) {}
    /// After the worker stopped or was killed: ends whatever is left of it.
    fn after_stop(&self);
    /// How the worker ended when the host did not end it: its exit status and last words, the
    /// reason its server gave. Waits until it has ended.
    async fn describe_end(&self) -> String;
    /// Why a worker that never became ready did not: ` (exited with status 78): what it said`.
    /// Waits until it has ended.
    async fn describe_failed_start(&self) -> String {
        format!(": {}", self.describe_end().await)
    }
    /// Output the worker had written and not sent when it ended, with its execution's id.
    fn unsent(&self) -> Option<(u64, String)> {
        None
    }
    /// A directory the host can write and the worker read at the same path (a local child's
    /// work directory); `None` for a worker elsewhere.
    fn shared_dir(&self) -> Option<&std::path::Path> {
        None
    }
    /// The paused copies of a worker that can be forked; `None` where it cannot.
    fn copies(&self) -> Option<&Copies> {
        None
    }
    /// How each limit is enforced.
    fn enforcement(&self) -> Vec<String> {
        Vec::new()
    }
    /// The limits in force, when the host sets them.
    fn limits(&self) -> Option<crate::Limits> {
        None
    }
    /// How each sandbox layer stands, when the host applies them.
    fn sandbox(&self) -> Vec<Layer> {
        Vec::new()
    }
    /// The connections through the host's egress proxy that ended since the last call (none
    /// where the host runs no proxy for the worker).
    async fn connections(&self) -> cave_core::Connections {
        cave_core::Connections::default()
    }
    /// Makes what a branch of this worker needs (its socket, control group, directory) and
    /// hands the worker its ends, ahead of the `fork` request; refused where the worker
    /// cannot be copied.
    fn prepare_branch(&self) -> Result<Box<dyn PreparedBranch>, KernelError> {
        Err(KernelError::Fork {
            message: "a kernel behind a Jupyter server cannot be forked: only a local child process can (KernelRuntime::new, with_config or from_pool)".to_owned(),
        })
    }
}

/// A branch of a worker, prepared: what its processes will hold is made, and the worker has
/// its ends, for the `fork` request that follows.
#[async_trait]
pub(crate) trait PreparedBranch: Send {
    /// The branch's own directory and its parent's, whose files it copies (when it has one).
    fn dir(&self) -> Option<(&Path, &Path)>;
    /// Starts the branch whose first process the worker forked as `keeper`: returns it as a
    /// started worker (its `ready` still to come) and the transport of its later fresh
    /// processes.
    async fn launch(
        self: Box<Self>,
        keeper: i32,
        start_timeout: std::time::Duration,
    ) -> Result<(Started, Box<dyn Transport>), KernelError>;
}

/// The process serving a worker that can fork paused copies of itself (checkpoints), and the
/// copy held for each checkpoint.
#[derive(Debug)]
pub(crate) struct Copies {
    /// The process serving now: the first one, or the copy a rollback handed over to.
    serving: AtomicI32,
    /// The pid of the paused copy of each checkpoint.
    held: Mutex<HashMap<u64, i32>>,
}

impl Copies {
    /// Copies of the worker whose first process is `pid`.
    pub(crate) fn new(pid: i32) -> Self {
        Self {
            serving: AtomicI32::new(pid),
            held: Mutex::new(HashMap::new()),
        }
    }
    /// `pid` serves from the start (a guard's child, not the process the host started).
    pub(crate) fn started(&self, pid: i32) {
        self.serving.store(pid, Ordering::SeqCst);
    }
    /// The process serving now.
    pub(crate) fn serving(&self) -> i32 {
        self.serving.load(Ordering::SeqCst)
    }
    /// Checkpoint `id` is held by the paused copy `pid`.
    pub(crate) fn hold(&self, id: u64, pid: i32) {
        cave_core::lock(&self.held).insert(id, pid);
    }
    /// The copy holding checkpoint `id`.
    pub(crate) fn holder(&self, id: u64) -> Option<i32> {
        cave_core::lock(&self.held).get(&id).copied()
    }
    /// Checkpoint `id` is no longer held; whether it was.
    pub(crate) fn release(&self, id: u64) -> bool {
        cave_core::lock(&self.held).remove(&id).is_some()
    }
    /// After a rollback to `id`: `copy` serves, `fresh` holds `id`, later checkpoints are gone.
    pub(crate) fn rolled_back(&self, id: u64, copy: i32, fresh: i32) {
        self.serving.store(copy, Ordering::SeqCst);
        let mut held = cave_core::lock(&self.held);
        held.retain(|&k, _| k <= id);
        held.insert(id, fresh);
    }
}

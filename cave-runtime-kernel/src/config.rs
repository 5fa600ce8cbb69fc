//! How a kernel runtime starts its child: which Python, its limits, its environment, its
//! sandbox. (A kernel behind a Jupyter server has its own settings, `JupyterConfig`, which
//! cannot name what its server decides.)

use crate::sandbox::Sandbox;
use cave_cell::CellLimits;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The default frame limit: one message (a value, a cell's source, a chunk of output) in
/// either direction.
pub const DEFAULT_MAX_FRAME: usize = 256 << 20;

/// Processes (and threads) a sandboxed child may have when no limit is set.
pub const DEFAULT_PROCESSES: u64 = 512;
/// Open files a child may have when no limit is set.
pub const DEFAULT_OPEN_FILES: u64 = 1024;
/// The largest file a child may write when no limit is set.
pub const DEFAULT_FILE_SIZE: u64 = 4 << 30;

/// Resource limits applied to the child. `None` leaves the host's own limit.
///
/// [`Limits::default`] is what a sandboxed child gets when none are set (the table in
/// docs/SANDBOX.md); [`Limits::unsandboxed`] what a child without a sandbox gets;
/// [`Limits::none`] sets nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Memory in bytes. Enforced by a control group of the child's own where the host can
    /// make one (cgroup v2 delegation, or writable v1 hierarchies, as for root): the kernel
    /// kills the child when it is exceeded, and the execution says "out of memory". Otherwise
    /// it is an address-space limit (`RLIMIT_AS`): allocations beyond it raise `MemoryError`.
    /// Default: half of the machine's memory (or of the host's own control group's limit,
    /// when lower).
    pub memory: Option<u64>,
    /// Address space in bytes (`RLIMIT_AS`): allocation beyond it raises `MemoryError` and
    /// the process lives on. Default: none.
    pub address_space: Option<u64>,
    /// CPU seconds over the child's life (`RLIMIT_CPU`): past it the child is killed.
    /// Default: none (`max_exec_timeout` bounds a cell).
    pub cpu_seconds: Option<u64>,
    /// Open files (`RLIMIT_NOFILE`). Default: [`DEFAULT_OPEN_FILES`].
    pub open_files: Option<u64>,
    /// Processes (and threads) the child may have. Enforced by its control group where the
    /// host can make one; otherwise `RLIMIT_NPROC`, which counts all of the user's processes
    /// and which the kernel does not apply to root. Default: [`DEFAULT_PROCESSES`].
    pub processes: Option<u64>,
    /// Largest file the child may write, in bytes (`RLIMIT_FSIZE`). Default:
    /// [`DEFAULT_FILE_SIZE`].
    pub file_size: Option<u64>,
}

impl Default for Limits {
    /// The limits of a sandboxed child when none are set: processes, memory, open files and
    /// file size. The memory and process defaults hold only through a control group: where
    /// the host cannot make one, the child runs without them (an rlimit would count every
    /// process of the user, and an address-space cap breaks programs that reserve more than
    /// they use), and `enforcement()` says so.
    fn default() -> Self {
        Self {
            memory: Some(crate::cgroup::host_memory() / 2),
            address_space: None,
            cpu_seconds: None,
            open_files: Some(DEFAULT_OPEN_FILES),
            processes: Some(DEFAULT_PROCESSES),
            file_size: Some(DEFAULT_FILE_SIZE),
        }
    }
}

impl Limits {
    /// No limits beyond the host's own.
    pub fn none() -> Self {
        Self {
            memory: None,
            address_space: None,
            cpu_seconds: None,
            open_files: None,
            processes: None,
            file_size: None,
        }
    }
    /// The limits of a child without a sandbox when none are set: open files and file size
    /// only.
    pub fn unsandboxed() -> Self {
        Self {
            open_files: Some(DEFAULT_OPEN_FILES),
            file_size: Some(DEFAULT_FILE_SIZE),
            ..Self::none()
        }
    }
    /// Sets the memory limit in bytes.
    pub fn memory(mut self, bytes: u64) -> Self {
        self.memory = Some(bytes);
        self
    }
    /// Sets the address-space limit in bytes.
    pub fn address_space(mut self, bytes: u64) -> Self {
        self.address_space = Some(bytes);
        self
    }
    /// Sets the CPU-seconds limit.
    pub fn cpu_seconds(mut self, seconds: u64) -> Self {
        self.cpu_seconds = Some(seconds);
        self
    }
    /// Sets the open-files limit.
    pub fn open_files(mut self, files: u64) -> Self {
        self.open_files = Some(files);
        self
    }
    /// Sets the process limit.
    pub fn processes(mut self, processes: u64) -> Self {
        self.processes = Some(processes);
        self
    }
    /// Sets the file-size limit in bytes.
    pub fn file_size(mut self, bytes: u64) -> Self {
        self.file_size = Some(bytes);
        self
    }
}

impl fmt::Display for Limits {
    /// `processes 512, memory 11.7 GiB, open files 1024, file size 4 GiB, CPU time none,
    /// address space none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let none = || "none".to_owned();
        write!(
            f,
            "processes {}, memory {}, open files {}, file size {}, CPU time {}, address space {}",
            self.processes.map_or_else(none, |n| n.to_string()),
            self.memory.map_or_else(none, cave_core::format_size),
            self.open_files.map_or_else(none, |n| n.to_string()),
            self.file_size.map_or_else(none, cave_core::format_size),
            self.cpu_seconds.map_or_else(none, |n| format!("{n} s")),
            self.address_space.map_or_else(none, cave_core::format_size),
        )
    }
}

/// How a kernel runtime treats its workers, whatever the transport: one set of settings that
/// [`KernelConfig`] and [`JupyterConfig`](crate::JupyterConfig) both hold (their builder
/// methods set it), with the bounds on each cell's output that every runtime shares
/// ([`CellLimits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerSettings {
    /// Keep one started worker ready, so that `reset` and recovery from a dead worker do not
    /// wait for a start. Default: on.
    pub spare: bool,
    /// How long an interrupted cell has to stop before its worker is ended. Default: 0.5 s
    /// for a child process, 5 s for a Jupyter kernel (the interrupt crosses a server).
    pub interrupt_grace: Duration,
    /// How long `stop` waits for the worker to exit before ending it. Default: 1 s.
    pub stop_grace: Duration,
    /// How long a started worker has to say it is ready before it is ended and the start
    /// fails. Default: [`DEFAULT_START_TIMEOUT`].
    pub start_timeout: Duration,
    /// The largest frame either side may send. Default: [`DEFAULT_MAX_FRAME`].
    pub max_frame: usize,
    /// The bounds on each cell's output. Default: [`CellLimits::default`].
    pub cell: CellLimits,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            spare: true,
            interrupt_grace: Duration::from_millis(500),
            stop_grace: Duration::from_secs(1),
            start_timeout: DEFAULT_START_TIMEOUT,
            max_frame: DEFAULT_MAX_FRAME,
            cell: CellLimits::default(),
        }
    }
}

/// How long a started worker has to say it is ready, by default: a cold interpreter takes
/// under a second, the bootstrap in a kernel on a busy Jupyter server tens of seconds.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(120);

/// Code run in the child between `fork` and `exec` (after the runtime's own set-up): the seam
/// for sandbox layers. It must only make async-signal-safe calls.
pub type PreExec = Arc<dyn Fn() -> std::io::Result<()> + Send + Sync>;

/// Settings of a [`KernelRuntime`](crate::KernelRuntime).
#[derive(Clone)]
#[non_exhaustive]
pub struct KernelConfig {
    /// The interpreter to run; `None` finds one as the in-process runtime does (`CAVE_PYTHON`,
    /// `VIRTUAL_ENV`, `python3` on `PATH`). Any Python 3.9 or later.
    pub python: Option<PathBuf>,
    /// How the runtime treats its child (spare, graces, start timeout, frame size) and the
    /// bounds on each cell's output; the builder methods below set it. A cell's whole output
    /// is written to a file in the child's work directory past what the host holds, and is
    /// never kept above the file-size limit in force.
    pub worker: WorkerSettings,
    /// Resource limits for the child; `None`: [`Limits::default`] under a sandbox,
    /// [`Limits::unsandboxed`] without one ([`limits_in_force`](Self::limits_in_force)).
    pub limits: Option<Limits>,
    /// Variables added to the child's environment (after the allow-list).
    pub env: Vec<(String, String)>,
    /// The child's working directory; `None` is the host's, or with a sandbox a fresh
    /// directory made for the runtime (removed with it).
    pub working_dir: Option<PathBuf>,
    /// The sandbox layers the child runs under; `None`: [`Sandbox::strict`], every layer this
    /// machine supports ([`sandbox_in_force`](Self::sandbox_in_force)). [`Sandbox::off`] is
    /// the explicit way out.
    pub sandbox: Option<Sandbox>,
    /// Put the child in a control group of its own where the host can make one: it holds every
    /// process the child starts (detached ones included) and ends them with it, also when the
    /// host is killed, and it enforces the memory and process limits. Off: memory and process
    /// limits fall back to rlimits, and what a cell detaches ends only on the ends the host
    /// drives (see docs/SANDBOX.md). Default: on.
    pub control_group: bool,
    /// Where the worker's own code is kept compiled by each interpreter, so that a worker
    /// does not compile it at every start (about 17 ms of each); `None`: compiled every time.
    /// Default: `$XDG_CACHE_HOME/cave-agent/worker-code`, else `~/.cache/cave-agent/worker-code`.
    /// Written by the host only, and read only if the user alone can write it.
    pub bytecode_cache: Option<PathBuf>,
    pub(crate) pre_exec: Option<PreExec>,
    /// Told of every connection through the egress proxy (`Sandbox::allow_net`), besides the
    /// log: an audit trail.
    pub(crate) egress_observer: Option<Arc<dyn cave_egress::EgressObserver>>,
}

impl Default for KernelConfig {
    fn default() -> Self {
        Self {
            python: None,
            worker: WorkerSettings::default(),
            limits: None,
            env: Vec::new(),
            working_dir: None,
            sandbox: None,
            control_group: true,
            bytecode_cache: crate::bytecode::default_dir(),
            pre_exec: None,
            egress_observer: None,
        }
    }
}

impl KernelConfig {
    /// The defaults: the strict sandbox and the default limits.
    pub fn new() -> Self {
        Self::default()
    }
    /// Runs this interpreter.
    pub fn python(mut self, path: impl Into<PathBuf>) -> Self {
        self.python = Some(path.into());
        self
    }
    /// Turns the spare process on or off.
    pub fn spare(mut self, spare: bool) -> Self {
        self.worker.spare = spare;
        self
    }
    /// Sets the grace an interrupted cell gets before its process is killed.
    pub fn interrupt_grace(mut self, grace: Duration) -> Self {
        self.worker.interrupt_grace = grace;
        self
    }
    /// Sets how long `stop` waits for the child to exit before killing it.
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.worker.stop_grace = grace;
        self
    }
    /// What the runtime applies to every worker: [`worker`](Self::worker), a cell's whole
    /// output never kept above the file-size limit in force.
    pub(crate) fn settings(&self) -> WorkerSettings {
        let mut settings = self.worker;
        settings.cell.max_cell_output = settings
            .cell
            .max_cell_output
            .min(self.limits_in_force().file_size.unwrap_or(u64::MAX));
        settings
    }
    /// Sets how long a started child has to say it is ready.
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.worker.start_timeout = timeout;
        self
    }
    /// Sets the frame limit in bytes.
    pub fn max_frame(mut self, bytes: usize) -> Self {
        self.worker.max_frame = bytes;
        self
    }
    /// Sets the bounds on each cell's output (default: [`CellLimits::default`]); what is kept
    /// whole is written in the child's work directory, never above the file-size limit.
    pub fn cell_limits(mut self, limits: CellLimits) -> Self {
        self.worker.cell = limits;
        self
    }
    /// Sets the limits.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = Some(limits);
        self
    }
    /// Adds a variable to the child's environment.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }
    /// Sets the child's working directory.
    pub fn working_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.working_dir = Some(dir.into());
        self
    }
    /// Runs the child under these sandbox layers ([`Sandbox::off`] for none).
    pub fn sandbox(mut self, sandbox: Sandbox) -> Self {
        self.sandbox = Some(sandbox);
        self
    }
    /// Turns the child's control group on (the default, where the host can make one) or off.
    pub fn control_group(mut self, on: bool) -> Self {
        self.control_group = on;
        self
    }

    /// Where the worker's compiled code is kept (`None`: compiled at every start); see
    /// [`KernelConfig::bytecode_cache`](struct.KernelConfig.html#structfield.bytecode_cache).
    pub fn bytecode_cache(mut self, dir: Option<PathBuf>) -> Self {
        self.bytecode_cache = dir;
        self
    }

    /// The sandbox the child runs under: the one set, or [`Sandbox::strict`].
    pub fn sandbox_in_force(&self) -> Sandbox {
        self.sandbox.clone().unwrap_or_else(Sandbox::strict)
    }

    /// The limits the child gets: the ones set, or else the defaults for its sandbox
    /// ([`Limits::default`] under one, [`Limits::unsandboxed`] without). The memory and process
    /// defaults need a control group: without one here (or with
    /// [`control_group`](Self::control_group) off) they are left out.
    pub fn limits_in_force(&self) -> Limits {
        if let Some(limits) = &self.limits {
            return limits.clone();
        }
        if self.sandbox_in_force().is_off() {
            return Limits::unsandboxed();
        }
        let mut limits = Limits::default();
        if !self.control_group || !crate::cgroup::available() {
            limits.memory = None;
            limits.processes = None;
        }
        limits
    }

    /// Adds code to run in the child between `fork` and `exec`: after it joined its process
    /// group and control group, before the sandbox's layers and the resource limits.
    ///
    /// # Safety
    /// `hook` runs in a forked copy of this process where only async-signal-safe calls are
    /// sound (no allocation, no locks): the contract of
    /// [`CommandExt::pre_exec`](std::os::unix::process::CommandExt::pre_exec).
    pub unsafe fn pre_exec(mut self, hook: PreExec) -> Self {
        self.pre_exec = Some(hook);
        self
    }

    /// Tells `observer` of every connection the egress proxy lets through or refuses (host,
    /// port, bytes each way, why refused), with `Sandbox::allow_net`: the CLI's `--audit`.
    pub fn egress_observer(mut self, observer: Arc<dyn cave_egress::EgressObserver>) -> Self {
        self.egress_observer = Some(observer);
        self
    }
}

impl fmt::Debug for KernelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelConfig")
            .field("python", &self.python)
            .field("worker", &self.worker)
            .field("limits", &self.limits)
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("working_dir", &self.working_dir)
            .field("sandbox", &self.sandbox)
            .field("control_group", &self.control_group)
            .field("bytecode_cache", &self.bytecode_cache)
            .field("pre_exec", &self.pre_exec.is_some())
            .field("egress_observer", &self.egress_observer.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child's interrupt grace is 0.5 s unless set.
    #[test]
    fn the_interrupt_grace_is_half_a_second_unless_set() {
        assert_eq!(
            KernelConfig::new().settings().interrupt_grace,
            Duration::from_millis(500)
        );
        let set = KernelConfig::new().interrupt_grace(Duration::from_secs(2));
        assert_eq!(set.settings().interrupt_grace, Duration::from_secs(2));
    }

    /// A cell's whole output is never kept above the file-size limit the child has.
    #[test]
    fn the_whole_output_is_kept_within_the_file_size_limit() {
        let defaults = KernelConfig::new().sandbox(Sandbox::off());
        assert_eq!(defaults.settings().cell, CellLimits::default());
        let limited = KernelConfig::new().limits(Limits {
            file_size: Some(1000),
            ..Limits::unsandboxed()
        });
        assert_eq!(limited.settings().cell.max_cell_output, 1000);
        assert_eq!(
            limited.worker.cell.max_cell_output,
            cave_cell::DEFAULT_MAX_CELL_OUTPUT,
            "the setting itself is kept"
        );
    }
}

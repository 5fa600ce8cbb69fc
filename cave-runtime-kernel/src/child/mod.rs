//! The child-process transport: the worker in an interpreter this host starts, under its
//! limits, control group and sandbox, reached on a socket pair.

mod branch;
mod egress;
mod end;
mod spawn;

use branch::Branch;

use crate::KernelError;
use crate::cgroup::ChildGroup;
use crate::config::KernelConfig;
use crate::config::WorkerSettings;
use crate::link::{Copies, Link, Started, Transport};
use crate::sandbox::{Layer, WorkDir};
use async_trait::async_trait;
use end::{LastWords, Shadow, describe_status, last_words_for_the_model};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use tokio::sync::watch;

/// The interpreter to start and the directories it reads.
#[derive(Clone, Debug)]
pub(crate) struct Interpreter {
    /// The real executable.
    pub(crate) executable: PathBuf,
    /// `sys.prefix` and `sys.path`, for the sandbox's read-only rules.
    pub(crate) dirs: Vec<PathBuf>,
}

/// Starts workers as children of this process.
pub(crate) struct ChildTransport {
    config: Arc<KernelConfig>,
    settings: WorkerSettings,
    python: PathBuf,
    /// The interpreter behind `python` (a pyenv shim alone doubles the start), found once.
    resolved: tokio::sync::OnceCell<Interpreter>,
    /// The child's directory when the sandbox is on and none was given: made for this
    /// transport (or for the branch it restarts), removed once neither it nor a child uses it.
    work_dir: Option<Arc<WorkDir>>,
    /// Each worker gets a directory of its own instead (a pool's workers serve different
    /// sessions), removed with it.
    dir_per_worker: bool,
    /// The proxy the workers reach their allowlisted hosts through (one per transport: the
    /// session's downloads are counted together, across restarts).
    egress: Option<cave_egress::EgressProxy>,
}

impl ChildTransport {
    /// A transport with these settings: finds the interpreter, and makes the sandbox's work
    /// directory when one is needed.
    pub(crate) fn new(config: KernelConfig) -> Result<Self, KernelError> {
        let python = match &config.python {
            Some(path) => path.clone(),
            None => cave_python::find_interpreter()
                .map(|i| i.executable)
                .ok_or(KernelError::NoPython)?,
        };
        let work_dir = if config.sandbox_in_force().is_off() || config.working_dir.is_some() {
            None
        } else {
            Some(Arc::new(WorkDir::create().map_err(|e| {
                KernelError::Start {
                    message: format!("could not create the sandbox's work directory: {e}"),
                }
            })?))
        };
        Ok(Self {
            settings: config.settings(),
            egress: egress::proxy_for(&config),
            config: Arc::new(config),
            python,
            resolved: tokio::sync::OnceCell::new(),
            work_dir,
            dir_per_worker: false,
        })
    }

    /// A transport whose workers each get a work directory of their own (when the sandbox
    /// wants one): for a pool, whose workers serve different sessions.
    pub(crate) fn per_worker(config: KernelConfig) -> Result<Self, KernelError> {
        let mut transport = Self::new(config)?;
        transport.work_dir = None;
        transport.dir_per_worker =
            !transport.config.sandbox_in_force().is_off() && transport.config.working_dir.is_none();
        Ok(transport)
    }

    /// The transport that starts a branch's fresh process (after a crash or a reset): the
    /// parent's settings and interpreter, in the branch's own directory, with no spare (a
    /// spare per branch would be a cold process per branch).
    fn for_branch(
        config: Arc<KernelConfig>,
        interpreter: Interpreter,
        work_dir: Option<Arc<WorkDir>>,
    ) -> Self {
        let mut settings = config.settings();
        settings.spare = false;
        Self {
            settings,
            egress: egress::proxy_for(&config),
            python: config
                .python
                .clone()
                .unwrap_or_else(|| interpreter.executable.clone()),
            config,
            resolved: tokio::sync::OnceCell::new_with(Some(interpreter)),
            work_dir,
            dir_per_worker: false,
        }
    }

    /// The program to start: what the interpreter says `sys.executable` is (cached on disk,
    /// see `cave_python::report`), or the path as given when it cannot say; with the
    /// directories it reads (`sys.prefix`, `sys.path`), for the sandbox.
    async fn interpreter(&self) -> &Interpreter {
        self.resolved
            .get_or_init(|| async {
                let asked = self.python.clone();
                let reported =
                    tokio::task::spawn_blocking(move || cave_python::report::describe(&asked))
                        .await
                        .ok()
                        .and_then(Result::ok);
                match reported {
                    Some(r) if r.executable.is_file() => Interpreter {
                        dirs: std::iter::once(r.prefix.clone())
                            .chain(r.sys_path.iter().cloned())
                            .filter(|p| !p.is_empty())
                            .map(PathBuf::from)
                            .collect(),
                        executable: r.executable,
                    },
                    _ => Interpreter {
                        executable: self.python.clone(),
                        dirs: Vec::new(),
                    },
                }
            })
            .await
    }

    /// The child's directory: the configured one, or the sandbox's.
    fn work_dir(&self) -> Option<PathBuf> {
        self.config
            .working_dir
            .clone()
            .or_else(|| self.work_dir.as_ref().map(|w| w.path().to_owned()))
    }
}

#[async_trait]
impl Transport for ChildTransport {
    fn settings(&self) -> &WorkerSettings {
        &self.settings
    }

    async fn start(&self) -> Result<Started, KernelError> {
        let interpreter = self.interpreter().await;
        let own = if self.dir_per_worker {
            Some(Arc::new(WorkDir::create().map_err(|e| {
                KernelError::Start {
                    message: format!("could not create the sandbox's work directory: {e}"),
                }
            })?))
        } else {
            self.work_dir.clone()
        };
        let dir = own
            .as_ref()
            .map(|w| w.path().to_owned())
            .or_else(|| self.work_dir());
        spawn::spawn(&self.config, interpreter, dir, own, self.egress.as_ref()).await
    }

    fn python(&self) -> Option<&Path> {
        Some(&self.python)
    }

    fn copies_workers(&self) -> bool {
        true
    }
}

/// A started child, its process group and control group.
struct ChildLink {
    /// The process serving (the child, or the copy a rollback handed over to), and the copies.
    copies: Copies,
    /// The child's process group, which its copies share.
    pgid: i32,
    /// The child's control group, when the host could make one.
    group: Option<Arc<ChildGroup>>,
    /// `Some` once the child has exited, with its status when it could be read.
    exit: watch::Receiver<Option<Option<ExitStatus>>>,
    last_words: Arc<LastWords>,
    /// Output the child buffered and had not sent when it died.
    shadow: Shadow,
    enforcement: Vec<String>,
    limits: crate::Limits,
    sandbox: Vec<Layer>,
    /// Where the host writes what the child reads (a cell's whole output).
    spool_dir: PathBuf,
    /// The child's own work directory (not one the configuration names, nor the host's):
    /// what a branch's directory is copied from; removed once unused.
    own_dir: Option<Arc<WorkDir>>,
    /// The host's end of the socket on which a branch's descriptors are handed to the child.
    handover: std::os::unix::net::UnixStream,
    /// What started the child, for a branch's fresh processes.
    config: Arc<KernelConfig>,
    interpreter: Interpreter,
    /// The egress proxy serving the child's namespace (shared with its branches, which live in
    /// the same namespace).
    proxy: Option<Arc<egress::ProxyTask>>,
}

impl ChildLink {
    async fn status(&self) -> Option<ExitStatus> {
        let mut exit = self.exit.clone();
        let status = exit.wait_for(Option::is_some).await.ok()?;
        status.flatten()
    }
}

#[async_trait]
impl Link for ChildLink {
    fn pid(&self) -> Option<u32> {
        Some(self.copies.serving() as u32)
    }

    fn resource_usage(&self) -> Option<cave_core::ResourceUsage> {
        let serving = self.copies.serving();
        if let Some(group) = &self.group
            && let Some(cpu) = group.cpu_seconds()
        {
            let peak = group.peak_memory().or_else(|| process_peak_memory(serving));
            return Some(cave_core::ResourceUsage::new(cpu, peak));
        }
        let cpu = process_cpu_seconds(serving)?;
        Some(cave_core::ResourceUsage::new(
            cpu,
            process_peak_memory(serving),
        ))
    }

    fn shared_dir(&self) -> Option<&Path> {
        Some(&self.spool_dir)
    }

    async fn connections(&self) -> cave_core::Connections {
        match &self.proxy {
            Some(proxy) => proxy.connections().await,
            None => cave_core::Connections::default(),
        }
    }

    fn interrupt(&self) {
        // SAFETY: kill with a pid this runtime started; a stale pid is reaped only by our
        // waiter thread, after which the worker is not alive and this is not called.
        unsafe {
            libc::kill(self.copies.serving(), libc::SIGINT);
        }
    }

    fn kill(&self) {
        if self.exit.borrow().is_none() {
            // While the first worker lives, what cells detached is its descendant (after a
            // rollback the first worker is the reaper, the serving copy one of its descendants).
            crate::containment::kill_descendants(self.pgid, None);
            // SAFETY: signals to our child's process group and to the child itself.
            unsafe {
                libc::kill(-self.pgid, libc::SIGKILL);
                libc::kill(self.copies.serving(), libc::SIGKILL);
            }
        }
        if let Some(group) = &self.group {
            group.kill_all();
        }
    }

    fn before_stop(&self) {
        // While the first worker is still the ancestor of what cells detached (once it exits,
        // those are orphaned beyond its reach); the serving process is kept, to be asked to
        // exit.
        crate::containment::kill_descendants(self.pgid, Some(self.copies.serving()));
    }

    fn after_stop(&self) {
        // The group may still hold what a cell started.
        if let Some(group) = &self.group {
            group.kill_all();
        }
        // SAFETY: signals to our child's process group.
        unsafe {
            libc::kill(-self.pgid, libc::SIGKILL);
        }
    }

    async fn describe_end(&self) -> String {
        let status = self.status().await;
        if self.group.as_ref().is_some_and(|g| g.oom_kills() > 0) {
            return "the Python process was killed: out of memory (it reached its memory limit)"
                .to_owned();
        }
        let mut text = format!("the Python process {}", describe_status(status));
        let words = last_words_for_the_model(&self.last_words.to_the_end().await);
        if !words.is_empty() {
            text.push_str(&format!("; Python said:\n{words}"));
        }
        text
    }

    async fn describe_failed_start(&self) -> String {
        let status = self.status().await;
        let words = self.last_words.to_the_end().await;
        let said = if words.is_empty() {
            String::new()
        } else {
            format!(": {words}")
        };
        format!(" ({}){said}", describe_status(status))
    }

    fn unsent(&self) -> Option<(u64, String)> {
        self.shadow.unsent()
    }

    fn copies(&self) -> Option<&Copies> {
        Some(&self.copies)
    }

    fn enforcement(&self) -> Vec<String> {
        self.enforcement.clone()
    }

    fn limits(&self) -> Option<crate::Limits> {
        Some(self.limits.clone())
    }

    fn sandbox(&self) -> Vec<Layer> {
        self.sandbox.clone()
    }

    fn prepare_branch(&self) -> Result<Box<dyn crate::link::PreparedBranch>, KernelError> {
        Ok(Box::new(Branch::prepare(self)?))
    }
}

/// Processor time of process `pid` and of the children it has waited for, in seconds, from
/// `/proc/PID/stat` (where there is no control group to ask).
fn process_cpu_seconds(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name, in parentheses, may hold spaces and parentheses: the fields follow the last.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    // utime, stime, cutime, cstime: fields 14 to 17, the 12th to 15th after the name.
    let ticks: u64 = fields
        .get(11..15)?
        .iter()
        .map(|f| f.parse::<u64>().unwrap_or(0))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| ticks as f64 / per_second as f64)
}

/// The most resident memory process `pid` has held, in bytes (`VmHWM`).
fn process_peak_memory(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib.saturating_mul(1024))
}

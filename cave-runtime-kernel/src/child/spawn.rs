//! Starting a child interpreter: its command, limits, control group and sandbox.

use super::ChildLink;
use super::end::{LastWords, SHADOW_SIZE, Shadow};
use crate::KernelError;
use crate::cgroup::ChildGroup;
use crate::config::KernelConfig;
use crate::link::{Copies, Started};
use cave_python::MIN_PYTHON;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use tokio::sync::watch;

/// The descriptor the child finds its socket on.
const CHILD_FD: i32 = 3;
/// The descriptor of the output shadow: a memory file where the child keeps a copy of the
/// output it has not sent yet, read by the host if the child dies (see `Shadow`).
const SHADOW_FD: i32 = 4;
/// The descriptor of the hand-over socket, on which the host passes a branch's descriptors.
const HANDOVER_FD: i32 = 5;

/// Refuses an interpreter the worker does not support (argv 6: the oldest version, argv 7:
/// why free-threaded builds are refused), reads the sources frame, loads the executor and the
/// worker as modules (from the code compiled beside a source when its bytecode is this
/// interpreter's, `bytecode.rs`), and serves (argv 9: where it tells its guard who serves,
/// -1: no guard).
/// Written in syntax any Python 3 parses, so that an old one hears why it is refused.
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
magic = getattr(sys.modules.get('_frozen_importlib_external'), 'MAGIC_NUMBER', None)
for entry in marshal.loads(read(int.from_bytes(read(4), 'big'))):
    name, filename, source = entry[0], entry[1], entry[2]
    code = None
    # Compiled by this interpreter (the host's cache), if its bytecode is this one's.
    if len(entry) > 3 and magic is not None and entry[3][0] == magic:
        try:
            code = marshal.loads(entry[3][1])
        except Exception:
            code = None
    module = types.ModuleType(name)
    module.__file__ = filename
    module.__cave_precompiled__ = code is not None
    sys.modules[name] = module
    exec(code if code is not None else compile(source, filename, 'exec'), module.__dict__)
sys.modules['cave_kernel'].main(fd, int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[8]), int(sys.argv[9]))
";
/// Tells the worker where, under its work directory, the session's environment is, which
/// `pip install` installs into (set with an egress allowlist).
const PACKAGES_VARIABLE: &str = "CAVE_PACKAGES";

/// The session's environment, under the work directory.
pub(crate) const PACKAGES_DIR: &str = ".cave-packages";

/// Starts `interpreter` as a child with `config`'s limits and sandbox, in `work_dir`
/// (`own_dir`, when given, is that directory, removed when the child's link goes).
pub(super) async fn spawn(
    config: &KernelConfig,
    interpreter: &super::Interpreter,
    work_dir: Option<PathBuf>,
    own_dir: Option<Arc<crate::sandbox::WorkDir>>,
    egress: Option<&cave_egress::EgressProxy>,
) -> Result<Started, KernelError> {
    let python = interpreter.executable.as_path();
    let (host, child) = std::os::unix::net::UnixStream::pair().map_err(setup)?;
    let child: OwnedFd = child.into();
    let (handover, handover_child) = std::os::unix::net::UnixStream::pair().map_err(setup)?;
    let handover_child: OwnedFd = handover_child.into();
    let shadow = Shadow::create().map_err(setup)?;
    let mut limits = config.limits_in_force();
    let group = control_group(config, &mut limits);
    let members = group.as_deref().map(ChildGroup::members);
    // Without a control group, the process started here stays outside as the worker's guard.
    let guarded = group.is_none();
    let sandbox = config.sandbox_in_force();
    // How the child reaches the egress proxy, if the machine gives it a way.
    let (route, host_listener) = match egress {
        Some(_) => crate::sandbox::ProxyRoute::open(&sandbox)
            .map_err(|e| KernelError::Start {
                message: format!("the egress proxy could not listen on the host's loopback: {e}"),
            })?
            .map_or((None, None), |(route, listener)| (Some(route), listener)),
        None => (None, None),
    };
    let mut command = command(
        config,
        python,
        members.as_deref(),
        work_dir.as_deref(),
        route,
        guarded,
    );
    // Where a cell's whole output is written for the child to read: its work directory (the
    // only one a sandboxed child may read besides its interpreter's), else a temporary one.
    let spool_dir = match &work_dir {
        Some(dir) => dir.clone(),
        None if sandbox.is_off() => std::env::temp_dir(),
        None => std::env::current_dir().unwrap_or_default(),
    };
    let sandbox = (!sandbox.is_off()).then(|| {
        let dir = work_dir
            .clone()
            .unwrap_or_else(|| std::env::current_dir().unwrap_or_default());
        // The keeper reads who is in the group.
        let mut sandbox = sandbox;
        if let Some(members) = &members {
            sandbox = sandbox.readable(members);
        }
        // With a way out: the certificates TLS clients trust, and pip's configuration.
        if route.is_some() {
            for path in crate::sandbox::CERTIFICATES
                .iter()
                .map(PathBuf::from)
                .chain(crate::environment::pip_readable())
            {
                sandbox = sandbox.readable(path);
            }
        }
        crate::sandbox::Prepared::new(
            &sandbox,
            python,
            &interpreter.dirs,
            &dir,
            HANDOVER_FD,
            route,
        )
    });
    let handed_over = sandbox.as_ref().is_some_and(|s| s.sends_proxy_listener());
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
    let setup_in_child = ChildSetup {
        parent: std::process::id() as libc::pid_t,
        joins: group.as_deref().map(ChildGroup::procs).unwrap_or_default(),
        socket: child.as_raw_fd(),
        shadow: shadow.fd.as_raw_fd(),
        handover: handover_child.as_raw_fd(),
        rlimits: rlimits(&limits, group.as_deref(), &mut enforcement),
        hook: config.pre_exec.clone(),
        sandbox,
        guarded,
    };
    // SAFETY: `ChildSetup::run` makes only async-signal-safe calls on values prepared here,
    // before the fork; the user's hook carries the same contract (`KernelConfig::pre_exec` is
    // unsafe).
    unsafe {
        command.pre_exec(move || setup_in_child.run());
    }
    let (pid, stderr, exit, ended) =
        launch(command, [child, handover_child], group.clone(), python).await?;
    let last_words = Arc::new(LastWords::default());
    if let Some(stderr) = stderr {
        last_words.clone().keep(stderr.into());
    }
    // The child made its proxy's listener before `exec` (or failed its start): it is waiting.
    let proxy = match (egress, host_listener) {
        (Some(proxy), _) if handed_over => Some(Arc::new(
            super::egress::serve_child_listener(&handover, proxy, config.worker.start_timeout)
                .await?,
        )),
        (Some(proxy), Some(listener)) => Some(Arc::new(super::egress::serve(listener, proxy)?)),
        _ => None,
    };
    let link = ChildLink {
        copies: Copies::new(pid),
        pgid: pid,
        group,
        exit,
        last_words,
        shadow,
        enforcement,
        limits,
        sandbox: layers,
        spool_dir,
        own_dir,
        handover,
        config: Arc::new(config.clone()),
        interpreter: interpreter.clone(),
        proxy,
    };
    // Read (or on a machine's first start, compiled) while the child starts its interpreter.
    let precompiled = match config.bytecode_cache.clone() {
        Some(dir) => {
            let python = python.to_path_buf();
            tokio::task::spawn_blocking(move || crate::bytecode::precompiled(&dir, &python))
                .await
                .ok()
                .flatten()
        }
        None => None,
    };
    Ok(Started {
        link: Box::new(link),
        socket: host,
        ended,
        what: python.display().to_string(),
        has_sources: false,
        precompiled,
    })
}

/// The child's control group, made whether or not a limit asks for one (it holds every process
/// the child starts), when `config` wants one and the host can make it. Default limits the
/// host cannot delegate are dropped from `limits` rather than the group.
fn control_group(config: &KernelConfig, limits: &mut crate::Limits) -> Option<Arc<ChildGroup>> {
    if !config.control_group {
        return None;
    }
    let wanted = crate::cgroup::Wanted {
        memory: limits.memory,
        processes: limits.processes,
    };
    match ChildGroup::create(wanted) {
        Ok(group) => Some(Arc::new(group)),
        Err(why) if config.limits.is_none() => {
            // The defaults are not worth losing the group for (a host that delegates `pids`
            // but not `memory`): without them, then.
            tracing::info!(%why, "no control group with the default limits");
            limits.memory = None;
            limits.processes = None;
            ChildGroup::create(crate::cgroup::Wanted::default())
                .map(Arc::new)
                .map_err(|why| tracing::info!(%why, "no control group for the kernel child"))
                .ok()
        }
        Err(why) => {
            tracing::info!(%why, "no control group for the kernel child; rlimits only");
            None
        }
    }
}

/// The command that runs the bootstrap: its arguments, the allow-listed environment, no stdin
/// or stdout, stderr kept for the last words.
fn command(
    config: &KernelConfig,
    python: &Path,
    members: Option<&Path>,
    work_dir: Option<&Path>,
    route: Option<crate::sandbox::ProxyRoute>,
    guarded: bool,
) -> Command {
    let mut command = Command::new(python);
    command
        .arg("-c")
        .arg(BOOTSTRAP)
        .arg(CHILD_FD.to_string())
        .arg(config.worker.max_frame.to_string())
        .arg(SHADOW_FD.to_string())
        .arg(SHADOW_SIZE.to_string())
        .arg(members.unwrap_or(Path::new("-")))
        .arg(format!("{}.{}", MIN_PYTHON.0, MIN_PYTHON.1))
        .arg(cave_python::FREE_THREADED_REFUSAL)
        .arg(HANDOVER_FD.to_string())
        .arg(
            if guarded {
                crate::guard::ANNOUNCE_FD
            } else {
                -1
            }
            .to_string(),
        )
        .env_clear()
        .envs(crate::environment::inherited())
        .envs(config.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(dir) = work_dir {
        command.current_dir(dir);
    }
    if let Some(route) = route {
        let url = route.url();
        // What pip, requests, httpx and urllib follow (lower case for curl and wget).
        for variable in [
            "HTTPS_PROXY",
            "HTTP_PROXY",
            "ALL_PROXY",
            "https_proxy",
            "http_proxy",
            "all_proxy",
        ] {
            command.env(variable, &url);
        }
        command.env_remove("NO_PROXY").env_remove("no_proxy");
        // `pip install` in a cell installs into the session's environment (the worker puts it
        // on `sys.path`), from the index the host's pip uses.
        // The configuration's own settings win.
        command.env(PACKAGES_VARIABLE, PACKAGES_DIR).envs(
            crate::environment::pip_variables()
                .into_iter()
                .filter(|(name, _)| !config.env.iter().any(|(set, _)| name == set.as_str())),
        );
    }
    command
}

/// What the child does between `fork` and `exec`, all prepared before the fork.
struct ChildSetup {
    /// The host's pid: a child whose parent is already gone exits.
    parent: libc::pid_t,
    /// The control group's `cgroup.procs` files to join.
    joins: Vec<std::ffi::CString>,
    /// The child's end of the socket pair, moved to `CHILD_FD`.
    socket: i32,
    /// The output shadow, moved to `SHADOW_FD`.
    shadow: i32,
    /// The child's end of the hand-over socket, moved to `HANDOVER_FD`.
    handover: i32,
    rlimits: Vec<(libc::__rlimit_resource_t, libc::rlim_t)>,
    hook: Option<crate::PreExec>,
    sandbox: Option<crate::sandbox::Prepared>,
    /// No control group holds the child: the process the host starts stays outside as the
    /// worker's guard (`guard.rs`).
    guarded: bool,
}

impl ChildSetup {
    /// Runs in the forked child: only async-signal-safe calls (setpgid, prctl, getppid, open,
    /// write, close, dup2, fcntl, setrlimit), no allocation.
    ///
    /// # Safety
    /// Only between `fork` and `exec`, in the child (the contract of
    /// [`CommandExt::pre_exec`]).
    unsafe fn run(&self) -> std::io::Result<()> {
        let failed = std::io::Error::last_os_error;
        // SAFETY: system calls on values prepared before the fork (see above).
        unsafe {
            // Its own process group, so that a kill reaches what it started.
            if libc::setpgid(0, 0) != 0 {
                return Err(failed());
            }
            // It dies with the thread that started it, which lives exactly as long as it (a
            // guard outlives it, to end what the session started: its worker dies with it).
            if !self.guarded && libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(failed());
            }
            if libc::getppid() != self.parent {
                libc::_exit(1);
            }
            // Join the control group before anything else runs in it.
            for procs in &self.joins {
                let joined = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if joined < 0 {
                    return Err(failed());
                }
                let written = libc::write(joined, b"0".as_ptr().cast(), 1);
                libc::close(joined);
                if written != 1 {
                    return Err(failed());
                }
            }
            // Above the targets first, so that one dup2 cannot overwrite the other's source.
            let socket = libc::fcntl(self.socket, libc::F_DUPFD_CLOEXEC, 10);
            let memory = libc::fcntl(self.shadow, libc::F_DUPFD_CLOEXEC, 10);
            let handover = libc::fcntl(self.handover, libc::F_DUPFD_CLOEXEC, 10);
            if socket < 0
                || memory < 0
                || handover < 0
                || libc::dup2(socket, CHILD_FD) < 0
                || libc::dup2(memory, SHADOW_FD) < 0
                || libc::dup2(handover, HANDOVER_FD) < 0
            {
                return Err(failed());
            }
        }
        // SAFETY: in the forked child, as `run` itself.
        unsafe {
            if self.guarded {
                // From here on in the worker, the guard's child.
                crate::guard::split(CHILD_FD)?;
            } else {
                // What its cells orphan stays its descendant.
                crate::containment::apply()?;
            }
            if let Some(hook) = &self.hook {
                hook()?;
            }
            // Last: the layers restrict what the steps above need. The limits go in just
            // before seccomp: until `exec` closes them, the child still holds every descriptor
            // the host had, so under the open-files limit the steps that open one (entering
            // the user namespace writes its maps) failed once the host held more than the
            // limit (a host with 200 sessions).
            match &self.sandbox {
                Some(sandbox) => sandbox.apply(&|| self.limit()),
                None => self.limit(),
            }
        }
    }

    /// Sets the resource limits (async-signal-safe).
    fn limit(&self) -> std::io::Result<()> {
        for &(resource, value) in &self.rlimits {
            let limit = libc::rlimit {
                rlim_cur: value,
                rlim_max: value,
            };
            // SAFETY: one system call on a value prepared before the fork.
            if unsafe { libc::setrlimit(resource, &limit) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// How a child stands once launched: its pid, its stderr, its exit status once it has exited,
/// and whether it has.
type Launched = (
    i32,
    Option<std::process::ChildStderr>,
    watch::Receiver<Option<Option<std::process::ExitStatus>>>,
    watch::Receiver<bool>,
);

/// Forks and execs `command` from a thread that then waits for the child: the child's death
/// signal is tied to that thread, which therefore ends only after the child. When the child
/// exits, what is left of its process group and control group goes too.
async fn launch(
    mut command: Command,
    child_ends: [OwnedFd; 2],
    group: Option<Arc<ChildGroup>>,
    python: &Path,
) -> Result<Launched, KernelError> {
    let (exit_tx, exit) = watch::channel(None);
    let (ended_tx, ended) = watch::channel(false);
    let (started_tx, started) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("cave-kernel-child".to_owned())
        .spawn(move || match command.spawn() {
            Ok(mut spawned) => {
                drop(child_ends);
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
                if let Some(group) = &group {
                    group.kill_all();
                }
                let _ = exit_tx.send(Some(status));
                let _ = ended_tx.send(true);
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
    Ok((pid as i32, stderr, exit, ended))
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

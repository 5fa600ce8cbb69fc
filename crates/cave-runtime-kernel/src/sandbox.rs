//! The sandbox of the kernel child: layers applied between `fork` and `exec`, each prepared in
//! the host (rulesets, filters, identity maps) so that the child only makes system calls.
//!
//! - network: new user and network namespaces (no interface but a loopback that is down), or,
//!   where namespaces are not allowed, a seccomp rule refusing sockets other than Unix ones;
//! - filesystem: Landlock, read-only beneath the interpreter's directories and the system
//!   libraries, read-write only in the work directory; with Landlock ABI 4+ no TCP either, and
//!   with ABI 6+ no signals to (or abstract sockets of) processes outside the sandbox;
//! - system calls: seccomp refusing (`EPERM`) what a Python cell has no business calling
//!   (`ptrace`, `mount`, `bpf`, module loading, namespaces, keyrings, `perf_event_open`…);
//! - `no_new_privs`, always with any layer on.
//!
//! Every layer is reported as active, unavailable (with the reason) or off: none is skipped
//! silently.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;
use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Which sandbox layers the kernel child runs under. Default: off; [`Sandbox::strict`] turns
/// every layer on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sandbox {
    /// No network.
    pub network: bool,
    /// Landlock: read-only where the interpreter lives, read-write only in the work directory.
    pub filesystem: bool,
    /// seccomp: dangerous system calls refused.
    pub syscalls: bool,
    /// More directories (or files) the child may read.
    pub readable: Vec<PathBuf>,
    /// More directories (or files) the child may read and write.
    pub writable: Vec<PathBuf>,
}

impl Sandbox {
    /// No layer.
    pub fn off() -> Self {
        Self::default()
    }
    /// Every layer.
    pub fn strict() -> Self {
        Self {
            network: true,
            filesystem: true,
            syscalls: true,
            ..Self::default()
        }
    }
    /// Lets the child read beneath `path` too.
    pub fn readable(mut self, path: impl Into<PathBuf>) -> Self {
        self.readable.push(path.into());
        self
    }
    /// Lets the child read and write beneath `path` too.
    pub fn writable(mut self, path: impl Into<PathBuf>) -> Self {
        self.writable.push(path.into());
        self
    }
    /// Returns true if and only if no layer is on.
    pub fn is_off(&self) -> bool {
        !self.network && !self.filesystem && !self.syscalls
    }
}

/// How a layer stands.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayerState {
    /// In force, and how.
    Active(String),
    /// Asked for, but this machine cannot enforce it, and why.
    Unavailable(String),
    /// Not asked for.
    Off,
}

/// One sandbox layer and how it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Layer {
    /// `network`, `filesystem`, `syscalls` or `no_new_privs`.
    pub name: &'static str,
    /// How it stands.
    pub state: LayerState,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            LayerState::Active(how) => write!(f, "{}: active ({how})", self.name),
            LayerState::Unavailable(why) => write!(f, "{}: unavailable ({why})", self.name),
            LayerState::Off => write!(f, "{}: off", self.name),
        }
    }
}

/// What this machine can enforce, layer by layer (what `cave doctor` prints).
pub fn support() -> Vec<Layer> {
    let network = match namespaces_allowed() {
        Ok(()) => LayerState::Active("user and network namespaces".to_owned()),
        Err(why) => match seccomp_available() {
            Ok(()) => LayerState::Active(format!(
                "seccomp: Unix sockets only (namespaces not allowed: {why})"
            )),
            Err(seccomp) => LayerState::Unavailable(format!("{why}; {seccomp}")),
        },
    };
    let filesystem = match landlock_abi() {
        Ok(abi) => LayerState::Active(format!("Landlock ABI {abi}")),
        Err(why) => LayerState::Unavailable(why),
    };
    let syscalls = match seccomp_available() {
        Ok(()) => LayerState::Active("seccomp filter".to_owned()),
        Err(why) => LayerState::Unavailable(why),
    };
    vec![
        Layer {
            name: "network",
            state: network,
        },
        Layer {
            name: "filesystem",
            state: filesystem,
        },
        Layer {
            name: "syscalls",
            state: syscalls,
        },
        Layer {
            name: "no_new_privs",
            state: LayerState::Active("prctl".to_owned()),
        },
    ]
}

/// Whether the child can enter new user and network namespaces (probed once, by starting a
/// process that does).
fn namespaces_allowed() -> Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            use std::os::unix::process::CommandExt;
            let maps = IdMaps::current();
            let mut command = std::process::Command::new("/bin/sh");
            command
                .args(["-c", "exit 0"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            // SAFETY: only system calls on buffers prepared before the fork.
            unsafe {
                command.pre_exec(move || maps.enter());
            }
            match command.status() {
                Ok(status) if status.success() => Ok(()),
                Ok(status) => Err(format!("the probe process ended with {status}")),
                Err(e) => Err(format!("user namespaces are not allowed here ({e})")),
            }
        })
        .clone()
}

/// The Landlock ABI version the kernel offers.
fn landlock_abi() -> Result<i64, String> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the documented version query: no attributes, no size.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if version > 0 {
        Ok(version)
    } else {
        let e = std::io::Error::last_os_error();
        Err(match e.raw_os_error() {
            Some(libc::ENOSYS) => {
                "the kernel has no Landlock (Linux 5.13 or later, built with it)".to_owned()
            }
            Some(libc::EOPNOTSUPP) => {
                "Landlock is disabled at boot (add it to the lsm= kernel parameter)".to_owned()
            }
            _ => format!("Landlock cannot be used: {e}"),
        })
    }
}

fn seccomp_available() -> Result<(), String> {
    // SAFETY: a query with no side effect.
    let mode = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    if mode < 0 {
        return Err(format!(
            "the kernel has no seccomp ({})",
            std::io::Error::last_os_error()
        ));
    }
    target_arch().map(drop)
}

fn target_arch() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| format!("no seccomp filter for {}", std::env::consts::ARCH))
}

/// The identity maps of the new user namespace: the same user and group inside as outside.
#[derive(Clone)]
struct IdMaps {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
}

impl IdMaps {
    fn current() -> IdMaps {
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        IdMaps {
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
        }
    }

    /// In the child: new user and network namespaces, the same ids inside.
    fn enter(&self) -> std::io::Result<()> {
        // SAFETY: system calls on buffers prepared before the fork.
        unsafe {
            if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Needed before gid_map without CAP_SETGID in the parent namespace; absent on old
            // kernels, where it is not needed.
            let _ = write_file(c"/proc/self/setgroups", b"deny");
            write_file(c"/proc/self/uid_map", &self.uid_map)?;
            write_file(c"/proc/self/gid_map", &self.gid_map)?;
        }
        Ok(())
    }
}

/// `open` + `write` + `close`: async-signal-safe.
unsafe fn write_file(path: &std::ffi::CStr, bytes: &[u8]) -> std::io::Result<()> {
    // SAFETY: the caller is in a forked child; these are plain system calls.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let error = std::io::Error::last_os_error();
        libc::close(fd);
        if written != bytes.len() as isize {
            return Err(error);
        }
    }
    Ok(())
}

/// The layers, ready to apply in the child.
pub(crate) struct Prepared {
    namespaces: Option<IdMaps>,
    landlock: Option<OwnedFd>,
    /// Installed in order; each is self-contained (`Allow` when nothing matches).
    filters: Vec<BpfProgram>,
    /// How each layer stands, for the report.
    pub(crate) layers: Vec<Layer>,
}

impl fmt::Debug for Prepared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared")
            .field("layers", &self.layers)
            .finish_non_exhaustive()
    }
}

/// What the filesystem layer lets the child read besides the interpreter's own directories:
/// the system's libraries, the dynamic loader's cache, time zones, and harmless devices.
const SYSTEM_READABLE: &[&str] = &[
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/dev/urandom",
    "/dev/random",
    "/dev/zero",
];

impl Prepared {
    /// Prepares `sandbox` for a child running `python` (its `sys.prefix` and `sys.path`
    /// readable) in `work_dir` (writable).
    pub(crate) fn new(
        sandbox: &Sandbox,
        python: &Path,
        python_dirs: &[PathBuf],
        work_dir: &Path,
    ) -> Prepared {
        let mut layers = Vec::new();
        let mut filters = Vec::new();
        let mut namespaces = None;
        let mut socket_rule = false;
        let network = if !sandbox.network {
            LayerState::Off
        } else {
            match namespaces_allowed() {
                Ok(()) => {
                    namespaces = Some(IdMaps::current());
                    LayerState::Active("user and network namespaces".to_owned())
                }
                Err(why) => match seccomp_available() {
                    Ok(()) => {
                        socket_rule = true;
                        LayerState::Active(format!(
                            "seccomp: Unix sockets only (namespaces not allowed: {why})"
                        ))
                    }
                    Err(seccomp) => LayerState::Unavailable(format!("{why}; {seccomp}")),
                },
            }
        };
        layers.push(Layer {
            name: "network",
            state: network,
        });

        let mut landlock = None;
        let filesystem = if !sandbox.filesystem {
            LayerState::Off
        } else {
            match landlock_ruleset(sandbox, python, python_dirs, work_dir) {
                Ok((fd, how)) => {
                    landlock = Some(fd);
                    LayerState::Active(how)
                }
                Err(why) => LayerState::Unavailable(why),
            }
        };
        layers.push(Layer {
            name: "filesystem",
            state: filesystem,
        });

        let syscalls = if !sandbox.syscalls && !socket_rule {
            LayerState::Off
        } else {
            match seccomp_filters(sandbox.syscalls, socket_rule) {
                Ok(programs) => {
                    filters = programs;
                    if sandbox.syscalls {
                        LayerState::Active("seccomp filter".to_owned())
                    } else {
                        LayerState::Off
                    }
                }
                Err(why) => LayerState::Unavailable(why),
            }
        };
        layers.push(Layer {
            name: "syscalls",
            state: syscalls,
        });
        layers.push(Layer {
            name: "no_new_privs",
            state: if sandbox.is_off() {
                LayerState::Off
            } else {
                LayerState::Active("prctl".to_owned())
            },
        });
        Prepared {
            namespaces,
            landlock,
            filters,
            layers,
        }
    }

    /// In the child, between `fork` and `exec`: namespaces, `no_new_privs`, Landlock, then
    /// seccomp (last: it would refuse what the others need).
    ///
    /// # Safety
    /// Only in a forked child before `exec`; makes only system calls on what `new` prepared.
    pub(crate) unsafe fn apply(&self) -> std::io::Result<()> {
        if let Some(maps) = &self.namespaces {
            maps.enter()?;
        }
        // SAFETY: plain system calls on prepared values.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Entering a user namespace may clear the parent-death signal: set it again.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = &self.landlock
                && libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        for filter in &self.filters {
            seccompiler::apply_filter(filter).map_err(std::io::Error::other)?;
        }
        Ok(())
    }
}

/// The Landlock ruleset: its file descriptor and a description of what it enforces.
fn landlock_ruleset(
    sandbox: &Sandbox,
    python: &Path,
    python_dirs: &[PathBuf],
    work_dir: &Path,
) -> Result<(OwnedFd, String), String> {
    use landlock::{
        ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
        RulesetCreatedAttr, Scope, path_beneath_rules,
    };
    let kernel = landlock_abi()?;
    let abi = ABI::V6;
    let error = |e: landlock::RulesetError| format!("Landlock ruleset: {e}");
    let mut readable: Vec<PathBuf> = SYSTEM_READABLE.iter().map(PathBuf::from).collect();
    // The interpreter and its installation (a venv's python links into one).
    if let Ok(real) = python.canonicalize() {
        if let Some(install) = real.parent().and_then(Path::parent) {
            readable.push(install.to_owned());
        }
        readable.push(real);
    }
    readable.push(python.to_owned());
    readable.extend(python_dirs.iter().cloned());
    readable.extend(sandbox.readable.iter().cloned());
    let mut writable = vec![work_dir.to_owned(), PathBuf::from("/dev/null")];
    writable.extend(sandbox.writable.iter().cloned());
    let read = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(error)?
        .handle_access(AccessNet::from_all(abi))
        .map_err(error)?
        .scope(Scope::from_all(abi))
        .map_err(error)?
        .create()
        .map_err(error)?
        .add_rules(path_beneath_rules(&readable, read))
        .map_err(error)?
        .add_rules(path_beneath_rules(&writable, all))
        .map_err(error)?;
    let fd: Option<OwnedFd> = ruleset.into();
    let fd = fd.ok_or_else(|| "Landlock is not enforced by this kernel".to_owned())?;
    let mut how = format!(
        "Landlock ABI {kernel}: read-only system and interpreter directories, read-write {}",
        work_dir.display()
    );
    if kernel >= 4 {
        how.push_str("; no TCP");
    }
    if kernel >= 6 {
        how.push_str("; no signals or abstract sockets outside");
    }
    Ok((fd, how))
}

/// The seccomp programs: the refused calls (`EPERM`), and `clone3` answered `ENOSYS` so that
/// the C library falls back to `clone`, whose flags the first filter can read.
fn seccomp_filters(deny_list: bool, socket_rule: bool) -> Result<Vec<BpfProgram>, String> {
    let arch = target_arch()?;
    let error = |e: seccompiler::BackendError| format!("seccomp filter: {e}");
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    if deny_list {
        for &call in DENIED {
            rules.insert(call, Vec::new());
        }
        // New namespaces through clone: one rule per flag (rules of a call are alternatives).
        let mut clone_rules = Vec::new();
        for flag in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWCGROUP,
        ] {
            let condition = SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag as u64),
                flag as u64,
            )
            .map_err(error)?;
            clone_rules.push(SeccompRule::new(vec![condition]).map_err(error)?);
        }
        rules.insert(libc::SYS_clone, clone_rules);
    }
    if socket_rule {
        let condition = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Ne,
            libc::AF_UNIX as u64,
        )
        .map_err(error)?;
        rules.insert(
            libc::SYS_socket,
            vec![SeccompRule::new(vec![condition]).map_err(error)?],
        );
    }
    let mut programs = Vec::new();
    if deny_list {
        let clone3 = SeccompFilter::new(
            BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )
        .map_err(error)?;
        programs.push(BpfProgram::try_from(clone3).map_err(error)?);
    }
    let denied = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(error)?;
    programs.push(BpfProgram::try_from(denied).map_err(error)?);
    Ok(programs)
}

/// System calls a Python cell has no business making.
const DENIED: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fsconfig,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_bpf,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_quotactl,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_syslog,
    libc::SYS_fanotify_init,
    libc::SYS_vhangup,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// A per-runtime work directory: the child's current directory, removed with the runtime.
#[derive(Debug)]
pub(crate) struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    /// A fresh directory under the system's temporary directory.
    pub(crate) fn create() -> std::io::Result<WorkDir> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "cave-kernel-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&path)?;
        Ok(WorkDir { path })
    }

    /// Its path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

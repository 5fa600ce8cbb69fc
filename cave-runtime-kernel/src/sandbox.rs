//! The sandbox of the kernel child: layers applied between `fork` and `exec`, each prepared in
//! the host (rulesets, filters, identity maps) so that the child only makes system calls.
//!
//! - network: new user and network namespaces (no interface but a loopback that is down) and a
//!   seccomp rule refusing new Unix-domain sockets (a namespace does not separate sockets that
//!   live on the filesystem: the Docker daemon's, D-Bus's, an SSH agent's); where namespaces
//!   are not allowed, a seccomp rule refusing every new socket (with an egress allowlist and
//!   Landlock ABI 4+: every new socket but TCP ones, which Landlock holds to the port of the
//!   host's proxy). `socketpair` stays: Python's own plumbing (asyncio, multiprocessing) uses
//!   it, and it reaches nothing outside;
//! - filesystem: Landlock, read-only beneath the interpreter's directories and the system
//!   libraries, read-write only in the work directory; with Landlock ABI 4+ no TCP either, and
//!   with ABI 6+ no signals to (or abstract sockets of) processes outside the sandbox;
//! - system calls: seccomp refusing (`EPERM`) what a Python cell has no business calling
//!   (`ptrace`, `mount`, `bpf`, module loading, namespaces, keyrings, `perf_event_open`,
//!   io_uring…): every call Docker's default profile refuses, checked call by call in the
//!   tests (`DOCKER_REFUSED`);
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
    /// With the network layer on: the hosts the child may reach, through a proxy the host
    /// runs (see [`allow_net`](Self::allow_net)). Empty: no network at all.
    pub allow_net: cave_egress::Allowlist,
    /// Bytes a session may download through the proxy, in all (`None`: no bound).
    pub max_egress: Option<u64>,
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
    /// Lets the child reach the hosts `allowlist` lists, and nothing else: its own network
    /// namespace keeps no route out, and a forward proxy the host runs (HTTP `CONNECT`, plain
    /// HTTP) is its only way, at `http://127.0.0.1:3128` in the child, named by `HTTPS_PROXY`,
    /// `HTTP_PROXY` and `ALL_PROXY` (which pip and Python's clients follow). Names are resolved
    /// by the host; one that resolves to a loopback, link-local or private address is refused
    /// unless that address is listed. Needs the network layer; where this machine allows no
    /// namespaces, the proxy listens on the host's loopback instead and the child may open TCP
    /// sockets only, held by Landlock (ABI 4+) to the proxy's port, a weaker promise
    /// (`cave doctor` says which holds here). See docs/SANDBOX.md.
    pub fn allow_net(mut self, allowlist: cave_egress::Allowlist) -> Self {
        self.allow_net = allowlist;
        self
    }
    /// Bounds what a session downloads through the proxy to `bytes` in all.
    pub fn max_egress(mut self, bytes: Option<u64>) -> Self {
        self.max_egress = bytes;
        self
    }
    /// Returns true if and only if no layer is on.
    pub fn is_off(&self) -> bool {
        !self.network && !self.filesystem && !self.syscalls
    }
}

pub use cave_core::{Layer, LayerState};

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
        Layer::new("network", network),
        Layer::new("filesystem", filesystem),
        Layer::new("syscalls", syscalls),
        Layer::new("no_new_privs", LayerState::Active("prctl".to_owned())),
    ]
}

/// Whether the child can enter new user and network namespaces (probed once, by starting a
/// process that does).
/// Whether an egress allowlist (`Sandbox::allow_net`) can hold on this machine, and how:
/// what `cave doctor` prints.
pub fn egress_support() -> String {
    match namespaces_allowed() {
        Ok(()) => {
            let landlock = match landlock_abi() {
                Ok(abi) if abi >= 4 => {
                    format!("; Landlock ABI {abi} also holds cells to the proxy's port")
                }
                _ => String::new(),
            };
            format!(
                "supported: the worker's own network namespace has no route out, and the host's proxy (port {PROXY_PORT} inside it) is its only way{landlock}"
            )
        }
        Err(why) => match loopback_route() {
            Ok(abi) => format!(
                "partly: no network namespaces here ({why}); the host's proxy listens on its loopback, cells may open TCP sockets only (seccomp) and connect to the proxy's port only (Landlock ABI {abi}), on any address: a server elsewhere listening on that port number is reachable too"
            ),
            Err(fallback) => format!(
                "unavailable: no network namespaces here ({why}), and no TCP rules to hold cells to a proxy on the host ({fallback}); with --allow-net no host is reachable (the sandbox refuses every new socket)"
            ),
        },
    }
}

/// Whether the proxy can be reached on the host's loopback instead of a namespace of the
/// child's own: seccomp to leave the child TCP sockets only, Landlock ABI 4 or later to hold
/// their connections to the proxy's port (the ABI, or why not).
pub(crate) fn loopback_route() -> Result<i64, String> {
    seccomp_available()?;
    landlock_tcp()
}

/// The Landlock ABI when it has TCP rules (4 or later), or why not.
pub(crate) fn landlock_tcp() -> Result<i64, String> {
    match landlock_abi()? {
        abi if abi >= 4 => Ok(abi),
        abi => Err(format!(
            "Landlock ABI {abi} has no TCP rules (ABI 4, Linux 6.7, has)"
        )),
    }
}

/// How a child with an egress allowlist reaches the host's proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProxyRoute {
    /// In a network namespace of its own, through a listener at [`PROXY_PORT`] it makes there
    /// and hands to the host.
    Namespace,
    /// On the host's loopback, at this port of the host's own listener: seccomp leaves the
    /// child TCP sockets only, and Landlock holds their connections to this port.
    Loopback(u16),
}

impl ProxyRoute {
    /// The route this machine gives a child under `sandbox`, with the host's listener for the
    /// loopback route; `None` when the sandbox lists no host, or when the machine gives no
    /// route (the child then reaches no host: the network layer says why).
    pub(crate) fn open(
        sandbox: &Sandbox,
    ) -> std::io::Result<Option<(ProxyRoute, Option<std::net::TcpListener>)>> {
        if !sandbox.network || sandbox.allow_net.is_empty() {
            return Ok(None);
        }
        if namespaces_allowed().is_ok() {
            return Ok(Some((ProxyRoute::Namespace, None)));
        }
        if loopback_route().is_err() {
            return Ok(None);
        }
        let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        Ok(Some((ProxyRoute::Loopback(port), Some(listener))))
    }

    /// The port the child connects to.
    pub(crate) fn port(self) -> u16 {
        match self {
            ProxyRoute::Namespace => PROXY_PORT,
            ProxyRoute::Loopback(port) => port,
        }
    }

    /// The proxy's address, as the child's environment names it.
    pub(crate) fn url(self) -> String {
        format!("http://127.0.0.1:{}", self.port())
    }
}

pub(crate) fn namespaces_allowed() -> Result<(), String> {
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
pub(crate) fn landlock_abi() -> Result<i64, String> {
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

pub(crate) fn seccomp_available() -> Result<(), String> {
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

/// Where systems keep the certificates TLS clients trust (readable with an egress allowlist).
pub(crate) const CERTIFICATES: &[&str] = &["/etc/ssl", "/etc/pki", "/etc/ca-certificates"];

/// The port of the egress proxy inside the child's network namespace (its own: no other
/// process listens there).
pub(crate) const PROXY_PORT: u16 = 3128;

/// In the child, inside its new network namespace: the loopback brought up, a socket listening
/// on it at [`PROXY_PORT`], handed to the host over the hand-over socket (`SCM_RIGHTS`): the
/// host's proxy accepts on it and connects out from the host's own namespace.
///
/// # Safety
/// Only in a forked child before `exec`: system calls on stack values, no allocation.
unsafe fn hand_over_proxy_listener(handover: i32) -> std::io::Result<()> {
    let failed = std::io::Error::last_os_error;
    // SAFETY: plain system calls on values on this stack frame.
    unsafe {
        let control = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if control < 0 {
            return Err(failed());
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        request.ifr_name[0] = b'l' as libc::c_char;
        request.ifr_name[1] = b'o' as libc::c_char;
        if libc::ioctl(control, libc::SIOCGIFFLAGS, &mut request) != 0 {
            let error = failed();
            libc::close(control);
            return Err(error);
        }
        request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        let up = libc::ioctl(control, libc::SIOCSIFFLAGS, &request);
        let error = failed();
        libc::close(control);
        if up != 0 {
            return Err(error);
        }
        let listener = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if listener < 0 {
            return Err(failed());
        }
        let address = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: PROXY_PORT.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be(),
            },
            sin_zero: [0; 8],
        };
        let bound = libc::bind(
            listener,
            (&address as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        if bound != 0 || libc::listen(listener, 512) != 0 {
            let error = failed();
            libc::close(listener);
            return Err(error);
        }
        // One byte, and the descriptor as ancillary data (room for one, aligned).
        let byte = [b'p'];
        let mut iov = libc::iovec {
            iov_base: byte.as_ptr() as *mut libc::c_void,
            iov_len: 1,
        };
        let mut space = [0u64; 4];
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = space.as_mut_ptr().cast();
        message.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) as _;
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<i32>(), listener);
        let sent = libc::sendmsg(handover, &message, libc::MSG_NOSIGNAL);
        let error = failed();
        libc::close(listener);
        if sent != 1 {
            return Err(error);
        }
    }
    Ok(())
}

/// The layers, ready to apply in the child.
pub(crate) struct Prepared {
    namespaces: Option<IdMaps>,
    /// The hand-over socket the egress proxy's listener goes to, when the child may reach
    /// the network through the host's proxy.
    egress: Option<i32>,
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
/// the system's libraries, the dynamic loader's cache, time zones, the system's name and
/// version, and harmless devices.
const SYSTEM_READABLE: &[&str] = &[
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    // What the system is (pip's user agent reads them, as does `platform`).
    "/etc/os-release",
    "/etc/debian_version",
    "/etc/lsb-release",
    "/etc/system-release",
    "/etc/redhat-release",
    "/etc/alpine-release",
    "/dev/urandom",
    "/dev/random",
    "/dev/zero",
];

impl Prepared {
    /// Prepares `sandbox` for a child running `python` (its `sys.prefix` and `sys.path`
    /// readable) in `work_dir` (writable), reaching the egress proxy by `route` (see
    /// [`ProxyRoute::open`]); on the namespace route the proxy's listener goes to descriptor
    /// `handover`.
    pub(crate) fn new(
        sandbox: &Sandbox,
        python: &Path,
        python_dirs: &[PathBuf],
        work_dir: &Path,
        handover: i32,
        route: Option<ProxyRoute>,
    ) -> Prepared {
        let mut layers = Vec::new();
        let mut filters = Vec::new();
        let mut namespaces = None;
        let mut sockets = Sockets::Any;
        let listed = || sandbox.allow_net.entries().join(", ");

        // Landlock first: on the loopback route, the network layer holds only if its TCP rule
        // does (`ProxyRoute::open` gives no route without the network layer).
        let on_loopback = matches!(route, Some(ProxyRoute::Loopback(_)));
        let landlock = (sandbox.filesystem || on_loopback).then(|| {
            landlock_ruleset(
                sandbox,
                python,
                python_dirs,
                work_dir,
                route.map(ProxyRoute::port),
            )
        });

        let network = if !sandbox.network {
            LayerState::Off
        } else {
            match namespaces_allowed() {
                Ok(()) => {
                    namespaces = Some(IdMaps::current());
                    let egress = if route == Some(ProxyRoute::Namespace) {
                        format!("; out only through the host's proxy, to {}", listed())
                    } else {
                        String::new()
                    };
                    match seccomp_available() {
                        Ok(()) => {
                            sockets = Sockets::NoUnix;
                            LayerState::Active(format!(
                                "user and network namespaces; no new Unix-domain sockets (seccomp){egress}"
                            ))
                        }
                        Err(seccomp) => LayerState::Active(format!(
                            "user and network namespaces; the host's Unix-domain sockets stay reachable ({seccomp}){egress}"
                        )),
                    }
                }
                Err(why) => match seccomp_available() {
                    Ok(()) => match route {
                        Some(ProxyRoute::Loopback(port)) if matches!(landlock, Some(Ok(_))) => {
                            sockets = Sockets::TcpOnly;
                            LayerState::Active(format!(
                                "seccomp: no new sockets but TCP ones, and Landlock: TCP connections to port {port} only (namespaces not allowed: {why}); out only through the host's proxy on its loopback, to {}; a server elsewhere on port {port} is reachable too",
                                listed()
                            ))
                        }
                        _ => {
                            sockets = Sockets::None;
                            let egress = if sandbox.allow_net.is_empty() {
                                String::new()
                            } else {
                                let cause = match &landlock {
                                    Some(Err(why)) => Some(why.clone()),
                                    _ => loopback_route().err(),
                                }
                                .unwrap_or_else(|| "no route to the proxy".to_owned());
                                format!(
                                    "; the allowlist cannot apply ({cause}): no host is reachable"
                                )
                            };
                            LayerState::Active(format!(
                                "seccomp: no new sockets (namespaces not allowed: {why}){egress}"
                            ))
                        }
                    },
                    Err(seccomp) => LayerState::Unavailable(format!("{why}; {seccomp}")),
                },
            }
        };
        layers.push(Layer::new("network", network));

        let filesystem = if !sandbox.filesystem {
            LayerState::Off
        } else {
            match &landlock {
                Some(Ok((_, how))) => LayerState::Active(how.clone()),
                Some(Err(why)) => LayerState::Unavailable(why.clone()),
                None => unreachable!("a ruleset is made whenever the filesystem layer is on"),
            }
        };
        layers.push(Layer::new("filesystem", filesystem));
        let landlock = landlock.and_then(Result::ok).map(|(fd, _)| fd);

        let syscalls = if !sandbox.syscalls && sockets == Sockets::Any {
            LayerState::Off
        } else {
            match seccomp_filters(sandbox.syscalls, sockets) {
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
        layers.push(Layer::new("syscalls", syscalls));
        layers.push(Layer::new(
            "no_new_privs",
            if sandbox.is_off() {
                LayerState::Off
            } else {
                LayerState::Active("prctl".to_owned())
            },
        ));
        let egress =
            (namespaces.is_some() && route == Some(ProxyRoute::Namespace)).then_some(handover);
        Prepared {
            namespaces,
            egress,
            landlock,
            filters,
            layers,
        }
    }

    /// Whether the child hands the host its proxy's listener during its set-up.
    pub(crate) fn sends_proxy_listener(&self) -> bool {
        self.egress.is_some()
    }

    /// In the child, between `fork` and `exec`: namespaces, `no_new_privs`, Landlock,
    /// `before_seccomp`, then seccomp (last: it would refuse what the others need).
    ///
    /// # Safety
    /// Only in a forked child before `exec`; makes only system calls on what `new` prepared,
    /// and `before_seccomp` must be async-signal-safe.
    pub(crate) unsafe fn apply(
        &self,
        before_seccomp: &dyn Fn() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if let Some(maps) = &self.namespaces {
            maps.enter()?;
        }
        if let Some(handover) = self.egress {
            // SAFETY: in the forked child, as `apply` itself.
            unsafe { hand_over_proxy_listener(handover)? };
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
        before_seccomp()?;
        for filter in &self.filters {
            seccompiler::apply_filter(filter).map_err(std::io::Error::other)?;
        }
        Ok(())
    }
}

/// The Landlock ruleset: its file descriptor and a description of what it enforces. The
/// filesystem rules when the sandbox's filesystem layer is on; TCP refused (ABI 4+) but
/// connections to `proxy_port`.
fn landlock_ruleset(
    sandbox: &Sandbox,
    python: &Path,
    python_dirs: &[PathBuf],
    work_dir: &Path,
    proxy_port: Option<u16>,
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
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessNet::from_all(abi))
        .map_err(error)?;
    if sandbox.filesystem {
        ruleset = ruleset
            .handle_access(all)
            .map_err(error)?
            .scope(Scope::from_all(abi))
            .map_err(error)?;
    }
    let mut ruleset = ruleset.create().map_err(error)?;
    if sandbox.filesystem {
        ruleset = ruleset
            .add_rules(path_beneath_rules(&readable, read))
            .map_err(error)?
            .add_rules(path_beneath_rules(&writable, all))
            .map_err(error)?;
    }
    // The one TCP port a cell may connect to: the host's proxy's.
    if let Some(port) = proxy_port {
        ruleset = ruleset
            .add_rule(landlock::NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(error)?;
    }
    let fd: Option<OwnedFd> = ruleset.into();
    let fd = fd.ok_or_else(|| "Landlock is not enforced by this kernel".to_owned())?;
    // Above the descriptors the child's set-up overwrites (3 to 6: its socket, shadow,
    // hand-over socket and, under a guard, the announcements): a ruleset that happened to sit
    // there would be replaced before it is applied (EBADFD).
    // SAFETY: fcntl on a descriptor we own; the duplicate is owned by what it returns.
    let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
    if high < 0 {
        return Err(format!(
            "cannot move the Landlock ruleset: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: `high` is a new descriptor nothing else owns.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(high) };
    let mut how = if sandbox.filesystem {
        format!(
            "Landlock ABI {kernel}: read-only system and interpreter directories, read-write {}",
            work_dir.display()
        )
    } else {
        format!("Landlock ABI {kernel}: TCP rules only")
    };
    if kernel >= 4 {
        match proxy_port {
            Some(port) => how.push_str(&format!("; no TCP but to the proxy's port {port}")),
            None => how.push_str("; no TCP"),
        }
    }
    if kernel >= 6 && sandbox.filesystem {
        how.push_str("; no signals or abstract sockets outside");
    }
    Ok((fd, how))
}

/// Which new sockets the network layer lets the child make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sockets {
    /// Any (the layer is off).
    Any,
    /// Any but Unix-domain ones: the network namespace already cuts the rest off.
    NoUnix,
    /// None (no namespace cuts anything off).
    None,
    /// TCP ones only, for the proxy on the host's loopback (Landlock holds them to its port).
    TcpOnly,
}

/// A seccomp rule that matches when argument `index` equals `value`.
fn arg_is(index: u8, value: u64) -> Result<SeccompRule, seccompiler::BackendError> {
    SeccompRule::new(vec![SeccompCondition::new(
        index,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        value,
    )?])
}

/// The seccomp programs: the refused calls (`EPERM`), and `clone3` answered `ENOSYS` so that
/// the C library falls back to `clone`, whose flags the first filter can read.
fn seccomp_filters(deny_list: bool, sockets: Sockets) -> Result<Vec<BpfProgram>, String> {
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
        // Execution domains: only the ones Docker's profile lets through (the query, Linux,
        // 32-bit Linux, and uname26 with either), not ADDR_NO_RANDOMIZE and the like.
        let mut keep = Vec::new();
        for domain in [0u64, 8, 0x20000, 0x20008, 0xffff_ffff] {
            keep.push(
                SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, domain)
                    .map_err(error)?,
            );
        }
        rules.insert(
            libc::SYS_personality,
            vec![SeccompRule::new(keep).map_err(error)?],
        );
    }
    let mut socket_rules = Vec::new();
    if sockets == Sockets::NoUnix {
        socket_rules.push(arg_is(0, libc::AF_UNIX as u64).map_err(error)?);
    }
    if deny_list && sockets != Sockets::None {
        // Kernel crypto and virtual-machine sockets, as Docker's profile refuses them.
        socket_rules.push(arg_is(0, libc::AF_ALG as u64).map_err(error)?);
        socket_rules.push(arg_is(0, libc::AF_VSOCK as u64).map_err(error)?);
    }
    if sockets == Sockets::TcpOnly {
        // Refused when any holds: a family but IPv4 and IPv6, a type but a stream, a protocol
        // but TCP (SCTP and MPTCP streams escape Landlock's TCP rules).
        let refused = |conditions: Vec<SeccompCondition>| SeccompRule::new(conditions);
        let ne = |index: u8, value: u64| {
            SeccompCondition::new(index, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, value)
        };
        socket_rules.push(
            refused(vec![
                ne(0, libc::AF_INET as u64).map_err(error)?,
                ne(0, libc::AF_INET6 as u64).map_err(error)?,
            ])
            .map_err(error)?,
        );
        // The type's low four bits (the flags above them are free).
        for kind in (0..16u64).filter(|&kind| kind != libc::SOCK_STREAM as u64) {
            let condition = SeccompCondition::new(
                1,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::MaskedEq(0xf),
                kind,
            )
            .map_err(error)?;
            socket_rules.push(refused(vec![condition]).map_err(error)?);
        }
        socket_rules.push(
            refused(vec![
                ne(2, 0).map_err(error)?,
                ne(2, libc::IPPROTO_TCP as u64).map_err(error)?,
            ])
            .map_err(error)?,
        );
    }
    if sockets == Sockets::None {
        // No condition: every call.
        rules.insert(libc::SYS_socket, Vec::new());
    } else if !socket_rules.is_empty() {
        rules.insert(libc::SYS_socket, socket_rules);
    }
    if sockets == Sockets::TcpOnly {
        // What Landlock's TCP rules do not see: `listen` on a socket never bound binds a port
        // itself (in the host's namespace, here), and a send with MSG_FASTOPEN connects
        // without the connect hook on some kernels (`TCP_FASTOPEN_CONNECT` too, for safety).
        rules.insert(libc::SYS_listen, Vec::new());
        let fast_open = |index: u8| {
            SeccompCondition::new(
                index,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::MaskedEq(libc::MSG_FASTOPEN as u64),
                libc::MSG_FASTOPEN as u64,
            )
            .and_then(|condition| SeccompRule::new(vec![condition]))
            .map_err(error)
        };
        rules.insert(libc::SYS_sendto, vec![fast_open(3)?]);
        rules.insert(libc::SYS_sendmsg, vec![fast_open(2)?]);
        rules.insert(libc::SYS_sendmmsg, vec![fast_open(3)?]);
        let connect_option = SeccompRule::new(vec![
            SeccompCondition::new(
                1,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                libc::IPPROTO_TCP as u64,
            )
            .map_err(error)?,
            SeccompCondition::new(
                2,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                libc::TCP_FASTOPEN_CONNECT as u64,
            )
            .map_err(error)?,
        ])
        .map_err(error)?;
        rules.insert(libc::SYS_setsockopt, vec![connect_option]);
    }
    if sockets != Sockets::Any {
        // io_uring makes sockets (IORING_OP_SOCKET) without the `socket` call seccomp sees.
        for call in [
            libc::SYS_io_uring_setup,
            libc::SYS_io_uring_enter,
            libc::SYS_io_uring_register,
        ] {
            rules.insert(call, Vec::new());
        }
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
    libc::SYS_setdomainname,
    libc::SYS_sethostname,
    libc::SYS_quotactl_fd,
    // io_uring runs operations seccomp cannot see, with credentials it captured earlier.
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    // Other processes' descriptors, memory and comparisons of their resources.
    libc::SYS_kcmp,
    libc::SYS_pidfd_getfd,
    libc::SYS_process_madvise,
    // NUMA placement (Docker asks for CAP_SYS_NICE).
    libc::SYS_mbind,
    libc::SYS_set_mempolicy,
    libc::SYS_get_mempolicy,
    libc::SYS_migrate_pages,
    libc::SYS_move_pages,
    libc::SYS_set_mempolicy_home_node,
    libc::SYS_lookup_dcookie,
    libc::SYS_nfsservctl,
    // lsm_get_self_attr, lsm_set_self_attr, lsm_list_modules (Linux 6.8; one number on every
    // architecture, not yet named by the libc crate).
    459,
    460,
    461,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_uselib,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ustat,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_sysfs,
    #[cfg(target_arch = "x86_64")]
    libc::SYS__sysctl,
    // Never implemented, or removed: refused before the kernel says ENOSYS.
    #[cfg(target_arch = "x86_64")]
    174, // create_module
    #[cfg(target_arch = "x86_64")]
    177, // get_kernel_syms
    #[cfg(target_arch = "x86_64")]
    178, // query_module
    #[cfg(target_arch = "x86_64")]
    libc::SYS_getpmsg,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_putpmsg,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_afs_syscall,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_tuxcall,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_security,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_vserver,
];

/// The system calls Docker's default seccomp profile (moby/profiles, `seccomp/default.json`)
/// refuses on x86_64 to a container without added capabilities: the anchor most users trust.
/// Every one is refused here too (the test below); Docker lets `ptrace` and
/// `process_vm_readv`/`writev` through on Linux 4.8+, which this filter refuses as well.
#[cfg(all(test, target_arch = "x86_64"))]
const DOCKER_REFUSED: &[(&str, i64)] = &[
    ("syslog", 103),
    ("uselib", 134),
    ("ustat", 136),
    ("sysfs", 139),
    ("vhangup", 153),
    ("pivot_root", 155),
    ("_sysctl", 156),
    ("chroot", 161),
    ("acct", 163),
    ("settimeofday", 164),
    ("mount", 165),
    ("umount2", 166),
    ("swapon", 167),
    ("swapoff", 168),
    ("reboot", 169),
    ("sethostname", 170),
    ("setdomainname", 171),
    ("iopl", 172),
    ("ioperm", 173),
    ("create_module", 174),
    ("init_module", 175),
    ("delete_module", 176),
    ("get_kernel_syms", 177),
    ("query_module", 178),
    ("quotactl", 179),
    ("nfsservctl", 180),
    ("getpmsg", 181),
    ("putpmsg", 182),
    ("afs_syscall", 183),
    ("tuxcall", 184),
    ("security", 185),
    ("lookup_dcookie", 212),
    ("clock_settime", 227),
    ("vserver", 236),
    ("mbind", 237),
    ("set_mempolicy", 238),
    ("get_mempolicy", 239),
    ("kexec_load", 246),
    ("add_key", 248),
    ("request_key", 249),
    ("keyctl", 250),
    ("migrate_pages", 256),
    ("unshare", 272),
    ("move_pages", 279),
    ("perf_event_open", 298),
    ("fanotify_init", 300),
    ("open_by_handle_at", 304),
    ("clock_adjtime", 305),
    ("setns", 308),
    ("kcmp", 312),
    ("finit_module", 313),
    ("kexec_file_load", 320),
    ("bpf", 321),
    ("userfaultfd", 323),
    ("io_uring_setup", 425),
    ("io_uring_enter", 426),
    ("io_uring_register", 427),
    ("open_tree", 428),
    ("move_mount", 429),
    ("fsopen", 430),
    ("fsconfig", 431),
    ("fsmount", 432),
    ("fspick", 433),
    ("clone3", 435),
    ("pidfd_getfd", 438),
    ("process_madvise", 440),
    ("mount_setattr", 442),
    ("quotactl_fd", 443),
    ("set_mempolicy_home_node", 450),
    ("lsm_get_self_attr", 459),
    ("lsm_set_self_attr", 460),
    ("lsm_list_modules", 461),
];

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// The ruleset sits above the descriptors the child's set-up replaces (3 to 6), however
    /// few the host has open: a ruleset on 3 became the socket before it was applied.
    #[test]
    fn the_landlock_ruleset_is_above_the_childs_descriptors() {
        if landlock_abi().is_err() {
            eprintln!("skipped: no Landlock here");
            return;
        }
        let dir = std::env::temp_dir();
        let python = Path::new("/usr/bin/python3");
        for _ in 0..3 {
            let prepared = Prepared::new(&Sandbox::strict(), python, &[], &dir, 5, None);
            let fd = prepared.landlock.as_ref().expect("a ruleset").as_raw_fd();
            assert!(fd >= 10, "the ruleset is on {fd}");
        }
    }

    /// Call by call: what Docker's default profile refuses, this filter refuses (`clone3` is
    /// answered `ENOSYS` by a program of its own, as Docker answers it, so that the C library
    /// falls back to `clone`, whose flags the filter reads).
    #[test]
    fn every_call_docker_refuses_is_refused() {
        let missing: Vec<&str> = DOCKER_REFUSED
            .iter()
            .filter(|(_, number)| *number != libc::SYS_clone3 && !DENIED.contains(number))
            .map(|(name, _)| *name)
            .collect();
        assert!(
            missing.is_empty(),
            "allowed here, refused by Docker: {missing:?}"
        );
        // The numbers are the platform's own.
        for (name, number) in [
            ("syslog", libc::SYS_syslog),
            ("io_uring_setup", libc::SYS_io_uring_setup),
            ("clone3", libc::SYS_clone3),
            ("set_mempolicy_home_node", libc::SYS_set_mempolicy_home_node),
        ] {
            let table = DOCKER_REFUSED
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, n)| *n);
            assert_eq!(table, Some(number), "{name}");
        }
    }

    #[test]
    fn the_filters_build() {
        for sockets in [Sockets::Any, Sockets::NoUnix, Sockets::None] {
            for deny_list in [false, true] {
                seccomp_filters(deny_list, sockets).expect("builds");
            }
        }
    }
}

/// A per-runtime work directory: the child's current directory, removed with the runtime.
///
/// The host holds a lock on it while it lives, so that a host killed before it could remove
/// its own (SIGKILL, a crash, the machine's memory killer) leaves a directory the next host
/// can tell is nobody's: [`WorkDir::create`] sweeps those once a process. A lock, not a pid,
/// because a host in another pid namespace may share the temporary directory.
#[derive(Debug)]
pub(crate) struct WorkDir {
    path: PathBuf,
    /// The directory, opened: a branch's directory is made through it, whatever a cell has
    /// done to the names on the path since (a link in place of `.cave-branches` is not
    /// followed). A runtime's own is locked (`flock`) until it is dropped; closed on exec, so
    /// children do not hold it.
    held: std::fs::File,
    /// A branch's: its parent's branches directory, opened, and its name there (removed
    /// through them).
    within: Option<(std::fs::File, String)>,
    /// A branch's directory lies inside its parent's, which is kept until the branch's goes.
    parent: Option<std::sync::Arc<WorkDir>>,
}

/// `name` in the directory `dir` is open on, as a path that does not depend on the names
/// above it (`/proc/self/fd/N/name`).
fn beneath(dir: &std::fs::File, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()))
}

/// Opens a directory, refusing a symbolic link in its place.
fn open_directory(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Where a work directory keeps its branches' directories (inside it, so that the sandbox's
/// rule for the first directory covers them).
pub(crate) const BRANCHES_DIR: &str = ".cave-branches";

/// How work directories are named: `cave-kernel-<host pid>-<count>-<nanoseconds>`.
const WORK_DIR_PREFIX: &str = "cave-kernel-";

/// A directory younger than this is never swept: its host may be between creating and
/// locking it.
const UNLOCKED_FOR: std::time::Duration = std::time::Duration::from_secs(60);

impl WorkDir {
    /// A fresh directory under the system's temporary directory.
    pub(crate) fn create() -> std::io::Result<WorkDir> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        static SWEPT: std::sync::Once = std::sync::Once::new();
        let temp = std::env::temp_dir();
        SWEPT.call_once(|| sweep_work_dirs(&temp, UNLOCKED_FOR));
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = temp.join(format!(
            "{WORK_DIR_PREFIX}{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&path)?;
        let held = std::fs::File::open(&path)?;
        // Where locks are not supported, nobody can take the lock either, so nobody sweeps it.
        let _ = held.try_lock();
        Ok(WorkDir {
            path,
            held,
            within: None,
            parent: None,
        })
    }

    /// An empty directory for a branch of the process working in `parent`: inside it
    /// (beneath [`BRANCHES_DIR`], so that the parent's Landlock rule covers it), made through
    /// the parent's open directory, never through a link a cell put in the way. The branch
    /// copies its parent's files into it itself, inside the sandbox.
    pub(crate) fn branch(parent: &std::sync::Arc<WorkDir>) -> std::io::Result<WorkDir> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        match std::fs::create_dir(beneath(&parent.held, BRANCHES_DIR)) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        let branches = open_directory(&beneath(&parent.held, BRANCHES_DIR)).map_err(|e| {
            std::io::Error::other(format!(
                "{BRANCHES_DIR} in the work directory is not the runtime's directory ({e})"
            ))
        })?;
        // A name a cell made first is skipped.
        let mut tries = 0;
        let name = loop {
            let name = NEXT.fetch_add(1, Ordering::Relaxed).to_string();
            match std::fs::create_dir(beneath(&branches, &name)) {
                Ok(()) => break name,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 64 => {
                    tries += 1;
                }
                Err(e) => return Err(e),
            }
        };
        let held = open_directory(&beneath(&branches, &name))?;
        Ok(WorkDir {
            path: parent.path.join(BRANCHES_DIR).join(&name),
            held,
            within: Some((branches, name)),
            parent: Some(parent.clone()),
        })
    }

    /// The directory of the runtime the branches descend from: made by the host outside any
    /// sandbox, so no cell can put a link on its path.
    pub(crate) fn root(&self) -> &Path {
        match &self.parent {
            Some(parent) => parent.root(),
            None => &self.path,
        }
    }

    /// Its path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// Removes the work directories in `parent` that no host holds and that are older than
/// `unlocked_for`: those of hosts killed before they could remove their own.
fn sweep_work_dirs(parent: &Path, unlocked_for: std::time::Duration) {
    for (path, rest) in crate::stale::stale_entries(parent, WORK_DIR_PREFIX, unlocked_for) {
        // PID-N-NANOS: a runtime's, not another of our directories with the same prefix.
        let parts: Vec<&str> = rest.split('-').collect();
        let ours = parts.len() == 3
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if !ours || !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        // Held while it is removed, so that nobody takes it meanwhile.
        let Ok(dir) = std::fs::File::open(&path) else {
            continue;
        };
        if dir.try_lock().is_ok() {
            tracing::info!(dir = %path.display(), "removing the work directory of a host that is gone");
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        // A branch's through its parent's open branches directory: a link a cell put on the
        // path is not followed (and `remove_dir_all` follows none below).
        let _ = match &self.within {
            Some((branches, name)) => std::fs::remove_dir_all(beneath(branches, name)),
            None => std::fs::remove_dir_all(&self.path),
        };
    }
}

#[cfg(test)]
mod work_dir_tests {
    use super::*;

    /// An old work directory nobody holds is removed; a held one, a recent one, and anything
    /// not named as ours stay.
    #[test]
    fn only_old_work_directories_nobody_holds_are_swept() {
        let parent = cave_testing::TestDir::new("work-sweep");
        let gone = parent.join(format!("{WORK_DIR_PREFIX}4194305-0-1"));
        let held = parent.join(format!("{WORK_DIR_PREFIX}4194305-1-1"));
        let recent = parent.join(format!("{WORK_DIR_PREFIX}4194305-2-1"));
        let foreign = parent.join(format!("{WORK_DIR_PREFIX}py-4194305"));
        for dir in [&gone, &held, &recent, &foreign] {
            std::fs::create_dir(dir).unwrap();
        }
        std::fs::write(gone.join("left.csv"), "a,b\n").unwrap();
        let holder = std::fs::File::open(&held).unwrap();
        holder.try_lock().unwrap();
        crate::stale::testing::backdate(&[&gone, &held, &foreign]);
        sweep_work_dirs(&parent, UNLOCKED_FOR);
        assert!(!gone.exists(), "an old directory nobody holds");
        assert!(held.exists(), "a host holds it");
        assert!(recent.exists(), "too recent to be sure");
        assert!(foreign.exists(), "not named as ours");
        drop(holder);
    }

    /// A runtime's directory is held while it lives and removed when it is dropped.
    #[test]
    fn a_work_directory_is_held_until_dropped() {
        let dir = WorkDir::create().unwrap();
        let path = dir.path().to_owned();
        let other = std::fs::File::open(&path).unwrap();
        assert!(other.try_lock().is_err(), "held by its runtime");
        drop(dir);
        assert!(!path.exists());
    }
}

//! Branches of a child worker: a copy-on-write copy of its serving process, made a worker of
//! its own.
//!
//! The host makes what the branch needs (a socket pair, a hand-over socket for its own
//! branches, an output shadow, a stderr pipe, a status pipe, a control group with the same
//! limits, a copy of the work directory) and passes the child's ends to the worker over its
//! hand-over socket (`SCM_RIGHTS`) just before the `fork` request. The worker forks the
//! branch's *keeper*, a session of its own; the host moves the keeper into the branch's
//! control group and says go; the keeper forks the branch's worker (born in the group), tells
//! the host its pid on the status pipe, and later its wait status (the host cannot wait for a
//! process that is not its child). See `_fork` in `cave_kernel.py`.

use super::end::{LastWords, Shadow};
use super::{ChildLink, ChildTransport, Interpreter};
use crate::KernelError;
use crate::cgroup::{ChildGroup, Wanted};
use crate::config::KernelConfig;
use crate::link::{Copies, PreparedBranch, Started, Transport};
use crate::sandbox::{Layer, WorkDir};
use async_trait::async_trait;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::watch;

/// A branch prepared: the host's ends of what its processes will hold.
pub(crate) struct Branch {
    socket: UnixStream,
    handover: UnixStream,
    shadow: Shadow,
    stderr: OwnedFd,
    status: OwnedFd,
    group: Option<Arc<ChildGroup>>,
    own_dir: Option<Arc<WorkDir>>,
    /// The parent's directory, whose files the branch copies into its own.
    copied_from: Option<PathBuf>,
    spool_dir: PathBuf,
    config: Arc<KernelConfig>,
    interpreter: Interpreter,
    limits: crate::Limits,
    enforcement: Vec<String>,
    sandbox: Vec<Layer>,
    proxy: Option<Arc<super::egress::ProxyTask>>,
}

impl std::fmt::Debug for Branch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Branch")
            .field("dir", &self.own_dir.as_ref().map(|d| d.path().to_owned()))
            .finish_non_exhaustive()
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> KernelError {
    KernelError::Fork {
        message: format!("the branch could not be made: {what}: {e}"),
    }
}

/// A pipe whose ends are closed on `exec`: (read, write).
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors, owned from here on.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both are new descriptors nobody else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends `fds` over `socket` with one byte, as `SCM_RIGHTS`.
fn send_fds(socket: &UnixStream, fds: &[RawFd]) -> std::io::Result<()> {
    let byte = [b'f'];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    let data_len = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = unsafe { libc::CMSG_SPACE(data_len) } as usize;
    // u64s: a control buffer aligned for `cmsghdr`.
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: a zeroed msghdr is a valid empty one; it is filled below.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = space as _;
    // SAFETY: the control buffer holds one header and `fds`, as CMSG_SPACE sized it; the
    // pointers are into it and live through `sendmsg`.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(data_len) as _;
        std::ptr::copy_nonoverlapping(
            fds.as_ptr(),
            libc::CMSG_DATA(header).cast::<RawFd>(),
            fds.len(),
        );
        if libc::sendmsg(socket.as_raw_fd(), &message, libc::MSG_NOSIGNAL) != 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl Branch {
    /// Makes what a branch of `parent` needs and hands the worker its ends (on the parent's
    /// hand-over socket), for the `fork` request that follows.
    pub(super) fn prepare(parent: &ChildLink) -> Result<Self, KernelError> {
        let (socket, socket_child) = UnixStream::pair().map_err(|e| failed("a socket", e))?;
        let (handover, handover_child) = UnixStream::pair().map_err(|e| failed("a socket", e))?;
        let shadow = Shadow::create().map_err(|e| failed("a memory file", e))?;
        let (stderr, stderr_child) = pipe().map_err(|e| failed("a pipe", e))?;
        let (status, status_child) = pipe().map_err(|e| failed("a pipe", e))?;
        // A branch is held as its parent is: a group of its own with the same limits where the
        // parent has one (never less contained than the parent).
        let group = match &parent.group {
            Some(_) => Some(Arc::new(
                ChildGroup::create(Wanted {
                    memory: parent.limits.memory,
                    processes: parent.limits.processes,
                })
                .map_err(|e| failed("a control group", e))?,
            )),
            None => None,
        };
        let members = group
            .as_ref()
            .map(|g| std::fs::File::open(g.members()))
            .transpose()
            .map_err(|e| failed("the control group's member list", e))?;
        let own_dir = parent
            .own_dir
            .as_ref()
            .map(|dir| WorkDir::branch(dir).map(Arc::new))
            .transpose()
            .map_err(|e| failed("a copy of the work directory", e))?;
        // The host writes a cell's whole output there for the branch to read: the family's
        // root, on whose path no cell can put a link (the branch's own lies beneath names a
        // cell could replace).
        let spool_dir = own_dir
            .as_ref()
            .map_or_else(|| parent.spool_dir.clone(), |d| d.root().to_owned());
        let mut fds = vec![
            socket_child.as_raw_fd(),
            handover_child.as_raw_fd(),
            shadow.fd.as_raw_fd(),
            stderr_child.as_raw_fd(),
            status_child.as_raw_fd(),
        ];
        fds.extend(members.as_ref().map(AsRawFd::as_raw_fd));
        send_fds(&parent.handover, &fds).map_err(|e| failed("handing over its descriptors", e))?;
        // The parent's report, its first line (how processes end with the session) said anew.
        let mut enforcement = vec![crate::containment::describe(group.is_some())];
        enforcement.extend(parent.enforcement.iter().skip(1).cloned());
        Ok(Self {
            socket,
            handover,
            shadow,
            stderr,
            status,
            group,
            copied_from: parent.own_dir.as_ref().map(|d| d.path().to_owned()),
            own_dir,
            spool_dir,
            config: parent.config.clone(),
            interpreter: parent.interpreter.clone(),
            limits: parent.limits.clone(),
            enforcement,
            sandbox: parent.sandbox.clone(),
            proxy: parent.proxy.clone(),
        })
    }
}

#[async_trait]
impl PreparedBranch for Branch {
    fn dir(&self) -> Option<(&std::path::Path, &std::path::Path)> {
        let dir = self.own_dir.as_deref()?;
        Some((dir.path(), self.copied_from.as_deref()?))
    }

    /// Into its control group, go, and the worker's pid from the keeper.
    async fn launch(
        self: Box<Self>,
        keeper: i32,
        start_timeout: std::time::Duration,
    ) -> Result<(Started, Box<dyn Transport>), KernelError> {
        let this = *self;
        crate::containment::branch_started(keeper);
        let kill_keeper = || {
            crate::containment::branch_ended(keeper);
            // SAFETY: a signal to the branch's session, which the keeper leads.
            unsafe {
                libc::kill(-keeper, libc::SIGKILL);
                libc::kill(keeper, libc::SIGKILL);
            }
        };
        if let Some(group) = &this.group
            && let Err(e) = group.join(keeper)
        {
            kill_keeper();
            return Err(failed("joining its control group", e));
        }
        if let Err(e) = (&this.handover).write_all(b"g") {
            kill_keeper();
            return Err(failed("starting it", e));
        }
        let (exit_tx, exit) = watch::channel(None);
        let (ended_tx, ended) = watch::channel(false);
        let (pid_tx, pid_rx) = tokio::sync::oneshot::channel();
        let group = this.group.clone();
        let status = this.status;
        std::thread::Builder::new()
            .name("cave-kernel-branch".to_owned())
            .spawn(move || {
                let mut status = std::fs::File::from(status);
                let mut word = [0u8; 4];
                let pid = status
                    .read_exact(&mut word)
                    .ok()
                    .map(|()| i32::from_le_bytes(word));
                let _ = pid_tx.send(pid);
                let ended = pid
                    .and_then(|_| status.read_exact(&mut word).ok())
                    .map(|()| std::process::ExitStatus::from_raw(i32::from_le_bytes(word)));
                // What is left of the branch goes too.
                // SAFETY: a signal to the branch's session.
                unsafe {
                    libc::kill(-keeper, libc::SIGKILL);
                }
                if let Some(group) = &group {
                    group.kill_all();
                }
                crate::containment::branch_ended(keeper);
                let _ = exit_tx.send(Some(ended));
                let _ = ended_tx.send(true);
            })
            .map_err(|e| failed("a thread", e))?;
        let worker = match tokio::time::timeout(start_timeout, pid_rx).await {
            Ok(Ok(Some(pid))) => pid,
            _ => {
                kill_keeper();
                return Err(KernelError::Fork {
                    message: "the branch's worker did not start".to_owned(),
                });
            }
        };
        let last_words = Arc::new(LastWords::default());
        last_words.clone().keep(this.stderr);
        let transport = ChildTransport::for_branch(
            this.config.clone(),
            this.interpreter.clone(),
            this.own_dir.clone(),
        );
        let what = format!("a branch of {}", this.interpreter.executable.display());
        let link = ChildLink {
            copies: Copies::new(worker),
            pgid: keeper,
            group: this.group,
            exit,
            last_words,
            shadow: this.shadow,
            enforcement: this.enforcement,
            limits: this.limits,
            sandbox: this.sandbox,
            spool_dir: this.spool_dir,
            own_dir: this.own_dir,
            handover: this.handover,
            config: this.config,
            interpreter: this.interpreter,
            proxy: this.proxy,
        };
        Ok((
            Started {
                link: Box::new(link),
                socket: this.socket,
                ended,
                what,
                has_sources: true,
                precompiled: None,
            },
            Box::new(transport),
        ))
    }
}

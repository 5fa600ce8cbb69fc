//! The host's side of a child's egress: the listener the child made in its own network
//! namespace, received over the hand-over socket (or the host's own on its loopback, where
//! there are no namespaces), served by the session's `EgressProxy`.

use crate::KernelError;
use cave_egress::{EgressObserver, EgressProxy, EgressRecord};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The proxy serving one child's listener; it stops when the last link holding it goes (a
/// branch holds its parent's: it shares the namespace).
#[derive(Debug)]
pub(crate) struct ProxyTask {
    task: tokio::task::JoinHandle<()>,
    /// What was served on this listener, for the cells' accounts.
    log: Arc<ConnectionLog>,
}

impl Drop for ProxyTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ProxyTask {
    /// The connections that ended since the last call, once those of clients still connected
    /// have ended too, or none has for [`QUIET`], or after [`SETTLE`] in all (later ones go to
    /// the next account): a cell's client has closed its connection by the cell's end, but
    /// the proxy may not yet have told it; one the cell keeps open costs `QUIET`.
    pub(crate) async fn connections(&self) -> cave_core::Connections {
        let deadline = tokio::time::Instant::now() + SETTLE;
        loop {
            let notified = self.log.changed.notified();
            if self.log.open.load(Ordering::SeqCst) == 0 {
                break;
            }
            let until = deadline.min(tokio::time::Instant::now() + QUIET);
            if tokio::time::timeout_at(until, notified).await.is_err() {
                break;
            }
        }
        let mut account = cave_core::lock(&self.log.account);
        let list = std::mem::take(&mut account.list);
        let omitted = std::mem::take(&mut account.omitted);
        cave_core::Connections::new(list, omitted)
    }
}

/// How long a cell's end waits, at most, for the proxy to tell the connections of clients
/// still open.
const SETTLE: Duration = Duration::from_millis(100);

/// How long a cell's end waits for the next client to be done before it stops waiting.
const QUIET: Duration = Duration::from_millis(20);

/// The most connections one account lists; more are counted.
const MOST_LISTED: usize = 10_000;

/// One listener's connections, until a cell's end takes them.
#[derive(Debug, Default)]
struct ConnectionLog {
    account: std::sync::Mutex<cave_core::Connections>,
    /// Clients connected and not yet done.
    open: AtomicUsize,
    changed: tokio::sync::Notify,
}

impl EgressObserver for ConnectionLog {
    fn connection(&self, record: &EgressRecord) {
        let mut account = cave_core::lock(&self.account);
        if account.list.len() < MOST_LISTED {
            let mut connection =
                cave_core::Connection::new(record.host.clone(), record.port, record.allowed);
            connection.address = record.address.map(|a| a.to_string());
            connection.reason = record.reason.clone();
            connection.sent = record.sent;
            connection.received = record.received;
            account.list.push(connection);
        } else {
            account.omitted += 1;
        }
    }

    fn client_opened(&self) {
        self.open.fetch_add(1, Ordering::SeqCst);
    }

    fn client_closed(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }
}

/// Logs every connection, and tells the configuration's observer (an audit trail).
pub(crate) struct Logged(Option<Arc<dyn EgressObserver>>);

impl EgressObserver for Logged {
    fn connection(&self, record: &EgressRecord) {
        if let Some(observer) = &self.0 {
            observer.connection(record);
        }
        if record.allowed {
            tracing::info!(host = %record.host, port = record.port, address = ?record.address, sent = record.sent, received = record.received, "egress");
        } else {
            tracing::warn!(host = %record.host, port = record.port, reason = record.reason.as_deref().unwrap_or(""), "egress refused");
        }
    }
}

/// The session's proxy for `config`'s sandbox, when it lets the child reach some hosts.
pub(crate) fn proxy_for(config: &crate::KernelConfig) -> Option<EgressProxy> {
    let sandbox = config.sandbox_in_force();
    (sandbox.network && !sandbox.allow_net.is_empty()).then(|| {
        EgressProxy::new(sandbox.allow_net.clone())
            .max_download(sandbox.max_egress)
            .observer(Arc::new(Logged(config.egress_observer.clone())))
    })
}

/// Receives the listener the child sent on `handover` (within `timeout`) and serves `proxy`
/// on it.
pub(crate) async fn serve_child_listener(
    handover: &UnixStream,
    proxy: &EgressProxy,
    timeout: Duration,
) -> Result<ProxyTask, KernelError> {
    let failed = |what: String| KernelError::Start {
        message: format!("the egress proxy could not start: {what}"),
    };
    let socket = handover.try_clone().map_err(|e| failed(e.to_string()))?;
    let listener = tokio::task::spawn_blocking(move || {
        socket.set_read_timeout(Some(timeout))?;
        let received = receive_fd(&socket);
        socket.set_read_timeout(None)?;
        received
    })
    .await
    .map_err(|e| failed(e.to_string()))?
    .map_err(|e| failed(format!("the child's listener did not arrive ({e})")))?;
    serve(std::net::TcpListener::from(listener), proxy)
}

/// Serves `proxy` on `listener` (the child's, or the host's own on its loopback).
pub(crate) fn serve(
    listener: std::net::TcpListener,
    proxy: &EgressProxy,
) -> Result<ProxyTask, KernelError> {
    let failed = |e: std::io::Error| KernelError::Start {
        message: format!("the egress proxy could not start: {e}"),
    };
    listener.set_nonblocking(true).map_err(failed)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(failed)?;
    let log = Arc::new(ConnectionLog::default());
    let proxy = proxy.observed_by(log.clone());
    Ok(ProxyTask {
        task: tokio::spawn(async move {
            proxy.serve(listener).await;
        }),
        log,
    })
}

/// One descriptor sent with one byte (`SCM_RIGHTS`).
fn receive_fd(socket: &UnixStream) -> std::io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut space = [0u64; 4];
    // SAFETY: a zeroed msghdr filled with pointers into this frame, which live through the
    // call; the descriptor read from the control data is a new one this process owns.
    unsafe {
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = space.as_mut_ptr().cast();
        message.msg_controllen = std::mem::size_of_val(&space) as _;
        let read = libc::recvmsg(socket.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC);
        if read < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let header = libc::CMSG_FIRSTHDR(&message);
        if read == 0
            || header.is_null()
            || (*header).cmsg_level != libc::SOL_SOCKET
            || (*header).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(std::io::Error::other("no descriptor came"));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<i32>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

//! The host's side of a child's egress: the listener the child made in its own network
//! namespace, received over the hand-over socket, served by the session's `EgressProxy`.

use crate::KernelError;
use cave_egress::{EgressObserver, EgressProxy, EgressRecord};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

/// The proxy serving one child's listener; it stops when the last link holding it goes (a
/// branch holds its parent's: it shares the namespace).
#[derive(Debug)]
pub(crate) struct ProxyTask(tokio::task::JoinHandle<()>);

impl Drop for ProxyTask {
    fn drop(&mut self) {
        self.0.abort();
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
    let listener = std::net::TcpListener::from(listener);
    listener
        .set_nonblocking(true)
        .map_err(|e| failed(e.to_string()))?;
    let listener =
        tokio::net::TcpListener::from_std(listener).map_err(|e| failed(e.to_string()))?;
    let proxy = proxy.clone();
    Ok(ProxyTask(tokio::spawn(async move {
        proxy.serve(listener).await;
    })))
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

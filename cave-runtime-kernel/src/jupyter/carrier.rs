//! Carrying frames between the host's local socket and the kernel's channels WebSocket: the
//! I/O around [`Bridge`], and opening the WebSocket (again, once, when it is lost).

use super::JupyterConfig;
use super::bridge::{Bridge, End, message_size};
use super::websocket::{FromKernel, ToKernel};
use futures_util::{SinkExt as _, StreamExt as _};
use jupyter_protocol::JupyterMessage;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

/// Carries frames between `local` and the kernel's channels until either side ends; why it
/// ended.
pub(super) async fn carry(
    mut bridge: Bridge,
    mut socket: KernelSocket,
    local: tokio::net::UnixStream,
    bootstrap: JupyterMessage,
    in_transit: &AtomicU64,
) -> End {
    if let Err(e) = socket.to_kernel.send(bootstrap).await {
        return End::Bootstrap(e.to_string());
    }
    let (mut local_read, mut local_write) = local.into_split();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let step = bridge.tick(Instant::now());
        for message in bridge.take_for_kernel() {
            socket.send(message).await;
        }
        // Counted until the next step, after they are in the socket: counted twice for a
        // moment rather than not at all.
        in_transit.store(bridge.holding() as u64, Ordering::SeqCst);
        let to_host = bridge.take_for_host();
        if !to_host.is_empty()
            && let Err(e) = local_write.write_all(&to_host).await
        {
            return End::LocalSocket(e.to_string());
        }
        if let Err(end) = step {
            return end;
        }
        let deadline = bridge.deadline();
        let step = tokio::select! {
            read = local_read.read(&mut buffer), if bridge.reads_host() => match read {
                Ok(0) | Err(_) => bridge.host_closed(Instant::now()),
                Ok(n) => {
                    bridge.host_wrote(&buffer[..n]);
                    Ok(())
                }
            },
            message = socket.from_kernel.next() => match message {
                Some(Ok(message)) => bridge.kernel_sent(message, Instant::now()),
                lost => {
                    let cause = match lost {
                        Some(Err(e)) => e.to_string(),
                        _ => "the server closed it".to_owned(),
                    };
                    match socket.reopen(cause).await {
                        Ok(resend) if resend.is_empty() => {
                            if let Some(again) = bridge.last_answer_again() {
                                socket.send(again).await;
                            }
                            Ok(())
                        }
                        Ok(resend) => {
                            for message in resend {
                                socket.send(message).await;
                            }
                            Ok(())
                        }
                        Err(end) => Err(end),
                    }
                }
            },
            () = async {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            } => Ok(()),
        };
        in_transit.store(bridge.holding() as u64, Ordering::SeqCst);
        if let Err(end) = step {
            return end;
        }
    }
}

/// The kernel's channels WebSocket: messages that could not be sent are kept for when it is
/// open again, and it is opened again once.
pub(super) struct KernelSocket {
    to_kernel: ToKernel,
    from_kernel: FromKernel,
    config: JupyterConfig,
    kernel_id: String,
    session: String,
    reopened: bool,
    unsent: Vec<JupyterMessage>,
    /// The largest message sent: a server closes the socket on one past its size limit.
    largest_sent: usize,
}

impl KernelSocket {
    /// Opens the channels of `kernel_id` for `session`.
    pub(super) async fn open(
        config: &JupyterConfig,
        kernel_id: &str,
        session: String,
    ) -> Result<Self, String> {
        let (to_kernel, from_kernel) = super::websocket::open(config, kernel_id, &session).await?;
        Ok(Self {
            to_kernel,
            from_kernel,
            config: config.clone(),
            kernel_id: kernel_id.to_owned(),
            session,
            reopened: false,
            unsent: Vec::new(),
            largest_sent: 0,
        })
    }

    /// Sends a message, or keeps it for when the socket is open again.
    async fn send(&mut self, message: JupyterMessage) {
        self.largest_sent = self.largest_sent.max(message_size(&message));
        if let Err(error) = self.to_kernel.send(message.clone()).await {
            tracing::warn!(%error, "a message to the kernel could not be sent; kept");
            self.unsent.push(message);
        }
    }

    /// Opens the socket again after it was lost (`cause`), once; the messages that could not
    /// be sent, to send now.
    async fn reopen(&mut self, cause: String) -> Result<Vec<JupyterMessage>, End> {
        if self.reopened {
            return Err(End::SocketLost {
                cause,
                reopen_failed: None,
                largest_sent: self.largest_sent,
            });
        }
        self.reopened = true;
        tracing::warn!(%cause, "the WebSocket to the Jupyter server was lost; reopening it");
        (self.to_kernel, self.from_kernel) =
            super::websocket::open(&self.config, &self.kernel_id, &self.session)
                .await
                .map_err(|why| End::SocketLost {
                    cause,
                    reopen_failed: Some(why),
                    largest_sent: self.largest_sent,
                })?;
        Ok(std::mem::take(&mut self.unsent))
    }
}

/// A session id unique to this link (what the server keys replays on).
pub(super) fn session_id() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "cave-{}-{nanos:x}-{}",
        std::process::id(),
        COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

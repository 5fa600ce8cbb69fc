//! The kernel's channels WebSocket in Jupyter's JSON protocol, where each message names its
//! channel (the binary v1 protocol sends every message but control ones on the shell channel,
//! so an `input_reply` would never reach the kernel's stdin channel), over a TCP connection
//! that acknowledges what it reads at once.

use super::JupyterConfig;
use async_tungstenite::WebSocketStream;
use async_tungstenite::tokio::{ClientStream, client_async_tls_with_connector_and_config};
use async_tungstenite::tungstenite::Message;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{Sink, Stream, StreamExt as _};
use jupyter_protocol::JupyterMessage;
use std::os::fd::AsRawFd as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The half of the channels that sends.
pub(super) type ToKernel = SplitSink<Channels, JupyterMessage>;
/// The half of the channels that receives.
pub(super) type FromKernel = SplitStream<Channels>;

/// Opens the channels of `kernel_id` for `session` (which lets the server keep what the kernel
/// sends while the socket is down, and replay it when the same session reconnects).
pub(super) async fn open(
    config: &JupyterConfig,
    kernel_id: &str,
    session: &str,
) -> Result<(ToKernel, FromKernel), String> {
    use async_tungstenite::tungstenite::client::IntoClientRequest as _;
    let base = config
        .url
        .replacen("https://", "wss://", 1)
        .replacen("http://", "ws://", 1);
    let mut url = format!("{base}/api/kernels/{kernel_id}/channels?session_id={session}");
    if let Some(token) = &config.token {
        url.push_str("&token=");
        url.push_str(token);
    }
    let request = url.into_client_request().map_err(|e| {
        // The URL holds the token: say what is wrong without it.
        format!(
            "not a WebSocket URL ({})",
            e.to_string()
                .replace(config.token.as_deref().unwrap_or("\u{0}"), "[token]")
        )
    })?;
    // wss: the platform's certificate store, as for the model's HTTPS, and the CA certificates
    // the configuration adds.
    let connector = if base.starts_with("wss://") {
        Some(tokio_rustls::TlsConnector::from(
            super::gateway::tls_config(config).map_err(|e| e.to_string())?,
        ))
    } else {
        None
    };
    // `[::1]` in a URI is `::1` to connect to.
    let host = request.uri().host().unwrap_or_default();
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = request
        .uri()
        .port_u16()
        .unwrap_or(if connector.is_some() { 443 } else { 80 });
    let stream = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("could not connect to {host}:{port}: {e}"))?;
    // Each side's small messages are awaited by the other: no Nagle on ours.
    let _ = stream.set_nodelay(true);
    let (inner, _response) =
        client_async_tls_with_connector_and_config(request, QuickAck(stream), connector, None)
            .await
            .map_err(|e| e.to_string())?;
    Ok(Channels(inner).split())
}

/// A TCP stream that acknowledges what it read at once. A Jupyter server writes a kernel's
/// messages one by one, usually with Nagle's algorithm on (Tornado's default), so its second
/// small message waits for the acknowledgement of the first; Linux delays that by up to 40 ms
/// in an exchange of small messages, which made every cell that printed 45 ms slower.
/// `TCP_QUICKACK` is not sticky, so it is set again after each read.
pub(super) struct QuickAck(TcpStream);

impl AsyncRead for QuickAck {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.0).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let on: libc::c_int = 1;
            // SAFETY: a valid socket descriptor and a c_int option of the right size. A
            // failure only costs the delay this avoids.
            unsafe {
                libc::setsockopt(
                    self.0.as_raw_fd(),
                    libc::IPPROTO_TCP,
                    libc::TCP_QUICKACK,
                    (&raw const on).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
        read
    }
}

impl AsyncWrite for QuickAck {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Jupyter messages over the WebSocket, as JSON text.
pub(super) struct Channels(WebSocketStream<ClientStream<QuickAck>>);

impl Stream for Channels {
    type Item = Result<JupyterMessage, String>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            let message = match self.0.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) | Poll::Ready(Some(Ok(Message::Close(_)))) => {
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.to_string()))),
                Poll::Ready(Some(Ok(message))) => message,
            };
            let Message::Text(text) = &message else {
                // Binary messages carry buffers (a widget's), which the worker never sends;
                // pings are answered by tungstenite.
                continue;
            };
            let parsed = serde_json::from_str(text)
                .map_err(|e| e.to_string())
                .and_then(|value| JupyterMessage::from_value(value).map_err(|e| e.to_string()));
            match parsed {
                Ok(message) => return Poll::Ready(Some(Ok(message))),
                // A message of a kind this version does not know is not the worker's.
                Err(error) => tracing::debug!(%error, "a message from the kernel skipped"),
            }
        }
    }
}

impl Sink<JupyterMessage> for Channels {
    type Error = String;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), String>> {
        Pin::new(&mut self.0)
            .poll_ready(cx)
            .map_err(|e| e.to_string())
    }

    fn start_send(mut self: Pin<&mut Self>, message: JupyterMessage) -> Result<(), String> {
        let text = serde_json::to_string(&message)
            .map_err(|e| format!("a message that cannot be sent as JSON: {e}"))?;
        Pin::new(&mut self.0)
            .start_send(Message::Text(text.into()))
            .map_err(|e| e.to_string())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), String>> {
        Pin::new(&mut self.0)
            .poll_flush(cx)
            .map_err(|e| e.to_string())
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), String>> {
        Pin::new(&mut self.0)
            .poll_close(cx)
            .map_err(|e| e.to_string())
    }
}

//! The session over streamable HTTP: on a loopback address only, every request carrying the
//! session's bearer token, browsers' cross-site requests refused.

use super::SessionServer;
use crate::McpError;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cave_core::CancellationToken;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use std::io::Read as _;
use std::net::SocketAddr;
use std::sync::Arc;

/// 32 random bytes from the kernel, as 64 hex digits: a bearer token, or the handle of a
/// paused cell.
pub fn generate_token() -> String {
    let mut bytes = [0u8; 32];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)) {
        Ok(()) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
        // Never without randomness: std's hasher keys come from the kernel as well.
        Err(_) => (0..4)
            .map(|i| {
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u64(i);
                format!("{:016x}", h.finish())
            })
            .collect(),
    }
}

/// A session served over HTTP; [`stop`](Self::stop) ends it (dropping it does too, at once).
#[derive(Debug)]
pub struct HttpServing {
    addr: SocketAddr,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl HttpServing {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The MCP endpoint: `http://127.0.0.1:PORT/mcp`.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Stops accepting requests, ends the clients' sessions, and waits for the server to
    /// stop.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for HttpServing {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl SessionServer {
    /// Serves the session at `/mcp` on `listener` (a loopback address: others are refused),
    /// to clients that send `Authorization: Bearer TOKEN`.
    pub fn serve_http(
        self,
        listener: tokio::net::TcpListener,
        token: &str,
    ) -> Result<HttpServing, McpError> {
        let refused = |message: String| McpError::Serve { message };
        let addr = listener
            .local_addr()
            .map_err(|e| refused(format!("the listener has no address: {e}")))?;
        if !addr.ip().is_loopback() {
            return Err(refused(format!(
                "{addr} is not a loopback address: the session is served on this machine only (127.0.0.1 or ::1)"
            )));
        }
        if token.len() < 16 {
            return Err(refused(
                "the token is too short (16 characters at least)".to_owned(),
            ));
        }
        let stop = CancellationToken::new();
        let config = StreamableHttpServerConfig::default()
            .with_cancellation_token(stop.child_token())
            .enforce_origin_validation();
        let handler = self.clone();
        let service = StreamableHttpService::new(
            move || Ok(handler.clone()),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        let token: Arc<str> = Arc::from(token);
        let router = axum::Router::new()
            .route_service("/mcp", service)
            .layer(axum::middleware::from_fn_with_state(token, bearer));
        let shutdown = stop.clone();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "the MCP HTTP server stopped");
            }
        });
        Ok(HttpServing {
            addr,
            stop,
            task: Some(task),
        })
    }
}

/// Lets through the requests that carry the token.
async fn bearer(State(token): State<Arc<str>>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    if given.is_some_and(|given| same(given.trim().as_bytes(), token.as_bytes())) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "this MCP server needs the token it was started with: Authorization: Bearer TOKEN\n",
    )
        .into_response()
}

/// Compares in time independent of where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_compared_whole() {
        let (a, b) = (generate_token(), generate_token());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert!(same(a.as_bytes(), a.as_bytes()));
        assert!(!same(a.as_bytes(), b.as_bytes()));
        assert!(!same(a.as_bytes(), &a.as_bytes()[..63]));
    }
}

//! The forward proxy a sandboxed worker reaches the network through: HTTP `CONNECT` for TLS
//! (and any stream), plain HTTP forwarded request by request, each destination checked
//! against the allowlist and resolved by the host, every connection accounted for.

use crate::allowlist::{Allowlist, Refusal};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// How many connections the proxy serves at once; more wait to be accepted.
pub const MAX_CONNECTIONS: usize = 256;

/// How long a connection to a destination may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What happened to one connection (or one plain-HTTP request) through the proxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressRecord {
    /// The host asked for (a name or an address).
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// The address connected to, when one was.
    pub address: Option<SocketAddr>,
    /// Whether it was let through.
    pub allowed: bool,
    /// Why it was refused or cut short (the sentence the cell is told).
    pub reason: Option<String>,
    /// Bytes sent to the destination.
    pub sent: u64,
    /// Bytes received from it.
    pub received: u64,
}

/// Told of every connection when it ends (or is refused): the audit trail, the events.
pub trait EgressObserver: Send + Sync {
    /// One connection, allowed or refused.
    fn connection(&self, record: &EgressRecord);
    /// A client connected to the proxy through a handle `observed_by` this observer.
    fn client_opened(&self) {}
    /// That client's connection ended, and every `connection` of its requests was told.
    fn client_closed(&self) {}
}

/// Turns a host name into addresses: the system's resolver by default.
#[async_trait::async_trait]
pub trait Resolver: Send + Sync {
    /// The addresses of `host` on `port`, or why there are none.
    async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, String>;
}

/// The system's resolver (`getaddrinfo`, on a blocking thread).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

#[async_trait::async_trait]
impl Resolver for SystemResolver {
    async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        tokio::net::lookup_host((host, port))
            .await
            .map(Iterator::collect)
            .map_err(|e| e.to_string())
    }
}

/// A forward proxy that lets through what its [`Allowlist`] lists.
#[derive(Clone)]
pub struct EgressProxy {
    shared: Arc<Shared>,
    /// Told too, of the connections served through this handle only (see
    /// [`observed_by`](EgressProxy::observed_by)).
    local: Option<Arc<dyn EgressObserver>>,
    /// Held by everything serving one client, so that `local` hears when all of it is done.
    client: Option<Arc<Client>>,
}

/// One client of a handle with a local observer: told closed when the last holder goes (the
/// connection, and the tasks that report its tunnels and requests).
struct Client(Arc<dyn EgressObserver>);

impl Drop for Client {
    fn drop(&mut self) {
        self.0.client_closed();
    }
}

struct Shared {
    allowlist: Allowlist,
    resolver: Arc<dyn Resolver>,
    observer: Option<Arc<dyn EgressObserver>>,
    max_download: Option<u64>,
    downloaded: AtomicU64,
    uploaded: AtomicU64,
    permits: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for EgressProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressProxy")
            .field("allowlist", &self.shared.allowlist.entries())
            .field("max_download", &self.shared.max_download)
            .field("downloaded", &self.downloaded())
            .finish_non_exhaustive()
    }
}

type Body = BoxBody<Bytes, hyper::Error>;

fn text(message: impl Into<Bytes>) -> Body {
    Full::new(message.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A refusal as the client sees it: status 403 (or 502), the reason in the status line (what
/// Python's clients put in their exception) and in the body.
fn refused(status: StatusCode, reason: &str) -> Response<Body> {
    let mut response = Response::new(text(format!("{reason}\n")));
    *response.status_mut() = status;
    // A refused client gets nothing more on this connection.
    response.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    // A reason phrase is printable ASCII; ours are, and a stray byte is replaced.
    let phrase: String = reason
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect();
    if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(phrase.into_bytes()) {
        response.extensions_mut().insert(phrase);
    }
    response
}

impl EgressProxy {
    /// A proxy for `allowlist`, with the system's resolver, no download limit and no observer.
    pub fn new(allowlist: Allowlist) -> Self {
        Self {
            shared: Arc::new(Shared {
                allowlist,
                resolver: Arc::new(SystemResolver),
                observer: None,
                max_download: None,
                downloaded: AtomicU64::new(0),
                uploaded: AtomicU64::new(0),
                permits: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
            }),
            local: None,
            client: None,
        }
    }

    fn configure(mut self, change: impl FnOnce(&mut Shared)) -> Self {
        match Arc::get_mut(&mut self.shared) {
            Some(shared) => change(shared),
            None => tracing::warn!("an egress proxy in use cannot be configured"),
        }
        self
    }

    /// Stops every connection once the session has downloaded `bytes` in all (`None`: no
    /// limit); the connection under way is cut, later ones refused.
    pub fn max_download(self, bytes: Option<u64>) -> Self {
        self.configure(|s| s.max_download = bytes)
    }

    /// Tells `observer` of every connection.
    pub fn observer(self, observer: Arc<dyn EgressObserver>) -> Self {
        self.configure(|s| s.observer = Some(observer))
    }

    /// The same proxy (allowlist, counts, limit, observer), also telling `observer` of what
    /// is served through the handle returned: one listener's own account, say one worker's.
    pub fn observed_by(&self, observer: Arc<dyn EgressObserver>) -> Self {
        Self {
            shared: self.shared.clone(),
            local: Some(observer),
            client: None,
        }
    }

    /// Resolves names with `resolver` instead of the system's.
    pub fn resolver(self, resolver: Arc<dyn Resolver>) -> Self {
        self.configure(|s| s.resolver = resolver)
    }

    /// The allowlist it applies.
    pub fn allowlist(&self) -> &Allowlist {
        &self.shared.allowlist
    }

    /// Bytes received from destinations so far, in all.
    pub fn downloaded(&self) -> u64 {
        self.shared.downloaded.load(Ordering::SeqCst)
    }

    /// Bytes sent to destinations so far, in all.
    pub fn uploaded(&self) -> u64 {
        self.shared.uploaded.load(Ordering::SeqCst)
    }

    /// Serves the connections `listener` accepts until it fails (dropping the task that runs
    /// this ends it). At most [`MAX_CONNECTIONS`] at once: more wait in the listener's queue.
    pub async fn serve(&self, listener: TcpListener) {
        loop {
            let Ok(permit) = self.shared.permits.clone().acquire_owned().await else {
                return;
            };
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) if transient(&error) => {
                    tracing::warn!(%error, "the egress proxy could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(error) => {
                    tracing::warn!(%error, "the egress proxy's listener failed");
                    return;
                }
            };
            let mut proxy = self.clone();
            proxy.client = self.local.clone().map(|local| {
                local.client_opened();
                Arc::new(Client(local))
            });
            tokio::spawn(async move {
                let _permit = permit;
                let service = hyper::service::service_fn(move |request| {
                    let proxy = proxy.clone();
                    async move { Ok::<_, std::convert::Infallible>(proxy.handle(request).await) }
                });
                let served = hyper::server::conn::http1::Builder::new()
                    .preserve_header_case(true)
                    .serve_connection(TokioIo::new(stream), service)
                    .with_upgrades()
                    .await;
                if let Err(error) = served {
                    tracing::debug!(%error, "an egress connection ended with an error");
                }
            });
        }
    }

    fn observe(&self, record: EgressRecord) {
        for observer in self.shared.observer.iter().chain(&self.local) {
            observer.connection(&record);
        }
    }

    /// One request from the worker: a `CONNECT`, or a plain-HTTP request in absolute form.
    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        if request.method() == Method::CONNECT {
            return self.tunnel(request).await;
        }
        self.forward(request).await
    }

    /// Where a request goes, checked: the address to connect to, or the refusal said.
    async fn destination(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, Refusal> {
        if let Some(limit) = self.shared.max_download
            && self.downloaded() >= limit
        {
            return Err(Refusal::Unresolved(format!(
                "the session has downloaded its limit of {limit} bytes (--max-egress)"
            )));
        }
        let literal = self.shared.allowlist.check(host, port)?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if literal {
            let ip: std::net::IpAddr = bare.parse().map_err(|_| Refusal::BadName)?;
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let addresses = self
            .shared
            .resolver
            .resolve(bare, port)
            .await
            .map_err(Refusal::Unresolved)?;
        if addresses.is_empty() {
            return Err(Refusal::Unresolved("no address".to_owned()));
        }
        // Every address must pass: a name that answers one public and one private address is
        // refused (the private one is where a rebinding attack would point).
        if let Some(private) = addresses
            .iter()
            .find(|a| !self.shared.allowlist.allows_address(a.ip(), port))
        {
            return Err(Refusal::PrivateAddress(private.ip()));
        }
        Ok(addresses)
    }

    /// Connects to the first of `addresses` that answers.
    async fn connect(addresses: &[SocketAddr]) -> Result<(TcpStream, SocketAddr), String> {
        let mut last = "no address".to_owned();
        for &address in addresses {
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok((stream, address));
                }
                Ok(Err(e)) => last = format!("{address}: {e}"),
                Err(_) => last = format!("{address}: no answer within {CONNECT_TIMEOUT:?}"),
            }
        }
        Err(last)
    }

    /// A connection to `host:port` if the allowlist lets it through, with its record (to be
    /// completed and reported when it ends); else the refusal, reported already.
    async fn open(
        &self,
        host: String,
        port: u16,
    ) -> Result<(TcpStream, EgressRecord), Response<Body>> {
        let mut record = EgressRecord {
            host,
            port,
            address: None,
            allowed: false,
            reason: None,
            sent: 0,
            received: 0,
        };
        let addresses = match self.destination(&record.host, port).await {
            Ok(addresses) => addresses,
            Err(refusal) => {
                let reason = refusal.explain(&record.host, port);
                record.reason = Some(reason.clone());
                self.observe(record);
                return Err(refused(StatusCode::FORBIDDEN, &reason));
            }
        };
        match Self::connect(&addresses).await {
            Ok((stream, address)) => {
                record.address = Some(address);
                record.allowed = true;
                Ok((stream, record))
            }
            Err(why) => {
                let reason = format!(
                    "the host could not connect to {}:{port}: {why}",
                    record.host
                );
                record.reason = Some(reason.clone());
                self.observe(record);
                Err(refused(StatusCode::BAD_GATEWAY, &reason))
            }
        }
    }

    /// `CONNECT host:port`: checked, connected, answered 200, then bytes both ways.
    async fn tunnel(&self, request: Request<Incoming>) -> Response<Body> {
        let Some((host, port)) = request
            .uri()
            .authority()
            .and_then(|a| Some((a.host().to_owned(), a.port_u16()?)))
        else {
            return refused(
                StatusCode::BAD_REQUEST,
                "the host's proxy takes CONNECT host:port",
            );
        };
        let (upstream, mut record) = match self.open(host, port).await {
            Ok(opened) => opened,
            Err(refusal) => return refusal,
        };
        let proxy = self.clone();
        tokio::spawn(async move {
            let mut upstream = Counted::new(upstream, proxy.shared.clone());
            match hyper::upgrade::on(request).await {
                Ok(upgraded) => {
                    let mut client = TokioIo::new(upgraded);
                    if let Err(error) =
                        tokio::io::copy_bidirectional(&mut client, &mut upstream).await
                    {
                        record.reason = Some(error.to_string());
                    }
                }
                Err(error) => record.reason = Some(error.to_string()),
            }
            record.sent = upstream.sent;
            record.received = upstream.received;
            proxy.observe(record);
        });
        Response::new(text(Bytes::new()))
    }

    /// A plain-HTTP request (`GET http://host/path`): checked and forwarded on a connection of
    /// its own, the response streamed back.
    async fn forward(&self, request: Request<Incoming>) -> Response<Body> {
        let uri = request.uri().clone();
        let (Some("http"), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
            return refused(
                StatusCode::BAD_REQUEST,
                "the host's proxy takes CONNECT host:port, or a request for an http:// URL",
            );
        };
        let host = authority.host().to_owned();
        let port = authority.port_u16().unwrap_or(80);
        // The Host header names the same place as the URL, or the request is refused: a
        // server behind would otherwise be asked for a host that was never checked.
        if let Some(header) = request.headers().get(http::header::HOST) {
            let same = header.to_str().is_ok_and(|h| {
                h.eq_ignore_ascii_case(authority.as_str())
                    || (port == 80 && h.eq_ignore_ascii_case(&host))
            });
            if !same {
                let reason = format!(
                    "the host refused a request for {authority} whose Host header names another host"
                );
                self.observe(EgressRecord {
                    host,
                    port,
                    address: None,
                    allowed: false,
                    reason: Some(reason.clone()),
                    sent: 0,
                    received: 0,
                });
                return refused(StatusCode::FORBIDDEN, &reason);
            }
        }
        let (upstream, mut record) = match self.open(host.clone(), port).await {
            Ok(opened) => opened,
            Err(refusal) => return refusal,
        };
        let upstream = Counted::new(upstream, self.shared.clone());
        let totals = upstream.totals();
        let (mut sender, connection) =
            match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
                Ok(handshake) => handshake,
                Err(error) => {
                    let reason = format!("the host could not speak HTTP to {host}:{port}: {error}");
                    record.reason = Some(reason.clone());
                    self.observe(record);
                    return refused(StatusCode::BAD_GATEWAY, &reason);
                }
            };
        let proxy = self.clone();
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                record.reason = Some(error.to_string());
            }
            record.sent = totals.0.load(Ordering::SeqCst);
            record.received = totals.1.load(Ordering::SeqCst);
            proxy.observe(record);
        });
        let (mut parts, body) = request.into_parts();
        // Origin form for the server; the proxy's own headers stay here.
        parts.uri = uri
            .path_and_query()
            .map_or_else(|| "/".parse(), |p| p.as_str().parse())
            .unwrap_or_default();
        parts.headers.remove("proxy-connection");
        parts.headers.remove(http::header::PROXY_AUTHORIZATION);
        match sender.send_request(Request::from_parts(parts, body)).await {
            Ok(response) => response.map(BodyExt::boxed),
            Err(error) => refused(
                StatusCode::BAD_GATEWAY,
                &format!("the request to {host}:{port} failed: {error}"),
            ),
        }
    }
}

fn transient(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc_errno::EMFILE | libc_errno::ENFILE | libc_errno::ENOBUFS | libc_errno::ENOMEM)
    ) || error.kind() == std::io::ErrorKind::ConnectionAborted
        || error.kind() == std::io::ErrorKind::Interrupted
}

/// The errors `accept` can recover from (descriptors or memory short for a moment).
mod libc_errno {
    pub(super) const ENOMEM: i32 = 12;
    pub(super) const ENFILE: i32 = 23;
    pub(super) const EMFILE: i32 = 24;
    pub(super) const ENOBUFS: i32 = 105;
}

/// A destination's stream, counting bytes each way into the proxy's totals, and failing once
/// the session's download limit is passed.
struct Counted {
    stream: TcpStream,
    shared: Arc<Shared>,
    sent: u64,
    received: u64,
    /// This connection's counts, readable by whoever reports it.
    totals: Arc<(AtomicU64, AtomicU64)>,
}

impl Counted {
    fn new(stream: TcpStream, shared: Arc<Shared>) -> Self {
        Self {
            stream,
            shared,
            sent: 0,
            received: 0,
            totals: Arc::default(),
        }
    }

    fn totals(&self) -> Arc<(AtomicU64, AtomicU64)> {
        self.totals.clone()
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(limit) = self.shared.max_download
            && self.shared.downloaded.load(Ordering::SeqCst) >= limit
        {
            return Poll::Ready(Err(std::io::Error::other(format!(
                "the session has downloaded its limit of {limit} bytes (--max-egress)"
            ))));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        if read > 0 {
            self.received += read;
            self.totals.1.fetch_add(read, Ordering::SeqCst);
            self.shared.downloaded.fetch_add(read, Ordering::SeqCst);
        }
        polled
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = polled {
            self.sent += written as u64;
            self.totals.0.fetch_add(written as u64, Ordering::SeqCst);
            self.shared
                .uploaded
                .fetch_add(written as u64, Ordering::SeqCst);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

//! The Jupyter transport: the kernel runtime's worker inside a Jupyter kernel reached through
//! Jupyter Server, Kernel Gateway or Enterprise Gateway (REST to start, interrupt and shut
//! down kernels; the channels WebSocket for the rest).
//!
//! The worker runs inside one execute request that never ends, and the runtime's frames travel
//! through the kernel's stdin channel: each `input_request` carries the worker's frames in its
//! prompt, each `input_reply` the host's (see `cave_kernel.py`, `_Jupyter`). A bridge task
//! turns that into the same byte stream a child's socket carries, on one end of a local socket
//! pair whose other end the process code reads and writes as for a child: everything above the
//! transport (the registry, restore, host calls, nested calls, output shaping) is shared.

use crate::KernelError;
use crate::marshal::Data;
use base64::Engine as _;
use cave_core::Value;
use futures_util::{SinkExt as _, StreamExt as _};
use jupyter_protocol::{
    Channel, ExecuteRequest, ExecutionState, InputReply, JupyterMessage, JupyterMessageContent,
};
use std::collections::HashMap;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

/// Marks the runtime's own prompts and answers on the stdin channel.
const MARK: &str = "\u{0}cave ";
/// The most bytes of frames one answer carries (base64 makes it a third larger); gateways
/// refuse WebSocket messages past about 10 MiB.
const CHUNK: usize = 4 << 20;
/// The most executions whose IOPub output the bridge counts at once (a session runs a few).
const MAX_COUNTED: usize = 4096;
/// How long a kernel the runtime attached to gets to stop its worker when let go.
const RELEASE_GRACE: Duration = Duration::from_secs(10);
/// How long the bridge waits for a cell's output on IOPub to catch up with its frames.
const OUTPUT_GRACE: Duration = Duration::from_secs(5);
/// The longest the bridge leaves a prompt unanswered: an empty answer tells the worker the
/// host is still there (see [`JupyterConfig::orphan_timeout`]).
const HEARTBEAT: Duration = Duration::from_secs(30);

/// Where the kernel is: a Jupyter Server, Kernel Gateway or Enterprise Gateway, and which
/// kernel to start there or attach to.
#[derive(Clone)]
pub struct JupyterConfig {
    url: String,
    token: Option<String>,
    kernel_name: String,
    kernel_id: Option<String>,
    env: Vec<(String, String)>,
    ca_certificates: Option<Vec<u8>>,
    orphan_timeout: Duration,
}

impl std::fmt::Debug for JupyterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a credential: never shown.
        f.debug_struct("JupyterConfig")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "[set]"))
            .field("kernel_name", &self.kernel_name)
            .field("kernel_id", &self.kernel_id)
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("ca_certificates", &self.ca_certificates.is_some())
            .field("orphan_timeout", &self.orphan_timeout)
            .finish()
    }
}

impl JupyterConfig {
    /// The server at `url` (`http://host:port`, with its base path if it has one), without a
    /// token; starts a `python3` kernel.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into().trim_end_matches('/').to_owned(),
            token: None,
            kernel_name: "python3".to_owned(),
            kernel_id: None,
            env: Vec::new(),
            ca_certificates: None,
            orphan_timeout: Duration::from_secs(600),
        }
    }
    /// The token the server asks for (`cave` reads it from `JUPYTER_TOKEN`).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }
    /// The kernel spec to start (default `python3`).
    pub fn kernel_name(mut self, name: impl Into<String>) -> Self {
        self.kernel_name = name.into();
        self
    }
    /// Adds a variable to the kernel start request's `env`: how Enterprise Gateway is told a
    /// kernel's `KERNEL_USERNAME`, `KERNEL_NAMESPACE`, `KERNEL_IMAGE` and the like.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }
    /// Attaches to the running kernel `id` instead of starting one; it is never shut down by
    /// the runtime.
    pub fn attach(mut self, id: impl Into<String>) -> Self {
        self.kernel_id = Some(id.into());
        self
    }
    /// Also trusts the CA certificates in `pem` (PEM text, one or more), beside the platform's
    /// store, for an `https://` server whose certificate an internal CA signed (`cave`:
    /// `--jupyter-ca FILE`). Checked when the runtime first connects.
    pub fn ca_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_certificates = Some(pem.into());
        self
    }
    /// How long the worker in the kernel waits for a host that stopped answering (its process
    /// died, the network is gone) before it ends, leaving the kernel idle, where the server's
    /// idle culling can reclaim it (default 10 minutes; a live runtime answers every 30 s, or
    /// a quarter of this if less). Without it, such a kernel would stay busy for ever.
    pub fn orphan_timeout(mut self, timeout: Duration) -> Self {
        self.orphan_timeout = timeout.max(Duration::from_millis(100));
        self
    }
    /// How often the runtime tells a waiting worker it is still there.
    fn heartbeat(&self) -> Duration {
        HEARTBEAT.min(self.orphan_timeout / 4)
    }
    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }
    /// Whether the runtime attaches to an existing kernel.
    pub fn attaches(&self) -> bool {
        self.kernel_id.is_some()
    }
}

fn failed(message: impl Into<String>) -> KernelError {
    KernelError::Start {
        message: message.into(),
    }
}

/// The TLS configuration for a server: the platform's certificate store, plus the CA
/// certificates the configuration gives.
fn tls_config(config: &JupyterConfig) -> Result<std::sync::Arc<rustls::ClientConfig>, KernelError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let extra = match &config.ca_certificates {
        None => Vec::new(),
        Some(pem) => {
            let certificates = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    failed(format!(
                        "the CA certificates given (JupyterConfig::ca_certificates, --jupyter-ca) are not readable PEM: {e}"
                    ))
                })?;
            if certificates.is_empty() {
                return Err(failed(
                    "the CA certificates given (JupyterConfig::ca_certificates, --jupyter-ca) hold no certificate: give PEM text with -----BEGIN CERTIFICATE----- blocks",
                ));
            }
            certificates
        }
    };
    let builder = rustls::ClientConfig::builder();
    let verifier = rustls_platform_verifier::Verifier::new_with_extra_roots(
        extra,
        builder.crypto_provider().clone(),
    )
    .map_err(|e| failed(format!("no TLS configuration for {}: {e}", config.url)))?;
    Ok(std::sync::Arc::new(
        builder
            .dangerous()
            .with_custom_certificate_verifier(std::sync::Arc::new(verifier))
            .with_no_client_auth(),
    ))
}

/// The server's REST API.
#[derive(Clone)]
pub(crate) struct Gateway {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    env: serde_json::Map<String, serde_json::Value>,
}

impl Gateway {
    fn new(config: &JupyterConfig) -> Result<Self, KernelError> {
        let http = match &config.ca_certificates {
            None => reqwest::Client::new(),
            Some(_) => reqwest::Client::builder()
                .tls_backend_preconfigured(rustls::ClientConfig::clone(&*tls_config(config)?))
                .build()
                .map_err(|e| failed(format!("no HTTP client for {}: {e}", config.url)))?,
        };
        Ok(Self {
            http,
            base: config.url.clone(),
            token: config.token.clone(),
            env: config
                .env
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect(),
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self
            .http
            .request(method, format!("{}/api/{path}", self.base));
        match &self.token {
            Some(token) => request.header("Authorization", format!("token {token}")),
            None => request,
        }
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<reqwest::Response, KernelError> {
        let response = request
            .send()
            .await
            .map_err(|e| {
                let cause = cave_core::error_chain(&e);
                let hint = if cause.contains("invalid peer certificate") {
                    " (if an internal CA signed the server's certificate, give it: JupyterConfig::ca_certificates, or --jupyter-ca FILE for cave)"
                } else {
                    ""
                };
                failed(format!(
                    "{what}: could not reach {}: {cause}{hint}",
                    self.base
                ))
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.text().await.unwrap_or_default();
        let hint = match status.as_u16() {
            401 | 403 => {
                " (a missing or wrong token: JupyterConfig::token, or JUPYTER_TOKEN for cave)"
            }
            404 => " (no such kernel or kernel spec on this server)",
            _ => "",
        };
        Err(failed(format!(
            "{what}: {} answered {status}{hint}: {}",
            self.base,
            body.chars().take(300).collect::<String>()
        )))
    }

    /// Starts a kernel of spec `name`; its id.
    async fn start(&self, name: &str) -> Result<String, KernelError> {
        let request = self
            .request(reqwest::Method::POST, "kernels")
            .json(&serde_json::json!({ "name": name, "env": self.env }));
        let response = self.send(request, "starting a kernel").await?;
        let kernel: serde_json::Value = response
            .json()
            .await
            .map_err(|e| failed(format!("starting a kernel: an unreadable answer: {e}")))?;
        kernel["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| failed("starting a kernel: the answer had no kernel id"))
    }

    /// Checks that kernel `id` exists.
    async fn check(&self, id: &str) -> Result<(), KernelError> {
        let request = self.request(reqwest::Method::GET, &format!("kernels/{id}"));
        self.send(request, &format!("attaching to kernel {id}"))
            .await
            .map(drop)
    }

    /// Interrupts kernel `id` (what it runs gets `KeyboardInterrupt`).
    pub(crate) async fn interrupt(&self, id: &str) {
        let request = self.request(reqwest::Method::POST, &format!("kernels/{id}/interrupt"));
        if let Err(error) = self.send(request, "interrupting the kernel").await {
            tracing::warn!(%error, "the kernel could not be interrupted");
        }
    }

    /// Restarts kernel `id` (its state is lost).
    pub(crate) async fn restart(&self, id: &str) {
        let request = self.request(reqwest::Method::POST, &format!("kernels/{id}/restart"));
        if let Err(error) = self.send(request, "restarting the kernel").await {
            tracing::warn!(%error, "the kernel could not be restarted");
        }
    }

    /// Shuts kernel `id` down.
    pub(crate) async fn shutdown(&self, id: &str) {
        let request = self.request(reqwest::Method::DELETE, &format!("kernels/{id}"));
        if let Err(error) = self.send(request, "shutting the kernel down").await {
            tracing::warn!(%error, "the kernel could not be shut down");
        }
    }
}

/// One remote kernel serving the runtime: how to interrupt and end it.
pub(crate) struct Remote {
    pub(crate) gateway: Gateway,
    pub(crate) kernel_id: String,
    /// Started by the runtime (shut down with it), or attached to (left running).
    pub(crate) owned: bool,
    /// Why the link ended, once it has.
    pub(crate) ended: watch::Receiver<Option<String>>,
    end: watch::Sender<Option<String>>,
}

impl Remote {
    /// Ends the link; a kernel the runtime started is shut down, one it attached to is left
    /// as it is.
    pub(crate) fn end(&self, reason: &str) {
        let first = self.end.send_if_modified(|ended| {
            if ended.is_none() {
                *ended = Some(reason.to_owned());
                true
            } else {
                false
            }
        });
        if first && self.owned {
            let gateway = self.gateway.clone();
            let id = self.kernel_id.clone();
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move { gateway.shutdown(&id).await });
            }
        }
    }

    /// Stops whatever the kernel runs, however stuck: a kernel the runtime started is shut
    /// down; one it attached to is restarted (its state is lost, the kernel stays).
    pub(crate) fn kill(&self, reason: &str) {
        if !self.owned && self.ended.borrow().is_none() {
            let gateway = self.gateway.clone();
            let id = self.kernel_id.clone();
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move { gateway.restart(&id).await });
            }
        }
        self.end(reason);
    }

    /// Asks the server to interrupt the kernel.
    pub(crate) fn interrupt(&self) {
        let gateway = self.gateway.clone();
        let id = self.kernel_id.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { gateway.interrupt(&id).await });
        }
    }
}

/// Starts (or attaches to) the kernel, bootstraps the worker in it, and returns the link with
/// the host's end of the local socket the frames travel on.
pub(crate) async fn connect(
    config: &JupyterConfig,
    max_frame: usize,
) -> Result<(std::sync::Arc<Remote>, std::os::unix::net::UnixStream), KernelError> {
    let gateway = Gateway::new(config)?;
    let (kernel_id, owned) = match &config.kernel_id {
        Some(id) => {
            gateway.check(id).await?;
            (id.clone(), false)
        }
        None => (gateway.start(&config.kernel_name).await?, true),
    };
    let session = session_id();
    let socket = match channels(config, &kernel_id, &session).await {
        Ok(socket) => socket,
        Err(e) => {
            if owned {
                gateway.shutdown(&kernel_id).await;
            }
            return Err(failed(format!(
                "could not open the channels of kernel {kernel_id} at {}: {e}",
                config.url
            )));
        }
    };
    let (host, bridge_end) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| failed(format!("a local socket pair: {e}")))?;
    bridge_end
        .set_nonblocking(true)
        .map_err(|e| failed(e.to_string()))?;
    let bridge_end = tokio::net::UnixStream::from_std(bridge_end)
        .map_err(|e| failed(format!("a local socket pair: {e}")))?;
    let (end, ended) = watch::channel(None);
    let remote = std::sync::Arc::new(Remote {
        gateway,
        kernel_id,
        owned,
        ended,
        end,
    });
    let bootstrap = JupyterMessage::new(
        ExecuteRequest {
            code: bootstrap_code(max_frame, !owned, config.orphan_timeout),
            silent: true,
            store_history: false,
            user_expressions: None,
            allow_stdin: true,
            stop_on_error: false,
        },
        None,
    )
    .with_channel(Channel::Shell);
    tokio::spawn(bridge(
        Link {
            config: config.clone(),
            session,
            socket,
        },
        bridge_end,
        bootstrap,
        remote.clone(),
        max_frame,
    ));
    Ok((remote, host))
}

/// Opens the kernel's channels WebSocket in the JSON protocol, where each message names its
/// channel. (`jupyter-websocket-client`'s own connect asks for the binary v1 protocol, in which
/// it sends every message but control ones on the shell channel, so an `input_reply` would
/// never reach the kernel's stdin channel; its `JupyterWebSocket` does the rest.)
async fn channels(
    config: &JupyterConfig,
    kernel_id: &str,
    session: &str,
) -> Result<jupyter_websocket_client::JupyterWebSocket, String> {
    use async_tungstenite::tungstenite::client::IntoClientRequest as _;
    let base = config
        .url
        .replacen("https://", "wss://", 1)
        .replacen("http://", "ws://", 1);
    // The session lets the server keep what the kernel sends while the socket is down, and
    // replay it when the same session reconnects.
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
            tls_config(config).map_err(|e| e.to_string())?,
        ))
    } else {
        None
    };
    let (inner, _response) =
        async_tungstenite::tokio::connect_async_with_tls_connector(request, connector)
            .await
            .map_err(|e| e.to_string())?;
    Ok(jupyter_websocket_client::JupyterWebSocket {
        inner,
        protocol_mode: jupyter_websocket_client::ProtocolMode::Json,
    })
}

/// A session id unique to this link (what the server keys replays on).
fn session_id() -> String {
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

/// The kernel's channels, and how to open them again.
struct Link {
    config: JupyterConfig,
    session: String,
    socket: jupyter_websocket_client::JupyterWebSocket,
}

/// The bootstrap request's code: reads the sources frame through `input()`, loads the
/// executor and the worker as modules, and serves. Run in a namespace of its own, so the
/// kernel's user namespace gets nothing from it.
fn bootstrap_code(max_frame: usize, attached: bool, orphan_timeout: Duration) -> String {
    let attached = if attached { "True" } else { "False" };
    let orphan_timeout = orphan_timeout.as_secs_f64();
    let source = format!(
        "import base64, marshal, sys, types\n\
         kernel = get_ipython().kernel\n\
         answer = kernel.raw_input({mark:?} + 'sources')\n\
         data = base64.b64decode(answer.partition('\\n')[2])\n\
         for name, filename, source in marshal.loads(data[4:]):\n\
         \x20   module = types.ModuleType(name)\n\
         \x20   module.__file__ = filename\n\
         \x20   sys.modules[name] = module\n\
         \x20   exec(compile(source, filename, 'exec'), module.__dict__)\n\
         sys.modules['cave_kernel'].main_jupyter(kernel, {max_frame}, {attached}, {orphan_timeout:?})\n",
        mark = MARK,
    );
    format!("exec(compile({source:?}, '<cave-bootstrap>', 'exec'), {{'get_ipython': get_ipython}})")
}

/// The worker's side of one exchange, read from its prompt.
struct Prompt {
    /// The prompt's number, echoed in the answer.
    seq: Option<u64>,
    more: bool,
    last: bool,
    /// Characters of each execution's output published on IOPub so far.
    published: HashMap<u64, usize>,
    data: Vec<u8>,
}

fn read_prompt(prompt: &str) -> Option<Prompt> {
    let rest = prompt.strip_prefix(MARK)?;
    let (header, data) = rest.split_once('\n')?;
    let header: serde_json::Value = serde_json::from_str(header).ok()?;
    let data = base64::engine::general_purpose::STANDARD
        .decode(data)
        .ok()?;
    let published = header["out"]
        .as_object()
        .map(|out| {
            out.iter()
                .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_u64()? as usize)))
                .collect()
        })
        .unwrap_or_default();
    Some(Prompt {
        seq: header["seq"].as_u64(),
        more: header["more"].as_bool().unwrap_or(false),
        last: header["final"].as_bool().unwrap_or(false),
        published,
        data,
    })
}

fn answer(data: &[u8], more: bool, seq: Option<u64>) -> String {
    let header = match seq {
        Some(seq) => serde_json::json!({ "more": more, "seq": seq }),
        None => serde_json::json!({ "more": more }),
    };
    format!(
        "{MARK}{header}\n{}",
        base64::engine::general_purpose::STANDARD.encode(data)
    )
}

/// The last answer sent, kept to be sent again: after a lost WebSocket it may not have reached
/// the kernel, which would then wait for it forever.
struct Answered {
    seq: u64,
    request: JupyterMessage,
    answer: String,
}

/// What a cell's output says when part of it never came from the server.
fn lost_output_note(missing: usize) -> String {
    format!(
        "\n[{missing} characters of this cell's output did not arrive from the Jupyter server within {} s: \
         servers drop IOPub output past their rate limit (iopub_data_rate_limit, 1 MB/s by default). \
         Print less, or write large output to a file and read parts of it.]\n",
        OUTPUT_GRACE.as_secs()
    )
}

/// Frames the worker sent, held until the output they follow has arrived.
struct Held {
    data: Vec<u8>,
    published: HashMap<u64, usize>,
    deadline: tokio::time::Instant,
}

/// Carries frames between the local socket and the kernel's channels until either side ends.
async fn bridge(
    link: Link,
    local: tokio::net::UnixStream,
    bootstrap: JupyterMessage,
    remote: std::sync::Arc<Remote>,
    max_frame: usize,
) {
    let bootstrap_id = bootstrap.header.msg_id.clone();
    let Link {
        config,
        session,
        socket,
    } = link;
    let (mut to_kernel, mut from_kernel) = socket.split();
    // A lost WebSocket is opened again once; messages that could not be sent go then.
    let mut reopened = false;
    let mut unsent: Vec<JupyterMessage> = Vec::new();
    // The largest message sent: a server closes the socket on one past its size limit.
    let mut largest_sent = 0usize;
    let (mut local_read, mut local_write) = local.into_split();
    // Sends a message, or keeps it for when the socket is open again.
    macro_rules! send {
        ($message:expr) => {{
            let message = $message;
            largest_sent = largest_sent.max(message_size(&message));
            if let Err(error) = to_kernel.send(message.clone()).await {
                tracing::warn!(%error, "a message to the kernel could not be sent; kept");
                unsent.push(message);
            }
        }};
    }
    let reason = async {
        to_kernel
            .send(bootstrap)
            .await
            .map_err(|e| format!("the bootstrap request could not be sent: {e}"))?;
        // Host frames waiting for the next answer.
        let mut outgoing: Vec<u8> = Vec::new();
        // The worker's frames of an exchange that has more chunks to come.
        let mut incoming: Vec<u8> = Vec::new();
        // The open prompt, and its number.
        let mut waiting: Option<(JupyterMessage, Option<u64>)> = None;
        // When the open prompt is answered empty if nothing else goes first.
        let mut heartbeat_at = tokio::time::Instant::now();
        let heartbeat = config.heartbeat();
        // The number of the last prompt taken, and the last answer sent.
        let mut last_seq: Option<u64> = None;
        let mut answered: Option<Answered> = None;
        let mut held: Option<Held> = None;
        let mut received: HashMap<u64, usize> = HashMap::new();
        let mut last_tagged: Option<u64> = None;
        // The executions the last delivered prompt counted.
        let mut counted: std::collections::HashSet<u64> = std::collections::HashSet::new();
        let mut buffer = vec![0u8; 1 << 16];
        let mut failure: Option<String> = None;
        // Set when the runtime let go of a kernel it attached to: the worker is told to stop
        // (so the kernel is left idle, with its namespace) until then.
        let mut releasing: Option<tokio::time::Instant> = None;
        loop {
            if releasing.is_some_and(|until| tokio::time::Instant::now() >= until) {
                return Ok("the runtime let the kernel go (the worker did not stop in time)".to_owned());
            }
            // Frames whose output has arrived (or waited long enough) go to the host.
            if let Some(h) = &held {
                let caught_up = h
                    .published
                    .iter()
                    .all(|(id, n)| received.get(id).copied().unwrap_or(0) >= *n);
                if caught_up || tokio::time::Instant::now() >= h.deadline {
                    let h = held.take().expect("held");
                    if !caught_up && releasing.is_none() {
                        // Output the server dropped is said in the cell's own output, before
                        // the frames that end it, so the model reads that it is missing.
                        for (id, published) in &h.published {
                            let got = received.get(id).copied().unwrap_or(0);
                            // Bounded as the counts are: the ids come from the kernel.
                            if got < *published
                                && (received.len() < MAX_COUNTED || received.contains_key(id))
                            {
                                tracing::warn!(
                                    execution = id,
                                    missing = published - got,
                                    "output published on IOPub did not arrive"
                                );
                                let note = crate::process::framed(
                                    &Data::Owned(Value::Tuple(vec![
                                        "out".into(),
                                        Value::Int((*id).into()),
                                        Value::Str(lost_output_note(published - got)),
                                    ])),
                                    max_frame,
                                )
                                .map_err(|e| e.to_string())?;
                                local_write
                                    .write_all(&note)
                                    .await
                                    .map_err(|e| format!("the local socket: {e}"))?;
                                // Said once: what arrives late is passed on, not said again.
                                received.insert(*id, *published);
                            }
                        }
                    }
                    // Executions the worker no longer counts have ended: forget theirs.
                    received.retain(|id, _| h.published.contains_key(id) || !counted.contains(id));
                    counted = h.published.keys().copied().collect();
                    if releasing.is_none() {
                        local_write
                            .write_all(&h.data)
                            .await
                            .map_err(|e| format!("the local socket: {e}"))?;
                    }
                }
            }
            // An open prompt gets the host's frames as soon as there are some, or nothing once a
            // heartbeat is due (so the worker knows the host is there).
            if waiting.is_some()
                && (!outgoing.is_empty() || tokio::time::Instant::now() >= heartbeat_at)
            {
                let (request, seq) = waiting.take().expect("waiting");
                let n = outgoing.len().min(CHUNK);
                let more = outgoing.len() > n;
                let text = answer(&outgoing[..n], more, seq);
                outgoing.drain(..n);
                send!(reply_to(&request, text.clone()));
                answered = seq.map(|seq| Answered {
                    seq,
                    request,
                    answer: text,
                });
            }
            let deadline = [
                held.as_ref().map(|h| h.deadline),
                releasing,
                waiting.as_ref().map(|_| heartbeat_at),
            ]
            .into_iter()
            .flatten()
            .min();
            tokio::select! {
                read = local_read.read(&mut buffer), if releasing.is_none() => match read {
                    Ok(0) | Err(_) if remote.owned => {
                        return Ok::<_, String>("the runtime closed the link".to_owned());
                    }
                    Ok(0) | Err(_) => {
                        // A frame cut short by the end goes no further.
                        let mut whole = 0;
                        while let Some(n) = frame_len(&outgoing[whole..]) {
                            if outgoing.len() - whole < n {
                                break;
                            }
                            whole += n;
                        }
                        outgoing.truncate(whole);
                        let stop = crate::process::framed(
                            &Data::Owned(Value::Tuple(vec!["stop".into(), Value::Int(0)])),
                            max_frame,
                        )
                        .map_err(|e| e.to_string())?;
                        outgoing.extend_from_slice(&stop);
                        releasing = Some(tokio::time::Instant::now() + RELEASE_GRACE);
                    }
                    Ok(n) => outgoing.extend_from_slice(&buffer[..n]),
                },
                message = from_kernel.next() => {
                    let message = match message {
                        Some(Ok(message)) => message,
                        lost => {
                            let cause = match lost {
                                Some(Err(e)) => e.to_string(),
                                _ => "the server closed it".to_owned(),
                            };
                            if reopened {
                                return Err(format!(
                                    "the WebSocket to the Jupyter server was lost again ({cause}); it had been reopened once already{}",
                                    size_hint(largest_sent)
                                ));
                            }
                            reopened = true;
                            tracing::warn!(%cause, "the WebSocket to the Jupyter server was lost; reopening it");
                            let socket = channels(&config, &remote.kernel_id, &session)
                                .await
                                .map_err(|e| format!(
                                    "the WebSocket to the Jupyter server was lost ({cause}) and could not be reopened: {e}"
                                ))?;
                            (to_kernel, from_kernel) = socket.split();
                            let resend = std::mem::take(&mut unsent);
                            if resend.is_empty()
                                && let Some(last) = &answered
                                && last_seq == Some(last.seq)
                            {
                                // The last answer may have been lost with the socket, and the
                                // worker waits for it; a copy that did arrive twice is told
                                // apart by its number.
                                send!(reply_to(&last.request, last.answer.clone()));
                            }
                            for message in resend {
                                send!(message);
                            }
                            continue;
                        }
                    };
                    let from_bootstrap = message
                        .parent_header
                        .as_ref()
                        .is_some_and(|p| p.msg_id == bootstrap_id);
                    match &message.content {
                        JupyterMessageContent::InputRequest(request) => {
                            if request.prompt == format!("{MARK}sources") {
                                // The sources frame is the first thing the runtime sends.
                                while frame_len(&outgoing).is_none_or(|n| outgoing.len() < n) {
                                    let n = local_read.read(&mut buffer).await.map_err(|e| e.to_string())?;
                                    if n == 0 {
                                        return Ok("the runtime closed the link".to_owned());
                                    }
                                    outgoing.extend_from_slice(&buffer[..n]);
                                }
                                let n = frame_len(&outgoing).expect("a whole frame");
                                let reply = reply_to(&message, answer(&outgoing[..n], false, None));
                                outgoing.drain(..n);
                                send!(reply);
                                continue;
                            }
                            let Some(prompt) = read_prompt(&request.prompt) else {
                                return Err("the kernel asked for input the runtime does not understand (a cell called input()?)".to_owned());
                            };
                            if let (Some(seq), Some(last)) = (prompt.seq, last_seq)
                                && seq <= last
                            {
                                // A prompt taken already: the worker asks again (it got a copy
                                // of an earlier answer), or the server replayed it. Its frames
                                // are not taken twice; its answer, if sent, is sent again.
                                if seq == last {
                                    match &answered {
                                        Some(done) if done.seq == seq => {
                                            send!(reply_to(&message, done.answer.clone()));
                                        }
                                        _ => {
                                            waiting = Some((message.clone(), prompt.seq));
                                            heartbeat_at = tokio::time::Instant::now() + heartbeat;
                                        }
                                    }
                                }
                                continue;
                            }
                            last_seq = prompt.seq.or(last_seq);
                            incoming.extend_from_slice(&prompt.data);
                            // The worker sends a frame or two per exchange, each within the frame
                            // limit: more is a broken (or hostile) worker, not data to keep.
                            let pending = incoming.len() + held.as_ref().map_or(0, |h| h.data.len());
                            if pending > 2 * (max_frame + 4) {
                                return Err(format!(
                                    "the kernel sent {pending} bytes of frames without a break, over twice the frame limit ({max_frame} bytes): a protocol violation"
                                ));
                            }
                            if prompt.more || prompt.last {
                                // A chunk of more to come, or the worker's last words: acknowledged
                                // at once.
                                let text = answer(&[], false, prompt.seq);
                                send!(reply_to(&message, text.clone()));
                                answered = prompt.seq.map(|seq| Answered {
                                    seq,
                                    request: message.clone(),
                                    answer: text,
                                });
                            } else {
                                waiting = Some((message.clone(), prompt.seq));
                                heartbeat_at = tokio::time::Instant::now() + heartbeat;
                            }
                            if !prompt.more {
                                let data = std::mem::take(&mut incoming);
                                match held.as_mut() {
                                    // Still waiting for earlier output: later frames queue behind.
                                    Some(h) => {
                                        h.data.extend_from_slice(&data);
                                        h.published = prompt.published;
                                    }
                                    None => {
                                        held = Some(Held {
                                            data,
                                            published: prompt.published,
                                            deadline: tokio::time::Instant::now() + OUTPUT_GRACE,
                                        })
                                    }
                                }
                            }
                        }
                        JupyterMessageContent::StreamContent(stream) => {
                            let tagged = message.metadata["cave_execution"].as_u64();
                            // Untagged output is the server's own (its rate-limit notice): it
                            // belongs where it broke in, the execution whose output came last.
                            if tagged.is_some() {
                                last_tagged = tagged;
                            }
                            let execution = tagged.or(last_tagged);
                            // Bounded: a cell may tag stream messages with any ids it likes.
                            if let Some(id) = tagged
                                && (received.len() < MAX_COUNTED || received.contains_key(&id))
                            {
                                *received.entry(id).or_insert(0) += stream.text.chars().count();
                            }
                            let frame = crate::process::framed(
                                &Data::Owned(Value::Tuple(vec![
                                    "out".into(),
                                    Value::Int(execution.unwrap_or(0).into()),
                                    Value::Str(stream.text.clone()),
                                ])),
                                max_frame,
                            )
                            .map_err(|e| e.to_string())?;
                            if releasing.is_none() {
                                local_write.write_all(&frame).await.map_err(|e| format!("the local socket: {e}"))?;
                            }
                        }
                        JupyterMessageContent::ErrorOutput(error) if from_bootstrap => {
                            failure = Some(format!("{}: {}", error.ename, error.evalue));
                        }
                        JupyterMessageContent::ExecuteReply(_) if from_bootstrap => {
                            return Ok(failure.take().map_or_else(
                                || "the worker in the Jupyter kernel stopped".to_owned(),
                                |f| format!("the worker in the Jupyter kernel failed: {f}"),
                            ));
                        }
                        JupyterMessageContent::Status(status) => match status.execution_state {
                            ExecutionState::Restarting
                            | ExecutionState::AutoRestarting
                            | ExecutionState::Dead => {
                                return Ok("the Jupyter kernel died (the server is restarting it)".to_owned());
                            }
                            _ => {}
                        },
                        _ => {}
                    }
                },
                () = async {
                    match deadline {
                        Some(deadline) => tokio::time::sleep_until(deadline).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }
    .await
    .unwrap_or_else(|e| e);
    tracing::info!(%reason, kernel = %remote.kernel_id, "the Jupyter link ended");
    remote.end(&reason);
}

/// The size of a message's answer, the part that grows with the frames it carries.
fn message_size(message: &JupyterMessage) -> usize {
    match &message.content {
        JupyterMessageContent::InputReply(reply) => reply.value.len(),
        JupyterMessageContent::ExecuteRequest(request) => request.code.len(),
        _ => 0,
    }
}

/// What to say about a connection lost after a large message.
fn size_hint(largest: usize) -> String {
    if largest < 1 << 20 {
        return String::new();
    }
    format!(
        "; the largest message sent was {:.1} MiB: a server whose WebSocket message limit is lower closes the connection (Jupyter Server's default is 10 MiB; the runtime sends at most {} MiB of frames, base64, per message)",
        largest as f64 / 1048576.0,
        CHUNK >> 20
    )
}

/// The length of the first frame in `bytes`, once its header is there.
fn frame_len(bytes: &[u8]) -> Option<usize> {
    let header: [u8; 4] = bytes.get(..4)?.try_into().ok()?;
    Some(4 + u32::from_be_bytes(header) as usize)
}

fn reply_to(request: &JupyterMessage, value: String) -> JupyterMessage {
    JupyterMessage::new(
        InputReply {
            value,
            ..InputReply::default()
        },
        Some(request),
    )
    .with_channel(Channel::Stdin)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages a server could send, read as the WebSocket client reads them (JSON, then
    /// `JupyterMessage::from_value`) and then by the bridge (the runtime's prompts, the tags of
    /// stream output): each ends in a value or an error (`cargo xtask fuzz` runs a million).
    #[test]
    fn fuzz_messages_from_the_server() {
        let prompt = format!(
            "{MARK}{}\n{}",
            serde_json::json!({"seq": 3, "more": true, "final": false, "out": {"7": 12, "8": 0}}),
            base64::engine::general_purpose::STANDARD.encode(b"\x00\x00\x00\x02hi")
        );
        let request = JupyterMessage::new(
            jupyter_protocol::InputRequest {
                prompt: prompt.clone(),
                password: false,
            },
            None,
        );
        let mut stream =
            JupyterMessage::new(jupyter_protocol::StreamContent::stdout("tick\n"), None);
        stream.metadata = serde_json::json!({"cave_execution": 7});
        let seeds: Vec<Vec<u8>> = [&request, &stream]
            .iter()
            .map(|m| serde_json::to_vec(m).unwrap())
            .chain([prompt.into_bytes()])
            .collect();
        cave_testing::fuzz::soak("jupyter-messages", &seeds, |input| {
            if let Some(prompt) = read_prompt(&String::from_utf8_lossy(input)) {
                let _ = frame_len(&prompt.data);
            }
            let Ok(value) = serde_json::from_slice::<serde_json::Value>(input) else {
                return;
            };
            let Ok(message) = JupyterMessage::from_value(value) else {
                return;
            };
            let _ = message_size(&message);
            match &message.content {
                JupyterMessageContent::InputRequest(request) => {
                    if let Some(prompt) = read_prompt(&request.prompt) {
                        let _ = frame_len(&prompt.data);
                        let _ = answer(&prompt.data, prompt.more, prompt.seq);
                    }
                }
                JupyterMessageContent::StreamContent(stream) => {
                    let _ = (
                        message.metadata["cave_execution"].as_u64(),
                        stream.text.chars().count(),
                    );
                }
                _ => {}
            }
        });
    }

    #[test]
    fn prompts_and_answers_carry_frames_and_counts() {
        let prompt = format!(
            "{MARK}{}\n{}",
            serde_json::json!({"seq": 3, "more": false, "final": false, "out": {"7": 12}}),
            base64::engine::general_purpose::STANDARD.encode(b"\x00\x00\x00\x02hi")
        );
        let read = read_prompt(&prompt).expect("a prompt");
        assert!(!read.more && !read.last);
        assert_eq!(read.seq, Some(3));
        assert_eq!(read.published.get(&7), Some(&12));
        assert_eq!(read.data, b"\x00\x00\x00\x02hi");
        assert_eq!(frame_len(&read.data), Some(6));
        assert_eq!(frame_len(b"\x00\x00"), None);
        // What a cell's own input() would send is not a prompt of the runtime.
        assert!(read_prompt("Your name? ").is_none());
        let answered = answer(b"xyz", true, Some(3));
        assert!(answered.starts_with(MARK));
        let (header, data) = answered[MARK.len()..].split_once('\n').expect("two parts");
        assert_eq!(header, r#"{"more":true,"seq":3}"#);
        assert!(answer(b"", false, None).contains(r#"{"more":false}"#));
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .unwrap(),
            b"xyz"
        );
    }

    #[test]
    fn a_loss_after_a_large_message_names_the_size_limit() {
        assert_eq!(size_hint(1000), "");
        let hint = size_hint(5 << 20);
        assert!(
            hint.contains("5.0 MiB") && hint.contains("10 MiB"),
            "{hint}"
        );
    }

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let config = JupyterConfig::new("http://127.0.0.1:8888/").token("s3cret-token");
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret-token"), "{shown}");
        assert_eq!(config.url(), "http://127.0.0.1:8888");
    }

    #[test]
    fn a_tls_configuration_with_the_platform_certificates_builds() {
        assert!(tls_config(&JupyterConfig::new("https://example.org")).is_ok());
    }

    #[test]
    fn ca_certificates_that_are_not_pem_are_refused_saying_which_setting() {
        let config = |pem: &str| JupyterConfig::new("https://example.org").ca_certificates(pem);
        let empty = tls_config(&config("not a certificate"))
            .unwrap_err()
            .to_string();
        assert!(
            empty.contains("hold no certificate") && empty.contains("--jupyter-ca"),
            "{empty}"
        );
        let broken = tls_config(&config(
            "-----BEGIN CERTIFICATE-----\n%%%\n-----END CERTIFICATE-----\n",
        ))
        .unwrap_err()
        .to_string();
        assert!(broken.contains("not readable PEM"), "{broken}");
        assert!(
            format!("{:?}", config("x")).contains("ca_certificates: true"),
            "Debug says whether certificates are set"
        );
    }

    #[test]
    fn the_bootstrap_is_python_that_names_the_worker_entry() {
        let code = bootstrap_code(1 << 20, true, Duration::from_secs(600));
        assert!(code.starts_with("exec(compile("), "{code}");
        assert!(
            code.contains("main_jupyter(kernel, 1048576, True, 600.0)"),
            "{code}"
        );
    }
}

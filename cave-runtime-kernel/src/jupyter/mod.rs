//! The Jupyter transport: the kernel runtime's worker inside a Jupyter kernel reached through
//! Jupyter Server, Kernel Gateway or Enterprise Gateway (REST to start, interrupt and shut
//! down kernels; the channels WebSocket for the rest).
//!
//! The worker runs inside one execute request that never ends, and the runtime's frames travel
//! through the kernel's stdin channel: each `input_request` carries the worker's frames in its
//! prompt, each `input_reply` the host's (see `cave_kernel.py`, `_Jupyter`). The bridge
//! (`bridge.rs`, its I/O in `carrier.rs`) turns that into the byte stream a child's socket
//! carries, on one end of a local socket pair whose other end the worker code reads and writes
//! as for a child: everything above the transport (the registry, restore, host calls, nested
//! calls, output shaping) is shared. `gateway.rs` is the server's REST API.

mod bridge;
mod carrier;
mod gateway;
mod websocket;

use crate::KernelError;
use crate::config::WorkerSettings;
use crate::link::{Link, Started, Transport};
use crate::runtime::KernelRuntime;
use async_trait::async_trait;
use cave_cell::CellLimits;
use gateway::Gateway;
use jupyter_protocol::{Channel, ExecuteRequest, JupyterMessage};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;

/// Marks the runtime's own prompts and answers on the stdin channel.
const MARK: &str = "\u{0}cave ";
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
    worker: WorkerSettings,
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
            .field("worker", &self.worker)
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
            worker: WorkerSettings {
                interrupt_grace: Duration::from_secs(5),
                ..WorkerSettings::default()
            },
        }
    }
    /// Keeps one more kernel started and ready, so that `reset` and recovery from a dead
    /// kernel do not wait for a start (default: on; never for a kernel attached to).
    pub fn spare(mut self, spare: bool) -> Self {
        self.worker.spare = spare;
        self
    }
    /// How long an interrupted cell has to stop before its kernel is ended (a kernel attached
    /// to: restarted). Default 5 s: the interrupt crosses the server, and a busy cluster.
    pub fn interrupt_grace(mut self, grace: Duration) -> Self {
        self.worker.interrupt_grace = grace;
        self
    }
    /// How long `stop` waits for the worker to end before ending its kernel. Default: 1 s.
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.worker.stop_grace = grace;
        self
    }
    /// How long the worker bootstrapped in a started kernel has to say it is ready before the
    /// kernel is ended and the start fails (a kernel that died while starting, which its server
    /// may keep trying to reach). Default:
    /// [`DEFAULT_START_TIMEOUT`](crate::DEFAULT_START_TIMEOUT).
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.worker.start_timeout = timeout;
        self
    }
    /// The largest frame either side may send, in bytes. Default:
    /// [`DEFAULT_MAX_FRAME`](crate::DEFAULT_MAX_FRAME).
    pub fn max_frame(mut self, bytes: usize) -> Self {
        self.worker.max_frame = bytes;
        self
    }
    /// How the runtime treats its kernels' workers and bounds each cell's output, as set.
    pub fn worker(&self) -> WorkerSettings {
        self.worker
    }
    /// Sets the bounds on each cell's output (default: [`CellLimits::default`]). Past what the
    /// host holds, a cell's output goes to a temporary file of the host's as it comes, and is
    /// sent to the kernel whole as `_output_N`.
    pub fn cell_limits(mut self, limits: CellLimits) -> Self {
        self.worker.cell = limits;
        self
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

impl KernelRuntime {
    /// A runtime whose worker runs in a kernel behind the Jupyter server `config` names
    /// (started there, or attached to). The server decides the kernel's interpreter, limits,
    /// environment and isolation. Nothing starts until the first request.
    pub fn jupyter(config: JupyterConfig) -> KernelRuntime {
        KernelRuntime::with_transport(JupyterTransport::new(config))
    }
}

impl crate::KernelPool {
    /// A pool of kernels started ahead on the Jupyter server `config` names (each with the
    /// worker bootstrapped in it), so that a session on a busy gateway starts without waiting
    /// for a kernel. A configuration that attaches to one given kernel cannot be pooled.
    pub fn jupyter(
        config: JupyterConfig,
        pool: crate::PoolConfig,
    ) -> Result<crate::KernelPool, KernelError> {
        if config.attaches() {
            return Err(failed(
                "a pool starts kernels of its own: a configuration that attaches to a given kernel cannot be pooled",
            ));
        }
        if pool.setup.is_some() {
            return Err(failed(
                "a pool's setup code runs in a template its workers are forked from, and a kernel behind a Jupyter server cannot be copied: use a pool of local workers (KernelPool::new), or run the setup in each session",
            ));
        }
        Ok(crate::KernelPool::with_transport(
            std::sync::Arc::new(JupyterTransport::new(config)),
            pool,
        ))
    }
}

/// Starts workers in kernels behind a Jupyter server.
struct JupyterTransport {
    config: JupyterConfig,
    settings: WorkerSettings,
}

impl JupyterTransport {
    fn new(config: JupyterConfig) -> Self {
        Self {
            settings: config.worker,
            config,
        }
    }
}

#[async_trait]
impl Transport for JupyterTransport {
    fn settings(&self) -> &WorkerSettings {
        &self.settings
    }

    async fn start(&self) -> Result<Started, KernelError> {
        connect(&self.config, self.settings.max_frame).await
    }

    fn keeps_spares(&self) -> bool {
        // An attached kernel is the one kernel there is.
        !self.config.attaches()
    }
}

/// One kernel behind a server serving the runtime: how to interrupt and end it.
struct JupyterLink {
    gateway: Gateway,
    kernel_id: String,
    /// Started by the runtime (shut down with it), or attached to (left running).
    owned: bool,
    /// Why the link ended, once it has.
    ended: watch::Receiver<Option<String>>,
    end: watch::Sender<Option<String>>,
    /// Where the REST calls run: an interrupt may come from a thread outside any runtime.
    handle: tokio::runtime::Handle,
    /// Bytes of the worker's frames the bridge holds, not yet in the local socket.
    in_transit: Arc<AtomicU64>,
}

impl JupyterLink {
    /// Ends the link; a kernel the runtime started is shut down, one it attached to is left
    /// as it is.
    fn end(&self, reason: &str) {
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
            self.handle
                .spawn(async move { gateway.shutdown(&id).await });
        }
    }

    /// Stops whatever the kernel runs, however stuck: a kernel the runtime started is shut
    /// down; one it attached to is restarted (its state is lost, the kernel stays).
    fn kill_kernel(&self, reason: &str) {
        if !self.owned && self.ended.borrow().is_none() {
            let gateway = self.gateway.clone();
            let id = self.kernel_id.clone();
            self.handle.spawn(async move { gateway.restart(&id).await });
        }
        self.end(reason);
    }

    /// Asks the server to interrupt the kernel.
    fn interrupt_kernel(&self) {
        let gateway = self.gateway.clone();
        let id = self.kernel_id.clone();
        self.handle
            .spawn(async move { gateway.interrupt(&id).await });
    }
}

/// The link as the worker holds it (the bridge's task holds it too, to end it).
struct SharedLink(Arc<JupyterLink>);

#[async_trait]
impl Link for SharedLink {
    fn interrupt(&self) {
        self.0.interrupt_kernel();
    }

    fn kill(&self) {
        self.0.kill_kernel("the Python process was stopped");
    }

    fn in_transit(&self) -> u64 {
        self.0.in_transit.load(Ordering::SeqCst)
    }

    fn let_go_on_release(&self, executing: bool) -> bool {
        !self.0.owned && !executing
    }

    fn after_stop(&self) {
        self.0.end("the Python process was stopped");
    }

    async fn describe_end(&self) -> String {
        let mut ended = self.0.ended.clone();
        match ended.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => "the link to the Jupyter kernel ended".to_owned(),
        }
    }
}

/// Starts (or attaches to) the kernel and bootstraps the worker in it; the link, with the
/// host's end of the local socket the frames travel on.
async fn connect(config: &JupyterConfig, max_frame: usize) -> Result<Started, KernelError> {
    let gateway = Gateway::new(config)?;
    let (kernel_id, owned) = match &config.kernel_id {
        Some(id) => {
            gateway.check(id).await?;
            (id.clone(), false)
        }
        None => (gateway.start(&config.kernel_name).await?, true),
    };
    let session = carrier::session_id();
    let socket = match carrier::KernelSocket::open(config, &kernel_id, session).await {
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
    let (end, link_ended) = watch::channel(None);
    let link = Arc::new(JupyterLink {
        gateway,
        kernel_id,
        owned,
        ended: link_ended.clone(),
        end,
        handle: tokio::runtime::Handle::current(),
        in_transit: Arc::new(AtomicU64::new(0)),
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
    let bridge = bridge::Bridge::new(
        bootstrap.header.msg_id.clone(),
        owned,
        max_frame,
        config.heartbeat(),
        tokio::time::Instant::now(),
    );
    let carried = link.clone();
    tokio::spawn(async move {
        let end = carrier::carry(bridge, socket, bridge_end, bootstrap, &carried.in_transit).await;
        tracing::info!(reason = %end, kernel = %carried.kernel_id, "the Jupyter link ended");
        carried.end(&end.to_string());
    });
    // The worker sees the end of the link as the end of its process.
    let (ended_tx, ended) = watch::channel(false);
    let mut link_ended = link_ended;
    tokio::spawn(async move {
        let _ = link_ended.wait_for(Option::is_some).await;
        let _ = ended_tx.send(true);
    });
    Ok(Started {
        link: Box::new(SharedLink(link)),
        socket: host,
        ended,
        what: format!("the Jupyter kernel at {}", config.url),
        has_sources: false,
        precompiled: None,
    })
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

#[cfg(test)]
mod tests {
    use super::gateway::tls_config;
    use super::*;

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

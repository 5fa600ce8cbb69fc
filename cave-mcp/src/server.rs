//! A running MCP server and the session with it: started as a child process speaking MCP on
//! its stdio (or reached over streamable HTTP), its tools listed, its calls made, and stopped
//! with everything it started.

use crate::McpError;
use rmcp::model::{CallToolRequestParams, Tool};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// The lines of a server's stderr kept for errors (its last ones).
const STDERR_LINES: usize = 20;
/// The longest stderr line kept, in bytes.
const STDERR_LINE_BYTES: usize = 500;

/// How a stdio server is started.
#[derive(Clone, Debug)]
pub struct StdioServer {
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables set for it, beside the host's environment.
    pub env: Vec<(String, String)>,
    /// How long the start (process and MCP handshake) may take.
    pub start_timeout: Duration,
}

impl StdioServer {
    /// `program` with `args`; 30 seconds to start.
    pub fn new(
        program: impl Into<String>,
        args: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            start_timeout: Duration::from_secs(30),
        }
    }

    /// A command line split as a POSIX shell would split it (quotes and backslashes; no
    /// expansion, and no shell is run).
    pub fn from_command_line(line: &str) -> Result<Self, McpError> {
        let words = shlex::split(line).ok_or_else(|| McpError::Command {
            command: line.to_owned(),
            problem: "a quote is not closed, or it ends in a backslash".to_owned(),
        })?;
        let mut words = words.into_iter();
        let program = words.next().ok_or_else(|| McpError::Command {
            command: line.to_owned(),
            problem: "it names no program".to_owned(),
        })?;
        Ok(Self::new(program, words))
    }
}

/// How a server over streamable HTTP is reached.
#[derive(Clone)]
pub struct HttpServer {
    /// Its MCP endpoint (`https://host/mcp`).
    pub url: String,
    /// Headers sent with every request (authorization): never shown in errors or `Debug`.
    pub headers: Vec<(String, String)>,
    /// How long the MCP handshake may take.
    pub start_timeout: Duration,
}

impl HttpServer {
    /// The server at `url`, without headers; 30 seconds to answer the handshake.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            headers: Vec::new(),
            start_timeout: Duration::from_secs(30),
        }
    }

    /// Adds a header sent with every request.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("HttpServer")
            .field("url", &self.url)
            .field("headers", &names)
            .field("start_timeout", &self.start_timeout)
            .finish()
    }
}

/// Notices what the server says while the session runs.
#[derive(Clone, Debug, Default)]
struct Notices {
    tools_changed: Arc<AtomicBool>,
    /// Wakes whoever follows the changes (a permit is kept when nobody waits yet).
    changes: Arc<tokio::sync::Notify>,
}

impl ClientHandler for Notices {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        self.tools_changed.store(true, Ordering::SeqCst);
        self.changes.notify_one();
        std::future::ready(())
    }
}

/// The last lines a server wrote to stderr.
#[derive(Clone, Debug, Default)]
pub(crate) struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    fn push(&self, line: &str) {
        let mut lines = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.len() == STDERR_LINES {
            lines.pop_front();
        }
        let mut line = line.trim_end().to_owned();
        if line.len() > STDERR_LINE_BYTES {
            let mut cut = STDERR_LINE_BYTES;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push('…');
        }
        lines.push_back(line);
    }

    /// The lines, joined; empty when there were none.
    pub(crate) fn text(&self) -> String {
        let lines = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

/// A connected MCP server. Dropping it ends the session and the server's process group.
pub struct McpServer {
    name: String,
    service: Mutex<Option<RunningService<RoleClient, Notices>>>,
    peer: rmcp::Peer<RoleClient>,
    notices: Notices,
    stderr: StderrTail,
    process: Mutex<Option<ServerProcess>>,
    /// Cancelled when the session ends (`close`, or drop).
    ended: cave_core::CancellationToken,
}

/// The server's process: its group, and the thread it was started from (which it dies with,
/// so that it never outlives the host, even one killed at once).
#[derive(Debug)]
struct ServerProcess {
    pgid: i32,
    /// Dropped to let the starting thread end.
    stop: Option<std::sync::mpsc::Sender<()>>,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // Never 0 or 1 here: kill(0) and kill(-1) would reach the host's group and every process.
        if self.pgid > 1 {
            // SAFETY: a signal to the group the server leads (its own, from its setpgid).
            unsafe {
                libc::kill(-self.pgid, libc::SIGKILL);
            }
        }
        self.stop.take();
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        self.ended.cancel();
    }
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.name)
            .field("process", &self.process)
            .finish_non_exhaustive()
    }
}

impl McpServer {
    /// Starts the server `name` and opens an MCP session with it. The error names the server
    /// and carries its stderr's last lines.
    pub async fn stdio(name: &str, server: &StdioServer) -> Result<Self, McpError> {
        let stderr = StderrTail::default();
        let started = start(name, server, stderr.clone());
        let (transport, process) = match tokio::time::timeout(server.start_timeout, started).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(McpError::start(
                    name,
                    "its process did not start in time",
                    &stderr,
                ));
            }
        };
        Self::open(name, transport, server.start_timeout, stderr, Some(process)).await
    }

    /// Opens an MCP session with the server `name` at a URL (streamable HTTP), with its
    /// headers on every request.
    pub async fn http(name: &str, server: &HttpServer) -> Result<Self, McpError> {
        let mut headers = std::collections::HashMap::new();
        for (key, value) in &server.headers {
            let bad = |what: &str| McpError::Command {
                command: server.url.clone(),
                problem: format!("the header {key:?} has {what}"),
            };
            let key = http::HeaderName::from_bytes(key.trim().as_bytes())
                .map_err(|_| bad("a name HTTP does not allow"))?;
            let mut value = http::HeaderValue::from_str(value)
                .map_err(|_| bad("a value HTTP does not allow"))?;
            // Kept out of any debug output of the request.
            value.set_sensitive(true);
            headers.insert(key, value);
        }
        let config = StreamableHttpClientTransportConfig::with_uri(server.url.clone())
            .custom_headers(headers);
        let transport = StreamableHttpClientTransport::from_config(config);
        Self::open(
            name,
            transport,
            server.start_timeout,
            StderrTail::default(),
            None,
        )
        .await
    }

    /// The MCP handshake over `transport`, within `timeout`.
    async fn open<T, E, A>(
        name: &str,
        transport: T,
        timeout: Duration,
        stderr: StderrTail,
        process: Option<ServerProcess>,
    ) -> Result<Self, McpError>
    where
        T: rmcp::transport::IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let notices = Notices::default();
        let handshake = notices.clone().serve(transport);
        let service = match tokio::time::timeout(timeout, handshake).await {
            Ok(Ok(service)) => service,
            Ok(Err(e)) => {
                // What it wrote before it failed is in its stderr: give it a moment to arrive.
                tokio::time::sleep(Duration::from_millis(100)).await;
                return Err(McpError::start(
                    name,
                    &format!("the MCP handshake failed: {e}"),
                    &stderr,
                ));
            }
            Err(_) => {
                return Err(McpError::start(
                    name,
                    &format!("it did not answer the MCP handshake within {timeout:?}"),
                    &stderr,
                ));
            }
        };
        let peer = service.peer().clone();
        Ok(Self {
            name: name.to_owned(),
            service: Mutex::new(Some(service)),
            peer,
            notices,
            stderr,
            process: Mutex::new(process),
            ended: cave_core::CancellationToken::new(),
        })
    }

    /// The name it was started under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the server says it is (`serverInfo`), when it said.
    pub fn info(&self) -> Option<String> {
        let info = self.peer.peer_info()?;
        let implementation = info.server_info.as_ref()?;
        Some(format!(
            "{} {}",
            implementation.name, implementation.version
        ))
    }

    /// Its tools, as it lists them now.
    pub async fn tools(&self) -> Result<Vec<Tool>, McpError> {
        self.notices.tools_changed.store(false, Ordering::SeqCst);
        self.peer
            .list_all_tools()
            .await
            .map_err(|e| self.failure("listing its tools", &e))
    }

    /// Returns true if and only if the server said its tools changed since they were last
    /// listed.
    pub fn tools_changed(&self) -> bool {
        self.notices.tools_changed.load(Ordering::SeqCst)
    }

    /// Waits until the server says its tools changed (at once if it said so since the last
    /// wait); `false` when the session ended instead.
    pub async fn tools_change(&self) -> bool {
        tokio::select! {
            () = self.notices.changes.notified() => true,
            () = self.ended.cancelled() => false,
        }
    }

    /// Wakes what waits in [`tools_change`](Self::tools_change).
    pub(crate) fn wake_followers(&self) {
        self.notices.changes.notify_one();
    }

    /// Calls `tool` with `arguments`, waiting at most `timeout` (the request is cancelled
    /// after it).
    pub async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
        timeout: Duration,
    ) -> Result<serde_json::Value, McpError> {
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let call = self.peer.call_tool(params);
        let result = match tokio::time::timeout(timeout, call).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => return Err(self.failure(&format!("calling {tool}"), &e)),
            Err(_) => {
                return Err(McpError::Timeout {
                    server: self.name.clone(),
                    tool: tool.to_owned(),
                    timeout,
                });
            }
        };
        serde_json::to_value(result).map_err(|e| McpError::Protocol {
            server: self.name.clone(),
            message: e.to_string(),
        })
    }

    fn failure(&self, doing: &str, error: &rmcp::ServiceError) -> McpError {
        match error {
            rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_) => {
                McpError::Stopped {
                    server: self.name.clone(),
                    doing: doing.to_owned(),
                    stderr: self.stderr.text(),
                }
            }
            other => McpError::Protocol {
                server: self.name.clone(),
                message: format!("{doing}: {other}"),
            },
        }
    }

    /// Ends the session: the server is asked to stop (its stdin closes), then its process
    /// group is killed after at most `grace`. Calls after it fail as calls to a stopped server.
    pub async fn close(&self, grace: Duration) {
        self.ended.cancel();
        let service = self
            .service
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(service) = service {
            let _ = tokio::time::timeout(grace, service.cancel()).await;
        }
        self.process
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

/// Starts the process from a thread of its own, which it dies with (`PR_SET_PDEATHSIG`), in a
/// process group of its own; its stderr is read into `stderr`.
async fn start(
    name: &str,
    server: &StdioServer,
    stderr: StderrTail,
) -> Result<(TokioChildProcess, ServerProcess), McpError> {
    let handle = tokio::runtime::Handle::current();
    let (ready, spawned) = tokio::sync::oneshot::channel();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let program = server.program.clone();
    let server = server.clone();
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    std::thread::Builder::new()
        .name(format!("cave-mcp-{name}"))
        .spawn(move || {
            let _entered = handle.enter();
            let mut command = tokio::process::Command::new(&server.program);
            command
                .args(&server.args)
                .envs(server.env.iter().map(|(k, v)| (k, v)))
                .kill_on_drop(true);
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    if libc::setpgid(0, 0) != 0
                        || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::getppid() != parent {
                        libc::_exit(1);
                    }
                    Ok(())
                });
            }
            let result = TokioChildProcess::builder(command)
                .stderr(Stdio::piped())
                .spawn();
            let _ = ready.send(result);
            // The server lives as long as this thread: it ends when the host lets go.
            let _ = stopped.recv();
        })
        .map_err(|e| McpError::start(name, &format!("no thread to start it from: {e}"), &stderr))?;
    let spawned = spawned
        .await
        .map_err(|_| McpError::start(name, "its starting thread ended", &stderr))?;
    let (transport, child_stderr) = spawned
        .map_err(|e| McpError::start(name, &format!("cannot run {program}: {e}"), &stderr))?;
    let pgid = transport.id().map_or(0, |pid| pid as i32);
    if let Some(child_stderr) = child_stderr {
        let tail = stderr.clone();
        tokio::spawn(async move {
            let mut child_stderr = child_stderr;
            let mut pending: Vec<u8> = Vec::new();
            let mut buffer = [0u8; 4096];
            while let Ok(n) = child_stderr.read(&mut buffer).await {
                if n == 0 {
                    break;
                }
                pending.extend_from_slice(&buffer[..n]);
                while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                    tail.push(&String::from_utf8_lossy(&pending[..end]));
                    pending.drain(..=end);
                }
                // A line without an end is kept only in part.
                if pending.len() > STDERR_LINE_BYTES {
                    tail.push(&String::from_utf8_lossy(&pending));
                    pending.clear();
                }
            }
            if !pending.is_empty() {
                tail.push(&String::from_utf8_lossy(&pending));
            }
        });
    }
    Ok((
        transport,
        ServerProcess {
            pgid,
            stop: Some(stop),
        },
    ))
}

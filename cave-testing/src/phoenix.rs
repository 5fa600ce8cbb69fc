//! A real OTLP receiver for the trace tests: Arize Phoenix (PyPI), started on free ports in a
//! working directory of its own, and its spans read back over its REST API.
//!
//! Found through `CAVE_PHOENIX` (the `phoenix` executable; `cargo xtask test` installs it and
//! sets it) or the workspace's `target/phoenix-venv`. Without one, [`Phoenix::start`] says so
//! on stdout and returns `None`, and under `CI` it panics instead: the trace tests never
//! silently skip there.

use serde_json::Value as Json;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long Phoenix may take to answer its health check (about 20 s on 2 cores).
const READY_WITHIN: Duration = Duration::from_secs(120);

/// A Phoenix server on 127.0.0.1, killed (and its directory removed) when dropped.
#[derive(Debug)]
pub struct Phoenix {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `phoenix` executable, if this machine has one.
fn executable() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CAVE_PHOENIX") {
        return Some(PathBuf::from(path));
    }
    let venv = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/phoenix-venv/bin/phoenix"
    ));
    venv.exists().then_some(venv)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// The body of a `GET` that answered 200 (asked as HTTP/1.0: a plain body, never chunked).
fn get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?;
    (status == "200").then(|| body.to_owned())
}

impl Phoenix {
    /// Starts Phoenix and waits until it is ready; `None` (with a line on stdout saying why)
    /// where it is not installed, outside CI.
    pub fn start() -> Option<Phoenix> {
        let Some(executable) = executable() else {
            let why =
                "no phoenix (CAVE_PHOENIX or target/phoenix-venv; `cargo xtask test` installs it)";
            assert!(std::env::var_os("CI").is_none(), "{why}");
            println!("skipped: {why}");
            return None;
        };
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("cave-phoenix-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a working directory for phoenix");
        let child = Command::new(&executable)
            .arg("serve")
            .env("PHOENIX_WORKING_DIR", &dir)
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_GRPC_PORT", free_port().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", executable.display()));
        let mut server = Phoenix { child, port, dir };
        let begun = Instant::now();
        while get(port, "/healthz").is_none() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("phoenix exited before it was ready: {status}");
            }
            assert!(
                begun.elapsed() < READY_WITHIN,
                "phoenix was not ready within {READY_WITHIN:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Some(server)
    }

    /// The base URL of its OTLP/HTTP receiver (`…/v1/traces` is below it).
    pub fn otlp_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The spans of the default project once there are at least `at_least` of them, or all
    /// there are after 30 s (exports arrive in batches).
    pub fn spans(&self, at_least: usize) -> Vec<Json> {
        let begun = Instant::now();
        loop {
            let found = self.read_spans();
            if found.len() >= at_least || begun.elapsed() > Duration::from_secs(30) {
                return found;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    fn read_spans(&self) -> Vec<Json> {
        let Some(body) = get(self.port, "/v1/projects/default/spans?limit=1000") else {
            return Vec::new();
        };
        serde_json::from_str::<Json>(&body)
            .ok()
            .and_then(|j| j["data"].as_array().cloned())
            .unwrap_or_default()
    }
}

/// The spans named `name`.
pub fn named<'a>(spans: &'a [Json], name: &str) -> Vec<&'a Json> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

/// The span whose id is `span`'s parent id.
pub fn parent<'a>(spans: &'a [Json], span: &Json) -> Option<&'a Json> {
    let id = &span["parent_id"];
    spans.iter().find(|s| &s["context"]["span_id"] == id)
}

/// Attribute `name` of `span` (`Null` when it has none).
pub fn attribute<'a>(span: &'a Json, name: &str) -> &'a Json {
    &span["attributes"][name]
}

/// The cells (`execute_tool python`) that recorded their code, as (code, output): those of
/// runs with `trace_content` on.
pub fn recorded_cells(spans: &[Json]) -> Vec<(&str, &str)> {
    named(spans, "execute_tool python")
        .into_iter()
        .filter_map(|s| {
            let code = attribute(s, "gen_ai.tool.call.arguments").as_str()?;
            let output = attribute(s, "gen_ai.tool.call.result")
                .as_str()
                .unwrap_or("");
            Some((code, output))
        })
        .collect()
}

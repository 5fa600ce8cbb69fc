//! The MCP test servers, for every crate's MCP tests: where they are installed, and the
//! edge-case server's command (over stdio, or over HTTP).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The virtualenv with `mcp` and `mcp-server-time`, from `CAVE_MCP_TIME` (its
/// `mcp-server-time`, which `cargo xtask test` sets) or `target/mcp-venv`. Without it the
/// tests skip and say so; under `CI` they fail.
pub fn venv() -> Option<PathBuf> {
    let venv = match std::env::var_os("CAVE_MCP_TIME") {
        Some(program) => PathBuf::from(program)
            .parent()
            .and_then(|bin| bin.parent())
            .map(PathBuf::from)
            .unwrap_or_default(),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/mcp-venv")),
    };
    if venv.join("bin/mcp-server-time").is_file() {
        return Some(venv);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must provide the MCP test servers (cargo xtask test installs them)"
    );
    eprintln!("skipped: no MCP test servers (run `cargo xtask test`, or set CAVE_MCP_TIME)");
    None
}

/// The edge-case server's command: the SDK's Python and the script.
pub fn edge_command(venv: &Path) -> (String, Vec<String>) {
    (
        venv.join("bin/python").display().to_string(),
        vec![
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../cave-mcp/tests/support/edge_server.py"
            )
            .to_owned(),
        ],
    )
}

/// The command that starts the server of 500 tools (`many_tools_server.py`) with `venv`'s
/// Python.
pub fn many_command(venv: &Path) -> (String, Vec<String>) {
    (
        venv.join("bin/python").display().to_string(),
        vec![
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../cave-mcp/tests/support/many_tools_server.py"
            )
            .to_owned(),
        ],
    )
}

/// The edge server over streamable HTTP on 127.0.0.1, with a token; killed when dropped.
pub struct HttpEdge {
    child: std::process::Child,
    /// Its MCP endpoint.
    pub url: String,
}

impl HttpEdge {
    /// Starts it on a free port, and waits until it listens.
    pub fn start(venv: &Path, token: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let (program, args) = edge_command(venv);
        let child = std::process::Command::new(program)
            .args(args)
            .env("EDGE_HTTP_PORT", port.to_string())
            .env("EDGE_TOKEN", token)
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap();
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for HttpEdge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! Model Context Protocol servers' tools as cave-agent host objects.
//!
//! [`McpServer::stdio`] starts a server (a child process speaking MCP on its stdio, through the
//! official Rust SDK, `rmcp`) and opens a session with it; [`McpTools`] makes its tools the
//! methods of one host object, which [`McpTools::binding`] binds under the server's name. The
//! model's code then calls the tools as it calls any host object's methods (in a loop, on
//! results of other calls, within one cell), on every runtime, with the host's guards around
//! them (approvals, audit). Names become identifiers, signatures come from each tool's
//! `inputSchema`, a structured result comes back as a value, text as `str` (images are shown
//! among the cell's output too), an error result raises
//! `RuntimeError`, a call past its time limit `TimeoutError`, a server that stopped
//! `ConnectionError`.
//!
//! See the README for an example.
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

mod schema;
#[cfg(feature = "serve")]
pub mod serve;
mod server;
mod tools;

pub use server::{HttpServer, McpServer, StdioServer};

/// The README's example, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
pub use tools::{DEFAULT_CALL_TIMEOUT, McpTools};

use std::time::Duration;

/// What went wrong with an MCP server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// A command line that cannot be run.
    #[error("the MCP server command {command:?} cannot be run: {problem}")]
    Command {
        /// The command line.
        command: String,
        /// Why.
        problem: String,
    },
    /// The server did not start, or did not complete the MCP handshake.
    #[error(
        "the MCP server `{server}` did not start: {message}{}",
        stderr_lines(stderr)
    )]
    Start {
        /// The server's name.
        server: String,
        /// What happened.
        message: String,
        /// The last lines of its stderr.
        stderr: String,
    },
    /// The server stopped (its process ended, or it closed the session).
    #[error("the MCP server `{server}` stopped ({doing}){}", stderr_lines(stderr))]
    Stopped {
        /// The server's name.
        server: String,
        /// What the host was doing.
        doing: String,
        /// The last lines of its stderr.
        stderr: String,
    },
    /// A tool call took longer than its limit (and was cancelled).
    #[error("the MCP server `{server}` did not answer {tool} within {}s (the call was cancelled)", timeout.as_secs_f64())]
    Timeout {
        /// The server's name.
        server: String,
        /// The tool.
        tool: String,
        /// The limit.
        timeout: Duration,
    },
    /// A session could not be served (`serve`).
    #[error("the session cannot be served over MCP: {message}")]
    Serve {
        /// Why.
        message: String,
    },
    /// The server answered something the protocol does not allow, or refused the request.
    #[error("the MCP server `{server}`: {message}")]
    Protocol {
        /// The server's name.
        server: String,
        /// What happened.
        message: String,
    },
}

fn stderr_lines(stderr: &str) -> String {
    if stderr.trim().is_empty() {
        String::new()
    } else {
        format!("; its stderr ended with:\n{stderr}")
    }
}

impl McpError {
    pub(crate) fn start(server: &str, message: &str, stderr: &server::StderrTail) -> Self {
        McpError::Start {
            server: server.to_owned(),
            message: message.to_owned(),
            stderr: stderr.text(),
        }
    }

    /// The Python exception a call that failed this way raises.
    pub fn host_error(&self) -> cave_core::HostError {
        let python_type = match self {
            McpError::Timeout { .. } => "TimeoutError",
            McpError::Stopped { .. } | McpError::Start { .. } => "ConnectionError",
            McpError::Command { .. } | McpError::Protocol { .. } | McpError::Serve { .. } => {
                "RuntimeError"
            }
        };
        cave_core::HostError::new(python_type, self.to_string())
    }
}

//! The `cave` binary against a local SSE server, the human renderer's snapshot, and the
//! session viewer in a headless browser.
mod cli;
mod habits;
mod jupyter;
mod kernel;
mod litellm;
mod mcp;
mod mcp_serve;
/// The MCP test servers (installed by `cargo xtask test`).
#[path = "../../cave-mcp/tests/support/servers.rs"]
mod mcp_servers;
mod render;
mod session;
mod skills;
mod soak;
#[path = "../../cave-models/tests/support/mod.rs"]
#[allow(dead_code)]
mod support;
mod traces;
mod view;

//! The `cave` binary against a local SSE server, the human renderer's snapshot, and the
//! session viewer in a headless browser.
mod cli;
mod jupyter;
mod kernel;
mod litellm;
mod mcp;
mod render;
mod skills;
mod soak;
#[path = "../../cave-models/tests/support/mod.rs"]
#[allow(dead_code)]
mod support;
mod view;

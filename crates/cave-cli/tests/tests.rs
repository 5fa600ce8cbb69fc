//! The `cave` binary against a local SSE server, and the human renderer's snapshot.
mod cli;
mod jupyter;
mod kernel;
mod litellm;
mod render;
mod skills;
mod soak;
#[path = "../../cave-models/tests/support/mod.rs"]
#[allow(dead_code)]
mod support;

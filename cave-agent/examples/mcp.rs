//! Code mode over MCP: PyPI's `mcp-server-time` becomes the object `clock` (not `time`, which a
//! cell's `import time` would rebind), and the model calls its tools from code: three zones in
//! one cell, in a loop, instead of one tool call per turn. The host reads the result back as a
//! Rust value; the server ends with the program.
//!
//! Needs the server: `pip install mcp-server-time` (or set `CAVE_MCP_TIME` to its program;
//! `cargo xtask test` installs it in `target/mcp-venv`). Offline, with the model's answers
//! scripted: `cargo run -p cave-agent --example mcp --features mcp,testing`. With
//! `LLM_MODEL_ID` set, a real model does it.

#[path = "common/mod.rs"]
mod common;

use cave_agent::AgentExt;
use cave_agent::mcp::{DEFAULT_CALL_TIMEOUT, McpServer, McpTools, StdioServer};
use cave_agent::testing::Reply;
use cave_agent::{Agent, InProcRuntime, Model, Resources, Runtime, RuntimeExt};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a model would write.
fn script() -> Vec<Reply> {
    vec![
        common::code(
            "zones = ['Asia/Tokyo', 'Europe/Paris', 'America/New_York']\noffsets = {z: clock.get_current_time(z)['datetime'][-6:] for z in zones}\nprint(offsets)",
        ),
        Reply::text("Tokyo is ahead of Paris and New York; the offsets are in `offsets`."),
    ]
}

/// The server's program: `CAVE_MCP_TIME`, else `mcp-server-time` on `PATH`.
fn server_program() -> String {
    std::env::var("CAVE_MCP_TIME").unwrap_or_else(|_| "mcp-server-time".to_owned())
}

/// Runs the request; returns the UTC offsets the model's code stored in `offsets`.
async fn run(
    model: Arc<dyn Model>,
) -> Result<BTreeMap<String, String>, Box<dyn std::error::Error>> {
    let command = StdioServer::new(server_program(), ["--local-timezone", "UTC"]);
    let server = McpServer::stdio("clock", &command).await.map_err(|e| {
        format!("{e} (install the server: pip install mcp-server-time, or set CAVE_MCP_TIME)")
    })?;
    let server = Arc::new(server);
    let tools = Arc::new(McpTools::new(server.clone(), DEFAULT_CALL_TIMEOUT).await?);
    let runtime = InProcRuntime::new()?;
    runtime
        .register(Resources::new().object(tools.binding()))
        .await?;
    let mut agent = Agent::builder(model, runtime.clone()).build()?;
    common::show(
        agent.stream("What are the UTC offsets of Tokyo, Paris and New York right now? Keep them in `offsets`."),
        true,
    )
    .await;
    let offsets = runtime.get_as("offsets").await?;
    server.close(std::time::Duration::from_secs(2)).await;
    Ok(offsets)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    common::finish(run(common::model(script)).await, |offsets| {
        println!("\nThe host read back:");
        for (zone, offset) in offsets {
            println!("  {zone}: UTC{offset}");
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_model_calls_the_tools_in_a_loop_and_the_host_reads_the_result() {
        if std::env::var_os("CAVE_MCP_TIME").is_none() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs the examples with CAVE_MCP_TIME set (cargo xtask test)"
            );
            eprintln!("skipped: no mcp-server-time (CAVE_MCP_TIME)");
            return;
        }
        let model = Arc::new(cave_agent::testing::ScriptedModel::new(script()));
        let offsets = run(model).await.unwrap();
        assert_eq!(offsets.len(), 3);
        assert_eq!(offsets["Asia/Tokyo"], "+09:00");
        assert!(offsets["Europe/Paris"] == "+01:00" || offsets["Europe/Paris"] == "+02:00");
    }
}

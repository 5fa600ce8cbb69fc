//! MCP servers' tools called from the in-process runtime (the kernel runtime's turn is in
//! cave-mcp's own tests): the same scenario, on CPython embedded in this test binary.

#[path = "../../cave-mcp/tests/support/scenario.rs"]
mod scenario;
#[path = "../../cave-mcp/tests/support/servers.rs"]
mod servers;

#[tokio::test(flavor = "multi_thread")]
async fn tools_are_methods_in_process() {
    let Some(venv) = servers::venv() else { return };
    let runtime = cave_agent::InProcRuntime::new().unwrap();
    scenario::tools_as_methods(&runtime, &venv).await;
}

//! The scenario every runtime is put through with the MCP test servers (cave-mcp's tests run it
//! on the kernel runtime, cave-agent's in process). Needs `servers.rs` as the sibling module
//! `servers`.
#![allow(dead_code)]

use cave_core::{DiscardOutput, Resources, Runtime};
use cave_mcp::{McpServer, McpTools, StdioServer};
use cave_testing::process::ends;
use std::sync::Arc;
use std::time::Duration;

pub fn edge_server(venv: &std::path::Path) -> StdioServer {
    let (program, args) = super::servers::edge_command(venv);
    StdioServer::new(program, args)
}

/// The tools of the server `name` started with `command`, each call limited to `timeout`.
pub async fn stdio_tools(name: &str, command: &StdioServer, timeout: Duration) -> Arc<McpTools> {
    let server = McpServer::stdio(name, command)
        .await
        .unwrap_or_else(|e| panic!("the server {name} starts: {e}"));
    Arc::new(McpTools::new(Arc::new(server), timeout).await.unwrap())
}

/// The server of 500 tools (`many_tools_server.py`) as the object `many`.
pub async fn many(venv: &std::path::Path) -> Arc<McpTools> {
    let (program, args) = super::servers::many_command(venv);
    stdio_tools(
        "many",
        &StdioServer::new(program, args),
        Duration::from_secs(60),
    )
    .await
}

pub async fn edge(venv: &std::path::Path, timeout: Duration) -> Arc<McpTools> {
    stdio_tools("edge", &edge_server(venv), timeout).await
}

pub async fn run(runtime: &dyn Runtime, code: &str) -> String {
    let execution = runtime.execute(code, &DiscardOutput).await.unwrap();
    execution.output
}

/// Every case against one runtime (also run in process by cave-agent's `tests/mcp.rs`):
/// results, errors, the time limit, a changing tool list, a server that dies mid-call.
pub async fn tools_as_methods(runtime: &dyn Runtime, venv: &std::path::Path) {
    let tools = edge(venv, Duration::from_secs(2)).await;
    runtime
        .register(Resources::new().object(tools.binding()))
        .await
        .unwrap();
    let out = run(
        runtime,
        "print(edge.add(2, 3))\nprint(edge.add(a=1))\nprint(edge.word_stats('a b c'))\nprint(edge.profile('ada', tags=['x']))",
    )
    .await;
    assert_eq!(
        out,
        // Keys come back sorted (the JSON layer keeps no order).
        "5\n3\n3 words\n{'name': 'ada', 'ok': True, 'tags': ['x']}\n"
    );
    let out = run(
        runtime,
        "try:\n    edge.fail('not today')\nexcept RuntimeError as e:\n    print('raised:', e)",
    )
    .await;
    assert!(
        out.starts_with("raised: the MCP tool \"fail\" of `edge` failed:")
            && out.contains("refused: not today"),
        "{out}"
    );
    let out = run(
        runtime,
        "try:\n    edge.slow(10)\nexcept TimeoutError as e:\n    print('timed out:', e)\nprint(edge.add(1, 1))",
    )
    .await;
    assert!(
        out.starts_with("timed out: the MCP server `edge` did not answer slow within 2s"),
        "{out}"
    );
    assert!(
        out.ends_with("\n2\n"),
        "the session survives a timeout: {out}"
    );

    // The tool list changes: the server says so, and a reload lists the new tool.
    assert!(!tools.server().tools_changed());
    assert_eq!(run(runtime, "print(edge.grow())").await, "grown\n");
    // The call that changed the list normally takes the new one before it answers; a notice
    // that came later is taken by a reload.
    let has_extra = || {
        cave_core::HostObject::methods(&*tools)
            .iter()
            .any(|m| m.name == "extra")
    };
    for _ in 0..50 {
        if has_extra() {
            break;
        }
        tools.reload_if_changed().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(has_extra(), "the new tool is a method");
    assert!(!tools.reload_if_changed().await.unwrap(), "taken once");
    let extra = cave_core::HostObject::call(&*tools, "extra", cave_core::Args::new(Vec::new()))
        .await
        .unwrap();
    assert_eq!(extra, cave_core::Value::Str("extra here".into()));

    // A cell waiting on a call that never answers is interrupted like any other: the call is
    // dropped, and the server told (`notifications/cancelled`).
    let interrupter = runtime.interrupter().expect("the runtime can interrupt");
    let stopper = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        interrupter.interrupt()
    });
    let hung = tokio::time::timeout(
        Duration::from_secs(30),
        runtime.execute("edge.hang()", &DiscardOutput),
    )
    .await
    .expect("the interrupt ended the cell")
    .unwrap();
    stopper.await.unwrap();
    assert_eq!(
        hung.error.as_ref().map(|e| e.python_type.as_str()),
        Some("KeyboardInterrupt"),
        "{hung:?}"
    );
    let mut told = String::new();
    for _ in 0..100 {
        told = run(runtime, "print(edge.cancelled())").await;
        if told == "1\n" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(told, "1\n", "the server was told the call was cancelled");

    let pid: u32 = run(runtime, "print(edge.pid())")
        .await
        .trim()
        .parse()
        .unwrap();
    let out = run(
        runtime,
        "for _ in range(2):\n    try:\n        edge.die()\n    except ConnectionError as e:\n        print('gone:', e)",
    )
    .await;
    assert!(
        out.starts_with("gone: the MCP server `edge` stopped (calling die)"),
        "{out}"
    );
    assert!(
        out.contains("dying on purpose"),
        "its stderr is in the error: {out}"
    );
    assert_eq!(out.matches("gone:").count(), 2, "{out}");
    assert!(ends(pid), "the dead server was reaped");
}

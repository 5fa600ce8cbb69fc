//! `cave mcp serve`, driven by the official Python MCP client (`data/mcp_session_client.py`)
//! over stdio and streamable HTTP, and by hand for a host killed mid-way.

use cave_agent::testing::process::{alive, ends};
use serde_json::{Value as Json, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::mcp_servers as servers;

const CLIENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/mcp_session_client.py"
);

/// A 1×1 PNG, as a cell would show it.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

/// `cave mcp serve ARGS…` as the client starts it.
fn serve(args: &[&str]) -> Json {
    let mut command = vec![env!("CARGO_BIN_EXE_cave"), "mcp", "serve"];
    command.extend_from_slice(args);
    json!({ "command": command })
}

/// Runs the client with `plan`; its report.
fn drive(venv: &Path, plan: &Json) -> Json {
    let out = Command::new(venv.join("bin/python"))
        .arg(CLIENT)
        .arg(plan.to_string())
        .output()
        .expect("the MCP client runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the client failed: {stderr}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("the client's report is not JSON ({e}); stderr: {stderr}"))
}

fn text(result: &Json) -> &str {
    result["text"].as_str().unwrap_or_default()
}

/// What a user gets with nothing configured: the in-process runtime over stdio; state kept
/// across calls, images as image content, long output stored, descriptors 0 and 1 kept off
/// the MCP stream.
#[test]
fn a_session_with_the_defaults_keeps_its_state() {
    let Some(venv) = servers::venv() else { return };
    let show = format!(
        "import base64\nx = 41\ndisplay({{'image/png': base64.b64decode('{PNG}')}}, raw=True)\nx + 1"
    );
    let plan = json!({
        "server": serve(&[]),
        "calls": [
            {"tool": "run_cell", "arguments": {"code": show}},
            {"tool": "run_cell", "arguments": {"code": "import os\nos.write(1, b'straight to fd 1\\n')\nprint(x * 2)\ninput()"}},
            {"tool": "run_cell", "arguments": {"code": "print('z' * 6000)"}},
            {"tool": "get_variable", "arguments": {"name": "x"}},
            {"tool": "get_variable", "arguments": {"name": "_output_1"}},
            {"tool": "get_variable", "arguments": {"name": "os"}},
            {"tool": "get_variable", "arguments": {"name": "nothing_here"}},
            {"tool": "list_bound"},
        ],
    });
    let report = drive(&venv, &plan);
    assert_eq!(
        report["tools"],
        json!(["get_variable", "list_bound", "run_cell"])
    );
    assert_eq!(report["protocol_version"], "2026-07-28");
    let instructions = report["instructions"].as_str().unwrap();
    assert!(instructions.contains("Isolation: none"), "{instructions}");
    let results = report["results"].as_array().unwrap();
    assert_eq!(results[0]["is_error"], false, "{}", results[0]);
    assert!(text(&results[0]).ends_with("42\n"), "{}", results[0]);
    assert_eq!(results[0]["images"], json!(["image/png"]));
    // The cell wrote to descriptor 1 and read descriptor 0: its output got the first (the
    // capture's pipe is read beside Python's own output, so not necessarily in order), the
    // second was empty, and the MCP stream went on.
    assert_eq!(results[1]["is_error"], true);
    let second = text(&results[1]);
    assert!(second.contains("82"), "{second}");
    assert!(second.contains("straight to fd 1"), "{second}");
    assert!(second.contains("EOFError"), "{second}");
    let long = text(&results[2]);
    assert!(long.contains("_output_1"), "{long}");
    assert!(long.len() < 6000, "the long output came back whole");
    assert_eq!(results[3]["structured"], json!({"name": "x", "value": 41}));
    assert_eq!(
        results[4]["structured"]["value"].as_str().map(str::len),
        Some(6001)
    );
    assert_eq!(results[5]["is_error"], true);
    assert!(text(&results[5]).contains("no JSON form"), "{}", results[5]);
    assert_eq!(results[6]["is_error"], true);
    let listed = text(&results[7]);
    assert!(listed.contains("  x (int)"), "{listed}");
    assert!(listed.contains("Isolation: none"), "{listed}");
}

/// The kernel runtime with its sandbox, the strict policy, a cell time limit, and each cell
/// approved by the client, on both protocols: asked with `elicitation/create` (2025-11-25)
/// and in the call's result, the cell paused until the answer (2026-07-28). The audit records
/// it all.
#[test]
fn policy_approvals_limits_and_sandbox_apply() {
    let Some(venv) = servers::venv() else { return };
    let dir = std::env::temp_dir().join(format!("cave-mcp-serve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (mode, version) in [("legacy", "2025-11-25"), ("auto", "2026-07-28")] {
        let audit = dir.join(format!("{mode}.jsonl"));
        let plan = json!({
            "server": serve(&[
                "--runtime", "kernel", "--policy", "strict", "--approve", "cells",
                "--max-exec-timeout", "2", "--audit", audit.to_str().unwrap(),
            ]),
            "mode": mode,
            "elicit": ["accept", "decline", "accept"],
            "calls": [
                {"tool": "run_cell", "arguments": {"code": "y = 5\nprint(y)"}},
                {"tool": "run_cell", "arguments": {"code": "y = 6"}},
                {"tool": "run_cell", "arguments": {"code": "import os\nos.system('id')"}},
                {"tool": "run_cell", "arguments": {"code": "while True: pass"}},
                {"tool": "get_variable", "arguments": {"name": "y"}},
                {"tool": "list_bound"},
            ],
        });
        let report = drive(&venv, &plan);
        assert_eq!(report["protocol_version"], version);
        // The kernel runtime forks: its branches are offered.
        assert_eq!(
            report["tools"],
            json!([
                "drop_branch",
                "fork",
                "get_variable",
                "list_bound",
                "run_cell"
            ])
        );
        let asked = report["asked"].as_array().unwrap();
        // The policy's refusal is never asked about.
        assert_eq!(asked.len(), 3, "{mode}: {asked:?}");
        assert!(asked[1].as_str().unwrap().ends_with("y = 6"));
        let results = report["results"].as_array().unwrap();
        assert_eq!(text(&results[0]), "5\n", "{mode}");
        assert_eq!(results[1]["is_error"], true);
        assert!(text(&results[1]).contains("declined"), "{}", results[1]);
        assert_eq!(results[2]["is_error"], true);
        assert!(
            text(&results[2]).starts_with("Code execution blocked: 1 violation found"),
            "{}",
            results[2]
        );
        assert_eq!(results[3]["is_error"], true);
        assert!(
            text(&results[3]).contains("stopped after 2.0 seconds"),
            "{}",
            results[3]
        );
        // The declined cell did not run.
        assert_eq!(results[4]["structured"], json!({"name": "y", "value": 5}));
        let instructions = report["instructions"].as_str().unwrap();
        for layer in ["network:", "filesystem:", "syscalls:", "no_new_privs:"] {
            assert!(instructions.contains(layer), "{mode}: {instructions}");
            assert!(text(&results[5]).contains(layer), "{}", results[5]);
        }
        let trail = std::fs::read_to_string(&audit).unwrap();
        for record in [
            "\"sandbox\"",
            "\"cell\"",
            "\"approval_asked\"",
            "\"approval_refused\"",
            "\"policy_refused\"",
            "\"cell_result\"",
            "\"cell_timeout\"",
        ] {
            assert!(trail.contains(record), "{mode}: no {record} in {trail}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Over HTTP: nothing without the token; with it, a cell calls an MCP server's tool that the
/// client approves once and refuses once.
#[test]
fn a_session_over_http_needs_its_token_and_asks_about_host_calls() {
    let Some(venv) = servers::venv() else { return };
    let (program, args) = servers::edge_command(&venv);
    let spec = format!("edge={program} {}", args.join(" "));
    let token = "cave-test-token-271828182845904523";
    let mut cave = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args([
            "mcp",
            "serve",
            "--http",
            "--mcp",
            &spec,
            "--approve",
            "calls",
        ])
        .env("CAVE_MCP_TOKEN", token)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(cave.stderr.take().unwrap());
    let mut said = String::new();
    let url = loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "cave ended before it served: {said}"
        );
        said.push_str(&line);
        if let Some(rest) = line.split(" at ").nth(1)
            && line.contains("serving the session over MCP")
        {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let mut lines = String::new();
    stderr.read_line(&mut lines).unwrap();
    assert!(
        !lines.contains(token),
        "a token given in the environment is not printed: {lines}"
    );

    // Without the token, or with another one: 401.
    let authority = url.trim_start_matches("http://").trim_end_matches("/mcp");
    for header in ["", "Authorization: Bearer wrong-token-0000000000000000\r\n"] {
        let mut stream = std::net::TcpStream::connect(authority).unwrap();
        let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        write!(
            stream,
            "POST /mcp HTTP/1.1\r\nHost: {authority}\r\n{header}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    }

    let code = "print(edge.add(2, 3))\ntry:\n    edge.add(1, 1)\nexcept PermissionError as e:\n    print('refused:', e)";
    let plan = json!({
        "server": {"url": url, "token": token},
        "elicit": ["accept", "decline"],
        "calls": [{"tool": "run_cell", "arguments": {"code": code}}],
    });
    let report = drive(&venv, &plan);
    let asked = report["asked"].as_array().unwrap();
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert!(asked[0].as_str().unwrap().contains("edge.add"), "{asked:?}");
    let output = text(&report["results"][0]);
    assert!(output.starts_with("5\nrefused:"), "{output}");

    // Ctrl-C ends it.
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(cave.id() as i32, libc::SIGINT) };
    let status = cave.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

/// The host killed while a cell waits on an MCP tool: neither the kernel's child nor the MCP
/// server outlives it.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_server_leaves_nothing_behind() {
    let Some(venv) = servers::venv() else { return };
    let (program, args) = servers::edge_command(&venv);
    let spec = format!("edge={program} {}", args.join(" "));
    let mut cave = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args([
            "mcp",
            "serve",
            "--runtime",
            "kernel",
            "--mcp",
            &spec,
            "--mcp-timeout",
            "5m",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = cave.stdin.take().unwrap();
    let mut output = BufReader::new(cave.stdout.take().unwrap()).lines();
    let code = "import os\nprint(edge.pid(), os.getpid())";
    for message in [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "cave-test", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "run_cell", "arguments": {"code": code}}}),
    ] {
        writeln!(input, "{message}").unwrap();
    }
    input.flush().unwrap();
    let pids: Vec<u32> = loop {
        let line = output.next().expect("cave answers").unwrap();
        let message: Json = serde_json::from_str(&line).unwrap();
        if message["id"] == 2 {
            let printed = message["result"]["content"][0]["text"].as_str().unwrap();
            break printed
                .split_whitespace()
                .map(|pid| pid.parse().unwrap())
                .collect();
        }
    };
    assert_eq!(pids.len(), 2);
    // Concurrent calls take their turns in no set order: this one goes after the answer.
    let slow = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "run_cell", "arguments": {"code": "edge.slow(120)"}}});
    writeln!(input, "{slow}").unwrap();
    input.flush().unwrap();
    assert!(pids.iter().all(|pid| alive(*pid)));
    // The second cell is now inside the slow call.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    cave.kill().unwrap();
    cave.wait().unwrap();
    assert!(ends(pids[0]), "the MCP server outlived its killed host");
    assert!(ends(pids[1]), "the kernel's child outlived its killed host");
}

/// What cannot be served is said before anything starts: exit 2.
#[test]
fn bad_serving_options_are_usage_errors() {
    for (args, token, said) in [
        (
            vec!["--http=0.0.0.0:0"],
            None,
            "on this machine only (a loopback address",
        ),
        (vec!["--http"], Some("short"), "CAVE_MCP_TOKEN is too short"),
        (
            vec!["--max-exec-timeout", "soon"],
            None,
            "invalid value 'soon'",
        ),
    ] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_cave"));
        command.args(["mcp", "serve"]).args(&args);
        match token {
            Some(token) => command.env("CAVE_MCP_TOKEN", token),
            None => command.env_remove("CAVE_MCP_TOKEN"),
        };
        let out = command.stdin(Stdio::null()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

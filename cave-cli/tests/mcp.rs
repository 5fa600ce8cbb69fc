//! `cave run --mcp` and `cave mcp list` through the binary, with the MCP test servers.

use crate::cli::{KEY, block, command, events, with_stdin};
use crate::support::{Part, Reply, TestServer, answer};
use cave_agent::testing::process::{alive, ends};
use serde_json::Value as Json;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::mcp_servers as servers;

fn edge_spec(venv: &std::path::Path) -> String {
    let (program, args) = servers::edge_command(venv);
    format!("edge={program} {}", args.join(" "))
}

/// The output of the first cell in a run's events.
fn cell_output(events: &[Json]) -> &str {
    events
        .iter()
        .find(|e| e["type"] == "execution_result")
        .and_then(|e| e["output"].as_str())
        .unwrap_or_else(|| panic!("no cell ran: {events:?}"))
}

/// `cave run --json --runtime RUNTIME --mcp SPEC PROMPT` against `server`, which must succeed:
/// its events.
/// `runtime` `jupyter` runs on the test gateway.
fn run_with(server: &TestServer, runtime: &str, spec: &str, prompt: &str) -> Vec<Json> {
    let mut run = command(Some(server), &["run", "--json", "--runtime", runtime]);
    if runtime == "jupyter" {
        let gateway = crate::jupyter::gateway::gateway().expect("the caller checked");
        run.args(["--jupyter-url", &gateway.url])
            .env("JUPYTER_TOKEN", &gateway.token);
    }
    let out = run.args(["--mcp", spec, prompt]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{runtime}: {stderr}");
    events(&out)
}

/// `--approve calls` asks before each tool call (answered on stdin), `--audit` records the
/// calls, and the tools' results reach the cell; on both runtimes.
#[tokio::test(flavor = "multi_thread")]
async fn tool_calls_are_approved_audited_and_answered() {
    let Some(venv) = servers::venv() else { return };
    for runtime in ["inproc", "kernel"] {
        let dir =
            std::env::temp_dir().join(format!("cave-cli-mcp-{runtime}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let audit = dir.join("audit.jsonl");
        let code = "print(edge.add(2, 3))\ntry:\n    edge.word_stats('one two')\nexcept Exception as e:\n    print(type(e).__name__, e)";
        let server =
            TestServer::start([answer(&block(code), 8, "stop"), answer("Five.", 8, "stop")]).await;
        let spec = edge_spec(&venv);
        let mut run = command(
            Some(&server),
            &[
                "run",
                "--json",
                "--runtime",
                runtime,
                "--mcp",
                &spec,
                "--approve",
                "calls",
                "--audit",
                audit.to_str().unwrap(),
                "Add them.",
            ],
        );
        run.current_dir(&dir);
        let out = with_stdin(
            run,
            b"{\"approve\": true}\n{\"approve\": false, \"reason\": \"enough\"}\n",
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{runtime}: {stderr}");
        let events = events(&out);
        let asked: Vec<&Json> = events
            .iter()
            .filter(|e| e["type"] == "approval_requested")
            .collect();
        assert_eq!(asked.len(), 2, "{runtime}: {events:?}");
        assert_eq!(asked[0]["request"]["function"], "edge.add");
        assert_eq!(asked[1]["request"]["function"], "edge.word_stats");
        let output = cell_output(&events);
        assert!(output.starts_with("5\n"), "{runtime}: {output}");
        assert!(
            output.contains("enough"),
            "{runtime}: the refusal reaches the cell: {output}"
        );
        let trail = std::fs::read_to_string(&audit).unwrap();
        assert!(trail.contains("edge.add"), "{runtime}: {trail}");
        assert!(!trail.contains(KEY) && !stderr.contains(KEY));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The host killed in the middle of a cell that waits on a tool: the server does not outlive it.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_host_leaves_no_server_behind() {
    let Some(venv) = servers::venv() else { return };
    let code = "print('server', edge.pid(), flush=True)\nedge.slow(120)";
    let server = TestServer::start([answer(&block(code), 8, "stop")]).await;
    let spec = edge_spec(&venv);
    let mut child = command(
        Some(&server),
        &[
            "run",
            "--json",
            "--mcp",
            &spec,
            "--mcp-timeout",
            "5m",
            "Wait.",
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // The live output, as it comes (a print may arrive in pieces).
    let mut output = String::new();
    let pid: u32 = loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("no pid in the live output: {output:?}"))
            .unwrap();
        let event: Json = serde_json::from_str(&line).unwrap();
        output.push_str(event["chunk"].as_str().unwrap_or(""));
        if let Some(line) = output.strip_prefix("server ")
            && let Some((pid, _)) = line.split_once('\n')
        {
            break pid.parse().unwrap();
        }
    };
    assert!(alive(pid));
    // The cell is now inside the slow call.
    tokio::time::sleep(Duration::from_millis(300)).await;
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(ends(pid), "the MCP server outlived its killed host");
}

/// `cave mcp list`: the object and its methods as the prompt shows them; a server that cannot
/// start is exit 2 with its stderr.
#[test]
fn mcp_list_shows_what_the_model_gets() {
    let Some(venv) = servers::venv() else { return };
    let out = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args(["mcp", "list", &edge_spec(&venv)])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("  type: EdgeTools\n"), "{stdout}");
    assert!(
        stdout.contains("    - add(a: int, b: int = 2) -> int\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("(MCP tool `word-stats` of the server `edge`.)"),
        "{stdout}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args(["mcp", "list", &edge_spec(&venv)])
        .env("EDGE_FAIL_AT_START", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the MCP server `edge` did not start"),
        "{stderr}"
    );
    assert!(
        stderr.contains("missing configuration EDGE_TOKEN"),
        "{stderr}"
    );
    for bad in [
        "edge",
        "2x=cmd",
        "x=https://example.invalid/mcp",
        "x='unclosed",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_cave"))
            .args(["mcp", "list", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
    }
}

/// `--mcp NAME=URL` with `--mcp-header NAME:KEY=ENVVAR`: the server is reached with the header,
/// whose variable the model's code cannot read; without it, or with an unset variable, exit 2.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_over_http_gets_its_header_from_the_environment() {
    let Some(venv) = servers::venv() else { return };
    let edge = servers::HttpEdge::start(&venv, "tok-314159");
    // The last call gets the server to echo its own token: redacted like a secret.
    let code = "import os\nprint(edge.add(20, 22))\nprint(os.environ.get('EDGE_AUTH'))\ntry:\n    edge.fail('echo tok-314159')\nexcept RuntimeError as e:\n    print(e)";
    let server =
        TestServer::start([answer(&block(code), 8, "stop"), answer("42.", 8, "stop")]).await;
    let spec = format!("edge={}", edge.url);
    let out = command(
        Some(&server),
        &[
            "run",
            "--json",
            "--mcp",
            &spec,
            "--mcp-header",
            "edge:Authorization=EDGE_AUTH",
            "Add.",
        ],
    )
    .env("EDGE_AUTH", "Bearer tok-314159")
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let events = events(&out);
    assert_eq!(
        cell_output(&events),
        "42\nNone\nthe MCP tool \"fail\" of `edge` failed: Error executing tool fail: refused: echo [redacted: edge Authorization]\n"
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    // Only in the code the model wrote, never in what came back.
    assert_eq!(printed.matches("tok-314159").count(), 1, "{printed}");

    let listed = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args(["mcp", "list", &spec])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&listed.stderr);
    assert_eq!(listed.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("401"), "{stderr}");
    let listed = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args(["mcp", "list", &spec, "--header", "Authorization=EDGE_AUTH"])
        .env("EDGE_AUTH", "Bearer tok-314159")
        .output()
        .unwrap();
    assert_eq!(
        listed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert!(String::from_utf8_lossy(&listed.stdout).contains("word_stats(text: str)"));
    let unset = command(
        Some(&server),
        &[
            "run",
            "--mcp",
            &spec,
            "--mcp-header",
            "edge:Authorization=CAVE_TEST_UNSET_VAR",
            "x",
        ],
    )
    .env_remove("CAVE_TEST_UNSET_VAR")
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&unset.stderr);
    assert_eq!(unset.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("CAVE_TEST_UNSET_VAR is not set"),
        "{stderr}"
    );
}

/// An MCP tool called from a cell in a kernel behind a Jupyter Kernel Gateway: the host call
/// crosses the Jupyter transport like any other.
#[tokio::test(flavor = "multi_thread")]
async fn tools_are_called_from_a_jupyter_kernel() {
    let Some(venv) = servers::venv() else { return };
    let Some(gateway) = crate::jupyter::gateway::gateway() else {
        return;
    };
    let server = TestServer::start([
        answer(
            &block("print(edge.add(40, 2))\nprint(edge.word_stats('a b c d'))"),
            8,
            "stop",
        ),
        answer("Done.", 8, "stop"),
    ])
    .await;
    let out = command(
        Some(&server),
        &[
            "run",
            "--json",
            "--runtime",
            "jupyter",
            "--jupyter-url",
            &gateway.url,
            "--mcp",
            &edge_spec(&venv),
            "Add.",
        ],
    )
    .env("JUPYTER_TOKEN", &gateway.token)
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let events = events(&out);
    assert_eq!(cell_output(&events), "42\n4 words\n");
}

/// A tool that adds a tool (and says so with `notifications/tools/list_changed`): the next
/// cell calls the new one, on both runtimes. The object is bound anew as the cell ends, while
/// the model writes its next answer (here it takes 300 ms to start: a model answering faster
/// than a task can be scheduled on a loaded machine is not a model).
#[tokio::test(flavor = "multi_thread")]
async fn a_changed_tool_list_is_taken_before_the_next_cell() {
    let Some(venv) = servers::venv() else { return };
    for runtime in ["inproc", "kernel"] {
        let Reply::Sse(mut thinking) = answer(&block("print(edge.extra())"), 8, "stop") else {
            unreachable!("an answer is a stream")
        };
        thinking.insert(0, Part::Pause(Duration::from_millis(300)));
        let server = TestServer::start([
            answer(&block("print(edge.grow())"), 8, "stop"),
            Reply::Sse(thinking),
            answer("Done.", 8, "stop"),
        ])
        .await;
        let events = run_with(&server, runtime, &edge_spec(&venv), "Grow.");
        let outputs: Vec<&str> = events
            .iter()
            .filter(|e| e["type"] == "execution_result")
            .map(|e| e["output"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(outputs, ["grown\n", "extra here\n"], "{runtime}");
    }
}

/// A tool that never answers: the cell's time limit (`--max-exec-timeout`) stops the cell like
/// any other, the model is told it was stopped (not that a call cannot be interrupted), and the
/// next cell runs at once; on both runtimes.
#[tokio::test(flavor = "multi_thread")]
async fn a_tool_that_never_answers_is_stopped_at_the_time_limit() {
    let Some(venv) = servers::venv() else { return };
    let spec = edge_spec(&venv);
    for runtime in ["inproc", "kernel"] {
        let server = TestServer::start([
            answer(
                &block("print('calling', flush=True)\nedge.hang()"),
                8,
                "stop",
            ),
            answer(&block("print('next', edge.add(1, 2))"), 8, "stop"),
            answer("Done.", 8, "stop"),
        ])
        .await;
        let out = command(
            Some(&server),
            &[
                "run",
                "--json",
                "--runtime",
                runtime,
                "--mcp",
                &spec,
                "--max-exec-timeout",
                "2s",
                // Longer than the cell's limit: the cell is stopped while the call waits.
                "--mcp-timeout",
                "5m",
                "Call it.",
            ],
        )
        .stdin(Stdio::null())
        .output()
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{runtime}: {stderr}");
        let events = events(&out);
        let stopped: Vec<&Json> = events
            .iter()
            .filter(|e| e["type"] == "execution_timeout")
            .collect();
        assert_eq!(stopped.len(), 1, "{runtime}: {events:?}");
        assert_eq!(stopped[0]["timeout"], 2.0);
        // What the model was told about the first cell, in the second request.
        let asked = server.received();
        let told = asked[1].body["messages"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()["content"]
            .to_string();
        assert!(
            told.contains("stopped after 2.0 seconds"),
            "{runtime}: {told}"
        );
        assert!(
            !told.contains("cannot be interrupted"),
            "{runtime}: the call was dropped: {told}"
        );
        assert_eq!(
            cell_output(&events),
            "next 3\n",
            "{runtime}: the next cell ran: {events:?}"
        );
    }
}

/// A server of 500 tools: the first request names the server in a line instead of listing
/// every tool, the model's code finds the tool with `search_tools`, a number comes back as a
/// number (not the SDK's `{'result': ...}`), a structured result comes back as the dict its schema describes,
/// and ten calls of a slow tool made with
/// `asyncio.gather` over `.aio` are all answered, and the next request's system prompt is the
/// first one's, byte for byte; on both local runtimes and through the Jupyter transport.
#[tokio::test(flavor = "multi_thread")]
async fn five_hundred_tools_are_found_from_the_runtime() {
    let Some(venv) = servers::venv() else { return };
    let (program, args) = servers::many_command(&venv);
    let spec = format!("many={program} {}", args.join(" "));
    let code = "print(search_tools('temperature in degrees fahrenheit', limit=2))
print(many.fahrenheit(100))
f = many.forecast('Paris')
print(f['celsius'], f['summary'])
import asyncio
print(await asyncio.gather(*(many.slow.aio(i) for i in range(10))))";
    let jupyter = crate::jupyter::gateway::gateway().map(|_| "jupyter");
    for runtime in ["inproc", "kernel"].into_iter().chain(jupyter) {
        let server =
            TestServer::start([answer(&block(code), 8, "stop"), answer("Done.", 8, "stop")]).await;
        server.record(true);
        let events = run_with(&server, runtime, &spec, "Convert.");
        let output = cell_output(&events);
        assert!(
            output.starts_with("many.fahrenheit(celsius: float) -> float\n    Converts a temperature from degrees Celsius to degrees Fahrenheit."),
            "{runtime}: {output}"
        );
        assert!(
            output.ends_with("212.0\n18.5 clouds\n[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n"),
            "{runtime}: {output}"
        );
        let first = &server.received()[0].body;
        let messages = serde_json::to_string(&first["messages"]).unwrap();
        assert!(
            messages.len() <= 8_000,
            "{runtime}: the first request's messages take {} characters",
            messages.len()
        );
        assert!(messages.contains("search_tools"), "{runtime}: {messages}");
        assert!(
            !messages.contains("list_invoice"),
            "{runtime}: tools are not listed"
        );
        let second = &server.received()[1].body;
        assert_eq!(
            first["messages"][0], second["messages"][0],
            "{runtime}: the system prompt is kept as it was"
        );
    }
}

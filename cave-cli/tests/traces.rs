//! `cave run --otlp URL`, the `OTEL_*` variables and `--trace-content`: a run's trace reaches a
//! real OTLP receiver (Arize Phoenix) with its MCP tool call under its cell, and neither the
//! secret nor the API key is in any attribute; code and output only with the opt-in.

use crate::cli::{KEY, block, command};
use crate::mcp_servers as servers;
use crate::support::{TestServer, answer};
use cave_agent::testing::phoenix::{Phoenix, attribute, named, parent, recorded_cells};
use serde_json::Value as Json;

const SECRET: &str = "tok-cli-trace-31c2b1a0";

#[tokio::test(flavor = "multi_thread")]
async fn runs_are_traced_to_phoenix_without_secrets() {
    let Some(venv) = servers::venv() else { return };
    let Some(phoenix) = tokio::task::spawn_blocking(Phoenix::start).await.unwrap() else {
        return;
    };
    let (program, args) = servers::edge_command(&venv);
    let edge = format!("edge={program} {}", args.join(" "));

    // `--otlp`, the default runtime, an MCP tool call, a secret: nothing of the cells.
    let server = TestServer::start([
        answer(&block("print(edge.add(2, 3))\nprint(token)"), 8, "stop"),
        answer("Five.", 8, "stop"),
    ])
    .await;
    let out = command(
        Some(&server),
        &[
            "run",
            "--json",
            "--otlp",
            &phoenix.otlp_url(),
            "--mcp",
            &edge,
            "--secret",
            "token=CAVE_TRACE_TOKEN",
            "Add them.",
        ],
    )
    .env("CAVE_TRACE_TOKEN", SECRET)
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The standard variables instead, and the cell's code and output recorded (redacted).
    let server = TestServer::start([
        answer(&block("print('seen', token)"), 8, "stop"),
        answer("Done.", 8, "stop"),
    ])
    .await;
    let out = command(
        Some(&server),
        &[
            "run",
            "--json",
            "--trace-content",
            "--secret",
            "token=CAVE_TRACE_TOKEN",
            "Show it.",
        ],
    )
    .env("CAVE_TRACE_TOKEN", SECRET)
    .env("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix.otlp_url())
    .env("OTEL_SERVICE_NAME", "cave-cli-test")
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Each run: itself, 2 steps, 2 chats, a cell; the first run's tool call.
    let spans = tokio::task::spawn_blocking(move || phoenix.spans(13))
        .await
        .unwrap();
    assert_eq!(spans.len(), 13, "{spans:#?}");
    let roots: Vec<&Json> = spans.iter().filter(|s| s["parent_id"].is_null()).collect();
    assert_eq!(roots.len(), 2, "{spans:#?}");
    assert!(roots.iter().all(|r| r["name"] == "invoke_agent cave-agent"));
    assert!(
        roots
            .iter()
            .all(|r| attribute(r, "gen_ai.request.model") == "test-model")
    );

    let call = named(&spans, "execute_tool edge.add");
    assert_eq!(call.len(), 1, "{spans:#?}");
    assert_eq!(attribute(call[0], "gen_ai.tool.name"), "edge.add");
    let cell = parent(&spans, call[0]).expect("the cell");
    assert_eq!(cell["name"], "execute_tool python");
    assert!(
        attribute(cell, "gen_ai.tool.call.arguments").is_null(),
        "{cell}"
    );
    assert!(
        attribute(cell, "gen_ai.tool.call.result").is_null(),
        "{cell}"
    );
    let step = parent(&spans, cell).expect("the step");
    let run = parent(&spans, step).expect("the run");
    assert!(run["parent_id"].is_null());
    let chats: Vec<&Json> = spans
        .iter()
        .filter(|s| attribute(s, "gen_ai.operation.name") == "chat")
        .collect();
    assert_eq!(chats.len(), 4, "{spans:#?}");
    assert!(
        chats
            .iter()
            .all(|c| attribute(c, "gen_ai.usage.input_tokens").as_i64() > Some(0)),
        "{chats:#?}"
    );

    let recorded = recorded_cells(&spans);
    assert_eq!(recorded.len(), 1, "{spans:#?}");
    assert_eq!(recorded[0].0, "print('seen', token)");
    assert!(recorded[0].1.starts_with("seen "), "{recorded:?}");

    let text = serde_json::to_string(&spans).unwrap();
    assert!(!text.contains(SECRET), "the secret reached the traces");
    assert!(!text.contains(KEY), "the API key reached the traces");
}

/// `--trace-content` with nowhere to send traces, and an `--otlp` that is not a URL: usage
/// errors that say what to give, before any model call.
#[test]
fn trace_options_are_checked() {
    let out = command(None, &["run", "--trace-content", "Go."])
        .env("LLM_MODEL_ID", "m")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--otlp URL"), "{stderr}");
    let out = command(None, &["run", "--otlp", "127.0.0.1:4318", "Go."])
        .env("LLM_MODEL_ID", "m")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("http://"), "{stderr}");
}

/// A receiver that is not there does not fail the run: it completes, and stderr says the
/// traces were not all sent.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_receiver_does_not_fail_the_run() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let server = TestServer::start([answer("Nothing to do.", 8, "stop")]).await;
    let out = command(Some(&server), &["run", "--json", "--otlp", &url, "Go."])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("could not be sent to"), "{stderr}");
}

//! Spans exported to a real OTLP receiver, Arize Phoenix (PyPI), and read back over its REST
//! API: the run's tree, its GenAI attributes and token counts, and nothing of the secret.
//! Needs `CAVE_PHOENIX` (the `phoenix` executable) or `target/phoenix-venv`; says so and skips
//! without one.

use cave_core::{Agent, Resources, Runtime, Variable};
use cave_testing::{EchoRuntime, Reply, ScriptedModel};
use serde_json::Value as Json;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: &str = "tok-otel-5a4b3c2d1e";

fn phoenix() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CAVE_PHOENIX") {
        return Some(PathBuf::from(path));
    }
    let venv = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../target/phoenix-venv/bin/phoenix"
    ));
    venv.exists().then_some(venv)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Phoenix server on free ports, in a working directory of its own; killed when dropped.
struct Phoenix {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

fn start(phoenix: PathBuf) -> Phoenix {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("cave-phoenix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let child = Command::new(phoenix)
        .arg("serve")
        .env("PHOENIX_WORKING_DIR", &dir)
        .env("PHOENIX_PORT", port.to_string())
        .env("PHOENIX_GRPC_PORT", free_port().to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("phoenix starts");
    let server = Phoenix { child, port, dir };
    let begun = Instant::now();
    while get(port, "/healthz").is_none() {
        assert!(
            begun.elapsed() < Duration::from_secs(120),
            "phoenix did not come up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    server
}

/// The spans of the default project, read back (chunked bodies are joined naively: Phoenix
/// answers small JSON; a JSON parse failure means "not yet").
fn spans(port: u16) -> Vec<Json> {
    let Some(body) = get(port, "/v1/projects/default/spans?limit=100") else {
        return Vec::new();
    };
    let json = body
        .find('{')
        .and_then(|start| body.rfind('}').map(|end| &body[start..=end]))
        .and_then(|text| serde_json::from_str::<Json>(text).ok());
    json.and_then(|j| j["data"].as_array().cloned())
        .unwrap_or_default()
}

#[test]
fn a_run_reaches_phoenix_as_a_genai_trace() {
    let Some(executable) = phoenix() else {
        println!(
            "skipped: no phoenix (CAVE_PHOENIX or target/phoenix-venv; `cargo xtask test` installs it)"
        );
        return;
    };
    let server = start(executable);
    let guard = cave_otel::install(
        cave_otel::OtlpConfig::new(format!("http://127.0.0.1:{}", server.port))
            .service_name("cave-otel-test"),
    )
    .expect("installs");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let runtime = Arc::new(EchoRuntime::new());
        runtime
            .register(Resources::new().variable(Variable::secret("token", SECRET)))
            .await
            .unwrap();
        let model = Arc::new(ScriptedModel::new([
            Reply::text(format!("```python\nprint('{SECRET}')\n```")),
            Reply::text("Done."),
        ]));
        let mut agent = Agent::builder(model, runtime).build().unwrap();
        assert_eq!(agent.run("Go.").await.content, "Done.");
    });
    // Flushes and shuts the exporter down.
    drop(guard);
    let begun = Instant::now();
    let mut found = Vec::new();
    while begun.elapsed() < Duration::from_secs(30) {
        found = spans(server.port);
        if found.len() >= 6 {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let named = |name: &str| -> Vec<&Json> { found.iter().filter(|s| s["name"] == name).collect() };
    let run = named("invoke_agent cave-agent");
    assert_eq!(run.len(), 1, "{found:#?}");
    let run = run[0];
    assert!(run["parent_id"].is_null());
    assert_eq!(run["attributes"]["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(run["attributes"]["cave.stop_reason"], "completed");
    let run_id = run["context"]["span_id"].clone();
    let steps = named("step");
    assert_eq!(steps.len(), 2, "{found:#?}");
    assert!(steps.iter().all(|s| s["parent_id"] == run_id));
    let chats: Vec<&Json> = found
        .iter()
        .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with("chat ")))
        .collect();
    assert_eq!(chats.len(), 2);
    for chat in &chats {
        assert!(
            chat["attributes"]["gen_ai.usage.input_tokens"]
                .as_i64()
                .unwrap_or(0)
                > 0,
            "{chat}"
        );
    }
    let cells = named("execute_tool python");
    assert_eq!(cells.len(), 1);
    assert!(
        cells[0]["attributes"]
            .get("gen_ai.tool.call.arguments")
            .is_none()
    );
    let text = serde_json::to_string(&found).unwrap();
    assert!(!text.contains(SECRET), "the secret reached the traces");
}

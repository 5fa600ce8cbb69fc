//! `cave run --runtime kernel`, through the binary.

use crate::support::{TestServer, answer};
use serde_json::{Value as Json, json};
use std::process::{Command, Output};

const KEY: &str = "sk-kernel-test-secret-7777";

fn block(code: &str) -> String {
    format!("```python\n{code}\n```")
}

fn cave(server: &TestServer, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cave"))
        .args(["run", "--json", "--runtime", "kernel"])
        .args(args)
        .env("LLM_MODEL_ID", "test-model")
        .env("LLM_BASE_URL", server.base_url())
        .env("LLM_API_KEY", KEY)
        .output()
        .expect("the binary runs")
}

fn events(output: &Output) -> Vec<Json> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn results(events: &[Json]) -> Vec<&Json> {
    events
        .iter()
        .filter(|e| e["type"] == "execution_result" || e["type"] == "execution_timeout")
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn variables_files_and_retrieval_work_on_the_kernel() {
    let dir = std::env::temp_dir().join(format!("cave-cli-kernel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let module = dir.join("tools.py");
    std::fs::write(
        &module,
        "def double(x: int) -> int:\n    \"\"\"Twice x.\"\"\"\n    return 2 * x\n",
    )
    .expect("writes");
    let server = TestServer::start([
        answer(
            &block("import os\ndata.append(double(4))\nprint(sum(data), os.getpid() != parent)"),
            8,
            "stop",
        ),
        answer("Done.", 8, "stop"),
    ])
    .await;
    let parent = std::process::id().to_string();
    let out = cave(
        &server,
        &[
            "--var",
            "data=[1, 2]",
            "--var",
            &format!("parent={parent}"),
            "--py",
            module.to_str().expect("utf-8 path"),
            "--retrieve",
            "data",
            "Add.",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = events(&out);
    assert_eq!(results(&events)[0]["output"], "11 True\n");
    let retrieved = events
        .iter()
        .find(|e| e["type"] == "retrieved")
        .expect("retrieved");
    assert_eq!(
        retrieved,
        &json!({"type": "retrieved", "name": "data", "value": [1, 2, 8]})
    );
    let system = server.received()[0].body["messages"][0]["content"].clone();
    assert!(
        system
            .as_str()
            .expect("text")
            .contains("double(x: int) -> int")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_is_reported_and_the_model_carries_on() {
    let server = TestServer::start([
        answer(&block("import ctypes\nctypes.string_at(0)"), 8, "stop"),
        answer(&block("print(data, 'lost' in globals())"), 8, "stop"),
        answer("Recovered.", 8, "stop"),
    ])
    .await;
    let out = cave(&server, &["--var", "data=[1]", "Crash, then look."]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = events(&out);
    let results = results(&events);
    assert_eq!(results[0]["success"], false);
    assert_eq!(results[0]["state_lost"], true);
    assert!(
        results[0]["output"]
            .as_str()
            .expect("text")
            .contains("SIGSEGV"),
        "{}",
        results[0]
    );
    assert_eq!(results[1]["output"], "[1] False\n");
    // The model was told its state was lost.
    let second = &server.received()[1].body["messages"];
    let told = second
        .as_array()
        .expect("messages")
        .iter()
        .any(|m| m["content"].as_str().is_some_and(|c| c.contains("SIGSEGV")));
    assert!(told, "{second}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_cell_times_out_and_the_key_is_not_in_the_child() {
    let server = TestServer::start([
        answer(&block("while True:\n    try:\n        import time; time.sleep(10)\n    except BaseException:\n        pass"), 8, "stop"),
        answer(&block("import os\nprint(sorted(k for k in os.environ if 'KEY' in k or 'LLM' in k))"), 8, "stop"),
        answer("Done.", 8, "stop"),
    ])
    .await;
    let out = cave(
        &server,
        &["--max-exec-timeout", "500ms", "--memory-limit", "2G", "go"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = events(&out);
    let results = results(&events);
    assert_eq!(results[0]["type"], "execution_timeout");
    assert_eq!(results[0]["state_lost"], true);
    assert_eq!(results[1]["output"], "[]\n");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains(KEY));
}

#[test]
fn kernel_options_need_the_kernel_runtime() {
    let out = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args(["run", "--model", "m", "--memory-limit", "1G", "hi"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--memory-limit applies to the kernel runtime"),
        "{stderr}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args([
            "run",
            "--model",
            "m",
            "--runtime",
            "kernel",
            "--memory-limit",
            "12X",
            "hi",
        ])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("K, M, G or T"));
}

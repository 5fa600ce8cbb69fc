//! `cave run --session DIR`: a value built in one process is there in the next process's
//! first cell, on both runtimes; the runtime options come back with the session; the model is
//! told in one line what came back; a newer session directory is refused.

use crate::support::{TestServer, answer};
use serde_json::Value as Json;
use std::path::Path;
use std::process::{Command, Output};

fn block(code: &str) -> String {
    format!("```python\n{code}\n```")
}

fn cave(server: &TestServer, runtime: &str, session: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cave"));
    command.args(["run", "--json", "--runtime", runtime]);
    if runtime == "jupyter" {
        let gateway = crate::jupyter::gateway::gateway().expect("a gateway");
        command
            .args(["--jupyter-url", &gateway.url])
            .env("JUPYTER_TOKEN", &gateway.token);
    }
    command
        .arg("--session")
        .arg(session)
        .args(args)
        .env("LLM_MODEL_ID", "test-model")
        .env("LLM_BASE_URL", server.base_url())
        .env("LLM_API_KEY", "sk-session-test-4242")
        .output()
        .expect("the binary runs")
}

fn outputs(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Json>(l).ok())
        .filter(|e| e["type"] == "execution_result")
        .map(|e| e["output"].as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn resumes_on(runtime: &str) {
    let dir =
        std::env::temp_dir().join(format!("cave-cli-session-{runtime}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let module = dir.join("shapes.py");
    std::fs::write(
        &module,
        "class Point:\n    \"\"\"A point.\"\"\"\n    def __init__(self, x: int, y: int):\n        self.x = x\n        self.y = y\n",
    )
    .unwrap();
    let session = dir.join("session");
    // `conn` is a value no session can save; a lock, which every sandbox lets a cell make (a
    // socket is refused where there are no namespaces).
    let first = TestServer::start([
        answer(
            &block(
                "import threading\ntotals = [base * 2, 3]\np = Point(1, 2)\nconn = threading.Lock()",
            ),
            8,
            "stop",
        ),
        answer("Built.", 8, "stop"),
    ])
    .await;
    let out = cave(
        &first,
        runtime,
        &session,
        &[
            "--var",
            "base=21",
            "--py",
            module.to_str().unwrap(),
            "Build.",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("keeps all but: conn ("), "{stderr}");

    // A new process, nothing repeated but the directory.
    let second = TestServer::start([
        answer(
            &block("print(totals, p.x + p.y, base, 'conn' in globals())"),
            8,
            "stop",
        ),
        answer("Resumed.", 8, "stop"),
    ])
    .await;
    let out = cave(&second, runtime, &session, &["Go on."]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(outputs(&out), ["[42, 3] 3 21 False\n"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("restored: "), "{stderr}");
    // The model sees the earlier conversation and the line.
    let messages = second.received()[0].body["messages"].clone();
    let texts: Vec<String> = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(texts.iter().any(|t| t == "Build."), "{texts:?}");
    let line = texts
        .iter()
        .find(|t| t.starts_with("[session resumed]"))
        .unwrap_or_else(|| panic!("no resume line: {texts:?}"));
    assert!(line.contains("p") && line.contains("totals"), "{line}");
    assert!(line.contains("not restored: conn ("), "{line}");
    assert_eq!(texts.last().unwrap(), "Go on.");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_resumes_in_process() {
    resumes_on("inproc").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_resumes_on_the_kernel() {
    resumes_on("kernel").await;
}

/// Through a Jupyter kernel: the values are saved and restored by the kernel's Python, into a
/// new kernel the next process starts.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_resumes_on_a_jupyter_kernel() {
    if crate::jupyter::gateway::gateway().is_none() {
        return;
    }
    resumes_on("jupyter").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_newer_session_directory_is_refused() {
    let dir = std::env::temp_dir().join(format!("cave-cli-session-newer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("session.json"),
        r#"{"format_version": 9, "generation": 1, "history": "history-1.json"}"#,
    )
    .unwrap();
    let server = TestServer::start([answer("unused", 8, "stop")]).await;
    let out = cave(&server, "inproc", &dir, &["Hi."]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("format version 9") && stderr.contains("upgrade cave-agent"),
        "{stderr}"
    );
    assert!(server.received().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `cave chat --session DIR`: a value bound in one chat is there in the next one's first cell.
#[tokio::test(flavor = "multi_thread")]
async fn a_chat_session_resumes() {
    use std::io::Write as _;
    let dir = std::env::temp_dir().join(format!("cave-cli-session-chat-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let chat = |server: &TestServer, input: &str| -> Output {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cave"))
            .args(["chat", "--json", "--session"])
            .arg(&dir)
            .env("LLM_MODEL_ID", "test-model")
            .env("LLM_BASE_URL", server.base_url())
            .env("LLM_API_KEY", "sk-session-test-4242")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the binary runs");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let first = TestServer::start([
        answer(&block("notes = ['first']"), 8, "stop"),
        answer("Noted.", 8, "stop"),
    ])
    .await;
    let out = chat(&first, "Note something.\n");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second = TestServer::start([
        answer(&block("notes.append('second')\nprint(notes)"), 8, "stop"),
        answer("Both.", 8, "stop"),
    ])
    .await;
    let out = chat(&second, "Add one.\n");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(outputs(&out), ["['first', 'second']\n"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A turn in which the runtime lost its state (the kernel's process died) does not overwrite
/// the values saved before it: the next start still has them.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_state_keeps_the_values_saved_before() {
    let dir = std::env::temp_dir().join(format!("cave-cli-session-lost-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let first = TestServer::start([
        answer(&block("kept = 41"), 8, "stop"),
        answer("Kept.", 8, "stop"),
        answer(&block("import os\nos._exit(1)"), 8, "stop"),
        answer("It crashed.", 8, "stop"),
    ])
    .await;
    let out = cave(&first, "kernel", &dir, &["Keep.", "Crash."]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("keeps the values saved before"), "{stderr}");
    let second = TestServer::start([
        answer(&block("print(kept + 1)"), 8, "stop"),
        answer("Back.", 8, "stop"),
    ])
    .await;
    let out = cave(&second, "kernel", &dir, &["Still there?"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(outputs(&out), ["42\n"]);
    let _ = std::fs::remove_dir_all(&dir);
}

//! `cave` against a real LiteLLM proxy (`litellm[proxy]`, `mock_response` models) on 127.0.0.1:
//! both providers, reported usage, an unknown model, a wrong key, and a code answer that runs.
//!
//! `cargo xtask test` installs the proxy in `target/litellm-venv` (or set `CAVE_LITELLM` to a
//! `litellm` executable); without it the test says so in one line and passes.

use serde_json::Value as Json;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const MASTER_KEY: &str = "sk-litellm-test-master";

fn litellm() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CAVE_LITELLM").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let local = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/litellm-venv/bin/litellm"
    ));
    local.is_file().then_some(local)
}

/// The proxy's program, or `None` after saying the test skips.
fn litellm_or_skip() -> Option<PathBuf> {
    let program = litellm();
    if program.is_none() {
        eprintln!(
            "skipped: the LiteLLM proxy is not installed (cargo xtask test installs it in target/litellm-venv; or set CAVE_LITELLM)"
        );
    }
    program
}

/// A running proxy, killed when dropped.
struct Proxy {
    child: Child,
    port: u16,
    /// Its configuration, removed once the proxy has stopped (`drop` runs before the fields
    /// drop).
    _dir: cave_agent::testing::TestDir,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proxy {
    fn start(program: &PathBuf) -> Proxy {
        Self::with_models(program, "")
    }

    /// A proxy with the test's mock models and `models` (more `model_list` entries).
    fn with_models(program: &PathBuf, models: &str) -> Proxy {
        // One directory a proxy: tests start proxies at the same time.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = cave_agent::testing::TestDir::new(&format!("litellm-{n}"));
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "model_list:\n  - model_name: mock-answer\n    litellm_params:\n      model: openai/mock-answer\n      api_key: fake\n      mock_response: \"The answer is 42.\"\n  - model_name: mock-code\n    litellm_params:\n      model: openai/mock-code\n      api_key: fake\n      mock_response: \"Let me compute it.\\n```python3\\nprint(6 * 7)\\n\"\n{models}router_settings:\n  num_retries: 0\ngeneral_settings:\n  master_key: {MASTER_KEY}\n"
            ),
        )
        .expect("config");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(program)
            .args(["--config"])
            .arg(&config)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the proxy starts");
        let proxy = Proxy {
            child,
            port,
            _dir: dir,
        };
        // Generous: the proxy imports a lot before it listens.
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() && health(port) {
                return proxy;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("the LiteLLM proxy did not become ready");
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// `GET /health/liveliness` answers 200.
fn health(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!(
        "GET /health/liveliness HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.starts_with("HTTP/1.1 200")
}

fn cave(proxy: &Proxy, key: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cave"))
        .args(["run", "--json", "--base-url", &proxy.base_url()])
        .args(args)
        .env("LLM_API_KEY", key)
        .env_remove("LLM_MODEL_ID")
        .env_remove("LLM_BASE_URL")
        .output()
        .expect("cave runs")
}

fn events(output: &Output) -> Vec<Json> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn stopped(events: &[Json]) -> &Json {
    events
        .last()
        .filter(|e| e["type"] == "stopped")
        .expect("a stopped event last")
}

#[test]
fn cave_against_a_real_litellm_proxy() {
    let Some(program) = litellm_or_skip() else {
        return;
    };
    let proxy = Proxy::start(&program);

    // Both providers stream an answer and get the proxy's own usage figures.
    for provider in ["litellm", "openai"] {
        let out = cave(
            &proxy,
            MASTER_KEY,
            &[
                "--provider",
                provider,
                "--model",
                "mock-answer",
                "What is it?",
            ],
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{provider}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let events = events(&out);
        let stop = stopped(&events);
        assert_eq!(stop["content"], "The answer is 42.", "{provider}");
        assert_eq!(
            stop["usage"]["estimated"], false,
            "{provider}: reported, not estimated: {stop}"
        );
        assert!(
            stop["usage"]["prompt_tokens"].as_u64().unwrap_or(0) > 0,
            "{stop}"
        );
        let texts = events.iter().filter(|e| e["type"] == "text").count();
        assert!(texts > 1, "{provider}: streamed in pieces");
    }

    // An unknown model: the proxy's 400, as an invalid request.
    let out = cave(
        &proxy,
        MASTER_KEY,
        &["--provider", "litellm", "--model", "no-such-model", "hi"],
    );
    assert_eq!(out.status.code(), Some(1));
    let stop = stopped(&events(&out)).clone();
    assert_eq!(stop["stop_reason"], "model_error");
    assert_eq!(stop["error"]["kind"], "invalid_request", "{stop}");
    assert!(
        stop["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("no-such-model"),
        "{stop}"
    );

    // A wrong key: refused, and the key appears nowhere.
    let wrong = "sk-wrong-key-0000";
    let out = cave(
        &proxy,
        wrong,
        &["--provider", "litellm", "--model", "mock-answer", "hi"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stopped(&events(&out))["stop_reason"], "model_error");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains(wrong) && !all.contains("0000"), "{all}");

    // A small model's answer: a ```python3 block it never closes. It runs.
    let out = cave(
        &proxy,
        MASTER_KEY,
        &[
            "--provider",
            "litellm",
            "--model",
            "mock-code",
            "--max-steps",
            "1",
            "What is 6 times 7?",
        ],
    );
    let events = events(&out);
    let code = events
        .iter()
        .find(|e| e["type"] == "code")
        .expect("a code event");
    assert_eq!(code["code"], "print(6 * 7)");
    assert_eq!(code["unclosed"], true);
    let result = events
        .iter()
        .find(|e| e["type"] == "execution_result")
        .expect("it ran");
    assert_eq!(result["output"], "42\n");
}

/// A priced model behind a proxy that puts each call's cost in the streamed usage: the ledger
/// takes the proxy's figure as reported, not the price given on the command line.
#[test]
fn the_proxy_reports_what_a_call_cost() {
    let Some(program) = litellm_or_skip() else {
        return;
    };
    let proxy = Proxy::with_models(
        &program,
        "  - model_name: mock-priced\n    litellm_params:\n      model: openai/mock-priced\n      api_key: fake\n      mock_response: \"The answer is 42.\"\n    model_info:\n      input_cost_per_token: 0.000002\n      output_cost_per_token: 0.00001\nlitellm_settings:\n  include_cost_in_streaming_usage: true\n",
    );
    let out = cave(
        &proxy,
        MASTER_KEY,
        &[
            "--provider",
            "litellm",
            "--model",
            "mock-priced",
            "--price",
            "1000,1000",
            "What is it?",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = events(&out);
    let stop = stopped(&events);
    let usage = &stop["usage"];
    let cost = &stop["ledger"]["cost"];
    let expected = usage["prompt_tokens"].as_f64().unwrap() * 2e-6
        + usage["completion_tokens"].as_f64().unwrap() * 1e-5;
    let reported = cost["reported"].as_f64().unwrap();
    assert!(
        expected > 0.0 && (reported - expected).abs() < 1e-9,
        "{stop}"
    );
    assert_eq!(cost["computed"].as_f64(), Some(0.0), "{stop}");
}

/// A failure upstream after part of the answer streamed: the proxy reports it inside the
/// stream. `cave` classifies the provider's message, drops the half answer, asks again from
/// the start, and the answer it shows is the second one alone.
#[test]
fn an_upstream_failure_mid_stream_through_the_proxy_is_asked_again() {
    use crate::support::{Part, Reply, TestServer, answer, text};
    let Some(program) = litellm_or_skip() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for provider in ["litellm", "openai"] {
        let failing = Reply::Sse(vec![
            text("Half of an answer"),
            text(" that never ends"),
            Part::Data(serde_json::json!({"error": {
                "message": "upstream overloaded, try again later",
                "type": "server_error",
                "code": "overloaded"
            }})),
        ]);
        let upstream = runtime.block_on(TestServer::start([
            failing,
            answer("The answer is 42.", 4, "stop"),
        ]));
        let proxy = Proxy::with_models(
            &program,
            &format!(
                "  - model_name: upstream\n    litellm_params:\n      model: openai/upstream\n      api_key: fake\n      api_base: {}\n",
                upstream.base_url()
            ),
        );
        let out = cave(
            &proxy,
            MASTER_KEY,
            &["--provider", provider, "--model", "upstream", "What is it?"],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);

        let events = events(&out);
        let stop = stopped(&events);
        assert_eq!(out.status.code(), Some(0), "{provider}: {stop} {stderr}");
        assert_eq!(stop["content"], "The answer is 42.", "{provider}: {stop}");
        let at = events
            .iter()
            .position(|e| e["type"] == "backoff")
            .unwrap_or_else(|| panic!("{provider}: a backoff event: {events:?}"));
        let backoff = &events[at];
        // The proxy sent part of the answer before the error: it came inside the stream.
        assert!(
            events[..at]
                .iter()
                .any(|e| e["type"] == "text" && e["content"] == "Half of an answer"),
            "{provider}: {events:?}"
        );
        assert!(
            backoff["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("upstream overloaded"),
            "{provider}: the provider's message is kept: {backoff}"
        );
        assert_eq!(upstream.received().len(), 2, "{provider}: asked again once");
    }
}

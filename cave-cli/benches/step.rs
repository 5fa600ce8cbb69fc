//! The cost of one agent step through the `cave` binary against a local SSE server (the same
//! 60-character answer with a code block, streamed in 8-character chunks, at every step), on
//! the in-process and the kernel runtime; and the server's own floor per request, measured in
//! the same run by a bare HTTP client sending the very requests a run sent (the history grows
//! with each step, and the server reads each body), which a step cannot go below.
//!
//! A step's figure is the difference between a run of `STEPS + 1` steps and a run of one,
//! divided by `STEPS`: start-up and shutdown cancel out.

#[path = "../../cave-models/tests/support/mod.rs"]
#[allow(dead_code)]
mod support;

use criterion::{Criterion, criterion_group, criterion_main};
use std::io::{Read as _, Write as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const STEPS: u32 = 50;
const REPLY: &str = "Computing.\n```python\nresult = 5 + 3\nprint(result)\n```";

/// One `cave run` of `steps` steps, timed to its exit.
fn cave(base_url: &str, runtime: &str, steps: u32) -> Duration {
    let start = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args(["run", "--json", "--runtime", runtime, "--max-steps"])
        .arg(steps.to_string())
        .arg("Compute.")
        .env("LLM_MODEL_ID", "bench-model")
        .env("LLM_BASE_URL", base_url)
        .env("LLM_API_KEY", "sk-bench")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("the cave binary runs");
    // Every answer has code: the run stops at its step limit (exit status 1).
    assert_eq!(status.code(), Some(1), "cave run failed");
    start.elapsed()
}

/// One request as the model adapter makes it, on a connection kept alive between requests (as
/// the adapter keeps its own), read to the end of the stream.
fn bare_request(stream: &mut std::net::TcpStream, address: &str, body: &str) -> Duration {
    let start = Instant::now();
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("sent");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.ends_with(b"0\r\n\r\n") {
        let n = stream.read(&mut buf).expect("read");
        assert!(n > 0, "the server closed the connection mid-stream");
        answer.extend_from_slice(&buf[..n]);
    }
    start.elapsed()
}

fn steps(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(support::TestServer::repeating(support::answer(
        REPLY, 8, "stop",
    )));
    let base_url = server.base_url();
    let address = base_url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let mut group = c.benchmark_group("cave_step");
    group.sample_size(10);
    // The bodies of a whole run, as the floor's requests: its history grows step by step.
    server.record(true);
    cave(&base_url, "inproc", STEPS + 1);
    server.record(false);
    let bodies: Vec<String> = server
        .received()
        .iter()
        .map(|r| r.body.to_string())
        .collect();
    assert_eq!(bodies.len(), STEPS as usize + 1, "one request a step");
    group.bench_function("server_floor_per_request", |b| {
        let mut stream = std::net::TcpStream::connect(&address).expect("the server listens");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        let mut next = bodies.iter().cycle();
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| bare_request(&mut stream, &address, next.next().unwrap()))
                .sum()
        })
    });
    for runtime in ["inproc", "kernel"] {
        cave(&base_url, runtime, 1); // warms the Python environment cache
        group.bench_function(runtime, |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        let long = cave(&base_url, runtime, STEPS + 1);
                        let short = cave(&base_url, runtime, 1);
                        long.saturating_sub(short) / STEPS
                    })
                    .sum()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, steps);
criterion_main!(benches);

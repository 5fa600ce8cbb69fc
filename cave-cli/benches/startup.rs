//! `cave run` from process start to its first event (the replayed demo, so no network), with
//! the Python environment cache warm: what a user waits before anything happens.

use criterion::{Criterion, criterion_group, criterion_main};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn first_event() -> Duration {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/demo.jsonl");
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args(["run", "--json", "--replay", root, "--var", "text=\"a b a\""])
        .arg("Which word appears most often?")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the cave binary runs");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("a first event");
    let elapsed = start.elapsed();
    let _ = child.wait();
    elapsed
}

fn startup(c: &mut Criterion) {
    first_event(); // warms the Python environment cache
    let mut group = c.benchmark_group("cave");
    group.sample_size(20);
    group.bench_function("start_to_first_event", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| first_event()).sum())
    });
    group.finish();
}

criterion_group!(benches, startup);
criterion_main!(benches);

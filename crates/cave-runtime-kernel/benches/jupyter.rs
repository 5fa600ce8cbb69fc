//! Benchmarks of the kernel runtime's Jupyter transport through a Kernel Gateway on
//! 127.0.0.1: cold start (a kernel started by the gateway, the worker bootstrapped) to the
//! first result, the round trip of a cell, and a host call from Python; then 20 sessions at
//! once through the one gateway (wall time, and resident memory per session), a measurement
//! printed and written to `target/tmp/jupyter-sessions.json`.
//!
//! Needs `CAVE_JUPYTER` or `target/jupyter-venv` (`cargo xtask test` or `cargo xtask bench`
//! make it); without one it says so and measures nothing.

#[path = "support/bench.rs"]
mod bench;
#[path = "../tests/support/on_gateway.rs"]
mod on_gateway;
#[path = "../tests/support/gateway.rs"]
mod support;

use on_gateway::runtime;

use cave_core::{Args, DiscardOutput, Function, Resources, Runtime, Signature, Value};
use cave_runtime_kernel::KernelRuntime;
use criterion::Criterion;
use std::time::Instant;

fn round_trips(c: &mut Criterion, gateway: &support::Gateway) {
    let rt = bench::tokio(2);
    let mut group = c.benchmark_group("jupyter");
    group.sample_size(10);
    group.bench_function("cold_start_to_first_result", |b| {
        b.iter(|| {
            rt.block_on(async {
                let runtime = runtime(gateway);
                let out = runtime.execute("1", &DiscardOutput).await.expect("runs");
                assert_eq!(out.output, "1\n");
                runtime.stop().await;
            })
        })
    });
    let runtime = runtime(gateway);
    group.sample_size(50);
    // Host calls timed over cells of 200.
    bench::round_trips(&mut group, &rt, &runtime, 200);
    group.finish();
    rt.block_on(runtime.stop());
}

/// `VmRSS` of a process and its descendants, in bytes.
fn resident_tree(pid: u32) -> u64 {
    let mut total = 0;
    let mut pending = vec![pid];
    while let Some(pid) = pending.pop() {
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            total += status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .unwrap_or(0)
                * 1024;
        }
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        pending.extend(
            children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
    }
    total
}

/// The gateway's pid: the process listening on its port among this process's children.
fn gateway_pid() -> Option<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_string_lossy().parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let ppid: u32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).ok()?;
        (ppid == me && cmdline.contains("kernelgateway")).then_some(pid)
    })
}

/// 20 sessions at once: each starts a kernel, registers a host function, runs three cells
/// (one calling the host), and stops.
fn sessions(gateway: &support::Gateway) {
    const SESSIONS: usize = 20;
    let rt = bench::tokio(2);
    let before = gateway_pid().map(resident_tree).unwrap_or(0);
    let (wall, peak) = rt.block_on(async {
        let start = Instant::now();
        let runtimes: Vec<KernelRuntime> = (0..SESSIONS).map(|_| runtime(gateway)).collect();
        let mut tasks = Vec::new();
        for (i, runtime) in runtimes.iter().cloned().enumerate() {
            tasks.push(tokio::spawn(async move {
                let echo = Function::host(
                    "echo",
                    Signature::new([cave_core::Param::new("v")]),
                    |args: Args| async move { args.get::<Value>("v") },
                );
                runtime
                    .register(Resources::new().function(echo))
                    .await
                    .expect("registers");
                runtime
                    .execute(&format!("n = {i}"), &DiscardOutput)
                    .await
                    .expect("runs");
                let out = runtime
                    .execute("print(echo(n) * 2)", &DiscardOutput)
                    .await
                    .expect("runs");
                assert_eq!(out.output, format!("{}\n", i * 2));
                runtime
                    .execute("total = sum(range(10_000))", &DiscardOutput)
                    .await
                    .expect("runs");
            }));
        }
        for task in tasks {
            task.await.expect("a session");
        }
        let wall = start.elapsed();
        let peak = gateway_pid().map(resident_tree).unwrap_or(0);
        for runtime in &runtimes {
            runtime.stop().await;
        }
        (wall, peak)
    });
    let per_session = peak.saturating_sub(before) / SESSIONS as u64;
    println!(
        "jupyter/{SESSIONS}_concurrent_sessions: {:.2} s wall; gateway and kernels {:.1} MiB before, {:.1} MiB with the sessions ({:.1} MiB per session)",
        wall.as_secs_f64(),
        before as f64 / 1048576.0,
        peak as f64 / 1048576.0,
        per_session as f64 / 1048576.0
    );
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let _ = std::fs::create_dir_all(dir);
    let _ = std::fs::write(
        dir.join("jupyter-sessions.json"),
        serde_json::json!({
            "sessions": SESSIONS,
            "wall_seconds": wall.as_secs_f64(),
            "gateway_bytes_before": before,
            "gateway_and_kernels_bytes": peak,
            "bytes_per_session": per_session,
        })
        .to_string(),
    );
}

fn main() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let mut criterion = Criterion::default().configure_from_args();
    round_trips(&mut criterion, gateway);
    criterion.final_summary();
    sessions(gateway);
}

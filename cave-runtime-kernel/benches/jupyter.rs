//! Benchmarks of the kernel runtime's Jupyter transport through a Kernel Gateway on
//! 127.0.0.1: cold start (a kernel started by the gateway, the worker bootstrapped) to the
//! first result, the round trip of a cell, and a host call from Python; then many sessions at
//! once through the one gateway, kernels started cold and taken from a `KernelPool::jupyter`
//! (start and step latency, resident memory of the host, the gateway and its kernels per
//! session, what leaked), a table printed and written to `target/tmp/jupyter-load-table.md`.
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
use cave_runtime_kernel::{KernelPool, KernelRuntime, PoolConfig};
use cave_testing::measure::{
    cpu_time, descendants, open_descriptors, percentile, resident, resident_self, resident_tree,
    started_since,
};
use criterion::Criterion;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;

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

/// Steps (cells, each calling the host) per session.
const STEPS: usize = 5;

/// Sessions arrive spread over this window, as in cave-agent's `load` bench.
const ARRIVALS: Duration = Duration::from_secs(1);

/// The pause before each step (the model's time to its code, shortened: the gateway's figures
/// are about starts and round trips under load, not about idle kernels).
const THINK: Duration = Duration::from_millis(250);

/// What one level measured.
struct Level {
    sessions: usize,
    pooled: bool,
    starts: Vec<Duration>,
    steps: Vec<Duration>,
    failed: Vec<String>,
    /// The kernels' resident memory, per session.
    kernel_bytes_per_session: u64,
    /// What this process and the gateway grew by, per session.
    overhead_per_session: u64,
    /// Processor time of this process, the gateway and its kernels while the steps ran.
    host_cpu: Duration,
    gateway_cpu: Duration,
    kernels_cpu: Duration,
    leaked_descriptors: i64,
    leaked_processes: usize,
    wall: Duration,
}

/// `n` sessions at once through the one gateway, their kernels started cold or taken from a
/// filled `KernelPool::jupyter`: each registers a host function, starts, and runs `STEPS`
/// cells that call it.
async fn level(gateway: &support::Gateway, n: usize, pooled: bool) -> Level {
    let me = std::process::id();
    let descriptors_before = open_descriptors();
    let processes_before = descendants(me);
    let gateway_pid = gateway_pid();
    // Before the pool fills: its kernels are the sessions'.
    let overhead = || resident_self() + gateway_pid.and_then(resident).unwrap_or(0);
    let overhead_before = overhead();
    let pool = pooled.then(|| {
        // Four starts at once: Enterprise Gateway users report starvation near 30.
        KernelPool::jupyter(
            on_gateway::config(gateway),
            PoolConfig::new(n).max_starting(4),
        )
        .expect("a pool")
    });
    if let Some(pool) = &pool {
        pool.fill();
        // A kernel that lost a port race to another starting at once fails its start (after
        // the start timeout); the pool tries again.
        let mut failures = 0;
        while let Err(e) = pool.filled(n).await {
            failures += 1;
            assert!(failures < 5, "the pool does not fill: {e}");
            println!("jupyter/{n} sessions: a pooled kernel did not start, tried again: {e}");
        }
    }
    let kernel_pids = Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
    let all_started = Arc::new(Barrier::new(n + 1));
    let go = Arc::new(Barrier::new(n + 1));
    let done = Arc::new(Barrier::new(n + 1));
    let end = Arc::new(Barrier::new(n + 1));
    // This process's, the gateway's, and each kernel's (a kernel that ends in the window
    // takes its time with it; one that starts in it counts from zero).
    let cpu = || {
        let kernels: std::collections::HashMap<u32, Duration> = gateway_pid
            .map(descendants)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|pid| Some((pid, cpu_time(pid)?)))
            .collect();
        (
            cpu_time(me).unwrap_or_default(),
            gateway_pid.and_then(cpu_time).unwrap_or_default(),
            kernels,
        )
    };
    let began = Instant::now();
    let sessions: Vec<_> = (0..n)
        .map(|i| {
            let runtime = match &pool {
                Some(pool) => KernelRuntime::from_pool(pool),
                None => runtime(gateway),
            };
            let (all_started, go, done, end) =
                (all_started.clone(), go.clone(), done.clone(), end.clone());
            let kernel_pids = kernel_pids.clone();
            tokio::spawn(async move {
                tokio::time::sleep(ARRIVALS.mul_f64(i as f64 / n as f64)).await;
                let tick = Function::host(
                    "tick",
                    Signature::new([cave_core::Param::new("n")]),
                    |args: Args| async move { Ok(Value::Int((args.get::<i64>("n")? + 1).into())) },
                );
                let started = Instant::now();
                let session = async {
                    runtime.register(Resources::new().function(tick)).await?;
                    runtime.start().await
                }
                .await;
                let start = started.elapsed();
                all_started.wait().await;
                go.wait().await;
                let mut steps = Vec::new();
                let mut failed = session.err().map(|e| e.to_string());
                for step in 0..STEPS {
                    if failed.is_some() {
                        break;
                    }
                    tokio::time::sleep(THINK).await;
                    let began = Instant::now();
                    match runtime
                        .execute(&format!("x = tick({step})\nprint(x)"), &DiscardOutput)
                        .await
                    {
                        Ok(out) if out.output == format!("{}\n", step + 1) => {
                            steps.push(began.elapsed())
                        }
                        Ok(out) => failed = Some(format!("unexpected output {:?}", out.output)),
                        Err(e) => failed = Some(e.to_string()),
                    }
                }
                // The kernel runs on this machine: its pid, for its memory.
                if let Ok(out) = runtime
                    .execute("import os\nprint(os.getpid())", &DiscardOutput)
                    .await
                    && let Ok(pid) = out.output.trim().parse()
                {
                    cave_core::lock(&kernel_pids).push(pid);
                }
                done.wait().await;
                end.wait().await;
                runtime.stop().await;
                (start, steps, failed)
            })
        })
        .collect();
    all_started.wait().await;
    if let Some(pool) = &pool {
        // The sessions have their kernels: what the pool started meanwhile goes, before the
        // steps (an ipykernel start costs half a second of processor time).
        pool.resize(0);
        while pool.stats().starting > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let cpu_before = cpu();
    go.wait().await;
    done.wait().await;
    let wall = began.elapsed();
    let cpu_after = cpu();
    // The sessions' kernels' memory, and what this process and the gateway grew by.
    let kernels: u64 = cave_core::lock(&kernel_pids)
        .iter()
        .map(|pid| resident_tree(*pid))
        .sum();
    let grown = overhead().saturating_sub(overhead_before);
    end.wait().await;
    let mut measured = Level {
        sessions: n,
        pooled,
        starts: Vec::new(),
        steps: Vec::new(),
        failed: Vec::new(),
        kernel_bytes_per_session: kernels / n as u64,
        overhead_per_session: grown / n as u64,
        host_cpu: cpu_after.0.saturating_sub(cpu_before.0),
        gateway_cpu: cpu_after.1.saturating_sub(cpu_before.1),
        kernels_cpu: cpu_after
            .2
            .iter()
            .map(|(pid, after)| {
                after.saturating_sub(cpu_before.2.get(pid).copied().unwrap_or_default())
            })
            .sum(),
        leaked_descriptors: 0,
        leaked_processes: 0,
        wall,
    };
    for session in sessions {
        let (start, steps, failed) = session.await.expect("a session");
        measured.starts.push(start);
        measured.steps.extend(steps);
        measured.failed.extend(failed);
    }
    drop(pool);
    // The gateway ends kernels asynchronously, and closes connections as it gets to them: a
    // loaded one takes a while.
    let settled = Instant::now();
    loop {
        measured.leaked_processes = started_since(me, &processes_before).len();
        measured.leaked_descriptors = open_descriptors() as i64 - descriptors_before as i64;
        let clean = measured.leaked_processes == 0 && measured.leaked_descriptors <= 0;
        if clean || settled.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    measured
}

/// The gateway's pid: the process among this process's children that runs it.
fn gateway_pid() -> Option<u32> {
    let me = std::process::id();
    descendants(me).into_iter().find(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| c.contains("kernelgateway"))
            && std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(me)
            })
    })
}

/// Sessions at once through the one gateway, at 1 and 10 (`--quick`) or 1, 10, 50 and 100,
/// cold and from a pool: a table printed and written to `target/tmp/jupyter-load-table.md`.
fn sessions(gateway: &support::Gateway, quick: bool) {
    let rt = bench::tokio(2);
    // `CAVE_BENCH_SESSIONS=50,100` measures those levels only.
    let chosen: Option<Vec<usize>> = std::env::var("CAVE_BENCH_SESSIONS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect());
    let counts: &[usize] = match &chosen {
        Some(chosen) => chosen,
        None if quick => &[1, 10],
        None => &[1, 10, 50, 100],
    };
    let mut levels = Vec::new();
    for &n in counts {
        for pooled in [true, false] {
            levels.push(rt.block_on(level(gateway, n, pooled)));
        }
    }
    let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1000.0);
    let alone = |pooled: bool| {
        let mut steps = levels
            .iter()
            .find(|l| l.sessions == 1 && l.pooled == pooled)
            .map(|l| l.steps.clone())
            .unwrap_or_default();
        (percentile(&mut steps, 0.5), percentile(&mut steps, 0.99))
    };
    let alone = [alone(false), alone(true)];
    let mut table = String::from(
        "| sessions | kernels | start p50 ms | start p99 ms | step p50 ms | step p99 ms | added p50 ms | added p99 ms | kernel MiB per session | host and gateway MiB per session | wall s | steps' CPU s: host | gateway | kernels | failed | leaked fds | leaked processes |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for level in &mut levels {
        let (alone50, alone99) = alone[usize::from(level.pooled)];
        let (s50, s99) = (
            percentile(&mut level.starts, 0.5),
            percentile(&mut level.starts, 0.99),
        );
        let (t50, t99) = (
            percentile(&mut level.steps, 0.5),
            percentile(&mut level.steps, 0.99),
        );
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} |\n",
            level.sessions,
            if level.pooled { "pool" } else { "cold" },
            ms(s50),
            ms(s99),
            ms(t50),
            ms(t99),
            ms(t50.saturating_sub(alone50)),
            ms(t99.saturating_sub(alone99)),
            level.kernel_bytes_per_session as f64 / 1048576.0,
            level.overhead_per_session as f64 / 1048576.0,
            level.wall.as_secs_f64(),
            level.host_cpu.as_secs_f64(),
            level.gateway_cpu.as_secs_f64(),
            level.kernels_cpu.as_secs_f64(),
            level.failed.len(),
            level.leaked_descriptors,
            level.leaked_processes,
        ));
        if let Some(first) = level.failed.first() {
            println!(
                "jupyter/{} sessions ({}): {} failed, the first with: {first}",
                level.sessions,
                if level.pooled { "pool" } else { "cold" },
                level.failed.len()
            );
        }
    }
    println!("{table}");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(dir).expect("target/tmp");
    std::fs::write(dir.join("jupyter-load-table.md"), &table).expect("writes the table");
}

fn main() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let mut criterion = Criterion::default().configure_from_args();
    round_trips(&mut criterion, gateway);
    criterion.final_summary();
    sessions(gateway, std::env::args().any(|a| a == "--quick"));
}

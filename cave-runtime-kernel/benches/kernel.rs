//! Benchmarks of the kernel runtime: cold start, a start from a pool, the round trip of a cell, a host call from
//! Python, a million ints in and out (start included), recovery after a crash, and a
//! checkpoint with a rollback to it.
//!
//! Run with `cargo xtask bench` (or `cargo bench -p cave-runtime-kernel`).

use cave_core::RuntimeExt;
use cave_core::{DiscardOutput, Resources, Runtime, Value, Variable};
use cave_runtime_kernel::{KernelConfig, KernelRuntime, Sandbox};
use criterion::{Criterion, criterion_group, criterion_main};

#[path = "support/bench.rs"]
mod bench;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// A new runtime with `config` (no spare) until `1` comes back, and its stop.
fn start_to_first_result(rt: &tokio::runtime::Runtime, config: KernelConfig) {
    rt.block_on(async {
        let runtime = KernelRuntime::with_config(config.spare(false)).expect("python");
        let out = runtime.execute("1", &DiscardOutput).await.expect("runs");
        assert_eq!(out.output, "1\n");
        runtime.stop().await;
    })
}

fn cold_start(c: &mut Criterion) {
    let rt = bench::tokio(1);
    let mut group = c.benchmark_group("kernel");
    group.sample_size(20);
    // Without the sandbox (the default since it is on), beside the strict one below: what the
    // layers cost at start.
    group.bench_function("cold_start_to_first_result", |b| {
        b.iter(|| start_to_first_result(&rt, KernelConfig::new().sandbox(Sandbox::off())))
    });
    // Like for like with the peer (`cargo xtask bench --compare-python` sets the variable):
    // the same row on the interpreter CaveAgent's kernel runs on, whose own start may differ
    // from `python3`'s by tens of milliseconds.
    if let Some(python) = std::env::var_os("CAVE_BENCH_PEER_PYTHON") {
        group.bench_function("cold_start_to_first_result_on_the_peers_python", |b| {
            b.iter(|| {
                let config = KernelConfig::new().python(&python).sandbox(Sandbox::off());
                start_to_first_result(&rt, config)
            })
        });
    }
    group.bench_function("cold_start_to_first_result_strict_sandbox", |b| {
        b.iter(|| start_to_first_result(&rt, KernelConfig::new().sandbox(Sandbox::strict())))
    });
    group.finish();
}

/// A session's start from a filled pool: the worker handed over and the first result, with
/// the strict sandbox (the pool refills between samples, outside the timing).
fn pool_start(c: &mut Criterion) {
    use cave_runtime_kernel::{KernelPool, PoolConfig};
    let rt = bench::tokio(2);
    let pool = rt.block_on(async {
        let pool = KernelPool::new(
            KernelConfig::new().sandbox(Sandbox::strict()),
            PoolConfig::new(4),
        )
        .expect("python");
        pool.fill();
        pool.filled(4).await.expect("the pool fills");
        pool
    });
    let mut group = c.benchmark_group("kernel");
    group.sample_size(20);
    group.bench_function("start_from_pool_to_first_result_strict_sandbox", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                rt.block_on(async {
                    pool.filled(1).await.expect("the pool refills");
                    let start = Instant::now();
                    let runtime = KernelRuntime::from_pool(&pool);
                    let out = runtime.execute("1", &DiscardOutput).await.expect("runs");
                    total += start.elapsed();
                    assert_eq!(out.output, "1\n");
                    runtime.stop().await;
                });
            }
            total
        })
    });
    group.finish();
}

fn round_trips(c: &mut Criterion) {
    let rt = bench::tokio(1);
    let runtime = KernelRuntime::with_config(KernelConfig::new().spare(false)).expect("python");
    let mut group = c.benchmark_group("kernel");
    // Host calls timed over cells of 1000.
    bench::round_trips(&mut group, &rt, &runtime, 1000);
    group.finish();
    rt.block_on(runtime.stop());
}

/// A cell that changes the namespace, then the rollback that undoes it (the checkpoint is
/// taken once: a rollback keeps it). The cell's own cost is `execute_x_equals_1`.
fn checkpoints(c: &mut Criterion) {
    let rt = bench::tokio(1);
    let runtime = KernelRuntime::with_config(KernelConfig::new().spare(false)).expect("python");
    rt.block_on(runtime.execute("import json\ndata = list(range(100000))", &DiscardOutput))
        .expect("runs");
    let mut group = c.benchmark_group("kernel");
    group.bench_function("checkpoint", |b| {
        b.iter(|| black_box(rt.block_on(runtime.checkpoint()).expect("checkpoint")))
    });
    let checkpoint = rt.block_on(runtime.checkpoint()).expect("checkpoint");
    group.bench_function("cell_then_rollback", |b| {
        b.iter(|| {
            rt.block_on(async {
                runtime
                    .execute("data.append(1)", &DiscardOutput)
                    .await
                    .expect("runs");
                runtime.rollback(&checkpoint).await.expect("rolls back");
            })
        })
    });
    group.finish();
    drop(checkpoint);
    rt.block_on(runtime.stop());
}

fn million_ints(c: &mut Criterion) {
    let rt = bench::tokio(1);
    let ints = Value::List((0..1_000_000).map(Value::Int).collect());
    let mut group = c.benchmark_group("kernel");
    group.sample_size(10);
    group.bench_function("inject_and_retrieve_million_ints_with_start", |b| {
        b.iter_batched(
            || ints.clone(),
            |value| {
                rt.block_on(async {
                    let runtime = KernelRuntime::with_config(KernelConfig::new().spare(false))
                        .expect("python");
                    runtime
                        .register(Resources::new().variable(Variable::new("ints", value)))
                        .await
                        .expect("registers");
                    runtime.start().await.expect("starts");
                    let back = runtime.retrieve("ints").await.expect("retrieves");
                    assert!(matches!(&back, Value::List(items) if items.len() == 1_000_000));
                    runtime.stop().await;
                    black_box(back)
                })
            },
            criterion::BatchSize::LargeInput,
        )
    });
    group.finish();
}

fn recovery(c: &mut Criterion) {
    let rt = bench::tokio(1);
    let runtime = KernelRuntime::new().expect("python");
    rt.block_on(runtime.register(Resources::new().variable(Variable::new("kept", Value::Int(1)))))
        .expect("registers");
    let mut group = c.benchmark_group("kernel");
    group.sample_size(20);
    group.bench_function("recovery_after_crash_with_spare", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                rt.block_on(async {
                    runtime.start().await.expect("starts");
                    while runtime.spare_pid().is_none() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    let crash = runtime
                        .execute("import os\nos._exit(1)", &DiscardOutput)
                        .await
                        .expect("reports");
                    assert!(crash.state_lost);
                    let start = Instant::now();
                    let out = runtime.execute("kept", &DiscardOutput).await.expect("runs");
                    total += start.elapsed();
                    assert_eq!(out.output, "1\n");
                });
            }
            total
        })
    });
    group.finish();
    rt.block_on(runtime.stop());
}

criterion_group!(
    benches,
    cold_start,
    pool_start,
    round_trips,
    checkpoints,
    million_ints,
    recovery
);
criterion_main!(benches);

//! What the kernel runtime's benches share: their tokio runtime, and host calls timed per call.

use cave_core::{Args, DiscardOutput, Function, Resources, Runtime, Signature, Value};
use criterion::BenchmarkGroup;
use criterion::measurement::WallTime;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// A tokio runtime with `workers` threads.
pub fn tokio(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("tokio")
}

/// The total time of `iters` calls to the registered host function `noop`.
pub fn noop_calls(
    rt: &tokio::runtime::Runtime,
    runtime: &dyn Runtime,
    iters: u64,
    batch: u64,
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(batch);
        let code = format!("for _ in range({n}):\n    noop()");
        let start = Instant::now();
        rt.block_on(runtime.execute(&code, &DiscardOutput))
            .expect("runs");
        total += start.elapsed();
        left -= n;
    }
    total
}

/// `execute_x_equals_1` and `host_call_from_python` (over cells of `batch` calls) in `group`, on
/// `runtime` started with a `noop` host function.
pub fn round_trips(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &tokio::runtime::Runtime,
    runtime: &dyn Runtime,
    batch: u64,
) {
    let noop = Function::host("noop", Signature::default(), |_args: Args| async move {
        Ok(Value::None)
    });
    rt.block_on(runtime.register(Resources::new().function(noop)))
        .expect("registers");
    rt.block_on(runtime.execute("pass", &DiscardOutput))
        .expect("starts");
    group.bench_function("execute_x_equals_1", |b| {
        b.iter(|| {
            black_box(
                rt.block_on(runtime.execute("x = 1", &DiscardOutput))
                    .expect("runs"),
            )
        })
    });
    group.bench_function("host_call_from_python", |b| {
        b.iter_custom(|iters| noop_calls(rt, runtime, iters, batch))
    });
}

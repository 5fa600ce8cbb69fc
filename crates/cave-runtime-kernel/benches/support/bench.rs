//! What the kernel runtime's benches share: their tokio runtime, and host calls timed per call.

use cave_core::{DiscardOutput, Runtime};
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

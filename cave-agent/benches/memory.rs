//! Resident memory of the host with one runtime of each kind (not a criterion benchmark: a
//! measurement). The kernel runtime is measured first, while this process has not loaded
//! libpython yet; then the in-process runtime. Figures are written as JSON to
//! `target/tmp/memory-figures.json` for `cargo xtask bench`, and printed.
//!
//! Run with `cargo xtask bench` (or `cargo bench -p cave-agent --bench memory`).

use cave_agent::testing::measure::{resident, resident_self};
use cave_agent::{DiscardOutput, InProcRuntime, KernelRuntime, Runtime};
use std::time::{Duration, Instant};

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut figures = serde_json::Map::new();
    let mut record = |id: &str, bytes: u64| {
        println!("{id}: {:.1} MiB", bytes as f64 / 1048576.0);
        figures.insert(id.to_owned(), bytes.into());
    };
    let base = resident_self();
    record("memory/host_alone", base);

    rt.block_on(async {
        let kernel = KernelRuntime::new().expect("a Python interpreter");
        kernel.execute("x = 1", &DiscardOutput).await.expect("runs");
        // The spare (on by default) starts in the background: wait for it, it is part of
        // the cost of a session.
        let deadline = Instant::now() + Duration::from_secs(10);
        while kernel.spare_pid().is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let host = resident_self();
        record("memory/kernel_runtime/host", host);
        let child = kernel.pid().await.and_then(resident);
        record(
            "memory/kernel_runtime/child",
            child.expect("the child's status"),
        );
        if let Some(spare) = kernel.spare_pid().and_then(resident) {
            record("memory/kernel_runtime/spare", spare);
        }
        kernel.stop().await;

        let inproc = InProcRuntime::new().expect("embedded CPython");
        inproc.execute("x = 1", &DiscardOutput).await.expect("runs");
        record("memory/inproc_runtime/host", resident_self());
    });

    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join("memory-figures.json");
    std::fs::create_dir_all(dir).expect("target/tmp");
    std::fs::write(&path, serde_json::to_string_pretty(&figures).expect("JSON"))
        .expect("writes the figures");
}

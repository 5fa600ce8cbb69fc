//! Branches of a live session, measured (a plain program, not criterion: percentiles and
//! memory): the latency of `fork()` with a small and a large namespace (p50, p99), the memory
//! a branch adds before it writes, 32 branches of one state each running a cell (wall time,
//! memory, processes left), and a session from a template pool (`PoolConfig::setup`) to its
//! first result with pandas imported, beside a cold start that imports it. Writes a Markdown
//! table to `target/tmp/fork-table.md` for `cargo xtask bench`'s report, and prints it.
//!
//! The large namespace and the pandas rows need pandas and numpy: in the interpreter
//! `CAVE_BENCH_PANDAS_PYTHON` names (`cargo xtask bench` gives its test environment's), else
//! those rows say they were skipped.
//!
//! Run with `cargo xtask bench` (or `cargo bench -p cave-runtime-kernel --bench fork`).

use cave_core::{DiscardOutput, Runtime};
use cave_runtime_kernel::{KernelConfig, KernelPool, KernelRuntime, PoolConfig};
use cave_testing::measure::unique;
use std::time::{Duration, Instant};

/// Forks timed per namespace.
const FORKS: usize = 40;
/// Branches of one state, each running a cell.
const BRANCHES: usize = 32;

fn quick() -> bool {
    std::env::args().any(|a| a == "--quick")
}

/// The value at quantile `q` of `samples` (sorted here).
fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
    samples[index.min(samples.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / 1048576.0)
}

/// The parent of `pid` (a branch's worker's parent is its keeper).
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat.rsplit(") ").next().unwrap_or("").starts_with('Z'))
}

/// The processes of a branch: its worker and its keeper.
async fn processes(branch: &KernelRuntime) -> Vec<u32> {
    let worker = branch.pid().await.expect("a branch runs");
    std::iter::once(worker).chain(parent(worker)).collect()
}

/// What the branch's processes hold alone, right after the fork.
async fn added(branch: &KernelRuntime) -> u64 {
    processes(branch).await.into_iter().filter_map(unique).sum()
}

async fn run(rt: &KernelRuntime, code: &str) {
    let out = rt.execute(code, &DiscardOutput).await.expect("runs");
    assert!(out.success(), "{code}: {out:?}");
}

/// Fork latency (p50, p99) and the memory a branch adds, on a runtime that ran `setup`.
async fn fork_figures(
    config: KernelConfig,
    setup: &str,
    forks: usize,
) -> (Duration, Duration, u64) {
    let parent = KernelRuntime::with_config(config.spare(false)).expect("python");
    run(&parent, setup).await;
    let mut samples = Vec::with_capacity(forks);
    let mut memory = Vec::with_capacity(forks);
    for _ in 0..forks {
        let start = Instant::now();
        let branch = parent.fork().await.expect("forks");
        samples.push(start.elapsed());
        memory.push(added(&branch).await);
        branch.stop().await;
    }
    parent.stop().await;
    memory.sort_unstable();
    let median_memory = memory[memory.len() / 2];
    (
        quantile(&mut samples, 0.5),
        quantile(&mut samples, 0.99),
        median_memory,
    )
}

/// 32 branches of one state, each running a cell at once: wall time, what they hold, and how
/// many of their processes are left a moment after they are dropped.
async fn many_branches(config: KernelConfig) -> (Duration, u64, usize) {
    let parent = KernelRuntime::with_config(config.spare(false)).expect("python");
    run(&parent, "data = bytearray(1 << 20)\nimport json").await;
    let start = Instant::now();
    let branches: Vec<KernelRuntime> = parent
        .fork_n(BRANCHES)
        .await
        .into_iter()
        .map(|b| b.expect("forks"))
        .collect();
    let cells = branches.iter().enumerate().map(|(i, b)| {
        let code = format!("data[0] = {}\nresult = json.dumps(len(data))", i % 256);
        async move { run(b, &code).await }
    });
    futures_util::future::join_all(cells).await;
    let wall = start.elapsed();
    let mut pids = Vec::new();
    let mut memory = 0;
    for branch in &branches {
        for pid in processes(branch).await {
            memory += unique(pid).unwrap_or(0);
            pids.push(pid);
        }
    }
    drop(branches);
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = pids.iter().filter(|&&p| alive(p)).count();
    parent.stop().await;
    (wall, memory, left)
}

/// A session from a filled template pool to its first result (p50), and a cold start that
/// imports the same (p50).
async fn template_figures(
    config: KernelConfig,
    setup: &str,
    samples: usize,
) -> (Duration, Duration) {
    let pool = KernelPool::new(config.clone(), PoolConfig::new(2).setup(setup)).expect("python");
    pool.fill();
    pool.filled(2).await.expect("the template sets up");
    let mut warm = Vec::with_capacity(samples);
    for _ in 0..samples {
        pool.filled(1).await.expect("refills");
        let start = Instant::now();
        let runtime = KernelRuntime::from_pool(&pool);
        run(&runtime, "pandas.__name__").await;
        warm.push(start.elapsed());
        runtime.stop().await;
    }
    let mut cold = Vec::new();
    for _ in 0..samples.min(5) {
        let start = Instant::now();
        let runtime = KernelRuntime::with_config(config.clone().spare(false)).expect("python");
        run(&runtime, setup).await;
        cold.push(start.elapsed());
        runtime.stop().await;
    }
    (quantile(&mut warm, 0.5), quantile(&mut cold, 0.5))
}

fn main() {
    // Criterion's arguments (`--bench`, filters) are not this program's.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let forks = if quick() { FORKS / 4 } else { FORKS };
    let pandas = std::env::var_os("CAVE_BENCH_PANDAS_PYTHON")
        .map(std::path::PathBuf::from)
        .filter(|p| p.exists());
    let mut rows = vec!["| figure | value |".to_owned(), "|---|---|".to_owned()];
    rt.block_on(async {
        let small = fork_figures(KernelConfig::new(), "data = bytearray(1 << 20)", forks).await;
        rows.push(format!(
            "| `fork()` latency, 1 MB namespace (p50 / p99, {forks} forks) | {} / {} |",
            ms(small.0),
            ms(small.1)
        ));
        rows.push(format!(
            "| memory a branch adds before it writes, 1 MB namespace (worker and keeper, unique set) | {} |",
            mib(small.2)
        ));
        match &pandas {
            Some(python) => {
                let config = KernelConfig::new().python(python);
                let frame = "import numpy, pandas\nframe = pandas.DataFrame(numpy.random.rand(5_000_000, 5))\nassert frame.memory_usage().sum() >= 200_000_000";
                let large = fork_figures(config.clone(), frame, forks.min(20)).await;
                rows.push(format!(
                    "| `fork()` latency, 200 MB namespace (a pandas frame; p50 / p99, {} forks) | {} / {} |",
                    forks.min(20),
                    ms(large.0),
                    ms(large.1)
                ));
                rows.push(format!(
                    "| memory a branch adds before it writes, 200 MB namespace | {} |",
                    mib(large.2)
                ));
                let (warm, cold) =
                    template_figures(config, "import pandas, numpy", if quick() { 5 } else { 20 })
                        .await;
                rows.push(format!(
                    "| session from a template pool to its first result, pandas imported (p50) | {} |",
                    ms(warm)
                ));
                rows.push(format!(
                    "| cold start importing pandas, to its first result (p50) | {} |",
                    ms(cold)
                ));
            }
            None => rows.push(
                "| 200 MB namespace and template pool with pandas | skipped: set CAVE_BENCH_PANDAS_PYTHON to an interpreter with pandas and numpy |".to_owned(),
            ),
        }
        let (wall, memory, left) = many_branches(KernelConfig::new()).await;
        rows.push(format!(
            "| {BRANCHES} branches of one state, forked and each running a cell (wall time) | {} |",
            ms(wall)
        ));
        rows.push(format!(
            "| … memory the {BRANCHES} branches hold alone after their cells | {} |",
            mib(memory)
        ));
        rows.push(format!(
            "| … processes left 5 s after the branches are dropped | {left} |"
        ));
    });
    let table = rows.join("\n") + "\n";
    println!("{table}");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(dir).expect("target/tmp");
    std::fs::write(dir.join("fork-table.md"), table).expect("writes the table");
}

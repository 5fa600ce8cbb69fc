//! Load: N agent sessions at once on one tokio runtime (two worker threads), arriving within a
//! second, each on a kernel runtime with the strict sandbox, each running scripted steps whose cells call a host
//! function. For N = 1, 10, 50, 100 (1 and 10 with `--quick`), with the workers taken from a
//! filled `KernelPool` and started cold: session start p50/p99, step latency p50/p99 (the
//! cell, as `Event::Step` times it; the model answers each step after `THINK`) and what load
//! adds to it over one session alone, resident
//! memory per session (host and child), and descriptors and processes before and after (what
//! leaked). Not a criterion benchmark: a measurement, printed and written as a Markdown table
//! to `target/tmp/load-table.md` for `cargo xtask bench`.
//!
//! Run with `cargo xtask bench` (or `cargo bench -p cave-agent --bench load --features
//! kernel,testing`).

use cave_agent::AgentExt;
use cave_agent::kernel::{KernelConfig, KernelPool, PoolConfig, Sandbox};
use cave_agent::testing::measure::{
    descendants, open_descriptors, percentile, resident_self, resident_tree, started_since,
};
use cave_agent::testing::{Reply, ScriptedModel};
use cave_agent::{
    Agent, Args, Event, Function, KernelRuntime, Param, Resources, Runtime, Signature, Value,
};
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;

/// Steps (cells) per session.
const STEPS: usize = 5;

/// How long the model takes to answer a step, on average (a fast hosted model's time to its
/// code is about a second). Session `i` of `n` takes `THINK/2 + THINK·i/n`, so that the
/// sessions' cells are spread as real ones would be rather than all run at one instant.
const THINK: Duration = Duration::from_secs(1);

/// Sessions arrive spread over this window (session `i` of `n` at `ARRIVALS·i/n`): a service's
/// burst, not one instant.
const ARRIVALS: Duration = Duration::from_secs(1);

/// What session `i` of `n`'s model writes: a host call per cell, then an answer.
fn script(i: usize, n: usize) -> Vec<Reply> {
    let think = THINK / 2 + THINK.mul_f64(i as f64 / n as f64);
    (0..STEPS)
        .map(|step| {
            Reply::text("")
                .then_stall(think)
                .then_text(format!("```python\nx = tick({step})\nprint(x)\n```"))
        })
        .chain(std::iter::once(Reply::text("Done.")))
        .collect()
}

/// The host function each cell calls.
fn tick() -> Function {
    Function::host(
        "tick",
        Signature::new([Param::new("n").annotated("int")]).returns("int"),
        |args: Args| async move {
            let n: i64 = args.get("n")?;
            Ok(Value::Int((n + 1).into()))
        },
    )
}

/// Where a session's worker comes from.
#[derive(Clone, Copy, PartialEq)]
enum Source {
    Pool,
    Cold,
}

/// What one level measured.
struct Level {
    sessions: usize,
    source: Source,
    starts: Vec<Duration>,
    steps: Vec<Duration>,
    memory_per_session: u64,
    leaked_descriptors: i64,
    leaked_processes: usize,
    wall: Duration,
}

fn strict() -> KernelConfig {
    KernelConfig::new().sandbox(Sandbox::strict()).spare(false)
}

/// `n` sessions at once from `source`.
async fn level(n: usize, source: Source) -> Level {
    let me = std::process::id();
    let descriptors_before = open_descriptors();
    let processes_before = descendants(me);
    let pool = match source {
        Source::Pool => {
            // One start at a time refills it while the sessions arrive (half a core here).
            let pool = KernelPool::new(strict(), PoolConfig::new(n).max_starting(1))
                .expect("a Python interpreter");
            pool.fill();
            pool.filled(n).await.expect("the pool fills");
            Some(pool)
        }
        Source::Cold => None,
    };
    let host_before = resident_self();
    // All sessions done (and measured) before any ends: memory is counted with all alive.
    let started = Arc::new(Barrier::new(n + 1));
    let done = Arc::new(Barrier::new(n + 1));
    let end = Arc::new(Barrier::new(n + 1));
    let began = Instant::now();
    let sessions: Vec<_> = (0..n)
        .map(|i| {
            let runtime = match &pool {
                Some(pool) => KernelRuntime::from_pool(pool),
                None => KernelRuntime::with_config(strict()).expect("a Python interpreter"),
            };
            let (all_started, done, end) = (started.clone(), done.clone(), end.clone());
            tokio::spawn(async move {
                tokio::time::sleep(ARRIVALS.mul_f64(i as f64 / n as f64)).await;
                let started = Instant::now();
                runtime
                    .register(Resources::new().function(tick()))
                    .await
                    .expect("registers");
                runtime.start().await.expect("starts");
                let start = started.elapsed();
                all_started.wait().await;
                let model = Arc::new(ScriptedModel::new(script(i, n)));
                let mut agent = Agent::builder(model, runtime.clone())
                    .max_steps(STEPS as u32 + 1)
                    .build()
                    .expect("an agent");
                let mut steps = Vec::new();
                let mut events = agent.stream("Tick.");
                while let Some(event) = events.next().await {
                    if let Event::Step {
                        execution_seconds: Some(seconds),
                        ..
                    } = event
                    {
                        steps.push(Duration::from_secs_f64(seconds));
                    }
                }
                drop(events);
                done.wait().await;
                end.wait().await;
                runtime.stop().await;
                (start, steps)
            })
        })
        .collect();
    started.wait().await;
    if let Some(pool) = &pool {
        // The sessions have their workers: what the pool started meanwhile goes, and nothing
        // more starts to compete with their steps for the cores.
        pool.resize(0);
    }
    done.wait().await;
    let wall = began.elapsed();
    let host = resident_self().saturating_sub(host_before);
    let children = resident_tree(me).saturating_sub(resident_self());
    end.wait().await;
    let mut starts = Vec::new();
    let mut steps = Vec::new();
    for session in sessions {
        let (start, session_steps) = session.await.expect("a session");
        starts.push(start);
        steps.extend(session_steps);
    }
    drop(pool);
    // What ends asynchronously (reapers, the pool's own ready workers) has a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Level {
        sessions: n,
        source,
        starts,
        steps,
        memory_per_session: (host + children) / n as u64,
        leaked_descriptors: open_descriptors() as i64 - descriptors_before as i64,
        leaked_processes: started_since(me, &processes_before).len(),
        wall,
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let counts: &[usize] = if quick { &[1, 10] } else { &[1, 10, 50, 100] };
    let mut levels = Vec::new();
    for &n in counts {
        for source in [Source::Pool, Source::Cold] {
            let measured = rt.block_on(level(n, source));
            levels.push(measured);
        }
    }
    let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1000.0);
    // One session alone, per source: what load adds is measured against it.
    let alone: Vec<(Source, (Duration, Duration))> = levels
        .iter()
        .filter(|l| l.sessions == 1)
        .map(|l| {
            let mut steps = l.steps.clone();
            (
                l.source,
                (percentile(&mut steps, 0.5), percentile(&mut steps, 0.99)),
            )
        })
        .collect();
    let alone = |source: Source| {
        alone
            .iter()
            .find(|(s, _)| *s == source)
            .map(|(_, figures)| *figures)
            .unwrap_or_default()
    };
    let mut table = String::from(
        "| sessions | workers | start p50 ms | start p99 ms | step p50 ms | step p99 ms | added p50 ms | added p99 ms | MiB per session | wall s | leaked fds | leaked processes |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for level in &mut levels {
        let (alone50, alone99) = alone(level.source);
        let (s50, s99) = (
            percentile(&mut level.starts, 0.5),
            percentile(&mut level.starts, 0.99),
        );
        let (t50, t99) = (
            percentile(&mut level.steps, 0.5),
            percentile(&mut level.steps, 0.99),
        );
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.2} | {} | {} |\n",
            level.sessions,
            match level.source {
                Source::Pool => "pool",
                Source::Cold => "cold",
            },
            ms(s50),
            ms(s99),
            ms(t50),
            ms(t99),
            ms(t50.saturating_sub(alone50)),
            ms(t99.saturating_sub(alone99)),
            level.memory_per_session as f64 / 1048576.0,
            level.wall.as_secs_f64(),
            level.leaked_descriptors,
            level.leaked_processes,
        ));
    }
    println!("{table}");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(dir).expect("target/tmp");
    std::fs::write(dir.join("load-table.md"), &table).expect("writes the table");
}

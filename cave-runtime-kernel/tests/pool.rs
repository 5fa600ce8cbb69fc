//! `KernelPool`: the pool's own promises (taken at once when ready, refilled, bounded under a
//! burst, never shared, let go when idle). The contract on pooled runtimes is in
//! `pool_contract.rs` (a binary of its own: its timing checks run alone).

use cave_core::{DiscardOutput, Runtime};
use cave_runtime_kernel::{KernelConfig, KernelPool, KernelRuntime, PoolConfig};
use std::collections::HashSet;
use std::time::Duration;

#[path = "support/sessions.rs"]
mod sessions;
use sessions::pid;

/// A ready worker is taken and replaced; a runtime's second worker (after `reset`) is a fresh
/// one too; runtimes do not share a work directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_are_taken_refilled_and_never_shared() {
    let pool = KernelPool::new(KernelConfig::default(), PoolConfig::new(2)).unwrap();
    pool.fill();
    pool.filled(2).await.unwrap();
    assert_eq!(pool.stats().ready, 2);
    let first = KernelRuntime::from_pool(&pool);
    let second = KernelRuntime::from_pool(&pool);
    let (a, b) = (pid(&first).await, pid(&second).await);
    assert_ne!(a, b);
    let stats = pool.stats();
    assert_eq!(stats.taken, 2);
    pool.filled(2).await.unwrap();
    assert!(pool.stats().started >= 4, "{:?}", pool.stats());
    // A used worker never goes back: after a reset the runtime has a new one.
    first.reset().await.unwrap();
    let again = pid(&first).await;
    assert!(again != a && again != b, "{again} was used before");
    // Each worker in a directory of its own.
    let wrote = first
        .execute("open('mine.txt', 'w').write('a')", &DiscardOutput)
        .await
        .unwrap();
    assert!(wrote.success(), "{wrote:?}");
    let seen = second
        .execute(
            "import os\nprint(os.path.exists('mine.txt'))",
            &DiscardOutput,
        )
        .await
        .unwrap();
    assert_eq!(seen.output, "False\n");
    // Resized: the surplus goes at once; grown again, it fills.
    pool.resize(0);
    assert_eq!(pool.stats().ready, 0);
    pool.resize(1);
    pool.filled(1).await.unwrap();
    assert_eq!(pool.stats().ready, 1);
}

/// 200 sessions start at once against a pool of 8: every one gets a worker of its own, and
/// never more than `max_starting` workers start at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_sessions_queues_behind_the_bound() {
    let pool =
        KernelPool::new(KernelConfig::default(), PoolConfig::new(8).max_starting(3)).unwrap();
    pool.fill();
    let sessions: Vec<_> = (0..200)
        .map(|_| {
            let runtime = KernelRuntime::from_pool(&pool);
            tokio::spawn(async move {
                let pid = pid(&runtime).await;
                (pid, runtime)
            })
        })
        .collect();
    let mut pids = HashSet::new();
    let mut kept = Vec::new();
    for session in sessions {
        let (pid, runtime) = session.await.unwrap();
        pids.insert(pid);
        kept.push(runtime);
    }
    assert_eq!(pids.len(), 200, "a worker served two sessions");
    let stats = pool.stats();
    assert_eq!(stats.taken, 200);
    assert!(stats.peak_starting <= 3, "{stats:?}");
    assert_eq!(stats.waiting, 0, "{stats:?}");
    for runtime in kept {
        runtime.stop().await;
    }
}

/// Ready workers are let go after the idle timeout; a take fills the pool again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_workers_are_let_go() {
    let pool = KernelPool::new(
        KernelConfig::default(),
        PoolConfig::new(1).idle_timeout(Some(Duration::from_millis(300))),
    )
    .unwrap();
    pool.fill();
    pool.filled(1).await.unwrap();
    let mut ready = pool.stats().ready;
    for _ in 0..40 {
        if ready == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        ready = pool.stats().ready;
    }
    assert_eq!(ready, 0, "the idle worker was kept");
    let runtime = KernelRuntime::from_pool(&pool);
    assert!(pid(&runtime).await > 0);
}

/// A pool whose workers cannot start says why to the runtime waiting, instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_reaches_the_waiting_runtime() {
    let config = KernelConfig::default().python("/nonexistent/python3");
    let pool = KernelPool::new(config, PoolConfig::new(1)).unwrap();
    let runtime = KernelRuntime::from_pool(&pool);
    let started = tokio::time::timeout(Duration::from_secs(30), runtime.start())
        .await
        .expect("the start ends");
    let error = started.unwrap_err().to_string();
    assert!(error.contains("nonexistent"), "{error}");
    assert!(pool.stats().failed >= 1);
}

/// A start that failed with no runtime waiting (an interpreter missing for a moment, a
/// gateway overloaded) is tried again in the background, so the pool fills once it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_is_tried_again_in_the_background() {
    let dir = cave_testing::TestDir::new("pool-retry");
    let marker = dir.join("broken");
    std::fs::write(&marker, "").unwrap();
    let python = std::env::var("CAVE_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let script = dir.join("python3");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n[ -e '{}' ] && exit 3\nexec '{python}' \"$@\"\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // No sandbox: it would confine the child to the script's interpreter's directories.
    let config = KernelConfig::default()
        .python(&script)
        .sandbox(cave_runtime_kernel::Sandbox::off());
    let pool = KernelPool::new(
        config,
        PoolConfig::new(1).retry(Some(Duration::from_millis(100))),
    )
    .unwrap();
    pool.fill();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while pool.stats().failed < 2 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", pool.stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The interpreter works again: the pool fills with no runtime asking.
    std::fs::remove_file(&marker).unwrap();
    while pool.stats().ready < 1 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", pool.stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(pool.stats().taken, 0);
    let runtime = KernelRuntime::from_pool(&pool);
    let out = runtime
        .execute("print(6 * 7)", &DiscardOutput)
        .await
        .unwrap();
    assert_eq!(out.output, "42\n");
    runtime.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A pool with setup code hands out forks of a template that ran it once: every session starts
/// with its imports and values, each on its own (a change in one is unseen in another), and a
/// session's fresh process after a crash is a fork of the template too. Setup code that raises
/// fails the pool's starts with what it raised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_pool_hands_out_sessions_that_ran_its_setup() {
    let pool = KernelPool::new(
        KernelConfig::default(),
        PoolConfig::new(2).setup("import json\nloaded = [json.dumps({'ok': 1})]"),
    )
    .unwrap();
    pool.fill();
    pool.filled(2).await.unwrap();
    let first = KernelRuntime::from_pool(&pool);
    let second = KernelRuntime::from_pool(&pool);
    let run = |rt: &KernelRuntime, code: &'static str| {
        let rt = rt.clone();
        async move { rt.execute(code, &DiscardOutput).await.unwrap() }
    };
    assert_eq!(
        run(&first, "loaded.append(2)\nprint(loaded)").await.output,
        "['{\"ok\": 1}', 2]\n"
    );
    assert_eq!(
        run(&second, "print(loaded)").await.output,
        "['{\"ok\": 1}']\n"
    );
    assert_ne!(pid(&first).await, pid(&second).await);
    let crashed = run(&first, "import os\nos._exit(1)").await;
    assert!(crashed.state_lost);
    assert_eq!(
        run(&first, "print(loaded, json.loads(loaded[0]))")
            .await
            .output,
        "['{\"ok\": 1}'] {'ok': 1}\n"
    );

    let broken = KernelPool::new(
        KernelConfig::default(),
        PoolConfig::new(1).setup("import no_such_module_here"),
    )
    .unwrap();
    let error = broken.filled(1).await.unwrap_err().to_string();
    assert!(
        error.contains("setup code failed") && error.contains("ModuleNotFoundError"),
        "{error}"
    );
}

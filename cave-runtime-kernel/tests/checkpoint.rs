//! Checkpoints and rollbacks: the namespace returns to what it was, the process that serves
//! changes and keeps serving (output, host calls, interrupts), and no copy outlives what
//! holds it.

use cave_core::RuntimeExt;
use cave_core::{Args, Function, Resources, Runtime, Signature, Value, Variable};
use cave_runtime_kernel::{KernelConfig, KernelRuntime, Limits, Sandbox};
use cave_testing::contract::run;
use std::time::Duration;

fn runtime(sandbox: Sandbox) -> KernelRuntime {
    KernelRuntime::with_config(
        KernelConfig::new()
            .spare(false)
            .sandbox(sandbox)
            .limits(Limits::default().processes(64)),
    )
    .expect("python")
}

/// The processes of the kernel's process group (the child, its copies, what cells started).
fn group_members(pgid: u32) -> Vec<u32> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // After the command's closing parenthesis: state, ppid, pgrp.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() == Some(&"Z") {
            continue;
        }
        if fields.get(2).and_then(|g| g.parse::<u32>().ok()) == Some(pgid) {
            members.push(pid);
        }
    }
    members
}

/// Waits (bounded) until the group has `count` live members.
/// The process group of `pid` (the first process the host started: the worker itself, or its
/// guard where no control group holds it).
fn process_group(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("a live process");
    let rest = stat.rsplit_once(')').expect("a stat line").1;
    rest.split_whitespace()
        .nth(2)
        .and_then(|p| p.parse().ok())
        .expect("a process group")
}

async fn group_settles(pgid: u32, count: usize) -> Vec<u32> {
    for _ in 0..200 {
        let members = group_members(pgid);
        if members.len() == count {
            return members;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    group_members(pgid)
}

async fn namespace_returns(sandbox: Sandbox) {
    let rt = runtime(sandbox);
    run(&rt, "x = 1\nitems = [1, 2]").await;
    let first = rt.pid().await.expect("running");
    let checkpoint = rt.checkpoint().await.expect("a checkpoint");
    run(
        &rt,
        "x = 2\nitems.append(3)\nimport json\ny = json.dumps(items)",
    )
    .await;
    assert_eq!(
        run(&rt, "print(x, items, y)").await.output,
        "2 [1, 2, 3] [1, 2, 3]\n"
    );

    rt.rollback(&checkpoint).await.expect("rolls back");
    let second = rt.pid().await.expect("running");
    assert_ne!(first, second, "a copy serves now");
    assert_eq!(run(&rt, "print(x, items)").await.output, "1 [1, 2]\n");
    let gone = run(&rt, "y").await;
    assert_eq!(gone.error.expect("unbound").python_type, "NameError");
    // Output from Python and from descriptors still streams from the copy.
    assert_eq!(run(&rt, "print('a')").await.output, "a\n");
    assert_eq!(
        run(&rt, "import os\n_ = os.write(1, b'b\\n')").await.output,
        "b\n"
    );

    // The checkpoint stays: roll back to it again after more changes.
    run(&rt, "x = 5").await;
    rt.rollback(&checkpoint).await.expect("rolls back again");
    assert_eq!(run(&rt, "print(x)").await.output, "1\n");
    rt.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_namespace_returns_to_its_checkpoint() {
    namespace_returns(Sandbox::off()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_namespace_returns_to_its_checkpoint_in_the_strict_sandbox() {
    namespace_returns(Sandbox::strict()).await;
}

/// Host calls cross the new socket owner; resources registered after the checkpoint are
/// unregistered by the rollback; host state (in the host) is not rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_and_host_calls_follow_the_rollback() {
    let rt = runtime(Sandbox::off());
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = calls.clone();
    let count = Function::host("count", Signature::new([]), move |_args: Args| {
        let calls = counted.clone();
        async move {
            Ok(Value::Int(
                i128::from(calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst)) + 1,
            ))
        }
    });
    rt.register(Resources::new().function(count))
        .await
        .expect("registers");
    let checkpoint = rt.checkpoint().await.expect("a checkpoint");
    rt.register(Resources::new().variable(Variable::new("later", Value::Int(7))))
        .await
        .expect("registers");
    assert!(rt.describe().variables.contains("later"));
    assert_eq!(run(&rt, "print(count(), later)").await.output, "1 7\n");

    rt.rollback(&checkpoint).await.expect("rolls back");
    assert!(!rt.describe().variables.contains("later"));
    assert_eq!(
        run(&rt, "later").await.error.expect("unbound").python_type,
        "NameError"
    );
    // The host's counter is the host's: it is not rolled back.
    assert_eq!(run(&rt, "print(count())").await.output, "2\n");
    // The name is free again.
    rt.register(Resources::new().variable(Variable::new("later", Value::Int(8))))
        .await
        .expect("registers again");
    assert_eq!(run(&rt, "print(later)").await.output, "8\n");
    rt.stop().await;
}

/// An interrupt reaches the process that serves after a rollback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_reaches_the_copy() {
    let rt = runtime(Sandbox::off());
    run(&rt, "import time").await;
    let checkpoint = rt.checkpoint().await.expect("a checkpoint");
    rt.rollback(&checkpoint).await.expect("rolls back");
    cave_testing::contract::a_sleep_is_interrupted(&rt).await;
    rt.stop().await;
}

/// Later checkpoints end with a rollback to an earlier one; a dropped checkpoint's copy ends;
/// a stop ends every copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_live_exactly_as_long_as_their_checkpoints() {
    let rt = runtime(Sandbox::off());
    run(&rt, "x = 0").await;
    let pgid = process_group(rt.pid().await.expect("running"));
    // Beside the worker, one more process of the group: with a control group the keeper (which
    // ends the group when the host goes), without one the guard (the worker's parent).
    let keeper = 1;
    let guarded = rt
        .enforcement()
        .await
        .iter()
        .any(|e| e.contains("a guard process"));
    assert_eq!(group_settles(pgid, 1 + keeper).await.len(), 1 + keeper);
    let first = rt.checkpoint().await.expect("first");
    run(&rt, "x = 1").await;
    let second = rt.checkpoint().await.expect("second");
    run(&rt, "x = 2").await;
    let third = rt.checkpoint().await.expect("third");
    assert_eq!(
        group_settles(pgid, 4 + keeper).await.len(),
        4 + keeper,
        "the process and three copies"
    );

    drop(third);
    assert_eq!(
        group_settles(pgid, 3 + keeper).await.len(),
        3 + keeper,
        "the third copy ended"
    );

    rt.rollback(&first).await.expect("rolls back");
    assert_eq!(run(&rt, "print(x)").await.output, "0\n");
    // The serving copy, a fresh copy of the first checkpoint, and the first worker, now the
    // reaper of the tree (under a guard, which reaps, the first worker is gone); the second
    // copy is gone.
    let after = 2 + keeper + usize::from(!guarded);
    assert_eq!(
        group_settles(pgid, after).await.len(),
        after,
        "{:?}",
        group_members(pgid)
    );
    let refused = rt.rollback(&second).await.unwrap_err();
    assert!(refused.to_string().contains("not held"), "{refused}");

    rt.stop().await;
    assert_eq!(group_settles(pgid, 0).await, Vec::<u32>::new());
}

/// A checkpoint does not survive its process: after a crash, rolling back says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_ends_the_checkpoints() {
    let rt = runtime(Sandbox::off());
    run(&rt, "x = 1").await;
    let pgid = process_group(rt.pid().await.expect("running"));
    let checkpoint = rt.checkpoint().await.expect("a checkpoint");
    assert!(!group_members(pgid).is_empty());
    let crashed = run(&rt, "import os\nos._exit(3)").await;
    assert!(crashed.state_lost);
    // The copy went with the crashed process.
    assert_eq!(group_settles(pgid, 0).await, Vec::<u32>::new());
    let refused = rt.rollback(&checkpoint).await.unwrap_err();
    assert!(refused.to_string().contains("has ended"), "{refused}");
    assert_eq!(
        run(&rt, "x").await.error.expect("fresh").python_type,
        "NameError"
    );
    rt.stop().await;
}

/// After a rollback, the copy's death is seen like the child's: the execution says the
/// process died, and the next one gets a fresh process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_a_rollback_is_reported() {
    let rt = runtime(Sandbox::off());
    run(&rt, "x = 1").await;
    let checkpoint = rt.checkpoint().await.expect("a checkpoint");
    rt.rollback(&checkpoint).await.expect("rolls back");
    let crashed = run(&rt, "import os\nos._exit(3)").await;
    assert!(crashed.state_lost);
    let error = crashed.error.expect("died");
    assert_eq!(error.python_type, cave_runtime_kernel::PROCESS_DIED);
    // Its status too, passed on by the first worker, which reaps the tree after a rollback.
    assert!(
        error.message.contains("exited with status 3"),
        "{}",
        error.message
    );
    assert_eq!(run(&rt, "print('fresh')").await.output, "fresh\n");
    rt.stop().await;
}

/// Rollbacks back to back leave nothing behind: each ends the process it replaces, which is
/// reaped at once (a zombie left to a slow init counted against the process limit: 64 here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollbacks_back_to_back_leave_no_process_behind() {
    let rt = runtime(Sandbox::strict());
    run(&rt, "x = 0").await;
    let checkpoint = rt.checkpoint().await.expect("a checkpoint");
    for n in 0..300 {
        run(&rt, "x += 1").await;
        if let Err(error) = rt.rollback(&checkpoint).await {
            panic!("rollback {n}: {error}");
        }
    }
    assert_eq!(run(&rt, "print(x)").await.output, "0\n");
    let forked = run(
        &rt,
        "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)[1]",
    )
    .await;
    assert_eq!(forked.output, "0\n", "a cell can still fork");
    rt.stop().await;
}

/// Not while a cell runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_checkpoint_while_a_cell_runs() {
    let rt = runtime(Sandbox::off());
    let running = {
        let rt = rt.clone();
        tokio::spawn(async move { run(&rt, "import time\ntime.sleep(1)").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = rt.checkpoint().await.unwrap_err();
    assert!(
        refused.to_string().contains("a cell is running"),
        "{refused}"
    );
    running.await.expect("joins");
    rt.checkpoint().await.expect("between cells");
    rt.stop().await;
}

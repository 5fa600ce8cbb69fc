//! What model code can do to its process, and how the runtime comes back from it.

use cave_core::{
    Args, DiscardOutput, Execution, Function, Interruption, Param, Resources, Runtime, Signature,
    Value, Variable,
};
use cave_runtime_kernel::{KernelConfig, KernelRuntime, Limits, Need, PROCESS_DIED};
use std::time::{Duration, Instant};

async fn run(rt: &KernelRuntime, code: &str) -> Execution {
    rt.execute(code, &DiscardOutput)
        .await
        .expect("the runtime works")
}

/// A runtime with a registered variable, a model-made name, and a started process.
async fn prepared(config: KernelConfig) -> KernelRuntime {
    let rt = KernelRuntime::with_config(config).expect("python is available");
    rt.register(Resources::new().variable(Variable::new("kept", Value::Int(7))))
        .await
        .expect("registers");
    assert_eq!(run(&rt, "mine = 1\nkept * 6").await.output, "42\n");
    rt
}

/// After a death: a fresh process, registered resources back, the model's names gone.
async fn recovered(rt: &KernelRuntime, before: Option<u32>) {
    let after = run(rt, "kept, 'mine' in globals()").await;
    assert_eq!(after.output, "(7, False)\n");
    assert!(after.success());
    assert!(
        !after.state_lost,
        "the loss was reported once, by the execution that died"
    );
    assert_ne!(rt.pid().await, before, "a fresh process");
}

fn died(out: &Execution, what: &str) {
    let error = out.error.as_ref().expect("the execution failed");
    assert_eq!(error.python_type, PROCESS_DIED, "{out:?}");
    assert!(
        error.message.contains(what),
        "{what:?} in {:?}",
        error.message
    );
    assert!(out.output.contains(what), "{:?}", out.output);
    assert!(out.state_lost);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segfault_ends_only_the_child() {
    let rt = prepared(KernelConfig::new()).await;
    let pid = rt.pid().await;
    let out = run(&rt, "print('before')\nimport ctypes\nctypes.string_at(0)").await;
    died(&out, "SIGSEGV");
    assert!(out.output.starts_with("before\n"), "{:?}", out.output);
    recovered(&rt, pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn os_exit_is_reported_with_its_status() {
    let rt = prepared(KernelConfig::new().spare(false)).await;
    let pid = rt.pid().await;
    let out = run(&rt, "import os\nos._exit(3)").await;
    died(&out, "exited with status 3");
    recovered(&rt, pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_errors_under_the_address_space_limit_keep_the_process() {
    let limits = Limits::default().address_space(1 << 30);
    let rt = prepared(KernelConfig::new().limits(limits)).await;
    let pid = rt.pid().await;
    let out = run(&rt, "x = bytearray(3 * 1024**3)").await;
    assert_eq!(
        out.error.as_ref().map(|e| e.python_type.as_str()),
        Some("MemoryError"),
        "{out:?}"
    );
    assert!(!out.state_lost);
    assert_eq!(run(&rt, "mine").await.output, "1\n", "state kept");
    assert_eq!(rt.pid().await, pid);
}

/// Interrupts raise `KeyboardInterrupt` in blocking calls as in loops, keeping state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeps_and_loops_stop_at_their_interrupt() {
    let rt = prepared(KernelConfig::new()).await;
    let pid = rt.pid().await;
    for cell in ["import time\ntime.sleep(100)", "while True:\n    pass"] {
        let interrupter = rt.interrupter().expect("interruptible");
        let stopper = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            (interrupter.interrupt(), Instant::now())
        });
        let out = run(&rt, cell).await;
        let (interruption, at) = stopper.await.expect("the stopper ran");
        assert_eq!(interruption, Interruption::Delivered);
        assert_eq!(
            out.error.as_ref().map(|e| e.python_type.as_str()),
            Some("KeyboardInterrupt"),
            "{out:?}"
        );
        assert!(!out.state_lost);
        // Generous: the behaviour is "stops at once", not a speed figure.
        assert!(at.elapsed() < Duration::from_secs(2), "{:?}", at.elapsed());
    }
    assert_eq!(run(&rt, "mine").await.output, "1\n");
    assert_eq!(rt.pid().await, pid, "the same process");
}

/// Interrupts that land anywhere, between the worker's own statements around a cell as well
/// as in the cell, stop at most that cell: a storm of them never ends the process, never leaves
/// a cell unanswered, and never garbles the next cell's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_interrupts_stops_cells_not_the_process() {
    let rt = prepared(KernelConfig::new()).await;
    let echo = Function::host(
        "echo",
        Signature::new([Param::new("x")]),
        |args: Args| async move { Ok(args.value("x").cloned().unwrap_or(Value::None)) },
    );
    rt.register(Resources::new().function(echo))
        .await
        .expect("registers");
    assert!(run(&rt, "n = 0").await.success());
    let pid = rt.pid().await;
    let worker = libc::pid_t::try_from(pid.expect("a started worker")).expect("a pid");
    // From a thread of the test: signals at any moment of the worker's own code, as often as
    // every 50 µs (a thread of the worker would send them only when it gets the GIL).
    let storm = std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(3);
        while Instant::now() < end {
            // SAFETY: a signal to the worker this test started (alive: see the end).
            unsafe { libc::kill(worker, libc::SIGINT) };
            std::thread::sleep(Duration::from_micros(50));
        }
    });
    let started = Instant::now();
    let (mut ended, mut interrupted) = (0, 0);
    while started.elapsed() < Duration::from_secs(4) {
        // Host calls between the lines: their waits and locks are in the storm too. Bounded:
        // a lock an interrupt left taken hangs the cell for good (no interrupt of the host's
        // comes to kill it).
        let cell =
            "n += 1\nfor i in range(2000):\n    print('n', n, echo(i) if i % 500 == 0 else i)";
        let out = tokio::time::timeout(Duration::from_secs(20), run(&rt, cell))
            .await
            .expect("a cell hung in the storm (a lock an interrupt left taken?)");
        let end = &out.output[out
            .output
            .floor_char_boundary(out.output.len().saturating_sub(300))..];
        assert!(!out.state_lost, "{:?} ending {end:?}", out.error);
        match out.error.as_ref().map(|e| e.python_type.as_str()) {
            None => {
                // Whole: nothing the cell printed lost, nothing of another cell's in it.
                let lines: Vec<&str> = out.output.lines().collect();
                assert_eq!(lines.len(), 2000, "ending {end:?}");
                assert!(
                    lines.iter().enumerate().all(|(i, line)| line.starts_with("n ")
                        && line.ends_with(&format!(" {i}"))),
                    "ending {end:?}"
                );
                ended += 1;
            }
            Some("KeyboardInterrupt") => interrupted += 1,
            other => panic!("{other:?}: {:?} ending {end:?}", out.error),
        }
    }
    storm.join().expect("the storm ran");
    assert!(
        interrupted > 0 && ended > 0,
        "{ended} ended, {interrupted} interrupted"
    );
    assert_eq!(run(&rt, "print('after')").await.output, "after\n");
    assert_eq!(rt.pid().await, pid, "the same process");
}

/// A cell that swallows its interrupt is killed after the grace, with a fresh process after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_that_ignores_its_interrupt_is_killed() {
    let rt = prepared(KernelConfig::new().interrupt_grace(Duration::from_millis(300))).await;
    let pid = rt.pid().await;
    let interrupter = rt.interrupter().expect("interruptible");
    let stopper = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        interrupter.interrupt()
    });
    let cell = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        print('ignored', flush=True)";
    let out = run(&rt, cell).await;
    assert_eq!(stopper.await.expect("ran"), Interruption::Delivered);
    died(&out, "did not stop within 0.3 s of its interrupt");
    assert!(out.output.starts_with("ignored\n"), "{:?}", out.output);
    recovered(&rt, pid).await;
}

/// The agent's own time limit, end to end: a sleeping cell, a busy loop, and a cell that
/// swallows its interrupt (killed, state lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_exec_timeout_stops_hung_cells() {
    use cave_core::{AgentBuilder, Event};
    use cave_testing::{Reply, ScriptedModel};
    use futures_util::StreamExt;
    let rt = prepared(KernelConfig::new()).await;
    let model = ScriptedModel::new([
        Reply::text("```python\nimport time\ntime.sleep(100)\n```"),
        Reply::text("```python\nwhile True:\n    pass\n```"),
        Reply::text(
            "```python\nwhile True:\n    try:\n        time.sleep(10)\n    except BaseException:\n        pass\n```",
        ),
        Reply::text("```python\nprint(kept, 'mine' in globals())\n```"),
        Reply::text("done"),
    ]);
    let mut builder = AgentBuilder::new(model, rt.clone());
    builder.max_exec_timeout(Duration::from_millis(500));
    let mut agent = builder.build().expect("builds");
    let events: Vec<Event> = agent.stream("go").collect().await;
    let timeouts: Vec<bool> = events
        .iter()
        .filter_map(|e| match e {
            Event::ExecutionTimeout { state_lost, .. } => Some(*state_lost),
            _ => None,
        })
        .collect();
    assert_eq!(timeouts, [false, false, true], "{events:#?}");
    let last_result = events.iter().rev().find_map(|e| match e {
        Event::ExecutionResult { output, .. } => Some(output.clone()),
        _ => None,
    });
    assert_eq!(last_result.as_deref(), Some("7 False\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exceeding_the_memory_limit_is_an_out_of_memory_kill() {
    let limits = Limits::default().memory(256 << 20);
    let rt = prepared(KernelConfig::new().limits(limits)).await;
    let enforcement = rt.enforcement().await;
    // Control groups are how a memory kill is enforced.
    if cave_testing::machine::skips(
        "exceeding_the_memory_limit_is_an_out_of_memory_kill",
        Need::ControlGroups.lacking(),
    ) {
        return;
    }
    assert!(
        enforcement
            .iter()
            .any(|e| e.contains("memory") && e.contains("control group")),
        "{enforcement:?}"
    );
    let pid = rt.pid().await;
    let out = run(
        &rt,
        "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 1024**2))",
    )
    .await;
    died(&out, "out of memory");
    recovered(&rt, pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_stops_at_the_process_limit() {
    let limits = Limits::default().processes(32);
    let rt = prepared(KernelConfig::new().limits(limits)).await;
    let enforcement = rt.enforcement().await;
    // Control groups are how a process limit holds for root.
    if cave_testing::machine::skips(
        "a_fork_bomb_stops_at_the_process_limit",
        Need::ControlGroups.lacking(),
    ) {
        return;
    }
    assert!(
        enforcement
            .iter()
            .any(|e| e.contains("processes: 32 (control group)")),
        "{enforcement:?}"
    );
    let out = run(&rt, "import os\nwhile True:\n    os.fork()").await;
    assert!(!out.success(), "{out:?}");
    assert!(
        out.output.contains("BlockingIOError") || out.state_lost,
        "the bomb hit the limit: {:?}",
        &out.output[..out.output.len().min(500)]
    );
    // Whatever the bomb left, the runtime answers with its registered resources. (Copies that
    // were still writing to the descriptors when the cell ended may add their tracebacks to
    // this cell's output: descriptor output belongs to the cell running when it arrives.)
    let after = run(&rt, "kept").await;
    assert!(after.success(), "{after:?}");
    assert!(after.output.lines().any(|l| l == "7"), "{:?}", after.output);
}

/// The agent, end to end: the model's code crashes the child; the model is told its state was
/// lost, and its next cell runs in a fresh process with the registered resources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_recovers_from_a_crash_mid_run() {
    use cave_core::{AgentBuilder, Event, StopReason};
    use cave_testing::{Reply, ScriptedModel};
    use futures_util::StreamExt;
    let rt = prepared(KernelConfig::new()).await;
    let model = ScriptedModel::new([
        Reply::text("```python\nprint('step one')\nimport ctypes\nctypes.string_at(0)\n```"),
        Reply::text("```python\nprint(kept + 1)\n```"),
        Reply::text("It crashed once; kept + 1 is 8."),
    ]);
    let shared = std::sync::Arc::new(model);
    let mut agent = AgentBuilder::new(shared.clone(), rt.clone())
        .build()
        .expect("builds");
    let events: Vec<Event> = agent.stream("go").collect().await;
    let results: Vec<(String, bool, bool)> = events
        .iter()
        .filter_map(|e| match e {
            Event::ExecutionResult {
                output,
                success,
                state_lost,
                ..
            } => Some((output.clone(), *success, *state_lost)),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 2, "{events:#?}");
    assert!(results[0].0.starts_with("step one\n") && results[0].0.contains("SIGSEGV"));
    assert_eq!((results[0].1, results[0].2), (false, true));
    assert_eq!(results[1], ("8\n".to_owned(), true, false));
    let told = shared.requests()[1]
        .messages
        .iter()
        .any(|m| m.content.contains("SIGSEGV"));
    assert!(told, "the model saw what happened");
    assert!(matches!(
        events.last(),
        Some(Event::Stopped {
            stop_reason: StopReason::Completed,
            ..
        })
    ));
}

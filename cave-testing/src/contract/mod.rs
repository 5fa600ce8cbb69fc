//! The runtime contract: what every [`Runtime`] that runs Python must do, as checks a runtime's
//! own tests call (see [`runtime_contract_tests!`](crate::runtime_contract_tests)).
//!
//! The expected outputs are exact: a runtime that passes gives the same output, echo and
//! traceback for the same cell as every other one. A new runtime starts by passing these.

mod concurrent;
mod display;

pub use concurrent::{
    a_failing_call_among_many_reaches_the_cell, calls_in_flight_end_with_their_cell,
    host_calls_run_side_by_side,
};

pub use display::{
    Piece, Shown, a_form_over_the_display_limit_is_left_out, a_host_function_can_show_an_item,
    a_rich_last_value_is_shown_as_an_item, display_sends_every_rich_form,
    matplotlib_figures_are_shown, mime_bundles_are_taken_as_given, run_shown,
};

use cave_core::{
    Args, DiscardOutput, Execution, Field, Function, HostError, HostObject, Interrupt,
    Interruption, Method, ObjectBinding, OutputSink, Param, ParamKind, Resources, Runtime,
    RuntimeError, RuntimeExt, Signature, TypeSchema, Value, Variable,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Generates one `#[tokio::test]` per contract check, each on a fresh runtime from `$make`
/// (an async function returning the runtime). The test crate needs tokio with `macros` and
/// `rt-multi-thread`.
#[macro_export]
macro_rules! runtime_contract_tests {
    ($make:path) => {
        $crate::runtime_contract_tests!(@list @each $make);
    };
    // `$make` returns `Option<R>`: `None` skips the check (having said why).
    (optional $make:path) => {
        $crate::runtime_contract_tests!(@list @optional $make);
    };
    (@list @$form:ident $make:path) => {
        $crate::runtime_contract_tests!(@$form $make;
            output_is_captured_in_order,
            errors_show_the_cells_own_lines,
            top_level_await_works,
            the_namespace_persists,
            long_cells_stream_their_output,
            a_busy_loop_is_preempted,
            a_printing_loop_is_preempted,
            output_past_the_cap_is_kept_whole,
            output_written_between_cells_comes_with_the_next,
            a_cell_that_replaces_stdout_does_not_silence_later_cells,
            values_round_trip,
            host_functions_have_real_signatures,
            python_source_functions_are_bound_as_written,
            generated_types_reach_host_functions_as_structs,
            host_objects_keep_their_state_in_the_host,
            a_cell_that_rebinds_a_host_name_is_told,
            a_panicking_host_function_fails_its_call_only,
            a_host_call_that_never_returns_is_interrupted,
            an_interrupt_leaves_no_import_lock_held,
            host_calls_run_side_by_side,
            a_failing_call_among_many_reaches_the_cell,
            calls_in_flight_end_with_their_cell,
            a_replaced_object_has_its_new_methods,
            reset_restores_what_was_registered,
            bind_unique_hands_out_distinct_names,
            deeply_nested_values_are_refused_both_ways,
            display_sends_every_rich_form,
            a_rich_last_value_is_shown_as_an_item,
            mime_bundles_are_taken_as_given,
            a_form_over_the_display_limit_is_left_out,
            a_host_function_can_show_an_item,
            matplotlib_figures_are_shown
        );
    };
    (@optional $make:path; $($check:ident),*) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let _turn = $crate::contract::turn(stringify!($check));
                let Some(runtime) = $make().await else { return };
                $crate::contract::$check(&runtime).await;
            }
        )*
    };
    (@each $make:path; $($check:ident),*) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let _turn = $crate::contract::turn(stringify!($check));
                let runtime = $make().await;
                $crate::contract::$check(&runtime).await;
            }
        )*
    };
}

/// Checks that change what every runtime of the process shares (in-process, `sys.stdout` is
/// the interpreter's) run alone; the others run side by side.
const ALONE: &[&str] = &[
    "a_cell_that_replaces_stdout_does_not_silence_later_cells",
    "output_written_between_cells_comes_with_the_next",
];

static TURNS: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A check's turn (used by [`runtime_contract_tests!`]): exclusive for the checks that must
/// run alone, shared otherwise. Keep a runtime's other tests out of the contract's binary.
pub fn turn(check: &str) -> Box<dyn std::any::Any> {
    if ALONE.contains(&check) {
        Box::new(
            TURNS
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    } else {
        Box::new(
            TURNS
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// A traceback without the lines of `~` and `^` that Python 3.11+ draws under a frame's line
/// (where in it the error was): they differ from version to version (3.13 marks calls that
/// 3.11 leaves unmarked), and the checks run on every supported Python.
pub fn without_position_marks(traceback: &str) -> String {
    traceback
        .split_inclusive('\n')
        .filter(|line| {
            let mark = line.trim();
            mark.is_empty() || !mark.chars().all(|c| c == '~' || c == '^')
        })
        .collect()
}

/// A host function that panics fails its call with a `RuntimeError` the cell can catch, whether
/// it panicked at once or after waiting; the runtime goes on serving calls.
pub async fn a_panicking_host_function_fails_its_call_only(rt: &dyn Runtime) {
    let now = Function::host("now", Signature::default(), |_args: Args| async move {
        if true {
            panic!("broken at once");
        }
        Ok(Value::None)
    });
    let later = Function::host("later", Signature::default(), |_args: Args| async move {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        if true {
            panic!("broken after waiting");
        }
        Ok(Value::None)
    });
    let fine = Function::host("fine", Signature::default(), |_args: Args| async move {
        Ok(Value::Int(7))
    });
    rt.register(
        Resources::new()
            .function(now)
            .function(later)
            .function(fine),
    )
    .await
    .expect("registers");
    let out = run(
        rt,
        "for f in (now, later):\n    try:\n        f()\n    except RuntimeError as e:\n        print(e)\nprint(fine())",
    )
    .await;
    assert!(out.error.is_none(), "{out:?}");
    assert_eq!(
        out.output,
        "the host function now panicked: broken at once\n\
         the host function later panicked: broken after waiting\n7\n"
    );
}

/// A cell waiting on a host call that never returns (an MCP tool that does not answer, a future
/// that never finishes) is stopped by an interrupt like any other cell: the call's future is
/// dropped, the cell gets `KeyboardInterrupt`, and the next cell runs at once.
pub async fn a_host_call_that_never_returns_is_interrupted(rt: &dyn Runtime) {
    /// Counts the futures dropped.
    struct Dropped(Arc<std::sync::atomic::AtomicUsize>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = dropped.clone();
    // Calls that reached the host: the interrupt is sent only once the call is there (sent
    // while the cell is still handing the call over, it stops the cell before any call).
    let entered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let entering = entered.clone();
    let hang = Function::host("hang", Signature::default(), move |_args: Args| {
        entering.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let guard = Dropped(counter.clone());
        async move {
            let _guard = guard;
            std::future::pending::<()>().await;
            Ok(Value::None)
        }
    });
    rt.register(Resources::new().function(hang))
        .await
        .expect("registers");
    let interrupter = rt.interrupter().expect("the runtime can interrupt");
    for attempt in 1..=2 {
        let stopper = {
            let (interrupter, entered) = (interrupter.clone(), entered.clone());
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(60);
                while entered.load(std::sync::atomic::Ordering::SeqCst) < attempt
                    && Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                (interrupter.interrupt(), Instant::now())
            })
        };
        let waiting = run(
            rt,
            "print('calling')
hang()",
        );
        let out = tokio::time::timeout(Duration::from_secs(60), waiting)
            .await
            .expect("the cell waiting on the host call was never stopped");
        let (interruption, at) = stopper.await.expect("the stopper ran");
        assert_eq!(interruption, Interruption::Delivered, "attempt {attempt}");
        assert_eq!(
            out.error.as_ref().map(|e| e.python_type.as_str()),
            Some("KeyboardInterrupt"),
            "attempt {attempt}: {out:?}"
        );
        assert!(!out.state_lost, "attempt {attempt}");
        assert!(out.output.starts_with("calling\n"), "{:?}", out.output);
        let late = at.elapsed();
        assert!(
            late < Duration::from_secs(20),
            "stopped {late:?} after the interrupt"
        );
        // The next cell does not wait for the call.
        let next = tokio::time::timeout(Duration::from_secs(20), run(rt, "print(1 + 1)"))
            .await
            .expect("the next cell ran");
        assert_eq!(next.output, "2\n");
        let deadline = Instant::now() + Duration::from_secs(10);
        while dropped.load(std::sync::atomic::Ordering::SeqCst) < attempt
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            dropped.load(std::sync::atomic::Ordering::SeqCst),
            attempt,
            "the call's future was dropped"
        );
    }
}

/// A cell interrupted while its thread holds the interpreter's import lock (as when the
/// interrupt lands inside importlib, between its taking the lock and the `try` that gives it
/// back) leaves it held by no one: another thread's import completes afterwards.
pub async fn an_interrupt_leaves_no_import_lock_held(rt: &dyn Runtime) {
    run(rt, "import threading, sys, time").await;
    let interrupter = rt.interrupter().expect("the runtime can interrupt");
    let stopper = interrupt_once_running(interrupter);
    let holding = run(
        rt,
        "import _imp\n_imp.acquire_lock()\nwhile True:\n    time.sleep(0.01)",
    );
    let out = tokio::time::timeout(Duration::from_secs(60), holding)
        .await
        .expect("the cell holding the lock was never stopped");
    assert_eq!(
        stopper.await.expect("the stopper ran").0,
        Interruption::Delivered
    );
    assert_eq!(
        out.error.as_ref().map(|e| e.python_type.as_str()),
        Some("KeyboardInterrupt"),
        "{out:?}"
    );
    // Imported afresh on a thread of its own (the cell's thread may take the lock again: it
    // is reentrant); bounded, so that a lock still held fails the check instead of hanging it.
    let probe = run(
        rt,
        "sys.modules.pop('sched', None)\nprobe = threading.Thread(target=__import__, args=('sched',), daemon=True)\nprobe.start()\nprobe.join(20)\nprint('blocked' if probe.is_alive() else 'imported')",
    )
    .await;
    assert_eq!(probe.output, "imported\n", "{probe:?}");
}

/// Runs a cell; the runtime itself must not fail.
pub async fn run(runtime: &dyn Runtime, code: &str) -> Execution {
    runtime
        .execute(code, &DiscardOutput)
        .await
        .expect("the runtime works")
}

/// `time.sleep(100)` stopped by the runtime's interrupter: delivered, `KeyboardInterrupt`, the
/// namespace kept. Not one of the contract's checks (a runtime that cannot stop a blocking C
/// call may still pass the contract); for a runtime's own tests, e.g. after it changed process.
pub async fn a_sleep_is_interrupted(rt: &dyn Runtime) {
    run(rt, "import time\nkept = 'yes'").await;
    let interrupter = rt.interrupter().expect("the runtime can interrupt");
    let stopper = interrupt_once_running(interrupter);
    let slept = run(rt, "time.sleep(100)").await;
    assert_eq!(
        stopper.await.expect("the stopper ran").0,
        Interruption::Delivered
    );
    assert_eq!(
        slept.error.map(|e| e.python_type),
        Some("KeyboardInterrupt".to_owned())
    );
    assert!(!slept.state_lost);
    assert_eq!(run(rt, "print(kept)").await.output, "yes\n");
}

/// Printed output, stderr and echoes arrive in order; text is valid UTF-8.
pub async fn output_is_captured_in_order(rt: &dyn Runtime) {
    assert_eq!(run(rt, "print('hi')").await.output, "hi\n");
    assert_eq!(run(rt, "5 + 3").await.output, "8\n");
    assert_eq!(run(rt, "x = 1").await.output, "");
    assert_eq!(run(rt, "None").await.output, "");
    let out = run(
        rt,
        "import sys\nprint('one')\nprint('warned', file=sys.stderr)\nprint('two')",
    )
    .await;
    assert_eq!(out.output, "one\nwarned\ntwo\n");
    assert_eq!(
        run(rt, "import sys\nsys.stdout.writelines(['A', 'B'])")
            .await
            .output,
        "AB"
    );
    let out = run(
        rt,
        "import sys\nsys.stdout.buffer.write(b'binary-output\\n\\xff')\nsys.stdout.flush()",
    )
    .await;
    assert_eq!(out.output, "binary-output\n\u{fffd}");
    assert!(out.success());
    // Lone surrogates cannot be UTF-8: they arrive as U+FFFD.
    assert_eq!(run(rt, "print('a\\udc80b')").await.output, "a\u{fffd}b\n");
}

/// Tracebacks show the cell's lines and none of the runtime's.
pub async fn errors_show_the_cells_own_lines(rt: &dyn Runtime) {
    let out = run(rt, "print('before')\ndef f():\n    return 1/0\nf()").await;
    assert!(!out.success());
    let error = out.error.as_ref().expect("it raised");
    assert_eq!(
        (error.python_type.as_str(), error.message.as_str()),
        ("ZeroDivisionError", "division by zero")
    );
    assert!(
        out.output
            .starts_with("before\nTraceback (most recent call last):\n  File \"<cell "),
        "{}",
        out.output
    );
    assert!(
        out.output.contains(", line 3, in f\n    return 1/0\n"),
        "{}",
        out.output
    );
    assert!(
        out.output
            .ends_with("ZeroDivisionError: division by zero\n"),
        "{}",
        out.output
    );
    assert!(
        !out.output.contains("<cave-") && !out.output.contains("run_cell"),
        "{}",
        out.output
    );
    let out = run(rt, "if True:\nprint(1)").await;
    assert_eq!(
        out.error.as_ref().map(|e| e.python_type.as_str()),
        Some("IndentationError")
    );
    // Python 3.9 says less: "expected an indented block".
    assert!(
        out.output.contains("    print(1)\n")
            && (out.output.ends_with(
                "IndentationError: expected an indented block after 'if' statement on line 1\n"
            ) || out
                .output
                .ends_with("IndentationError: expected an indented block\n")),
        "{}",
        out.output
    );
    let out = run(rt, "x = (").await;
    assert_eq!(
        out.error.map(|e| e.python_type),
        Some("SyntaxError".to_owned())
    );
    // A trailing expression (compiled apart from the body, where the host reads it) raises on
    // its own line; a syntax error in it or before it reads as the whole cell's.
    let out = run(rt, "x = 1\ny = 0\nx / y").await;
    assert!(
        out.output.contains(", line 3, in <module>\n    x / y\n"),
        "{}",
        out.output
    );
    for (cell, line) in [("x = 1\nx +", 2), ("def f(:\n    pass\nf()", 1)] {
        let out = run(rt, cell).await;
        assert_eq!(
            out.error.as_ref().map(|e| e.python_type.as_str()),
            Some("SyntaxError"),
            "{cell:?}: {}",
            out.output
        );
        assert!(
            out.output.contains(&format!(", line {line}\n")),
            "{cell:?}: {}",
            out.output
        );
    }
}

/// Top-level `await` works, and coroutines persist across cells.
pub async fn top_level_await_works(rt: &dyn Runtime) {
    let out = run(rt, "import asyncio\nasync def twice(x):\n    await asyncio.sleep(0.01)\n    return 2 * x\nawait twice(21)").await;
    assert_eq!(out.output, "42\n");
    assert_eq!(run(rt, "r = await twice(2)\nprint(r)").await.output, "4\n");
}

/// Names and imports persist from cell to cell.
pub async fn the_namespace_persists(rt: &dyn Runtime) {
    run(rt, "shared = 'a'").await;
    assert_eq!(run(rt, "shared").await.output, "'a'\n");
    assert_eq!(run(rt, "import math\nmath.floor(2.5)").await.output, "2\n");
    assert_eq!(run(rt, "math.ceil(2.5)").await.output, "3\n");
}

/// Records live output.
#[derive(Default)]
struct Live(Mutex<Vec<String>>);

impl OutputSink for Live {
    fn write(&self, chunk: &str) {
        cave_core::lock(&self.0).push(chunk.to_owned());
    }
}

/// Output reaches the sink while the cell runs, and the whole of it is in the result.
pub async fn long_cells_stream_their_output(rt: &dyn Runtime) {
    let live = Live::default();
    let out = rt
        .execute(
            "import time\nprint('first', flush=True)\ntime.sleep(0.3)\nprint('second')",
            &live,
        )
        .await
        .expect("the runtime works");
    let chunks = live.0.lock().expect("not poisoned").clone();
    assert_eq!(chunks.concat(), out.output);
    assert_eq!(out.output, "first\nsecond\n");
    assert!(chunks.len() >= 2, "streamed in pieces: {chunks:?}");
}

/// Interrupts the cell that is about to start, once it is running (a slow machine may take a
/// while to start it): what the interrupt said, and when.
fn interrupt_once_running(
    interrupter: Arc<dyn Interrupt>,
) -> tokio::task::JoinHandle<(Interruption, Instant)> {
    tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let interruption = interrupter.interrupt();
            if interruption != Interruption::Idle {
                return (interruption, Instant::now());
            }
        }
        (Interruption::Idle, Instant::now())
    })
}

/// An interrupt stops a pure-Python loop with `KeyboardInterrupt`; state survives.
pub async fn a_busy_loop_is_preempted(rt: &dyn Runtime) {
    let interrupter = rt.interrupter().expect("the runtime can interrupt");
    assert_eq!(interrupter.interrupt(), Interruption::Idle);
    // Started first, so that the interrupt finds the loop running on any runtime.
    run(rt, "n = 0").await;
    let stopper = interrupt_once_running(interrupter);
    let out = run(rt, "while True:\n    n += 1").await;
    let (interruption, at) = stopper.await.expect("the stopper ran");
    assert_eq!(interruption, Interruption::Delivered);
    assert_eq!(
        out.error.map(|e| e.python_type),
        Some("KeyboardInterrupt".to_owned())
    );
    assert!(!out.state_lost);
    let late = at.elapsed();
    assert!(
        late < Duration::from_millis(500),
        "stopped {late:?} after the interrupt"
    );
    assert_eq!(run(rt, "n > 0").await.output, "True\n");
    // A late interrupt does not leak into the next cell.
    assert_eq!(
        rt.interrupter().expect("still").interrupt(),
        Interruption::Idle
    );
    assert_eq!(run(rt, "1").await.output, "1\n");
}

/// An interrupt stops a loop that prints as fast as it can: nothing on the output path may
/// swallow it or hold it back.
pub async fn a_printing_loop_is_preempted(rt: &dyn Runtime) {
    let interrupter = rt.interrupter().expect("the runtime can interrupt");
    run(rt, "k = 0").await;
    let stopper = interrupt_once_running(interrupter);
    let looping = run(rt, "while True:\n    k += 1\n    print('line', k)");
    // A loop the interrupt cannot stop would hang the suite: give up well past the bound.
    let out = tokio::time::timeout(Duration::from_secs(60), looping)
        .await
        .expect("the printing loop was never stopped");
    let (interruption, at) = stopper.await.expect("the stopper ran");
    assert_eq!(interruption, Interruption::Delivered);
    assert_eq!(
        out.error.as_ref().map(|e| e.python_type.as_str()),
        Some("KeyboardInterrupt"),
        "{:?}",
        out.error
    );
    assert!(!out.state_lost);
    // Generous: a loaded machine delays a printing loop's output through a Jupyter server.
    let late = at.elapsed();
    assert!(
        late < Duration::from_secs(20),
        "stopped {late:?} after the interrupt"
    );
    assert!(
        out.output.starts_with("line 1\n"),
        "{:?}",
        &out.output[..out.output.len().min(200)]
    );
    assert_eq!(run(rt, "k > 0").await.output, "True\n");
    assert_eq!(run(rt, "1").await.output, "1\n");
}

/// A cell that prints more than the runtime holds (the default cap,
/// [`DEFAULT_MAX_HELD_OUTPUT`](cave_core::DEFAULT_MAX_HELD_OUTPUT)) gives its beginning and its
/// end in `output`, with a note of what is not shown, and the whole output in its file
/// (`Execution::spooled`), which binds whole to `_output_N` (`bind_unique_spooled`).
pub async fn output_past_the_cap_is_kept_whole(rt: &dyn Runtime) {
    let cap = cave_core::DEFAULT_MAX_HELD_OUTPUT;
    let lines = 3 * cap / 1000;
    let out = run(
        rt,
        &format!("for i in range({lines}):\n    print(f'{{i:07}}', 'x' * 990)"),
    )
    .await;
    assert!(out.success(), "{:?}", out.error);
    assert!(
        out.output.len() <= cap + 1000,
        "{} bytes held",
        out.output.len()
    );
    assert!(
        out.output.starts_with("0000000 x"),
        "{:?}",
        &out.output[..80]
    );
    let last = format!("{:07} {}\n", lines - 1, "x".repeat(990));
    assert!(out.output.ends_with(&last), "the last line is kept");
    let whole = lines as u64 * 999;
    let note = out
        .output
        .lines()
        .find(|l| l.contains("of output not shown here"))
        .expect("a note says what is not shown");
    assert!(
        note.contains(&format!(
            "the whole output, {}, is kept.]",
            cave_core::format_size(whole)
        )),
        "{note}"
    );
    let spooled = out.spooled.as_deref().expect("the whole output is kept");
    assert_eq!((spooled.bytes(), spooled.cut()), (whole, 0));
    let name = rt
        .bind_unique_spooled("_output", spooled, 1)
        .await
        .expect("binds the whole output");
    assert_eq!(
        run(
            rt,
            &format!("print(len({name}), {name}.splitlines()[12345][:9], {name}.count('\\n'))")
        )
        .await
        .output,
        format!("{whole} 0012345 x {lines}\n")
    );
    // The file goes with the last clone of its execution.
    let path = spooled.path().map(ToOwned::to_owned);
    drop(out);
    if let Some(path) = path {
        assert!(!path.exists(), "{} is left", path.display());
    }
}

/// What a thread a cell left running writes while no cell runs is shown, within a cap, with
/// the next cell's output: the model learns its thread is still printing, and nothing grows
/// without bound.
pub async fn output_written_between_cells_comes_with_the_next(rt: &dyn Runtime) {
    // The thread waits until its cell is over, then writes about 1 MB.
    run(
        rt,
        "import threading, time\n\
         def flood():\n    \
             time.sleep(0.3)\n    \
             for i in range(10_000):\n        \
                 print('tick', i, 'x' * 100)\n\
         threading.Thread(target=flood, daemon=True).start()",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // What it wrote comes before the output of the next cells, as it arrives.
    let mut said = String::new();
    for _ in 0..3 {
        let out = run(rt, "print('next')").await;
        assert!(out.output.contains("next\n"), "{:.300}", out.output);
        said.push_str(&out.output);
        if said.contains("more written outside any cell") {
            break;
        }
    }
    assert!(said.contains("Written after its cell ended"), "{said:.300}");
    assert!(said.contains("tick "), "{said:.300}");
    assert!(
        said.contains("more written outside any cell"),
        "{said:.300}"
    );
    assert!(
        said.len() < 4 * cave_cell::STRAY_OUTPUT_CAP,
        "{} bytes shown",
        said.len()
    );
}

/// Through an agent: a cell that prints without pause is stopped at `max_exec_timeout`, and at
/// the run's time budget when that comes first (the output path must not keep the deadline
/// from firing). Not one of the contract's checks (it needs the agent); for each runtime's
/// agent tests.
pub async fn time_limits_stop_a_printing_loop(runtime: impl Runtime + Clone + 'static) {
    use crate::{Reply, ScriptedModel};
    use cave_core::{Agent, AgentBuilder, Event, Message, StopReason, prompt};
    use futures_util::StreamExt;
    let block = |code: &str| format!("```python\n{code}\n```");
    // A cell nothing stops would hang the suite: fail instead, well past either limit.
    async fn run_to_end(agent: &mut Agent) -> Vec<Event> {
        tokio::time::timeout(Duration::from_secs(60), agent.stream("Print.").collect())
            .await
            .expect("a time limit ended the printing cell")
    }
    let timeout_of = |events: &[Event]| {
        events.iter().find_map(|e| match e {
            Event::ExecutionTimeout { timeout, .. } => Some(*timeout),
            _ => None,
        })
    };
    let stop_reason = |events: &[Event]| match events.last() {
        Some(Event::Stopped { stop_reason, .. }) => Some(*stop_reason),
        _ => None,
    };
    let printing = block("n = 0\nwhile True:\n    n += 1\n    print('line', n)");
    let model = ScriptedModel::new([
        Reply::text(printing.clone()),
        Reply::text(block("print(n > 0)")),
        Reply::text("Done."),
    ]);
    let mut agent = AgentBuilder::new(model, runtime.clone())
        // Room for the cell after it: behind a Jupyter server the interrupted cell's output
        // may still be arriving when it starts.
        .max_exec_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let events = run_to_end(&mut agent).await;
    assert_eq!(timeout_of(&events), Some(2.0));
    assert_eq!(stop_reason(&events), Some(StopReason::Completed));
    let second = agent
        .history()
        .iter()
        .filter_map(|m| match m {
            Message::ExecutionResult { content, .. } => Some(content.as_str()),
            _ => None,
        })
        .nth(1);
    assert_eq!(second, Some(prompt::execution_output("True\n").as_str()));

    // The run's budget: the cell is stopped when the run's time is up, and the run ends.
    let model = ScriptedModel::new([Reply::text(printing), Reply::text("never asked")]);
    let mut agent = AgentBuilder::new(model, runtime)
        .max_exec_timeout(Duration::from_secs(600))
        .max_run_time(Duration::from_millis(800))
        .build()
        .unwrap();
    let events = run_to_end(&mut agent).await;
    assert!(
        timeout_of(&events).is_some_and(|t| t <= 0.8),
        "{:?}",
        timeout_of(&events)
    );
    assert_eq!(stop_reason(&events), Some(StopReason::Timeout));
}

/// Replacing `sys.stdout` is undone after the cell, with one note to the model.
pub async fn a_cell_that_replaces_stdout_does_not_silence_later_cells(rt: &dyn Runtime) {
    let out = run(
        rt,
        "import sys\nsys.stdout = None\nsys.stderr = open('/dev/null', 'w')\nprint('lost')",
    )
    .await;
    assert!(out.success(), "{}", out.output);
    assert!(
        out.output.contains("replaced sys.stdout and sys.stderr") && !out.output.contains("lost"),
        "the model is told, once: {:?}",
        out.output
    );
    let out = run(
        rt,
        "import sys\nprint('seen')\nprint('also', file=sys.stderr)",
    )
    .await;
    assert_eq!(out.output, "seen\nalso\n");
    let out = run(
        rt,
        "import contextlib, io\nbuf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n    print('inner')\nprint(buf.getvalue().strip())",
    )
    .await;
    assert_eq!(out.output, "inner\n");
}

/// Every kind of value crosses both ways with full fidelity; the model's changes come back.
pub async fn values_round_trip(rt: &dyn Runtime) {
    let nested: BTreeMap<i64, Vec<(String, f64)>> =
        [(1, vec![("a".to_owned(), 1.5)]), (-7, vec![])].into();
    let big = i128::from(u64::MAX) * 1000;
    let resources = Resources::new()
        .variable(Variable::new("small", Value::Int(42)))
        .variable(Variable::new("big", Value::Int(big)))
        .variable(Variable::new("nan", Value::Float(f64::NAN)))
        .variable(Variable::new("raw", Value::Bytes(vec![0, 255])))
        .variable(Variable::new(
            "pair",
            Value::Tuple(vec![Value::Int(1), "x".into()]),
        ))
        .variable(Variable::from_serialize("nested", &nested).expect("serializes"))
        .variable(Variable::new("nothing", Value::None));
    rt.register(resources).await.expect("registers");
    let out = run(rt, "print(type(big).__name__, big % 1000, type(pair).__name__, sorted(nested), raw[1], nan != nan)").await;
    assert_eq!(out.output, "int 0 tuple [-7, 1] 255 True\n");
    assert_eq!(rt.retrieve_as::<i128>("big").await.expect("big"), big);
    assert!(rt.retrieve_as::<f64>("nan").await.expect("nan").is_nan());
    assert_eq!(
        rt.retrieve_as::<Vec<u8>>("raw").await.expect("raw"),
        [0, 255]
    );
    assert_eq!(
        rt.retrieve_as::<(i64, String)>("pair").await.expect("pair"),
        (1, "x".to_owned())
    );
    assert_eq!(
        rt.retrieve_as::<BTreeMap<i64, Vec<(String, f64)>>>("nested")
            .await
            .expect("nested"),
        nested
    );
    assert_eq!(rt.retrieve("nothing").await.expect("nothing"), Value::None);
    run(
        rt,
        "nested[2] = [('b', 2)]\nsmall += 1\nsets = {1, 2}\nhuge = 2 ** 200\nkeys = {(1, 'a'): b'x', None: -2**100}\nfn = lambda: 1\nimport collections\nodd = collections.OrderedDict(a=collections.Counter('aab'))",
    )
    .await;
    assert_eq!(rt.retrieve_as::<i64>("small").await.expect("small"), 43);
    assert_eq!(
        rt.retrieve_as::<BTreeMap<i64, Vec<(String, f64)>>>("nested")
            .await
            .expect("nested")
            .len(),
        3
    );
    assert_eq!(
        rt.get("sets").await.expect("sets"),
        Value::Set(vec![Value::Int(1), Value::Int(2)])
    );
    assert_eq!(
        rt.get("keys").await.expect("keys"),
        Value::Dict(vec![
            (
                Value::Tuple(vec![Value::Int(1), "a".into()]),
                Value::Bytes(b"x".to_vec())
            ),
            (Value::None, Value::Int(-(1 << 100))),
        ])
    );
    assert_eq!(
        rt.get("odd")
            .await
            .expect("subclasses convert as their base"),
        Value::Dict(vec![(
            "a".into(),
            Value::Dict(vec![
                ("a".into(), Value::Int(2)),
                ("b".into(), Value::Int(1))
            ])
        )])
    );
    let err = rt.get("huge").await.expect_err("too large");
    assert!(
        err.to_string().contains("int larger than 128 bits"),
        "{err}"
    );
    let err = rt.get("fn").await.expect_err("a function is not a value");
    assert!(
        matches!(&err, RuntimeError::Unsupported { python_type, .. } if python_type == "function"),
        "{err}"
    );
    let err = rt.retrieve("sets").await.expect_err("not registered");
    assert!(
        matches!(err, RuntimeError::UnknownVariable { bound: true, .. }),
        "only registered variables are retrieved: {err}"
    );
    assert!(
        err.to_string().contains("get_as"),
        "points to get_as: {err}"
    );
    let err = rt.retrieve("missing").await.expect_err("not registered");
    assert!(
        matches!(err, RuntimeError::UnknownVariable { bound: false, .. }),
        "{err}"
    );
    // Any bound name, read as a Rust type.
    let small: i64 = rt.get_as("small").await.expect("an int");
    assert_eq!(small, 43);
    assert!(matches!(
        rt.get("missing").await.expect_err("unbound"),
        RuntimeError::Unbound { .. }
    ));
    rt.update("small", Value::Int(7)).await.expect("updates");
    assert_eq!(run(rt, "small").await.output, "7\n");
}

fn reverse() -> Function {
    let sig = Signature::new([Param::new("text").annotated("str")]).returns("str");
    Function::host("reverse", sig, |args: Args| async move {
        let text: String = args.get("text")?;
        Ok(Value::Str(text.chars().rev().collect()))
    })
    .with_doc("Reverse a string.")
}

/// Host functions have real Python signatures; their errors are Python exceptions.
pub async fn host_functions_have_real_signatures(rt: &dyn Runtime) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let sig = Signature::new([
        Param::new("a").annotated("int"),
        Param::new("b")
            .annotated("int")
            .default_value(Value::Int(2)),
        Param::new("rest").kind(ParamKind::VarPositional),
        Param::new("scale")
            .default_value(Value::Int(1))
            .kind(ParamKind::KeywordOnly),
    ])
    .returns("int");
    let add = Function::host("add", sig, move |args: Args| {
        let seen = seen.clone();
        async move {
            seen.lock()
                .map_err(HostError::runtime)?
                .push(args.values().to_vec());
            let (a, b, scale): (i64, i64, i64) =
                (args.get("a")?, args.get("b")?, args.get("scale")?);
            let rest: Vec<i64> = args.get("rest")?;
            Ok(Value::Int(
                ((a + b + rest.iter().sum::<i64>()) * scale).into(),
            ))
        }
    });
    let fail = Function::host("fail", Signature::default(), |_args: Args| async move {
        Err(HostError::new("ValueError", "the host says no"))
    });
    rt.register(
        Resources::new()
            .function(add)
            .function(fail)
            .function(reverse()),
    )
    .await
    .expect("registers");
    assert_eq!(run(rt, "add(1)").await.output, "3\n");
    assert_eq!(run(rt, "add(1, 2, 3, 4, scale=10)").await.output, "100\n");
    assert_eq!(run(rt, "reverse(text='abc')").await.output, "'cba'\n");
    let out = run(rt, "add()").await;
    assert!(
        out.output
            .ends_with("TypeError: add() missing 1 required positional argument: 'a'\n"),
        "{}",
        out.output
    );
    let out = run(rt, "add(1, nope=2)").await;
    assert!(
        out.output
            .ends_with("TypeError: add() got an unexpected keyword argument 'nope'\n"),
        "{}",
        out.output
    );
    let out = run(
        rt,
        "try:\n    fail()\nexcept ValueError as e:\n    print('caught', e)",
    )
    .await;
    assert_eq!(out.output, "caught the host says no\n");
    let out = run(rt, "fail()").await;
    assert_eq!(
        without_position_marks(&out.output),
        "Traceback (most recent call last):\n  File \"<cell 7>\", line 1, in <module>\n    fail()\n  File \"<cave fail>\", line 2, in fail\nValueError: the host says no\n"
    );
    let out = run(rt, "add('x')").await;
    assert!(
        out.output.contains("TypeError: argument 'a'"),
        "a Rust conversion error is a Python exception: {}",
        out.output
    );
    let out = run(rt, "add(lambda: 1)").await;
    assert!(
        out.output.contains(
            "TypeError: argument 'a' is a function, which cannot be passed to a host function"
        ),
        "{}",
        out.output
    );
    let out = run(rt, "import inspect\nprint(inspect.signature(add))").await;
    assert_eq!(out.output, "(a, b=2, *rest, scale=1)\n");
    assert_eq!(calls.lock().expect("not poisoned").len(), 3);
    let prompt = rt.describe().functions;
    assert!(
        prompt.contains("- function: add(a: int, b: int = 2, *rest, scale=1) -> int"),
        "{prompt}"
    );
    assert!(
        prompt.contains("- function: reverse(text: str) -> str\n  doc:\n    Reverse a string."),
        "{prompt}"
    );
}

/// Python-source functions are bound as written; a batch with a bad one binds nothing.
pub async fn python_source_functions_are_bound_as_written(rt: &dyn Runtime) {
    let sig = Signature::new([Param::new("n").annotated("int")]).returns("int");
    rt.register(
        Resources::new().function(
            Function::python("square", sig, "def square(n):\n    return n * n\n")
                .with_doc("Square it."),
        ),
    )
    .await
    .expect("registers");
    assert_eq!(run(rt, "square(7)").await.output, "49\n");
    let bad = Function::python("cube", Signature::default(), "def other(): pass");
    let err = rt
        .register(
            Resources::new()
                .variable(Variable::new("ok_before", Value::Int(1)))
                .function(bad)
                .variable(Variable::new("ok_after", Value::Int(2))),
        )
        .await
        .expect_err("refused");
    assert!(
        matches!(&err, RuntimeError::InvalidResource { name, .. } if name == "cube")
            && err.to_string().contains("does not define 'cube'"),
        "{err}"
    );
    let names = run(
        rt,
        "print([n for n in ('ok_before', 'ok_after', 'cube', 'other') if n in globals()])",
    )
    .await;
    assert_eq!(names.output, "[]\n", "nothing of the failed batch is bound");
    assert!(!rt.describe().variables.contains("ok_before"));
    assert_eq!(run(rt, "square(2)").await.output, "4\n");
    let fixed = Function::python(
        "cube",
        Signature::default(),
        "def cube(n):\n    return n ** 3",
    );
    rt.register(
        Resources::new()
            .function(fixed)
            .variable(Variable::new("ok_before", Value::Int(1))),
    )
    .await
    .expect("registers");
    assert_eq!(run(rt, "cube(2), ok_before").await.output, "(8, 1)\n");
    rt.reset().await.expect("resets");
    assert_eq!(run(rt, "cube(2), square(3)").await.output, "(8, 9)\n");
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Point {
    x: f64,
    y: f64,
    tags: Vec<String>,
}

/// Records and enums are real Python classes; records reach the host as structs.
pub async fn generated_types_reach_host_functions_as_structs(rt: &dyn Runtime) {
    let point = TypeSchema::record(
        "Point",
        [
            Field::new("x", "float"),
            Field::new("y", "float").default_value(Value::Float(0.0)),
            Field::new("tags", "list[str]").default_value(Value::List(vec![])),
        ],
    )
    .with_doc("A point.");
    let color = TypeSchema::enumeration(
        "Color",
        [
            ("RED".to_owned(), "r".into()),
            ("GREEN".to_owned(), Value::Int(2)),
        ],
    );
    let received = Arc::new(Mutex::new(None));
    let sink = received.clone();
    let sig = Signature::new([Param::new("p").annotated("Point")]).returns("float");
    let norm = Function::host("norm", sig, move |args: Args| {
        let sink = sink.clone();
        async move {
            let p: Point = args.get("p")?;
            let n = (p.x * p.x + p.y * p.y).sqrt();
            *sink.lock().map_err(HostError::runtime)? = Some(p);
            Ok(Value::Float(n))
        }
    });
    let origin = Variable::from_serialize(
        "origin",
        &Point {
            x: 0.0,
            y: 0.0,
            tags: vec!["o".into()],
        },
    )
    .expect("serializes")
    .with_type_name("Point");
    rt.register(
        Resources::new()
            .type_(point)
            .type_(color)
            .function(norm)
            .variable(origin),
    )
    .await
    .expect("registers");
    assert_eq!(
        run(rt, "norm(Point(3.0, 4.0, tags=['a']))").await.output,
        "5.0\n"
    );
    assert_eq!(
        *received.lock().expect("not poisoned"),
        Some(Point {
            x: 3.0,
            y: 4.0,
            tags: vec!["a".into()]
        })
    );
    assert_eq!(
        run(
            rt,
            "type(origin).__name__, Color.RED.value, Point(1.0).tags, Color.GREEN"
        )
        .await
        .output,
        "('Point', 'r', [], <Color.GREEN: 2>)\n"
    );
    run(rt, "origin.x = 9.5\nshade = Color.GREEN").await;
    assert_eq!(
        rt.retrieve_as::<Point>("origin").await.expect("origin"),
        Point {
            x: 9.5,
            y: 0.0,
            tags: vec!["o".into()]
        }
    );
    assert_eq!(rt.get("shade").await.expect("shade"), Value::from("GREEN"));
    let types = rt.describe().types;
    assert!(types.starts_with("Point:\n  doc: A point.\n  fields:\n    - x: float\n    - y: float = 0.0\n    - tags: list[str] = []"), "{types}");
    assert!(
        types.contains("Color (Enum):\n  - RED = 'r'\n  - GREEN = 2"),
        "{types}"
    );
}

/// A host object the model operates (its state lives in the host): the contract's, and the
/// one runtime-specific tests of host objects use too.
#[derive(Debug, Default)]
pub struct Light {
    /// The brightness the model set last.
    pub level: Mutex<i64>,
    /// The methods called, in order.
    pub log: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl HostObject for Light {
    fn type_name(&self) -> &str {
        "Light"
    }
    fn doc(&self) -> Option<String> {
        Some("A smart light.".into())
    }
    fn methods(&self) -> Vec<Method> {
        vec![
            Method::new(
                "dim",
                Signature::new([Param::new("level")
                    .annotated("int")
                    .default_value(Value::Int(10))])
                .returns("int"),
            )
            .with_doc("Set the brightness."),
            Method::new("level", Signature::default().returns("int")),
        ]
    }
    async fn call(&self, method: &str, args: Args) -> Result<Value, HostError> {
        self.log
            .lock()
            .map_err(HostError::runtime)?
            .push(method.to_owned());
        match method {
            "dim" => {
                let level: i64 = args.get("level")?;
                if !(0..=100).contains(&level) {
                    return Err(HostError::new(
                        "ValueError",
                        format!("level {level} is outside 0..=100"),
                    ));
                }
                *self.level.lock().map_err(HostError::runtime)? = level;
                Ok(Value::Int(level.into()))
            }
            "level" => Ok(Value::Int(
                (*self.level.lock().map_err(HostError::runtime)?).into(),
            )),
            other => Err(HostError::new(
                "AttributeError",
                format!("no method {other}"),
            )),
        }
    }
}

/// The model calls a host object's methods; the host's own object changes.
pub async fn host_objects_keep_their_state_in_the_host(rt: &dyn Runtime) {
    let light = Arc::new(Light::default());
    rt.register(
        Resources::new()
            .object(ObjectBinding::new("light", light.clone()).with_description("the desk light")),
    )
    .await
    .expect("registers");
    assert_eq!(run(rt, "light.dim(40)\nlight.level()").await.output, "40\n");
    let out = run(rt, "light.dim(400)").await;
    assert!(
        out.output
            .ends_with("ValueError: level 400 is outside 0..=100\n"),
        "{}",
        out.output
    );
    assert_eq!(
        run(rt, "isinstance(light, Light), light").await.output,
        "(True, <Light object (host)>)\n"
    );
    assert_eq!(*light.level.lock().expect("not poisoned"), 40);
    assert_eq!(
        light.log.lock().expect("not poisoned").as_slice(),
        ["dim", "level", "dim"]
    );
    let d = rt.describe();
    assert!(
        d.variables
            .contains("- name: light\n  type: Light\n  description: the desk light"),
        "{}",
        d.variables
    );
    assert!(d.types.contains("Light:\n  doc: A smart light.\n  methods:\n    - dim(level: int = 10) -> int\n        Set the brightness.\n    - level() -> int"), "{}", d.types);
    rt.reset().await.expect("resets");
    assert_eq!(run(rt, "light.level()").await.output, "40\n");
}

/// A cell that rebinds or deletes a function or object the host registered is told so in its
/// output, once; a registered variable is the model's to change, and is not watched.
pub async fn a_cell_that_rebinds_a_host_name_is_told(rt: &dyn Runtime) {
    let light = Arc::new(Light::default());
    let double = Function::host("double", Signature::default(), |_args: Args| async {
        Ok(Value::Int(2))
    });
    rt.register(
        Resources::new()
            .object(ObjectBinding::new("time", light))
            .function(double)
            .variable(Variable::new("total", Value::Int(0))),
    )
    .await
    .expect("registers");
    let out = run(rt, "total = 5\nprint(time.level())").await;
    assert_eq!(out.output, "0\n", "no note for a variable or a use");
    let out = run(rt, "import time\nprint('ok')").await;
    assert!(out.success(), "{out:?}");
    assert_eq!(
        out.output,
        "ok\n[note: this code rebound `time` (the host's Light object); in this session that name \
         no longer reaches the host's value. Bind your own values under other names (for a \
         module: `import time as time_module`).]\n"
    );
    assert_eq!(
        run(rt, "print(time.__name__)").await.output,
        "time\n",
        "said once"
    );
    let out = run(rt, "del double").await;
    assert!(
        out.output
            .contains("rebound `double` (the host's function)"),
        "{}",
        out.output
    );
    // A failing cell is told too.
    rt.reset().await.expect("resets");
    let out = run(rt, "double = 3\nraise ValueError('x')").await;
    assert!(out.output.contains("rebound `double`"), "{}", out.output);
}

/// A host object whose methods grow (an MCP server whose tools changed): `a` at first, then
/// `b` too.
#[derive(Debug, Default)]
struct Growing {
    grown: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl HostObject for Growing {
    fn type_name(&self) -> &str {
        "Growing"
    }
    fn methods(&self) -> Vec<Method> {
        let mut methods = vec![Method::new("a", Signature::default().returns("str"))];
        if self.grown.load(std::sync::atomic::Ordering::SeqCst) {
            methods.push(Method::new("b", Signature::default().returns("str")));
        }
        methods
    }
    async fn call(&self, method: &str, _args: Args) -> Result<Value, HostError> {
        Ok(Value::Str(method.to_owned()))
    }
}

/// `replace` binds an object anew with the methods it has now, keeps the cells' own names,
/// survives `reset`, and refuses to replace a variable.
pub async fn a_replaced_object_has_its_new_methods(rt: &dyn Runtime) {
    let growing = Arc::new(Growing::default());
    let binding = || Resources::new().object(ObjectBinding::new("tools", growing.clone()));
    rt.register(binding()).await.expect("registers");
    rt.register(Resources::new().variable(Variable::new("limit", Value::Int(3))))
        .await
        .expect("registers");
    assert_eq!(
        run(
            rt,
            "mine = 1
tools.a()"
        )
        .await
        .output,
        "'a'\n"
    );
    assert!(run(rt, "tools.b()").await.output.contains("AttributeError"));
    growing
        .grown
        .store(true, std::sync::atomic::Ordering::SeqCst);
    rt.replace(binding()).await.expect("replaces");
    assert_eq!(
        run(rt, "tools.a(), tools.b(), mine").await.output,
        "('a', 'b', 1)\n"
    );
    assert!(rt.describe().types.contains("b() -> str"));
    let refused = rt
        .replace(Resources::new().variable(Variable::new("limit", Value::Int(4))))
        .await;
    assert!(
        matches!(refused, Err(RuntimeError::InvalidResource { .. })),
        "{refused:?}"
    );
    assert_eq!(run(rt, "limit").await.output, "3\n");
    rt.reset().await.expect("resets");
    assert_eq!(run(rt, "tools.b()").await.output, "'b'\n");
}

/// `reset` clears the model's names and restores registered resources with their latest
/// host-side values, and `bind_unique` bindings.
pub async fn reset_restores_what_was_registered(rt: &dyn Runtime) {
    rt.register(
        Resources::new()
            .variable(Variable::new("count", Value::Int(1)))
            .function(reverse()),
    )
    .await
    .expect("registers");
    run(rt, "count = 5\nmine = 1").await;
    rt.update("count", Value::Int(7)).await.expect("updates");
    let persisted = rt
        .bind_unique("_output", Value::Str("big".into()), 1)
        .await
        .expect("binds");
    rt.reset().await.expect("resets");
    assert_eq!(
        run(rt, "'mine' in globals(), count, reverse('ab'), _output_1")
            .await
            .output,
        "(False, 7, 'ba', 'big')\n"
    );
    assert_eq!(persisted, "_output_1");
    let err = rt
        .update("count", Value::Str("x".into()))
        .await
        .expect_err("typed");
    assert_eq!(
        err.to_string(),
        "cannot update variable 'count': expected int, got str"
    );
}

/// `bind_unique` never hands out a taken name, even to concurrent callers.
pub async fn bind_unique_hands_out_distinct_names(rt: &dyn Runtime) {
    run(rt, "_output_2 = 'made by the model'").await;
    rt.register(Resources::new().variable(Variable::new("_output_4", Value::None)))
        .await
        .expect("registers");
    let names = futures_util::future::join_all(
        (0..25).map(|i| rt.bind_unique("_output", Value::Int(i), 1)),
    )
    .await;
    let distinct: std::collections::BTreeSet<_> =
        names.into_iter().map(|n| n.expect("binds")).collect();
    assert_eq!(distinct.len(), 25);
    assert!(!distinct.contains("_output_2") && !distinct.contains("_output_4"));
    assert_eq!(run(rt, "_output_2").await.output, "'made by the model'\n");
    assert_eq!(
        rt.bind_unique("\u{212a}", Value::None, 1)
            .await
            .expect("binds"),
        "K_1"
    );
    assert!(rt.bind_unique("bad-name", Value::None, 1).await.is_err());
    assert!(matches!(
        rt.bind_unique("p", Value::None, 0)
            .await
            .expect_err("start 0"),
        RuntimeError::InvalidStart
    ));
}

/// Nesting as deep as code can make it: a clear error both ways, never a crash.
pub async fn deeply_nested_values_are_refused_both_ways(rt: &dyn Runtime) {
    let out = run(
        rt,
        "deep = []\nfor _ in range(100_000):\n    deep = [deep]\ndeep",
    )
    .await;
    assert!(
        out.output.contains("RecursionError"),
        "Python's own repr gives up cleanly: {}",
        out.output
    );
    let err = rt.get("deep").await.expect_err("too deep");
    assert!(
        matches!(&err, RuntimeError::Unsupported { python_type, .. } if python_type.contains("nested deeper")),
        "{err}"
    );
    let mut value = Value::Int(0);
    for _ in 0..600 {
        value = Value::List(vec![value]);
    }
    let err = rt
        .register(Resources::new().variable(Variable::new("from_host", value)))
        .await
        .expect_err("too deep");
    assert!(err.to_string().contains("nested deeper than"), "{err}");
    assert_eq!(run(rt, "'from_host' in globals()").await.output, "False\n");
}

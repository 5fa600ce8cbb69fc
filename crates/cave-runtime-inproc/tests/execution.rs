//! Running cells: output, errors, await, isolation, concurrency, interrupts.

use cave_core::{DiscardOutput, Execution, Interruption, OutputSink, Runtime};
use cave_runtime_inproc::InProcRuntime;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub(crate) async fn run(runtime: &InProcRuntime, code: &str) -> Execution {
    runtime
        .execute(code, &DiscardOutput)
        .await
        .expect("the runtime works")
}

#[tokio::test]
async fn output_is_captured_in_order() {
    let rt = InProcRuntime::new().unwrap();
    assert_eq!(run(&rt, "print('hi')").await.output, "hi\n");
    assert_eq!(run(&rt, "5 + 3").await.output, "8\n");
    assert_eq!(run(&rt, "x = 1").await.output, "");
    assert_eq!(run(&rt, "None").await.output, "");
    let out = run(
        &rt,
        "import sys\nprint('one')\nprint('warned', file=sys.stderr)\nprint('two')",
    )
    .await;
    assert_eq!(out.output, "one\nwarned\ntwo\n");
    assert_eq!(
        run(&rt, "import sys\nsys.stdout.writelines(['A', 'B'])")
            .await
            .output,
        "AB"
    );
    let out = run(
        &rt,
        "import sys\nsys.stdout.buffer.write(b'binary-output\\n\\xff')\nsys.stdout.flush()",
    )
    .await;
    assert_eq!(out.output, "binary-output\n\u{fffd}");
    assert!(out.success());
    // Lone surrogates cannot be UTF-8: they arrive as U+FFFD.
    assert_eq!(run(&rt, "print('a\\udc80b')").await.output, "a\u{fffd}b\n");
}

#[tokio::test]
async fn errors_show_the_cells_own_lines() {
    let rt = InProcRuntime::new().unwrap();
    let out = run(&rt, "print('before')\ndef f():\n    return 1/0\nf()").await;
    assert!(!out.success());
    let error = out.error.as_ref().unwrap();
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
        !out.output.contains("cave-executor") && !out.output.contains("run_cell"),
        "{}",
        out.output
    );

    let out = run(&rt, "if True:\nprint(1)").await;
    assert_eq!(out.error.unwrap().python_type, "IndentationError");
    assert!(
        out.output.contains("    print(1)\n")
            && out.output.ends_with(
                "IndentationError: expected an indented block after 'if' statement on line 1\n"
            ),
        "{}",
        out.output
    );
    let out = run(&rt, "x = (").await;
    assert_eq!(out.error.unwrap().python_type, "SyntaxError");
}

#[tokio::test]
async fn top_level_await_works() {
    let rt = InProcRuntime::new().unwrap();
    let out = run(&rt, "import asyncio\nasync def twice(x):\n    await asyncio.sleep(0.01)\n    return 2 * x\nawait twice(21)").await;
    assert_eq!(out.output, "42\n");
    assert_eq!(run(&rt, "r = await twice(2)\nprint(r)").await.output, "4\n");
}

#[tokio::test]
async fn namespaces_are_isolated_and_persistent() {
    let a = InProcRuntime::new().unwrap();
    let b = InProcRuntime::new().unwrap();
    run(&a, "shared = 'a'").await;
    run(&b, "shared = 'b'").await;
    assert_eq!(run(&a, "shared").await.output, "'a'\n");
    assert_eq!(run(&b, "shared").await.output, "'b'\n");
    assert_eq!(run(&a, "import math\nmath.floor(2.5)").await.output, "2\n");
    assert_eq!(run(&b, "'math' in globals()").await.output, "False\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runtimes_keep_their_own_output() {
    let runtimes: Vec<_> = (0..3).map(|_| InProcRuntime::new().unwrap()).collect();
    let cell = |i: usize| {
        format!("import time\nfor n in range(200):\n    print('r{i}', n)\n    time.sleep(0)")
    };
    let outputs = futures_util::future::join_all(runtimes.iter().enumerate().map(|(i, rt)| {
        let code = cell(i);
        async move { rt.execute(&code, &DiscardOutput).await.unwrap().output }
    }))
    .await;
    for (i, out) in outputs.iter().enumerate() {
        let expected: String = (0..200).map(|n| format!("r{i} {n}\n")).collect();
        assert_eq!(
            out, &expected,
            "runtime {i} got only its own output, in order"
        );
    }
}

/// Records live output.
#[derive(Default)]
struct Live(Mutex<Vec<String>>);

impl OutputSink for Live {
    fn write(&self, chunk: &str) {
        self.0.lock().unwrap().push(chunk.to_owned());
    }
}

#[tokio::test]
async fn long_cells_stream_their_output() {
    let rt = InProcRuntime::new().unwrap();
    let live = Live::default();
    let out = rt
        .execute("for i in range(3):\n    print(i)", &live)
        .await
        .unwrap();
    assert_eq!(live.0.lock().unwrap().concat(), out.output);
    assert_eq!(out.output, "0\n1\n2\n");
}

#[tokio::test]
async fn host_output_is_not_captured() {
    let rt = InProcRuntime::new().unwrap();
    // A thread the cell starts writes to the real stdout, not into the cell's output.
    let out = run(&rt, "import threading\nt = threading.Thread(target=lambda: print('from a thread'))\nt.start(); t.join()\nprint('cell')").await;
    assert_eq!(out.output, "cell\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_loop_is_preempted() {
    let rt = InProcRuntime::new().unwrap();
    let interrupter = rt.interrupter().expect("in-process runtimes can interrupt");
    assert_eq!(interrupter.interrupt(), Interruption::Idle);
    let started = Instant::now();
    let deadline = Duration::from_millis(300);
    let stopper = tokio::spawn(async move {
        tokio::time::sleep(deadline).await;
        (interrupter.interrupt(), Instant::now())
    });
    let out = run(&rt, "n = 0\nwhile True:\n    n += 1").await;
    let (interruption, at) = stopper.await.unwrap();
    assert_eq!(interruption, Interruption::Delivered);
    assert_eq!(out.error.unwrap().python_type, "KeyboardInterrupt");
    let late = at.elapsed();
    eprintln!("a busy loop stopped {late:?} after the interrupt");
    assert!(
        late < Duration::from_millis(500),
        "stopped {late:?} after the interrupt (started {:?} ago)",
        started.elapsed()
    );
    // The runtime stays usable and kept its state.
    assert!(run(&rt, "n > 0").await.output == "True\n");
    // A late interrupt does not leak into the next cell.
    assert_eq!(rt.interrupter().unwrap().interrupt(), Interruption::Idle);
    assert_eq!(run(&rt, "1").await.output, "1\n");
}

#[tokio::test]
async fn a_cell_that_replaces_stdout_does_not_silence_later_cells() {
    let rt = InProcRuntime::new().unwrap();
    let out = run(
        &rt,
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
        &rt,
        "import sys\nprint('seen')\nprint('also', file=sys.stderr)",
    )
    .await;
    assert_eq!(
        out.output, "seen\nalso\n",
        "routing is back, and no second note"
    );
    // Capturing temporarily is fine and says nothing.
    let out = run(
        &rt,
        "import contextlib, io\nbuf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n    print('inner')\nprint(buf.getvalue().strip())",
    )
    .await;
    assert_eq!(out.output, "inner\n");
}

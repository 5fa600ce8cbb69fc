//! Running cells: output, errors, await, isolation, concurrency, interrupts.

use cave_core::{DiscardOutput, Execution, Runtime};
use cave_runtime_inproc::InProcRuntime;

pub(crate) async fn run(runtime: &InProcRuntime, code: &str) -> Execution {
    runtime
        .execute(code, &DiscardOutput)
        .await
        .expect("the runtime works")
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

#[tokio::test]
async fn a_thread_a_cell_starts_writes_into_the_cell() {
    let rt = InProcRuntime::new().unwrap();
    // Its output is the model code's, not the host's: the cell's, in order here (joined).
    let out = run(&rt, "import threading\nt = threading.Thread(target=lambda: print('from a thread'))\nt.start(); t.join()\nprint('cell')").await;
    assert_eq!(out.output, "from a thread\ncell\n");
}

#[tokio::test]
async fn a_pool_thread_writes_into_the_cell_that_waits_for_it() {
    let rt = InProcRuntime::new().unwrap();
    run(&rt, "from concurrent.futures import ThreadPoolExecutor\npool = ThreadPoolExecutor(1)\npool.submit(lambda: None).result()").await;
    // The pool's thread was started by the first cell; the second cell's task writes.
    let out = run(
        &rt,
        "pool.submit(lambda: print('from the pool')).result()\nprint('cell')",
    )
    .await;
    assert_eq!(out.output, "from the pool\ncell\n");
    run(&rt, "pool.shutdown()").await;
}

/// `set_cell_limits` bounds each form of an item a cell shows, for this runtime alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_display_limit_is_a_setting_of_each_runtime() {
    let small = InProcRuntime::new().unwrap();
    small.set_cell_limits(small.cell_limits().max_display(1000));
    let other = InProcRuntime::new().unwrap();
    let code = "display({'text/plain': 't', 'image/svg+xml': 'y' * 1001}, raw=True)";
    let (_, shown) = cave_testing::contract::run_shown(&small, code).await;
    assert_eq!(
        shown.items()[0].omitted,
        [("image/svg+xml".to_owned(), 1001)]
    );
    let (_, shown) = cave_testing::contract::run_shown(&other, code).await;
    assert!(shown.items()[0].omitted.is_empty(), "the default is 16 MiB");
}

/// Two runtimes share the interpreter and pyplot's figures: each cell shows only its own
/// runtime's, also when another runtime's cell ends while a figure of this one is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_runtime_shows_only_its_own_matplotlib_figures() {
    let drawing = InProcRuntime::new().unwrap();
    let other = InProcRuntime::new().unwrap();
    let (drawn, quick) = tokio::join!(
        cave_testing::contract::run_shown(
            &drawing,
            "import time, matplotlib.pyplot as plt\nplt.figure()\nplt.plot([1, 2])\ntime.sleep(1.5)",
        ),
        async {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            cave_testing::contract::run_shown(&other, "print('quick')").await
        }
    );
    assert!(drawn.0.success(), "{:?}", drawn.0);
    assert_eq!(quick.0.output, "quick\n");
    assert!(quick.1.items().is_empty(), "{:?}", quick.1.items());
    assert_eq!(drawn.1.items().len(), 1, "the figure is its own cell's");
}

/// An interrupt that finds a cell importing lands where importlib can unwind it: never
/// between its taking the interpreter's import lock and the `try` that gives it back, which
/// left the lock held and every later import in the process waiting forever (a CI hang on
/// Python 3.13). A thread of the cell imports without pause meanwhile, so the interrupted
/// thread is often waiting for that lock when the interrupt comes; the cell's own loop does
/// some work of its own between imports, as real cells do, where the interrupt can land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_during_imports_leaves_imports_working() {
    let rt = InProcRuntime::new().unwrap();
    run(
        &rt,
        "import sys, threading\nstop = False\ndef churn():\n    while not stop:\n        sys.modules.pop('colorsys', None)\n        import colorsys\nchurner = threading.Thread(target=churn, daemon=True)\nchurner.start()",
    )
    .await;
    let interrupter = rt.interrupter().expect("the runtime can interrupt");
    for round in 0..60u64 {
        let interrupter = interrupter.clone();
        let stopper = tokio::spawn(async move {
            // Different moments of the import loop from one round to the next.
            tokio::time::sleep(std::time::Duration::from_millis(2 + round % 17)).await;
            while interrupter.interrupt() == cave_core::Interruption::Idle {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        });
        let out = bounded(run(
            &rt,
            "while True:\n    sys.modules.pop('sched', None)\n    import sched\n    for _ in range(300):\n        pass",
        ))
        .await;
        stopper.await.expect("the stopper ran");
        assert_eq!(
            out.error.map(|e| e.python_type).as_deref(),
            Some("KeyboardInterrupt"),
            "round {round}"
        );
    }
    // Another thread still imports: the lock was given back each time.
    let out = bounded(run(
        &rt,
        "stop = True\nchurner.join(10)\ndef probe():\n    sys.modules.pop('colorsys', None)\n    import colorsys\nprober = threading.Thread(target=probe, daemon=True)\nprober.start()\nprober.join(10)\nprint(churner.is_alive(), prober.is_alive())",
    ))
    .await;
    assert_eq!(out.output, "False False\n", "{out:?}");
}

/// A cell's result, or a failure (not a hang) if the interpreter wedged.
async fn bounded(cell: impl std::future::Future<Output = Execution>) -> Execution {
    tokio::time::timeout(std::time::Duration::from_secs(60), cell)
        .await
        .expect("the cell ended: the interpreter's import lock was left held")
}

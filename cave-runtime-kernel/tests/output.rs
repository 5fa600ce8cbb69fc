//! Output written to the child's descriptors 1 and 2 belongs to the cell that wrote it.

use cave_core::{DiscardOutput, OutputSink, Runtime};
use cave_runtime_kernel::KernelRuntime;
use std::sync::Mutex;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptor_output_belongs_to_the_cell_that_wrote_it() {
    let rt = KernelRuntime::new().expect("python");
    let out = rt
        .execute(
            "import os, subprocess, sys\nprint('py')\nos.write(1, b'fd1\\n')\nos.write(2, b'fd2\\n')\nsubprocess.run(['echo', 'sub'])\nos.system('echo shell >&2')",
            &DiscardOutput,
        )
        .await
        .expect("runs");
    for expected in ["py\n", "fd1\n", "fd2\n", "sub\n", "shell\n"] {
        assert!(
            out.output.contains(expected),
            "{expected:?} in {:?}",
            out.output
        );
    }
    // More than a pipe holds: every line, in order, once.
    let out = rt
        .execute(
            "import os\nfor i in range(4000):\n    os.write(1, (f'{i:05d}' + 'x' * 50 + '\\n').encode())",
            &DiscardOutput,
        )
        .await
        .expect("runs");
    let rows: Vec<String> = (0..4000)
        .map(|i| format!("{i:05}{}", "x".repeat(50)))
        .collect();
    let seen: Vec<&str> = out.output.lines().collect();
    assert_eq!(seen, rows);
    // A process the cell forks prints through the descriptors and leaves the socket alone.
    let out = rt
        .execute(
            "import os\npid = os.fork()\nif pid == 0:\n    print('from the fork')\nelse:\n    os.waitpid(pid, 0)\n    print('parent')",
            &DiscardOutput,
        )
        .await
        .expect("runs");
    assert!(out.success(), "{out:?}");
    assert!(
        out.output.contains("from the fork\n") && out.output.ends_with("parent\n"),
        "{:?}",
        out.output
    );
    assert_eq!(
        rt.execute("'still' + ' here'", &DiscardOutput)
            .await
            .expect("runs")
            .output,
        "'still here'\n"
    );
    // A thread that writes after its cell ended: shown before the next cell's output, said
    // to be the thread's, not the cell's.
    rt.execute(
        "import threading, time, os\nthreading.Thread(target=lambda: (time.sleep(0.2), os.write(1, b'late\\n'))).start()",
        &DiscardOutput,
    )
    .await
    .expect("runs");
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let next = rt.execute("1 + 1", &DiscardOutput).await.expect("runs");
    assert_eq!(
        next.output,
        cave_core::prompt::written_outside_cells("late\n") + "2\n"
    );
    let after = rt.execute("1 + 1", &DiscardOutput).await.expect("runs");
    assert_eq!(after.output, "2\n", "said once");
}

/// Records live output.
#[derive(Default)]
struct Live(Mutex<Vec<String>>);

impl OutputSink for Live {
    fn write(&self, chunk: &str) {
        self.0.lock().expect("not poisoned").push(chunk.to_owned());
    }
}

/// Output is sent in batches, yet streams: a line printed before a pause arrives on its own,
/// without a flush; and many prints arrive whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_output_still_streams() {
    let rt = KernelRuntime::new().expect("python");
    let live = Live::default();
    let out = rt
        .execute(
            "import time\nprint('first')\ntime.sleep(0.5)\nprint('second')",
            &live,
        )
        .await
        .expect("runs");
    assert_eq!(out.output, "first\nsecond\n");
    let chunks = live.0.lock().expect("not poisoned").clone();
    assert_eq!(
        chunks.first().map(String::as_str),
        Some("first\n"),
        "{chunks:?}"
    );
    let out = rt
        .execute("for i in range(20000):\n    print(i)", &DiscardOutput)
        .await
        .expect("runs");
    let expected: String = (0..20000).map(|i| format!("{i}\n")).collect();
    assert_eq!(out.output, expected);
}

/// `CellLimits::max_display`, set on the kernel's configuration, bounds each form of an item
/// the cell shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_display_limit_is_a_setting() {
    let rt = KernelRuntime::with_config(
        cave_runtime_kernel::KernelConfig::new()
            .spare(false)
            .cell_limits(cave_cell::CellLimits::default().max_display(1000)),
    )
    .expect("python");
    let (out, shown) = cave_testing::contract::run_shown(
        &rt,
        "display({'text/plain': 't', 'text/html': 'x' * 999, 'image/svg+xml': 'y' * 1001}, raw=True)",
    )
    .await;
    assert!(out.success(), "{out:?}");
    let item = &shown.items()[0];
    assert_eq!(item.mime_types(), ["text/plain", "text/html"]);
    assert_eq!(item.omitted, [("image/svg+xml".to_owned(), 1001)]);
    rt.stop().await;
}

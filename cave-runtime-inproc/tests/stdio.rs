//! Descriptor-level output (os.write, subprocesses, C stdio) captured into the running cell.

use crate::execution::run;
use cave_runtime_inproc::{CapturedStreams, InProcRuntime, StdioCapture};
use std::io::Write;
use std::os::fd::AsRawFd;

fn identity(fd: i32) -> (u64, u64) {
    // SAFETY: fstat fills a zeroed stat structure for a descriptor of this process.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::fstat(fd, &mut stat) }, 0);
    (stat.st_dev, stat.st_ino)
}

/// One test holds the process's only capture; everything about it is checked here.
#[tokio::test]
async fn descriptor_output_belongs_to_the_cell_that_wrote_it() {
    let stdout_before = identity(1);
    let stderr_before = identity(2);
    let rt = InProcRuntime::new().unwrap();
    let capture = StdioCapture::start(CapturedStreams::StdoutAndStderr).unwrap();
    assert!(
        StdioCapture::start(CapturedStreams::Stdout).is_err(),
        "one capture at a time"
    );
    assert_ne!(
        identity(1),
        stdout_before,
        "descriptor 1 is the capture's pipe"
    );
    assert_eq!(
        identity(capture.original_stdout().unwrap().as_raw_fd()),
        stdout_before
    );
    rt.attach_stdio(&capture);

    let out = run(
        &rt,
        "import os, ctypes\n\
         os.write(1, b'fd-one\\n')\n\
         os.write(2, b'fd-two\\n')\n\
         os.system('echo from-a-child')\n\
         ctypes.CDLL(None).printf(b'from-c-stdio\\n')\n\
         print('from-print')",
    )
    .await;
    assert!(out.success(), "{}", out.output);
    for expected in [
        "fd-one\n",
        "fd-two\n",
        "from-a-child\n",
        "from-c-stdio\n",
        "from-print\n",
    ] {
        assert!(
            out.output.contains(expected),
            "{expected:?} missing from {:?}",
            out.output
        );
    }
    // More than a pipe holds, written while the cell runs: all of it, once.
    let out = run(
        &rt,
        "import os\nfor i in range(4000):\n    os.write(1, (f'{i:05d}' + 'x' * 50 + '\\n').encode())",
    )
    .await;
    // (Other writers of this process may write to descriptor 1 meanwhile: that output belongs
    // to whatever cell runs, by design. The test harness writes "test … " and "ok" separately,
    // so its text can even land inside a line of ours: each row is looked for as text, in
    // order, rather than as a whole line.)
    let mut from = 0;
    for i in 0..4000 {
        let row = format!("{i:05}{}\n", "x".repeat(50));
        let at = out.output[from..]
            .find(&row)
            .unwrap_or_else(|| panic!("row {i} missing or out of order"));
        from += at + row.len();
    }
    assert_eq!(
        out.output.matches("xxxxxxxxxx\n").count(),
        4000,
        "every row once"
    );
    // Written outside any cell (here by the host itself): not the next cell's output.
    // SAFETY: writing a valid buffer to descriptor 1.
    unsafe { libc::write(1, b"stray\n".as_ptr().cast(), 6) };
    // (The harness's own progress output may land in it too, as above.)
    let next = run(&rt, "1 + 1").await.output;
    assert!(next.contains("2\n") && !next.contains("stray"), "{next:?}");
    // The host's own channel still reaches the original stdout.
    capture.original_stdout().unwrap().write_all(b"").unwrap();

    drop(capture);
    assert_eq!(identity(1), stdout_before, "descriptor 1 is restored");
    assert_eq!(identity(2), stderr_before, "descriptor 2 is restored");
    let again = StdioCapture::start(CapturedStreams::Stdout).unwrap();
    drop(again);
}

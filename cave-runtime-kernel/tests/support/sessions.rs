//! What several test binaries do with a session: read its process id, give it a host
//! function, kill its kernel from outside.

// Each test binary that includes this file uses a part of it.
#![allow(dead_code)]

use cave_core::{
    Args, DiscardOutput, Function, Param, Resources, Runtime, Signature, Value, Variable,
};
use cave_runtime_kernel::KernelRuntime;
use cave_testing::contract::run;
use std::time::Duration;

/// The process id the session's cells run in.
pub async fn pid(runtime: &KernelRuntime) -> u32 {
    let run = runtime
        .execute("import os\nprint(os.getpid())", &DiscardOutput)
        .await
        .unwrap();
    run.output
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{run:?}"))
}

/// `double(n)`, a host function.
pub fn double() -> Function {
    Function::host(
        "double",
        Signature::new([Param::new("n").annotated("int")]).returns("int"),
        |args: Args| async move {
            let n: i64 = args.get("n")?;
            Ok(Value::Int((2 * n).into()))
        },
    )
}

/// The kernel is killed behind the runtime's back: the next cell says state was lost, and
/// runs in a fresh kernel with what was registered bound again (`limit`, 7).
pub async fn a_killed_kernel_is_replaced(rt: &KernelRuntime) {
    rt.register(Resources::new().variable(Variable::new("limit", Value::Int(7))))
        .await
        .expect("registers");
    let pid: i32 = run(rt, "import os\nscratch = 1\nprint(os.getpid())")
        .await
        .output
        .trim()
        .parse()
        .expect("a pid");
    // SAFETY: a signal to the kernel process this test's gateway started.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let mut after = run(rt, "print(limit)").await;
    if !after.state_lost {
        // The death may not have been seen yet; it is by the next cell at the latest.
        tokio::time::sleep(Duration::from_secs(1)).await;
        after = run(rt, "print(limit)").await;
    }
    assert!(after.state_lost, "{after:?}");
    assert_eq!(run(rt, "print(limit)").await.output, "7\n");
    assert_eq!(
        run(rt, "scratch").await.error.expect("gone").python_type,
        "NameError"
    );
}

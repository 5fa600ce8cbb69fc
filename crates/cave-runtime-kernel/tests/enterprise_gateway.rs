//! The kernel runtime through a real Jupyter Enterprise Gateway (PyPI's
//! `jupyter_enterprise_gateway`) on 127.0.0.1, in its local mode: the runtime contract, a host
//! call, an interrupt, a kernel killed from outside, and a pool of kernels started ahead.

#![cfg(feature = "jupyter")]

#[path = "support/gateway.rs"]
mod support;

use cave_core::{Args, Function, Param, Resources, Runtime, Signature, Value, Variable};
use cave_runtime_kernel::{JupyterConfig, KernelPool, KernelRuntime, PoolConfig};
use cave_testing::contract::run;
use std::time::Duration;

/// Where the runtime finds the gateway; Enterprise Gateway refuses kernels for root, so the
/// start request names a user.
fn config(gateway: &support::Gateway) -> JupyterConfig {
    JupyterConfig::new(gateway.url.clone())
        .token(gateway.token.clone())
        .env("KERNEL_USERNAME", "cave")
}

async fn make() -> Option<KernelRuntime> {
    support::enterprise_gateway().map(|g| KernelRuntime::jupyter(config(g).spare(false)))
}

mod contract {
    use super::make;
    cave_testing::runtime_contract_tests!(optional make);
}

/// A host call, an interrupt, and a kernel killed behind the runtime's back (the next cell
/// says state was lost and runs in a fresh kernel with the registered resources bound again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_interrupts_and_a_killed_kernel() {
    let Some(rt) = make().await else { return };
    let double = Function::host(
        "double",
        Signature::new([Param::new("n").annotated("int")]).returns("int"),
        |args: Args| async move {
            let n: i64 = args.get("n")?;
            Ok(Value::Int((2 * n).into()))
        },
    );
    rt.register(
        Resources::new()
            .function(double)
            .variable(Variable::new("limit", Value::Int(7))),
    )
    .await
    .unwrap();
    assert_eq!(run(&rt, "double(21)").await.output, "42\n");
    cave_testing::contract::a_sleep_is_interrupted(&rt).await;
    let pid: i32 = run(&rt, "import os\nscratch = 1\nprint(os.getpid())")
        .await
        .output
        .trim()
        .parse()
        .expect("a pid");
    // SAFETY: a signal to the kernel process this test's gateway started.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let mut after = run(&rt, "print(limit)").await;
    if !after.state_lost {
        tokio::time::sleep(Duration::from_secs(1)).await;
        after = run(&rt, "print(limit)").await;
    }
    assert!(after.state_lost, "{after:?}");
    assert_eq!(run(&rt, "double(limit)").await.output, "14\n");
    assert_eq!(
        run(&rt, "scratch").await.error.expect("gone").python_type,
        "NameError"
    );
    rt.stop().await;
}

/// Kernels started ahead on the gateway: two sessions take two of them at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_kernels_started_ahead() {
    let Some(gateway) = support::enterprise_gateway() else {
        return;
    };
    let pool = KernelPool::jupyter(config(gateway), PoolConfig::new(2)).unwrap();
    pool.fill();
    pool.filled(2).await.unwrap();
    let (a, b) = (
        KernelRuntime::from_pool(&pool),
        KernelRuntime::from_pool(&pool),
    );
    let pid = |rt: KernelRuntime| async move {
        let out = run(&rt, "import os\nprint(os.getpid())").await.output;
        rt.stop().await;
        out
    };
    let (first, second) = tokio::join!(pid(a), pid(b));
    assert_ne!(first, second);
    assert_eq!(pool.stats().taken, 2);
}

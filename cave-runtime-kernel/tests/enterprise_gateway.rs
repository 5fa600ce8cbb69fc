//! The kernel runtime through a real Jupyter Enterprise Gateway (PyPI's
//! `jupyter_enterprise_gateway`) on 127.0.0.1, in its local mode: a host call, an interrupt, a
//! kernel killed from outside, and a pool of kernels started ahead. (The contract through it
//! runs in `enterprise_gateway_contract.rs`.)

#![cfg(feature = "jupyter")]

#[path = "support/sessions.rs"]
mod sessions;
#[path = "support/gateway.rs"]
mod support;

use cave_core::{Resources, Runtime};
use cave_runtime_kernel::{JupyterConfig, KernelPool, KernelRuntime, PoolConfig};
use cave_testing::contract::run;

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

/// A host call, an interrupt, and a kernel killed behind the runtime's back (the next cell
/// says state was lost and runs in a fresh kernel with the registered resources bound again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_interrupts_and_a_killed_kernel() {
    let Some(rt) = make().await else { return };
    rt.register(Resources::new().function(sessions::double()))
        .await
        .unwrap();
    assert_eq!(run(&rt, "double(21)").await.output, "42\n");
    cave_testing::contract::a_sleep_is_interrupted(&rt).await;
    sessions::a_killed_kernel_is_replaced(&rt).await;
    assert_eq!(run(&rt, "double(limit)").await.output, "14\n");
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
    let (first, second) = tokio::join!(sessions::pid(&a), sessions::pid(&b));
    assert_ne!(first, second);
    assert_eq!(pool.stats().taken, 2);
    a.stop().await;
    b.stop().await;
}

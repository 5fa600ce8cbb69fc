//! `KernelPool` on the Jupyter transport: kernels started ahead on the test's Kernel Gateway.

#![cfg(feature = "jupyter")]

#[path = "support/on_gateway.rs"]
#[allow(dead_code)]
mod on_gateway;
#[path = "support/sessions.rs"]
mod sessions;
#[path = "support/gateway.rs"]
mod support;

use cave_core::{DiscardOutput, Resources, Runtime};
use cave_runtime_kernel::{KernelPool, KernelRuntime, PoolConfig};
use sessions::pid;

/// Two sessions take two kernels the pool started on the gateway; each calls the host; the
/// pool refills; a configuration that attaches to a given kernel cannot be pooled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernels_are_started_ahead_on_the_gateway() {
    let Some(gateway) = support::gateway() else {
        return;
    };
    let pool = KernelPool::jupyter(on_gateway::config(gateway), PoolConfig::new(2)).unwrap();
    pool.fill();
    pool.filled(2).await.unwrap();
    let first = KernelRuntime::from_pool(&pool);
    let second = KernelRuntime::from_pool(&pool);
    first
        .register(Resources::new().function(sessions::double()))
        .await
        .unwrap();
    assert_eq!(
        first
            .execute("double(21)", &DiscardOutput)
            .await
            .unwrap()
            .output,
        "42\n"
    );
    assert_ne!(pid(&first).await, pid(&second).await);
    assert_eq!(pool.stats().taken, 2);
    pool.filled(2).await.unwrap();
    first.stop().await;
    second.stop().await;

    let attached = KernelPool::jupyter(
        on_gateway::config(gateway).attach("a-given-kernel"),
        PoolConfig::new(1),
    );
    assert!(attached.is_err());
}

//! The runtime contract, on runtimes taken from a `KernelPool`.

use cave_runtime_kernel::{KernelConfig, KernelPool, KernelRuntime, PoolConfig};

async fn make() -> KernelRuntime {
    let pool = KernelPool::new(KernelConfig::default(), PoolConfig::new(1))
        .expect("a Python interpreter is available");
    KernelRuntime::from_pool(&pool)
}

cave_testing::runtime_contract_tests!(make);

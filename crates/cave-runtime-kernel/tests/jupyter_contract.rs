//! The runtime contract, on the kernel runtime over a Jupyter Kernel Gateway.

#![cfg(feature = "jupyter")]

#[path = "support/gateway.rs"]
mod support;

/// Where the runtime finds the test's gateway.
fn config(gateway: &support::Gateway) -> cave_runtime_kernel::JupyterConfig {
    cave_runtime_kernel::JupyterConfig::new(gateway.url.clone()).token(gateway.token.clone())
}

/// A kernel runtime that starts its kernels at the test's gateway.
fn runtime(gateway: &support::Gateway) -> cave_runtime_kernel::KernelRuntime {
    cave_runtime_kernel::KernelRuntime::with_config(
        cave_runtime_kernel::KernelConfig::new()
            .spare(false)
            .jupyter(config(gateway)),
    )
    .expect("a runtime")
}

use cave_runtime_kernel::KernelRuntime;

async fn make() -> Option<KernelRuntime> {
    support::gateway().map(runtime)
}

cave_core::runtime_contract_tests!(optional make);

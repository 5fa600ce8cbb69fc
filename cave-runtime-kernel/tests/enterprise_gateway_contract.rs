//! The runtime contract, on the kernel runtime through a Jupyter Enterprise Gateway (its local
//! mode) on 127.0.0.1.

#![cfg(feature = "jupyter")]

#[path = "support/gateway.rs"]
mod support;

use cave_runtime_kernel::{JupyterConfig, KernelRuntime};

async fn make() -> Option<KernelRuntime> {
    support::enterprise_gateway().map(|g| {
        // Enterprise Gateway refuses kernels for root: the start request names a user.
        let config = JupyterConfig::new(g.url.clone())
            .token(g.token.clone())
            .env("KERNEL_USERNAME", "cave")
            .spare(false);
        KernelRuntime::jupyter(config)
    })
}

cave_testing::runtime_contract_tests!(optional make);

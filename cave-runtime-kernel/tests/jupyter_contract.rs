//! The runtime contract, on the kernel runtime over a Jupyter Kernel Gateway.

#![cfg(feature = "jupyter")]

#[path = "support/on_gateway.rs"]
mod on_gateway;
#[path = "support/gateway.rs"]
mod support;

use cave_runtime_kernel::KernelRuntime;

async fn make() -> Option<KernelRuntime> {
    support::gateway().map(on_gateway::runtime)
}

cave_testing::runtime_contract_tests!(optional make);

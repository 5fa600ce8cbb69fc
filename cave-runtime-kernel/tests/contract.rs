//! The runtime contract, on the kernel runtime.

use cave_runtime_kernel::KernelRuntime;

async fn make() -> KernelRuntime {
    KernelRuntime::new().expect("a Python interpreter is available")
}

cave_testing::runtime_contract_tests!(make);

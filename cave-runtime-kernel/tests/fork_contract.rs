//! The runtime contract, on a branch of a kernel runtime (whose parent is gone: a branch
//! lives on its own).

use cave_runtime_kernel::KernelRuntime;

async fn make() -> KernelRuntime {
    let parent = KernelRuntime::new().expect("a Python interpreter is available");
    parent.fork().await.expect("forks")
}

cave_testing::runtime_contract_tests!(make);

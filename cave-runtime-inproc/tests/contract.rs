//! The runtime contract, on the in-process runtime.

use cave_runtime_inproc::InProcRuntime;

async fn make() -> InProcRuntime {
    InProcRuntime::new().expect("the interpreter starts")
}

cave_testing::runtime_contract_tests!(make);

//! An agent whose code runs in a Jupyter kernel behind a real Kernel Gateway: a host object
//! (a Rust struct, with the macros) operated from the kernel, the state read back in the host.

#[path = "../../cave-runtime-kernel/tests/support/gateway.rs"]
mod gateway;

use cave_agent::AgentExt;
use cave_agent::RuntimeExt;
use cave_agent::kernel::JupyterConfig;
use cave_agent::testing::{Reply, ScriptedModel};
use cave_agent::{Agent, KernelRuntime, ObjectBinding, Resources, Runtime, Shared, StopReason};

/// A counter the model's code increments from the kernel.
#[cave_agent::object]
#[derive(Debug, Default)]
struct Tally {
    /// The count so far.
    #[cave(get)]
    count: i64,
}

#[cave_agent::object]
impl Tally {
    /// Adds `n` and returns the new count.
    pub fn add(&mut self, n: i64) -> i64 {
        self.count += n;
        self.count
    }
}

/// A kernel runtime on the test gateway.
fn on_gateway(gateway: &gateway::Gateway) -> KernelRuntime {
    KernelRuntime::jupyter(
        JupyterConfig::new(gateway.url.clone())
            .token(gateway.token.clone())
            .spare(false),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_runs_in_a_kernel_behind_a_gateway() {
    let Some(gateway) = gateway::gateway() else {
        return;
    };
    let runtime = on_gateway(gateway);
    let tally = Shared::new(Tally::default());
    runtime
        .register(Resources::new().object(ObjectBinding::new("tally", tally.clone())))
        .await
        .expect("registers");
    let model = ScriptedModel::new([
        Reply::text("```python\nfor n in range(1, 5):\n    tally.add(n)\nprint(tally.count)\n```"),
        Reply::text("The tally is 10."),
    ]);
    let mut agent = Agent::builder(model, runtime.clone())
        .build()
        .expect("builds");
    let response = agent.run("Add 1 to 4.").await;
    assert_eq!(response.stop_reason, StopReason::Completed);
    assert_eq!(tally.read().await.count, 10);
    let same = runtime
        .retrieve_object::<Shared<Tally>>("tally")
        .await
        .expect("the host's object");
    assert!(std::sync::Arc::ptr_eq(&same, &tally));
    runtime.stop().await;
}

/// The time limits stop a printing cell in a kernel behind a gateway too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_printing_loop_is_stopped_behind_a_gateway() {
    let Some(gateway) = gateway::gateway() else {
        return;
    };
    let runtime = on_gateway(gateway);
    cave_agent::testing::contract::time_limits_stop_a_printing_loop(runtime).await;
}

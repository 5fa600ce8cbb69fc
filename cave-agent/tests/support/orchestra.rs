//! The orchestrated run the span tests trace: an in-process orchestrator with host function
//! `tick`, and a sub-agent `helper` on the sandboxed kernel runtime with host function `tock`
//! (its model scripted to call it once).

use cave_agent::AgentExt;
use cave_agent::testing::{Reply, ScriptedModel};
use cave_agent::{
    Agent, Args, Function, InProcRuntime, KernelRuntime, Param, Resources, Runtime, Signature,
    SubAgent, Value,
};

/// A model reply that is one Python block.
pub fn code(text: &str) -> Reply {
    Reply::text(format!("```python\n{text}\n```"))
}

/// A host function `name(n: int) -> int` returning `n + 1`.
pub fn counter(name: &'static str) -> Function {
    Function::host(
        name,
        Signature::new([Param::new("n").annotated("int")]).returns("int"),
        |args: Args| async move {
            let n: i64 = args.get("n")?;
            Ok(Value::Int((n + 1).into()))
        },
    )
}

/// The sub-agent: a kernel runtime with `tock`, a model that prints `tock(41)` then answers.
pub async fn helper() -> std::sync::Arc<SubAgent> {
    let runtime = KernelRuntime::new().expect("python");
    runtime
        .register(Resources::new().function(counter("tock")))
        .await
        .unwrap();
    SubAgent::new(
        "helper",
        "Counts in a sandbox.",
        Agent::builder(
            ScriptedModel::new([code("print(tock(41))"), Reply::text("42 it is.")]),
            runtime,
        )
        .build()
        .unwrap(),
    )
}

/// The orchestrator's runtime: in-process, with `tick` and `more`.
pub async fn orchestrator_runtime(more: Resources) -> InProcRuntime {
    let runtime = InProcRuntime::new().expect("python");
    runtime
        .register(more.function(counter("tick")))
        .await
        .unwrap();
    runtime
}

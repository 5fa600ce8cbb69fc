//! The spans of a run through real runtimes: host calls (in-process and from a sandboxed
//! kernel) are `execute_tool NAME` spans under the cell that made them, and a sub-agent's run is
//! an `invoke_agent` span under the host call that started it. One test in its own binary: the
//! subscriber is the process's global one (cells and host calls run on other threads).

#[path = "support/orchestra.rs"]
mod orchestra;

use cave_agent::AgentExt;
use cave_agent::testing::ScriptedModel;
use cave_agent::testing::spans::{CapturedSpan, SpanCapture};
use cave_agent::{Agent, Resources, StopReason};
use orchestra::{code, helper, orchestrator_runtime};

fn tool<'a>(spans: &'a [CapturedSpan], name: &str) -> &'a CapturedSpan {
    spans
        .iter()
        .find(|s| s.fields.get("gen_ai.tool.name").map(String::as_str) == Some(name))
        .unwrap_or_else(|| panic!("no span for {name}: {spans:#?}"))
}

fn parent<'a>(spans: &'a [CapturedSpan], span: &CapturedSpan) -> &'a CapturedSpan {
    let id = span
        .parent
        .unwrap_or_else(|| panic!("{span:?} has no parent"));
    spans.iter().find(|s| s.id == id).expect("the parent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_calls_and_sub_agents_nest_under_their_cells() {
    let capture = SpanCapture::new();
    tracing::subscriber::set_global_default(capture.clone()).expect("the only subscriber");

    let helper = helper().await;
    let runtime = orchestrator_runtime(Resources::new()).await;
    let mut orchestrator = Agent::builder(
        ScriptedModel::new([
            code("print(tick(1))\nprint(helper.run('Count from 41.'))"),
            cave_agent::testing::Reply::text("Done."),
        ]),
        runtime,
    )
    .sub_agent(helper)
    .build()
    .unwrap();
    let response = orchestrator.run("Count.").await;
    assert_eq!(response.stop_reason, StopReason::Completed);

    let spans = capture.spans();
    // The orchestrator's cell, and its two host calls under it.
    let tick = tool(&spans, "tick");
    let cell = parent(&spans, tick);
    assert_eq!(cell.fields["gen_ai.tool.name"], "python");
    assert_eq!(tick.fields["gen_ai.tool.type"], "function");
    assert_eq!(tick.fields["otel.name"], "execute_tool tick");
    let run_call = tool(&spans, "helper.run");
    assert_eq!(run_call.parent, Some(cell.id));
    // The sub-agent's run under that call, its cell in the kernel, and the kernel's host call.
    let sub_run: Vec<&CapturedSpan> = spans
        .iter()
        .filter(|s| s.name == "invoke_agent" && s.parent == Some(run_call.id))
        .collect();
    assert_eq!(sub_run.len(), 1, "{spans:#?}");
    assert_eq!(sub_run[0].fields["cave.stop_reason"], "completed");
    let tock = tool(&spans, "tock");
    let sub_cell = parent(&spans, tock);
    assert_eq!(sub_cell.fields["gen_ai.tool.name"], "python");
    let sub_step = parent(&spans, sub_cell);
    assert_eq!(sub_step.name, "step");
    assert_eq!(sub_step.parent, Some(sub_run[0].id));
    // One root: the orchestrator's run.
    let roots: Vec<_> = spans.iter().filter(|s| s.parent.is_none()).collect();
    assert_eq!(roots.len(), 1, "{roots:#?}");
    assert_eq!(roots[0].name, "invoke_agent");
}

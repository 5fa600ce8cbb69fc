//! A run's trace as an OpenTelemetry backend receives it: exported over OTLP/HTTP by
//! `cave_agent::otel` to Arize Phoenix and read back. Two steps, host calls from the
//! in-process runtime and from a sandboxed kernel, a sub-agent; token counts on the model
//! spans; a secret in no attribute; code and output only when opted in. One test in its own
//! binary: the exporter is the process's global subscriber.

#[path = "support/orchestra.rs"]
mod orchestra;

use cave_agent::AgentExt;
use cave_agent::otel::{OtlpConfig, install};
use cave_agent::testing::phoenix::{Phoenix, attribute, named, parent, recorded_cells};
use cave_agent::testing::{Reply, ScriptedModel};
use cave_agent::{Agent, Resources, StopReason, Variable};
use orchestra::{code, helper, orchestrator_runtime};
use serde_json::Value as Json;

const SECRET: &str = "tok-trace-9f8e7d6c5b";

/// The orchestrator, with a secret, and its sub-agent; `content`: code and output recorded.
async fn orchestrator(model: ScriptedModel, content: bool) -> Agent {
    let helper = helper().await;
    let runtime =
        orchestrator_runtime(Resources::new().variable(Variable::secret("token", SECRET))).await;
    let mut builder = Agent::builder(model, runtime);
    builder.sub_agent(helper).trace_content(content);
    builder.build().unwrap()
}

fn tool<'a>(spans: &'a [Json], name: &str) -> Vec<&'a Json> {
    spans
        .iter()
        .filter(|s| attribute(s, "gen_ai.tool.name") == name)
        .collect()
}

#[test]
fn a_run_with_host_calls_and_a_sub_agent_reaches_phoenix_whole() {
    let Some(server) = Phoenix::start() else {
        return;
    };
    let guard = install(OtlpConfig::new(server.otlp_url()).service_name("cave-agent-test"))
        .expect("installs");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // Without content: the default.
        let mut plain = orchestrator(
            ScriptedModel::new([
                code("print(tick(1))\nprint(token)\nprint(helper.run('Count from 41.'))"),
                Reply::text("Done."),
            ]),
            false,
        )
        .await;
        assert_eq!(plain.run("Count.").await.stop_reason, StopReason::Completed);
        // With content: the code and the output, the secret redacted from the output.
        let mut recorded = orchestrator(
            ScriptedModel::new([code("print('shown', token)"), Reply::text("Done.")]),
            true,
        )
        .await;
        assert_eq!(
            recorded.run("Show.").await.stop_reason,
            StopReason::Completed
        );
    });
    guard.finish().expect("every span sent");

    // Each run: itself, 2 steps, 2 chats, a cell (6); the first also its 2 host calls, and the
    // sub-agent's run with the same 6 and its host call (9).
    let spans = server.spans(21);
    assert_eq!(spans.len(), 21, "{spans:#?}");
    let roots: Vec<&Json> = spans.iter().filter(|s| s["parent_id"].is_null()).collect();
    assert_eq!(roots.len(), 2, "{spans:#?}");
    assert!(roots.iter().all(|r| r["name"] == "invoke_agent cave-agent"));

    // The first run's tree.
    let tick = tool(&spans, "tick");
    assert_eq!(tick.len(), 1, "{spans:#?}");
    assert_eq!(tick[0]["name"], "execute_tool tick");
    let cell = parent(&spans, tick[0]).expect("the cell of tick");
    assert_eq!(cell["name"], "execute_tool python");
    let step = parent(&spans, cell).expect("the step of the cell");
    assert_eq!(step["name"], "step");
    let run = parent(&spans, step).expect("the run");
    assert!(run["parent_id"].is_null());
    assert_eq!(attribute(run, "gen_ai.operation.name"), "invoke_agent");
    assert_eq!(attribute(run, "cave.stop_reason"), "completed");
    let steps: Vec<&Json> = named(&spans, "step")
        .into_iter()
        .filter(|s| s["parent_id"] == run["context"]["span_id"])
        .collect();
    assert_eq!(steps.len(), 2, "two steps in the first run");
    // Each step's model call, with its tokens.
    for step in &steps {
        let chats: Vec<&Json> = spans
            .iter()
            .filter(|s| s["parent_id"] == step["context"]["span_id"])
            .filter(|s| attribute(s, "gen_ai.operation.name") == "chat")
            .collect();
        assert_eq!(chats.len(), 1, "{step}");
        assert!(attribute(chats[0], "gen_ai.usage.input_tokens").as_i64() > Some(0));
        assert!(attribute(chats[0], "gen_ai.usage.output_tokens").as_i64() > Some(0));
    }
    let total_in = attribute(run, "gen_ai.usage.input_tokens").as_i64();
    assert!(total_in > Some(0), "{run}");
    // The sub-agent: its run under the host call that started it, its kernel host call under
    // its own cell.
    let call = tool(&spans, "helper.run");
    assert_eq!(call.len(), 1);
    assert_eq!(call[0]["parent_id"], cell["context"]["span_id"]);
    let sub_run: Vec<&Json> = named(&spans, "invoke_agent cave-agent")
        .into_iter()
        .filter(|s| s["parent_id"] == call[0]["context"]["span_id"])
        .collect();
    assert_eq!(sub_run.len(), 1, "{spans:#?}");
    let tock = tool(&spans, "tock");
    assert_eq!(tock.len(), 1);
    let sub_cell = parent(&spans, tock[0]).expect("the sub-agent's cell");
    let sub_step = parent(&spans, sub_cell).expect("the sub-agent's step");
    assert_eq!(sub_step["parent_id"], sub_run[0]["context"]["span_id"]);
    // Nothing of the code or output without the opt-in.
    for span in [cell, sub_cell] {
        assert!(
            attribute(span, "gen_ai.tool.call.arguments").is_null(),
            "{span}"
        );
        assert!(
            attribute(span, "gen_ai.tool.call.result").is_null(),
            "{span}"
        );
    }

    // The second run recorded its cell's code and output, the secret redacted.
    let recorded = recorded_cells(&spans);
    assert_eq!(recorded.len(), 1, "{spans:#?}");
    assert_eq!(recorded[0].0, "print('shown', token)");
    assert!(recorded[0].1.starts_with("shown "), "{recorded:?}");

    let text = serde_json::to_string(&spans).unwrap();
    assert!(!text.contains(SECRET), "the secret reached the traces");
}

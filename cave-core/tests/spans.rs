//! The run's spans, as a `tracing` subscriber sees them: the tree (run, steps, model calls,
//! cells), the GenAI attributes and token counts, and no code, output or secret unless the host
//! opts in (then redacted).

use cave_core::{AgentBuilder, Resources, Runtime, Usage, Variable};
use cave_testing::spans::{CapturedSpan as Recorded, SpanCapture};
use cave_testing::{EchoRuntime, Reply, ScriptedModel};
use std::collections::BTreeMap;
use std::sync::Arc;

const SECRET: &str = "tok-9f8e7d6c5b4a";

/// Runs a two-step run (a cell, then an answer) under a capturing subscriber.
fn spans_of(content: bool) -> BTreeMap<u64, Recorded> {
    spans_with(content, Reply::text("Done.").usage(Usage::new(200, 5)))
}

/// The same, the second answer being `second`.
fn spans_with(content: bool, second: Reply) -> BTreeMap<u64, Recorded> {
    let capture = SpanCapture::new();
    let _default = tracing::subscriber::set_default(capture.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let runtime = Arc::new(EchoRuntime::new());
        runtime
            .register(Resources::new().variable(Variable::secret("token", SECRET)))
            .await
            .unwrap();
        let model = Arc::new(ScriptedModel::new([
            Reply::text(format!("```python\nx = '{SECRET}'\nprint(x)\n```")),
            second,
        ]));
        let mut builder = AgentBuilder::new(model, runtime);
        builder.trace_content(content);
        let mut agent = builder.build().unwrap();
        agent.run("Count.").await;
    });
    capture.spans().into_iter().map(|s| (s.id, s)).collect()
}

fn children(spans: &BTreeMap<u64, Recorded>, parent: u64) -> Vec<(u64, &Recorded)> {
    spans
        .iter()
        .filter(|(_, s)| s.parent == Some(parent))
        .map(|(id, s)| (*id, s))
        .collect()
}

#[test]
fn a_run_is_a_tree_of_genai_spans() {
    let spans = spans_of(false);
    let roots: Vec<_> = spans.iter().filter(|(_, s)| s.parent.is_none()).collect();
    assert_eq!(roots.len(), 1, "{spans:#?}");
    let (&run_id, run) = roots[0];
    assert_eq!(run.name, "invoke_agent");
    assert_eq!(run.fields["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(run.fields["otel.name"], "invoke_agent cave-agent");
    assert_eq!(run.fields["cave.stop_reason"], "completed");
    // The run's tokens are its model calls'.
    let calls: Vec<&Recorded> = spans.values().filter(|s| s.name == "chat").collect();
    let sum = |key: &str| -> u64 {
        calls
            .iter()
            .map(|c| c.fields[key].parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(
        run.fields["gen_ai.usage.input_tokens"],
        sum("gen_ai.usage.input_tokens").to_string()
    );
    assert_eq!(
        run.fields["gen_ai.usage.output_tokens"],
        sum("gen_ai.usage.output_tokens").to_string()
    );
    assert!(!run.fields.contains_key("error.type"));
    let steps = children(&spans, run_id);
    let names: Vec<_> = steps.iter().map(|(_, s)| s.name).collect();
    assert_eq!(names, ["step", "step"], "{spans:#?}");
    // Step 1: the model call, then the cell.
    let first: Vec<_> = children(&spans, steps[0].0);
    let names: Vec<_> = first.iter().map(|(_, s)| s.name).collect();
    assert_eq!(names, ["chat", "execute_tool"]);
    let chat = first[0].1;
    assert_eq!(chat.fields["gen_ai.operation.name"], "chat");
    assert!(chat.fields["otel.name"].starts_with("chat "), "{chat:?}");
    assert!(
        chat.fields["gen_ai.usage.input_tokens"]
            .parse::<u64>()
            .unwrap()
            > 0
    );
    let cell = first[1].1;
    assert_eq!(cell.fields["gen_ai.tool.name"], "python");
    assert_eq!(cell.fields["cave.cell.success"], "true");
    // Without the opt-in: neither code nor output.
    assert!(!cell.fields.contains_key("gen_ai.tool.call.arguments"));
    assert!(!cell.fields.contains_key("gen_ai.tool.call.result"));
    // Step 2: the model call alone.
    let second: Vec<_> = children(&spans, steps[1].0);
    assert_eq!(second.len(), 1);
    // As the provider reported them.
    assert_eq!(second[0].1.fields["gen_ai.usage.input_tokens"], "200");
    assert_eq!(second[0].1.fields["gen_ai.usage.output_tokens"], "5");
    assert_eq!(second[0].1.fields["cave.usage.estimated"], "false");
    for span in spans.values() {
        for value in span.fields.values() {
            assert!(!value.contains(SECRET), "{span:?}");
        }
    }
}

#[test]
fn code_and_output_are_recorded_only_when_asked_and_redacted() {
    let spans = spans_of(true);
    let cell = spans
        .values()
        .find(|s| s.name == "execute_tool")
        .expect("a cell span");
    let code = &cell.fields["gen_ai.tool.call.arguments"];
    assert!(code.contains("print(x)"), "{code}");
    assert!(code.contains("[redacted: token]"), "{code}");
    let output = &cell.fields["gen_ai.tool.call.result"];
    assert!(output.contains("print(x)"), "{output}");
    for span in spans.values() {
        for value in span.fields.values() {
            assert!(!value.contains(SECRET), "{span:?}");
        }
    }
}

/// A run that ends in a model failure says so on its span and on the model call's, with the
/// kind the `stopped` event names.
#[test]
fn a_failed_model_call_marks_its_span_and_the_run() {
    let refused = cave_core::ModelError::new(cave_core::ModelErrorKind::Auth, "401 Unauthorized");
    let spans = spans_with(false, Reply::fails(refused));
    let run = spans
        .values()
        .find(|s| s.name == "invoke_agent")
        .expect("the run");
    assert_eq!(run.fields["cave.stop_reason"], "model_error");
    assert_eq!(run.fields["error.type"], "model_error");
    assert_eq!(run.fields["otel.status_code"], "ERROR");
    let failed: Vec<_> = spans
        .values()
        .filter(|s| s.name == "chat" && s.fields.contains_key("error.type"))
        .collect();
    assert_eq!(failed.len(), 1, "{spans:#?}");
    assert_eq!(failed[0].fields["error.type"], "auth");
    assert_eq!(failed[0].fields["otel.status_code"], "ERROR");
}

/// A model call's cached and reasoning tokens and its cost are on its span after the GenAI
/// conventions; the session's ledger on the run's.
#[test]
fn token_kinds_cost_and_the_ledger_are_on_the_spans() {
    let spans = spans_with(
        false,
        Reply::text("Done.")
            .usage(Usage::new(200, 5).with_cached(128).with_reasoning(3))
            .cost(0.0042),
    );
    let chat = spans
        .values()
        .rfind(|s| s.name == "chat")
        .expect("a model call");
    assert_eq!(chat.fields["gen_ai.usage.cache_read.input_tokens"], "128");
    assert_eq!(chat.fields["gen_ai.usage.reasoning.output_tokens"], "3");
    assert_eq!(chat.fields["cave.cost.usd"], "0.0042");
    assert_eq!(chat.fields["cave.cost.source"], "reported");
    let run = spans
        .values()
        .find(|s| s.name == "invoke_agent")
        .expect("the run");
    assert_eq!(run.fields["cave.ledger.cells"], "1");
    assert_eq!(run.fields["cave.ledger.cost_usd"], "0.0042");
    assert_eq!(run.fields["gen_ai.usage.cache_read.input_tokens"], "128");
}

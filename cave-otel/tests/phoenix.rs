//! Spans exported to a real OTLP receiver, Arize Phoenix (PyPI), and read back over its REST
//! API: the run's tree, its GenAI attributes and token counts, and nothing of the secret.
//! Needs Phoenix (`cave_testing::phoenix`); says so and skips without one, outside CI.

use cave_core::{AgentBuilder, Resources, Runtime, Variable};
use cave_testing::phoenix::{Phoenix, named};
use cave_testing::{EchoRuntime, Reply, ScriptedModel};
use serde_json::Value as Json;
use std::sync::Arc;

const SECRET: &str = "tok-otel-5a4b3c2d1e";

#[test]
fn a_run_reaches_phoenix_as_a_genai_trace() {
    let Some(server) = Phoenix::start() else {
        return;
    };
    let guard = cave_otel::install(
        cave_otel::OtlpConfig::new(server.otlp_url()).service_name("cave-otel-test"),
    )
    .expect("installs");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let runtime = Arc::new(EchoRuntime::new());
        runtime
            .register(Resources::new().variable(Variable::secret("token", SECRET)))
            .await
            .unwrap();
        let model = Arc::new(ScriptedModel::new([
            Reply::text(format!("```python\nprint('{SECRET}')\n```")),
            Reply::text("Done."),
        ]));
        let mut agent = AgentBuilder::new(model, runtime).build().unwrap();
        assert_eq!(agent.run("Go.").await.content, "Done.");
    });
    guard.finish().expect("every span sent");
    let found = server.spans(6);
    let run = named(&found, "invoke_agent cave-agent");
    assert_eq!(run.len(), 1, "{found:#?}");
    let run = run[0];
    assert!(run["parent_id"].is_null());
    assert_eq!(run["attributes"]["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(run["attributes"]["cave.stop_reason"], "completed");
    let run_id = run["context"]["span_id"].clone();
    let steps = named(&found, "step");
    assert_eq!(steps.len(), 2, "{found:#?}");
    assert!(steps.iter().all(|s| s["parent_id"] == run_id));
    let chats: Vec<&Json> = found
        .iter()
        .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with("chat ")))
        .collect();
    assert_eq!(chats.len(), 2);
    for chat in &chats {
        assert!(
            chat["attributes"]["gen_ai.usage.input_tokens"]
                .as_i64()
                .unwrap_or(0)
                > 0,
            "{chat}"
        );
    }
    let cells = named(&found, "execute_tool python");
    assert_eq!(cells.len(), 1);
    assert!(
        cells[0]["attributes"]
            .get("gen_ai.tool.call.arguments")
            .is_none()
    );
    let text = serde_json::to_string(&found).unwrap();
    assert!(!text.contains(SECRET), "the secret reached the traces");
}

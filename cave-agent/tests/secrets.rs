//! Secrets through the agent, on both runtimes: code can use them; their value (and its
//! usual printed forms) never reaches the events or what the model reads next.

use cave_agent::AgentExt;
use cave_agent::RuntimeExt;
use cave_agent::testing::{Reply, ScriptedModel};
use cave_agent::{Agent, Event, InProcRuntime, KernelRuntime, Resources, Runtime, Variable};
use futures_util::StreamExt;
use std::sync::Arc;

const VALUE: &str = "tok-9f8e7d6c5b4a";

async fn check(runtime: Arc<dyn Runtime>) {
    runtime
        .register(Resources::new().variable(Variable::secret("API_TOKEN", VALUE)))
        .await
        .expect("registers");
    assert!(!runtime.describe().variables.contains(VALUE));
    let model = Arc::new(ScriptedModel::new([
        Reply::text(
            "```python\nimport base64, json\nprint(API_TOKEN)\nprint(repr(API_TOKEN), json.dumps({'t': API_TOKEN}))\nprint(base64.b64encode(API_TOKEN.encode()).decode(), API_TOKEN.encode().hex())\nprint(len(API_TOKEN), API_TOKEN.startswith('tok-'))\nraise ValueError('bad token ' + API_TOKEN)\n```",
        ),
        Reply::text("Done."),
    ]));
    let mut agent = Agent::builder(model.clone(), runtime.clone())
        .build()
        .expect("builds");
    let events: Vec<Event> = agent.stream("Use the token.").collect().await;
    let wire = serde_json::to_string(&events).expect("JSON");
    assert!(!wire.contains(VALUE), "{wire}");
    assert!(
        !wire.contains("dG9rLTlmOGU3ZDZjNWI0YQ"),
        "base64 form: {wire}"
    );
    assert!(!wire.contains(&hex(VALUE)), "hex form: {wire}");
    let result = events
        .iter()
        .find_map(|e| match e {
            Event::ExecutionResult { output, .. } => Some(output.clone()),
            _ => None,
        })
        .expect("ran");
    assert!(
        result.starts_with("[redacted: API_TOKEN]\n'[redacted: API_TOKEN]' {\"t\": \"[redacted: API_TOKEN]\"}\n[redacted: API_TOKEN] [redacted: API_TOKEN]\n16 True\n"),
        "{result}"
    );
    assert!(
        result.contains("ValueError: bad token [redacted: API_TOKEN]"),
        "{result}"
    );
    let live: String = events
        .iter()
        .filter_map(|e| match e {
            Event::ExecutionOutput { chunk } => Some(chunk.as_str()),
            _ => None,
        })
        .collect();
    assert!(!live.contains(VALUE), "{live}");
    // What the model reads next has no secret either.
    let next: String = model.requests()[1]
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect();
    assert!(
        !next.contains(VALUE) && next.contains("[redacted: API_TOKEN]"),
        "{next}"
    );
    // The host still reads the real value.
    assert_eq!(
        runtime.retrieve("API_TOKEN").await.expect("bound"),
        cave_agent::Value::Str(VALUE.into())
    );
}

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_redacted_in_process() {
    check(Arc::new(InProcRuntime::new().expect("python"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_redacted_in_the_kernel() {
    let runtime = KernelRuntime::new().expect("python");
    check(Arc::new(runtime.clone())).await;
    runtime.stop().await;
}

#[tokio::test]
async fn a_secret_too_short_or_not_a_string_is_refused() {
    let runtime = InProcRuntime::new().expect("python");
    let short = runtime
        .register(Resources::new().variable(Variable::secret("PIN", "123")))
        .await
        .unwrap_err();
    assert!(
        short.to_string().contains("at least 4 characters"),
        "{short}"
    );
    let mut not_text = Variable::secret("NUM", "1234");
    not_text.value = cave_agent::Value::Int(1234);
    let wrong = runtime
        .register(Resources::new().variable(not_text))
        .await
        .unwrap_err();
    assert!(
        wrong.to_string().contains("a secret is a string"),
        "{wrong}"
    );
}

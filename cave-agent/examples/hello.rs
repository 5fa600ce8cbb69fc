//! The README's hello world: the model reverses a secret with a host function, in a real
//! embedded Python.
//!
//! Offline, with the model's answers scripted: `cargo run -p cave-agent --example hello
//! --features testing`. With `LLM_MODEL_ID` (and `LLM_BASE_URL`, `LLM_API_KEY`) set, a real
//! model does it.

#[path = "common/mod.rs"]
mod common;

use cave_agent::AgentExt;
use cave_agent::testing::Reply;
use cave_agent::{
    Agent, Event, InProcRuntime, Model, Resources, Runtime, RuntimeExt, Value, Variable,
};
use futures_util::StreamExt;
use std::sync::Arc;

/// Reverse a string.
#[cave_agent::function]
fn reverse(text: String) -> String {
    text.chars().rev().collect()
}

/// What a model would write.
fn script() -> Vec<Reply> {
    vec![
        Reply::text(
            "I'll use the host function.\n```python\nanswer = reverse(secret)\nprint(answer)\n```",
        ),
        Reply::text("The secret reads: Hello world!"),
    ]
}

/// Runs the request; returns what the host reads back from `answer` (`None` if the model left
/// it unset, as a small model may).
async fn run(model: Arc<dyn Model>) -> Result<Option<String>, Box<dyn std::error::Error>> {
    let runtime = InProcRuntime::new()?;
    runtime
        .register(
            Resources::new()
                .function(reverse::function())
                .variable(
                    Variable::new("secret", "!dlrow olleH".into()).with_description("the secret"),
                )
                .variable(
                    Variable::new("answer", Value::None)
                        .with_type_name("str")
                        .with_description("put the result here"),
                ),
        )
        .await?;
    let mut agent = Agent::builder(model, runtime.clone()).build()?;
    let mut events = agent.stream("Reverse the secret and store it in `answer`.");
    while let Some(event) = events.next().await {
        // The CLI's wire format: one JSON object per event.
        println!("{}", serde_json::to_string(&event)?);
        if let Event::Stopped { stop_reason, .. } = event {
            eprintln!("stopped: {stop_reason}");
        }
    }
    drop(events);
    Ok(runtime.retrieve_as("answer").await?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    match run(common::model(script)).await? {
        Some(answer) => eprintln!("the host reads back: {answer}"),
        None => eprintln!("the model did not set `answer`: the host reads back None"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_host_reads_the_reversed_secret() {
        let model = Arc::new(cave_agent::testing::ScriptedModel::new(script()));
        assert_eq!(run(model).await.unwrap().as_deref(), Some("Hello world!"));
    }
}

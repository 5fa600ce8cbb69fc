//! The README's hello world: the model reverses a secret with a host function, in a real
//! embedded Python, with a scripted model so it runs offline.
//!
//! Run with `cargo run -p cave-agent --example hello --features testing`.

use cave_agent::testing::{Reply, ScriptedModel};
use cave_agent::{Agent, Event, InProcRuntime, Resources, Runtime, RuntimeExt, Value, Variable};
use futures_util::StreamExt;

/// Reverse a string.
#[cave_agent::function]
fn reverse(text: String) -> String {
    text.chars().rev().collect()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
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

    // What a model would write; a real one comes from cave-models.
    let model = ScriptedModel::new([
        Reply::text(
            "I'll use the host function.\n```python\nanswer = reverse(secret)\nprint(answer)\n```",
        ),
        Reply::text("The secret reads: Hello world!"),
    ]);
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
    let answer: String = runtime.retrieve_as("answer").await?;
    eprintln!("the host reads back: {answer}");
    assert_eq!(answer, "Hello world!");
    Ok(())
}

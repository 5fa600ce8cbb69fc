//! The README's hello world, offline: a scripted model and a runtime without Python.
//!
//! Run with `cargo run -p cave-agent --example hello --features testing`.

use cave_agent::testing::{EchoRuntime, Reply, ScriptedModel};
use cave_agent::{Agent, Event};
use futures_util::StreamExt;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), cave_agent::BuildError> {
    let model = ScriptedModel::new([
        Reply::text("Let me reverse it.\n```python\nprint(secret[::-1])\n```"),
        Reply::text("Done: the secret, reversed, is printed above."),
    ]);
    let mut agent = Agent::builder(model, EchoRuntime::new()).build()?;
    let mut events = agent.stream("Reverse the secret.");
    while let Some(event) = events.next().await {
        // The CLI's wire format: one JSON object per event.
        println!("{}", serde_json::to_string(&event).unwrap_or_default());
        if let Event::Stopped { stop_reason, .. } = event {
            eprintln!("stopped: {stop_reason}");
        }
    }
    Ok(())
}

//! The owned form of a run, as a UI or a web handler uses it: the agent moves into its own
//! task, another task reads the events (here it prints them as JSON Lines, as a server would
//! send them to a browser), a "stop" button cancels the run, and the agent comes back for the
//! next request with its history and its runtime's state.
//!
//! Run with `cargo run -p cave-agent --example owned_run --features testing`.

use cave_agent::AgentExt;
use cave_agent::testing::{Reply, ScriptedModel};
use cave_agent::{Agent, Event, InProcRuntime, StopReason};
use futures_util::StreamExt;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = InProcRuntime::new()?;
    let model = ScriptedModel::new([
        Reply::text("```python\ntotal = sum(range(10))\nprint(total)\n```"),
        Reply::text("The total is 45."),
        // The second request runs code that never ends on its own.
        Reply::text("```python\nimport time\nwhile True:\n    time.sleep(0.01)\n```"),
    ]);
    let mut builder = Agent::builder(model, runtime.clone());
    // Needed for a hard stop of running code; the cancel below interrupts it too.
    builder.max_exec_timeout(Duration::from_secs(30));
    let agent = builder.build()?;

    // Request 1: read every event in another task, as a streaming HTTP response would.
    let run = agent.spawn("Add the numbers below 10.");
    let agent = tokio::spawn(async move {
        let mut run = run;
        while let Some(event) = run.next().await {
            println!(
                "{}",
                serde_json::to_string(&event).expect("events serialize")
            );
        }
        run.into_agent().await
    })
    .await?
    .ok_or("the run's task failed")?;

    // Request 2: the user presses "stop" while the code runs.
    let mut run = agent.spawn("Now wait forever.");
    let stop_button = run.cancel_token();
    let mut reason = None;
    while let Some(event) = run.next().await {
        if matches!(event, Event::Code { .. }) {
            let stop = stop_button.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                stop.cancel();
            });
        }
        if let Event::Stopped { stop_reason, .. } = &event {
            reason = Some(*stop_reason);
        }
    }
    assert_eq!(reason, Some(StopReason::Cancelled));
    let agent = run.into_agent().await.ok_or("the run's task failed")?;
    println!(
        "stopped; the agent is back with {} messages, and `total` is still {}",
        agent.history().len(),
        agent.runtime().get("total").await?
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_offline() {
        // Its own assertions: the first run's answer, the cancelled second run.
        super::main().unwrap();
    }
}

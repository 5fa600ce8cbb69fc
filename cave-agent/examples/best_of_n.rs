//! Best of N: an agent loads data once, then three branches of it (each a fork of the live
//! session: the namespace, the conversation, the host's objects) try three approaches to one
//! task; the host checks each branch's result and keeps the first that passes, dropping the
//! others (their processes end with them).
//!
//! Offline: `cargo run -p cave-agent --example best_of_n --features testing`. With
//! `LLM_MODEL_ID` set, a real model does it.

#[path = "common/mod.rs"]
mod common;

use cave_agent::testing::Reply;
use cave_agent::{Agent, AgentExt, KernelRuntime, Model, Resources, Runtime, RuntimeExt};
use cave_agent::{Value, Variable};
use std::sync::Arc;

/// Readings around 10, with one sensor glitch.
const RAW: &str = "9.8,10.1,10.0,9.9,10.2,1000.0,10.0,9.7";

/// The approaches the branches are asked to take.
const APPROACHES: [&str; 3] = [
    "the arithmetic mean",
    "the median",
    "the mean of the values within 20% of the median",
];

fn script() -> Vec<Reply> {
    vec![
        common::code("readings = [float(x) for x in raw.split(',')]\nprint(len(readings))"),
        Reply::text("Loaded 8 readings into `readings`."),
        // Branch 1: the mean, pulled up by the glitch.
        common::code("estimate = sum(readings) / len(readings)\nprint(estimate)"),
        Reply::text("The mean is 133.7."),
        // Branch 2: the median.
        common::code("import statistics\nestimate = statistics.median(readings)\nprint(estimate)"),
        Reply::text("The median is 10.0."),
        // Branch 3: a trimmed mean.
        common::code(
            "import statistics\nm = statistics.median(readings)\nkept = [r for r in readings if abs(r - m) <= 0.2 * m]\nestimate = sum(kept) / len(kept)\nprint(round(estimate, 3))",
        ),
        Reply::text("The trimmed mean is 9.957."),
    ]
}

/// The host's check: a typical reading is within half a unit of 10.
fn passes(estimate: f64) -> bool {
    (estimate - 10.0).abs() < 0.5
}

/// Loads, branches, checks; returns the approach kept and its estimate.
async fn run(model: Arc<dyn Model>) -> Result<(String, f64), Box<dyn std::error::Error>> {
    let runtime = KernelRuntime::new()?
        .registered(
            Resources::new()
                .variable(Variable::new("raw", RAW.into()).with_description("sensor readings"))
                .variable(
                    Variable::new("estimate", Value::None)
                        .with_type_name("float")
                        .with_description("the typical reading, once estimated"),
                ),
        )
        .await?;
    let mut agent = Agent::builder(model, runtime).build()?;
    common::show(
        agent.stream("Parse `raw` into a list of floats, `readings`."),
        false,
    )
    .await;
    let mut kept: Option<(String, f64, Agent)> = None;
    for approach in APPROACHES {
        // Each branch starts from the same loaded state and the same conversation.
        let mut branch = agent.fork().await?;
        common::show(
            branch.stream(format!(
                "Estimate the typical reading as {approach}; put it in `estimate`."
            )),
            false,
        )
        .await;
        let estimate: f64 = branch.runtime().retrieve_as("estimate").await?;
        println!(
            "{approach}: {estimate} ({})",
            if passes(estimate) { "passes" } else { "fails" }
        );
        if kept.is_none() && passes(estimate) {
            kept = Some((approach.to_owned(), estimate, branch));
        }
        // A branch not kept is dropped here: its process ends.
    }
    let (approach, estimate, _agent) = kept.ok_or("no branch passed the check")?;
    // The session the branches came from is untouched.
    let untouched: Value = agent.runtime().get("estimate").await?;
    assert_eq!(untouched, Value::None);
    Ok((approach, estimate))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    common::finish(run(common::model(script)).await, |(approach, estimate)| {
        println!("\nThe host keeps {approach}: {estimate}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_host_keeps_the_first_branch_that_passes() {
        let model = Arc::new(cave_agent::testing::ScriptedModel::new(script()));
        let (approach, estimate) = run(model).await.unwrap();
        assert_eq!(approach, "the median");
        assert_eq!(estimate, 10.0);
    }
}

//! Multi-turn state: the first request loads data into the runtime, the second works on what
//! the first left there; the conversation and the namespace both carry over.
//!
//! Offline: `cargo run -p cave-agent --example multi_turn --features testing`. With
//! `LLM_MODEL_ID` set, a real model does it.

#[path = "common/mod.rs"]
mod common;

use cave_agent::Agent;
use cave_agent::AgentExt;
use cave_agent::testing::Reply;
use cave_agent::{InProcRuntime, Model, Resources, Runtime, RuntimeExt, Value, Variable};
use std::sync::Arc;

fn script() -> Vec<Reply> {
    vec![
        common::code(
            "sales = {}\nfor line in raw.splitlines():\n    region, amount = line.split(',')\n    sales[region] = sales.get(region, 0) + int(amount)\nprint(sales)",
        ),
        Reply::text("Loaded the sales per region into `sales`."),
        common::code("best = max(sales, key=sales.get)\nprint(best, sales[best])"),
        Reply::text("The north sold most: 1500."),
    ]
}

/// Runs both requests; returns the region the host reads back.
async fn run(model: Arc<dyn Model>) -> Result<String, Box<dyn std::error::Error>> {
    let runtime = InProcRuntime::new()?;
    runtime
        .register(
            Resources::new()
                .variable(
                    Variable::new("raw", "north,1200\nsouth,800\nnorth,300\neast,950".into())
                        .with_description("sales lines: region,amount"),
                )
                .variable(
                    Variable::new("best", Value::None)
                        .with_type_name("str")
                        .with_description("the region that sold most"),
                ),
        )
        .await?;
    let mut agent = Agent::builder(model, runtime.clone()).build()?;
    common::show(
        agent.stream("Parse `raw` into a dict `sales` of totals per region."),
        true,
    )
    .await;
    // The second request says nothing about how `sales` was made: it is in the runtime.
    common::show(
        agent.stream("Which region sold most? Put it in `best`."),
        true,
    )
    .await;
    Ok(runtime.retrieve_as("best").await?)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    common::finish(run(common::model(script)).await, |best| {
        println!("\nThe host reads best = {best:?}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_second_request_uses_what_the_first_left() {
        let model = Arc::new(cave_agent::testing::ScriptedModel::new(script()));
        assert_eq!(run(model).await.unwrap(), "north");
    }
}

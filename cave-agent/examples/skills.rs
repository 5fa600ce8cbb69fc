//! Skills: `examples/skills` holds an Agent Skill (SKILL.md, a reference file, and an
//! `injection.py` written for CaveAgent). The prompt lists it by name and description; the
//! model activates it when it needs it, then uses what it brought into the runtime.
//!
//! Offline: `cargo run -p cave-agent --example skills --features testing`. With
//! `LLM_MODEL_ID` set, a real model does it.

#[path = "common/mod.rs"]
mod common;

use cave_agent::Agent;
use cave_agent::AgentExt;
use cave_agent::skills::discover;
use cave_agent::testing::Reply;
use cave_agent::{Event, InProcRuntime, Model, SkillSet};
use std::sync::Arc;

fn script() -> Vec<Reply> {
    vec![
        common::code("print(activate_skill('order-desk'))"),
        common::code("cents = total(pending)\nprint(f'{cents / 100:.2f} EUR')"),
        Reply::text("The pending orders are worth 989.70 EUR."),
    ]
}

/// Runs the request; returns the outputs of the model's cells.
async fn run(model: Arc<dyn Model>) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let found = discover(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/skills"));
    for warning in &found.warnings {
        eprintln!("warning: {warning}");
    }
    let skills = SkillSet::from_discovery(found)?;
    let runtime = InProcRuntime::new()?;
    let mut builder = Agent::builder(model, runtime.clone());
    skills.install(&runtime, &mut builder).await?;
    let mut agent = builder.build()?;
    let events = common::show(
        agent.stream("What are the pending orders worth, in euros?"),
        true,
    )
    .await;
    Ok(events
        .into_iter()
        .filter_map(|e| match e {
            Event::ExecutionResult { output, .. } => Some(output),
            _ => None,
        })
        .collect())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    run(common::model(script)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_skill_is_activated_then_used() {
        let model = Arc::new(cave_agent::testing::ScriptedModel::new(script()));
        let outputs = run(model).await.unwrap();
        assert_eq!(outputs.len(), 2);
        assert!(outputs[0].contains("Use `total(orders)`"), "{}", outputs[0]);
        assert_eq!(outputs[1], "989.70 EUR\n");
    }
}

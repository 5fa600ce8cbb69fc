//! Large output: a cell prints far more than the model should read. The agent keeps the whole
//! output in a runtime variable (`_output_1`), gives the model a preview and the variable's
//! name, and the model's next cell searches the variable instead of the context.
//!
//! Offline: `cargo run -p cave-agent --example large_output --features testing`. With
//! `LLM_MODEL_ID` set, a real model does it.

#[path = "common/mod.rs"]
mod common;

use cave_agent::Agent;
use cave_agent::AgentExt;
use cave_agent::testing::Reply;
use cave_agent::{Event, InProcRuntime, Model, Resources, Runtime, Value, Variable};
use std::sync::Arc;

fn script() -> Vec<Reply> {
    vec![
        common::code("print(access_log)"),
        // The model read the preview and the variable's name in the execution result.
        common::code(
            "errors = [l for l in _output_1.splitlines() if ' 500 ' in l]\nprint(len(errors))\nprint(errors[0])",
        ),
        Reply::text("There are 12 server errors; the first is on /checkout."),
    ]
}

fn access_log() -> String {
    (0..3000)
        .map(|i| {
            let status = if i % 250 == 7 { 500 } else { 200 };
            let path = if status == 500 {
                "/checkout"
            } else {
                "/catalogue"
            };
            format!(
                "10.0.0.{} - GET {path} {status} {}ms\n",
                i % 250,
                20 + i % 90
            )
        })
        .collect()
}

/// Runs the request; returns the persisted variable's name and the host's read of it.
async fn run(model: Arc<dyn Model>) -> Result<(String, usize), Box<dyn std::error::Error>> {
    let runtime = InProcRuntime::new()?;
    runtime
        .register(
            Resources::new().variable(
                Variable::new("access_log", Value::Str(access_log()))
                    .with_description("today's web server log"),
            ),
        )
        .await?;
    let mut builder = Agent::builder(model, runtime.clone());
    // Small, to show it: the default keeps 5000 characters inline.
    builder.max_exec_output(2000);
    let mut agent = builder.build()?;
    let events = common::show(
        agent.stream("How many server errors (status 500) are in the log?"),
        false,
    )
    .await;
    let name = events
        .iter()
        .find_map(|e| match e {
            Event::ExecutionResult {
                persisted_variable: Some(name),
                ..
            } => Some(name.clone()),
            _ => None,
        })
        .ok_or("no cell printed enough for its output to be kept as `_output_N`")?;
    let Value::Str(kept) = runtime.get(&name).await? else {
        return Err("the persisted output is not text".into());
    };
    Ok((name, kept.len()))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    common::finish(run(common::model(script)).await, |(name, chars)| {
        println!("\nThe whole output ({chars} characters) is in the runtime as `{name}`.")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_whole_output_stays_in_the_runtime() {
        let model = Arc::new(cave_agent::testing::ScriptedModel::new(script()));
        let (name, chars) = run(model).await.unwrap();
        assert_eq!(name, "_output_1");
        // All of it, and the newline `print` adds.
        assert_eq!(chars, access_log().len() + 1);
    }
}

//! Multi-agent: an orchestrator drives a cleaner and an analyzer, each an agent with its own
//! runtime and history, from its code (`cleaner.run(...)`); their events show nested; the
//! host reads the analyzer's result from the analyzer's runtime.
//!
//! Offline: `cargo run -p cave-agent --example multi_agent --features testing`. With
//! `LLM_MODEL_ID` set, three real agents do it.

#[path = "common/mod.rs"]
mod common;

use cave_agent::AgentExt;
use cave_agent::testing::Reply;
use cave_agent::{
    Agent, InProcRuntime, KernelRuntime, Model, Resources, Runtime, SubAgent, Value, Variable,
};
use std::sync::Arc;

struct Scripts {
    orchestrator: Vec<Reply>,
    cleaner: Vec<Reply>,
    analyzer: Vec<Reply>,
}

fn scripts() -> Scripts {
    Scripts {
        orchestrator: vec![
            common::code(
                "cleaner.set('readings', readings)\nprint(cleaner.run('Drop the missing and negative readings from `readings` into `clean`.'))\nanalyzer.set('values', cleaner.get('clean'))\nprint(analyzer.run('Compute the mean, minimum and maximum of `values` into a dict `summary`.'))",
            ),
            Reply::text("The cleaner kept 5 readings; their mean is 21.0 °C (19.5 to 22.5)."),
        ],
        cleaner: vec![
            common::code(
                "clean = [r for r in readings if r is not None and r >= 0]\nprint(len(clean), 'kept')",
            ),
            Reply::text("Kept 5 of 8 readings."),
        ],
        analyzer: vec![
            common::code(
                "summary = {'mean': sum(values) / len(values), 'min': min(values), 'max': max(values)}\nprint(summary)",
            ),
            Reply::text("Mean 21.0, from 19.5 to 22.5."),
        ],
    }
}

/// Runs the request; returns the analyzer's `summary`, read by the host.
async fn run(
    orchestrator_model: Arc<dyn Model>,
    cleaner_model: Arc<dyn Model>,
    analyzer_model: Arc<dyn Model>,
) -> Result<Value, Box<dyn std::error::Error>> {
    let cleaner = SubAgent::new(
        "cleaner",
        "Cleans data: give it data with set(), ask with run(), read results with get().",
        Agent::builder(cleaner_model, InProcRuntime::new()?).build()?,
    );
    // The analyzer's code runs in a child process.
    let analyzer = SubAgent::new(
        "analyzer",
        "Computes statistics: give it data with set(), ask with run(), read results with get().",
        Agent::builder(analyzer_model, KernelRuntime::new()?).build()?,
    );
    let runtime = InProcRuntime::new()?;
    let readings = [20.5, -1.0, 19.5, 22.5, f64::NAN, 21.0, 21.5]
        .into_iter()
        .map(|r| {
            if r.is_nan() {
                Value::None
            } else {
                Value::Float(r)
            }
        })
        .chain([Value::None])
        .collect();
    runtime
        .register(
            Resources::new().variable(
                Variable::new("readings", Value::List(readings))
                    .with_description("temperature readings, °C, with gaps"),
            ),
        )
        .await?;
    let mut orchestrator: Agent = {
        let mut builder = Agent::builder(orchestrator_model, runtime);
        builder.sub_agent(cleaner).sub_agent(analyzer.clone());
        builder.build()?
    };
    common::show(
        orchestrator.stream("Have the readings cleaned, then summarized. Tell me the result."),
        false,
    )
    .await;
    Ok(analyzer.runtime().get("summary").await?)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let scripts = scripts();
    let summary = run(
        common::model(|| scripts.orchestrator),
        common::model(|| scripts.cleaner),
        common::model(|| scripts.analyzer),
    )
    .await;
    common::finish(summary, |summary| {
        println!("\nThe host reads the analyzer's summary: {summary}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cave_agent::testing::ScriptedModel;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_host_reads_the_analyzers_result() {
        let s = scripts();
        let summary = run(
            Arc::new(ScriptedModel::new(s.orchestrator)),
            Arc::new(ScriptedModel::new(s.cleaner)),
            Arc::new(ScriptedModel::new(s.analyzer)),
        )
        .await
        .unwrap();
        assert_eq!(
            summary,
            Value::Dict(vec![
                (Value::Str("mean".into()), Value::Float(21.0)),
                (Value::Str("min".into()), Value::Float(19.5)),
                (Value::Str("max".into()), Value::Float(22.5)),
            ])
        );
    }
}

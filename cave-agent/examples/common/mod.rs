//! What the examples share: the model (a real one when `LLM_MODEL_ID` is set, the example's
//! script otherwise) and a compact printout of a run's events.

#![allow(dead_code)]

use cave_agent::testing::{Reply, ScriptedModel};
use cave_agent::{Event, Model, OpenAiModel};
use futures_util::{Stream, StreamExt};
use std::sync::Arc;

/// The model at `LLM_BASE_URL` when `LLM_MODEL_ID` is set (with `LLM_API_KEY`), else one that
/// replays `script` (what a model would answer), so that the example runs offline.
pub fn model(script: impl FnOnce() -> Vec<Reply>) -> Arc<dyn Model> {
    if live() {
        match OpenAiModel::from_env() {
            Ok(model) => return Arc::new(model),
            Err(e) => eprintln!(
                "LLM_MODEL_ID is set but the model cannot be built ({e}); replaying the script"
            ),
        }
    }
    Arc::new(ScriptedModel::new(script()))
}

/// Ends an example: `done` with what the host read, or, when that failed, the reason said
/// plainly (a real model may not do what the example asks; the scripted one does), and exit
/// status 1.
pub fn finish<T>(
    result: Result<T, Box<dyn std::error::Error>>,
    done: impl FnOnce(T),
) -> std::process::ExitCode {
    match result {
        Ok(value) => {
            done(value);
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("\nThe example ended without its result: {error}");
            if live() {
                eprintln!(
                    "(the model at LLM_BASE_URL did not do what the example asks; without LLM_MODEL_ID, the example replays a script that does)"
                );
            }
            std::process::ExitCode::FAILURE
        }
    }
}

/// Returns true if and only if the examples talk to a real model.
pub fn live() -> bool {
    std::env::var("LLM_MODEL_ID").is_ok_and(|m| !m.trim().is_empty())
}

/// A fenced Python block, as a model writes one.
pub fn code(text: &str) -> Reply {
    Reply::text(format!("```python\n{text}\n```"))
}

/// Prints each event on a line or two (`verbose`: the output of each execution too) and
/// returns them.
pub async fn show(events: impl Stream<Item = Event>, verbose: bool) -> Vec<Event> {
    let mut seen = Vec::new();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        describe(&event, "", verbose);
        seen.push(event);
    }
    seen
}

fn describe(event: &Event, indent: &str, verbose: bool) {
    match event {
        Event::UserPrompt { content, .. } => println!("{indent}> {content}"),
        Event::Code { code, .. } => {
            println!("{indent}[code]");
            for line in code.lines() {
                println!("{indent}    {line}");
            }
        }
        Event::ExecutionResult {
            output, success, ..
        } if verbose || !success => {
            println!("{indent}[{}]", if *success { "output" } else { "error" });
            for line in output.lines().take(20) {
                println!("{indent}    {line}");
            }
        }
        Event::Display {
            mime_types, files, ..
        } => {
            let shown: Vec<String> = mime_types
                .iter()
                .filter(|m| *m != "text/plain")
                .map(|m| match files.get(m) {
                    Some(path) => format!("{m} in {path}"),
                    None => m.clone(),
                })
                .collect();
            if !shown.is_empty() {
                println!("{indent}[shown] {}", shown.join(", "));
            }
        }
        Event::SubAgent { agent, event } => {
            describe(event, &format!("{indent}  {agent} | "), verbose)
        }
        Event::FinalResponse { content } => println!("{indent}[answer] {content}"),
        Event::Stopped {
            stop_reason, steps, ..
        } => println!("{indent}[stopped: {stop_reason} after {steps} steps]"),
        _ => {}
    }
}

/// The final answer of a run's events.
pub fn answer(events: &[Event]) -> Option<&str> {
    events.iter().rev().find_map(|e| match e {
        Event::FinalResponse { content } => Some(content.as_str()),
        _ => None,
    })
}

//! Streaming events to a UI: the run's events arrive as they happen (prose token by token,
//! code before it runs, output while it runs); a UI keeps a view of the run and redraws it.
//! Here the "UI" is a status line per event and a final view; a web server would send each
//! event as one JSON line (`serde_json::to_string(&event)`: the format `cave --json` prints).
//!
//! Offline: `cargo run -p cave-agent --example streaming --features testing`. With
//! `LLM_MODEL_ID` set, a real model streams.

#[path = "common/mod.rs"]
mod common;

use cave_agent::Agent;
use cave_agent::AgentExt;
use cave_agent::testing::Reply;
use cave_agent::{Event, InProcRuntime, Model};
use futures_util::StreamExt;
use std::sync::Arc;

/// What a UI shows of a run.
#[derive(Debug, Default, PartialEq)]
struct View {
    prose: String,
    cells: Vec<String>,
    live_output: String,
    status: String,
    events: usize,
}

impl View {
    fn update(&mut self, event: &Event) {
        self.events += 1;
        match event {
            Event::Text { content } => self.prose.push_str(content),
            Event::Code { code, .. } => {
                self.cells.push(code.clone());
                self.status = "running".into();
            }
            Event::ExecutionOutput { chunk } => self.live_output.push_str(chunk),
            Event::ExecutionResult { success, .. } => {
                self.status = if *success { "ran" } else { "failed" }.into();
            }
            Event::Stopped { stop_reason, .. } => self.status = format!("done: {stop_reason}"),
            _ => {}
        }
    }
}

fn script() -> Vec<Reply> {
    vec![
        Reply::text("Counting down, one line every few milliseconds.\n```python\nimport time\nfor n in range(3, 0, -1):\n    print(n, flush=True)\n    time.sleep(0.02)\nprint('liftoff')\n```")
            .chunk_size(4),
        Reply::text("The countdown ran: 3, 2, 1, liftoff.").chunk_size(4),
    ]
}

async fn run(model: Arc<dyn Model>) -> Result<View, Box<dyn std::error::Error>> {
    let runtime = InProcRuntime::new()?;
    let mut agent = Agent::builder(model, runtime).build()?;
    let mut view = View::default();
    let mut events = agent.stream("Count down from 3 in Python, printing as you go.");
    while let Some(event) = events.next().await {
        view.update(&event);
        // One line per event, as a UI's status bar would change.
        let kind = serde_json::to_value(&event)?["type"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        println!("{:>3} {kind:<18} status={}", view.events, view.status);
    }
    Ok(view)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let view = run(common::model(script)).await?;
    println!(
        "\nprose: {}\ncells: {:?}\noutput: {:?}\n{}",
        view.prose, view.cells, view.live_output, view.status
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_view_follows_the_run() {
        let model = Arc::new(cave_agent::testing::ScriptedModel::new(script()));
        let view = run(model).await.unwrap();
        assert_eq!(view.live_output, "3\n2\n1\nliftoff\n");
        assert_eq!(view.cells.len(), 1);
        assert_eq!(view.status, "done: completed");
        assert!(
            view.prose.starts_with("Counting down") && view.prose.ends_with("liftoff."),
            "{}",
            view.prose
        );
        // Prose streamed in small pieces: many events, not one per answer.
        assert!(view.events > 20, "{}", view.events);
    }
}

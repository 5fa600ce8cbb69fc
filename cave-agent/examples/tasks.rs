//! Function calling: the model manages a task list through three Rust functions, written as
//! plain functions with `#[cave_agent::function]`; the host reads the list afterwards.
//!
//! Offline: `cargo run -p cave-agent --example tasks --features testing`. With `LLM_MODEL_ID`
//! (and `LLM_BASE_URL`, `LLM_API_KEY`) set, a real model does it.

#[path = "common/mod.rs"]
mod common;

use cave_agent::Agent;
use cave_agent::AgentExt;
use cave_agent::testing::Reply;
use cave_agent::{InProcRuntime, Model, PythonType, Resources, Runtime};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};

/// A task on the list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, PythonType)]
struct Task {
    id: usize,
    title: String,
    /// The day it is due, when there is one (`2026-12-24`).
    due: Option<String>,
    done: bool,
}

/// The list, kept by the host.
static TASKS: Mutex<Vec<Task>> = Mutex::new(Vec::new());

/// Adds a task; returns its id.
///
/// # Arguments
/// * `title` - what to do
/// * `due` - the day it is due, as `YYYY-MM-DD`
#[cave_agent::function]
fn add_task(title: String, due: Option<String>) -> usize {
    let mut tasks = TASKS.lock().expect("the task list");
    let id = tasks.len() + 1;
    tasks.push(Task {
        id,
        title,
        due,
        done: false,
    });
    id
}

/// The tasks not done yet.
#[cave_agent::function]
fn open_tasks() -> Vec<Task> {
    let tasks = TASKS.lock().expect("the task list");
    tasks.iter().filter(|t| !t.done).cloned().collect()
}

/// Marks a task done.
#[cave_agent::function]
fn complete(id: usize) -> Result<Task, String> {
    let mut tasks = TASKS.lock().expect("the task list");
    let task = tasks
        .iter_mut()
        .find(|t| t.id == id)
        .ok_or_else(|| format!("there is no task {id}"))?;
    task.done = true;
    Ok(task.clone())
}

fn script() -> Vec<Reply> {
    vec![
        common::code(
            "add_task('Buy a tree', due='2026-12-20')\nadd_task('Wrap presents')\nfirst = open_tasks()[0]\nprint(complete(first['id']))\nprint([t['title'] for t in open_tasks()])",
        ),
        Reply::text(
            "I added both tasks and marked \"Buy a tree\" done; \"Wrap presents\" is open.",
        ),
    ]
}

/// Runs the request; returns the host's list afterwards.
async fn run(model: Arc<dyn Model>) -> Result<Vec<Task>, Box<dyn std::error::Error>> {
    TASKS.lock().expect("the task list").clear();
    let runtime = InProcRuntime::new()?;
    runtime
        .register(
            Resources::new()
                .function(add_task::function())
                .function(open_tasks::function())
                .function(complete::function()),
        )
        .await?;
    let mut agent = Agent::builder(model, runtime).build()?;
    common::show(
        agent.stream(
            "Add 'Buy a tree' due 2026-12-20 and 'Wrap presents' to my list, then mark the first open task done.",
        ),
        true,
    )
    .await;
    Ok(TASKS.lock().expect("the task list").clone())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tasks = run(common::model(script)).await?;
    println!("\nThe host's list:");
    for task in tasks {
        println!("  {task:?}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_model_fills_the_hosts_list() {
        let model = Arc::new(cave_agent::testing::ScriptedModel::new(script()));
        let tasks = run(model).await.unwrap();
        assert_eq!(
            tasks,
            vec![
                Task {
                    id: 1,
                    title: "Buy a tree".into(),
                    due: Some("2026-12-20".into()),
                    done: true
                },
                Task {
                    id: 2,
                    title: "Wrap presents".into(),
                    due: None,
                    done: false
                },
            ]
        );
    }
}

//! Sub-agents: an agent given to another agent's runtime as an object the model's code drives.

use super::Agent;
use crate::lock;
use crate::{
    Args, Event, HostError, HostObject, Method, ObjectBinding, Param, Resources, Runtime,
    RuntimeError, Signature, StopReason, Value, Variable,
};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// An agent the orchestrating agent's code can call: `NAME.run(prompt)` runs it and returns
/// its final answer; `NAME.set(name, value)` and `NAME.get(name)` reach its runtime's
/// variables.
///
/// Give it to the orchestrator with [`AgentBuilder::sub_agent`](crate::AgentBuilder::sub_agent):
/// the orchestrator registers it with its runtime at its first run (its description goes in
/// the prompt), shows its events nested (`Event::SubAgent`) while the orchestrator's code
/// runs, and cancels its run when the orchestrator's execution ends or is cancelled. A
/// sub-agent has its own history and budgets; nothing of the orchestrator's conversation
/// reaches it but the prompts its code passes. Give it its own runtime: the in-process runtime
/// cannot run a cell from inside its own host call (the sub-agent then stops with that error),
/// and a shared kernel runtime would share its namespace.
pub struct SubAgent {
    name: String,
    description: String,
    agent: tokio::sync::Mutex<Agent>,
    runtime: Arc<dyn Runtime>,
    link: Mutex<Option<Link>>,
}

/// Where a running sub-agent sends its events, and what cancels it.
#[derive(Clone)]
pub(crate) struct Link {
    pub(crate) events: mpsc::UnboundedSender<Event>,
    pub(crate) cancel: CancellationToken,
}

impl std::fmt::Debug for SubAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubAgent")
            .field("name", &self.name)
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

impl SubAgent {
    /// `agent` under `name` (a Python identifier in the orchestrator's runtime), described to
    /// the orchestrator's model by `description`.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        agent: Agent,
    ) -> Arc<SubAgent> {
        let runtime = agent.runtime().clone();
        Arc::new(SubAgent {
            name: name.into(),
            description: description.into(),
            agent: tokio::sync::Mutex::new(agent),
            runtime,
            link: Mutex::new(None),
        })
    }

    /// Its name in the orchestrator's runtime.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its own runtime (to read what its code left there).
    pub fn runtime(&self) -> &Arc<dyn Runtime> {
        &self.runtime
    }

    /// The agent itself (waits while it runs), e.g. to read its history.
    pub async fn agent(&self) -> tokio::sync::MutexGuard<'_, Agent> {
        self.agent.lock().await
    }

    /// The binding the orchestrator registers.
    pub(crate) fn binding(self: &Arc<Self>) -> Resources {
        Resources::new().object(
            ObjectBinding::new(self.name.clone(), self.clone())
                .with_description(self.description.clone()),
        )
    }

    pub(crate) fn set_link(&self, link: Option<Link>) {
        *lock(&self.link) = link;
    }

    fn link(&self) -> Option<Link> {
        lock(&self.link).clone()
    }

    async fn run(&self, prompt: String) -> Result<Value, HostError> {
        let link = self.link();
        let cancel = link
            .as_ref()
            .map_or_else(CancellationToken::new, |l| l.cancel.child_token());
        let mut agent = self.agent.lock().await;
        let mut stream = agent.stream_until(prompt, cancel);
        let mut last = None;
        while let Some(event) = futures_util::StreamExt::next(&mut stream).await {
            if let Some(link) = &link {
                // The orchestrator's run may be over: then nobody reads, and that is fine.
                let _ = link.events.send(Event::SubAgent {
                    agent: self.name.clone(),
                    event: Box::new(event.clone()),
                });
            }
            last = Some(event);
        }
        match last {
            Some(Event::Stopped {
                content,
                stop_reason: StopReason::Completed,
                ..
            }) => Ok(Value::Str(content)),
            Some(Event::Stopped {
                content,
                stop_reason,
                error,
                ..
            }) => {
                let why = error
                    .map(|e| format!(" ({})", e.message))
                    .unwrap_or_default();
                let said = if content.trim().is_empty() {
                    String::new()
                } else {
                    format!("; its last words: {content}")
                };
                Err(HostError::new(
                    "RuntimeError",
                    format!(
                        "sub-agent '{}' stopped without an answer: {stop_reason}{why}{said}",
                        self.name
                    ),
                ))
            }
            _ => Err(HostError::new(
                "RuntimeError",
                format!("sub-agent '{}' ended without a stop event", self.name),
            )),
        }
    }

    async fn set(&self, name: String, value: Value) -> Result<Value, HostError> {
        match self.runtime.update(&name, value.clone()).await {
            Ok(()) => Ok(Value::None),
            // Not one of its variables yet: it becomes one, described in its prompt.
            Err(RuntimeError::UnknownVariable { .. }) => self
                .runtime
                .register(Resources::new().variable(Variable::new(name, value)))
                .await
                .map(|()| Value::None)
                .map_err(|e| HostError::new("ValueError", e.to_string())),
            Err(e) => Err(HostError::new("ValueError", e.to_string())),
        }
    }

    async fn get(&self, name: String) -> Result<Value, HostError> {
        self.runtime
            .get(&name)
            .await
            .map_err(|e| HostError::new("KeyError", e.to_string()))
    }
}

#[async_trait::async_trait]
impl HostObject for SubAgent {
    fn type_name(&self) -> &str {
        "SubAgent"
    }
    fn doc(&self) -> Option<String> {
        Some(
            "Another agent, with its own runtime and history. `run(prompt)` gives it a task and returns its final answer (it raises RuntimeError if it stops without one); `set(name, value)` and `get(name)` reach the variables of its runtime."
                .to_owned(),
        )
    }
    fn methods(&self) -> Vec<Method> {
        vec![
            Method::new(
                "run",
                Signature::new([Param::new("prompt").annotated("str")]).returns("str"),
            )
            .with_doc("Runs the agent on a task; returns its final answer."),
            Method::new(
                "set",
                Signature::new([
                    Param::new("name").annotated("str"),
                    Param::new("value").annotated("Any"),
                ])
                .returns("None"),
            )
            .with_doc("Sets a variable in the agent's runtime."),
            Method::new(
                "get",
                Signature::new([Param::new("name").annotated("str")]).returns("Any"),
            )
            .with_doc("Reads a variable from the agent's runtime."),
        ]
    }
    async fn call(&self, method: &str, args: Args) -> Result<Value, HostError> {
        match method {
            "run" => self.run(args.get("prompt")?).await,
            "set" => {
                let value = args
                    .value("value")
                    .cloned()
                    .ok_or_else(|| HostError::new("TypeError", "missing argument 'value'"))?;
                self.set(args.get("name")?, value).await
            }
            "get" => self.get(args.get("name")?).await,
            other => Err(HostError::new(
                "AttributeError",
                format!("'SubAgent' object has no attribute '{other}'"),
            )),
        }
    }
}

/// The sub-agents linked to one execution: cancelled and unlinked when it ends, however it
/// ends (finished, timed out, or dropped with a cancelled run).
pub(crate) struct LinkScope {
    agents: Vec<Arc<SubAgent>>,
    cancel: CancellationToken,
}

impl LinkScope {
    /// Links `agents` to `events` for the execution about to start.
    pub(crate) fn new(agents: &[Arc<SubAgent>], events: mpsc::UnboundedSender<Event>) -> Self {
        let cancel = CancellationToken::new();
        for agent in agents {
            agent.set_link(Some(Link {
                events: events.clone(),
                cancel: cancel.clone(),
            }));
        }
        Self {
            agents: agents.to_vec(),
            cancel,
        }
    }
}

impl Drop for LinkScope {
    fn drop(&mut self) {
        self.cancel.cancel();
        for agent in &self.agents {
            agent.set_link(None);
        }
    }
}

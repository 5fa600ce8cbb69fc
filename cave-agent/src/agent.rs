//! What the facade adds to the core's [`Agent`]: the constructor with the good defaults, and
//! the owned form of a run.

use crate::{Agent, AgentBuilder, ContextCompactor, Model, RunHandle, Runtime, ScriptEstimator};

/// What the facade adds to [`Agent`]: `Agent::builder` with the facade's defaults, and
/// `agent.spawn(prompt)`, a run in a task of its own.
///
/// cave-core's [`AgentBuilder::new`] keeps every message and counts a token per four bytes;
/// the agents most programs want compact their history when it nears the context window
/// ([`ContextCompactor`], whose summaries the agent's own model writes, the model's declared
/// output cap kept free) and never under-count other scripts ([`ScriptEstimator`]). This trait
/// gives [`Agent`] the constructor that sets both; bring it into scope with the type:
///
/// ```
/// use cave_agent::{Agent, AgentExt, Model, Runtime};
///
/// fn agent(model: impl Model + 'static, runtime: impl Runtime + 'static) -> Agent {
///     Agent::builder(model, runtime).build().expect("the defaults hold together")
/// }
/// ```
///
/// Either setting can still be changed on the builder (`.compactor(NoCompaction)` keeps every
/// message, `.estimator(compact::estimator_for(id))` counts exactly for OpenAI models).
pub trait AgentExt {
    /// Starts building an agent for this model and runtime, compacting and estimating as the
    /// facade does. Keep a clone of the runtime (e.g. pass an `Arc`) to read objects after a
    /// run.
    fn builder(model: impl Model + 'static, runtime: impl Runtime + 'static) -> AgentBuilder;

    /// Moves the agent into a new tokio task that runs `prompt`: the owned form of a run, for
    /// UIs and web handlers, where the code that reads the events is not the code that owns
    /// the agent (see [`RunHandle`]). Must be called within a tokio runtime.
    fn spawn(self, prompt: impl Into<String>) -> RunHandle;
}

impl AgentExt for Agent {
    fn builder(model: impl Model + 'static, runtime: impl Runtime + 'static) -> AgentBuilder {
        let model: std::sync::Arc<dyn Model> = std::sync::Arc::new(model);
        let mut builder = AgentBuilder::new(model.clone(), runtime);
        builder
            .compactor(ContextCompactor::new(model))
            .estimator(ScriptEstimator);
        builder
    }

    fn spawn(self, prompt: impl Into<String>) -> RunHandle {
        RunHandle::spawn(self, prompt)
    }
}

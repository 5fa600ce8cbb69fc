//! One run: the error envelope and the step loop. Its phases are the submodules: a model
//! call (`turn`), running code (`execute`), compaction between steps (`compaction`), and
//! usage and limits (`usage`).

mod compaction;
mod execute;
pub(super) mod spans;
mod tools;
mod turn;
mod usage;

use turn::{Cut, Kept, Outcome, Turn};

use super::emit::Emitter;
use super::{Agent, INTERRUPT_GRACE, MAX_OUTPUT_RECOVERIES};
use crate::parser::is_py_whitespace;
use crate::prompt;
use crate::{
    ChatMessage, ChatRequest, ChatRole, Event, FenceParser, FinishReason, Interruption, Message,
    MessageKind, ModelError, ModelErrorKind, OutputSink, PersistedOutput, Resources, RuntimeError,
    Status, StopError, StopErrorKind, StopReason, ThinkSplitter, TokenAnchor, Usage,
};
use futures_util::{FutureExt, StreamExt};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Why a run ends early.
enum Failure {
    Model(ModelError),
    Runtime(RuntimeError),
}

/// The runs' driver: the envelope that guarantees a `Stopped` event and a valid history.
/// `span` is the run's (it runs inside it), which gets the run's outcome.
pub(super) async fn drive(
    agent: &mut Agent,
    prompt: String,
    cancel: CancellationToken,
    emit: Emitter,
    span: tracing::Span,
) {
    emit.emit(Event::UserPrompt {
        content: prompt.clone(),
        format_version: crate::EVENT_FORMAT_VERSION,
    })
    .await;
    let mut run = Run::new(agent, emit.clone());
    let outcome = {
        let body = AssertUnwindSafe(run.body(prompt)).catch_unwind();
        tokio::select! {
            biased;
            () = cancel.cancelled() => None,
            result = body => Some(result),
        }
    };
    let (reason, error) = match outcome {
        None => {
            let interruption = run.interrupt_execution();
            let placeholder = if interruption == Some(Interruption::StateLost) {
                prompt::EXECUTION_CANCELLED_STATE_LOST
            } else {
                prompt::EXECUTION_CANCELLED
            };
            repair_history(&mut run.agent.history, placeholder, true);
            tracing::info!("run cancelled");
            (StopReason::Cancelled, None)
        }
        Some(Ok(Ok(StopReason::BudgetExhausted))) => {
            (StopReason::BudgetExhausted, run.budget_error())
        }
        Some(Ok(Ok(reason))) => (reason, None),
        Some(Ok(Err(failure))) => {
            run.interrupt_execution();
            repair_history(&mut run.agent.history, prompt::EXECUTION_INCOMPLETE, false);
            match failure {
                Failure::Model(e) => {
                    tracing::warn!(error = %e, "model error, ending the run");
                    (StopReason::ModelError, Some(StopError::from(&e)))
                }
                Failure::Runtime(e) => {
                    tracing::warn!(error = %e, "runtime error, ending the run");
                    (StopReason::RuntimeError, Some(StopError::from(&e)))
                }
            }
        }
        Some(Err(panic)) => {
            run.interrupt_execution();
            repair_history(&mut run.agent.history, prompt::EXECUTION_INCOMPLETE, false);
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with a non-string payload".to_owned());
            tracing::error!(panic = %message, "internal error, ending the run");
            (
                StopReason::InternalError,
                Some(StopError::new(
                    StopErrorKind::Internal,
                    format!("internal error: {message}"),
                )),
            )
        }
    };
    run.armed = false;
    spans::finish_run(&span, run.usage, run.steps, reason, &run.agent.ledger);
    let stopped = Event::Stopped {
        content: std::mem::take(&mut run.final_content),
        stop_reason: reason,
        steps: run.steps,
        elapsed: run.started.elapsed().as_secs_f64(),
        usage: run.usage,
        error,
        ledger: Box::new(run.agent.ledger.clone()),
    };
    drop(run);
    emit.emit(stopped).await;
}

/// Closes a code message left without its result, then (if the user interrupted) says so.
fn repair_history(history: &mut Vec<Message>, placeholder: &str, interrupted: bool) {
    if matches!(history.last(), Some(Message::Code { .. })) {
        history.push(Message::execution_result(placeholder));
    }
    let already = matches!(history.last(), Some(Message::User { content }) if content == prompt::USER_INTERRUPTION);
    if interrupted && !already {
        history.push(Message::user(prompt::USER_INTERRUPTION));
    }
}

/// The state of one run.
struct Run<'a> {
    agent: &'a mut Agent,
    emit: Emitter,
    started: Instant,
    steps: u32,
    usage: Usage,
    final_content: String,
    /// Fragments of an answer cut off earlier, which the next call continues.
    pending_text: String,
    recoveries: u32,
    completed: bool,
    /// An execution is in flight.
    executing: bool,
    /// Dropped before its end (the consumer dropped the stream): repair the history.
    armed: bool,
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.interrupt_execution();
            repair_history(&mut self.agent.history, prompt::EXECUTION_INCOMPLETE, true);
        }
    }
}

impl<'a> Run<'a> {
    fn new(agent: &'a mut Agent, emit: Emitter) -> Self {
        Self {
            agent,
            emit,
            started: Instant::now(),
            steps: 0,
            usage: Usage::default(),
            final_content: String::new(),
            pending_text: String::new(),
            recoveries: 0,
            completed: false,
            executing: false,
            armed: true,
        }
    }

    /// Binds the sub-agents in the runtime, once (before the first prompt, which lists them).
    async fn register_sub_agents(&mut self) -> Result<(), Failure> {
        if self.agent.sub_agents_registered {
            return Ok(());
        }
        let mut batch = Resources::new();
        for sub in &self.agent.sub_agents {
            batch = batch.with(sub.binding());
        }
        self.agent
            .runtime
            .register(batch)
            .await
            .map_err(Failure::Runtime)?;
        self.agent.sub_agents_registered = true;
        Ok(())
    }

    fn interrupt_execution(&mut self) -> Option<Interruption> {
        if !std::mem::take(&mut self.executing) {
            return None;
        }
        let interruption = self.agent.runtime.interrupter().map(|i| i.interrupt());
        tracing::info!(?interruption, "interrupted the execution in flight");
        interruption
    }

    async fn body(&mut self, prompt: String) -> Result<StopReason, Failure> {
        self.register_sub_agents().await?;
        let isolation = self.agent.runtime.isolation();
        if !isolation.is_empty() && isolation != self.agent.isolation {
            let layers = isolation.iter().map(ToString::to_string).collect();
            self.agent.isolation = isolation;
            self.emit
                .emit(Event::Status(Status::Isolation { layers }))
                .await;
        }
        // Rendered before `search_tools` is bound: it is hidden, so the prompt is the same.
        let (system, searching) = self.agent.rendered_system_prompt();
        if searching && !self.agent.tool_search_registered {
            crate::agent::search::register(&self.agent.runtime)
                .await
                .map_err(Failure::Runtime)?;
            self.agent.tool_search_registered = true;
        }
        let history = &mut self.agent.history;
        match history.first_mut() {
            Some(Message::System { content }) => *content = system,
            _ => history.insert(0, Message::system(system)),
        }
        history.push(Message::user(prompt));

        for _ in 0..self.agent.config.max_steps {
            if self.time_exceeded() || self.budget_crossed() {
                break;
            }
            let step = spans::step(self.steps + 1);
            tracing::Instrument::instrument(self.step(), step).await?;
            if self.completed {
                break;
            }
        }
        Ok(if self.completed {
            StopReason::Completed
        } else if self.budget_crossed() {
            StopReason::BudgetExhausted
        } else if self.time_exceeded() {
            StopReason::Timeout
        } else {
            StopReason::MaxSteps
        })
    }

    async fn step(&mut self) -> Result<(), Failure> {
        self.maybe_compact().await;
        self.steps += 1;
        let mut turn = Turn::new(self.pending_text.clone());
        let called = Instant::now();
        let chat = spans::chat(&self.agent.model_info.id);
        let streamed = tracing::Instrument::instrument(
            self.stream_with_overflow_retry(&mut turn),
            chat.clone(),
        )
        .await;
        let before = self.usage;
        let sent = self.agent.history.len();
        turn.ledger_estimated_before = self.agent.ledger.tokens.estimated;
        let usage = self.settle_usage(&turn);
        let cost = match (turn.reported_cost, &self.agent.config.price) {
            (Some(usd), _) => Some((usd, "reported")),
            (None, Some(price)) => Some((price.cost(&usage), "computed")),
            (None, None) => None,
        };
        spans::finish_chat(&chat, usage, cost, streamed.as_ref().err());
        let mut step = StepCost {
            step: self.steps,
            usage,
            model_seconds: called.elapsed().as_secs_f64(),
        };
        let ledger = &mut self.agent.ledger;
        ledger.model_calls = ledger.model_calls.saturating_add(1);
        ledger.model_seconds += step.model_seconds;
        if let Err(error) = streamed {
            self.keep_partial(&turn);
            return Err(Failure::Model(error));
        }

        let kept = match turn.outcome(self.recoveries < MAX_OUTPUT_RECOVERIES) {
            Outcome::Resume(cut) => {
                self.resume(turn, cut).await;
                self.emit.emit(step.event(None)).await;
                return Ok(());
            }
            Outcome::Failed(error) => {
                self.keep_partial(&turn);
                self.pending_text.clear();
                return Err(Failure::Model(error));
            }
            Outcome::Kept(kept) => kept,
        };
        self.pending_text.clear();
        self.final_content = turn.full();
        let text = std::mem::take(&mut turn.text);
        let thinking = std::mem::take(&mut turn.thinking);
        match kept {
            Kept::Code {
                code,
                unclosed,
                tool,
            } => {
                // Code from a tool call is recorded as the block it stands for: the request
                // advertises no tools, and the next one stays valid for every provider.
                let text = match &tool {
                    Some(_) => {
                        let tag = &self.agent.config.python_block_identifier;
                        let gap = if text.trim().is_empty() { "" } else { "\n\n" };
                        format!("{}{gap}```{tag}\n{code}\n```", text.trim_end())
                    }
                    None => text,
                };
                // Recorded before it is told: a run cancelled while the event is handed over
                // (a reader that stops at the code) still has the code, and its result says
                // it was cancelled.
                let message = Message::code(text).with_reasoning(thinking);
                self.agent.history.push(message);
                self.emit
                    .emit(Event::Code {
                        code: code.clone(),
                        unclosed,
                        tool_call: tool.clone(),
                    })
                    .await;
                let started = Instant::now();
                let content = self.agent.config.trace_content;
                // The code is redacted only when it is to be recorded (most runs: never).
                let recorded = content.then(|| {
                    crate::SecretRedactor::new(crate::RuntimeExt::secrets(&*self.agent.runtime))
                        .redact(&code)
                });
                let cell = spans::cell(recorded.as_deref());
                let (event, result) =
                    tracing::Instrument::instrument(self.execute(&code), cell.clone()).await?;
                spans::finish_cell(&cell, &event, content);
                self.agent.history.push(result);
                self.emit.emit(event).await;
                self.settle_tail(&mut turn, before, &mut step.usage, sent)
                    .await;
                let ran = started.elapsed().as_secs_f64();
                self.emit.emit(step.event(Some(ran))).await;
                Ok(())
            }
            Kept::Answer => {
                self.agent
                    .history
                    .push(Message::assistant(text).with_reasoning(thinking));
                self.completed = true;
                self.emit
                    .emit(Event::FinalResponse {
                        content: self.final_content.clone(),
                    })
                    .await;
                self.emit.emit(step.event(None)).await;
                Ok(())
            }
            Kept::ToolCalls => {
                let names: Vec<String> = turn
                    .tool_calls
                    .calls()
                    .map(|call| tools::display_name(&call.name).to_owned())
                    .collect();
                tracing::info!(tools = ?names, "the answer called tools; telling the model there are none");
                let said = if text.trim().is_empty() {
                    tools::rendered(&turn.tool_calls)
                } else {
                    text
                };
                self.agent
                    .history
                    .push(Message::assistant(said).with_reasoning(thinking));
                let tag = &self.agent.config.python_block_identifier;
                self.agent
                    .history
                    .push(Message::user(prompt::tool_calls_unanswered(&names, tag)));
                self.emit
                    .emit(Event::Status(Status::ToolCallsAnswered { tools: names }))
                    .await;
                self.emit.emit(step.event(None)).await;
                Ok(())
            }
            Kept::Truncated(error) => {
                self.agent
                    .history
                    .push(Message::assistant(text).with_reasoning(thinking));
                Err(Failure::Model(error))
            }
        }
    }

    /// A run that ends in a model failure after text arrived answers with that text (what the
    /// user saw), not with nothing.
    fn keep_partial(&mut self, turn: &Turn) {
        let partial = turn.full();
        if !partial.trim().is_empty() {
            self.final_content = partial;
        }
    }

    /// Keeps the cut answer and asks the model to go on from where it stopped.
    async fn resume(&mut self, mut turn: Turn, cut: Cut) {
        self.recoveries += 1;
        self.pending_text = turn.full();
        let resume = match cut {
            Cut::Interrupted => prompt::STREAM_INTERRUPTED_PROMPT,
            Cut::Length => prompt::OUTPUT_RECOVERY_PROMPT,
            Cut::UnclosedThinking => prompt::UNCLOSED_THINKING_PROMPT,
        };
        // A reasoning model can spend its whole cap thinking: no empty assistant message.
        if !turn.text.is_empty() {
            let message = Message::assistant(std::mem::take(&mut turn.text))
                .with_reasoning(std::mem::take(&mut turn.thinking));
            self.agent.history.push(message);
        }
        self.agent.history.push(Message::user(resume));
        self.emit
            .emit(Event::Status(Status::OutputRecovery {
                recovery: self.recoveries,
                max_recoveries: MAX_OUTPUT_RECOVERIES,
            }))
            .await;
    }
}

/// What a step's model call cost, said in its `Step` event once the step ends.
struct StepCost {
    step: u32,
    usage: Usage,
    model_seconds: f64,
}

impl StepCost {
    fn event(&self, execution_seconds: Option<f64>) -> Event {
        Event::Step {
            step: self.step,
            usage: self.usage,
            model_seconds: self.model_seconds,
            execution_seconds,
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

//! One run: the turn cycle, recovery, execution, and the error envelope.

use super::emit::Emitter;
use super::{Agent, MAX_OUTPUT_RECOVERIES};
use crate::parser::is_py_whitespace;
use crate::prompt;
use crate::shape::persisted_marker;
use crate::{
    ChatMessage, ChatRequest, ChatRole, Event, FenceParser, FinishReason, Interruption, Message,
    ModelError, ModelErrorKind, OutputSink, PersistedOutput, RuntimeError, Status, StopError,
    StopErrorKind, StopReason, TokenAnchor, Usage, Value,
};
use futures_util::{FutureExt, StreamExt};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How long an interrupted execution gets to unwind before the agent stops waiting for it.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// Why a run ends early.
enum Failure {
    Model(ModelError),
    Runtime(RuntimeError),
}

/// The runs' driver: the envelope that guarantees a `Stopped` event and a valid history.
pub(super) async fn drive(
    agent: &mut Agent,
    prompt: String,
    cancel: CancellationToken,
    emit: Emitter,
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
    let stopped = Event::Stopped {
        content: std::mem::take(&mut run.final_content),
        stop_reason: reason,
        steps: run.steps,
        elapsed: run.started.elapsed().as_secs_f64(),
        usage: run.usage,
        error,
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

/// One model call.
#[derive(Default)]
struct Turn {
    /// Earlier fragments this call continues.
    prefix: String,
    /// Content this call produced, up to the closing fence.
    text: String,
    /// All content received, for usage estimates.
    received: String,
    thinking: String,
    refusal: String,
    finish: Option<FinishReason>,
    reported_usage: Option<Usage>,
    code: Option<String>,
    stopped_at_code: bool,
    error: Option<ModelError>,
    recoverable: bool,
    prompt_estimate: u64,
}

impl Turn {
    fn new(prefix: String) -> Self {
        Self {
            prefix,
            recoverable: true,
            ..Self::default()
        }
    }
    fn full(&self) -> String {
        format!("{}{}", self.prefix, self.text)
    }
    fn complete(&self) -> bool {
        self.error.is_none() && (self.code.is_some() || self.finish != Some(FinishReason::Length))
    }
}

/// Forwards live output into the run as `ExecutionOutput` events.
struct ChannelSink(mpsc::UnboundedSender<String>);

impl OutputSink for ChannelSink {
    fn write(&self, chunk: &str) {
        // The receiver is gone only once the execution is over; late output has no reader.
        let _ = self.0.send(chunk.to_owned());
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

    fn interrupt_execution(&mut self) -> Option<Interruption> {
        if !std::mem::take(&mut self.executing) {
            return None;
        }
        let interruption = self.agent.runtime.interrupter().map(|i| i.interrupt());
        tracing::info!(?interruption, "interrupted the execution in flight");
        interruption
    }

    async fn body(&mut self, prompt: String) -> Result<StopReason, Failure> {
        let system = self.agent.system_prompt();
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
            self.step().await?;
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

    fn time_exceeded(&self) -> bool {
        self.agent
            .config
            .max_run_time
            .is_some_and(|limit| self.started.elapsed() >= limit)
    }

    fn budget_crossed(&self) -> bool {
        self.budget_error().is_some()
    }

    /// The first token budget that is spent, if any.
    fn budget_error(&self) -> Option<StopError> {
        let c = &self.agent.config;
        let u = &self.usage;
        [
            (
                c.max_total_tokens,
                u.total_tokens,
                StopErrorKind::MaxTotalTokens,
                "total",
            ),
            (
                c.max_input_tokens,
                u.prompt_tokens,
                StopErrorKind::MaxInputTokens,
                "input",
            ),
            (
                c.max_output_tokens,
                u.completion_tokens,
                StopErrorKind::MaxOutputTokens,
                "output",
            ),
        ]
        .into_iter()
        .find_map(|(cap, spent, kind, what)| {
            let cap = cap.filter(|cap| spent >= *cap)?;
            Some(StopError::new(
                kind,
                format!("the {what} token budget of {cap} is spent ({spent} used)"),
            ))
        })
    }

    async fn step(&mut self) -> Result<(), Failure> {
        self.maybe_compact().await;
        self.steps += 1;
        let mut turn = Turn::new(self.pending_text.clone());
        let streamed = self.stream_with_overflow_retry(&mut turn).await;
        self.settle_usage(&turn);
        streamed.map_err(Failure::Model)?;

        if let Some(error) = turn.error.as_ref().filter(|_| !turn.recoverable) {
            return Err(Failure::Model(error.clone()));
        }
        if !turn.complete() && self.recoveries < MAX_OUTPUT_RECOVERIES {
            self.recoveries += 1;
            self.pending_text = turn.full();
            let resume = if turn.error.is_some() {
                prompt::STREAM_INTERRUPTED_PROMPT
            } else {
                prompt::OUTPUT_RECOVERY_PROMPT
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
            return Ok(());
        }
        self.pending_text.clear();
        self.handle_turn(turn).await
    }

    async fn handle_turn(&mut self, mut turn: Turn) -> Result<(), Failure> {
        self.final_content = turn.full();
        let complete = turn.complete();
        let Some(code) = turn.code.take() else {
            let message = Message::assistant(std::mem::take(&mut turn.text))
                .with_reasoning(std::mem::take(&mut turn.thinking));
            self.agent.history.push(message);
            if !complete {
                let error = turn.error.take().unwrap_or_else(|| {
                    ModelError::new(
                        ModelErrorKind::Truncated,
                        format!(
                            "the answer was cut off by the output limit {MAX_OUTPUT_RECOVERIES} times and could not be resumed"
                        ),
                    )
                });
                return Err(Failure::Model(error));
            }
            self.completed = true;
            self.emit
                .emit(Event::FinalResponse {
                    content: self.final_content.clone(),
                })
                .await;
            return Ok(());
        };
        self.emit.emit(Event::Code { code: code.clone() }).await;
        let message = Message::code(std::mem::take(&mut turn.text))
            .with_reasoning(std::mem::take(&mut turn.thinking));
        self.agent.history.push(message);
        let (event, result) = self.execute(&code).await?;
        self.agent.history.push(result);
        self.emit.emit(event).await;
        Ok(())
    }

    async fn maybe_compact(&mut self) {
        let before = self.agent.history.len();
        let prepared = self.agent.compactor.prepare(
            &self.agent.history,
            self.agent.anchor,
            self.agent.estimator.as_ref(),
        );
        if let Some(history) = prepared.history {
            self.agent.history = history;
        }
        if prepared.needs_summary {
            self.emit.emit(Event::Status(Status::Compacting)).await;
            // A clone, so that a run cancelled mid-summary keeps its history.
            let summarized = self
                .agent
                .compactor
                .summarize(self.agent.history.clone())
                .await;
            self.settle_summary(summarized, before).await;
        }
    }

    /// Takes a summary's history, counts its tokens, and says how it went.
    async fn settle_summary(&mut self, summarized: crate::Summarized, before: usize) {
        self.usage += summarized.usage;
        self.agent.history = summarized.history;
        let status = match summarized.error {
            Some(message) => {
                tracing::warn!(error = %message, "compaction failed; history kept");
                Status::CompactionFailed { message }
            }
            None => Status::Compacted {
                before,
                after: self.agent.history.len(),
            },
        };
        self.emit.emit(Event::Status(status)).await;
    }

    async fn stream_with_overflow_retry(&mut self, turn: &mut Turn) -> Result<(), ModelError> {
        match self.stream_once(turn).await {
            Err(error) if error.is_prompt_too_long() => {
                tracing::warn!(error = %error, "prompt too long, compacting and retrying once");
                let before = self.agent.history.len();
                self.emit.emit(Event::Status(Status::Compacting)).await;
                let recovered = self
                    .agent
                    .compactor
                    .recover_from_overflow(self.agent.history.clone())
                    .await;
                self.settle_summary(recovered, before).await;
                *turn = Turn::new(std::mem::take(&mut turn.prefix));
                self.stream_once(turn).await
            }
            other => other,
        }
    }

    /// The wire request: the history, with the date reminder after the system prompt.
    fn request(&self) -> ChatRequest {
        let mut messages: Vec<ChatMessage> =
            self.agent.history.iter().map(Message::to_chat).collect();
        let at = messages
            .iter()
            .position(|m| m.role == ChatRole::System)
            .map_or(0, |i| i + 1);
        let reminder = ChatMessage {
            reasoning: None,
            role: ChatRole::User,
            content: prompt::date_reminder(&prompt::utc_hour_now()),
        };
        messages.insert(at, reminder);
        ChatRequest::new(messages)
    }

    /// Streams one model call into `turn`. `Err` is a failure before any answer (or a prompt
    /// that is too long); a failure after some answer is recorded in `turn.error`.
    async fn stream_once(&mut self, turn: &mut Turn) -> Result<(), ModelError> {
        let defer = self.agent.model_info.filters_asynchronously;
        let idle = self.agent.config.stream_idle_timeout;
        let mut parser = FenceParser::new(&self.agent.config.python_block_identifier);
        if !turn.prefix.is_empty() {
            // Already shown by the earlier call: only the parser's state matters.
            parser.push(&turn.prefix);
        }
        let request = self.request();
        let estimator = self.agent.estimator.as_ref();
        turn.prompt_estimate = request
            .messages
            .iter()
            .map(|m| estimator.estimate(&m.content))
            .sum();

        let model = self.agent.model.clone();
        let mut stream = match idle {
            Some(limit) => tokio::time::timeout(limit, model.stream(request))
                .await
                .map_err(|_| stalled(limit))??,
            None => model.stream(request).await?,
        };
        let mut thinking_since: Option<Instant> = None;
        let mut saw_content = false;
        let mut backoff = Duration::ZERO;
        loop {
            let next = match idle {
                Some(limit) => {
                    let wait = limit + std::mem::take(&mut backoff);
                    match tokio::time::timeout(wait, stream.next()).await {
                        Ok(item) => item,
                        Err(_) => Some(Err(stalled(limit))),
                    }
                }
                None => stream.next().await,
            };
            let delta = match next {
                None => break,
                Some(Err(error)) if error.is_prompt_too_long() => return Err(error),
                // After the terminal delta only usage was pending: not a failure.
                Some(Err(_)) if turn.finish.is_some() => break,
                Some(Err(error)) if !saw_content => return Err(error),
                Some(Err(error)) => {
                    tracing::warn!(error = %error, "the model stream broke mid-answer; keeping the partial answer");
                    turn.error = Some(error);
                    turn.recoverable = !defer;
                    break;
                }
                Some(Ok(delta)) => delta,
            };
            if let Some(usage) = delta.usage {
                turn.reported_usage = Some(usage);
            }
            if delta.finish_reason.is_some() {
                turn.finish = delta.finish_reason;
            }
            if let Some(delay) = delta.backoff {
                backoff = delay;
                self.emit
                    .emit(Event::Backoff {
                        delay: delay.as_secs_f64(),
                    })
                    .await;
            }
            turn.refusal.push_str(&delta.refusal);
            if !delta.reasoning.is_empty() {
                thinking_since.get_or_insert_with(Instant::now);
                turn.thinking.push_str(&delta.reasoning);
                self.emit
                    .emit(Event::ThinkingChunk {
                        content: delta.reasoning,
                    })
                    .await;
            }
            if delta.text.is_empty() {
                continue;
            }
            self.seal_thinking(turn, &mut thinking_since).await;
            saw_content = true;
            turn.received.push_str(&delta.text);
            let parsed = parser.push(&delta.text);
            let text = parsed.text.to_owned();
            if let Some(code) = parsed.code {
                turn.code = Some(code.to_owned());
            }
            let consumed = delta.text.len() - parser.remainder().len();
            turn.text.push_str(&delta.text[..consumed]);
            if !text.is_empty() {
                self.emit.emit(Event::Text { content: text }).await;
            }
            if parser.is_complete() && !defer {
                turn.stopped_at_code = true;
                break;
            }
        }
        // Closes the connection now: nothing more is read from it.
        drop(stream);
        self.seal_thinking(turn, &mut thinking_since).await;
        if !parser.is_complete() {
            // Held-back text is shown; an unterminated block is never run.
            let text = parser.flush().text.to_owned();
            if !text.is_empty() {
                self.emit.emit(Event::Text { content: text }).await;
            }
        }
        self.conclude(turn, defer).await;
        Ok(())
    }

    async fn seal_thinking(&self, turn: &Turn, since: &mut Option<Instant>) {
        if let Some(started) = since.take()
            && !turn.thinking.is_empty()
        {
            let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.emit
                .emit(Event::Thinking {
                    content: turn.thinking.clone(),
                    duration_ms,
                })
                .await;
        }
    }

    /// Decides what an ended stream means, in a fixed order.
    async fn conclude(&self, turn: &mut Turn, defer: bool) {
        if turn.error.is_some() {
            return;
        }
        let filtered = turn.finish == Some(FinishReason::ContentFilter);
        let (kind, message, recoverable) = if turn.finish.is_none() && !turn.stopped_at_code {
            (
                ModelErrorKind::StreamInterrupted,
                "the model stream ended without a finish reason",
                !defer && !turn.text.is_empty(),
            )
        } else if filtered && !turn.text.is_empty() {
            (
                ModelErrorKind::ContentFiltered,
                "the provider withdrew this answer after streaming part of it",
                false,
            )
        } else if !turn.refusal.is_empty() && turn.text.is_empty() {
            // A refusal is the answer; it is never parsed for code.
            turn.text = turn.refusal.clone();
            self.emit
                .emit(Event::Text {
                    content: turn.refusal.clone(),
                })
                .await;
            return;
        } else if filtered {
            (
                ModelErrorKind::ContentFiltered,
                "the provider filtered this answer and returned nothing",
                false,
            )
        } else if turn.finish != Some(FinishReason::Length)
            && turn.code.is_none()
            && turn.text.chars().all(is_py_whitespace)
        {
            (
                ModelErrorKind::EmptyAnswer,
                "the model finished without returning an answer",
                false,
            )
        } else {
            return;
        };
        turn.error = Some(ModelError::new(kind, message));
        turn.recoverable = recoverable;
    }

    /// Adds the call's usage to the run (estimated when the provider reported none) and
    /// anchors token estimates to the provider's prompt count.
    fn settle_usage(&mut self, turn: &Turn) {
        let usage = match turn.reported_usage {
            Some(reported) if reported.total_tokens != 0 => reported,
            _ => {
                let estimator = self.agent.estimator.as_ref();
                let mut completion = estimator.estimate(&turn.received)
                    + estimator.estimate(&turn.refusal)
                    + estimator.estimate(&turn.thinking);
                let produced = !turn.received.is_empty()
                    || !turn.thinking.is_empty()
                    || !turn.refusal.is_empty();
                if produced && completion == 0 {
                    completion = 1;
                }
                Usage::new(turn.prompt_estimate, completion)
            }
        };
        self.usage += usage;
        if usage.prompt_tokens > 0 {
            self.agent.anchor = Some(TokenAnchor::new(
                &self.agent.history,
                usage.prompt_tokens,
                self.agent.estimator.as_ref(),
            ));
        }
    }

    /// Runs the code (unless the policy refuses it); returns the event and the model's text.
    /// Runs the code (unless the policy refuses it): the event and the execution result.
    async fn execute(&mut self, code: &str) -> Result<(Event, Message), Failure> {
        if let Some(policy) = &self.agent.policy {
            let violations = policy.check(code);
            if !violations.is_empty() {
                let mut message = format!(
                    "Code execution blocked: {} violation{} found:",
                    violations.len(),
                    if violations.len() == 1 { "" } else { "s" }
                );
                for v in &violations {
                    message.push_str("\n  - ");
                    message.push_str(&v.message);
                }
                let result = prompt::security_error(&message);
                return Ok((
                    Event::SecurityError { message },
                    Message::execution_result(result),
                ));
            }
        }
        let runtime = self.agent.runtime.clone();
        let (sender, mut live) = mpsc::unbounded_channel();
        let sink = ChannelSink(sender);
        let deadline = self
            .agent
            .config
            .max_exec_timeout
            .map(|t| tokio::time::Instant::now() + t);
        self.executing = true;
        let execution = runtime.execute(code, &sink);
        tokio::pin!(execution);
        let finished = loop {
            tokio::select! {
                biased;
                result = &mut execution => break Some(result),
                Some(chunk) = live.recv() => self.emit.emit(Event::ExecutionOutput { chunk }).await,
                () = sleep_until(deadline) => break None,
            }
        };
        let Some(result) = finished else {
            return self.timed_out(execution).await;
        };
        self.executing = false;
        while let Ok(chunk) = live.try_recv() {
            self.emit.emit(Event::ExecutionOutput { chunk }).await;
        }
        let execution = result.map_err(Failure::Runtime)?;
        let success = execution.success();
        let state_lost = execution.state_lost;
        let output = match (execution.output.is_empty(), execution.error) {
            (false, _) => execution.output,
            (true, Some(error)) => format!("{}: {}", error.python_type, error.message),
            (true, None) => prompt::EMPTY_OUTPUT.to_owned(),
        };
        let (body, persisted) = self.shape_output(&output).await?;
        let mut result = prompt::execution_output(&body);
        if state_lost {
            result.push_str("\n\n");
            result.push_str(prompt::STATE_LOST_NOTICE);
        }
        let event = Event::ExecutionResult {
            output,
            success,
            persisted: persisted.is_some(),
            persisted_variable: persisted.as_ref().map(|p| p.variable.clone()),
            state_lost,
        };
        let message = match persisted {
            Some(persisted) => Message::persisted_result(result, persisted),
            None => Message::execution_result(result),
        };
        Ok((event, message))
    }

    /// The execution passed `max_exec_timeout`: interrupt it and give it a moment to unwind.
    async fn timed_out<F>(
        &mut self,
        execution: std::pin::Pin<&mut F>,
    ) -> Result<(Event, Message), Failure>
    where
        F: std::future::Future<Output = Result<crate::Execution, RuntimeError>>,
    {
        let limit = self
            .agent
            .config
            .max_exec_timeout
            .unwrap_or_default()
            .as_secs_f64();
        let interruption = self.interrupt_execution();
        let settled = tokio::time::timeout(INTERRUPT_GRACE, execution).await;
        let mut state_lost = interruption == Some(Interruption::StateLost);
        let pending = match settled {
            Ok(Ok(execution)) => {
                state_lost |= execution.state_lost;
                false
            }
            Ok(Err(error)) => return Err(Failure::Runtime(error)),
            Err(_) => true,
        };
        tracing::info!(
            limit,
            state_lost,
            pending,
            "execution stopped at its time limit"
        );
        let mut result = prompt::execution_timeout(limit);
        if state_lost {
            result.push_str("\n\n");
            result.push_str(prompt::STATE_LOST_NOTICE);
        }
        if pending {
            result.push_str("\n\n");
            result.push_str(prompt::INTERRUPT_PENDING_NOTICE);
        }
        Ok((
            Event::ExecutionTimeout {
                timeout: limit,
                state_lost,
            },
            Message::execution_result(result),
        ))
    }

    /// Inlines small output; stores large output in the runtime and returns a marker.
    async fn shape_output(
        &mut self,
        output: &str,
    ) -> Result<(String, Option<PersistedOutput>), Failure> {
        let chars = output.chars().count();
        let config = &self.agent.config;
        if chars <= config.max_exec_output {
            return Ok((output.to_owned(), None));
        }
        let prefix = config.persisted_output_prefix.clone();
        let preview_chars = config.exec_output_preview_chars;
        let name = self
            .agent
            .runtime
            .bind_unique(
                &prefix,
                Value::Str(output.to_owned()),
                self.agent.persisted_floor,
            )
            .await
            .map_err(Failure::Runtime)?;
        let index = name
            .strip_prefix(prefix.as_str())
            .and_then(|rest| rest.strip_prefix('_'))
            .and_then(|n| n.parse::<u64>().ok());
        let Some(index) = index else {
            // The runtime broke `bind_unique`'s contract: say so rather than guess a number.
            return Err(Failure::Runtime(RuntimeError::Backend {
                operation: "bind_unique",
                message: format!("returned {name:?}, which is not {prefix}_N"),
            }));
        };
        self.agent.persisted_floor = self.agent.persisted_floor.max(index.saturating_add(1));
        tracing::info!(variable = %name, chars, "execution output persisted in the runtime");
        Ok((
            persisted_marker(output, chars, &name, preview_chars),
            Some(PersistedOutput::new(&prefix, index, chars)),
        ))
    }
}

fn stalled(limit: Duration) -> ModelError {
    ModelError::new(
        ModelErrorKind::StreamStalled,
        format!(
            "the model stream stalled: nothing arrived for {} s",
            limit.as_secs_f64()
        ),
    )
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

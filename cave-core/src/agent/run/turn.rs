//! One model call: streaming it through the fence parser, and what it came to.

use super::tools::{self, ToolCalls};
use super::*;

/// How many times one call is asked again from the start after the provider reported a
/// transient failure mid-answer.
const MAX_PROVIDER_RESTARTS: u32 = 3;

/// One model call.
#[derive(Default)]
pub(super) struct Turn {
    /// Earlier fragments this call continues.
    pub(super) prefix: String,
    /// Content this call produced, up to the closing fence.
    pub(super) text: String,
    /// All content received, for usage estimates.
    pub(super) received: String,
    pub(super) thinking: String,
    pub(super) refusal: String,
    pub(super) finish: Option<FinishReason>,
    pub(super) reported_usage: Option<Usage>,
    /// What the provider said the call cost, in US dollars.
    pub(super) reported_cost: Option<f64>,
    /// Whether the ledger's tokens were marked estimated before this call was charged (so that
    /// a late report that replaces this call's estimate can take the mark back).
    pub(super) ledger_estimated_before: bool,
    /// The end of an answer stopped at its block, read in the background for its usage.
    pub(super) tail: Option<tokio::task::JoinHandle<Tail>>,
    pub(super) code: Option<String>,
    /// The code is a block the answer ended in, without a closing fence.
    pub(super) unclosed: bool,
    /// The content opened reasoning in tags (`<think>`) and never closed it.
    pub(super) unclosed_thinking: bool,
    /// Tool calls the answer made.
    pub(super) tool_calls: ToolCalls,
    /// The code came from the arguments of a call of this tool.
    pub(super) tool: Option<String>,
    pub(super) stopped_at_code: bool,
    pub(super) error: Option<ModelError>,
    /// The provider reported a failure after some answer (an error event in the stream): what
    /// came is not an answer to keep or continue.
    pub(super) provider_failure: Option<ModelError>,
    pub(super) recoverable: bool,
    pub(super) prompt_estimate: u64,
}

impl Turn {
    pub(super) fn new(prefix: String) -> Self {
        Self {
            prefix,
            recoverable: true,
            ..Self::default()
        }
    }
    pub(super) fn full(&self) -> String {
        format!("{}{}", self.prefix, self.text)
    }
    pub(super) fn complete(&self) -> bool {
        self.error.is_none()
            && (self.code.is_some()
                || (self.finish != Some(FinishReason::Length) && !self.unclosed_thinking))
    }

    /// What the call came to; `can_resume` says whether a cut answer may still be resumed.
    pub(super) fn outcome(&mut self, can_resume: bool) -> Outcome {
        if !self.recoverable
            && let Some(error) = self.error.take()
        {
            return Outcome::Failed(error);
        }
        let complete = self.complete();
        let cut = if self.error.is_some() {
            Cut::Interrupted
        } else if self.unclosed_thinking && self.finish != Some(FinishReason::Length) {
            Cut::UnclosedThinking
        } else {
            Cut::Length
        };
        if !complete && can_resume {
            return Outcome::Resume(cut);
        }
        Outcome::Kept(match self.code.take() {
            Some(code) => Kept::Code {
                code,
                unclosed: self.unclosed,
                tool: self.tool.take(),
            },
            None if complete && !self.tool_calls.is_empty() => Kept::ToolCalls,
            None if complete => Kept::Answer,
            None => Kept::Truncated(self.error.take().unwrap_or_else(|| match cut {
                Cut::UnclosedThinking => ModelError::new(
                    ModelErrorKind::EmptyAnswer,
                    format!(
                        "the model's reasoning (<think>) was never closed and no answer followed, {MAX_OUTPUT_RECOVERIES} times"
                    ),
                ),
                _ => ModelError::new(
                    ModelErrorKind::Truncated,
                    format!(
                        "the answer was cut off by the output limit {MAX_OUTPUT_RECOVERIES} times and could not be resumed"
                    ),
                ),
            })),
        })
    }
}

/// Why an answer is incomplete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cut {
    /// The output cap cut it.
    Length,
    /// A broken stream cut it.
    Interrupted,
    /// It opened reasoning in tags and ended without closing them or answering.
    UnclosedThinking,
}

/// What one model call came to.
pub(super) enum Outcome {
    /// Cut off: ask to resume.
    Resume(Cut),
    /// Failed before anything usable: the run ends.
    Failed(ModelError),
    /// An answer that goes into the history as it is.
    Kept(Kept),
}

/// An answer the history keeps.
pub(super) enum Kept {
    /// It holds a code block, to run (`unclosed`: the answer ended inside it; `tool`: the
    /// code was the arguments of a call of that tool).
    Code {
        code: String,
        unclosed: bool,
        tool: Option<String>,
    },
    /// The final answer.
    Answer,
    /// Tool calls without code: answered with a correction, and the run goes on.
    ToolCalls,
    /// Cut off once too often: the partial answer is kept and the run ends.
    Truncated(ModelError),
}

impl Run<'_> {
    /// One model call: retried from scratch when the provider reports a transient failure
    /// after part of the answer (that part is dropped, never continued or spliced), failed
    /// without it otherwise; compacted and retried once when the prompt is too long.
    pub(super) async fn stream_with_overflow_retry(
        &mut self,
        turn: &mut Turn,
    ) -> Result<(), ModelError> {
        let mut restarts = 0;
        loop {
            self.stream_with_compaction(turn).await?;
            let Some(error) = turn.provider_failure.take() else {
                return Ok(());
            };
            // Shown live already; not the answer.
            turn.text.clear();
            let retry_after = match error.kind() {
                ModelErrorKind::Transient { retry_after } => Some(*retry_after),
                _ => None,
            };
            let Some(retry_after) = retry_after.filter(|_| restarts < MAX_PROVIDER_RESTARTS) else {
                return Err(error);
            };
            let delay = retry_after
                .unwrap_or(Duration::from_millis(500) * 2u32.pow(restarts))
                .min(Duration::from_secs(30));
            restarts += 1;
            tracing::warn!(error = %error, attempt = restarts, "the provider failed mid-answer; asking again from the start");
            self.emit
                .emit(Event::Backoff {
                    delay: delay.as_secs_f64(),
                    reason: Some(error.message().to_owned()),
                })
                .await;
            tokio::time::sleep(delay).await;
            *turn = Turn::new(std::mem::take(&mut turn.prefix));
        }
    }

    async fn stream_with_compaction(&mut self, turn: &mut Turn) -> Result<(), ModelError> {
        match self.stream_once(turn).await {
            Err(error) if error.is_prompt_too_long() => {
                tracing::warn!(error = %error, "prompt too long, compacting and retrying once");
                let before = self.agent.history.len();
                self.emit.emit(Event::Status(Status::Compacting)).await;
                let recovered = tracing::Instrument::instrument(
                    self.agent.compactor.recover_from_overflow(
                        self.agent.history.clone(),
                        self.agent.estimator.as_ref(),
                    ),
                    super::spans::compaction(),
                )
                .await;
                self.settle_summary(recovered, before).await;
                *turn = Turn::new(std::mem::take(&mut turn.prefix));
                self.stream_once(turn).await
            }
            other => other,
        }
    }

    /// The wire request: the history, with the date reminder after the system prompt.
    pub(super) fn request(&self) -> ChatRequest {
        let mut messages: Vec<ChatMessage> =
            self.agent.history.iter().map(Message::to_chat).collect();
        let at = messages
            .iter()
            .position(|m| m.role == ChatRole::System)
            .map_or(0, |i| i + 1);
        let reminder = ChatMessage::new(
            ChatRole::User,
            prompt::date_reminder(&prompt::utc_hour_now()),
        )
        .with_kind(MessageKind::Reminder);
        messages.insert(at, reminder);
        ChatRequest::new(messages)
    }

    /// Streams one model call into `turn`. `Err` is a failure before any answer (or a prompt
    /// that is too long); a failure after some answer is recorded in `turn.error`.
    pub(super) async fn stream_once(&mut self, turn: &mut Turn) -> Result<(), ModelError> {
        let defer = self.agent.model_info.filters_asynchronously;
        let idle = self.agent.config.stream_idle_timeout;
        let tag = self.agent.config.python_block_identifier.as_str();
        // `py` and `python3` open a block too (small models write them), unless the host chose
        // its own tag.
        let mut parser = if tag == "python" {
            FenceParser::with_tags(&["python", "py", "python3"])
        } else {
            FenceParser::new(tag)
        };
        // Reasoning in tags opens only an answer: a continuation is answer text.
        let mut think = ThinkSplitter::new();
        if !turn.prefix.is_empty() {
            // Already shown by the earlier call: only the parser's state matters.
            parser.push(&turn.prefix);
            think = ThinkSplitter::answering();
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
                Some(Err(error))
                    if !matches!(
                        error.kind(),
                        ModelErrorKind::StreamInterrupted | ModelErrorKind::StreamStalled
                    ) =>
                {
                    tracing::warn!(error = %error, "the provider reported a failure mid-answer");
                    turn.provider_failure = Some(error);
                    break;
                }
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
            if delta.reported_cost.is_some() {
                turn.reported_cost = delta.reported_cost;
            }
            if delta.finish_reason.is_some() {
                turn.finish = delta.finish_reason;
            }
            if let Some(delay) = delta.backoff {
                backoff = delay;
                self.emit
                    .emit(Event::Backoff {
                        delay: delay.as_secs_f64(),
                        reason: delta.backoff_reason.clone(),
                    })
                    .await;
            }
            turn.refusal.push_str(&delta.refusal);
            for piece in delta.tool_calls {
                turn.tool_calls.push(piece);
            }
            saw_content |= !delta.text.is_empty();
            let mut split = think.push(&delta.text);
            split.reasoning.insert_str(0, &delta.reasoning);
            self.think(turn, split.reasoning, &mut thinking_since).await;
            if self
                .answer_text(turn, &mut parser, &split.text, &mut thinking_since)
                .await
                && !defer
            {
                turn.stopped_at_code = true;
                break;
            }
        }
        // Nothing more of the answer is used. Stopped at a block, its end is read for a moment
        // in the background for the usage that follows it (while the code runs); then, or
        // at once otherwise, the stream is dropped: the adapter keeps the connection if the
        // rest arrives within moments, and closes it otherwise (which stops the model).
        if turn.stopped_at_code && turn.reported_usage.is_none() {
            turn.tail = Some(tokio::spawn(tail_usage(stream)));
        } else {
            drop(stream);
        }
        if !parser.is_complete() {
            let last = think.finish();
            turn.unclosed_thinking = think.is_unclosed();
            self.think(turn, last.reasoning, &mut thinking_since).await;
            self.answer_text(turn, &mut parser, &last.text, &mut thinking_since)
                .await;
        }
        self.seal_thinking(turn, &mut thinking_since).await;
        if !parser.is_complete() {
            // Held-back text is shown. An unterminated block runs only if the answer ended
            // normally inside it: cut by the output cap, it is resumed instead.
            let flushed = parser.flush();
            let text = flushed.text.to_owned();
            let code = flushed.code.map(str::to_owned);
            if !text.is_empty() {
                self.emit.emit(Event::Text { content: text }).await;
            }
            if let Some(code) = code
                && turn.finish == Some(FinishReason::Stop)
                && turn.error.is_none()
                && turn.code.is_none()
            {
                tracing::info!(
                    "the answer ended inside a code block without a closing fence; running it"
                );
                turn.code = Some(code);
                turn.unclosed = true;
            }
            if turn.code.is_none()
                && turn.error.is_none()
                && let Some((call, code)) = turn.tool_calls.code()
            {
                tracing::info!(tool = %call.name, "the answer called a tool with code; running it as the block");
                turn.tool = Some(tools::display_name(&call.name).to_owned());
                turn.code = Some(code);
            }
        }
        self.conclude(turn, defer).await;
        Ok(())
    }

    /// Reasoning (the provider's field, or tags in the content) as it streams.
    async fn think(&self, turn: &mut Turn, reasoning: String, since: &mut Option<Instant>) {
        if reasoning.is_empty() {
            return;
        }
        since.get_or_insert_with(Instant::now);
        turn.thinking.push_str(&reasoning);
        self.emit
            .emit(Event::ThinkingChunk { content: reasoning })
            .await;
    }

    /// Answer text through the fence parser; returns true if and only if it closed the first
    /// block.
    async fn answer_text(
        &self,
        turn: &mut Turn,
        parser: &mut FenceParser,
        content: &str,
        since: &mut Option<Instant>,
    ) -> bool {
        if content.is_empty() || parser.is_complete() {
            return false;
        }
        self.seal_thinking(turn, since).await;
        turn.received.push_str(content);
        let parsed = parser.push(content);
        let text = parsed.text.to_owned();
        if let Some(code) = parsed.code {
            turn.code = Some(code.to_owned());
        }
        let consumed = content.len() - parser.remainder().len();
        turn.text.push_str(&content[..consumed]);
        if !text.is_empty() {
            self.emit.emit(Event::Text { content: text }).await;
        }
        parser.is_complete()
    }

    pub(super) async fn seal_thinking(&self, turn: &Turn, since: &mut Option<Instant>) {
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
    pub(super) async fn conclude(&self, turn: &mut Turn, defer: bool) {
        if turn.error.is_some() {
            return;
        }
        let filtered = turn.finish == Some(FinishReason::ContentFilter);
        let nothing = turn.text.is_empty()
            && turn.thinking.is_empty()
            && turn.refusal.is_empty()
            && turn.tool_calls.is_empty();
        if turn.finish.is_none() && !turn.stopped_at_code && nothing {
            // What llama.cpp does when the prompt exceeds its context: a 200 with no content.
            turn.error = Some(ModelError::new(
                ModelErrorKind::StreamInterrupted,
                format!(
                    "the model stream ended without any answer or finish reason. The prompt was about {} tokens (estimated): if the server's context is smaller than that, it may have refused it silently; tell the agent the server's real context size (`--context-window`) so that it compacts in time",
                    turn.prompt_estimate
                ),
            ));
            turn.recoverable = false;
            return;
        }
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
            && !turn.unclosed_thinking
            && turn.tool_calls.is_empty()
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
}

/// How long the end of an answer is read after the block the agent stopped at, for the usage
/// the provider reports last (a model still talking by then is cut off).
pub(super) const TAIL_WAIT: Duration = Duration::from_millis(250);

/// The most deltas of an answer's end that are read for its usage.
const TAIL_DELTAS: usize = 256;

/// What the end of an answer reported after the block the agent stopped at.
#[derive(Debug, Default)]
pub(super) struct Tail {
    pub(super) usage: Option<Usage>,
    pub(super) cost: Option<f64>,
}

/// Reads what follows the block the agent stopped at, for at most [`TAIL_WAIT`], and returns
/// the usage and cost reported there, if any.
async fn tail_usage(mut stream: crate::DeltaStream) -> Tail {
    let deadline = tokio::time::Instant::now() + TAIL_WAIT;
    let mut tail = Tail::default();
    for _ in 0..TAIL_DELTAS {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(delta))) => {
                if let Some(reported) = delta.usage.filter(|u| u.total_tokens != 0) {
                    tail.usage = Some(reported);
                }
                if delta.reported_cost.is_some() {
                    tail.cost = delta.reported_cost;
                }
            }
            Ok(Some(Err(_)) | None) | Err(_) => break,
        }
    }
    tail
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

//! `ContextCompactor`: keeping a conversation inside the model's context window, with summaries
//! the model writes when clearing old results is not enough.

use async_trait::async_trait;
use cave_core::prompt as prompts;
use cave_core::{
    ChatMessage, ChatRequest, ChatRole, Compactor, FinishReason, Message, Model, Prepared,
    Summarized, SummaryError, TokenAnchor, TokenEstimator, Usage, estimate_history,
    estimate_message, lock, strip_persisted_preview,
};
use futures_util::StreamExt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

/// The context window assumed when none is given.
pub const DEFAULT_CONTEXT_WINDOW: u64 = 128_000;
/// Room kept free besides the output reserve.
pub const COMPACT_BUFFER_TOKENS: u64 = 13_000;
/// The output reserve when neither the settings nor the model declare one.
pub const FALLBACK_OUTPUT_RESERVE: u64 = 16_000;
/// Execution results kept whole by microcompaction.
pub const KEEP_RECENT_RESULTS: usize = 6;
/// Messages always kept after a summary.
const MIN_KEEP: usize = 4;
/// Consecutive failed summaries that open the circuit breaker.
pub const MAX_CONSECUTIVE_FAILURES: u32 = 3;
/// Summary attempts skipped while the breaker is open.
pub const COOLDOWN_ATTEMPTS: u32 = 10;
/// Characters of one message shown to the summarizer.
const TRANSCRIPT_CAP: usize = 2000;
/// How deep folding may split a summary request.
const MAX_FOLD_DEPTH: u32 = 24;

/// Counts failed summaries and, after too many in a row, skips the next attempts.
#[derive(Debug, Default)]
struct Breaker {
    failures: u32,
    cooldown: u32,
}

impl Breaker {
    fn should_skip(&mut self) -> bool {
        if self.cooldown == 0 {
            return false;
        }
        self.cooldown -= 1;
        if self.cooldown == 0 {
            self.failures = 0;
        }
        true
    }
    fn record_failure(&mut self) {
        self.failures += 1;
        if self.failures >= MAX_CONSECUTIVE_FAILURES {
            self.cooldown = COOLDOWN_ATTEMPTS;
        }
    }
    fn record_success(&mut self) {
        *self = Breaker::default();
    }
}

/// A [`Compactor`] in two tiers.
///
/// Before each step, if the history is estimated above the threshold (window − output
/// reserve − 13 000 tokens, by default 99 000 of 128 000), old execution results are cleared
/// (all but the 6 most recent; a persisted-output marker keeps its declaration, so the model
/// still knows where the full output lives). Only if that is not enough does the model write a
/// summary of the older half of the conversation, never separating a code message from its
/// result. A new summary builds on the previous one, given back verbatim, and is skipped when
/// nothing happened since. Summary requests too large for the window are folded in batches.
/// After three failed summaries in a row, the next ten attempts are skipped. A failed summary
/// never drops anything. The tokens summary calls spend are reported with the result
/// ([`Summarized`]) and count in the run's usage and budgets.
pub struct ContextCompactor {
    summarizer: Arc<dyn Model>,
    context_window: u64,
    output_reserve: Option<u64>,
    breaker: Mutex<Breaker>,
}

impl std::fmt::Debug for ContextCompactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextCompactor")
            .field("summarizer", &self.summarizer.info().id)
            .field("context_window", &self.context_window)
            .field("threshold", &self.threshold())
            .finish_non_exhaustive()
    }
}

impl ContextCompactor {
    /// Compacts with summaries written by `summarizer` (usually the agent's own model, or a
    /// cheaper one). It counts with the estimator the agent hands it at each call (the
    /// agent's own, [`AgentBuilder::estimator`](cave_core::AgentBuilder::estimator)), so the
    /// two always count in one unit.
    pub fn new(summarizer: Arc<dyn Model>) -> Self {
        Self {
            summarizer,
            context_window: DEFAULT_CONTEXT_WINDOW,
            output_reserve: None,
            breaker: Mutex::new(Breaker::default()),
        }
    }

    /// The model's context window, in tokens (default 128 000).
    pub fn with_context_window(mut self, tokens: u64) -> Self {
        self.context_window = tokens;
        self
    }

    /// Tokens kept free for the answer: the output cap of the model the agent talks to
    /// (default: the summarizer's declared cap, else 16 000).
    pub fn with_output_reserve(mut self, tokens: u64) -> Self {
        self.output_reserve = Some(tokens);
        self
    }

    /// The size above which the history is compacted.
    pub fn threshold(&self) -> u64 {
        let reserve = self
            .output_reserve
            .or(self.summarizer.info().max_output_tokens.map(u64::from))
            .unwrap_or(FALLBACK_OUTPUT_RESERVE);
        match self
            .context_window
            .checked_sub(reserve + COMPACT_BUFFER_TOKENS)
        {
            Some(t) if t > 0 => t,
            // Reserve and buffer eat the window: compact at half, so that folding terminates.
            _ => self.context_window / 2,
        }
    }

    /// Returns true if and only if the circuit breaker is skipping summaries.
    pub fn breaker_open(&self) -> bool {
        lock(&self.breaker).cooldown > 0
    }

    /// Clears old execution results; `None` if there is nothing to clear. Message count and
    /// code messages are unchanged; applying it twice changes nothing more.
    pub fn microcompact(
        &self,
        history: &[Message],
        estimator: &dyn TokenEstimator,
    ) -> Option<Vec<Message>> {
        self.clear_old_results(history, estimator).map(|(h, _)| h)
    }

    /// The history with old results cleared, and the estimated tokens saved.
    /// Clears old results; also returns what that saves, by `estimator`.
    fn clear_old_results(
        &self,
        history: &[Message],
        estimator: &dyn TokenEstimator,
    ) -> Option<(Vec<Message>, u64)> {
        let results: Vec<usize> = history
            .iter()
            .enumerate()
            .filter(|(_, m)| matches!(m, Message::ExecutionResult { .. }))
            .map(|(i, _)| i)
            .collect();
        let old = results.len().saturating_sub(KEEP_RECENT_RESULTS);
        let mut out: Option<Vec<Message>> = None;
        let mut saved = 0;
        for &i in &results[..old] {
            let content = history[i].content();
            // Output stored in the runtime keeps its pointer (the marker without its preview);
            // anything else is cleared.
            let persisted = history[i].persisted().cloned();
            let stripped = persisted
                .as_ref()
                .and_then(|_| strip_persisted_preview(content));
            let cleared = match stripped {
                Some(stripped) => stripped,
                None => prompts::CLEARED_RESULT.to_owned(),
            };
            // Already at its floor: a marker without preview, or cleared, and no images.
            if cleared == content && history[i].images().is_empty() {
                continue;
            }
            // Images go with the text they came with (as a large output, a figure is cleared).
            saved += estimate_message(&history[i], estimator)
                .saturating_sub(estimator.estimate(&cleared));
            out.get_or_insert_with(|| history.to_vec())[i] = match persisted {
                Some(persisted) => Message::persisted_result(cleared, persisted),
                None => Message::execution_result(cleared),
            };
        }
        out.map(|h| (h, saved))
    }

    /// Summarizes the older part of `history`, keeping `len / divisor` (at least 4) recent
    /// messages; `None` when there is nothing to summarize or the summary failed.
    async fn summarize_part(
        &self,
        history: &[Message],
        divisor: usize,
        spent: &Spent<'_>,
    ) -> Result<Option<Vec<Message>>, SummaryError> {
        let (system, body) = match history.first() {
            Some(m @ Message::System { .. }) => (Some(m.clone()), &history[1..]),
            _ => (None, history),
        };
        if body.len() <= MIN_KEEP {
            return Ok(None);
        }
        let keep = (body.len() / divisor).max(MIN_KEEP);
        let mut split = body.len() - keep;
        // Never orphan a result from its code.
        while split > 0 && matches!(body[split], Message::ExecutionResult { .. }) {
            split -= 1;
        }
        if split == 0 {
            return Ok(None);
        }
        let (old, kept) = body.split_at(split);
        let (prior, fresh) = match old {
            [
                Message::Summary { body, .. },
                Message::SummaryAcknowledgement { .. },
                rest @ ..,
            ] => (Some(body.clone()), rest),
            [Message::Summary { body, .. }, rest @ ..] => (Some(body.clone()), rest),
            _ => (None, old),
        };
        if fresh.is_empty() {
            return Ok(None); // Nothing happened since the last summary.
        }
        let summary = self.fold(prior, fresh.to_vec(), 0, spent).await?;
        let mut out = Vec::with_capacity(kept.len() + 3);
        out.extend(system);
        out.push(Message::Summary {
            content: prompts::summary_message(&summary),
            body: summary,
        });
        let answered = matches!(
            kept.first(),
            Some(
                Message::Assistant { .. }
                    | Message::Code { .. }
                    | Message::SummaryAcknowledgement { .. }
            )
        );
        if !answered {
            out.push(Message::SummaryAcknowledgement {
                content: prompts::SUMMARY_ACKNOWLEDGEMENT.to_owned(),
            });
        }
        out.extend_from_slice(kept);
        Ok(Some(out))
    }

    /// A summary of `entries` building on `prior`, split in halves when the request would not
    /// fit the window (or the provider says so).
    fn fold<'a>(
        &'a self,
        prior: Option<String>,
        entries: Vec<Message>,
        depth: u32,
        spent: &'a Spent<'a>,
    ) -> Pin<Box<dyn Future<Output = Result<String, SummaryError>> + Send + 'a>> {
        Box::pin(async move {
            let request = prompts::summary_request(prior.as_deref(), &entries, TRANSCRIPT_CAP);
            let size: u64 = request
                .messages
                .iter()
                .map(|m| spent.estimator.estimate(&m.content))
                .sum();
            let too_big = size > self.threshold();
            let result = if too_big {
                None
            } else {
                Some(self.call(request, size, spent).await)
            };
            match result {
                Some(Ok(summary)) => Ok(summary),
                Some(Err(SummaryError::Model(e))) if !e.is_prompt_too_long() => {
                    Err(SummaryError::Model(e))
                }
                Some(Err(e @ SummaryError::Unusable(_))) => Err(e),
                // Too big (by estimate or by the provider's word): fold in halves.
                _ => {
                    if depth >= MAX_FOLD_DEPTH {
                        return Err(SummaryError::Unusable(
                            "the summary request cannot be made small enough".to_owned(),
                        ));
                    }
                    let halves = split_entries(entries).ok_or_else(|| {
                        SummaryError::Unusable(
                            "a single message is too large to summarize".to_owned(),
                        )
                    })?;
                    let left = self.fold(prior, halves.0, depth + 1, spent).await?;
                    self.fold(Some(left), halves.1, depth + 1, spent).await
                }
            }
        })
    }

    /// One summary call: the answer must finish normally; the `<summary>` part is kept.
    /// Its tokens are added to `spent` (estimated from `prompt_estimate` and the answer when
    /// the provider reports none), whether it succeeds or not.
    async fn call(
        &self,
        request: ChatRequest,
        prompt_estimate: u64,
        spent: &Spent<'_>,
    ) -> Result<String, SummaryError> {
        let mut stream = self
            .summarizer
            .stream(request)
            .await
            .map_err(SummaryError::Model)?;
        let (mut text, mut refusal, mut finish) = (String::new(), String::new(), None);
        let mut reported = None;
        let mut failure = None;
        while let Some(delta) = stream.next().await {
            let delta = match delta {
                Ok(delta) => delta,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            text.push_str(&delta.text);
            refusal.push_str(&delta.refusal);
            if delta.finish_reason.is_some() {
                finish = delta.finish_reason;
            }
            if delta.usage.is_some() {
                reported = delta.usage;
            }
        }
        let usage = reported.filter(|u| u.total_tokens > 0).unwrap_or_else(|| {
            Usage::new(
                prompt_estimate,
                spent.estimator.estimate(&text) + spent.estimator.estimate(&refusal),
            )
            .estimate()
        });
        spent.add(usage);
        if let Some(e) = failure {
            return Err(SummaryError::Model(e));
        }
        if !refusal.is_empty() && text.is_empty() {
            return Err(SummaryError::Unusable(format!(
                "the model refused to summarize: {refusal}"
            )));
        }
        if finish != Some(FinishReason::Stop) {
            let why = match &finish {
                Some(FinishReason::Length) => "it was cut off by the output limit".to_owned(),
                Some(FinishReason::ContentFilter) => "the provider filtered it".to_owned(),
                Some(FinishReason::Other(reason)) => format!("it ended with \"{reason}\""),
                Some(other) => format!("it ended with {other:?}"),
                None => "the stream ended without a reason".to_owned(),
            };
            return Err(SummaryError::Unusable(format!(
                "the summary did not finish normally: {why}"
            )));
        }
        let summary = match (text.find("<summary>"), text.find("</summary>")) {
            (Some(start), Some(end)) if end > start => {
                text[start + "<summary>".len()..end].trim().to_owned()
            }
            _ => text.trim().to_owned(),
        };
        if summary.is_empty() {
            return Err(SummaryError::Unusable(
                "the model returned an empty summary".to_owned(),
            ));
        }
        Ok(summary)
    }
}

/// Splits a batch in halves; a single message is split at the middle of its text.
fn split_entries(mut entries: Vec<Message>) -> Option<(Vec<Message>, Vec<Message>)> {
    if entries.len() >= 2 {
        let right = entries.split_off(entries.len() / 2);
        return Some((entries, right));
    }
    let only = entries.pop()?;
    let content = only.content();
    let chars: Vec<char> = content.chars().collect();
    if chars.len() < 2 {
        return None;
    }
    let (a, b) = chars.split_at(chars.len() / 2);
    let part = |text: &[char]| ChatMessage::new(only.chat_role(), text.iter().collect::<String>());
    let as_message = |m: ChatMessage| match m.role {
        ChatRole::Assistant => Message::assistant(m.content),
        _ => Message::user(m.content),
    };
    Some((vec![as_message(part(a))], vec![as_message(part(b))]))
}

/// One compaction's summary calls: the tokens they spent, and the agent's estimator they
/// count with where the provider reports nothing.
struct Spent<'e> {
    usage: Mutex<Usage>,
    estimator: &'e dyn TokenEstimator,
}

impl<'e> Spent<'e> {
    fn new(estimator: &'e dyn TokenEstimator) -> Self {
        Self {
            usage: Mutex::new(Usage::default()),
            estimator,
        }
    }
    fn add(&self, usage: Usage) {
        *lock(&self.usage) += usage;
    }
    fn total(&self) -> Usage {
        *lock(&self.usage)
    }
}

#[async_trait]
impl Compactor for ContextCompactor {
    fn prepare(
        &self,
        history: &[Message],
        anchor: Option<TokenAnchor>,
        estimator: &dyn TokenEstimator,
    ) -> Prepared {
        let tokens = estimate_history(history, anchor, estimator);
        let threshold = self.threshold();
        if tokens <= threshold {
            return Prepared::unchanged();
        }
        // Stay in the anchored unit: subtract what clearing saves, never re-estimate from scratch.
        match self.clear_old_results(history, estimator) {
            Some((cleared, saved)) => {
                let needs_summary = tokens.saturating_sub(saved) > threshold;
                Prepared::new(Some(cleared), needs_summary)
            }
            None => Prepared::new(None, true),
        }
    }

    async fn summarize(&self, history: Vec<Message>, estimator: &dyn TokenEstimator) -> Summarized {
        if lock(&self.breaker).should_skip() {
            tracing::info!("summary skipped: the circuit breaker is open");
            return Summarized::failed(history, Usage::default(), SummaryError::Paused);
        }
        let spent = Spent::new(estimator);
        match self.summarize_part(&history, 2, &spent).await {
            Ok(Some(summarized)) => {
                lock(&self.breaker).record_success();
                Summarized::new(summarized, spent.total())
            }
            Ok(None) => Summarized::new(history, spent.total()),
            Err(error) => {
                let mut breaker = lock(&self.breaker);
                breaker.record_failure();
                tracing::warn!(failures = breaker.failures, error = %error, "summary failed; history kept as it was");
                Summarized::failed(history, spent.total(), error)
            }
        }
    }

    async fn recover_from_overflow(
        &self,
        history: Vec<Message>,
        estimator: &dyn TokenEstimator,
    ) -> Summarized {
        // The provider has refused the prompt: no threshold, no breaker.
        let cleared = self.microcompact(&history, estimator).unwrap_or(history);
        let spent = Spent::new(estimator);
        match self.summarize_part(&cleared, 4, &spent).await {
            Ok(Some(summarized)) => Summarized::new(summarized, spent.total()),
            Ok(None) => Summarized::new(cleared, spent.total()),
            Err(error) => {
                tracing::warn!(error = %error, "emergency summary failed; keeping the cleared history");
                Summarized::failed(cleared, spent.total(), error)
            }
        }
    }
}

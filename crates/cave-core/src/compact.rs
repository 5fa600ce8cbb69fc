//! The `Compactor` and `TokenEstimator` seams: keeping the history inside the context window.

use crate::Message;
use async_trait::async_trait;
use std::sync::Arc;

/// Estimates how many tokens a text costs.
pub trait TokenEstimator: Send + Sync {
    /// The estimated token count of `text`.
    fn estimate(&self, text: &str) -> u64;
}

/// The simple default: a quarter token per character, rounded down (right for English prose
/// and code; cave-compact has a script-aware estimator and exact counts).
#[derive(Clone, Copy, Debug, Default)]
pub struct CharEstimator;

impl TokenEstimator for CharEstimator {
    fn estimate(&self, text: &str) -> u64 {
        text.chars().count() as u64 / 4
    }
}

/// Ties an estimate to a provider's real count: the history that was sent, estimated, and the
/// prompt tokens the provider reported for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenAnchor {
    /// Prompt tokens the provider reported.
    pub api_tokens: u64,
    /// The estimate of the same history.
    pub heuristic_tokens: u64,
}

impl TokenAnchor {
    /// Anchors `history` (as sent) to the provider's count.
    pub fn new(history: &[Message], api_tokens: u64, estimator: &dyn TokenEstimator) -> Self {
        Self {
            api_tokens,
            heuristic_tokens: estimate_history(history, None, estimator),
        }
    }
}

/// The estimated size of a history: the provider's count at the anchor plus the estimate of
/// what changed since; the plain estimate when there is no anchor or the history shrank.
pub fn estimate_history(
    history: &[Message],
    anchor: Option<TokenAnchor>,
    estimator: &dyn TokenEstimator,
) -> u64 {
    let heuristic: u64 = history
        .iter()
        .map(|m| estimator.estimate(m.content()))
        .sum();
    match anchor {
        Some(a) if a.api_tokens > 0 && heuristic >= a.heuristic_tokens => {
            a.api_tokens + (heuristic - a.heuristic_tokens)
        }
        _ => heuristic,
    }
}

/// What [`Compactor::prepare`] decided.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Prepared {
    /// A cheaper history, if anything was cleared.
    pub history: Option<Vec<Message>>,
    /// Returns true if and only if the history is still too large and must be summarized.
    pub needs_summary: bool,
}

impl Prepared {
    /// Nothing to do.
    pub fn unchanged() -> Self {
        Self::default()
    }
    /// A decision.
    pub fn new(history: Option<Vec<Message>>, needs_summary: bool) -> Self {
        Self {
            history,
            needs_summary,
        }
    }
}

/// Keeps the history inside the model's context window.
///
/// Before every step the agent calls [`prepare`](Compactor::prepare), which is cheap and
/// silent. If it asks for a summary, the agent announces `compacting`, calls
/// [`summarize`](Compactor::summarize) and announces `compacted`. When the provider rejects a
/// prompt as too long, the agent calls
/// [`recover_from_overflow`](Compactor::recover_from_overflow) and retries once. Only
/// [`estimator`](Compactor::estimator) is required: the defaults never compact. Compaction
/// never deletes history without a summary to replace it.
#[async_trait]
pub trait Compactor: Send + Sync {
    /// The estimator used for budgets, anchors and usage estimates.
    fn estimator(&self) -> &dyn TokenEstimator;

    /// The cheap pass before a step.
    fn prepare(&self, history: &[Message], anchor: Option<TokenAnchor>) -> Prepared {
        let _ = (history, anchor);
        Prepared::unchanged()
    }

    /// Summarizes older history; returns it unchanged if that fails.
    async fn summarize(&self, history: Vec<Message>) -> Vec<Message> {
        history
    }

    /// Shrinks a history the provider rejected as too long.
    async fn recover_from_overflow(&self, history: Vec<Message>) -> Vec<Message> {
        history
    }

    /// Learns the output-token cap of a model that uses this compactor.
    fn adopt_output_reserve(&self, tokens: u32) {
        let _ = tokens;
    }
}

/// A compactor that never compacts (the agent's default until one is configured).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoCompaction;

impl Compactor for NoCompaction {
    fn estimator(&self) -> &dyn TokenEstimator {
        &CharEstimator
    }
}

macro_rules! forward_compactor {
    ($($ptr:ty),*) => {$(
        #[async_trait]
        impl<C: Compactor + ?Sized> Compactor for $ptr {
            fn estimator(&self) -> &dyn TokenEstimator {
                (**self).estimator()
            }
            fn prepare(&self, history: &[Message], anchor: Option<TokenAnchor>) -> Prepared {
                (**self).prepare(history, anchor)
            }
            async fn summarize(&self, history: Vec<Message>) -> Vec<Message> {
                (**self).summarize(history).await
            }
            async fn recover_from_overflow(&self, history: Vec<Message>) -> Vec<Message> {
                (**self).recover_from_overflow(history).await
            }
            fn adopt_output_reserve(&self, tokens: u32) {
                (**self).adopt_output_reserve(tokens)
            }
        }
    )*};
}
forward_compactor!(&C, Box<C>, Arc<C>);

macro_rules! forward_estimator {
    ($($ptr:ty),*) => {$(
        impl<E: TokenEstimator + ?Sized> TokenEstimator for $ptr {
            fn estimate(&self, text: &str) -> u64 {
                (**self).estimate(text)
            }
        }
    )*};
}
forward_estimator!(&E, Box<E>, Arc<E>);

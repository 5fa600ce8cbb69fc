//! Keeping the history inside the context window: the `Compactor` and `TokenEstimator` seams,
//! what a program on the core alone gets (`NoCompaction`, `ByteEstimator`) and the arithmetic
//! both sides share. The compaction every facade agent gets is cave-compact's.

use crate::{Message, Usage};
use async_trait::async_trait;
use std::sync::Arc;

/// Estimates how many tokens a text costs.
pub trait TokenEstimator: Send + Sync {
    /// The estimated token count of `text`.
    fn estimate(&self, text: &str) -> u64;
    /// The estimated token count of an image of this size. Default: OpenAI's count at high
    /// detail (fit within 2048 × 2048, the shorter side scaled to 768, then 170 tokens per
    /// 512-pixel tile and 85 more).
    fn estimate_image(&self, width: u32, height: u32) -> u64 {
        image_tokens(width, height)
    }
}

/// OpenAI's token count of an image at high detail (see
/// [`TokenEstimator::estimate_image`]).
pub fn image_tokens(width: u32, height: u32) -> u64 {
    if width == 0 || height == 0 {
        return 85;
    }
    let (mut w, mut h) = (f64::from(width), f64::from(height));
    let fit = (2048.0 / w.max(h)).min(1.0);
    w *= fit;
    h *= fit;
    let shorter = (768.0 / w.min(h)).min(1.0);
    w *= shorter;
    h *= shorter;
    let tiles = (w / 512.0).ceil() * (h / 512.0).ceil();
    85 + 170 * tiles as u64
}

/// The estimated tokens of one message: its text and its images.
pub fn estimate_message(message: &Message, estimator: &dyn TokenEstimator) -> u64 {
    estimator.estimate(message.content())
        + message
            .images()
            .iter()
            .map(|i| estimator.estimate_image(i.width, i.height))
            .sum::<u64>()
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
    let heuristic: u64 = history.iter().map(|m| estimate_message(m, estimator)).sum();
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

/// What a summary attempt did: the history (summarized, or as it was), the tokens the
/// summary calls spent (counted in the run's usage), and why it failed, if it did.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Summarized {
    /// The history to go on with.
    pub history: Vec<Message>,
    /// Tokens spent by summary calls.
    pub usage: Usage,
    /// Why no summary replaced the older history, when one was tried and failed.
    pub error: Option<SummaryError>,
}

/// Why a summary could not be made (the history is then kept as it was).
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SummaryError {
    /// The summarizing model failed.
    #[error("{0}")]
    Model(crate::ModelError),
    /// The model answered, but not with a summary that can stand for the history.
    #[error("{0}")]
    Unusable(String),
    /// Summaries are paused after repeated failures (a circuit breaker).
    #[error("summaries are paused after repeated failures")]
    Paused,
}

/// Equal when of the same variant with the same kind and text (a model error's source is not
/// compared).
impl PartialEq for SummaryError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (SummaryError::Model(a), SummaryError::Model(b)) => {
                a.kind() == b.kind() && a.message() == b.message()
            }
            (SummaryError::Unusable(a), SummaryError::Unusable(b)) => a == b,
            (SummaryError::Paused, SummaryError::Paused) => true,
            _ => false,
        }
    }
}

impl Summarized {
    /// Nothing was done (nothing to summarize, or no call was made).
    pub fn unchanged(history: Vec<Message>) -> Self {
        Self {
            history,
            usage: Usage::default(),
            error: None,
        }
    }
    /// A summary was made at this cost.
    pub fn new(history: Vec<Message>, usage: Usage) -> Self {
        Self {
            history,
            usage,
            error: None,
        }
    }
    /// A summary was tried at this cost and failed; `history` is as it was (or, after an
    /// overflow, only cleared of old results).
    pub fn failed(history: Vec<Message>, usage: Usage, error: SummaryError) -> Self {
        Self {
            history,
            usage,
            error: Some(error),
        }
    }
}

/// Keeps the history inside the model's context window.
///
/// Before every step the agent calls [`prepare`](Compactor::prepare), which is cheap and
/// silent, with the agent's own [`TokenEstimator`] (so that the compactor counts in the units
/// of the anchor). If it asks for a summary, the agent announces `compacting`, calls
/// [`summarize`](Compactor::summarize) and announces `compacted` (or `compaction_failed`).
/// When the provider rejects a prompt as too long, the agent calls
/// [`recover_from_overflow`](Compactor::recover_from_overflow) and retries once. Every method
/// has a default that never compacts. Compaction never deletes history without a summary to
/// replace it.
#[async_trait]
pub trait Compactor: Send + Sync {
    /// The cheap pass before a step.
    fn prepare(
        &self,
        history: &[Message],
        anchor: Option<TokenAnchor>,
        estimator: &dyn TokenEstimator,
    ) -> Prepared {
        let _ = (history, anchor, estimator);
        Prepared::unchanged()
    }

    /// Summarizes older history; the history unchanged (with the error) if that fails.
    /// `estimator` is the agent's, as in [`prepare`](Compactor::prepare).
    async fn summarize(&self, history: Vec<Message>, estimator: &dyn TokenEstimator) -> Summarized {
        let _ = estimator;
        Summarized::unchanged(history)
    }

    /// Shrinks a history the provider rejected as too long.
    async fn recover_from_overflow(
        &self,
        history: Vec<Message>,
        estimator: &dyn TokenEstimator,
    ) -> Summarized {
        let _ = estimator;
        Summarized::unchanged(history)
    }
}

/// A compactor that never compacts: the default of an agent built on the core alone
/// ([`AgentBuilder::new`](crate::AgentBuilder::new)); the facade's `Agent::builder` sets
/// cave-compact's `ContextCompactor`.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoCompaction;

impl Compactor for NoCompaction {}

macro_rules! forward_compactor {
    ($($ptr:ty),*) => {$(
        #[async_trait]
        impl<C: Compactor + ?Sized> Compactor for $ptr {
            fn prepare(
                &self,
                history: &[Message],
                anchor: Option<TokenAnchor>,
                estimator: &dyn TokenEstimator,
            ) -> Prepared {
                (**self).prepare(history, anchor, estimator)
            }
            async fn summarize(
                &self,
                history: Vec<Message>,
                estimator: &dyn TokenEstimator,
            ) -> Summarized {
                (**self).summarize(history, estimator).await
            }
            async fn recover_from_overflow(
                &self,
                history: Vec<Message>,
                estimator: &dyn TokenEstimator,
            ) -> Summarized {
                (**self).recover_from_overflow(history, estimator).await
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

/// One token per four bytes of UTF-8, rounded up: OpenAI's rule of thumb for English, and the
/// estimate of an agent built on the core alone. It under-counts the scripts that tokenize
/// densely (Chinese, Japanese, Korean, most of the rest of the world's); cave-compact's
/// `ScriptEstimator`, the facade's default, does not, and its `TiktokenEstimator` is exact.
#[derive(Clone, Copy, Debug, Default)]
pub struct ByteEstimator;

impl TokenEstimator for ByteEstimator {
    fn estimate(&self, text: &str) -> u64 {
        (text.len() as u64).div_ceil(4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_count_a_quarter_token_each_rounded_up() {
        assert_eq!(ByteEstimator.estimate(""), 0);
        assert_eq!(ByteEstimator.estimate("abcd"), 1);
        assert_eq!(ByteEstimator.estimate("abcde"), 2);
        assert_eq!(ByteEstimator.estimate("你好"), 2, "six bytes");
    }

    #[test]
    fn images_cost_what_openai_counts_at_high_detail() {
        assert_eq!(image_tokens(640, 480), 85 + 2 * 170);
        assert_eq!(image_tokens(2048, 4096), 1105, "OpenAI's worked example");
        assert_eq!(image_tokens(0, 10), 85);
        let message = Message::execution_result("abcdefgh")
            .with_images(vec![crate::ImagePart::new("image/png", b"x", 640, 480)]);
        assert_eq!(estimate_message(&message, &ByteEstimator), 2 + 425);
        // Only execution results carry images.
        assert!(
            Message::user("hi")
                .with_images(message.images().to_vec())
                .images()
                .is_empty()
        );
    }
}

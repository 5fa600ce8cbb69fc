//! Token usage.

use serde::{Deserialize, Serialize};
use std::ops::{Add, AddAssign};

/// Tokens spent by one model call, or summed over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Usage {
    /// Tokens in the request.
    pub prompt_tokens: u64,
    /// Tokens the model generated (reasoning included).
    pub completion_tokens: u64,
    /// Their sum, as the provider reported it or as estimated.
    pub total_tokens: u64,
    /// Some of it was estimated: the provider reported no usage for at least one call (local
    /// servers often report none when streaming).
    #[serde(default)]
    pub estimated: bool,
    /// Of the prompt tokens, those the provider read from its prompt cache (OpenAI's
    /// `prompt_tokens_details.cached_tokens`), when it said.
    #[serde(default)]
    pub cached_tokens: u64,
    /// Of the completion tokens, those spent reasoning (OpenAI's
    /// `completion_tokens_details.reasoning_tokens`), when the provider said.
    #[serde(default)]
    pub reasoning_tokens: u64,
}

impl Usage {
    /// Usage whose total is the sum of its parts.
    pub fn new(prompt_tokens: u64, completion_tokens: u64) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            estimated: false,
            cached_tokens: 0,
            reasoning_tokens: 0,
        }
    }

    /// The same counts, `tokens` of the prompt's read from the provider's cache.
    pub fn with_cached(self, tokens: u64) -> Self {
        Self {
            cached_tokens: tokens,
            ..self
        }
    }

    /// The same counts, `tokens` of the completion's spent reasoning.
    pub fn with_reasoning(self, tokens: u64) -> Self {
        Self {
            reasoning_tokens: tokens,
            ..self
        }
    }

    /// These counts less `other`'s, none below zero (the estimate a later report replaces).
    pub fn saturating_sub(self, other: Usage) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens.saturating_sub(other.prompt_tokens),
            completion_tokens: self
                .completion_tokens
                .saturating_sub(other.completion_tokens),
            total_tokens: self.total_tokens.saturating_sub(other.total_tokens),
            estimated: self.estimated,
            cached_tokens: self.cached_tokens.saturating_sub(other.cached_tokens),
            reasoning_tokens: self.reasoning_tokens.saturating_sub(other.reasoning_tokens),
        }
    }

    /// The same counts with the total the provider reported (which may differ from the sum,
    /// e.g. when cached tokens are counted apart).
    pub fn with_total(self, total_tokens: u64) -> Self {
        Self {
            total_tokens,
            ..self
        }
    }

    /// The same figures, marked as estimated.
    pub fn estimate(self) -> Self {
        Self {
            estimated: true,
            ..self
        }
    }
}

impl Add for Usage {
    type Output = Usage;
    fn add(self, rhs: Usage) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens + rhs.prompt_tokens,
            completion_tokens: self.completion_tokens + rhs.completion_tokens,
            total_tokens: self.total_tokens + rhs.total_tokens,
            estimated: self.estimated || rhs.estimated,
            cached_tokens: self.cached_tokens + rhs.cached_tokens,
            reasoning_tokens: self.reasoning_tokens + rhs.reasoning_tokens,
        }
    }
}

impl AddAssign for Usage {
    fn add_assign(&mut self, rhs: Usage) {
        *self = *self + rhs;
    }
}

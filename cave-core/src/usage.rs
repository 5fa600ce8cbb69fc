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
}

impl Usage {
    /// Usage whose total is the sum of its parts.
    pub fn new(prompt_tokens: u64, completion_tokens: u64) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            estimated: false,
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
        }
    }
}

impl AddAssign for Usage {
    fn add_assign(&mut self, rhs: Usage) {
        *self = *self + rhs;
    }
}

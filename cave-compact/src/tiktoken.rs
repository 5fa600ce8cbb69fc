//! Exact token counts with tiktoken, for OpenAI models.

use crate::ScriptEstimator;
use cave_core::TokenEstimator;
use std::sync::OnceLock;
use tiktoken_rs::CoreBPE;

/// Which tiktoken encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Encoding {
    /// GPT-4o, GPT-4.1, GPT-5, the o-series.
    O200k,
    /// GPT-4, GPT-3.5.
    Cl100k,
}

static O200K: OnceLock<Option<CoreBPE>> = OnceLock::new();
static CL100K: OnceLock<Option<CoreBPE>> = OnceLock::new();

/// Exact token counts with an OpenAI tokenizer (the encodings are built into the binary; the
/// first use builds the tables, about 100 ms, once per process).
#[derive(Clone, Copy, Debug)]
pub struct TiktokenEstimator {
    encoding: Encoding,
}

impl TiktokenEstimator {
    /// Counts with `encoding`.
    pub fn new(encoding: Encoding) -> Self {
        Self { encoding }
    }

    /// The exact estimator for an OpenAI model id, if its tokenizer is known.
    pub fn for_model(model: &str) -> Option<Self> {
        let id = model
            .rsplit('/')
            .next()
            .unwrap_or(model)
            .to_ascii_lowercase();
        let o200k = [
            "gpt-4o",
            "gpt-4.1",
            "gpt-4.5",
            "gpt-5",
            "o1",
            "o3",
            "o4",
            "chatgpt-4o",
        ];
        if o200k.iter().any(|p| id.starts_with(p)) {
            return Some(Self::new(Encoding::O200k));
        }
        if id.starts_with("gpt-4") || id.starts_with("gpt-3.5") {
            return Some(Self::new(Encoding::Cl100k));
        }
        None
    }

    fn bpe(&self) -> Option<&'static CoreBPE> {
        let cell = match self.encoding {
            Encoding::O200k => &O200K,
            Encoding::Cl100k => &CL100K,
        };
        cell.get_or_init(|| match self.encoding {
            Encoding::O200k => tiktoken_rs::o200k_base().ok(),
            Encoding::Cl100k => tiktoken_rs::cl100k_base().ok(),
        })
        .as_ref()
    }
}

impl TokenEstimator for TiktokenEstimator {
    fn estimate(&self, text: &str) -> u64 {
        match self.bpe() {
            Some(bpe) => bpe.encode_ordinary(text).len() as u64,
            // The tables are compiled in; should they fail to build, estimate rather than stop.
            None => ScriptEstimator.estimate(text),
        }
    }
}

/// The best estimator for a model: exact for known OpenAI ids, the script-aware heuristic
/// otherwise.
pub fn estimator_for(model: &str) -> Box<dyn TokenEstimator> {
    match TiktokenEstimator::for_model(model) {
        Some(exact) => Box::new(exact),
        None => Box::new(ScriptEstimator),
    }
}

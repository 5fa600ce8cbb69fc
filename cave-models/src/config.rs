//! Configuration: where the model is, how to authenticate, what to send, how to retry.

use serde_json::{Map, Value as Json};
use std::fmt;
use std::time::Duration;

/// An API key. It never appears in `Debug` output, errors, logs or cassettes.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([redacted])")
    }
}

/// How failed requests are retried: exponential backoff with jitter, honouring `Retry-After`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (default 5).
    pub max_retries: u32,
    /// The first delay (default 0.5 s); it doubles each retry.
    pub base_delay: Duration,
    /// The longest delay, `Retry-After` included (default 32 s).
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 5,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(32),
        }
    }
}

impl RetryPolicy {
    /// No retries.
    pub fn none() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }

    /// The delay before retry number `retry` (0-based): the provider's `Retry-After` if it
    /// gave one (capped), else `base · 2^retry` (capped) plus 0–25 % jitter.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(wait) = retry_after {
            return wait.min(self.max_delay);
        }
        let base = self
            .base_delay
            .saturating_mul(1u32.checked_shl(retry).unwrap_or(u32::MAX))
            .min(self.max_delay);
        base + base.mul_f64(0.25 * jitter())
    }
}

/// A number in [0, 1), to spread retries of many clients apart.
fn jitter() -> f64 {
    fastrand::f64()
}

/// Settings of a chat model adapter. Build with [`ModelConfig::new`] or [`ModelConfig::from_env`].
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub(crate) model: String,
    pub(crate) base_url: Option<String>,
    pub(crate) api_key: Option<ApiKey>,
    pub(crate) organization: Option<String>,
    pub(crate) project: Option<String>,
    pub(crate) extra: Map<String, Json>,
    pub(crate) max_output_tokens: Option<u32>,
    pub(crate) stream_usage: Option<bool>,
    pub(crate) filters_asynchronously: bool,
    pub(crate) send_reasoning: bool,
    pub(crate) retry: RetryPolicy,
    pub(crate) connect_timeout: Duration,
}

impl ModelConfig {
    /// Settings for the model called `model` (e.g. `gpt-4o`, or `anthropic/claude-...` through a
    /// LiteLLM proxy).
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            base_url: None,
            api_key: None,
            organization: None,
            project: None,
            extra: Map::new(),
            max_output_tokens: None,
            stream_usage: None,
            filters_asynchronously: false,
            send_reasoning: false,
            retry: RetryPolicy::default(),
            connect_timeout: Duration::from_secs(30),
        }
    }

    /// Settings from the environment: `LLM_MODEL_ID` (required), `LLM_BASE_URL` and
    /// `LLM_API_KEY` (optional).
    pub fn from_env() -> Result<Self, ConfigError> {
        let read = |name: &'static str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let model = read("LLM_MODEL_ID").ok_or(ConfigError::MissingEnv {
            name: "LLM_MODEL_ID",
        })?;
        let mut config = Self::new(model);
        config.base_url = read("LLM_BASE_URL");
        config.api_key = read("LLM_API_KEY").map(ApiKey::new);
        Ok(config)
    }

    /// The same settings for another model id (e.g. a cheaper model for summaries).
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = model.into();
        self
    }

    /// The server's base URL, up to `/v1` (the adapter appends `/chat/completions`).
    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = Some(url.into());
        self
    }
    /// The API key, sent as a bearer token.
    pub fn api_key(mut self, key: ApiKey) -> Self {
        self.api_key = Some(key);
        self
    }
    /// The OpenAI organization header.
    pub fn organization(mut self, organization: impl Into<String>) -> Self {
        self.organization = Some(organization.into());
        self
    }
    /// The OpenAI project header.
    pub fn project(mut self, project: impl Into<String>) -> Self {
        self.project = Some(project.into());
        self
    }
    /// An extra request parameter (`temperature`, `reasoning_effort`, provider fields, …).
    pub fn param(mut self, name: impl Into<String>, value: Json) -> Self {
        self.extra.insert(name.into(), value);
        self
    }
    /// The output-token cap: sent as `max_tokens`, and declared to the agent.
    pub fn max_output_tokens(mut self, tokens: u32) -> Self {
        self.max_output_tokens = Some(tokens);
        self
    }
    /// Whether to ask for usage in the stream (`stream_options.include_usage`). Default: on; a
    /// server that refuses the option is asked again without it, and not asked again.
    pub fn stream_usage(mut self, on: bool) -> Self {
        self.stream_usage = Some(on);
        self
    }
    /// The provider may withdraw an answer after streaming it (Azure-style asynchronous
    /// content filtering): the agent then reads each answer to its end before running code.
    pub fn filters_asynchronously(mut self, yes: bool) -> Self {
        self.filters_asynchronously = yes;
        self
    }
    /// Sends each assistant turn's reasoning back as `reasoning_content` (off by default: most
    /// providers reject or ignore it; some require it on later turns).
    pub fn send_reasoning(mut self, on: bool) -> Self {
        self.send_reasoning = on;
        self
    }
    /// How failed requests are retried.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }
    /// How long connecting may take.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }
}

/// The settings do not hold together.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A required environment variable is unset or empty.
    #[error(
        "the environment variable {name} is not set: set it to the model's identifier (e.g. gpt-4o)"
    )]
    MissingEnv {
        /// The variable.
        name: &'static str,
    },
    /// The base URL is not an http(s) URL.
    #[error("the base URL {url:?} is not an http:// or https:// URL")]
    BaseUrl {
        /// The URL given.
        url: String,
    },
    /// A header value (the key, the organization, the project) holds characters HTTP headers
    /// cannot carry (a line break, say).
    #[error(
        "{name} cannot be sent as an HTTP header: check it for line breaks or other control characters"
    )]
    Header {
        /// What was given.
        name: &'static str,
    },
    /// A setting that a configured async-openai client holds was also given to the adapter.
    #[error(
        "{setting} is set on the async-openai client's configuration; leave it out of the ModelConfig"
    )]
    SetOnClient {
        /// The setting.
        setting: &'static str,
    },
    /// The HTTP client could not be built.
    #[error("could not set up the HTTP client: {message}")]
    Http {
        /// Why.
        message: String,
    },
}

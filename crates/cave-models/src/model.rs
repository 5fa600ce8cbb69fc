//! The two adapters: OpenAI-compatible servers and LiteLLM proxies.

use crate::client::{self, Client};
use crate::config::{ApiKey, ConfigError, ModelConfig};
use async_trait::async_trait;
use cave_core::{ChatRequest, DeltaStream, Model, ModelError, ModelInfo};
use std::sync::Arc;

fn build(
    config: ModelConfig,
    default_base: &str,
    default_stream_usage: bool,
) -> Result<(Arc<Client>, ModelInfo), ConfigError> {
    let base = config
        .base_url
        .clone()
        .unwrap_or_else(|| default_base.to_owned());
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(ConfigError::BaseUrl { url: base });
    }
    let http = reqwest::Client::builder()
        .connect_timeout(config.connect_timeout)
        .build()
        .map_err(|e| ConfigError::Http {
            message: e.to_string(),
        })?;
    let mut headers = Vec::new();
    if let Some(org) = &config.organization {
        headers.push(("OpenAI-Organization".to_owned(), org.clone()));
    }
    if let Some(project) = &config.project {
        headers.push(("OpenAI-Project".to_owned(), project.clone()));
    }
    let info = ModelInfo::new(config.model.clone())
        .with_max_output_tokens(config.max_output_tokens)
        .with_filters_asynchronously(config.filters_asynchronously);
    let client = Client {
        http,
        endpoint: format!("{}/chat/completions", base.trim_end_matches('/')),
        model: config.model,
        redactor: cave_core::SecretRedactor::for_api_key(
            config.api_key.as_ref().map(ApiKey::expose),
        ),
        api_key: config.api_key,
        headers,
        extra: config.extra,
        max_tokens: config.max_output_tokens,
        stream_usage: config.stream_usage.unwrap_or(default_stream_usage).into(),
        send_reasoning: config.send_reasoning,
        retry: config.retry,
        releasing: Default::default(),
    };
    Ok((Arc::new(client), info))
}

/// A chat model on any OpenAI-compatible server: OpenAI, Azure OpenAI, vLLM, llama.cpp server,
/// Ollama, DeepSeek, or a LiteLLM proxy in OpenAI mode.
///
/// Streams with usage (`stream_options.include_usage`), reads reasoning from
/// `reasoning_content` or `reasoning`, retries transient failures before any output with
/// backoff (announced to the agent, so its stall watchdog waits), and classifies failures
/// into [`cave_core::ModelErrorKind`]s. Dropping the model releases its connection pool.
#[derive(Debug, Clone)]
pub struct OpenAiModel {
    client: Arc<Client>,
    info: ModelInfo,
}

impl OpenAiModel {
    /// The model at `config.base_url` (default `https://api.openai.com/v1`).
    pub fn new(config: ModelConfig) -> Result<Self, ConfigError> {
        let (client, info) = build(config, "https://api.openai.com/v1", true)?;
        Ok(Self { client, info })
    }

    /// The model described by `LLM_MODEL_ID`, `LLM_BASE_URL` and `LLM_API_KEY`.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::new(ModelConfig::from_env()?)
    }
}

#[async_trait]
impl Model for OpenAiModel {
    async fn stream(&self, request: ChatRequest) -> Result<DeltaStream, ModelError> {
        client::stream(self.client.clone(), &request)
    }
    fn info(&self) -> ModelInfo {
        self.info.clone()
    }
}

/// A chat model behind a LiteLLM proxy: the proxy routes model names such as
/// `anthropic/claude-...` or `bedrock/...` to their providers, and its error bodies
/// (`litellm.RateLimitError: ...`, codes as strings) are classified like any other.
///
/// Usage is asked for in the stream (`stream_options.include_usage`); if the proxy or the
/// provider behind it refuses the option, the request is sent again without it, and later
/// ones leave it out (usage is then estimated). [`ModelConfig::stream_usage`] turns it off.
#[derive(Debug, Clone)]
pub struct LiteLlmModel {
    client: Arc<Client>,
    info: ModelInfo,
}

impl LiteLlmModel {
    /// The model behind the proxy at `config.base_url` (default `http://localhost:4000`).
    pub fn new(config: ModelConfig) -> Result<Self, ConfigError> {
        let (client, info) = build(config, "http://localhost:4000", true)?;
        Ok(Self { client, info })
    }
}

#[async_trait]
impl Model for LiteLlmModel {
    async fn stream(&self, request: ChatRequest) -> Result<DeltaStream, ModelError> {
        client::stream(self.client.clone(), &request)
    }
    fn info(&self) -> ModelInfo {
        self.info.clone()
    }
}

//! The two adapters: OpenAI-compatible servers and LiteLLM proxies.

use crate::client::{self, Client};
use crate::config::{ApiKey, ConfigError, ModelConfig};
use crate::transport::{Endpoint, Transport};
use async_trait::async_trait;
use cave_core::{ChatRequest, DeltaStream, Model, ModelError, ModelInfo};
use std::sync::Arc;

fn build(config: ModelConfig, default_base: &str) -> Result<(Arc<Client>, ModelInfo), ConfigError> {
    let base = config
        .base_url
        .clone()
        .unwrap_or_else(|| default_base.to_owned());
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(ConfigError::BaseUrl { url: base });
    }
    let endpoint = Endpoint::new(
        &base,
        config.api_key.as_ref(),
        config.organization.as_deref(),
        config.project.as_deref(),
    )?;
    let http = http_client(&config)?;
    let key = config.api_key.as_ref().map(ApiKey::expose);
    let redactor = cave_core::SecretRedactor::for_api_key(key);
    let api = async_openai::Client::build(http.clone(), endpoint);
    Ok(assemble(api, http, redactor, config))
}

/// The HTTP client a model's requests share (one connection pool per model).
fn http_client(config: &ModelConfig) -> Result<reqwest::Client, ConfigError> {
    reqwest::Client::builder()
        .connect_timeout(config.connect_timeout)
        .build()
        .map_err(|e| ConfigError::Http {
            message: e.to_string(),
        })
}

/// An async-openai client sending through our transport, and the settings of `config` that
/// are not where or who.
fn assemble<C: async_openai::config::Config + 'static>(
    api: async_openai::Client<C>,
    http: reqwest::Client,
    redactor: cave_core::SecretRedactor,
    config: ModelConfig,
) -> (Arc<Client>, ModelInfo) {
    let transport = Transport::new(http, redactor);
    let info = ModelInfo::new(config.model.clone())
        .with_max_output_tokens(config.max_output_tokens)
        .with_filters_asynchronously(config.filters_asynchronously);
    let client = Client {
        api: Box::new(api.with_http_service(transport.clone())),
        transport,
        model: config.model,
        extra: config.extra,
        max_tokens: config.max_output_tokens,
        stream_usage: config.stream_usage.unwrap_or(true).into(),
        send_reasoning: config.send_reasoning,
        retry: config.retry,
    };
    (Arc::new(client), info)
}

/// `client`'s configuration decides where and who; `config` may not say it again.
fn from_client<C: async_openai::config::Config + 'static>(
    client: async_openai::Client<C>,
    config: ModelConfig,
) -> Result<(Arc<Client>, ModelInfo), ConfigError> {
    use secrecy::ExposeSecret as _;
    for (set, setting) in [
        (config.base_url.is_some(), "base_url"),
        (config.api_key.is_some(), "api_key"),
        (config.organization.is_some(), "organization"),
        (config.project.is_some(), "project"),
    ] {
        if set {
            return Err(ConfigError::SetOnClient { setting });
        }
    }
    let http = http_client(&config)?;
    let key = client.config().api_key().expose_secret();
    let redactor = cave_core::SecretRedactor::for_api_key((!key.is_empty()).then_some(key));
    Ok(assemble(client, http, redactor, config))
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
        let (client, info) = build(config, "https://api.openai.com/v1")?;
        Ok(Self { client, info })
    }

    /// The model `config` names, through a configured async-openai client: an `OpenAIConfig`
    /// with its organisation, project and headers, or an `AzureConfig` with its deployment and
    /// `api-version`. The client's configuration says where and who (`config` must not set
    /// `base_url`, `api_key`, `organization` or `project`); requests go through this adapter's
    /// own HTTP transport (retries announced to the agent, `Retry-After`, typed errors, the
    /// connection kept between steps), which replaces the client's.
    ///
    /// ```no_run
    /// use async_openai::config::AzureConfig;
    /// use cave_models::{ModelConfig, OpenAiModel};
    ///
    /// let azure = AzureConfig::new()
    ///     .with_api_base("https://my-resource.openai.azure.com")
    ///     .with_deployment_id("gpt-4o")
    ///     .with_api_version("2024-10-21")
    ///     .with_api_key(std::env::var("AZURE_OPENAI_API_KEY").unwrap_or_default());
    /// let model = OpenAiModel::from_client(
    ///     async_openai::Client::with_config(azure),
    ///     ModelConfig::new("gpt-4o"),
    /// )?;
    /// # Ok::<(), cave_models::ConfigError>(())
    /// ```
    pub fn from_client<C: async_openai::config::Config + 'static>(
        client: async_openai::Client<C>,
        config: ModelConfig,
    ) -> Result<Self, ConfigError> {
        let (client, info) = from_client(client, config)?;
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
        Ok(client::stream(self.client.clone(), request))
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
        let (client, info) = build(config, "http://localhost:4000")?;
        Ok(Self { client, info })
    }
}

#[async_trait]
impl Model for LiteLlmModel {
    async fn stream(&self, request: ChatRequest) -> Result<DeltaStream, ModelError> {
        Ok(client::stream(self.client.clone(), request))
    }
    fn info(&self) -> ModelInfo {
        self.info.clone()
    }
}

//! Traces of cave-agent runs to any OpenTelemetry backend (Jaeger, Phoenix, Langfuse, Datadog,
//! Honeycomb, a collector): installs a `tracing` subscriber that exports the spans cave-agent
//! makes (named after the OpenTelemetry GenAI conventions) over OTLP/HTTP with protobuf.
//!
//! Only cave-agent's own spans are exported (targets `cave_*`): other crates' spans may carry
//! fields nobody vetted for secrets.
//!
//! ```no_run
//! let config = cave_otel::OtlpConfig::from_env()
//!     .unwrap_or_else(|| cave_otel::OtlpConfig::new("http://127.0.0.1:4318"));
//! let _traces = cave_otel::install(config)?; // flushed when dropped
//! # Ok::<(), cave_otel::OtelError>(())
//! ```

#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

/// The README's example, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::collections::HashMap;
use tracing_subscriber::layer::SubscriberExt as _;

/// Where traces go and as what service.
#[derive(Clone)]
pub struct OtlpConfig {
    /// The traces endpoint, `…/v1/traces`.
    endpoint: String,
    service_name: String,
    headers: Vec<(String, String)>,
}

impl std::fmt::Debug for OtlpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values are credentials: only their names.
        f.debug_struct("OtlpConfig")
            .field("endpoint", &self.endpoint)
            .field("service_name", &self.service_name)
            .field(
                "headers",
                &self.headers.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Why traces could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtelError {
    /// The exporter could not be built (a bad endpoint, say).
    #[error("the OTLP exporter could not be set up for {endpoint}: {message}")]
    Exporter {
        /// The endpoint.
        endpoint: String,
        /// What went wrong.
        message: String,
    },
    /// Another `tracing` subscriber is installed for the process already.
    #[error("a tracing subscriber is installed already: add the OpenTelemetry layer to it instead")]
    SubscriberTaken,
}

impl OtlpConfig {
    /// Traces to the OTLP/HTTP receiver at `base` (`http://host:4318`; `/v1/traces` is added
    /// unless the URL ends with it already), as service `cave-agent`.
    pub fn new(base: impl Into<String>) -> Self {
        let base = base.into();
        let base = base.trim_end_matches('/');
        let endpoint = if base.ends_with("/v1/traces") {
            base.to_owned()
        } else {
            format!("{base}/v1/traces")
        };
        Self {
            endpoint,
            service_name: "cave-agent".to_owned(),
            headers: Vec::new(),
        }
    }

    /// From the standard variables: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the whole URL) or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (a base), `OTEL_SERVICE_NAME`, and
    /// `OTEL_EXPORTER_OTLP_HEADERS` (`key=value,key=value`). `None` without an endpoint.
    pub fn from_env() -> Option<Self> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let mut config = match var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            Some(full) => Self {
                endpoint: full,
                ..Self::new("")
            },
            None => Self::new(var("OTEL_EXPORTER_OTLP_ENDPOINT")?),
        };
        if let Some(name) = var("OTEL_SERVICE_NAME") {
            config.service_name = name;
        }
        if let Some(headers) = var("OTEL_EXPORTER_OTLP_HEADERS") {
            for pair in headers.split(',') {
                if let Some((key, value)) = pair.split_once('=') {
                    config = config.header(key.trim(), value.trim());
                }
            }
        }
        Some(config)
    }

    /// Reports as service `name` (`service.name`).
    pub fn service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = name.into();
        self
    }

    /// Sends header `key` with every export (an API key, say; never printed).
    pub fn header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((key.into(), value.into()));
        self
    }

    /// The traces endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

/// Keeps the exporter running; dropping it sends what is left and shuts it down.
pub struct TraceGuard {
    provider: SdkTracerProvider,
}

impl std::fmt::Debug for TraceGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceGuard").finish_non_exhaustive()
    }
}

impl Drop for TraceGuard {
    fn drop(&mut self) {
        if let Err(error) = self.provider.shutdown() {
            eprintln!("cave: traces could not all be sent: {error}");
        }
    }
}

/// Exports cave-agent's spans as `config` says, from now on, for the whole process (the
/// global `tracing` subscriber). Keep the guard alive as long as runs go on.
pub fn install(config: OtlpConfig) -> Result<TraceGuard, OtelError> {
    let failed = |message: String| OtelError::Exporter {
        endpoint: config.endpoint.clone(),
        message,
    };
    let headers: HashMap<String, String> = config.headers.iter().cloned().collect();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(config.endpoint.clone())
        .with_headers(headers)
        .build()
        .map_err(|e| failed(e.to_string()))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(config.service_name.clone())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("cave-agent");
    let layer = tracing_subscriber::Layer::with_filter(
        tracing_opentelemetry::layer().with_tracer(tracer),
        tracing_subscriber::filter::filter_fn(|metadata| metadata.target().starts_with("cave_")),
    );
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::set_global_default(subscriber).map_err(|_| OtelError::SubscriberTaken)?;
    Ok(TraceGuard { provider })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_their_path_and_headers_stay_out_of_debug() {
        assert_eq!(
            OtlpConfig::new("http://127.0.0.1:4318/").endpoint(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            OtlpConfig::new("http://x:4318/v1/traces").endpoint(),
            "http://x:4318/v1/traces"
        );
        let config = OtlpConfig::new("http://x").header("authorization", "Bearer sk-otel-1234");
        let shown = format!("{config:?}");
        assert!(
            shown.contains("authorization") && !shown.contains("sk-otel-1234"),
            "{shown}"
        );
    }
}

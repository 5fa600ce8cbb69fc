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
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
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
    /// Spans could not be sent (the first reason given).
    #[error("traces: {spans} span(s) could not be sent to {endpoint}: {message}")]
    NotSent {
        /// The endpoint.
        endpoint: String,
        /// How many spans were lost (0: the exporter's shutdown failed).
        spans: usize,
        /// What went wrong first.
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
    /// `None` too when the environment turns traces off (`OTEL_SDK_DISABLED=true`,
    /// `OTEL_TRACES_EXPORTER=none`).
    pub fn from_env() -> Option<Self> {
        Self::from_env_with(None)
    }

    /// As [`from_env`](Self::from_env), with `endpoint` (a base URL, as for
    /// [`new`](Self::new)) taking the place of the environment's endpoint when given: what a
    /// command line's `--otlp URL` does. An endpoint given is used even where the environment
    /// turns traces off.
    pub fn from_env_with(endpoint: Option<String>) -> Option<Self> {
        Self::from_variables(endpoint, |name| std::env::var(name).ok())
    }

    /// [`from_env_with`](Self::from_env_with) with the variables `lookup` gives.
    fn from_variables(
        endpoint: Option<String>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Option<Self> {
        let var = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let off = var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
        let mut config = match (endpoint, var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) {
            (Some(base), _) => Self::new(base),
            (None, _) if off => return None,
            (None, Some(full)) => Self {
                endpoint: full,
                ..Self::new("")
            },
            (None, None) => Self::new(var("OTEL_EXPORTER_OTLP_ENDPOINT")?),
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

/// Keeps the exporter running. [`finish`](Self::finish) sends what is left and says what
/// could not be sent; dropping it does the same and says so on stderr.
pub struct TraceGuard {
    provider: Option<SdkTracerProvider>,
    lost: Arc<Mutex<Lost>>,
    endpoint: String,
}

impl std::fmt::Debug for TraceGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceGuard")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl TraceGuard {
    /// Sends the spans not sent yet (waiting a few seconds at most) and stops exporting;
    /// an error if any span of the process could not be sent (a receiver not there, say).
    pub fn finish(mut self) -> Result<(), OtelError> {
        self.shut_down()
    }

    fn shut_down(&mut self) -> Result<(), OtelError> {
        let Some(provider) = self.provider.take() else {
            return Ok(());
        };
        let shutdown = provider.shutdown();
        let lost = std::mem::take(&mut *self.lost.lock().unwrap_or_else(|e| e.into_inner()));
        match (lost.first_error, shutdown) {
            (Some(message), _) => Err(OtelError::NotSent {
                endpoint: self.endpoint.clone(),
                spans: lost.spans,
                message,
            }),
            (None, Err(error)) => Err(OtelError::NotSent {
                endpoint: self.endpoint.clone(),
                spans: 0,
                message: error.to_string(),
            }),
            (None, Ok(())) => Ok(()),
        }
    }
}

impl Drop for TraceGuard {
    fn drop(&mut self) {
        if let Err(error) = self.shut_down() {
            eprintln!("cave: {error}");
        }
    }
}

/// What the exporter could not send.
#[derive(Debug, Default)]
struct Lost {
    spans: usize,
    first_error: Option<String>,
}

/// The OTLP exporter, with what it failed to send counted for [`TraceGuard::finish`] (the SDK
/// itself only logs it).
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    lost: Arc<Mutex<Lost>>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        if let Err(error) = &result {
            let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
            lost.spans += spans;
            lost.first_error.get_or_insert_with(|| error.to_string());
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
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
    let lost = Arc::new(Mutex::new(Lost::default()));
    let exporter = Counted {
        inner: exporter,
        lost: lost.clone(),
    };
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
    Ok(TraceGuard {
        provider: Some(provider),
        lost,
        endpoint: config.endpoint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(endpoint: Option<&str>, vars: &[(&str, &str)]) -> Option<OtlpConfig> {
        OtlpConfig::from_variables(endpoint.map(str::to_owned), |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn the_standard_variables_are_read_as_the_specification_says() {
        assert!(from(None, &[]).is_none(), "no endpoint, no traces");
        let base = from(None, &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]).unwrap();
        assert_eq!(base.endpoint(), "http://c:4318/v1/traces");
        assert_eq!(base.service_name, "cave-agent");
        // The signal's own variable is the whole URL, and wins.
        let full = from(
            None,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:9/custom"),
                ("OTEL_SERVICE_NAME", "billing-agent"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=k1, team = a"),
            ],
        )
        .unwrap();
        assert_eq!(full.endpoint(), "http://t:9/custom");
        assert_eq!(full.service_name, "billing-agent");
        assert_eq!(
            full.headers,
            [
                ("x-api-key".to_owned(), "k1".to_owned()),
                ("team".to_owned(), "a".to_owned())
            ]
        );
        // Turned off by the environment, unless an endpoint is given explicitly.
        for off in [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ] {
            let vars = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), off];
            assert!(from(None, &vars).is_none(), "{off:?}");
            let given = from(Some("http://g:4318"), &vars).unwrap();
            assert_eq!(given.endpoint(), "http://g:4318/v1/traces");
        }
        // An endpoint given replaces the environment's; the service name still applies.
        let given = from(
            Some("http://g:4318"),
            &[
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:9/custom"),
                ("OTEL_SERVICE_NAME", "billing-agent"),
            ],
        )
        .unwrap();
        assert_eq!(given.endpoint(), "http://g:4318/v1/traces");
        assert_eq!(given.service_name, "billing-agent");
        // Blank is unset.
        assert!(from(None, &[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]).is_none());
    }

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

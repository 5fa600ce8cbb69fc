//! The server's REST API: starting, checking, interrupting, restarting and shutting down
//! kernels, over the platform's TLS (plus the CA certificates the configuration adds).

use super::{JupyterConfig, failed};
use crate::KernelError;

/// The TLS configuration for a server: the platform's certificate store, plus the CA
/// certificates the configuration gives.
pub(super) fn tls_config(
    config: &JupyterConfig,
) -> Result<std::sync::Arc<rustls::ClientConfig>, KernelError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let extra = match &config.ca_certificates {
        None => Vec::new(),
        Some(pem) => {
            let certificates = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    failed(format!(
                        "the CA certificates given (JupyterConfig::ca_certificates, --jupyter-ca) are not readable PEM: {e}"
                    ))
                })?;
            if certificates.is_empty() {
                return Err(failed(
                    "the CA certificates given (JupyterConfig::ca_certificates, --jupyter-ca) hold no certificate: give PEM text with -----BEGIN CERTIFICATE----- blocks",
                ));
            }
            certificates
        }
    };
    let builder = rustls::ClientConfig::builder();
    let verifier = rustls_platform_verifier::Verifier::new_with_extra_roots(
        extra,
        builder.crypto_provider().clone(),
    )
    .map_err(|e| failed(format!("no TLS configuration for {}: {e}", config.url)))?;
    Ok(std::sync::Arc::new(
        builder
            .dangerous()
            .with_custom_certificate_verifier(std::sync::Arc::new(verifier))
            .with_no_client_auth(),
    ))
}

/// The server's REST API.
#[derive(Clone)]
pub(super) struct Gateway {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    env: serde_json::Map<String, serde_json::Value>,
}

impl Gateway {
    pub(super) fn new(config: &JupyterConfig) -> Result<Self, KernelError> {
        let http = match &config.ca_certificates {
            None => reqwest::Client::new(),
            Some(_) => reqwest::Client::builder()
                .tls_backend_preconfigured(rustls::ClientConfig::clone(&*tls_config(config)?))
                .build()
                .map_err(|e| failed(format!("no HTTP client for {}: {e}", config.url)))?,
        };
        Ok(Self {
            http,
            base: config.url.clone(),
            token: config.token.clone(),
            env: config
                .env
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect(),
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self
            .http
            .request(method, format!("{}/api/{path}", self.base));
        match &self.token {
            Some(token) => request.header("Authorization", format!("token {token}")),
            None => request,
        }
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<reqwest::Response, KernelError> {
        let response = request
            .send()
            .await
            .map_err(|e| {
                let cause = cave_core::error_chain(&e);
                let hint = if cause.contains("invalid peer certificate") {
                    " (if an internal CA signed the server's certificate, give it: JupyterConfig::ca_certificates, or --jupyter-ca FILE for cave)"
                } else {
                    ""
                };
                failed(format!(
                    "{what}: could not reach {}: {cause}{hint}",
                    self.base
                ))
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.text().await.unwrap_or_default();
        let hint = match status.as_u16() {
            401 | 403 => {
                " (a missing or wrong token: JupyterConfig::token, or JUPYTER_TOKEN for cave)"
            }
            404 => " (no such kernel or kernel spec on this server)",
            _ => "",
        };
        Err(failed(format!(
            "{what}: {} answered {status}{hint}: {}",
            self.base,
            cave_core::shorten(&body, 300).0
        )))
    }

    /// Starts a kernel of spec `name`; its id.
    pub(super) async fn start(&self, name: &str) -> Result<String, KernelError> {
        let request = self
            .request(reqwest::Method::POST, "kernels")
            .json(&serde_json::json!({ "name": name, "env": self.env }));
        let response = self.send(request, "starting a kernel").await?;
        let kernel: serde_json::Value = response
            .json()
            .await
            .map_err(|e| failed(format!("starting a kernel: an unreadable answer: {e}")))?;
        kernel["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| failed("starting a kernel: the answer had no kernel id"))
    }

    /// Checks that kernel `id` exists.
    pub(super) async fn check(&self, id: &str) -> Result<(), KernelError> {
        let request = self.request(reqwest::Method::GET, &format!("kernels/{id}"));
        self.send(request, &format!("attaching to kernel {id}"))
            .await
            .map(drop)
    }

    /// Interrupts kernel `id` (what it runs gets `KeyboardInterrupt`).
    pub(super) async fn interrupt(&self, id: &str) {
        let request = self.request(reqwest::Method::POST, &format!("kernels/{id}/interrupt"));
        if let Err(error) = self.send(request, "interrupting the kernel").await {
            tracing::warn!(%error, "the kernel could not be interrupted");
        }
    }

    /// Restarts kernel `id` (its state is lost).
    pub(super) async fn restart(&self, id: &str) {
        let request = self.request(reqwest::Method::POST, &format!("kernels/{id}/restart"));
        if let Err(error) = self.send(request, "restarting the kernel").await {
            tracing::warn!(%error, "the kernel could not be restarted");
        }
    }

    /// Shuts kernel `id` down.
    pub(super) async fn shutdown(&self, id: &str) {
        let request = self.request(reqwest::Method::DELETE, &format!("kernels/{id}"));
        if let Err(error) = self.send(request, "shutting the kernel down").await {
            tracing::warn!(%error, "the kernel could not be shut down");
        }
    }
}

//! A pool's template: a worker that ran the pool's setup code once, forked for every worker
//! the pool hands out, so that a session starts with the setup's imports and values in the
//! time a fork takes instead of the interpreter's start and the imports.

use crate::KernelError;
use crate::child::ChildTransport;
use crate::config::{KernelConfig, WorkerSettings};
use crate::link::{Started, Transport};
use crate::pool::{KernelPool, PoolConfig};
use crate::runtime::KernelRuntime;
use async_trait::async_trait;
use cave_core::{DiscardOutput, Runtime};
use std::sync::Arc;

// Here rather than in `pool.rs`: the pool's workers may be forks of a runtime, and the runtime
// takes workers from the pool.
impl KernelPool {
    /// A pool of child workers with `config`'s interpreter, limits and sandbox (each worker in a
    /// work directory of its own). Nothing starts until [`fill`](Self::fill) or the first take.
    /// With [`PoolConfig::setup`], the workers are forks of a template that ran it.
    pub fn new(config: KernelConfig, pool: PoolConfig) -> Result<Self, KernelError> {
        let Some(setup) = pool.setup.clone() else {
            let transport = ChildTransport::per_worker(config)?;
            return Ok(Self::with_transport(Arc::new(transport), pool));
        };
        let settings = config.settings();
        // The template keeps no spare: it is started once, and again only if it dies.
        let template =
            KernelRuntime::with_transport(ChildTransport::per_worker(config.spare(false))?);
        let transport = TemplateTransport::new(template, setup, settings);
        Ok(Self::with_transport(Arc::new(transport), pool))
    }
}

/// Starts workers as branches of a template runtime that ran `setup`.
pub(crate) struct TemplateTransport {
    template: KernelRuntime,
    setup: String,
    settings: WorkerSettings,
    /// The process of the template the setup ran in (a template that died is started, and set
    /// up, again).
    set_up_in: tokio::sync::Mutex<Option<u32>>,
}

impl TemplateTransport {
    /// Forks of `template` once it has run `setup`; the workers get `settings`.
    pub(crate) fn new(template: KernelRuntime, setup: String, settings: WorkerSettings) -> Self {
        Self {
            template,
            setup,
            settings,
            set_up_in: tokio::sync::Mutex::new(None),
        }
    }

    /// The template's process, set up.
    async fn set_up(&self) -> Result<(), KernelError> {
        let mut set_up_in = self.set_up_in.lock().await;
        let running = self.template.pid().await;
        if running.is_some() && *set_up_in == running {
            return Ok(());
        }
        let failed = |why: String| KernelError::Start {
            message: format!("the pool's setup code failed in its template: {why}"),
        };
        let out = self
            .template
            .execute(&self.setup, &DiscardOutput)
            .await
            .map_err(|e| failed(e.to_string()))?;
        if let Some(error) = &out.error {
            let said = cave_core::shorten(out.output.trim_end(), 2000).0;
            return Err(failed(format!(
                "{}: {}\n{said}",
                error.python_type, error.message
            )));
        }
        *set_up_in = self.template.pid().await;
        Ok(())
    }
}

#[async_trait]
impl Transport for TemplateTransport {
    fn settings(&self) -> &WorkerSettings {
        &self.settings
    }

    async fn start(&self) -> Result<Started, KernelError> {
        self.set_up().await?;
        let (started, ()) =
            self.template
                .fork_worker(|_, _| ())
                .await
                .map_err(|e| KernelError::Start {
                    message: format!("the pool's template could not be forked: {e}"),
                })?;
        Ok(started)
    }

    fn python(&self) -> Option<&std::path::Path> {
        self.template.python()
    }

    fn copies_workers(&self) -> bool {
        true
    }
}

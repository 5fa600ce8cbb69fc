//! Kernel runtimes whose kernels the test's gateway (`support::gateway`) starts.

use crate::support::Gateway;
use cave_runtime_kernel::{JupyterConfig, KernelRuntime};

/// Where the runtime finds the test's gateway.
pub fn config(gateway: &Gateway) -> JupyterConfig {
    JupyterConfig::new(gateway.url.clone()).token(gateway.token.clone())
}

/// A kernel runtime that starts its kernels at the test's gateway.
pub fn runtime(gateway: &Gateway) -> KernelRuntime {
    runtime_on(config(gateway))
}

/// A kernel runtime (no spare) on the Jupyter server `jupyter` describes.
pub fn runtime_on(jupyter: JupyterConfig) -> KernelRuntime {
    KernelRuntime::jupyter(jupyter.spare(false))
}

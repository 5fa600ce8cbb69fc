//! cave-agent's process-isolated runtime: Python in a child process, or in a Jupyter kernel.
//!
//! [`KernelRuntime`] implements the core's `Runtime` on a worker in an interpreter it starts
//! as a program (this crate never links libpython): a child of this process
//! ([`KernelRuntime::with_config`], [`KernelConfig`]), or, with the feature `jupyter`, a
//! kernel behind a Jupyter server (`KernelRuntime::jupyter`, `JupyterConfig`). The child runs the same executor as the in-process
//! runtime, so a cell gives the same output, echo and traceback on either. What the model's
//! code does to its process (a segfault, `os._exit`, exhausting memory, ignoring an interrupt)
//! ends only that process: the execution says what happened, and the next request gets a
//! fresh one with every registered resource restored.
//!
//! ```no_run
//! use cave_core::{DiscardOutput, Runtime};
//! use cave_runtime_kernel::KernelRuntime;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = KernelRuntime::new()?;
//! let execution = runtime.execute("import os; os._exit(3)", &DiscardOutput).await?;
//! assert!(execution.state_lost);
//! let execution = runtime.execute("1 + 1", &DiscardOutput).await?;
//! assert_eq!(execution.output, "2\n");
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

mod bytecode;
mod cgroup;
mod checkpoint;
mod child;
mod config;
mod containment;
mod environment;
mod fork;
mod guard;
#[cfg(feature = "jupyter")]
mod jupyter;
mod link;
mod marshal;
mod need;
mod pool;
mod runtime;
mod sandbox;
mod spec;
mod stale;
mod template;
mod worker;

pub use cave_egress::{Allowlist, AllowlistError, EgressObserver, EgressRecord};
pub use checkpoint::Checkpoint;
pub use config::{
    DEFAULT_FILE_SIZE, DEFAULT_MAX_FRAME, DEFAULT_OPEN_FILES, DEFAULT_PROCESSES,
    DEFAULT_START_TIMEOUT, KernelConfig, Limits, PreExec, WorkerSettings,
};
pub use containment::support as containment_support;
#[cfg(feature = "jupyter")]
pub use jupyter::JupyterConfig;
pub use need::Need;
pub use pool::{KernelPool, PoolConfig, PoolStats};
pub use runtime::{KernelRuntime, PROCESS_DIED};
pub use sandbox::{Layer, LayerState, Sandbox, egress_support, support as sandbox_support};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The kernel runtime could not start or talk to its process.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// No interpreter was given and none was found.
    #[error(
        "no Python interpreter found: set CAVE_PYTHON, activate a virtualenv, put python3 on PATH, or give KernelConfig::python"
    )]
    NoPython,
    /// The child did not start.
    #[error("could not start the Python process: {message}")]
    Start {
        /// What went wrong.
        message: String,
    },
    /// A message exceeds the frame limit.
    #[error("{message}")]
    TooLarge {
        /// Which message, how large, and the limit.
        message: String,
    },
    /// A value the child could not load (nested too deep, an unhashable dict key).
    #[error("{message}")]
    Invalid {
        /// What is wrong.
        message: String,
    },
    /// The process ended before it answered.
    #[error("the Python process ended before it answered")]
    Died,
    /// A checkpoint could not be made or returned to.
    #[error("{message}")]
    Checkpoint {
        /// What went wrong, and what to do.
        message: String,
    },
    /// A branch could not be forked.
    #[error("{message}")]
    Fork {
        /// What went wrong, and what to do.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use cave_core::{DiscardOutput, Runtime};

    /// Whether the worker started with `config` loaded its own two modules compiled.
    async fn loaded_compiled(config: crate::KernelConfig) -> String {
        let runtime = crate::KernelRuntime::with_config(config.spare(false)).expect("python");
        let out = runtime
            .execute(
                "import sys\nprint(sys.modules['cave_executor'].__cave_precompiled__, sys.modules['cave_kernel'].__cave_precompiled__)\nprint(1 + 1)",
                &DiscardOutput,
            )
            .await
            .expect("runs");
        runtime.stop().await;
        out.output
    }

    /// The worker takes compiled code only if its magic number (the bytecode's format) is its
    /// interpreter's: a cache file the host reads (whole, the user's, of the right key) whose
    /// code is labelled with another magic is not loaded but compiled from source (bytecode of
    /// another format can crash an interpreter), and the worker runs. The same code with its
    /// own magic is taken: the probe tells the two apart. (Here, not in `bytecode.rs`: it
    /// starts a runtime, which starts with that module.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn code_of_another_magic_number_is_compiled_afresh_by_the_worker() {
        // The real executable, as the transport resolves it (the cache's key names the file).
        let python = std::process::Command::new("python3")
            .args([
                "-c",
                "import os, sys; print(os.path.realpath(sys.executable))",
            ])
            .output()
            .expect("python3 on PATH");
        let python = std::path::PathBuf::from(String::from_utf8(python.stdout).unwrap().trim());
        let root = cave_testing::TestDir::new("bytecode-magic");
        let config = |dir: std::path::PathBuf| {
            crate::KernelConfig::new()
                .python(&python)
                .bytecode_cache(Some(dir))
        };
        let other = root.join("other-magic");
        crate::bytecode::store_relabelled(&other, &python, |magic| magic[0] ^= 0x55);
        assert_eq!(loaded_compiled(config(other)).await, "False False\n2\n");
        let own = root.join("own-magic");
        crate::bytecode::store_relabelled(&own, &python, |_| {});
        assert_eq!(loaded_compiled(config(own)).await, "True True\n2\n");
    }
}

//! cave-agent's in-process runtime: the model's code runs in CPython embedded in this process.
//!
//! Nothing is copied: a host function is called directly, a host object's methods run on the
//! host's own object, and a Python object such as a pandas DataFrame stays one object that
//! both the model's code and the host see.
//!
//! # Brief overview
//!
//! - [`InProcRuntime`] implements [`cave_core::Runtime`]: one namespace and one thread per
//!   runtime, output captured per execution, tracebacks that show the cell's own lines.
//! - [`python_environment`] tells which Python environment the interpreter uses
//!   (`CAVE_PYTHON`, then `VIRTUAL_ENV`, then `python3` on `PATH`).
//! - The cell executor itself is Python, shared with the kernel runtime (`cave-python`).
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use cave_core::{DiscardOutput, Resources, Runtime, RuntimeExt, Value, Variable};
//! use cave_runtime_inproc::InProcRuntime;
//!
//! let runtime = InProcRuntime::new()?;
//! runtime.register(Resources::new().variable(Variable::new("numbers", Value::List(vec![Value::Int(3), Value::Int(1)])))).await?;
//! let run = runtime.execute("numbers.sort()\nnumbers", &DiscardOutput).await?;
//! assert_eq!(run.output, "[1, 3]\n");
//! let sorted: Vec<i64> = runtime.retrieve_as("numbers").await?;
//! assert_eq!(sorted, [1, 3]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! # Interrupting
//!
//! [`Runtime::interrupter`](cave_core::Runtime::interrupter) raises `KeyboardInterrupt` in the
//! running cell. Pure-Python code stops within milliseconds; code blocked in a C call (such as
//! `time.sleep` or a socket read) stops only when that call returns. For a guaranteed stop,
//! use the kernel runtime, which can kill its process.
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

mod convert;
mod env;
mod interrupt;
mod runtime;
mod stdio;
mod worker;

pub use env::{
    EnvironmentSource, PythonEnvironment, python_environment, send_stray_output_to_stderr,
};
pub use pyo3;
pub use runtime::InProcRuntime;
pub use stdio::{CapturedStreams, StdioCapture};

use std::path::PathBuf;

/// The interpreter could not be set up.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InProcError {
    /// The selected interpreter could not be asked for its paths.
    #[error(
        "could not read the Python environment of {interpreter}: {message} (set CAVE_PYTHON to a working python3)"
    )]
    Environment {
        /// The interpreter.
        interpreter: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The selected interpreter is another Python version than the embedded one.
    #[error(
        "{interpreter} is Python {selected}, but this program embeds Python {embedded}: select a {embedded} \
interpreter with CAVE_PYTHON or VIRTUAL_ENV, or rebuild with PYO3_PYTHON pointing at a {selected} interpreter"
    )]
    VersionMismatch {
        /// The selected interpreter.
        interpreter: PathBuf,
        /// Its version.
        selected: String,
        /// The embedded version.
        embedded: String,
    },
    /// The program loaded another libpython than the selected interpreter's: its `sys.path`
    /// would be used with another build's library (the loader found a system libpython
    /// before the configured one).
    #[error(
        "this program loaded {loaded}, but the selected interpreter {interpreter} uses the libpython in {libdir}: \
the loader found another library first. Give the program a run path to the right one: in its build.rs, \
`fn main() {{ pyo3_build_config::add_libpython_rpath_link_args(); }}` with pyo3-build-config (the version cave-agent uses) \
under [build-dependencies]; or select a matching interpreter with CAVE_PYTHON"
    )]
    LibpythonMismatch {
        /// The libpython the program loaded.
        loaded: PathBuf,
        /// The selected interpreter.
        interpreter: PathBuf,
        /// Where its libpython lives.
        libdir: String,
    },
    /// The embedded libpython is one the runtime does not support (too old, or a
    /// free-threaded build).
    #[error(
        "this program embeds Python {embedded}, which the in-process runtime does not support: {reason} \
(rebuild with PYO3_PYTHON pointing at a supported interpreter, or use the kernel runtime)"
    )]
    UnsupportedPython {
        /// The embedded version (`3.13.1t` for a free-threaded build).
        embedded: String,
        /// Why it is refused.
        reason: String,
    },
    /// Starting the interpreter or the runtime failed.
    #[error("could not start the embedded Python runtime: {message}")]
    Setup {
        /// What went wrong.
        message: String,
    },
}

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

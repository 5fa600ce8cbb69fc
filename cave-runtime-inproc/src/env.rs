//! Which Python environment the embedded interpreter sees, and starting the interpreter.

use crate::InProcError;
use cave_python::report::{self, Reported};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyModule};
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub use cave_python::EnvironmentSource;

/// The Python environment the runtime uses: its packages are the ones code can import.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PythonEnvironment {
    /// Where the choice came from.
    pub source: EnvironmentSource,
    /// The interpreter asked for its paths (`sys.executable` inside the runtime).
    pub executable: Option<PathBuf>,
    /// `sys.prefix` of that interpreter (a virtualenv's directory, for a virtualenv).
    pub prefix: Option<String>,
    /// The import path code gets.
    pub sys_path: Vec<String>,
    /// The embedded interpreter's version, e.g. `3.11.7`.
    pub embedded_version: String,
}

static ENVIRONMENT: OnceLock<Result<PythonEnvironment, InProcError>> = OnceLock::new();
static EXECUTOR: OnceLock<Py<PyModule>> = OnceLock::new();

/// Starts the interpreter once per process, set up for the selected environment, and returns
/// that environment.
///
/// The environment is chosen, in order, from `CAVE_PYTHON` (a path to an interpreter), an
/// active virtualenv (`VIRTUAL_ENV`), or `python3` on `PATH`. That interpreter is asked for its
/// `sys.path`, which the embedded interpreter then uses, so a package installed with
/// `python3 -m pip install` (or into the virtualenv) can be imported. Its `major.minor` must be
/// the embedded one's.
pub fn python_environment() -> Result<&'static PythonEnvironment, InProcError> {
    ENVIRONMENT
        .get_or_init(initialize)
        .as_ref()
        .map_err(Clone::clone)
}

/// The executor module (the interpreter is initialized first).
pub(crate) fn executor(py: Python<'_>) -> Result<&Bound<'_, PyModule>, InProcError> {
    python_environment()?;
    EXECUTOR
        .get()
        .map(|m| m.bind(py))
        .ok_or_else(|| InProcError::Setup {
            message: "the executor module was not loaded".to_owned(),
        })
}

/// The libpython this process loaded, from its memory map (Linux; `None` elsewhere or if not
/// found, e.g. a statically linked interpreter).
fn loaded_libpython() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .map(PathBuf::from)
        .find(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libpython3") && n.contains(".so"))
        })
}

/// Whether `dir` is `expected`, links resolved.
fn same_dir(dir: Option<&Path>, expected: &Path) -> bool {
    let resolved = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_owned());
    dir.is_some_and(|d| resolved(d) == resolved(expected))
}

fn ask(executable: &Path) -> Result<Reported, InProcError> {
    cave_python::report::ask(executable).map_err(|message| InProcError::Environment {
        interpreter: executable.to_owned(),
        message,
    })
}

fn initialize() -> Result<PythonEnvironment, InProcError> {
    let probe = cave_python::find_interpreter();
    let reported = match &probe {
        Some(p) => Some(report::report(
            report::default_dir().as_deref(),
            &p.executable,
            ask,
        )?),
        None => None,
    };
    Python::initialize();
    Python::attach(|py| {
        let setup = |e: PyErr| InProcError::Setup {
            message: e.to_string(),
        };
        let sys = py.import("sys").map_err(setup)?;
        let info = sys.getattr("version_info").map_err(setup)?;
        let embedded: (u32, u32) = (
            info.getattr("major")
                .and_then(|v| v.extract())
                .map_err(setup)?,
            info.getattr("minor")
                .and_then(|v| v.extract())
                .map_err(setup)?,
        );
        let embedded_version: String = py
            .import("platform")
            .and_then(|p| p.call_method0("python_version"))
            .and_then(|v| v.extract())
            .map_err(setup)?;
        let free_threaded = sys
            .getattr("abiflags")
            .and_then(|f| f.extract::<String>())
            .is_ok_and(|flags| flags.contains('t'));
        let (oldest_major, oldest_minor) = cave_python::MIN_PYTHON;
        if embedded < cave_python::MIN_PYTHON {
            return Err(InProcError::UnsupportedPython {
                embedded: embedded_version,
                reason: format!("Python {oldest_major}.{oldest_minor} or later is needed"),
            });
        }
        if free_threaded {
            return Err(InProcError::UnsupportedPython {
                embedded: format!("{embedded_version}t"),
                reason: cave_python::FREE_THREADED_REFUSAL.to_owned(),
            });
        }
        let mut environment = PythonEnvironment {
            source: EnvironmentSource::Embedded,
            executable: None,
            prefix: None,
            sys_path: sys
                .getattr("path")
                .and_then(|p| p.extract())
                .map_err(setup)?,
            embedded_version,
        };
        if let (Some(probe), Some(reported)) = (probe, reported) {
            if reported.version != embedded {
                return Err(InProcError::VersionMismatch {
                    interpreter: probe.executable,
                    selected: format!("{}.{}", reported.version.0, reported.version.1),
                    embedded: format!("{}.{}", embedded.0, embedded.1),
                });
            }
            if let Some(loaded) = loaded_libpython()
                && !reported.libdir.is_empty()
                && !same_dir(loaded.parent(), Path::new(&reported.libdir))
            {
                return Err(InProcError::LibpythonMismatch {
                    loaded,
                    interpreter: reported.executable,
                    libdir: reported.libdir,
                });
            }
            // The interpreter's own path (PYTHONPATH, site-packages, user site), without the
            // current directory entry that `-c` adds.
            let path = reported.sys_path;
            sys.setattr("path", PyList::new(py, &path).map_err(setup)?)
                .map_err(setup)?;
            sys.setattr("executable", reported.executable.to_string_lossy().as_ref())
                .map_err(setup)?;
            sys.setattr("prefix", reported.prefix.as_str())
                .map_err(setup)?;
            environment.source = probe.source;
            environment.executable = Some(reported.executable);
            environment.prefix = Some(reported.prefix);
            environment.sys_path = path;
        }
        let source = CString::new(cave_python::EXECUTOR).map_err(|e| InProcError::Setup {
            message: e.to_string(),
        })?;
        let file = CString::new(cave_python::EXECUTOR_FILE).map_err(|e| InProcError::Setup {
            message: e.to_string(),
        })?;
        let name = CString::new(cave_python::EXECUTOR_MODULE).map_err(|e| InProcError::Setup {
            message: e.to_string(),
        })?;
        let module = PyModule::from_code(py, &source, &file, &name).map_err(setup)?;
        // The runtime's `write` is its own, not a cell's: threads a cell starts keep it.
        module.call_method1("install", (true,)).map_err(setup)?;
        // Runtimes share this interpreter and run cells on threads of their own, and the
        // standard library reads `typing` from `sys.modules` without taking the import lock
        // (dataclasses with postponed annotations): while one runtime imported it first, another
        // saw a half-initialised module. Imported here, before any cell runs.
        py.import("typing").map_err(setup)?;
        let _ = EXECUTOR.set(module.unbind());
        tracing::info!(source = ?environment.source, executable = ?environment.executable, "embedded Python ready");
        Ok(environment)
    })
}

/// Sends output written outside any execution (by threads a cell started, or by tasks that
/// outlived their cell) to stderr instead of stdout, for programs whose stdout carries a
/// machine-readable stream. Output of executions is captured either way.
pub fn send_stray_output_to_stderr() -> Result<(), InProcError> {
    Python::attach(|py| {
        executor(py)?
            .call_method0("send_stray_output_to_stderr")
            .map(drop)
            .map_err(|e| InProcError::Setup {
                message: e.to_string(),
            })
    })
}

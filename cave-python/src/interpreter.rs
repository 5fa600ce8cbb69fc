//! Which Python interpreter a runtime uses: one discovery for every runtime.

use std::path::{Path, PathBuf};

/// Where the selected interpreter came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EnvironmentSource {
    /// The interpreter named by `CAVE_PYTHON`.
    CavePython,
    /// The active virtualenv (`VIRTUAL_ENV`).
    VirtualEnv,
    /// `python3` found on `PATH`.
    Path,
    /// No interpreter could be asked: the embedded interpreter's own paths.
    Embedded,
    /// A path the host gave explicitly.
    Explicit,
}

/// An interpreter found by [`find_interpreter`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Interpreter {
    /// Where the choice came from.
    pub source: EnvironmentSource,
    /// The program to run.
    pub executable: PathBuf,
}

/// The interpreter the runtimes use, in order: `CAVE_PYTHON` (a path to an interpreter), the
/// active virtualenv (`VIRTUAL_ENV`, when it has `bin/python`), or `python3` on `PATH`.
pub fn find_interpreter() -> Option<Interpreter> {
    if let Some(path) = std::env::var_os("CAVE_PYTHON").filter(|p| !p.is_empty()) {
        return Some(Interpreter {
            source: EnvironmentSource::CavePython,
            executable: PathBuf::from(path),
        });
    }
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV").filter(|p| !p.is_empty()) {
        let python = Path::new(&venv).join("bin").join("python");
        if python.exists() {
            return Some(Interpreter {
                source: EnvironmentSource::VirtualEnv,
                executable: python,
            });
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("python3"))
        .find(|candidate| candidate.is_file())
        .map(|executable| Interpreter {
            source: EnvironmentSource::Path,
            executable,
        })
}

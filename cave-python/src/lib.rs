//! The Python that cave-agent's runtimes run, as embedded sources, and the interpreter they
//! run it with (found and questioned as a child process: no libpython is linked).
//!
//! Both runtimes (in-process and kernel) load the same executor, so the same cell gives the
//! same output on either. The module runs cells (`run_cell`: compile with `ast`, echo a
//! trailing expression, allow top-level `await`, capture output per execution, format
//! tracebacks that show the cell's lines and hide the executor's), and builds the Python side
//! of injected resources (`make_function`, `make_record`, `make_enum`, `make_object`) with real
//! signatures, so a bad call raises Python's own `TypeError`.
//!
//! ```
//! assert!(cave_python::EXECUTOR.contains("def run_cell("));
//! assert_eq!(cave_python::EXECUTOR_MODULE, "cave_executor");
//! ```
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

pub mod exports;
mod interpreter;
pub mod report;
mod trailing;

pub use interpreter::{EnvironmentSource, Interpreter, find_interpreter};
pub use trailing::{Trailing, executor_split, trailing};

/// The oldest Python the runtimes run, as `(major, minor)`: the kernel worker refuses an
/// older interpreter when it starts, the in-process runtime an older libpython when it
/// initializes, and `cargo xtask test --pythons` tests every version from this one up.
pub const MIN_PYTHON: (u32, u32) = (3, 9);

/// Why a free-threaded build (3.13t, `sys.abiflags` containing `t`) is refused: the workers
/// and the host objects assume the GIL serializes the interpreter, and no such build could
/// be tested here.
pub const FREE_THREADED_REFUSAL: &str = "free-threaded builds of Python (3.13t and later) are not supported yet: use the standard build of the same version";

/// The executor module's source.
pub const EXECUTOR: &str = include_str!("../python/cave_executor.py");

/// The name the executor module is loaded under.
pub const EXECUTOR_MODULE: &str = "cave_executor";

/// The file name the executor is compiled with; its frames are hidden from tracebacks.
pub const EXECUTOR_FILE: &str = "<cave-executor>";

/// The kernel worker's source: the program a child interpreter runs to serve the kernel
/// runtime (frames over a socket, cells through the executor, host calls as proxies).
pub const KERNEL: &str = include_str!("../python/cave_kernel.py");

/// The name the kernel worker module is loaded under.
pub const KERNEL_MODULE: &str = "cave_kernel";

/// The file name the kernel worker is compiled with; its frames are hidden from tracebacks.
pub const KERNEL_FILE: &str = "<cave-kernel>";

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    /// The sources use no syntax newer than [`MIN_PYTHON`](super::MIN_PYTHON), the oldest the
    /// runtimes run: checked by a real `python3` parsing them with that `feature_version`.
    #[test]
    fn the_sources_parse_as_the_oldest_python() {
        let (major, minor) = super::MIN_PYTHON;
        let check = format!(
            "import ast, sys\nfor path in sys.argv[1:]:\n    ast.parse(open(path).read(), path, feature_version=({major}, {minor}))\n"
        );
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
        let status = std::process::Command::new("python3")
            .args(["-c", &check])
            .arg(format!("{dir}/cave_executor.py"))
            .arg(format!("{dir}/cave_kernel.py"))
            .status()
            .expect("python3 runs");
        assert!(status.success());
    }
}

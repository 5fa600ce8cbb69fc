//! The Python that cave-agent's runtimes run, as embedded sources: data, no libpython.
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

/// The executor module's source.
pub const EXECUTOR: &str = include_str!("../python/cave_executor.py");

/// The name the executor module is loaded under.
pub const EXECUTOR_MODULE: &str = "cave_executor";

/// The file name the executor is compiled with; its frames are hidden from tracebacks.
pub const EXECUTOR_FILE: &str = "<cave-executor>";

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

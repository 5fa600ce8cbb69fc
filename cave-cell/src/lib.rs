//! What every cave-agent runtime does around a running cell, written once.
//!
//! cave-core's [`Runtime`](cave_core::Runtime) says what a runtime does; this crate is how
//! the runtimes (in-process, kernel, the MCP session server) do the part they share:
//!
//! - [`CellOutput`]: a running cell's output, sent live and held up to a cap (its beginning
//!   and end, the middle counted: a printing loop cannot grow the host), and with an
//!   [`OutputSpool`] written whole to a file past that cap, handed back as the execution's
//!   [`SpooledOutput`](cave_core::SpooledOutput) for `_output_N`; [`CappedOutput`], the capped
//!   text itself; [`StrayOutput`], what is written while no cell runs, for the next cell.
//! - [`CellLimits`]: the bounds on a cell's output, one set for every runtime.
//! - [`run_host_call`]: a host call a cell makes, in its `execute_tool` span under the cell's,
//!   with [`show_from_host`] reaching the cell's output and a panic turned into the cell's
//!   `RuntimeError`.
//!
//! ```
//! use cave_cell::CellOutput;
//!
//! let mut output = CellOutput::new(16, None);
//! output.push(&"x".repeat(100));
//! let (text, spooled) = output.finish();
//! assert!(text.starts_with("xxxxxxxx") && text.len() < 400, "{text}");
//! assert!(spooled.is_none(), "no spool was given");
//! ```
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

mod host_call;
mod limits;
mod output;

pub use host_call::{HostCallCell, run_host_call, show_from_host};
pub use limits::CellLimits;
pub use output::{
    CappedOutput, CellOutput, DEFAULT_MAX_CELL_OUTPUT, OutputSpool, STRAY_OUTPUT_CAP, StrayOutput,
};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! The bounds on one cell's output, the same for every runtime.

use crate::DEFAULT_MAX_CELL_OUTPUT;
use cave_core::{DEFAULT_MAX_DISPLAY, DEFAULT_MAX_HELD_OUTPUT};

/// How much of one cell's output a runtime holds, keeps and shows: one set of bounds that the
/// in-process runtime, the kernel runtime and its Jupyter transport all take, with one set of
/// defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CellLimits {
    /// The output of one cell the host holds, in bytes: past it, the beginning and the end
    /// are kept and the middle is counted in a note. Default:
    /// [`DEFAULT_MAX_HELD_OUTPUT`](cave_core::DEFAULT_MAX_HELD_OUTPUT) (8 MiB).
    pub max_output: usize,
    /// The output of one cell kept whole, in bytes: past `max_output` it goes to a file as it
    /// comes and is bound whole to `_output_N`; past this the rest is dropped and counted.
    /// Default: [`DEFAULT_MAX_CELL_OUTPUT`] (1 GiB).
    pub max_cell_output: u64,
    /// The largest form of an item a cell shows (a figure's PNG, a table's HTML), in bytes:
    /// larger forms are left out and named. Default:
    /// [`DEFAULT_MAX_DISPLAY`](cave_core::DEFAULT_MAX_DISPLAY) (16 MiB).
    pub max_display: usize,
}

impl Default for CellLimits {
    fn default() -> Self {
        Self {
            max_output: DEFAULT_MAX_HELD_OUTPUT,
            max_cell_output: DEFAULT_MAX_CELL_OUTPUT,
            max_display: DEFAULT_MAX_DISPLAY,
        }
    }
}

impl CellLimits {
    /// Sets how much of one cell's output the host holds, in bytes.
    pub fn max_output(mut self, bytes: usize) -> Self {
        self.max_output = bytes;
        self
    }
    /// Sets how much of one cell's output is kept whole, in bytes.
    pub fn max_cell_output(mut self, bytes: u64) -> Self {
        self.max_cell_output = bytes;
        self
    }
    /// Sets the largest form of a display item, in bytes.
    pub fn max_display(mut self, bytes: usize) -> Self {
        self.max_display = bytes;
        self
    }
    /// What a cell's [`CellOutput`](crate::CellOutput) holds: `max_output`, never above what
    /// is kept whole.
    pub fn held(&self) -> usize {
        self.max_output
            .min(usize::try_from(self.max_cell_output).unwrap_or(usize::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_held_never_exceeds_what_is_kept() {
        let limits = CellLimits::default();
        assert_eq!(limits.held(), DEFAULT_MAX_HELD_OUTPUT);
        assert_eq!(limits.max_cell_output(1000).held(), 1000);
        assert_eq!(limits.max_output(10).held(), 10);
    }
}

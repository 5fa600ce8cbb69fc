//! The exit statuses of `cave`.

/// How `cave` ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// The last run completed (or stdout was closed by a reader that had enough).
    Completed = 0,
    /// The last run stopped for another reason (printed).
    Stopped = 1,
    /// Bad arguments or configuration (a one-line message names the problem).
    Usage = 2,
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        std::process::ExitCode::from(exit as u8)
    }
}

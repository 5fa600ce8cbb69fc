//! The `CodePolicy` seam: checks code before it runs.

use std::fmt;
use std::sync::Arc;

/// Checks the model's code before the runtime sees it.
///
/// One required method. Analysis never fails: code that does not parse is a finding, not an
/// error. A policy is a screen, not a sandbox: it catches what a model writes by mistake or
/// on instruction, not what a determined adversary can hide.
pub trait CodePolicy: Send + Sync {
    /// The violations found in `code`; empty means it may run.
    fn check(&self, code: &str) -> Vec<Violation>;
}

/// One reason a cell may not run.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Violation {
    /// What was found, e.g. "Forbidden import detected: os at line 1".
    pub message: String,
    /// The line it was found on (1-based), if known.
    pub line: Option<usize>,
}

impl Violation {
    /// A violation with a message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            line: None,
        }
    }
    /// Sets the line.
    pub fn at_line(mut self, line: usize) -> Self {
        self.line = Some(line);
        self
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

macro_rules! forward_policy {
    ($($ptr:ty),*) => {$(
        impl<P: CodePolicy + ?Sized> CodePolicy for $ptr {
            fn check(&self, code: &str) -> Vec<Violation> {
                (**self).check(code)
            }
        }
    )*};
}
forward_policy!(&P, Box<P>, Arc<P>);

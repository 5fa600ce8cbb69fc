//! What can go wrong at the runtime seam, in kinds a caller can match.

use crate::{NameError, ValueError};

/// `error` and each of its sources, joined with `: ` (HTTP and TLS errors say only their
/// outline at the top; the cause is further down).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A runtime operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The name is not a registered variable.
    #[error(
        "variable '{name}' is not managed by this runtime; registered variables: {available:?}{}",
        if *bound { "; the name is bound in the namespace (the code made it): read it with get or get_as" } else { "" }
    )]
    UnknownVariable {
        /// The name asked for.
        name: String,
        /// The registered variables.
        available: Vec<String>,
        /// The name is bound all the same (the model's code made it): [`Runtime::get`](crate::Runtime::get) and
        /// [`RuntimeExt::get_as`](crate::RuntimeExt::get_as) read it.
        bound: bool,
    },
    /// The name is not bound in the namespace.
    #[error("'{name}' is not bound in the runtime's namespace")]
    Unbound {
        /// The name asked for.
        name: String,
    },
    /// A name could not be bound.
    #[error(transparent)]
    Name(#[from] NameError),
    /// An update does not match the variable's declared type.
    #[error("cannot update variable '{name}': expected {expected}, got {found}")]
    TypeMismatch {
        /// The variable.
        name: String,
        /// Its declared Python type.
        expected: String,
        /// The Python type given.
        found: String,
    },
    /// The Python value has no counterpart on the seam.
    #[error(
        "'{name}' holds a Python {python_type}, which cannot cross into Rust as a value; convert it in Python first (e.g. to a dict or list)"
    )]
    Unsupported {
        /// The name.
        name: String,
        /// The Python type found.
        python_type: String,
    },
    /// The value did not convert to or from the requested Rust type.
    #[error("'{name}' does not convert: {source}")]
    Conversion {
        /// The name.
        name: String,
        /// Why.
        source: ValueError,
    },
    /// A resource declares something Python cannot hold (a bad parameter or field name, a
    /// required field after a defaulted one).
    #[error("resource '{name}' cannot be registered: {problem}")]
    InvalidResource {
        /// The resource's name.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// `bind_unique` was given `start = 0`.
    #[error("start must be a positive integer, not 0")]
    InvalidStart,
    /// The name holds no host object of the requested type.
    #[error("'{name}' is not a host object of type {expected}")]
    NotAnObject {
        /// The name.
        name: String,
        /// The Rust type asked for.
        expected: &'static str,
    },
    /// The runtime's process ended while doing `operation` (a crash, a kill, a lost
    /// connection to its server); the next request starts a fresh one, with what is
    /// registered restored, where the runtime can.
    #[error("the runtime's process ended during {operation}: {reason}")]
    ProcessDied {
        /// What the runtime was doing.
        operation: &'static str,
        /// How it ended, as far as known.
        reason: String,
    },
    /// The runtime's worker answered something the host does not understand (a worker of
    /// another version, or a broken one).
    #[error("the runtime's worker broke the protocol during {operation}: {message}")]
    Protocol {
        /// What the runtime was doing.
        operation: &'static str,
        /// What it answered.
        message: String,
    },
    /// A value too large to cross between the host and the runtime.
    #[error(
        "'{name}' is {size} bytes once encoded, over the limit of {limit} bytes ({setting} raises it)"
    )]
    TooLarge {
        /// The name whose value it is.
        name: String,
        /// Its encoded size.
        size: u64,
        /// The limit.
        limit: u64,
        /// The setting that sets the limit.
        setting: &'static str,
    },
    /// The runtime does not do `operation`.
    #[error("this runtime does not support {operation}: {reason}")]
    NotSupported {
        /// What was asked.
        operation: &'static str,
        /// Why not, and what to do instead.
        reason: String,
    },
    /// The runtime's machinery failed while doing `operation`.
    #[error("the runtime failed during {operation}: {message}")]
    Backend {
        /// What it was doing.
        operation: &'static str,
        /// What went wrong.
        message: String,
    },
}

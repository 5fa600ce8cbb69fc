//! The `Runtime` seam: a persistent Python namespace the model's code runs in.

use crate::{HostObject, NameError, Resources, Value, ValueError, from_value, to_value};
use async_trait::async_trait;
use serde::{Serialize, de::DeserializeOwned};
use std::sync::Arc;

/// A persistent Python namespace that the model's code runs in.
///
/// The runtime owns names and state; the agent owns the conversation. Required are the
/// namespace's genuine operations:
/// - [`execute`](Runtime::execute) a cell;
/// - [`register`](Runtime::register) an atomic batch of resources;
/// - [`describe`](Runtime::describe) them for the prompt;
/// - [`retrieve`](Runtime::retrieve) and [`update`](Runtime::update) registered variables;
/// - [`get`](Runtime::get) any bound name;
/// - [`bind_unique`](Runtime::bind_unique) and [`reset`](Runtime::reset).
///
/// [`interrupter`](Runtime::interrupter) defaults to `None`: a runtime that cannot stop running
/// code does not claim it can. Typed access is in [`RuntimeExt`].
#[async_trait]
pub trait Runtime: Send + Sync {
    /// Runs a cell. Output is written to `output` as it is produced, where the runtime can
    /// stream it, and returned whole in the [`Execution`]. Code that raises is a *successful*
    /// call with `error` set; `Err` means the runtime itself failed.
    async fn execute(&self, code: &str, output: &dyn OutputSink)
    -> Result<Execution, RuntimeError>;

    /// Registers a batch of resources: all bound, or none (names are validated, NFKC-normalized
    /// and share one namespace across kinds). When it returns `Ok`, every resource is bound and
    /// usable by the next execution; on `Err`, nothing of the batch is bound or registered.
    async fn register(&self, batch: Resources) -> Result<(), RuntimeError>;

    /// The registered resources as prompt text.
    fn describe(&self) -> Description;

    /// The current value of a registered variable (after the model's code changed it).
    async fn retrieve(&self, name: &str) -> Result<Value, RuntimeError>;

    /// Replaces the value of a registered variable.
    async fn update(&self, name: &str, value: Value) -> Result<(), RuntimeError>;

    /// The value of any bound name (`None` is a value, not absence).
    async fn get(&self, name: &str) -> Result<Value, RuntimeError>;

    /// How the model's code is isolated, one line per layer (`network: active (...)`); empty
    /// when the runtime does not say (the agent reports it as a status when it changes).
    fn isolation(&self) -> Vec<String> {
        Vec::new()
    }

    /// The `(name, value)` of each registered secret variable ([`Variable::secret`](crate::Variable::secret)),
    /// for the agent to redact. Default: none (a runtime without a registry keeps no secrets).
    fn secrets(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Binds `value` to the first free name `{prefix}_{n}` with `n >= start` that was never
    /// handed out before, and returns it. The check and the binding are one step; the binding
    /// survives `reset`.
    async fn bind_unique(
        &self,
        prefix: &str,
        value: Value,
        start: u64,
    ) -> Result<String, RuntimeError>;

    /// Clears the namespace and restores every registered resource, as one step.
    async fn reset(&self) -> Result<(), RuntimeError>;

    /// Runs a Python file in the runtime and registers what it exports: its `__exports__`
    /// (`Function`, `Variable`, `Type` from the `cave_agent.runtime` module, as CaveAgent's
    /// injection modules write them), or else its public top-level functions and classes;
    /// classes their signatures need are bound too, hidden. All or nothing; the objects
    /// survive `reset`. `hidden`: bound for code, not shown in the prompt. Returns what was
    /// registered, as resources (for describing them elsewhere). A runtime without Python
    /// files refuses.
    async fn register_python_file(
        &self,
        path: &std::path::Path,
        hidden: bool,
    ) -> Result<Resources, RuntimeError> {
        let _ = hidden;
        Err(RuntimeError::Backend {
            operation: "register_python_file",
            message: format!(
                "this runtime does not load Python files ({})",
                path.display()
            ),
        })
    }

    /// The handle that stops running code, if this runtime can.
    fn interrupter(&self) -> Option<Arc<dyn Interrupt>> {
        None
    }
}

/// Caller-side helpers over any [`Runtime`]: typed retrieval and update through serde.
#[async_trait]
pub trait RuntimeExt: Runtime {
    /// A registered variable, deserialized.
    async fn retrieve_as<T: DeserializeOwned>(&self, name: &str) -> Result<T, RuntimeError> {
        let value = self.retrieve(name).await?;
        from_value(value).map_err(|source| RuntimeError::Conversion {
            name: name.to_owned(),
            source,
        })
    }
    /// Replaces a registered variable with a serialized Rust value.
    async fn update_from<T: Serialize + Sync + ?Sized>(
        &self,
        name: &str,
        value: &T,
    ) -> Result<(), RuntimeError> {
        let value = to_value(value).map_err(|source| RuntimeError::Conversion {
            name: name.to_owned(),
            source,
        })?;
        self.update(name, value).await
    }
}

impl<R: Runtime + ?Sized> RuntimeExt for R {}

/// What one cell execution produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Execution {
    /// Everything the cell printed (stdout and stderr in order, the echoed value of a trailing
    /// expression, and the traceback if it raised). A Rust `String` is valid UTF-8 by type:
    /// runtimes replace lone surrogates from Python text with U+FFFD when they convert it.
    pub output: String,
    /// The exception the cell raised, if any.
    pub error: Option<ExecutionError>,
    /// Stopping this execution lost the runtime's non-registered state.
    pub state_lost: bool,
}

impl Execution {
    /// A successful execution with this output.
    pub fn ok(output: impl Into<String>) -> Self {
        Self {
            output: output.into(),
            error: None,
            state_lost: false,
        }
    }
    /// An execution that raised.
    pub fn failed(output: impl Into<String>, error: ExecutionError) -> Self {
        Self {
            output: output.into(),
            error: Some(error),
            state_lost: false,
        }
    }
    /// Marks the state as lost.
    pub fn with_state_lost(mut self, lost: bool) -> Self {
        self.state_lost = lost;
        self
    }
    /// Returns true if and only if the cell ran without raising.
    pub fn success(&self) -> bool {
        self.error.is_none()
    }
}

/// The exception a cell raised.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecutionError {
    /// The exception's type name, e.g. `ZeroDivisionError`.
    pub python_type: String,
    /// `str()` of the exception.
    pub message: String,
}

impl ExecutionError {
    /// An exception of this type.
    pub fn new(python_type: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            python_type: python_type.into(),
            message: message.into(),
        }
    }
}

/// Receives a cell's output while it runs. Called from any thread; must not block.
pub trait OutputSink: Send + Sync {
    /// Takes the next piece of output.
    fn write(&self, chunk: &str);
}

/// An [`OutputSink`] that drops live output (the whole output is still in the [`Execution`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct DiscardOutput;

impl OutputSink for DiscardOutput {
    fn write(&self, _chunk: &str) {}
}

/// Stops the code a runtime is running. Lock-free and non-blocking: callable from `Drop`.
pub trait Interrupt: Send + Sync {
    /// Asks the running code to stop, and says how that went.
    fn interrupt(&self) -> Interruption;
}

/// What an interrupt achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Interruption {
    /// Nothing was running.
    Idle,
    /// The code will stop at its next instruction; state is kept.
    Delivered,
    /// The code is inside a call that cannot be preempted (e.g. a blocking C call); it stops
    /// when that call returns.
    Pending,
    /// The runtime killed its process: registered resources come back, other state is lost.
    StateLost,
}

/// The registered resources rendered for the system prompt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Description {
    /// The `<functions>` section.
    pub functions: String,
    /// The `<variables>` section.
    pub variables: String,
    /// The `<types>` section.
    pub types: String,
}

impl Description {
    /// A description from its three sections.
    pub fn new(
        functions: impl Into<String>,
        variables: impl Into<String>,
        types: impl Into<String>,
    ) -> Self {
        Self {
            functions: functions.into(),
            variables: variables.into(),
            types: types.into(),
        }
    }
}

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
        "variable '{name}' is not managed by this runtime; registered variables: {available:?}"
    )]
    UnknownVariable {
        /// The name asked for.
        name: String,
        /// The registered variables.
        available: Vec<String>,
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
    /// The runtime's machinery failed while doing `operation`.
    #[error("the runtime failed during {operation}: {message}")]
    Backend {
        /// What it was doing.
        operation: &'static str,
        /// What went wrong.
        message: String,
    },
}

/// Hands back a host object as the concrete type it was registered with, through the
/// wrappers around it (approval guards, audit records).
pub fn downcast_object<T: HostObject>(
    name: &str,
    object: Arc<dyn HostObject>,
) -> Result<Arc<T>, RuntimeError> {
    let mut object = object;
    // Bounded: wrappers are stacked by the host, a few at most.
    for _ in 0..64 {
        let any: Arc<dyn std::any::Any + Send + Sync> = object.clone();
        if let Ok(found) = any.downcast::<T>() {
            return Ok(found);
        }
        match object.wrapped() {
            Some(inner) => object = inner,
            None => break,
        }
    }
    Err(RuntimeError::NotAnObject {
        name: name.to_owned(),
        expected: std::any::type_name::<T>(),
    })
}

macro_rules! forward_runtime {
    ($($ptr:ty),*) => {$(
        #[async_trait]
        impl<R: Runtime + ?Sized> Runtime for $ptr {
            async fn execute(&self, code: &str, output: &dyn OutputSink) -> Result<Execution, RuntimeError> {
                (**self).execute(code, output).await
            }
            async fn register(&self, batch: Resources) -> Result<(), RuntimeError> {
                (**self).register(batch).await
            }
            fn describe(&self) -> Description {
                (**self).describe()
            }
            async fn retrieve(&self, name: &str) -> Result<Value, RuntimeError> {
                (**self).retrieve(name).await
            }
            async fn update(&self, name: &str, value: Value) -> Result<(), RuntimeError> {
                (**self).update(name, value).await
            }
            async fn get(&self, name: &str) -> Result<Value, RuntimeError> {
                (**self).get(name).await
            }
            fn secrets(&self) -> Vec<(String, String)> {
                (**self).secrets()
            }
            fn isolation(&self) -> Vec<String> {
                (**self).isolation()
            }
            async fn bind_unique(&self, prefix: &str, value: Value, start: u64) -> Result<String, RuntimeError> {
                (**self).bind_unique(prefix, value, start).await
            }
            async fn reset(&self) -> Result<(), RuntimeError> {
                (**self).reset().await
            }
            async fn register_python_file(&self, path: &std::path::Path, hidden: bool) -> Result<Resources, RuntimeError> {
                (**self).register_python_file(path, hidden).await
            }
            fn interrupter(&self) -> Option<Arc<dyn Interrupt>> {
                (**self).interrupter()
            }
        }
    )*};
}
forward_runtime!(&R, Box<R>, Arc<R>);

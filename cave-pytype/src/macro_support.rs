//! What the code `cave-macros` generates names, every path through this module (so that the
//! macros' `crate = "..."` may name any crate that has it: `cave_agent` by default, or
//! `cave_pytype`). Not a public API: it changes with the macros.

pub use crate::{ObjectClass, ObjectMethods, PythonType, Shared, push_schema};
pub use async_trait::async_trait;
pub use cave_core::{
    Args, Field, Function, HostError, Method, Param, Signature, TypeSchema, Value,
};

use cave_core::to_value;
use serde::Serialize;
use std::any::Any;
use std::fmt::Display;

/// A Rust result value for Python.
pub fn value<T: Serialize + ?Sized>(result: &T) -> Result<Value, HostError> {
    to_value(result).map_err(|e| {
        HostError::new(
            "TypeError",
            format!("the result cannot be given to Python: {e}"),
        )
    })
}

/// A Rust error as the Python exception the model sees: a [`HostError`] as it is, anything
/// else as `RuntimeError` with its message.
pub fn error<E: Display + 'static>(error: E) -> HostError {
    match (&error as &dyn Any).downcast_ref::<HostError>() {
        Some(host) => host.clone(),
        None => HostError::new("RuntimeError", error.to_string()),
    }
}

/// A declared default as a value (defaults are the programmer's literals: a failure here is
/// a bug in the declaration, reported with the parameter's name).
pub fn default_value<T: Serialize>(param: &str, default: T) -> Value {
    to_value(&default)
        .unwrap_or_else(|e| panic!("the default of '{param}' cannot be given to Python: {e}"))
}

/// The error for a method or property the class does not have.
pub fn no_attribute(type_name: &str, name: &str) -> HostError {
    HostError::new(
        "AttributeError",
        format!("'{type_name}' object has no attribute '{name}'"),
    )
}

//! Rust types as a cave-agent model sees them in Python.
//!
//! [`PythonType`] gives a Rust type its annotation (`list[str]`, `Order | None`) and the
//! record and enum classes it uses; [`ObjectClass`] and [`ObjectMethods`] make a Rust struct a
//! class of host objects, registered as [`Shared<T>`], the lock its state lives behind for the
//! model's calls and the host's reads. `#[cave_agent::function]`, `#[cave_agent::object]` and
//! `#[derive(cave_agent::PythonType)]` implement them (the `cave-macros` crate); they can be
//! implemented by hand too. The facade re-exports this crate at its root.
//!
//! ```
//! use cave_pytype::PythonType;
//! use std::collections::HashMap;
//!
//! assert_eq!(<Vec<Option<String>>>::annotation(), "list[str | None]");
//! assert_eq!(<HashMap<String, f64>>::annotation(), "dict[str, float]");
//! ```
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

#[doc(hidden)]
pub mod macro_support;
mod pytype;

pub use pytype::{ObjectClass, ObjectMethods, PythonType, Shared, push_schema};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

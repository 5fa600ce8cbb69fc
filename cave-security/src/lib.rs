//! cave-agent's code policy: rules checked over the tree-sitter-python syntax tree before any
//! code runs, in Rust, so a refused cell never reaches the interpreter.
//!
//! # Brief overview
//!
//! [`SecurityPolicy`] implements [`cave_core::CodePolicy`]: import, call, attribute and
//! pattern rules, and a [`SecurityPolicy::strict`] preset. The agent (`AgentBuilder::policy`)
//! checks every cell with it; a refused cell becomes a `security_error` event and the model is
//! told each violation, one per line.
//!
//! ```
//! use cave_core::CodePolicy;
//! use cave_security::SecurityPolicy;
//!
//! let policy = SecurityPolicy::new().deny_imports(["os"], None).deny_calls(["eval"], Some("no dynamic code"));
//! let found = policy.check("import os.path\nf = eval\nprint('eval is just a word here')");
//! let messages: Vec<String> = found.iter().map(|v| v.message.clone()).collect();
//! assert_eq!(messages, ["Forbidden import 'os.path' at line 1", "Forbidden reference to 'eval' at line 2: no dynamic code"]);
//! ```
//!
//! A policy is advisory hardening, not a sandbox: see what [`SecurityPolicy::strict`] does
//! not stop.
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

mod literal;
mod policy;
mod settle;
mod statements;

pub use policy::{PolicyError, SecurityPolicy};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

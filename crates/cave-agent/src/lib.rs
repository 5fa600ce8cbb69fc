#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

pub use cave_core::*;

/// The workspace README's hello world, compiled and run as a doctest.
#[cfg(all(doctest, feature = "testing"))]
#[doc = include_str!("../../../README.md")]
struct WorkspaceReadme;

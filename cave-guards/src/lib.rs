//! What a cave-agent host puts around its functions and its runs: approvals before host calls,
//! an audit log, and which methods of an object a guard covers.
//!
//! The agent loop (cave-core) knows of approvals only as a seam (`Approver`, asked before each
//! cell) and of records only as one (`EventObserver`); this crate holds the guards a host
//! wraps its host functions and objects in, and the JSON Lines audit log:
//!
//! - [`requiring_approval`] and [`object_requiring_approval`]: ask an `Approver` before each
//!   call; a refusal raises `PermissionError` in the model's code.
//! - [`AuditLog`]: one timestamped, bounded JSON object per line for each run's prompt, cells,
//!   approvals and stop (as the agent's `EventObserver`), and each host call ([`audited`],
//!   [`audited_object`]).
//! - [`MethodFilter`]: which methods of an object a guard covers.
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

mod approval;
mod audit;
mod gate;

pub use approval::{object_requiring_approval, requiring_approval};
pub use audit::{AUDIT_TEXT_CHARS, AuditLog, audited, audited_object};
pub use gate::MethodFilter;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

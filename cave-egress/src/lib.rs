//! Egress for a sandboxed worker: an [`Allowlist`] of hosts and ports, and the [`EgressProxy`]
//! that is a worker's only way out (HTTP `CONNECT` for TLS, plain HTTP forwarded), which
//! resolves names itself, refuses what is not listed (and listed names that resolve to
//! loopback, link-local or private addresses), bounds what a session downloads, and reports
//! every connection.
//!
//! ```
//! use cave_egress::{Allowlist, EgressProxy};
//!
//! let allowlist: Allowlist = "pypi.org,files.pythonhosted.org".parse()?;
//! assert_eq!(allowlist.check("pypi.org", 443), Ok(false));
//! assert!(allowlist.check("example.com", 443).is_err());
//! let proxy = EgressProxy::new(allowlist).max_download(Some(512 << 20));
//! assert_eq!(proxy.downloaded(), 0);
//! # Ok::<(), cave_egress::AllowlistError>(())
//! ```
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

mod allowlist;
mod proxy;

pub use allowlist::{Allowlist, AllowlistError, DEFAULT_PORTS, Refusal, public};
pub use proxy::{
    CONNECT_TIMEOUT, EgressObserver, EgressProxy, EgressRecord, MAX_CONNECTIONS, Resolver,
    SystemResolver,
};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

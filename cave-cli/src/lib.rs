//! The `cave` command: arguments, configuration, the session loops and the renderers.
//!
//! The binary (`main.rs`) is a few lines; everything else is here so that it can be tested:
//! [`output`] holds the JSON Lines writer and the human renderer, both consumers of the core's
//! events that know nothing of where those come from.
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

pub mod app;
mod approve;
pub mod args;
pub mod config;
pub mod exit;
mod highlight;
pub mod images;
mod markdown;
pub mod output;
mod sixel;
mod stop;
pub mod units;
pub mod view;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

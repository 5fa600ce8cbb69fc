//! The `cave` command: arguments, configuration, the session loops and the renderers.
//!
//! The binary (`main.rs`) is a few lines; everything else is here so that it can be tested:
//! [`output`] holds the JSON Lines writer and the human renderer, both consumers of the core's
//! events that know nothing of where those come from.
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

pub mod app;
pub mod args;
pub mod config;
pub mod exit;
pub mod output;

/// Reads `LLM_API_KEY` and removes it from the process environment, so that no runtime (and
/// no code a model writes) can read it. Call it first thing in `main`, before any thread starts.
pub fn take_api_key() -> Option<String> {
    let key = std::env::var("LLM_API_KEY")
        .ok()
        .filter(|k| !k.trim().is_empty());
    // SAFETY: called at the start of `main`, while the process has a single thread.
    unsafe { std::env::remove_var("LLM_API_KEY") };
    key
}

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! Agent Skills for cave-agent: SKILL.md files (the open standard), read and checked, listed
//! in the prompt by name and description only, and loaded by the model when it needs them
//! (`activate_skill`, `read_skill_file`).
//!
//! ```
//! use cave_skills::{Skill, SkillSet};
//!
//! let mut skills = SkillSet::new();
//! skills.add(Skill::new("unit-convert", "Convert between units. Use for any unit question.", "Use the table below."))?;
//! assert_eq!(skills.listing(), "- unit-convert: Convert between units. Use for any unit question.");
//! assert_eq!(skills.activate("unit-convert")?, "Use the table below.");
//! assert!(skills.activate("nope").unwrap_err().message.contains("Available skills: [\"unit-convert\"]"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![warn(unreachable_pub, missing_debug_implementations)]

mod discover;
mod set;
mod skill;

pub use discover::{Discovery, INJECTION_FILE, SKILL_FILE, SkillError, SkillErrors, discover};
pub use set::SkillSet;
pub use skill::Skill;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

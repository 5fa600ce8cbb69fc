//! The code policy: rules, bypasses, false positives, the agent path, and fuzzing.
mod rules;

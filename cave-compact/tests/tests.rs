//! Estimation and compaction.
mod estimate;

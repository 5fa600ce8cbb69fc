//! Estimation and compaction.
mod compactor;
mod estimate;

//! The in-process runtime against the real interpreter: one binary, one module per concern.
mod environment;
mod execution;
mod injection;
mod stdio;

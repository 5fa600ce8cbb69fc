//! Integration tests of cave-core: one binary, one module per concern.
mod agent;
mod outside_runtime;
mod parser;
mod registry;
mod send_sync;
mod spans;
mod support;
mod values;

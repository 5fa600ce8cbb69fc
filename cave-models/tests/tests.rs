//! Adapter tests against a real local HTTP server.
mod adapters;
mod support;

//! Integration tests of cave-core: one binary, one module per concern.
mod parser;

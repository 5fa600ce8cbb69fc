//! core
mod parser;
pub use parser::{FenceParser, Parsed};

//! Values that cross the runtime seam, and their conversion to and from Rust types with serde.

mod de;
mod ser;

pub use de::from_value;
pub use ser::to_value;

use std::fmt;

/// A Python value that can cross the runtime seam: serde's data model, plus what Python has
/// that JSON lacks (bytes, tuples, sets, dictionaries with non-string keys, NaN and infinities).
///
/// Convert Rust values with [`to_value`] and back with [`from_value`]: a struct becomes a dict
/// with string keys, a tuple a tuple, `Option::None` and `()` become `None`, a unit enum
/// variant its name as a string, and a newtype or struct variant a one-entry dict.
#[derive(Clone, Debug, PartialEq, Default)]
#[non_exhaustive]
pub enum Value {
    /// `None`.
    #[default]
    None,
    /// `bool`.
    Bool(bool),
    /// `int` (Python ints are unbounded; this covers ±2^127).
    Int(i128),
    /// `float`, NaN and infinities included.
    Float(f64),
    /// `str`.
    Str(String),
    /// `bytes`.
    Bytes(Vec<u8>),
    /// `list`.
    List(Vec<Value>),
    /// `tuple`.
    Tuple(Vec<Value>),
    /// `dict`, in insertion order, keys of any hashable kind.
    Dict(Vec<(Value, Value)>),
    /// `set` (or `frozenset`).
    Set(Vec<Value>),
}

impl Value {
    /// The Python type name of this value (`int`, `dict`, …).
    pub fn python_type(&self) -> &'static str {
        match self {
            Value::None => "NoneType",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Set(_) => "set",
        }
    }

    /// The string, if this is a `str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Looks up a string key in a dict.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(entries) => entries
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_owned())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}
impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i.into())
    }
}
impl From<f64> for Value {
    fn from(f: f64) -> Self {
        Value::Float(f)
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

/// Writes Python's `repr` of the value (as used in prompts, e.g. for defaults).
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn seq(
            f: &mut fmt::Formatter<'_>,
            items: &[Value],
            open: &str,
            close: &str,
        ) -> fmt::Result {
            f.write_str(open)?;
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{v}")?;
            }
            f.write_str(close)
        }
        match self {
            Value::None => f.write_str("None"),
            Value::Bool(true) => f.write_str("True"),
            Value::Bool(false) => f.write_str("False"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) if x.is_nan() => f.write_str("nan"),
            Value::Float(x) if x.is_infinite() => {
                f.write_str(if *x > 0.0 { "inf" } else { "-inf" })
            }
            Value::Float(x) if x.fract() == 0.0 && x.abs() < 1e16 => write!(f, "{x:.1}"),
            Value::Float(x) => write!(f, "{x}"),
            Value::Str(s) => write_py_str(f, s),
            Value::Bytes(b) => {
                f.write_str("b'")?;
                for &byte in b {
                    match byte {
                        b'\'' => f.write_str("\\'")?,
                        b'\\' => f.write_str("\\\\")?,
                        b'\n' => f.write_str("\\n")?,
                        b'\r' => f.write_str("\\r")?,
                        b'\t' => f.write_str("\\t")?,
                        0x20..=0x7e => write!(f, "{}", byte as char)?,
                        _ => write!(f, "\\x{byte:02x}")?,
                    }
                }
                f.write_str("'")
            }
            Value::List(items) => seq(f, items, "[", "]"),
            Value::Tuple(items) if items.len() == 1 => write!(f, "({},)", items[0]),
            Value::Tuple(items) => seq(f, items, "(", ")"),
            Value::Set(items) if items.is_empty() => f.write_str("set()"),
            Value::Set(items) => seq(f, items, "{", "}"),
            Value::Dict(entries) => {
                f.write_str("{")?;
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k}: {v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

/// Python's `repr` of a `str`: single quotes unless the text has one and no double quote.
fn write_py_str(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    write!(f, "{quote}")?;
    for c in s.chars() {
        match c {
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            c if c == quote => write!(f, "\\{c}")?,
            c if (c as u32) < 0x20 || c as u32 == 0x7f => write!(f, "\\x{:02x}", c as u32)?,
            c => write!(f, "{c}")?,
        }
    }
    write!(f, "{quote}")
}

/// A value did not convert to or from the requested Rust type.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ValueError {
    message: String,
}

impl ValueError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl serde::ser::Error for ValueError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        ValueError::new(msg.to_string())
    }
}

impl serde::de::Error for ValueError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        ValueError::new(msg.to_string())
    }
}

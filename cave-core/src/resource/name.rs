//! Python names: validation and normalization, shared by every runtime.

use std::fmt;
use unicode_normalization::UnicodeNormalization;

/// What a name is being claimed for (used in error messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NameKind {
    /// A registered variable.
    Variable,
    /// A registered function.
    Function,
    /// A registered type.
    Type,
    /// A host object.
    Object,
    /// A hidden binding.
    Binding,
    /// A prefix for generated names (`bind_unique`).
    Prefix,
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameKind::Variable => "Variable",
            NameKind::Function => "Function",
            NameKind::Type => "Type",
            NameKind::Object => "Object",
            NameKind::Binding => "Binding",
            NameKind::Prefix => "Prefix",
        })
    }
}

/// Why a name was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NameProblem {
    /// Not a Python identifier, even after NFKC normalization (shown when it differs).
    NotIdentifier {
        /// The NFKC form of the name.
        normalized: String,
    },
    /// A hard keyword (`for`, `None`, `class`, …); soft keywords such as `match` are allowed.
    Keyword,
    /// The name is already bound in this runtime.
    Exists,
    /// The name is bound already under another spelling with the same NFKC form.
    CollidesAfterNormalization {
        /// The existing name.
        existing: String,
    },
}

/// A name that cannot be bound.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct NameError {
    /// What it was for.
    pub kind: NameKind,
    /// The name as given.
    pub name: String,
    /// What is wrong with it.
    pub problem: NameProblem,
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let NameError {
            kind,
            name,
            problem,
        } = self;
        match problem {
            NameProblem::NotIdentifier { normalized } if normalized != name => write!(
                f,
                "{kind} '{name}' is not a Python identifier (it normalizes to '{normalized}'): use letters, digits and underscores, not starting with a digit"
            ),
            NameProblem::NotIdentifier { .. } => write!(
                f,
                "{kind} '{name}' is not a Python identifier: use letters, digits and underscores, not starting with a digit"
            ),
            NameProblem::Keyword => {
                write!(
                    f,
                    "{kind} '{name}' is a Python keyword and cannot name a value: choose another name"
                )
            }
            NameProblem::Exists => {
                write!(
                    f,
                    "{kind} '{name}' already exists in this runtime: choose another name"
                )
            }
            NameProblem::CollidesAfterNormalization { existing } => write!(
                f,
                "{kind} '{name}' collides with the existing name '{existing}' after NFKC normalization (Python treats them as one name)"
            ),
        }
    }
}

/// Python's hard keywords (soft keywords like `match`, `case`, `type` and `_` are not here).
const HARD_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// The name Python binds for `name`: its NFKC normalization.
pub fn normalize_name(name: &str) -> String {
    name.nfkc().collect()
}

/// Returns true if and only if `name` is a Python identifier (`str.isidentifier`).
pub fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || unicode_ident::is_xid_start(c))
        && chars.all(unicode_ident::is_xid_continue)
}

/// Validates a name to bind: NFKC-normalizes it and checks it is an identifier and not a hard
/// keyword. Returns the normalized name, the one the runtime binds.
///
/// ```
/// use cave_core::{validate_name, NameKind};
/// assert_eq!(validate_name(NameKind::Variable, "\u{212a}").unwrap(), "K");
/// assert!(validate_name(NameKind::Variable, "for").is_err());
/// assert!(validate_name(NameKind::Variable, "match").is_ok());
/// ```
pub fn validate_name(kind: NameKind, name: &str) -> Result<String, NameError> {
    let normalized = normalize_name(name);
    let problem = if !is_identifier(&normalized) {
        NameProblem::NotIdentifier {
            normalized: normalized.clone(),
        }
    } else if HARD_KEYWORDS.contains(&normalized.as_str()) {
        NameProblem::Keyword
    } else {
        return Ok(normalized);
    };
    Err(NameError {
        kind,
        name: name.to_owned(),
        problem,
    })
}

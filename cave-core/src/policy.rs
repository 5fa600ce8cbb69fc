//! The `CodePolicy` seam: checks code before it runs.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// Checks the model's code before the runtime sees it.
///
/// One required method. Analysis never fails: code that does not parse is a finding, not an
/// error. A policy is a screen, not a sandbox: it catches what a model writes by mistake or
/// on instruction, not what a determined adversary can hide.
pub trait CodePolicy: Send + Sync {
    /// The violations found in `code`; empty means it may run.
    fn check(&self, code: &str) -> Vec<Violation>;
}

/// What a refused cell's author is told: how many violations, then one line each.
pub fn refusal_message(violations: &[Violation]) -> String {
    let mut message = format!(
        "Code execution blocked: {} violation{} found:",
        violations.len(),
        if violations.len() == 1 { "" } else { "s" }
    );
    for v in violations {
        message.push_str("\n  - ");
        message.push_str(&v.message);
    }
    message
}

/// One reason a cell may not run (in events as `{"message", "kind", "rule"?, "line"?}`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Violation {
    /// What was found, e.g. "Forbidden import 'os' at line 1".
    pub message: String,
    /// The line it was found on (1-based), if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    /// Which kind of rule fired.
    #[serde(default)]
    pub kind: ViolationKind,
    /// The rule's subject that matched: the forbidden module, function or attribute name, or
    /// the pattern; `None` where no single rule fired (a syntax error, a limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

/// Which kind of rule a [`Violation`] comes from (snake_case in events: `import`,
/// `computed_name`, …).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ViolationKind {
    /// A forbidden module was imported.
    Import,
    /// A forbidden function was called, referred to, or reached by name.
    Call,
    /// A forbidden attribute was used.
    Attribute,
    /// A forbidden pattern matched the source.
    Pattern,
    /// A name was computed where the policy must read it.
    ComputedName,
    /// The code does not parse.
    Syntax,
    /// The code is too large or too deeply nested to analyse.
    TooComplex,
    /// Anything else (a custom policy's finding).
    #[default]
    Other,
}

impl Violation {
    /// A violation with a message (kind [`ViolationKind::Other`]).
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            line: None,
            kind: ViolationKind::Other,
            rule: None,
        }
    }
    /// Sets the line.
    pub fn at_line(mut self, line: usize) -> Self {
        self.line = Some(line);
        self
    }
    /// Sets the kind.
    pub fn with_kind(mut self, kind: ViolationKind) -> Self {
        self.kind = kind;
        self
    }
    /// Sets the rule's subject that matched.
    pub fn with_rule(mut self, rule: impl Into<String>) -> Self {
        self.rule = Some(rule.into());
        self
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

macro_rules! forward_policy {
    ($($ptr:ty),*) => {$(
        impl<P: CodePolicy + ?Sized> CodePolicy for $ptr {
            fn check(&self, code: &str) -> Vec<Violation> {
                (**self).check(code)
            }
        }
    )*};
}
forward_policy!(&P, Box<P>, Arc<P>);

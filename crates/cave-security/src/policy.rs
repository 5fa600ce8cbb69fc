//! `SecurityPolicy`: the rules, and one walk over the syntax tree that checks them all.

use cave_core::{CodePolicy, Violation, normalize_name};
use regex::Regex;
use std::borrow::Cow;
use std::collections::BTreeSet;
use tree_sitter::{Node, Parser, TreeCursor};

/// A rule's pattern did not compile.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The regular expression is invalid.
    #[error("invalid regex pattern {pattern:?}: {source}")]
    Regex {
        /// The pattern given.
        pattern: String,
        /// Why it is invalid.
        source: regex::Error,
    },
}

/// A set of names a rule forbids, with the rule's description for the model.
#[derive(Clone, Debug, Default)]
struct Names {
    names: BTreeSet<String>,
    description: Option<String>,
}

/// A regular expression searched once over the whole cell.
#[derive(Clone, Debug)]
struct Pattern {
    regex: Regex,
    description: String,
}

/// A code policy made of rules, checked over the tree-sitter-python syntax tree before any
/// code runs.
///
/// - Imports: a forbidden module and its submodules (`import a.b`, `import a.b as c`,
///   `from a.b import x`, `__import__('a')`, `importlib.import_module('a.b')`); relative
///   imports never match; `posixpath` is not `os`.
/// - Calls: by name or attribute name (`open(...)`, `obj.open(...)`), and bare references
///   (`f = open`, `key=eval`), and by string (`getattr(__builtins__, 'eval')`,
///   `globals()['eval']`, `vars()['open']`).
/// - Attributes: `x.__globals__`, and by string (`getattr(x, '__globals__')`).
/// - Patterns: regular expressions over the source, reported once per cell.
///
/// Strings are followed when they are literals or concatenations of literals; anything
/// computed at run time is not. A policy is a screen, not a sandbox.
#[derive(Clone, Debug, Default)]
pub struct SecurityPolicy {
    imports: Vec<Names>,
    calls: Vec<Names>,
    attributes: Vec<Names>,
    patterns: Vec<Pattern>,
}

impl SecurityPolicy {
    /// A policy with no rules (it still reports code that does not parse).
    pub fn new() -> Self {
        Self::default()
    }

    /// Forbids importing these modules and their submodules.
    pub fn deny_imports<I, S>(mut self, modules: I, description: Option<&str>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.imports.push(names(modules, description));
        self
    }

    /// Forbids calling, or referring to, these functions.
    pub fn deny_calls<I, S>(mut self, functions: I, description: Option<&str>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.calls.push(names(functions, description));
        self
    }

    /// Forbids these attribute names.
    pub fn deny_attributes<I, S>(mut self, attributes: I, description: Option<&str>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.attributes.push(names(attributes, description));
        self
    }

    /// Forbids source matching `pattern` (multi-line, `.` matches newlines).
    pub fn deny_regex(
        mut self,
        pattern: &str,
        description: Option<&str>,
    ) -> Result<Self, PolicyError> {
        let regex = regex::RegexBuilder::new(pattern)
            .multi_line(true)
            .dot_matches_new_line(true)
            .build()
            .map_err(|source| PolicyError::Regex {
                pattern: pattern.to_owned(),
                source,
            })?;
        let description = description.map_or_else(|| format!("pattern {pattern}"), str::to_owned);
        self.patterns.push(Pattern { regex, description });
        Ok(self)
    }

    /// A preset for running code from a model you do not fully trust, on a machine you care
    /// about:
    ///
    /// - imports of `os`, `subprocess`, `sys`, `shutil`, `socket`, `ctypes`, `importlib`,
    ///   `builtins`, `multiprocessing`, `pty`, `signal`, `pickle` and `marshal`;
    /// - `eval`, `exec`, `compile`, `open`, `__import__`, `breakpoint`, `input`, `globals`,
    ///   `vars`, `locals` and `getattr`-style access to those names;
    /// - introspection attributes that reach interpreter internals: `__globals__`,
    ///   `__builtins__`, `__subclasses__`, `__bases__`, `__base__`, `__mro__`, `__code__`,
    ///   `__closure__`, `__getattribute__`, `__reduce__`, `__reduce_ex__`, `__loader__`,
    ///   `__spec__`, and frame attributes (`f_globals`, `f_locals`, `f_back`, `gi_frame`,
    ///   `tb_frame`, `cr_frame`).
    ///
    /// It does not stop: names computed at run time (`getattr(x, name)` with a variable,
    /// decoded strings), what injected functions and objects can do, modules it does not list
    /// (`pathlib` can write files, `urllib` can reach the network), or resource exhaustion
    /// (use `max_exec_timeout`, and the kernel runtime for a hard stop).
    pub fn strict() -> Self {
        Self::new()
            .deny_imports(
                [
                    "os",
                    "subprocess",
                    "sys",
                    "shutil",
                    "socket",
                    "ctypes",
                    "importlib",
                    "builtins",
                    "multiprocessing",
                    "pty",
                    "signal",
                    "pickle",
                    "marshal",
                ],
                Some("system access is not allowed"),
            )
            .deny_calls(
                [
                    "eval",
                    "exec",
                    "compile",
                    "open",
                    "__import__",
                    "breakpoint",
                    "input",
                    "globals",
                    "vars",
                    "locals",
                ],
                Some("dynamic code, files and interpreter state are not allowed"),
            )
            .deny_attributes(
                [
                    "__globals__",
                    "__builtins__",
                    "__subclasses__",
                    "__bases__",
                    "__base__",
                    "__mro__",
                    "__code__",
                    "__closure__",
                    "__getattribute__",
                    "__reduce__",
                    "__reduce_ex__",
                    "__loader__",
                    "__spec__",
                    "f_globals",
                    "f_locals",
                    "f_back",
                    "gi_frame",
                    "tb_frame",
                    "cr_frame",
                ],
                Some("interpreter internals are not allowed"),
            )
    }

    /// Whether the tree could hold a violation: some forbidden name appears as a whole word, or
    /// a way to reach names by string does. Non-ASCII code always gets the full check (Python
    /// folds `ｅｖａｌ` into `eval`).
    fn may_violate(&self, code: &str) -> bool {
        const DOORS: &[&str] = &[
            "__import__",
            "import_module",
            "getattr",
            "setattr",
            "delattr",
            "hasattr",
            "globals",
            "vars",
            "locals",
            "__builtins__",
            "__dict__",
        ];
        if !code.is_ascii() {
            return true;
        }
        let import_roots = self
            .imports
            .iter()
            .flat_map(|r| r.names.iter())
            .map(|m| m.split('.').next().unwrap_or(m));
        let names = self
            .calls
            .iter()
            .chain(&self.attributes)
            .flat_map(|r| r.names.iter())
            .map(String::as_str);
        import_roots
            .chain(names)
            .chain(DOORS.iter().copied())
            .any(|word| contains_word(code, word))
    }

    /// Returns true if and only if the policy has no rules.
    pub fn is_empty(&self) -> bool {
        self.imports.is_empty()
            && self.calls.is_empty()
            && self.attributes.is_empty()
            && self.patterns.is_empty()
    }
}

fn names<I, S>(names: I, description: Option<&str>) -> Names
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    Names {
        names: names.into_iter().map(Into::into).collect(),
        description: description.map(str::to_owned),
    }
}

/// Returns true if and only if `word` occurs in `code` not inside a longer identifier.
fn contains_word(code: &str, word: &str) -> bool {
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let bytes = code.as_bytes();
    code.match_indices(word).any(|(at, _)| {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(at + word.len()).copied();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// A name as Python binds it (NFKC), cheaply for the common ASCII case.
fn python_name(text: &str) -> Cow<'_, str> {
    if text.is_ascii() {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(normalize_name(text))
    }
}

fn with_description(message: String, description: &Option<String>) -> String {
    match description {
        Some(d) => format!("{message}: {d}"),
        None => message,
    }
}

impl CodePolicy for SecurityPolicy {
    fn check(&self, code: &str) -> Vec<Violation> {
        if code.trim().is_empty() {
            return vec![Violation::new("The code is empty")];
        }
        let mut found = Vec::new();
        for pattern in &self.patterns {
            if let Some(m) = pattern.regex.find(code) {
                let line = code[..m.start()].matches('\n').count() + 1;
                found.push(
                    Violation::new(format!(
                        "Forbidden pattern at line {line}: {}",
                        pattern.description
                    ))
                    .at_line(line),
                );
            }
        }
        if !self.may_violate(code) {
            // No forbidden name and no door to one: nothing the tree could show. (Code that
            // does not parse is then reported by Python itself when it runs.)
            return found;
        }
        let mut parser = Parser::new();
        if parser
            .set_language(&tree_sitter_python::LANGUAGE.into())
            .is_err()
        {
            // The grammar is compiled in: this cannot happen, but a policy fails closed.
            found.push(Violation::new(
                "The code policy could not load its Python grammar",
            ));
            return found;
        }
        let Some(tree) = parser.parse(code, None) else {
            found.push(Violation::new("The code policy could not parse the code"));
            return found;
        };
        let mut walk = Walk {
            policy: self,
            source: code.as_bytes(),
            found,
            syntax_error: None,
            parents: Vec::new(),
        };
        walk.visit(&mut tree.walk());
        if let Some(line) = walk.syntax_error {
            walk.found.insert(
                0,
                Violation::new(format!(
                    "Syntax error at line {line}: the code does not parse"
                ))
                .at_line(line),
            );
        }
        walk.found
    }
}

/// One pass over the tree.
struct Walk<'a, 't> {
    policy: &'a SecurityPolicy,
    source: &'a [u8],
    found: Vec<Violation>,
    syntax_error: Option<usize>,
    /// Kinds of the ancestors of the current node.
    parents: Vec<&'t str>,
}

/// Parents under which an identifier is a name being defined, not a value being used.
const DEFINING: &[&str] = &[
    "parameters",
    "lambda_parameters",
    "typed_parameter",
    "list_splat_pattern",
    "dictionary_splat_pattern",
    "global_statement",
    "nonlocal_statement",
    "dotted_name",
    "aliased_import",
    "import_from_statement",
    "import_statement",
    "keyword_pattern",
];

impl<'a, 't> Walk<'a, 't> {
    fn text(&self, node: Node<'_>) -> &'a str {
        node.utf8_text(self.source).unwrap_or("")
    }

    /// An identifier's text as the name Python binds (borrowed unless it needs folding).
    fn name(&self, node: Node<'_>) -> Cow<'a, str> {
        python_name(self.text(node))
    }

    fn line(node: Node<'_>) -> usize {
        node.start_position().row + 1
    }

    fn visit(&mut self, cursor: &mut TreeCursor<'t>) {
        // Iterative, so that deeply nested input cannot overflow the stack.
        let mut depth = 0usize;
        loop {
            let node = cursor.node();
            let field = cursor.field_name();
            self.check_node(node, field);
            if cursor.goto_first_child() {
                self.parents.push(node.kind());
                depth += 1;
                continue;
            }
            loop {
                if cursor.goto_next_sibling() {
                    break;
                }
                if depth == 0 || !cursor.goto_parent() {
                    return;
                }
                self.parents.pop();
                depth -= 1;
            }
        }
    }

    fn check_node(&mut self, node: Node<'_>, field: Option<&str>) {
        if (node.is_error() || node.is_missing()) && self.syntax_error.is_none() {
            self.syntax_error = Some(Self::line(node));
        }
        if !node.is_named() {
            return;
        }
        match node.kind() {
            "import_statement" => {
                let mut cursor = node.walk();
                for child in node.children_by_field_name("name", &mut cursor) {
                    let module = match child.kind() {
                        "aliased_import" => child
                            .child_by_field_name("name")
                            .map(|n| self.name(n).into_owned()),
                        _ => Some(self.name(child).into_owned()),
                    };
                    if let Some(module) = module {
                        self.import(&module, Self::line(child));
                    }
                }
            }
            "import_from_statement" => {
                if let Some(module) = node
                    .child_by_field_name("module_name")
                    .filter(|m| m.kind() == "dotted_name")
                {
                    let module = self.name(module).into_owned();
                    self.import(&module, Self::line(node));
                }
            }
            "call" => self.call(node),
            "attribute" => {
                if let Some(name) = node.child_by_field_name("attribute") {
                    let name = self.name(name).into_owned();
                    self.attribute(&name, Self::line(node));
                }
            }
            "subscript" => self.subscript(node),
            "identifier" => self.reference(node, field),
            _ => {}
        }
    }

    fn import(&mut self, module: &str, line: usize) {
        let module: String = module.split_whitespace().collect();
        for rule in &self.policy.imports {
            // `a.b.c` is `a.b.c`, `a.b` and `a`: a module and its parents, whole components.
            let hit = rule.names.iter().any(|forbidden| {
                module == *forbidden || module.starts_with(&format!("{forbidden}."))
            });
            if hit {
                let message = with_description(
                    format!("Forbidden import '{module}' at line {line}"),
                    &rule.description,
                );
                self.found.push(Violation::new(message).at_line(line));
                return;
            }
        }
    }

    fn call(&mut self, node: Node<'_>) {
        let Some(callee) = node.child_by_field_name("function") else {
            return;
        };
        let name = match callee.kind() {
            "identifier" => self.name(callee).into_owned(),
            "attribute" => callee
                .child_by_field_name("attribute")
                .map(|a| self.name(a).into_owned())
                .unwrap_or_default(),
            _ => return,
        };
        let line = Self::line(node);
        for rule in &self.policy.calls {
            if rule.names.contains(&name) {
                let message = with_description(
                    format!("Forbidden call to '{name}' at line {line}"),
                    &rule.description,
                );
                self.found.push(Violation::new(message).at_line(line));
                break;
            }
        }
        let args: Vec<Node<'_>> = node
            .child_by_field_name("arguments")
            .map(|a| {
                let mut cursor = a.walk();
                a.named_children(&mut cursor)
                    .filter(|c| c.kind() != "comment")
                    .collect()
            })
            .unwrap_or_default();
        match name.as_str() {
            // Dynamic imports.
            "__import__" | "import_module" => {
                if let Some(module) = args.first().and_then(|a| self.literal(*a)) {
                    self.import(&module, line);
                }
            }
            // Access by string: the name is an attribute, or a builtin reached through one.
            "getattr" | "setattr" | "delattr" | "hasattr" => {
                if let Some(attr) = args.get(1).and_then(|a| self.literal(*a)) {
                    self.named(&attr, line);
                }
            }
            _ => {}
        }
    }

    /// `globals()['eval']`, `vars()['open']`, `__builtins__['exec']`, `x.__dict__['y']`.
    fn subscript(&mut self, node: Node<'_>) {
        let Some(value) = node.child_by_field_name("value") else {
            return;
        };
        let namespace_like = match value.kind() {
            "call" => value
                .child_by_field_name("function")
                .is_some_and(|f| matches!(self.text(f), "globals" | "vars" | "locals")),
            "identifier" => self.text(value) == "__builtins__",
            "attribute" => value
                .child_by_field_name("attribute")
                .is_some_and(|a| self.text(a) == "__dict__"),
            _ => false,
        };
        if !namespace_like {
            return;
        }
        let key = node
            .child_by_field_name("subscript")
            .and_then(|k| self.literal(k));
        if let Some(key) = key {
            self.named(&key, Self::line(node));
        }
    }

    /// A name reached by string: checked as an attribute and as a function.
    fn named(&mut self, name: &str, line: usize) {
        self.attribute(name, line);
        for rule in &self.policy.calls {
            if rule.names.contains(name) {
                let message = with_description(
                    format!("Forbidden access to '{name}' by name at line {line}"),
                    &rule.description,
                );
                self.found.push(Violation::new(message).at_line(line));
                break;
            }
        }
    }

    fn attribute(&mut self, name: &str, line: usize) {
        for rule in &self.policy.attributes {
            if rule.names.contains(name) {
                let message = with_description(
                    format!("Forbidden attribute '{name}' at line {line}"),
                    &rule.description,
                );
                self.found.push(Violation::new(message).at_line(line));
                break;
            }
        }
    }

    /// A forbidden function used as a value (`f = open`, `key=eval`, `print(eval)`).
    fn reference(&mut self, node: Node<'_>, field: Option<&str>) {
        if self.policy.calls.is_empty() {
            return;
        }
        let parent = self.parents.last().copied().unwrap_or("");
        let defining = DEFINING.contains(&parent)
            || matches!((parent, field), ("call", Some("function")))
            || matches!((parent, field), ("attribute", Some("attribute")))
            || matches!((parent, field), ("keyword_argument", Some("name")))
            // A parameter's name defines; its default value is a use.
            || matches!((parent, field), ("default_parameter" | "typed_default_parameter", Some("name")))
            || matches!(
                (parent, field),
                ("function_definition" | "class_definition", Some("name"))
            )
            || matches!(
                (parent, field),
                ("assignment" | "augmented_assignment", Some("left"))
            )
            || matches!(
                (parent, field),
                ("for_statement" | "for_in_clause", Some("left"))
            )
            || matches!((parent, field), ("as_pattern_target", _));
        if defining {
            return;
        }
        let name = self.name(node);
        for rule in &self.policy.calls {
            if rule.names.contains(name.as_ref()) {
                let line = Self::line(node);
                let message = with_description(
                    format!("Forbidden reference to '{name}' at line {line}"),
                    &rule.description,
                );
                self.found.push(Violation::new(message).at_line(line));
                break;
            }
        }
    }

    /// The value of a string literal, or of a concatenation of literals; `None` for anything
    /// computed (f-strings with fields, names, calls).
    fn literal(&self, node: Node<'_>) -> Option<String> {
        match node.kind() {
            "string" => {
                let mut cursor = node.walk();
                let mut out = String::new();
                for part in node.children(&mut cursor) {
                    match part.kind() {
                        "string_start" | "string_end" => {}
                        "string_content" | "escape_sequence" => out.push_str(self.text(part)),
                        _ => return None,
                    }
                }
                Some(out)
            }
            "concatenated_string" => {
                let mut cursor = node.walk();
                let parts: Vec<Node<'_>> = node.named_children(&mut cursor).collect();
                parts
                    .into_iter()
                    .map(|p| self.literal(p))
                    .collect::<Option<Vec<_>>>()
                    .map(|v| v.concat())
            }
            "binary_operator" => {
                let op = node.child_by_field_name("operator").map(|o| self.text(o))?;
                if op != "+" {
                    return None;
                }
                let left = self.literal(node.child_by_field_name("left")?)?;
                let right = self.literal(node.child_by_field_name("right")?)?;
                Some(left + &right)
            }
            "parenthesized_expression" => {
                let mut cursor = node.walk();
                let inner = node.named_children(&mut cursor).next()?;
                self.literal(inner)
            }
            _ => None,
        }
    }
}

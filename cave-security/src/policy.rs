//! `SecurityPolicy`: the rules, and one walk over the syntax tree that checks them all.

use crate::literal::{self, Prefix};
use crate::settle::{self, Reached};
use crate::statements;
use cave_core::{CodePolicy, Violation, ViolationKind, normalize_name};
use regex::Regex;
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::ops::Range;
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

/// Cells larger than this are not analysed when they need analysis: they are refused.
const MAX_ANALYSED_BYTES: usize = 1 << 20;

/// Syntax trees nested deeper than this are not analysed below that depth: refused. (Python
/// itself gives up on nesting far shallower: 200 open brackets, or about 3000 levels of
/// expression when it builds its own tree.)
const MAX_TREE_DEPTH: usize = 3000;

/// Functions that reach an attribute or a name by a string.
const BY_STRING: &[&str] = &[
    "getattr",
    "setattr",
    "delattr",
    "hasattr",
    "attrgetter",
    "methodcaller",
    "getattr_static",
];

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
/// Strings are decoded as Python decodes them (escapes, raw and byte strings, implicit and
/// `+` concatenation) before they are compared. A name computed at run time is refused only
/// with [`deny_computed_names`](Self::deny_computed_names) (part of [`strict`](Self::strict)).
/// A cell too large (over 1 MiB) or too deeply nested (over 3000 levels) to analyse is refused
/// when it needs analysis. A policy is a screen, not a sandbox.
#[derive(Clone, Debug, Default)]
pub struct SecurityPolicy {
    imports: Vec<Names>,
    calls: Vec<Names>,
    attributes: Vec<Names>,
    patterns: Vec<Pattern>,
    computed_names: bool,
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

    /// Forbids calling, referring to, or importing by name (`from m import f`) these functions.
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

    /// Refuses access by a name the policy cannot read from the source: `getattr`, `setattr`,
    /// `delattr`, `hasattr`, `operator.attrgetter`, `operator.methodcaller` and
    /// `inspect.getattr_static` with a name that is not a string literal, or passed around as
    /// values (or imported under another name); `globals()`, `vars()`, `locals()`,
    /// `__builtins__` or `x.__dict__` indexed by a computed key; `__import__` and
    /// `import_module` of a computed module; and `str.format` on a format string that is not a
    /// literal (format fields read attributes). Fail closed: what a screen cannot evaluate, it
    /// does not let through.
    pub fn deny_computed_names(mut self) -> Self {
        self.computed_names = true;
        self
    }

    /// A preset for running code from a model you do not fully trust, on a machine you care
    /// about:
    ///
    /// - imports of `os`, `subprocess`, `sys`, `shutil`, `socket`, `ctypes`, `importlib`,
    ///   `builtins`, `multiprocessing`, `pty`, `signal`, `pickle` and `marshal`;
    /// - `eval`, `exec`, `compile`, `open`, `__import__`, `breakpoint`, `input`, `globals`,
    ///   `vars`, `locals`, `__builtins__` in any form, and `getattr`-style access to those
    ///   names;
    /// - introspection attributes that reach interpreter internals: `__globals__`,
    ///   `__builtins__`, `__dict__`, `__subclasses__`, `__bases__`, `__base__`, `__mro__`,
    ///   `__code__`, `__closure__`, `__getattribute__`, `__reduce__`, `__reduce_ex__`,
    ///   `__loader__`, `__spec__`, and frame attributes (`f_globals`, `f_locals`, `f_back`,
    ///   `gi_frame`, `tb_frame`, `cr_frame`);
    /// - every name it cannot read from the source ([`deny_computed_names`](Self::deny_computed_names)).
    ///
    /// It does not stop what injected functions and objects can do, modules it does not list
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
                    "__builtins__",
                ],
                Some("dynamic code, files and interpreter state are not allowed"),
            )
            .deny_attributes(
                [
                    "__globals__",
                    "__builtins__",
                    "__dict__",
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
            .deny_computed_names()
    }

    /// Where in `code` the words whose presence makes a cell worth analysing occur, in order:
    /// a forbidden name, or a way to reach names by string, as a whole word. (Non-ASCII code
    /// is always analysed: Python folds `ｅｖａｌ` into `eval`.)
    fn word_offsets(&self, code: &str) -> Vec<usize> {
        let mut offsets: Vec<usize> = self
            .words()
            .flat_map(|word| word_matches(code, word))
            .collect();
        offsets.sort_unstable();
        offsets
    }

    /// The words whose presence makes a cell worth analysing.
    fn words(&self) -> impl Iterator<Item = &str> {
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
            "attrgetter",
            "methodcaller",
            "getattr_static",
        ];
        let formats: &[&str] = if self.computed_names {
            &["format", "format_map"]
        } else {
            &[]
        };
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
        formats
            .iter()
            .copied()
            .chain(import_roots)
            .chain(names)
            .chain(DOORS.iter().copied())
    }

    /// Whether the word at `at` is a door call whose tokens settle it (`settle::door_call`):
    /// the door's name breaks no rule, nor does the name it reaches, or that name is computed
    /// and the policy lets computed names be.
    fn settled(&self, code: &str, at: usize) -> bool {
        let Some((door, reached)) = settle::door_call(code, at) else {
            return false;
        };
        // What the walk checks of it: the door as a call (or as an attribute, called as
        // `x.getattr(...)`), and what it reaches as an attribute and as a function.
        let forbidden = |name: &str| {
            self.calls
                .iter()
                .chain(&self.attributes)
                .any(|rule| rule.names.contains(name))
        };
        !forbidden(door)
            && match reached {
                Reached::Literal(name) => !forbidden(name),
                Reached::Computed => !self.computed_names,
            }
    }

    /// Returns true if and only if the policy has no rules.
    pub fn is_empty(&self) -> bool {
        self.imports.is_empty()
            && self.calls.is_empty()
            && self.attributes.is_empty()
            && self.patterns.is_empty()
            && !self.computed_names
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

/// The word offsets in `code[range]`, as positions in a source holding that text after
/// `prefix` bytes; `None` (walk every node) when the text is not ASCII, where Python folds
/// names (`ｅｖａｌ` is `eval`) that the word scan does not see.
fn words_in(
    code: &str,
    offsets: &[usize],
    range: Range<usize>,
    prefix: usize,
) -> Option<Vec<usize>> {
    if !code[range.clone()].is_ascii() {
        return None;
    }
    let first = offsets.partition_point(|&at| at < range.start);
    Some(
        offsets[first..]
            .iter()
            .take_while(|&&at| at < range.end)
            .map(|&at| at - range.start + prefix)
            .collect(),
    )
}

/// Whether one of `offsets` (in order) lies in `range`.
fn any_in(offsets: &[usize], range: Range<usize>) -> bool {
    let first = offsets.partition_point(|&at| at < range.start);
    offsets.get(first).is_some_and(|&at| at < range.end)
}

/// Whether `at` lies in one of `ranges` (in order, not overlapping).
fn within(ranges: &[Range<usize>], at: usize) -> bool {
    let after = ranges.partition_point(|r| r.end <= at);
    ranges.get(after).is_some_and(|r| r.start <= at)
}

/// Where `word` occurs in `code` not inside a longer identifier.
fn word_matches<'c>(code: &'c str, word: &'c str) -> impl Iterator<Item = usize> + 'c {
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let bytes = code.as_bytes();
    code.match_indices(word).filter_map(move |(at, _)| {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(at + word.len()).copied();
        (!before.is_some_and(is_ident) && !after.is_some_and(is_ident)).then_some(at)
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
        self.check_statements(code, Split::WhenCheaper)
    }
}

impl SecurityPolicy {
    /// The check; `split`: whether to parse only the statements that could break a rule (the
    /// same answer as the whole cell's, when the cell parses).
    fn check_statements(&self, code: &str, split: Split) -> Vec<Violation> {
        if code.trim().is_empty() {
            return vec![Violation::new("The code is empty").with_kind(ViolationKind::Syntax)];
        }
        // Python reads `\r\n` and a lone `\r` as `\n`; tree-sitter does not end a comment at
        // `\r`, so code after one would go unseen. Read as Python reads it.
        let code: Cow<'_, str> = if code.contains('\r') {
            Cow::Owned(code.replace("\r\n", "\n").replace('\r', "\n"))
        } else {
            Cow::Borrowed(code)
        };
        let code = code.as_ref();
        let mut found = Vec::new();
        for pattern in &self.patterns {
            if let Some(m) = pattern.regex.find(code) {
                let line = code[..m.start()].matches('\n').count() + 1;
                found.push(
                    Violation::new(format!(
                        "Forbidden pattern at line {line}: {}",
                        pattern.description
                    ))
                    .at_line(line)
                    .with_kind(ViolationKind::Pattern)
                    .with_rule(pattern.regex.as_str()),
                );
            }
        }
        // Where the words that could break a rule occur: none (in ASCII code) means nothing
        // the tree could show. (Code that does not parse is then reported by Python itself
        // when it runs.)
        let mut offsets = self.word_offsets(code);
        if offsets.is_empty() && code.is_ascii() {
            return found;
        }
        // A word in a comment or a plain string is text: a rule is broken only by code (a
        // string names something only as the argument of a door, itself a word in code).
        let reading = if split == Split::Never {
            None
        } else {
            statements::read(code)
        };
        if let Some(reading) = &reading {
            offsets.retain(|&at| !within(&reading.inert, at));
        }
        // A door called with a plain literal or a computed name (`getattr(frame, 'total')`,
        // `getattr(frame, prefix + i)`) is read from its tokens: the tree would show no more.
        if split != Split::Never {
            offsets.retain(|&at| !self.settled(code, at));
        }
        if offsets.is_empty() && code.is_ascii() {
            return found;
        }
        if code.len() > MAX_ANALYSED_BYTES {
            found.push(Violation::new(format!(
                "The code is {} bytes, more than the code policy analyses ({MAX_ANALYSED_BYTES}): split it into smaller cells",
                code.len()
            )).with_kind(ViolationKind::TooComplex));
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
        // Parsing is most of a check's time, and a statement without a forbidden word or a
        // door to one cannot break a rule: only the statements that could are parsed.
        if let Some(reading) = reading
            && let Some(parts) =
                self.check_parts(&mut parser, code, reading.statements, &offsets, split)
        {
            found.extend(parts);
            return found;
        }
        // (Split::Never is the reference the tests hold the rest to: every node walked.)
        let words = if split == Split::Never {
            None
        } else {
            words_in(code, &offsets, 0..code.len(), 0)
        };
        let Some(mut walk) = self.walk(&mut parser, code, 0, false, words.as_deref()) else {
            found.push(
                Violation::new("The code policy could not parse the code")
                    .with_kind(ViolationKind::TooComplex),
            );
            return found;
        };
        if let Some(line) = walk.syntax_error {
            found.insert(
                0,
                Violation::new(format!(
                    "Syntax error at line {line}: the code does not parse"
                ))
                .at_line(line)
                .with_kind(ViolationKind::Syntax),
            );
        }
        found.append(&mut walk.found);
        found
    }

    /// The violations of the cell's top-level `statements` that hold a word at `offsets` (or
    /// non-ASCII text), each parsed alone; of a compound statement whose header holds none,
    /// only its block's statements that do. `None` when the parts to read are most of it (one
    /// parse is then cheaper than many; so is a cell of one simple statement), or when a part
    /// does not parse alone (perhaps split inside a statement): then the whole cell decides.
    fn check_parts(
        &self,
        parser: &mut Parser,
        code: &str,
        statements: Vec<Range<usize>>,
        offsets: &[usize],
        split: Split,
    ) -> Option<Vec<Violation>> {
        let worth_reading = |range: &Range<usize>| {
            any_in(offsets, range.clone()) || !code[range.clone()].is_ascii()
        };
        // What to parse: (range in the cell, whether it is a block's statement, lines before).
        let mut parts: Vec<(Range<usize>, bool, usize)> = Vec::new();
        let mut lines_before = 0;
        for statement in statements {
            let text = &code[statement.clone()];
            if worth_reading(&statement) {
                let in_cell = |r: Range<usize>| statement.start + r.start..statement.start + r.end;
                match statements::block_statements(text)
                    .filter(|(header, _)| !worth_reading(&in_cell(0..*header)))
                {
                    Some((_, block)) => {
                        let (mut line, mut counted) = (lines_before, 0);
                        for part in block {
                            if worth_reading(&in_cell(part.clone())) {
                                line += text[counted..part.start].matches('\n').count();
                                counted = part.start;
                                parts.push((in_cell(part), true, line));
                            }
                        }
                    }
                    None => parts.push((statement, false, lines_before)),
                }
            }
            lines_before += text.matches('\n').count();
        }
        let to_read: usize = parts.iter().map(|(range, _, _)| range.len()).sum();
        if split == Split::WhenCheaper && to_read > code.len() / 4 * 3 {
            return None;
        }
        let mut found = Vec::new();
        let mut too_deep = false;
        for (range, in_block, line) in parts {
            let walk = if in_block {
                // Under a header of its own, a block's statement parses as it does in place:
                // same text, indentation and depth.
                let words = words_in(code, offsets, range.clone(), BLOCK_HEADER.len());
                let source = format!("{BLOCK_HEADER}{}", &code[range]);
                self.walk(parser, &source, line - 1, too_deep, words.as_deref())?
            } else {
                let words = words_in(code, offsets, range.clone(), 0);
                self.walk(parser, &code[range], line, too_deep, words.as_deref())?
            };
            if walk.syntax_error.is_some() {
                return None;
            }
            too_deep = walk.too_deep;
            found.extend(walk.found);
        }
        Some(found)
    }

    /// Parses `source` (lines numbered from `first_line + 1`) and checks its nodes; `None`
    /// if the parser gave up. `too_deep`: the cell was already reported as nested too deep.
    /// `words`: where in `source` the policy's words start (`None`: walk every node).
    fn walk(
        &self,
        parser: &mut Parser,
        source: &str,
        first_line: usize,
        too_deep: bool,
        words: Option<&[usize]>,
    ) -> Option<Walked> {
        let tree = parser.parse(source, None)?;
        let mut walk = Walk {
            policy: self,
            source: source.as_bytes(),
            first_line,
            found: Vec::new(),
            syntax_error: None,
            parents: Vec::new(),
            too_deep,
            words,
        };
        walk.visit(&mut tree.walk());
        Some(Walked {
            found: walk.found,
            syntax_error: walk.syntax_error,
            too_deep: walk.too_deep,
        })
    }
}

/// What a walk over one parsed source found.
struct Walked {
    found: Vec<Violation>,
    /// The first line with a syntax error.
    syntax_error: Option<usize>,
    /// Reported as nested too deep.
    too_deep: bool,
}

/// Whether a check parses the statements that could break a rule alone (and ignores the
/// words in text, and walks only the nodes that hold a word).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Split {
    /// The whole cell, always, every word and every node: the reference.
    Never,
    /// Those statements, unless they are most of the cell (one parse is then cheaper).
    WhenCheaper,
    /// Those statements, however many (to test the split).
    #[cfg(test)]
    Always,
}

/// The line a block's statement is parsed under, alone: any compound header would do.
const BLOCK_HEADER: &str = "if 1:\n";

/// One pass over the tree.
struct Walk<'a, 't> {
    policy: &'a SecurityPolicy,
    source: &'a [u8],
    /// Lines of the cell before `source`.
    first_line: usize,
    found: Vec<Violation>,
    syntax_error: Option<usize>,
    /// Kinds of the ancestors of the current node.
    parents: Vec<&'t str>,
    /// Some part nested deeper than the policy analyses (reported once).
    too_deep: bool,
    /// Where the policy's words start in the source (`None`: everywhere is worth a look).
    words: Option<&'a [usize]>,
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

    /// A module's dotted name as Python reads it: its names joined by dots, whatever lies
    /// between them (spaces, or a line joined by `\`: `os` and `.path` so joined is `os.path`).
    fn module(&self, node: Node<'_>) -> String {
        if node.kind() != "dotted_name" {
            return self.name(node).into_owned();
        }
        let mut cursor = node.walk();
        let names: Vec<Cow<'_, str>> = node
            .named_children(&mut cursor)
            .filter(|c| !c.is_extra())
            .map(|c| self.name(c))
            .collect();
        names.join(".")
    }

    fn line(&self, node: Node<'_>) -> usize {
        self.first_line + node.start_position().row + 1
    }

    fn visit(&mut self, cursor: &mut TreeCursor<'t>) {
        // Iterative, so that deeply nested input cannot overflow the stack.
        let mut depth = 0usize;
        loop {
            let node = cursor.node();
            let field = cursor.field_name();
            self.check_node(node, field);
            let descend = node.child_count() > 0 && self.worth_descending(node);
            if descend && depth >= MAX_TREE_DEPTH {
                // Fail closed: what lies below is not analysed, so the cell is refused.
                if !self.too_deep {
                    self.too_deep = true;
                    let line = self.line(node);
                    self.found.push(
                        Violation::new(format!(
                            "The code nests deeper than the code policy analyses ({MAX_TREE_DEPTH} levels) at line {line}: split the expression into steps"
                        ))
                        .at_line(line)
                        .with_kind(ViolationKind::TooComplex),
                    );
                }
            } else if descend && cursor.goto_first_child() {
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

    /// Whether a node's children could hold a finding: a word of the policy starts inside it
    /// (what the tree can show is made of words: a name, an import's module, a door), or a
    /// syntax error lies below (the first one's line is reported).
    fn worth_descending(&self, node: Node<'_>) -> bool {
        let Some(words) = self.words else {
            return true;
        };
        any_in(words, node.start_byte()..node.end_byte()) || node.has_error()
    }

    fn check_node(&mut self, node: Node<'_>, field: Option<&str>) {
        if (node.is_error() || node.is_missing()) && self.syntax_error.is_none() {
            self.syntax_error = Some(self.line(node));
        }
        if !node.is_named() {
            return;
        }
        match node.kind() {
            "import_statement" => {
                let mut cursor = node.walk();
                for child in node.children_by_field_name("name", &mut cursor) {
                    let module = match child.kind() {
                        "aliased_import" => {
                            child.child_by_field_name("name").map(|n| self.module(n))
                        }
                        _ => Some(self.module(child)),
                    };
                    if let Some(module) = module {
                        self.import(&module, self.line(child));
                    }
                }
            }
            "import_from_statement" => {
                if let Some(module) = node
                    .child_by_field_name("module_name")
                    .filter(|m| m.kind() == "dotted_name")
                {
                    let module = self.module(module);
                    self.import(&module, self.line(node));
                }
                self.imported_functions(node);
                if self.policy.computed_names {
                    self.renamed_imports(node);
                }
            }
            "call" => self.call(node),
            "attribute" => {
                if let Some(name) = node.child_by_field_name("attribute") {
                    let name = self.name(name).into_owned();
                    let line = self.line(node);
                    self.attribute(&name, line);
                    let called = self.parents.last() == Some(&"call") && field == Some("function");
                    // (`df.open` is a column as often as a function: only functions that
                    // reach names by string are refused as values.)
                    if !called {
                        self.by_string_as_value(&name, line);
                    }
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
            let hit = rule.names.iter().find(|forbidden| {
                module == **forbidden || module.starts_with(&format!("{forbidden}."))
            });
            if let Some(forbidden) = hit {
                let message = with_description(
                    format!("Forbidden import '{module}' at line {line}"),
                    &rule.description,
                );
                self.found.push(
                    Violation::new(message)
                        .at_line(line)
                        .with_kind(ViolationKind::Import)
                        .with_rule(forbidden.as_str()),
                );
                return;
            }
        }
    }

    /// `from builtins import eval as run`: a forbidden function taken by its name from a
    /// module, perhaps under another one that no rule names.
    fn imported_functions(&mut self, node: Node<'_>) {
        if self.policy.calls.is_empty() {
            return;
        }
        let mut cursor = node.walk();
        let names: Vec<Node<'_>> = node
            .children_by_field_name("name", &mut cursor)
            .filter_map(|child| match child.kind() {
                "aliased_import" => child.child_by_field_name("name"),
                _ => Some(child),
            })
            .collect();
        for name in names {
            let line = self.line(name);
            self.called_name(&self.module(name), line, Use::Import);
        }
    }

    /// `from operator import attrgetter as get`: a function that reaches names by string,
    /// under a name the policy would not recognise.
    fn renamed_imports(&mut self, node: Node<'_>) {
        let mut cursor = node.walk();
        for child in node.children_by_field_name("name", &mut cursor) {
            if child.kind() != "aliased_import" {
                continue;
            }
            let Some(name) = child.child_by_field_name("name") else {
                continue;
            };
            let name = self.module(name);
            if BY_STRING.contains(&name.as_str()) {
                let line = self.line(child);
                self.found.push(
                    Violation::new(format!(
                        "'{name}' imported under another name at line {line}: the strict policy must see every access by name; import it as it is"
                    ))
                    .at_line(line)
                    .with_kind(ViolationKind::ComputedName)
                    .with_rule(name.as_str()),
                );
            }
        }
    }

    /// A forbidden function, called or used by name (`how` words the message).
    fn called_name(&mut self, name: &str, line: usize, how: Use) {
        for rule in &self.policy.calls {
            if rule.names.contains(name) {
                let found = match how {
                    Use::Call => format!("Forbidden call to '{name}' at line {line}"),
                    Use::Reference => format!("Forbidden reference to '{name}' at line {line}"),
                    Use::ByString => {
                        format!("Forbidden access to '{name}' by name at line {line}")
                    }
                    Use::Import => {
                        format!("Forbidden function '{name}' imported at line {line}")
                    }
                };
                let message = with_description(found, &rule.description);
                self.found.push(
                    Violation::new(message)
                        .at_line(line)
                        .with_kind(ViolationKind::Call)
                        .with_rule(name),
                );
                break;
            }
        }
    }

    /// A function that reaches names by string, taken as a value (`g = getattr`): whatever it
    /// is later called with is out of the policy's sight.
    fn by_string_as_value(&mut self, name: &str, line: usize) {
        if self.policy.computed_names && BY_STRING.contains(&name) {
            self.found.push(
                Violation::new(format!(
                    "'{name}' used as a value at line {line}: the strict policy must see what it is called with; call it directly with a string literal"
                ))
                .at_line(line)
                .with_kind(ViolationKind::ComputedName)
                .with_rule(name),
            );
        }
    }

    /// A name the policy cannot read, where strict needs to.
    fn computed(&mut self, what: &str, line: usize) {
        if self.policy.computed_names {
            self.found.push(
                Violation::new(format!(
                    "{what} at line {line}: the strict policy refuses names it cannot read from the source; write the name literally (obj.name, or a plain string)"
                ))
                .at_line(line)
                .with_kind(ViolationKind::ComputedName),
            );
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
        let line = self.line(node);
        self.called_name(&name, line, Use::Call);
        // Extras are no arguments: comments, and the joined line (`\` at a line's end), which
        // the grammar also shows as a named node.
        let args: Vec<Node<'_>> = node
            .child_by_field_name("arguments")
            .map(|a| {
                let mut cursor = a.walk();
                a.named_children(&mut cursor)
                    .filter(|c| !c.is_extra())
                    .collect()
            })
            .unwrap_or_default();
        let literal_arg = |walk: &Self, at: usize| args.get(at).and_then(|a| walk.literal(*a));
        match name.as_str() {
            // Dynamic imports.
            "__import__" | "import_module" => match literal_arg(self, 0) {
                Some(module) => self.import(&module, line),
                None => self.computed(&format!("'{name}' of a computed module"), line),
            },
            // Access by string: the name is an attribute, or a builtin reached through one.
            "getattr" | "setattr" | "delattr" | "hasattr" | "getattr_static" => {
                match literal_arg(self, 1) {
                    Some(attr) => self.named(&attr, line),
                    None => self.computed(&format!("'{name}' with a computed name"), line),
                }
            }
            // `attrgetter('a.b', 'c')`: dotted paths; `methodcaller('name', ...)`.
            "attrgetter" | "methodcaller" => {
                let count = if name == "attrgetter" { args.len() } else { 1 };
                for at in 0..count.max(1) {
                    match literal_arg(self, at) {
                        Some(path) => {
                            for part in path.split('.') {
                                self.named(part, line);
                            }
                        }
                        None => {
                            self.computed(&format!("'{name}' with a computed name"), line);
                            break;
                        }
                    }
                }
            }
            // Format fields read attributes: `'{0.__globals__}'.format(f)`.
            "format" | "format_map"
                if self.policy.computed_names && callee.kind() == "attribute" =>
            {
                let receiver = callee.child_by_field_name("object");
                match receiver.and_then(|r| self.literal(r)) {
                    Some(template) => {
                        for attr in format_field_attributes(&template) {
                            self.named(attr, line);
                        }
                    }
                    None => self.computed("A format string that is not a literal", line),
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
                .is_some_and(|f| matches!(self.name(f).as_ref(), "globals" | "vars" | "locals")),
            "identifier" => self.name(value) == "__builtins__",
            "attribute" => value
                .child_by_field_name("attribute")
                .is_some_and(|a| self.name(a) == "__dict__"),
            _ => false,
        };
        if !namespace_like {
            return;
        }
        let line = self.line(node);
        match node
            .child_by_field_name("subscript")
            .and_then(|k| self.literal(k))
        {
            Some(key) => self.named(&key, line),
            None => self.computed("A namespace indexed by a computed key", line),
        }
    }

    /// A name reached by string: checked as an attribute and as a function (folded as an
    /// identifier would be: stricter than Python, which does not fold strings).
    fn named(&mut self, name: &str, line: usize) {
        let name = python_name(name);
        let name = name.as_ref();
        self.attribute(name, line);
        self.called_name(name, line, Use::ByString);
    }

    fn attribute(&mut self, name: &str, line: usize) {
        for rule in &self.policy.attributes {
            if rule.names.contains(name) {
                let message = with_description(
                    format!("Forbidden attribute '{name}' at line {line}"),
                    &rule.description,
                );
                self.found.push(
                    Violation::new(message)
                        .at_line(line)
                        .with_kind(ViolationKind::Attribute)
                        .with_rule(name),
                );
                break;
            }
        }
    }

    /// A forbidden function used as a value (`f = open`, `key=eval`, `print(eval)`).
    fn reference(&mut self, node: Node<'_>, field: Option<&str>) {
        if self.policy.calls.is_empty() && !self.policy.computed_names {
            return;
        }
        let parent = self.parents.last().copied().unwrap_or("");
        let called = matches!((parent, field), ("call", Some("function")));
        let defining = DEFINING.contains(&parent)
            || called
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
        let name = self.name(node).into_owned();
        let line = self.line(node);
        self.called_name(&name, line, Use::Reference);
        self.by_string_as_value(&name, line);
    }

    /// The value of a string literal, or of a concatenation of literals (implicit or with
    /// `+`, in parentheses or not), decoded as Python decodes it; `None` for anything computed
    /// (f-strings with fields, names, calls) or malformed. Iterative: the operand chain of a
    /// long `'a' + 'a' + ...` is as deep as it is long.
    fn literal(&self, node: Node<'_>) -> Option<String> {
        let mut out = String::new();
        let mut pending = vec![node];
        while let Some(node) = pending.pop() {
            match node.kind() {
                "string" => out.push_str(&self.string_value(node)?),
                "concatenated_string" => {
                    let mut cursor = node.walk();
                    let parts: Vec<Node<'_>> = node
                        .named_children(&mut cursor)
                        .filter(|c| !c.is_extra())
                        .collect();
                    pending.extend(parts.into_iter().rev());
                }
                "binary_operator" => {
                    let op = node.child_by_field_name("operator").map(|o| self.text(o))?;
                    if op != "+" {
                        return None;
                    }
                    pending.push(node.child_by_field_name("right")?);
                    pending.push(node.child_by_field_name("left")?);
                }
                "parenthesized_expression" => {
                    let mut cursor = node.walk();
                    let inner: Vec<Node<'_>> = node
                        .named_children(&mut cursor)
                        .filter(|c| !c.is_extra())
                        .collect();
                    match inner.as_slice() {
                        [only] => pending.push(*only),
                        _ => return None,
                    }
                }
                _ => return None,
            }
        }
        Some(out)
    }

    /// One string literal's value: its body decoded per its prefix; `None` if it has fields.
    fn string_value(&self, node: Node<'_>) -> Option<String> {
        let mut cursor = node.walk();
        let mut start = None;
        let mut end = None;
        for part in node.children(&mut cursor) {
            match part.kind() {
                "string_start" => start = Some(part),
                "string_end" if !part.is_missing() => end = Some(part),
                "string_content" => {}
                _ => return None,
            }
        }
        let (start, _) = (start?, end?);
        let opening = self.text(start);
        let prefix = opening.trim_end_matches(['\'', '"']);
        let quote = &opening[prefix.len()..];
        // The body ends where the closing quote starts (the grammar's `string_end` may hold
        // trailing backslashes of a raw string, so it is not the boundary).
        let body_end = node.end_byte().checked_sub(quote.len())?;
        let body = self
            .source
            .get(start.end_byte()..body_end)
            .and_then(|b| std::str::from_utf8(b).ok())?;
        if !self.text(node).ends_with(quote) {
            return None;
        }
        literal::decode(body, Prefix::parse(prefix))
    }
}

/// How a forbidden function's name was used.
#[derive(Clone, Copy)]
enum Use {
    Call,
    Reference,
    ByString,
    Import,
}

/// The attribute names a format string's fields read: `{0.a.b}` reads `a` and `b`; `{x[k]}`
/// reads an item, not an attribute. Nested fields in a format spec are read too.
fn format_field_attributes(template: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let bytes = template.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != b'{' {
            at += 1;
            continue;
        }
        if bytes.get(at + 1) == Some(&b'{') {
            at += 2;
            continue;
        }
        let field_start = at + 1;
        let field_end = template[field_start..]
            .find(['}', '!', ':', '{'])
            .map_or(template.len(), |i| field_start + i);
        let field = &template[field_start..field_end];
        // After the first component: `.name` is an attribute, `[key]` an item.
        let mut rest = field.find(['.', '[']).map_or("", |i| &field[i..]);
        while !rest.is_empty() {
            if let Some(after_dot) = rest.strip_prefix('.') {
                let end = after_dot.find(['.', '[']).unwrap_or(after_dot.len());
                found.push(&after_dot[..end]);
                rest = &after_dot[end..];
            } else {
                let end = rest.find(']').map_or(rest.len(), |i| i + 1);
                rest = &rest[end..];
            }
        }
        at = field_end.max(at + 1);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::{SecurityPolicy, Split};
    use cave_core::{CodePolicy, ViolationKind};
    use proptest::prelude::*;

    /// Statements that are hard to split: code-like text in strings, clauses and decorators at
    /// column 0, joined lines, f-strings, brackets over lines, indentation, and statements
    /// that break rules or do not parse.
    const TRICKY: &[&str] = &[
        "x = 1\n",
        "s = '''\nimport os\neval(1)\n'''\n",
        "s = \"\"\"\n\"\"\"; eval(1)\n",
        "t = r'\\''; open('f')\n",
        "if x:\n    y = 1\nelse:\n    getattr(x, 'ev' 'al')\n",
        "try:\n    import os\nexcept ImportError:\n    pass\nfinally:\n    z = vars()['open']\n",
        "@decorator(getattr)\ndef f(a=eval):\n    return a\n",
        "@property\n\nclass C:\n    x = __builtins__\n",
        "v = (1,\neval)\n",
        "w = [\n    open,\n]\n",
        "u = 1 + \\\n    2; g = getattr\n",
        "f'{x!r:>{w}}'\n",
        "f\"{d['k']}\" + 'import os'\n",
        "print(f'{getattr(x, \"__globals__\")}')\n",
        "'{0.__globals__}'.format(f)\n",
        "    indented = eval\n",
        "def broken(:\n",
        "x = (\n",
        "# a comment\n",
        "\n",
        "from importlib import import_module as im\n",
        "result = summarize(data)\n",
        "for k in range(3):\n    print(k)\n# col 0 comment\n    print(open)\n",
        "lambda: globals()\n",
        "ｅｖａｌ('1')\n",
        "class D:\n    def m(self):\n        return self.__dict__\n",
        "match p:\n    case {'k': v}:\n        eval(v)\n",
        "async def a():\n    await b(__import__('os'))\n",
        "def g(x):\n    y = x\n    return getattr(y, 'open')\n",
        "def h():\n    '''doc\nimport os\n'''\n    z = eval\n\n    @dec\n    def inner():\n        return globals()\n",
        "class E:\n    a = 1\n    b = vars()['x']\n    def m(self, v=__builtins__):\n        pass\n",
        "while True:\n    x = (1,\neval)\n    break\n",
        "if a:\n\tb = getattr(c, 'd')\n\te = 1\n",
        "def k():\n    x = 1\n  y = open\n",
        "for i in x:\n    s = \"\"\"\n__import__('os')\n\"\"\"\n    import subprocess\n",
        "def f():\n    x = 1; import os\n    if x:\n        pass\n    else:\n        getattr(x, 'y')\n",
        "with getattr(a, 'b') as c:\n    d = 1\n",
        "def ｆ():\n    x = 1\n",
        "def one(): return open\n",
        "class F:\n    def m(self):\n        pass\n    x = ｅｖａｌ\n",
        // Words in comments and strings, beside code that holds them or not.
        "x = '#'; y = eval\n",
        "s = \"it's # no comment\"; z = open\n",
        "y = 1  # eval, open, getattr\nz = 2\n",
        "s = 'getattr(a, \"__globals__\")'\n",
        "s = r'\\''; t = eval\n",
        "d = '''\neval\n'''; e = getattr(d, 'upper')\n",
        "f = f'{eval(1)}' + f'{{open}}'\n",
        "g = rb'exec' + b'open' + u'vars'\n",
        "h = \"\"  \"eval\" '' 'globals'\n",
        "i = ''' ''' ; j = '''open''' + '''\n''' + getattr(i, '__dict__')\n",
        "# import os\nk = 1\n",
        "def m():\n    '''Opens it with open, then eval.'''\n    return 1  # getattr\n",
        "n = (1,  # eval\n     open)\n",
        // Doors the tokens settle, and forms beside them that only the tree can read.
        "a = getattr(frame, 'total').sum() / len(frame)\n",
        "b = getattr(frame, '__globals__')\n",
        "c = x.getattr(y, 'z'); d = hasattr(y, name)\n",
        "e = getattr(y, 'z')(getattr, 'w')\n",
        "f = (getattr\n(y, 'eval'))\n",
        "g = getattr(y, r'open') or delattr(y, 'exec' )\n",
        "h = setattr(y, 'summarize', 1)\n",
        "i = getattr(getattr(y, 'a'), 'b').__dict__\n",
        "@getattr(y, 'z')\ndef j(): pass\n",
        "match p:\n    case getattr(y, 'z'):\n        pass\n",
        "k = getattr_static(y, 'vars') + hasattr(y, \"ok\")\n",
        "l = getattr(y, '''open''') + getattr(y, 'o' 'pen')\n",
        "m = getattr(y, prefix + 'eval') or hasattr(y, lambda: 'open')\n",
        "n = getattr(y, r'op' 'en') or getattr(y, u'__glo' + 'bals__', None)\n",
        "o = getattr(y, f'ex' 'ec', 0) + getattr(y, 'total', 0) + getattr(y, 'open', 0)\n",
        "p = getattr(y, x if c else 'ev' 'al') or getattr(y, name='op' 'en')\n",
        "q = getattr(y, ('op' 'en')) or getattr(y, 'op' + 'en') or getattr(y, 'ok' , 'eval')\n",
        "r = getattr(y, b'__code__'.decode()) + getattr(y, 'x'.join(z))\n",
        // (One door to a statement: a statement with any word left unsettled is walked whole.)
        "s = getattr(y, '__glo' + r'bals__')\n",
        "t = getattr(y, '__co' u'de__')\n",
        "u = getattr(y, f'ev' f'al')\n",
        "v = getattr(y, F'op' 'en')\n",
        "w = getattr(y, 'op' + ('en'))\n",
        "x = getattr(y, 'op'+'en')\n",
        "z = getattr(y, 'total_' + name) + getattr(y, f'total_{i}') + getattr(y, 'x'.join(z), 0)\n",
        "a1 = getattr(frames[0], '__globals__')\n",
        "a2 = getattr(self.f(x)[1:2], 'ev' 'al')\n",
        "a3 = getattr(rows(3).first, r'__co' 'de__')\n",
        "a4 = getattr(m(*a, **k), u'op' + 'en') or getattr(a[b](c), prefix + 'x')\n",
        "a5 = getattr(f(g[1], h(2)).i, 'total', None).sum()\n",
    ];

    fn corpus() -> Vec<&'static str> {
        let allowed = include_str!("../tests/corpus/allowed.py");
        let refused = include_str!("../tests/corpus/refused.py");
        allowed
            .split("# ---\n")
            .chain(refused.split("# ---\n"))
            .chain(TRICKY.iter().copied())
            .collect()
    }

    fn policy() -> SecurityPolicy {
        SecurityPolicy::strict()
            .deny_calls(["summarize"], None)
            .deny_regex(r"rm\s+-rf", None)
            .unwrap()
    }

    /// The rules of the bench: names computed at run time are let be.
    fn lenient() -> SecurityPolicy {
        SecurityPolicy::new()
            .deny_imports(["os", "subprocess", "sys"], None)
            .deny_calls(["eval", "exec", "open"], None)
            .deny_attributes(["__globals__", "__code__"], None)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Parsing only the statements that could break a rule, and reading doors from their
        /// tokens, finds what walking the whole cell finds, with the same lines, whenever the
        /// cell parses: under the strict policy and under one that lets computed names be.
        #[test]
        fn the_statements_parsed_alone_find_what_the_whole_cell_shows(
            picks in prop::collection::vec(any::<prop::sample::Index>(), 1..8)
        ) {
            let pieces = corpus();
            let code: String = picks.iter().map(|i| *i.get(&pieces)).collect();
            for policy in [policy(), lenient()] {
                let whole = policy.check_statements(&code, Split::Never);
                if !whole.iter().any(|v| v.kind == ViolationKind::Syntax) {
                    prop_assert_eq!(policy.check(&code), whole.clone(), "{:?}", code);
                    prop_assert_eq!(policy.check_statements(&code, Split::Always), whole, "{:?}", code);
                }
            }
        }
    }

    #[test]
    fn a_door_read_from_its_tokens_still_finds_what_it_reaches() {
        let policy = lenient();
        let settled = "total = getattr(frame, 'total').sum()\n".repeat(3);
        assert_eq!(policy.check(&settled), []);
        let found = policy.check(&format!("{settled}g = getattr(frame, '__globals__')\n"));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].line, Some(4), "{found:?}");
        assert_eq!(found[0].kind, ViolationKind::Attribute, "{found:?}");
        let found = policy.check("f = getattr(__builtins__, 'eval')\n");
        assert_eq!(found[0].kind, ViolationKind::Call, "{found:?}");
        // Computed: let be by this policy, refused by the strict one.
        assert_eq!(policy.check("v = getattr(frame, name)\n"), []);
        let found = SecurityPolicy::strict().check("v = getattr(frame, name)\n");
        assert_eq!(found[0].kind, ViolationKind::ComputedName, "{found:?}");
        let sum = "v = getattr(frame, prefix + str(i)).sum()\n";
        assert_eq!(policy.check(sum), []);
        let found = SecurityPolicy::strict().check(sum);
        assert_eq!(found[0].kind, ViolationKind::ComputedName, "{found:?}");
        // A string's prefix touches its quote: a string, read by the tree.
        let found = policy.check("v = getattr(frame, r'__glo' 'bals__')\n");
        assert_eq!(found[0].kind, ViolationKind::Attribute, "{found:?}");
        // A door the policy forbids by name is a finding however it is called.
        let found = SecurityPolicy::new()
            .deny_calls(["getattr"], None)
            .check("v = getattr(frame, 'total')\n");
        assert_eq!(found[0].kind, ViolationKind::Call, "{found:?}");
    }

    #[test]
    fn a_forbidden_name_in_a_long_function_is_found_at_its_line() {
        let mut code = "x = 1\n".repeat(20);
        code.push_str("def f(df):\n");
        code.push_str(&"    y = df.sum()\n".repeat(20));
        code.push_str("    z = getattr(df, 'ev' 'al')\n    return z\n");
        code.push_str(&"w = 2\n".repeat(20));
        let found = policy().check(&code);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].line, Some(42), "{found:?}");
        assert_eq!(found, policy().check_statements(&code, Split::Never));
    }

    #[test]
    fn words_in_comments_and_strings_are_text_but_code_after_a_lone_cr_is_not() {
        let policy = policy();
        assert_eq!(
            policy.check("x = 1  # eval\ns = 'open' + \"getattr\"\n"),
            []
        );
        // Python ends the comment at `\r`: the call is code.
        let found = policy.check("x = 1  # note\reval('1')\n");
        assert!(
            found.iter().any(|v| v.message.contains("'eval'")),
            "{found:?}"
        );
        // A field is code.
        let found = policy.check("s = f'{open(1)}'  # open\n");
        assert!(
            found.iter().any(|v| v.message.contains("'open'")),
            "{found:?}"
        );
    }

    #[test]
    fn a_statement_that_does_not_parse_alone_is_analysed_in_the_whole_cell() {
        let policy = policy();
        let broken = "x = 1\ndef f(:\n    eval(1)\n";
        let found = policy.check(broken);
        assert_eq!(found[0].kind, ViolationKind::Syntax, "{found:?}");
        assert!(
            found.iter().any(|v| v.message.contains("'eval'")),
            "{found:?}"
        );
    }
}

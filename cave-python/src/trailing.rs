//! Where a cell's last top-level statement begins and whether it is an expression, read from
//! its source without a parse: the executor then compiles the cell from source (once, or the
//! body and the trailing expression apart) instead of building Python's syntax tree as
//! objects and compiling that. The reading is conservative: anything it is not sure of
//! (f-strings with fields, `;`, `lambda`, soft keywords, `__future__`) is [`Trailing::Unknown`],
//! and the executor takes the syntax-tree way, so both ways echo the same value (a property
//! test holds them to it against Python's own `ast`).

/// What the last top-level statement of a cell is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trailing {
    /// An expression statement starting at this byte offset, at the start of its line: the
    /// cell's body is what comes before it.
    Expression(usize),
    /// Not an expression statement (an assignment, an import, a compound statement…), or no
    /// statement at all: the whole cell compiles as one body.
    Statement,
    /// Not sure: the executor parses the cell.
    Unknown,
}

/// Keywords that begin a statement that is not an expression.
const STATEMENT_KEYWORDS: &[&str] = &[
    "import", "from", "def", "class", "if", "elif", "else", "for", "while", "with", "try",
    "except", "finally", "return", "pass", "break", "continue", "raise", "global", "nonlocal",
    "del", "assert", "async",
];

/// Words whose meaning depends on what follows when they begin a statement (soft keywords):
/// the reading gives up on a statement that starts with one.
const SOFT_KEYWORDS: &[&str] = &["match", "case", "type"];

/// Words that make a top-level `=` or `:` ambiguous, or a statement not an expression
/// statement: the reading gives up on a statement that holds one.
const UNSURE_WORDS: &[&str] = &["lambda", "yield"];

/// The most bytes read; a longer cell is parsed (the reading is linear, but a bound keeps it
/// from doing work the parse would repeat).
const MAX_SOURCE: usize = 1 << 20;

/// What the executor's `run_cell` takes as `split`, read from `source`: `Some(None)` when its
/// last statement is not an expression (compile it whole), `Some(Some((start, line)))` when a
/// trailing expression starts at character `start`, the start of line `line` (from 1); `None`
/// when the reading is not sure (the executor parses the cell).
pub fn executor_split(source: &str) -> Option<Option<(usize, usize)>> {
    match trailing(source) {
        Trailing::Statement => Some(None),
        Trailing::Expression(at) => {
            let body = &source[..at];
            Some(Some((body.chars().count(), body.matches('\n').count() + 1)))
        }
        Trailing::Unknown => None,
    }
}

/// Reads `source` (a cell) for its last top-level statement.
pub fn trailing(source: &str) -> Trailing {
    if source.len() > MAX_SOURCE || source.contains("__future__") {
        return Trailing::Unknown;
    }
    match Scanner::new(source).run() {
        Some(last) => last,
        None => Trailing::Unknown,
    }
}

/// What the scan keeps of the statement being read.
#[derive(Default)]
struct Statement {
    /// Byte offset of its first token.
    start: usize,
    /// It began at the start of a line (column 0).
    at_line_start: bool,
    /// Its first word, if it began with one.
    first_word: Option<(usize, usize)>,
    /// A top-level `=`, augmented assignment or annotation `:` was seen.
    assigns: bool,
    /// Something the reading is not sure of was seen.
    unsure: bool,
    /// It has a token at all.
    started: bool,
}

struct Scanner<'a> {
    src: &'a str,
    bytes: &'a [u8],
    at: usize,
    depth: usize,
    /// At the start of a logical line (after a newline outside brackets, or at the start).
    line_start: bool,
    last: Option<Statement>,
    current: Statement,
}

impl<'a> Scanner<'a> {
    fn new(src: &'a str) -> Self {
        Self {
            src,
            bytes: src.as_bytes(),
            at: 0,
            depth: 0,
            line_start: true,
            last: None,
            current: Statement::default(),
        }
    }

    /// Scans the whole source; `None` when it gives up.
    fn run(mut self) -> Option<Trailing> {
        while self.at < self.bytes.len() {
            let b = self.bytes[self.at];
            match b {
                b'\n' => {
                    self.at += 1;
                    if self.depth == 0 {
                        self.end_line();
                    }
                }
                b' ' | b'\t' | b'\x0c' | b'\r' => self.at += 1,
                b'#' => {
                    while self.at < self.bytes.len() && self.bytes[self.at] != b'\n' {
                        self.at += 1;
                    }
                }
                b'\\' => {
                    // A continuation: the backslash ends its line.
                    if self.bytes.get(self.at + 1) == Some(&b'\n') {
                        self.at += 2;
                    } else if self.bytes.get(self.at + 1..self.at + 3) == Some(b"\r\n") {
                        self.at += 3;
                    } else {
                        return None;
                    }
                }
                b'\'' | b'"' => {
                    self.token(self.at);
                    self.string(self.at, false)?;
                }
                b'(' | b'[' | b'{' => {
                    self.token(self.at);
                    self.depth += 1;
                    self.at += 1;
                }
                b')' | b']' | b'}' => {
                    self.token(self.at);
                    self.depth = self.depth.checked_sub(1)?;
                    self.at += 1;
                }
                b';' if self.depth == 0 => return None,
                _ if b.is_ascii_alphabetic() || b == b'_' || b >= 0x80 => self.word()?,
                b'0'..=b'9' => {
                    self.token(self.at);
                    while self.at < self.bytes.len()
                        && (self.bytes[self.at].is_ascii_alphanumeric()
                            || matches!(self.bytes[self.at], b'.' | b'_'))
                    {
                        // An exponent's sign belongs to the number.
                        if matches!(self.bytes[self.at], b'e' | b'E')
                            && matches!(self.bytes.get(self.at + 1), Some(b'+' | b'-'))
                        {
                            self.at += 1;
                        }
                        self.at += 1;
                    }
                }
                _ => self.operator()?,
            }
        }
        if self.depth != 0 {
            return None;
        }
        self.end_line();
        let last = match self.last.take() {
            Some(last) => last,
            None => return Some(Trailing::Statement),
        };
        if last.unsure || !last.at_line_start {
            return None;
        }
        let word = last.first_word.map(|(s, e)| &self.src[s..e]);
        if word.is_some_and(|w| STATEMENT_KEYWORDS.contains(&w)) || last.assigns {
            return Some(Trailing::Statement);
        }
        if self.src[last.start..].starts_with('@') {
            return Some(Trailing::Statement);
        }
        Some(Trailing::Expression(last.start))
    }

    /// A token at `at` (not a comment or whitespace) belongs to the current statement.
    fn token(&mut self, at: usize) {
        if !self.current.started {
            self.current.started = true;
            self.current.start = at;
            self.current.at_line_start = self.line_start && self.column_zero(at);
        }
    }

    fn column_zero(&self, at: usize) -> bool {
        at == 0 || self.bytes[at - 1] == b'\n'
    }

    /// A logical line ended: a statement that began on it is the last one so far, unless the
    /// line continues a compound statement whose header it is part of (indented lines, and
    /// `else`/`elif`/`except`/`finally` at column 0, belong to the statement before).
    fn end_line(&mut self) {
        let current = std::mem::take(&mut self.current);
        self.line_start = true;
        if !current.started {
            return;
        }
        let word = current.first_word.map(|(s, e)| &self.src[s..e]);
        let continues = !current.at_line_start
            || word.is_some_and(|w| matches!(w, "else" | "elif" | "except" | "finally"));
        match (&mut self.last, continues) {
            (Some(last), true) => {
                // Part of the last statement (its block): what it holds does not change what
                // the statement is, but an unsure line inside still counts as unsure only for
                // a statement that could be an expression, which a block-holding one is not.
                last.assigns |= current.assigns;
            }
            (None, true) => {
                // An indented first line: the cell does not compile; the parse says why.
                self.last = Some(Statement {
                    unsure: true,
                    ..current
                });
            }
            (_, false) => self.last = Some(current),
        }
    }

    /// A name or keyword, or a string with a prefix (`rb'…'`, `f"…"`).
    fn word(&mut self) -> Option<()> {
        let start = self.at;
        while self.at < self.bytes.len()
            && (self.bytes[self.at].is_ascii_alphanumeric()
                || self.bytes[self.at] == b'_'
                || self.bytes[self.at] >= 0x80)
        {
            self.at += 1;
        }
        let word = &self.src[start..self.at];
        if matches!(self.bytes.get(self.at), Some(b'\'' | b'"'))
            && word.len() <= 2
            && word
                .chars()
                .all(|c| matches!(c.to_ascii_lowercase(), 'r' | 'b' | 'f' | 'u'))
        {
            self.token(start);
            let formatted = word.to_ascii_lowercase().contains('f');
            return self.string(self.at, formatted);
        }
        self.token(start);
        if self.current.start == start {
            self.current.first_word = Some((start, self.at));
            if SOFT_KEYWORDS.contains(&word) {
                self.current.unsure = true;
            }
        }
        if UNSURE_WORDS.contains(&word) {
            self.current.unsure = true;
        }
        Some(())
    }

    /// A string starting with the quote at `at`; an f-string with a field gives up (fields
    /// may hold quotes of their own).
    fn string(&mut self, at: usize, formatted: bool) -> Option<()> {
        let quote = self.bytes[at];
        let triple = self.bytes.get(at..at + 3) == Some(&[quote, quote, quote][..]);
        self.at = at + if triple { 3 } else { 1 };
        loop {
            let b = *self.bytes.get(self.at)?;
            if formatted && b == b'{' {
                self.current.unsure = true;
            }
            // A backslash keeps the character after it in the string, a quote included, raw
            // strings too.
            if b == b'\\' {
                self.at += 2;
                continue;
            }
            if b == b'\n' && !triple {
                return None;
            }
            if b == quote {
                if !triple {
                    self.at += 1;
                    return Some(());
                }
                if self.bytes.get(self.at..self.at + 3) == Some(&[quote, quote, quote][..]) {
                    self.at += 3;
                    return Some(());
                }
            }
            self.at += 1;
        }
    }

    /// An operator or delimiter: what matters is a top-level assignment or annotation.
    fn operator(&mut self) -> Option<()> {
        let start = self.at;
        self.token(start);
        let rest = &self.bytes[start..];
        // The longest operator that fits, so that `==` is not read as `=`.
        const OPERATORS: &[&[u8]] = &[
            b"**=", b"//=", b">>=", b"<<=", b"...", b"->", b":=", b"==", b"!=", b"<=", b">=",
            b"+=", b"-=", b"*=", b"/=", b"%=", b"&=", b"|=", b"^=", b"@=", b"**", b"//", b">>",
            b"<<",
        ];
        let op = OPERATORS
            .iter()
            .find(|op| rest.starts_with(op))
            .map_or(&rest[..1], |op| *op);
        self.at += op.len();
        if self.depth == 0 {
            let assigning = op.len() >= 2
                && op.ends_with(b"=")
                && !matches!(op, b"==" | b"!=" | b"<=" | b">=" | b":=");
            if op == b"=" || op == b":" || assigning {
                self.current.assigns = true;
            }
        }
        // Bytes that are not Python (`$`, `?`, a lone `!`): the parse reports them.
        if op.len() == 1 && b"+-*/%&|^~<>=.,:@!".iter().all(|c| *c != op[0]) {
            self.current.unsure = true;
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_imports_and_blocks_are_statements() {
        for cell in [
            "x = 1",
            "x += 1",
            "x: int = 1",
            "a, b = 1, 2",
            "import os",
            "for i in range(3):\n    i\n",
            "if x:\n    y\nelse:\n    z",
            "def f():\n    return 1\n",
            "@decorator\ndef f():\n    pass",
            "",
            "# only a comment\n",
            "x = (1,\n     2)\n",
            "d['k'] = 'v'",
            "try:\n    x\nexcept E:\n    y\nfinally:\n    z",
        ] {
            assert_eq!(trailing(cell), Trailing::Statement, "{cell:?}");
        }
    }

    #[test]
    fn a_trailing_expression_is_found_where_it_starts() {
        let cell = "x = 1\ny = [1,\n  2]\nx + y[0]\n";
        assert_eq!(
            trailing(cell),
            Trailing::Expression(cell.find("x + y").unwrap())
        );
        assert_eq!(trailing("df"), Trailing::Expression(0));
        let cell = "for i in r:\n    pass\nsum(\n  r,\n)  # total\n\n";
        assert_eq!(
            trailing(cell),
            Trailing::Expression(cell.find("sum").unwrap())
        );
        let cell = "s = '''a\nb = 1\n'''\ns == 'x'";
        assert_eq!(
            trailing(cell),
            Trailing::Expression(cell.find("s ==").unwrap())
        );
        assert_eq!(trailing("await f()"), Trailing::Expression(0));
        assert_eq!(trailing("x \\\n  + 1"), Trailing::Expression(0));
    }

    #[test]
    fn what_it_is_not_sure_of_is_left_to_the_parse() {
        for cell in [
            "x; y",
            "f'{x}'",
            "lambda x: x",
            "match(x)",
            "type(x)",
            "from __future__ import annotations\nx",
            "  x",
            "x = (",
            "'open",
            "x ? y",
            "(x for x in y) $",
        ] {
            assert_eq!(trailing(cell), Trailing::Unknown, "{cell:?}");
        }
        // An f-string without fields is a string like any other.
        assert_eq!(trailing("f'plain'"), Trailing::Expression(0));
        assert_eq!(trailing("print(1)"), Trailing::Expression(0));
        assert_eq!(trailing("x.type"), Trailing::Expression(0));
    }
}

//! Where a cell's top-level statements begin, and those of a compound statement's block, so
//! that the policy parses only the statements whose words could break a rule.
//!
//! A conservative reading of Python's tokens (strings, brackets, comments, line joins): it
//! splits only where a line starts outside any string or bracket, at column 0 (or at exactly
//! the block's indentation, every other line of the block indented further), and answers
//! `None` (analyse the cell whole) on anything it is not sure of, such as a quote inside an
//! f-string's field that Python 3.11 and 3.12 read differently, a `\r`, or an unterminated
//! string. A part too many is harmless (statements merged); a split inside a statement would
//! not be, so the policy also analyses the whole cell when a part does not parse.
//!
//! The same reading says which text is inert (comments, strings without fields), whose words
//! the policy then ignores. That must be exact, as a parse cannot catch it: a string taken to
//! end late, or a comment that Python ends at a lone `\r`, would hide code. So a string ends
//! only where Python's tokenizer ends it, and a `\r` anywhere gives up on the whole reading.

use std::ops::Range;

/// A cell as the policy reads it before parsing anything.
pub(crate) struct Reading {
    /// The byte ranges of the cell's top-level statements, in order and covering the whole
    /// cell (comments and blank lines belong to the statement before them; decorators, `else`,
    /// `elif`, `except` and `finally` to theirs).
    pub(crate) statements: Vec<Range<usize>>,
    /// Where the cell holds only text Python never runs, in order: its comments and its string
    /// literals without replacement fields (f-strings and t-strings are never inert).
    pub(crate) inert: Vec<Range<usize>>,
}

/// The cell's top-level statements and its inert text, in one pass; `None` when the cell is
/// not split (and then nothing of it is taken as inert).
pub(crate) fn read(code: &str) -> Option<Reading> {
    let b = code.as_bytes();
    let mut starts = vec![0];
    let mut inert = Vec::new();
    // The last statement that started at column 0 is a decorator: the next one is its target.
    let mut decorated = false;
    for at in logical_lines(code, Some(&mut inert))? {
        let c = b[at];
        if begins_statement(c) {
            if at > 0 && !decorated && !continues_clause(&b[at..]) {
                starts.push(at);
            }
            decorated = c == b'@';
        }
    }
    Some(Reading {
        statements: ranges(&starts, b.len()),
        inert,
    })
}

/// A compound statement (`statement`, one of [`Reading::statements`]) as its header and the
/// statements of its block: the header's end, then the block's statements, covering the rest
/// in order (comments, blank lines, clauses and decorators kept as at the top level). `None`
/// when the statement is not one header followed by one indented block: a decorated
/// definition, a statement with `else`/`except` clauses, a one-line body, a simple statement.
pub(crate) fn block_statements(statement: &str) -> Option<(usize, Vec<Range<usize>>)> {
    let b = statement.as_bytes();
    let lines = logical_lines(statement, None)?;
    // The header: the first logical line, which must start the statement (not a decorator).
    if b.first().is_none_or(|&c| c == b'@' || !begins_statement(c)) {
        return None;
    }
    let mut starts: Vec<usize> = Vec::new();
    let mut indent: Option<&[u8]> = None;
    let mut decorated = false;
    for at in lines.into_iter().skip(1) {
        let width = b[at..]
            .iter()
            .position(|&c| !matches!(c, b' ' | b'\t' | b'\x0c'))
            .unwrap_or(b.len() - at);
        // Blank and comment-only lines: their indentation means nothing to Python.
        if matches!(b.get(at + width), None | Some(b'\n' | b'#')) {
            continue;
        }
        let whitespace = &b[at..at + width];
        let block = *indent.get_or_insert(whitespace);
        if block.is_empty() {
            // Back at the header's column (a clause) or no indented block at all.
            return None;
        }
        if whitespace == block {
            let c = b[at + width];
            if !begins_statement(c) {
                return None;
            }
            if starts.is_empty() || (!decorated && !continues_clause(&b[at + width..])) {
                starts.push(at);
            }
            decorated = c == b'@';
        } else if !whitespace.starts_with(block) {
            // Less indented than the block, or indented differently: not sure where it ends.
            return None;
        }
    }
    let header_end = *starts.first()?;
    Some((header_end, ranges(&starts, b.len())))
}

/// Consecutive ranges from each start to the next, the last to `end`.
fn ranges(starts: &[usize], end: usize) -> Vec<Range<usize>> {
    let mut ranges: Vec<Range<usize>> = starts.windows(2).map(|w| w[0]..w[1]).collect();
    if let Some(&last) = starts.last() {
        ranges.push(last..end);
    }
    ranges
}

/// Where the code's logical lines begin (lines that start outside any string and bracket and
/// do not continue a joined line; the first at 0), or `None` when the code does not
/// tokenize the same on every Python version (see the module's documentation). `inert`, if
/// given, receives the ranges of the comments and of the strings without fields, in order.
fn logical_lines(code: &str, mut inert: Option<&mut Vec<Range<usize>>>) -> Option<Vec<usize>> {
    let mut note_inert = |range: Range<usize>| {
        if let Some(inert) = inert.as_deref_mut() {
            inert.push(range);
        }
    };
    let b = code.as_bytes();
    let mut lines = Vec::new();
    let mut depth = 0usize;
    let mut at = 0;
    let mut line_start = true;
    // The previous line ended with a backslash: this one continues it.
    let mut joined = false;
    while at < b.len() {
        if line_start {
            line_start = false;
            if depth == 0 && !joined {
                lines.push(at);
            }
            joined = false;
        }
        match b[at] {
            b'\n' => {
                line_start = true;
                at += 1;
            }
            b'\r' => return None,
            b'#' => {
                let end = b[at..]
                    .iter()
                    .position(|&c| c == b'\n' || c == b'\r')
                    .map_or(b.len(), |i| at + i);
                // Python ends a line at a lone `\r` too: what follows it is code.
                if b.get(end) == Some(&b'\r') {
                    return None;
                }
                note_inert(at..end);
                at = end;
            }
            b'\\' => {
                if b.get(at + 1) != Some(&b'\n') {
                    return None;
                }
                joined = true;
                line_start = true;
                at += 2;
            }
            b'(' | b'[' | b'{' => {
                depth += 1;
                at += 1;
            }
            b')' | b']' | b'}' => {
                depth = depth.checked_sub(1)?;
                at += 1;
            }
            b'\'' | b'"' => {
                let end = skip_string(b, at, Prefix::default(), 0)?;
                note_inert(at..end);
                at = end;
            }
            c if c.is_ascii_alphanumeric() || c == b'_' => {
                let end = identifier_end(b, at);
                if matches!(b.get(end), Some(b'\'' | b'"')) {
                    let prefix = Prefix::of(&b[at..end])?;
                    let string_end = skip_string(b, end, prefix, 0)?;
                    if !prefix.fields {
                        note_inert(end..string_end);
                    }
                    at = string_end;
                } else {
                    at = end;
                }
            }
            _ => at += 1,
        }
    }
    if depth != 0 || joined {
        return None;
    }
    Some(lines)
}

/// A line starting with this byte at column 0 starts a statement (or a clause of one).
/// Anything else (indentation, a comment, a blank line, a stray byte) never splits.
fn begins_statement(c: u8) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(
            c,
            b'_' | b'@' | b'(' | b'[' | b'{' | b'\'' | b'"' | b'-' | b'+' | b'~' | b'*' | b'.'
        )
}

/// `else`, `elif`, `except`, `finally`: the next clause of the statement above.
fn continues_clause(line: &[u8]) -> bool {
    ["else", "elif", "except", "finally"].iter().any(|k| {
        line.starts_with(k.as_bytes())
            && !line
                .get(k.len())
                .is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'_' || !c.is_ascii())
    })
}

/// Where the identifier (or keyword) that starts at `from` ends, as Python reads one: non-ASCII
/// bytes continue it.
pub(crate) fn identifier_end(b: &[u8], from: usize) -> usize {
    b[from..]
        .iter()
        .position(|&c| !(c.is_ascii_alphanumeric() || c == b'_' || !c.is_ascii()))
        .map_or(b.len(), |i| from + i)
}

/// A string's prefix, as far as the split cares: whether it has replacement fields.
#[derive(Clone, Copy, Default)]
struct Prefix {
    fields: bool,
}

impl Prefix {
    /// `None` for a word before a quote that is not a string prefix (a syntax error).
    fn of(word: &[u8]) -> Option<Self> {
        let word = word.to_ascii_lowercase();
        let known = ["r", "u", "b", "br", "rb", "f", "fr", "rf", "t", "tr", "rt"];
        known
            .contains(&std::str::from_utf8(&word).ok()?)
            .then(|| Self {
                fields: word.contains(&b'f') || word.contains(&b't'),
            })
    }
}

/// Deepest nesting of fields in format specs that is followed (`f"{x:{w}}"` is one level;
/// Python allows two).
const MAX_FIELD_NESTING: usize = 2;

/// From the opening quote at `at` to just after the closing one.
fn skip_string(b: &[u8], at: usize, prefix: Prefix, nesting: usize) -> Option<usize> {
    let q = b[at];
    let triple = b.get(at..at + 3) == Some(&[q, q, q][..]);
    let mut i = at + if triple { 3 } else { 1 };
    loop {
        let c = *b.get(i)?;
        match c {
            // An escape, in raw strings too (`r"\""` is one string): the next byte is content.
            b'\\' => {
                if b.get(i + 1) == Some(&b'\r') {
                    return None;
                }
                i += 2;
            }
            b'\n' | b'\r' if !triple => return None,
            b'\r' => return None,
            _ if c == q => {
                if !triple {
                    return Some(i + 1);
                }
                if b.get(i..i + 3) == Some(&[q, q, q][..]) {
                    return Some(i + 3);
                }
                i += 1;
            }
            b'{' if prefix.fields => {
                if b.get(i + 1) == Some(&b'{') {
                    i += 2;
                } else {
                    i = skip_field(b, i + 1, q, nesting)?;
                }
            }
            _ => i += 1,
        }
    }
}

/// An f-string's replacement field, from after its `{` to after its `}`. Gives up on what
/// Python versions read differently: the enclosing quote, a backslash, a comment or a line
/// break inside the field, a nested f-string.
fn skip_field(b: &[u8], from: usize, quote: u8, nesting: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = from;
    loop {
        let c = *b.get(i)?;
        match c {
            b'(' | b'[' | b'{' => {
                depth += 1;
                i += 1;
            }
            b')' | b']' => {
                depth = depth.checked_sub(1)?;
                i += 1;
            }
            b'}' if depth == 0 => return Some(i + 1),
            b'}' => {
                depth -= 1;
                i += 1;
            }
            b'\\' | b'#' | b'\n' | b'\r' => return None,
            b'\'' | b'"' if c == quote => return None,
            b'\'' | b'"' => i = skip_string(b, i, Prefix::default(), MAX_FIELD_NESTING)?,
            // The format spec: literal text, with fields of its own.
            b':' if depth == 0 => return skip_spec(b, i + 1, quote, nesting),
            c if c.is_ascii_alphanumeric() || c == b'_' => {
                let end = identifier_end(b, i);
                if matches!(b.get(end), Some(b'\'' | b'"')) {
                    let prefix = Prefix::of(&b[i..end])?;
                    if prefix.fields || b[end] == quote {
                        return None;
                    }
                    i = skip_string(b, end, prefix, MAX_FIELD_NESTING)?;
                } else {
                    i = end;
                }
            }
            _ => i += 1,
        }
    }
}

/// A format spec, from after its `:` to after the field's closing `}`.
fn skip_spec(b: &[u8], from: usize, quote: u8, nesting: usize) -> Option<usize> {
    let mut i = from;
    loop {
        let c = *b.get(i)?;
        match c {
            b'}' => return Some(i + 1),
            b'{' if nesting < MAX_FIELD_NESTING => i = skip_field(b, i + 1, quote, nesting + 1)?,
            b'{' | b'\\' | b'\n' | b'\r' | b'\'' | b'"' => return None,
            _ => i += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{block_statements, read};
    use proptest::prelude::*;
    use std::ops::Range;

    fn top_level_statements(code: &str) -> Option<Vec<Range<usize>>> {
        read(code).map(|reading| reading.statements)
    }

    proptest! {
        /// Any text, however malformed: no panic, and the parts cover it in order, each
        /// starting a line.
        #[test]
        fn parts_cover_the_cell_and_start_lines(code in "[a-f_@#'\"\\\\(){}\\[\\]:!=\n \tré]{0,80}") {
            if let Some(parts) = top_level_statements(&code) {
                let mut expected = 0;
                for part in &parts {
                    prop_assert_eq!(part.start, expected);
                    prop_assert!(part.start == 0 || code.as_bytes()[part.start - 1] == b'\n');
                    prop_assert!(part.end > part.start || code.is_empty());
                    expected = part.end;
                }
                prop_assert_eq!(expected, code.len());
            }
        }
    }

    proptest! {
        /// Any text: no panic, and the header and the block's statements cover it in order.
        #[test]
        fn block_parts_cover_the_statement(code in "[a-f_@#'\"\\\\(){}\\[\\]:!=\n \tré]{0,80}") {
            if let Some((header, parts)) = block_statements(&code) {
                let mut expected = header;
                prop_assert!(header > 0);
                for part in &parts {
                    prop_assert_eq!(part.start, expected);
                    prop_assert!(code.as_bytes()[part.start - 1] == b'\n');
                    expected = part.end;
                }
                prop_assert_eq!(expected, code.len());
            }
        }
    }

    fn block(code: &str) -> Option<(&str, Vec<&str>)> {
        block_statements(code)
            .map(|(header, r)| (&code[..header], r.into_iter().map(|r| &code[r]).collect()))
    }

    #[test]
    fn a_block_splits_at_its_own_indentation() {
        let code = "def f(x):\n    '''doc\nimport os\n'''\n    y = (1,\n2)\n\n    if y:\n        z = 1\n    else:\n        z = 2\n# note\n    @dec\n    def g():\n        pass\n    return z\n";
        assert_eq!(
            block(code).unwrap(),
            (
                "def f(x):\n",
                vec![
                    "    '''doc\nimport os\n'''\n",
                    "    y = (1,\n2)\n\n",
                    "    if y:\n        z = 1\n    else:\n        z = 2\n# note\n",
                    "    @dec\n    def g():\n        pass\n",
                    "    return z\n",
                ]
            )
        );
    }

    #[test]
    fn what_is_not_one_header_and_one_block_is_not_split() {
        for code in [
            "x = 1\n",
            "def f(): return 1\n",
            "@dec\ndef f():\n    pass\n",
            "if a:\n    b = 1\nelse:\n    c = 2\n",
            "def f():\n    x = 1\n  y = 2\n",
            "def f():\n    x = 1\n\ty = 2\n",
            "# c\ndef f():\n    pass\n",
            "def f():\n    x = (1\n",
        ] {
            assert_eq!(block(code), None, "{code:?}");
        }
    }

    fn parts(code: &str) -> Option<Vec<&str>> {
        top_level_statements(code).map(|r| r.into_iter().map(|r| &code[r]).collect())
    }

    #[test]
    fn statements_split_at_column_zero_only() {
        assert_eq!(
            parts("import os\nx = 1\n\ndef f():\n    return 2\n# note\ny = f()\n").unwrap(),
            [
                "import os\n",
                "x = 1\n\n",
                "def f():\n    return 2\n# note\n",
                "y = f()\n"
            ]
        );
    }

    #[test]
    fn clauses_decorators_brackets_and_joins_stay_with_their_statement() {
        for code in [
            "if a:\n    b()\nelif c:\n    d()\nelse:\n    e()\n",
            "try:\n    a()\nexcept E:\n    b()\nfinally:\n    c()\n",
            "@dec\n@other(1,\n2)\ndef f():\n    pass\n",
            "x = (1,\n2)\n",
            "x = 1 + \\\n2\n",
            "s = '''\nimport os\n'''\n",
            "s = f'{a!r:>{w}}'\n",
            "s = f\"{d['k']}\" + rb'\\''\n",
        ] {
            assert_eq!(parts(code).unwrap(), [code], "{code:?}");
        }
        assert_eq!(
            parts("elsewhere = 1\nelse_ = 2\n").unwrap(),
            ["elsewhere = 1\n", "else_ = 2\n"]
        );
    }

    fn inert(code: &str) -> Option<Vec<&str>> {
        read(code).map(|r| r.inert.into_iter().map(|r| &code[r]).collect())
    }

    #[test]
    fn comments_and_strings_without_fields_are_inert() {
        assert_eq!(
            inert("x = 'a#b'  # eval\ns = rb\"\\\"\" + f'{open}' + '''\nexec'''\n").unwrap(),
            ["'a#b'", "# eval", "\"\\\"\"", "'''\nexec'''"]
        );
        // Python ends a comment at a lone `\r`: not read at all.
        assert_eq!(inert("# a\reval(1)\n"), None);
        assert_eq!(inert("s = 'a\rb'\n"), None);
    }

    proptest! {
        /// Any text: inert ranges are in order, apart, and each a comment or a whole string.
        #[test]
        fn inert_ranges_are_comments_or_strings(code in "[a-f_#'\"\\\\(){}:=\n \tr]{0,80}") {
            if let Some(reading) = read(&code) {
                let mut end = 0;
                for range in reading.inert {
                    prop_assert!(range.start >= end && range.end > range.start);
                    end = range.end;
                    let text = &code[range];
                    let quote = text.as_bytes()[0];
                    let quoted = text.len() >= 2
                        && matches!(quote, b'\'' | b'"')
                        && text.as_bytes()[text.len() - 1] == quote;
                    prop_assert!(text.starts_with('#') || quoted, "{:?}", text);
                }
                prop_assert!(end <= code.len());
            }
        }
    }

    /// What the reading takes as inert is what CPython's own tokenizer reads as a comment or
    /// a string without fields, on cells built at random from pieces that stress the edges.
    #[test]
    fn inert_text_is_what_python_tokenizes_as_comments_and_plain_strings() {
        const PIECES: &[&str] = &[
            "x = ",
            "'a#b'",
            "\"it's\"",
            "'''\n#x\n'''",
            "\"\"\"q\"\"\"",
            "r'\\''",
            "rb\"\\\\\"",
            "f'{a}'",
            "f'{b!r:>{w}}'",
            "F\"{'k'}\"",
            "# c\n",
            "#\n",
            "(",
            ")",
            "\n",
            " ",
            "\\\n",
            "u'x'",
            "B'y'",
            "'' ",
            "\"\"",
            "eval",
            "getattr(a, 'b')",
            "1",
            ", ",
            "[",
            "]",
            "{",
            "}",
            ":",
            "'\\n'",
            "'\\\\'",
            "\"#\"",
            "'''a''' ",
            "r'''\\''''",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let cells: Vec<String> = (0..4000)
            .map(|_| {
                (0..1 + next(12))
                    .map(|_| PIECES[next(PIECES.len())])
                    .collect()
            })
            .collect();
        let script = r#"
import io, json, sys, tokenize
out = []
for cell in json.load(sys.stdin):
    starts = [0]
    for line in cell.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    at = lambda pos: starts[pos[0] - 1] + pos[1]
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(cell).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        out.append(None)
        continue
    spans = []
    for t in tokens:
        if t.type == tokenize.COMMENT:
            spans.append([at(t.start), at(t.end)])
        elif t.type == tokenize.STRING:
            prefix = len(t.string) - len(t.string.lstrip("rbuRBUfF"))
            if "f" not in t.string[:prefix].lower():
                spans.append([at(t.start) + prefix, at(t.end)])
    out.append(spans)
json.dump(out, sys.stdout)
"#;
        let python: Vec<Option<Vec<[usize; 2]>>> = cave_testing::python::ask(script, &cells);
        let mut compared = 0;
        for (cell, spans) in cells.iter().zip(python) {
            let (Some(reading), Some(spans)) = (read(cell), spans) else {
                continue;
            };
            for range in &reading.inert {
                assert!(
                    spans.contains(&[range.start, range.end]),
                    "{cell:?}: {:?} is inert here, not to Python ({spans:?})",
                    &cell[range.clone()]
                );
            }
            compared += usize::from(!reading.inert.is_empty());
        }
        assert!(compared > 500, "only {compared} cells compared");
    }

    #[test]
    fn what_versions_read_differently_or_does_not_tokenize_is_not_split() {
        for code in [
            "s = f\"{d[\"k\"]}\"\nx = 1\n",
            "s = f'{x # c\n}'\nx = 1\n",
            "s = f'{f\"{x}\"}'\nx = 1\n",
            "s = 'open\nx = 1\n",
            "x = (1\ny = 2\n",
            "x = 1)\ny = 2\n",
            "x = 1\r\ny = 2\r\n",
            "x = 1 \\ y\nz = 2\n",
            "x = q'a'\ny = 2\n",
        ] {
            assert_eq!(parts(code), None, "{code:?}");
        }
    }
}

//! The streaming fence parser: finds the first closed code block in a model's streamed answer.

mod pyscan;
mod think;

pub use think::{ThinkSplit, ThinkSplitter};

use pyscan::{EndState, PyScanner};

/// Where the parser is inside the Markdown it has seen so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Prose.
    Text,
    /// 1–2 backticks at the start of a prose line, waiting for more.
    BacktickCount,
    /// Three backticks seen; matching the block's tag.
    LanguageMatch,
    /// Tag matched, then a space or `\r`: the rest of the line is the info string.
    InfoString,
    /// Inside the block.
    Code,
    /// 1–2 backticks at the start of a code line, waiting for the third.
    CodeEndCheck,
}

/// What one call to [`FenceParser::push`] or [`FenceParser::flush`] produced.
///
/// Prose always comes before code: once a block closes the parser stops, so a chunk yields
/// some text, then at most one code block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Parsed<'a> {
    /// Prose to show as it arrived (possibly empty). Held-back backtick runs that turned out
    /// not to be a fence come out here, exactly as written.
    pub text: &'a str,
    /// The code of the block, dedented and stripped, on the call that closed it (or, from
    /// `flush`, an unterminated block).
    pub code: Option<&'a str>,
}

/// A streaming, chunk-size-invariant parser that finds the first closed ```` ```python ````
/// block in Markdown.
///
/// Feed it chunks as they arrive with [`push`](Self::push); after the chunk that closes the
/// first block it stops, and [`remainder`](Self::remainder) holds the unparsed rest of that
/// chunk. Whatever the chunking of the same input, the concatenated text, the code and the
/// remainder are the same. At the end of a stream, [`flush`](Self::flush) hands back what was
/// held (pending backticks, an unterminated block) and resets the parser for reuse.
///
/// The rules follow CommonMark where models rely on it and CaveAgent where it differs:
/// fences sit at the start of a line after at most three spaces; the tag (any of the parser's
/// tags) matches case-insensitively; an info string after the tag is discarded; a block with only blank
/// lines is not a block and is replayed as text; three backticks on a code line that sits
/// inside an open Python string (a triple-quoted string, or a string continued with a
/// backslash) are code, not the closing fence.
///
/// ```
/// use cave_core::FenceParser;
///
/// let mut parser = FenceParser::new("python");
/// let mut text = String::new();
/// for chunk in ["Here:\n``", "`python\nprint(", "1)\n```\nlater"] {
///     let parsed = parser.push(chunk);
///     text.push_str(parsed.text);
///     if let Some(code) = parsed.code {
///         assert_eq!(code, "print(1)");
///     }
/// }
/// assert_eq!(text, "Here:\n");
/// assert!(parser.is_complete());
/// assert_eq!(parser.remainder(), "\nlater");
/// ```
#[derive(Debug)]
pub struct FenceParser {
    /// The tags that open a block, lowercase.
    tags: Vec<Vec<char>>,
    /// The tag written so far, lowercase.
    matched: Vec<char>,
    mode: Mode,
    /// Indentation of the current prose line so far: `Some(n)` while it is `n` (≤ 3) spaces.
    line_indent: Option<u8>,
    /// The same for the current code line, for the closing fence.
    code_indent: Option<u8>,
    backticks: u8,
    /// The tag as the model wrote it, and the info string after it.
    opener: String,
    code: String,
    scanner: PyScanner,
    complete: bool,
    remainder: String,
    out_text: String,
    out_code: String,
    emitted_code: bool,
}

const FENCE: &str = "```";

impl FenceParser {
    /// Creates a parser for blocks tagged `tag` (e.g. `"python"`), matched case-insensitively.
    pub fn new(tag: &str) -> Self {
        Self::with_tags(&[tag])
    }

    /// Creates a parser for blocks tagged with any of `tags`, matched case-insensitively.
    pub fn with_tags(tags: &[&str]) -> Self {
        Self {
            tags: tags
                .iter()
                .map(|t| t.chars().flat_map(char::to_lowercase).collect())
                .collect(),
            matched: Vec::new(),
            mode: Mode::Text,
            line_indent: Some(0),
            code_indent: Some(0),
            backticks: 0,
            opener: String::new(),
            code: String::new(),
            scanner: PyScanner::default(),
            complete: false,
            remainder: String::new(),
            out_text: String::new(),
            out_code: String::new(),
            emitted_code: false,
        }
    }

    /// Returns true if and only if the first block has closed.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// The unparsed tail of the chunk that closed the first block (or of any later chunk).
    pub fn remainder(&self) -> &str {
        &self.remainder
    }

    /// Parses one chunk of the stream.
    #[inline]
    pub fn push(&mut self, chunk: &str) -> Parsed<'_> {
        // One ASCII character in the middle of a line, as servers that stream a character at
        // a time send most of an answer: appended where it belongs, nothing else to decide.
        if let [byte] = *chunk.as_bytes()
            && byte.is_ascii()
            && byte != b'\n'
            && !self.complete
        {
            let buffer = match self.mode {
                Mode::Code if self.code_indent.is_none() => Some(&mut self.code),
                Mode::Text if self.line_indent.is_none() => {
                    self.out_text.clear();
                    Some(&mut self.out_text)
                }
                _ => None,
            };
            if let Some(buffer) = buffer {
                buffer.push(char::from(byte));
                if self.mode == Mode::Code {
                    self.out_text.clear();
                }
                self.emitted_code = false;
                return self.parsed();
            }
        }
        self.push_chunk(chunk)
    }

    #[inline(never)]
    fn push_chunk(&mut self, chunk: &str) -> Parsed<'_> {
        self.out_text.clear();
        self.emitted_code = false;
        if self.complete {
            self.remainder.clear();
            self.remainder.push_str(chunk);
            return Parsed::default();
        }
        let mut rest = chunk;
        while !rest.is_empty() {
            // Mid-line, in prose or in code, nothing before the line's end can open or close a
            // fence: that run is copied whole (most of a long answer) and the rest stepped.
            let run = match self.mode {
                Mode::Code if self.code_indent.is_none() => Some(&mut self.code),
                Mode::Text if self.line_indent.is_none() => Some(&mut self.out_text),
                _ => None,
            };
            if let Some(buffer) = run {
                let end = line_end(rest);
                match rest.as_bytes()[..end] {
                    // One character at a time is how many servers stream: no copy call for it.
                    [byte] => buffer.push(char::from(byte)),
                    _ => buffer.push_str(&rest[..end]),
                }
                rest = &rest[end..];
                if rest.is_empty() {
                    break;
                }
            }
            let c = rest.chars().next().expect("not empty");
            rest = &rest[c.len_utf8()..];
            self.step(c);
            if self.complete {
                self.remainder.clear();
                self.remainder.push_str(rest);
                break;
            }
        }
        self.parsed()
    }

    /// Ends the stream: returns held text and any unterminated block, then resets the parser.
    pub fn flush(&mut self) -> Parsed<'_> {
        self.out_text.clear();
        self.emitted_code = false;
        if !self.complete {
            match self.mode {
                Mode::Text => {}
                Mode::BacktickCount => self.replay_backticks(),
                Mode::LanguageMatch | Mode::InfoString => {
                    self.out_text.push_str(FENCE);
                    self.out_text.push_str(&self.opener);
                }
                Mode::Code | Mode::CodeEndCheck => {
                    for _ in 0..self.backticks {
                        self.code.push('`');
                    }
                    if is_blank(&self.code) {
                        // An opening fence with nothing after it stays visible as text.
                        self.out_text.push_str(FENCE);
                        self.out_text.push_str(&self.opener);
                        self.out_text.push('\n');
                    } else {
                        self.emit_code();
                    }
                }
            }
        }
        self.reset();
        self.parsed()
    }

    fn parsed(&self) -> Parsed<'_> {
        Parsed {
            text: &self.out_text,
            code: self.emitted_code.then_some(self.out_code.as_str()),
        }
    }

    fn reset(&mut self) {
        self.mode = Mode::Text;
        self.line_indent = Some(0);
        self.code_indent = Some(0);
        self.backticks = 0;
        self.opener.clear();
        self.matched.clear();
        self.code.clear();
        self.scanner.reset();
        self.complete = false;
        self.remainder.clear();
    }

    // Out of line: the copy of mid-line runs in `push` is the hot path, and stays small.
    #[inline(never)]
    fn step(&mut self, c: char) {
        match self.mode {
            Mode::Text => {
                if c == '`' && self.line_indent.is_some() {
                    self.mode = Mode::BacktickCount;
                    self.backticks = 1;
                } else {
                    self.out_text.push(c);
                    self.line_indent = next_line_indent(self.line_indent, c);
                }
            }
            Mode::BacktickCount => {
                if c == '`' {
                    self.backticks += 1;
                    if self.backticks == 3 {
                        self.backticks = 0;
                        self.opener.clear();
                        self.matched.clear();
                        self.mode = Mode::LanguageMatch;
                    }
                } else {
                    self.replay_backticks();
                    self.out_text.push(c);
                    self.resume_text(c);
                }
            }
            Mode::LanguageMatch => {
                if c == '\n' || c == ' ' || c == '\r' {
                    if !self.tags.contains(&self.matched) {
                        self.fail_opener(c);
                    } else if c == '\n' {
                        self.enter_code();
                    } else {
                        self.opener.push(c);
                        self.mode = Mode::InfoString;
                    }
                } else {
                    let before = self.matched.len();
                    self.matched.extend(c.to_lowercase());
                    if self.tags.iter().any(|t| t.starts_with(&self.matched)) {
                        self.opener.push(c);
                    } else {
                        self.matched.truncate(before);
                        self.fail_opener(c);
                    }
                }
            }
            Mode::InfoString => {
                if c == '\n' {
                    self.enter_code();
                } else {
                    self.opener.push(c);
                }
            }
            Mode::Code => {
                if c == '`' && self.code_indent.is_some() {
                    self.mode = Mode::CodeEndCheck;
                    self.backticks = 1;
                } else {
                    self.code.push(c);
                    self.code_indent = next_line_indent(self.code_indent, c);
                }
            }
            Mode::CodeEndCheck => {
                if c == '`' {
                    self.backticks += 1;
                    if self.backticks == 3 {
                        self.backticks = 0;
                        self.close_candidate();
                    }
                } else {
                    for _ in 0..self.backticks {
                        self.code.push('`');
                    }
                    self.backticks = 0;
                    self.code.push(c);
                    self.code_indent = next_line_indent(None, c);
                    self.mode = Mode::Code;
                }
            }
        }
    }

    /// Three backticks at the start of a code line: the closing fence, or code inside a string.
    fn close_candidate(&mut self) {
        if is_blank(&self.code) {
            // An empty block is not a block: replay its fences as prose and keep looking.
            self.out_text.push_str(FENCE);
            self.out_text.push_str(&self.opener);
            self.out_text.push('\n');
            self.out_text.push_str(FENCE);
            self.code.clear();
            self.scanner.reset();
            self.mode = Mode::Text;
            self.line_indent = None;
            return;
        }
        let inside = match self.scanner.end_state(&self.code) {
            EndState::TripleString => true,
            EndState::UnterminatedString => ends_with_continuation(&self.code),
            EndState::Clean => false,
        };
        if inside {
            self.code.push_str(FENCE);
            self.code_indent = None;
            self.mode = Mode::Code;
        } else {
            self.emit_code();
            self.complete = true;
        }
    }

    fn emit_code(&mut self) {
        self.out_code = dedent_strip(&self.code);
        self.emitted_code = true;
    }

    fn enter_code(&mut self) {
        self.mode = Mode::Code;
        self.code.clear();
        self.scanner.reset();
        self.code_indent = Some(0);
    }

    fn fail_opener(&mut self, c: char) {
        self.out_text.push_str(FENCE);
        self.out_text.push_str(&self.opener);
        self.out_text.push(c);
        self.opener.clear();
        self.resume_text(c);
    }

    fn replay_backticks(&mut self) {
        for _ in 0..self.backticks {
            self.out_text.push('`');
        }
        self.backticks = 0;
    }

    fn resume_text(&mut self, last: char) {
        self.mode = Mode::Text;
        self.line_indent = if last == '\n' { Some(0) } else { None };
    }
}

/// Where the line `text` starts ends: the index of its first `\n`, or its length. Short
/// chunks (a token or a character, as models stream) are searched inline.
fn line_end(text: &str) -> usize {
    let bytes = text.as_bytes();
    if bytes.len() <= 16 {
        bytes
            .iter()
            .position(|&b| b == b'\n')
            .unwrap_or(bytes.len())
    } else {
        text.find('\n').unwrap_or(bytes.len())
    }
}

/// The indentation state after `c`: a newline starts a line; up to three spaces keep it a
/// possible fence line; anything else makes it mid-line.
fn next_line_indent(indent: Option<u8>, c: char) -> Option<u8> {
    match (c, indent) {
        ('\n', _) => Some(0),
        (' ', Some(n)) if n < 3 => Some(n + 1),
        _ => None,
    }
}

/// True if the buffer, without the fence's indentation and the line break before it, ends
/// with an odd number of backslashes (a line continuation).
fn ends_with_continuation(code: &str) -> bool {
    let trimmed = code.trim_end_matches(' ').trim_end_matches(['\r', '\n']);
    trimmed.chars().rev().take_while(|&c| c == '\\').count() % 2 == 1
}

fn is_blank(s: &str) -> bool {
    s.chars().all(is_py_whitespace)
}

/// Python's `str.isspace`: Unicode whitespace plus the ASCII separators U+001C–U+001F.
pub(crate) fn is_py_whitespace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `textwrap.dedent(s).strip()`.
pub(crate) fn dedent_strip(s: &str) -> String {
    let is_margin_char = |c: char| c == ' ' || c == '\t';
    let mut margin: Option<&str> = None;
    // A line of only spaces and tabs, which the output empties.
    let mut blank_with_margin = false;
    for line in s.split('\n') {
        let content = line.trim_start_matches(is_margin_char);
        if content.is_empty() {
            blank_with_margin |= !line.is_empty();
            continue; // whitespace-only lines do not count
        }
        let indent = &line[..line.len() - content.len()];
        margin = Some(match margin {
            None => indent,
            Some(m) if indent.starts_with(m) => m,
            Some(m) if m.starts_with(indent) => indent,
            Some(m) => {
                let common = m
                    .char_indices()
                    .zip(indent.chars())
                    .find(|((_, a), b)| a != b)
                    .map_or(m.len().min(indent.len()), |((i, _), _)| i);
                &m[..common]
            }
        });
    }
    let margin = margin.unwrap_or("");
    if margin.is_empty() && !blank_with_margin {
        // Nothing to take off any line (the usual block): one copy.
        return s.trim_matches(is_py_whitespace).to_owned();
    }
    let mut out = String::with_capacity(s.len());
    for (i, line) in s.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if line.trim_start_matches(is_margin_char).is_empty() {
            continue; // whitespace-only lines become empty
        }
        out.push_str(line.strip_prefix(margin).unwrap_or(line));
    }
    out.trim_matches(is_py_whitespace).to_owned()
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn dedent_matches_textwrap() {
        assert_eq!(dedent_strip("  a\n    b\n  c"), "a\n  b\nc");
        assert_eq!(dedent_strip("\t a\n\t b"), "a\nb");
        assert_eq!(dedent_strip("  a\n \n  b\n"), "a\n\nb");
        assert_eq!(dedent_strip("x\n \ta\n  b"), "x\n \ta\n  b");
        assert_eq!(dedent_strip("  x\n \ta\n  b"), "x\n\ta\n b");
        assert_eq!(dedent_strip("x = 1\r"), "x = 1");
    }

    #[test]
    fn continuation_counts_backslashes() {
        assert!(ends_with_continuation("s = 'a\\\n   "));
        assert!(!ends_with_continuation("s = 'a\\\\\n"));
        assert!(!ends_with_continuation("print('x')\n"));
    }
}

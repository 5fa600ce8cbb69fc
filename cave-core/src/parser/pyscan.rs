//! Just enough of Python's tokenizer to answer one question: does the end of a code buffer sit
//! inside an open string literal?
//!
//! The fence parser asks this when three backticks start a code line. Python's own tokenizer
//! stops at its *first* error, and the answer depends on which error that is, so this scanner
//! reproduces the errors that can come before the end of the buffer (unterminated strings,
//! inconsistent dedents, unmatched brackets, stray characters after a line continuation) and
//! then freezes. It scans whole lines only, incrementally, so the cost over a block is linear.

/// What the tokenizer would report at the end of the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EndState {
    /// No error, or an error that is not about strings (the fence closes).
    Clean,
    /// Inside an open triple-quoted string ("EOF in multi-line string").
    TripleString,
    /// "unterminated string literal", at the end or on an earlier line.
    UnterminatedString,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frozen {
    Unterminated,
    Other,
}

#[derive(Clone, Copy, Debug)]
struct OpenString {
    quote: u8,
    triple: bool,
}

/// Incremental scanner over complete lines of a code buffer.
#[derive(Debug, Default)]
pub(crate) struct PyScanner {
    /// Byte offset up to which the buffer has been scanned (always just after a `\n`).
    scanned: usize,
    frozen: Option<Frozen>,
    string: Option<OpenString>,
    brackets: Vec<u8>,
    indents: Vec<u32>,
    /// The previous line ended with a backslash continuation outside a string.
    continued: bool,
}

impl PyScanner {
    pub(crate) fn reset(&mut self) {
        self.scanned = 0;
        self.frozen = None;
        self.string = None;
        self.brackets.clear();
        self.indents.clear();
        self.continued = false;
    }

    /// Scans the complete lines of `buffer` not seen yet and reports the state at its end.
    ///
    /// `buffer` must extend the buffer given on earlier calls (it only ever grows).
    pub(crate) fn end_state(&mut self, buffer: &str) -> EndState {
        if let Some(last_newline) = buffer.rfind('\n') {
            let end = last_newline + 1;
            if end > self.scanned {
                for line in buffer[self.scanned..end].split_inclusive('\n') {
                    if self.frozen.is_some() {
                        break;
                    }
                    self.scan_line(line);
                }
                self.scanned = end;
            }
        }
        // The partial last line holds only the fence's indentation: it cannot change the state.
        match (self.frozen, self.string) {
            (Some(Frozen::Unterminated), _) => EndState::UnterminatedString,
            (Some(Frozen::Other), _) => EndState::Clean,
            (None, Some(s)) if s.triple => EndState::TripleString,
            (None, Some(_)) => EndState::UnterminatedString,
            (None, None) => EndState::Clean,
        }
    }

    fn scan_line(&mut self, line: &str) {
        // Bytes, not chars: everything the tokenizer looks for here is ASCII, and no byte of a
        // multi-byte character is. A `\r` is dropped wherever it stands, as Python reads it.
        let filtered: Vec<u8>;
        let chars = if line.contains('\r') {
            filtered = line.bytes().filter(|&b| b != b'\r').collect();
            &filtered[..]
        } else {
            line.as_bytes()
        };
        let mut i = 0;
        if self.string.is_none() && self.brackets.is_empty() && !self.continued {
            i = self.indentation(chars);
            if self.frozen.is_some() {
                return;
            }
        }
        self.continued = false;
        while i < chars.len() {
            let c = chars[i];
            if let Some(open) = self.string {
                i = self.scan_string(chars, i, open);
                if self.frozen.is_some() {
                    return;
                }
                continue;
            }
            match c {
                b'#' => return,
                b'\'' | b'"' => {
                    // Prefixes (r, b, f, u) do not change how the tokenizer finds the end.
                    let triple = chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c);
                    self.string = Some(OpenString { quote: c, triple });
                    i += if triple { 3 } else { 1 };
                    continue;
                }
                b'\\' => {
                    if chars.get(i + 1) == Some(&b'\n') {
                        self.continued = true;
                        return;
                    }
                    self.frozen = Some(Frozen::Other);
                    return;
                }
                b'(' | b'[' | b'{' => self.brackets.push(c),
                b')' | b']' | b'}' => {
                    let expected = match c {
                        b')' => b'(',
                        b']' => b'[',
                        _ => b'{',
                    };
                    if self.brackets.pop() != Some(expected) {
                        self.frozen = Some(Frozen::Other);
                        return;
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }

    /// Continues an open string from `i`; returns the index after what it consumed.
    fn scan_string(&mut self, chars: &[u8], mut i: usize, open: OpenString) -> usize {
        while i < chars.len() {
            let c = chars[i];
            if c == b'\\' {
                // An escape (in raw strings too, as far as the tokenizer is concerned) keeps the
                // next character, a newline included, inside the string.
                i += 2;
                continue;
            }
            if c == open.quote {
                if !open.triple {
                    self.string = None;
                    return i + 1;
                }
                if chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c) {
                    self.string = None;
                    return i + 3;
                }
            }
            if c == b'\n' && !open.triple {
                self.frozen = Some(Frozen::Unterminated);
                return chars.len();
            }
            i += 1;
        }
        chars.len()
    }

    /// Handles the indentation of a logical line's first physical line; returns where it ends.
    fn indentation(&mut self, chars: &[u8]) -> usize {
        let mut column = 0u32;
        let mut i = 0;
        while let Some(&c) = chars.get(i) {
            match c {
                b' ' => column += 1,
                b'\t' => column = (column / 8 + 1) * 8,
                b'\x0c' => column = 0,
                _ => break,
            }
            i += 1;
        }
        // Blank and comment-only lines do not take part in indentation.
        if matches!(chars.get(i), None | Some(b'\n') | Some(b'#')) {
            return i;
        }
        let top = self.indents.last().copied().unwrap_or(0);
        if column > top {
            self.indents.push(column);
        } else {
            while self.indents.last().is_some_and(|&t| t > column) {
                self.indents.pop();
            }
            if self.indents.last().copied().unwrap_or(0) != column {
                self.frozen = Some(Frozen::Other);
            }
        }
        i
    }
}

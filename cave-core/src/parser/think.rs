//! Reasoning written in the content: `<think>…</think>` (or `<thinking>…</thinking>`) at the
//! start of an answer, as models served without a reasoning parser write it.

/// The tags that open reasoning at the start of an answer, with their closing tags.
const TAGS: [(&str, &str); 2] = [("<think>", "</think>"), ("<thinking>", "</thinking>")];

/// Where the splitter is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: an opening tag may still come.
    Start,
    /// Inside reasoning opened by `TAGS[i]`.
    Inside(usize),
    /// Just after a closing tag: the whitespace before the answer is dropped.
    AfterClose,
    /// The answer: everything passes as it is.
    Answer,
}

/// What one call to [`ThinkSplitter::push`] produced: reasoning, then answer text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThinkSplit {
    /// Reasoning (possibly empty).
    pub reasoning: String,
    /// Answer text (possibly empty), what the fence parser reads.
    pub text: String,
}

/// Splits a streamed answer's content into reasoning and answer: a `<think>` or `<thinking>`
/// tag at its start (after whitespace) opens reasoning, which runs to the matching closing tag.
///
/// Chunk-size invariant: whatever the chunking of the same content, the concatenated reasoning
/// and text are the same (a chunk may end inside a tag; what could still be one is held). Tags
/// anywhere else are text: only an answer's start can open reasoning.
///
/// ```
/// use cave_core::ThinkSplitter;
///
/// let mut splitter = ThinkSplitter::new();
/// let (mut reasoning, mut text) = (String::new(), String::new());
/// for chunk in ["<thi", "nk>draft: ```python\nx", " = 1\n```</th", "ink>\n\nDone."] {
///     let split = splitter.push(chunk);
///     reasoning.push_str(&split.reasoning);
///     text.push_str(&split.text);
/// }
/// let last = splitter.finish();
/// assert_eq!(reasoning + &last.reasoning, "draft: ```python\nx = 1\n```");
/// assert_eq!(text + &last.text, "Done.");
/// assert!(!splitter.is_unclosed());
/// ```
#[derive(Clone, Debug)]
pub struct ThinkSplitter {
    state: State,
    /// Held back: the start's whitespace and a tag's beginning, or a closing tag's beginning.
    held: String,
    /// Bytes of `held` that are the start's whitespace (what follows may begin a tag).
    lead: usize,
    /// The content ended inside reasoning.
    unclosed: bool,
}

impl Default for ThinkSplitter {
    fn default() -> Self {
        Self::new()
    }
}

impl ThinkSplitter {
    /// A splitter at the start of an answer.
    pub fn new() -> Self {
        Self {
            state: State::Start,
            held: String::new(),
            lead: 0,
            unclosed: false,
        }
    }

    /// A splitter that passes everything as text (an answer that continues an earlier one).
    pub fn answering() -> Self {
        Self {
            state: State::Answer,
            ..Self::new()
        }
    }

    /// Returns true if and only if the splitter is inside reasoning.
    pub fn in_reasoning(&self) -> bool {
        matches!(self.state, State::Inside(_))
    }

    /// Returns true if and only if [`finish`](Self::finish) found the content ended inside
    /// reasoning that was never closed.
    pub fn is_unclosed(&self) -> bool {
        self.unclosed
    }

    /// Splits the next chunk.
    pub fn push(&mut self, chunk: &str) -> ThinkSplit {
        let mut out = ThinkSplit::default();
        let mut rest = chunk;
        // Each pass moves to a later state or consumes the chunk: at most four passes.
        while !rest.is_empty() {
            match self.state {
                State::Answer => {
                    out.text.push_str(rest);
                    rest = "";
                }
                State::AfterClose => {
                    let trimmed = rest.trim_start();
                    if trimmed.is_empty() {
                        rest = "";
                    } else {
                        self.state = State::Answer;
                        rest = trimmed;
                    }
                }
                State::Start => rest = self.start(rest, &mut out),
                State::Inside(tag) => rest = self.inside(tag, rest, &mut out),
            }
        }
        out
    }

    /// The start: whitespace, then an opening tag or the answer.
    fn start<'a>(&mut self, rest: &'a str, out: &mut ThinkSplit) -> &'a str {
        // Linear: the whitespace is counted once, and at most a tag's beginning is compared.
        for (at, c) in rest.char_indices() {
            self.held.push(c);
            if self.lead + c.len_utf8() == self.held.len() && c.is_whitespace() {
                self.lead = self.held.len();
                continue;
            }
            let candidate = &self.held[self.lead..];
            if let Some(tag) = TAGS.iter().position(|(open, _)| candidate == *open) {
                self.held.clear();
                self.lead = 0;
                self.state = State::Inside(tag);
                return &rest[at + c.len_utf8()..];
            }
            if !TAGS.iter().any(|(open, _)| open.starts_with(candidate)) {
                out.text.push_str(&std::mem::take(&mut self.held));
                self.lead = 0;
                self.state = State::Answer;
                return &rest[at + c.len_utf8()..];
            }
        }
        ""
    }

    /// Inside reasoning: up to the closing tag, holding what could be its beginning.
    fn inside<'a>(&mut self, tag: usize, rest: &'a str, out: &mut ThinkSplit) -> &'a str {
        let close = TAGS[tag].1;
        self.held.push_str(rest);
        if let Some(at) = self.held.find(close) {
            out.reasoning.push_str(&self.held[..at]);
            let after = self.held.len() - (at + close.len());
            // What followed the tag is the tail of `rest` (the held part before it was shorter
            // than the tag).
            let tail = &rest[rest.len() - after..];
            self.held.clear();
            self.state = State::AfterClose;
            return tail;
        }
        // Keep the longest suffix that is a beginning of the closing tag.
        let keep = (1..close.len())
            .rev()
            .find(|&n| {
                self.held.len() >= n
                    && self.held.is_char_boundary(self.held.len() - n)
                    && close.starts_with(&self.held[self.held.len() - n..])
            })
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        out.reasoning.push_str(&self.held[..cut]);
        self.held.drain(..cut);
        ""
    }

    /// The end of the content: what was held. Reasoning that was never closed stays
    /// reasoning ([`is_unclosed`](Self::is_unclosed) then says so); a tag's beginning that
    /// never completed, or whitespace alone, is text.
    pub fn finish(&mut self) -> ThinkSplit {
        let held = std::mem::take(&mut self.held);
        self.lead = 0;
        match self.state {
            State::Inside(_) => {
                self.unclosed = true;
                ThinkSplit {
                    reasoning: held,
                    text: String::new(),
                }
            }
            _ => ThinkSplit {
                reasoning: String::new(),
                text: held,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(input: &str, size: usize) -> (String, String, bool) {
        let mut splitter = ThinkSplitter::new();
        let (mut reasoning, mut text) = (String::new(), String::new());
        let chars: Vec<char> = input.chars().collect();
        for chunk in chars.chunks(size.max(1)) {
            let split = splitter.push(&chunk.iter().collect::<String>());
            reasoning.push_str(&split.reasoning);
            text.push_str(&split.text);
        }
        let last = splitter.finish();
        reasoning.push_str(&last.reasoning);
        text.push_str(&last.text);
        (reasoning, text, splitter.is_unclosed())
    }

    #[test]
    fn tags_at_the_start_are_reasoning_at_every_chunking() {
        let cases = [
            ("<think>a</think>b", ("a", "b", false)),
            (
                "  \n<think>\nplan\n</think>\n\n```python\nx\n```",
                ("\nplan\n", "```python\nx\n```", false),
            ),
            ("<thinking>t</thinking>ans", ("t", "ans", false)),
            (
                "<thinking>t</think>still</thinking>x",
                ("t</think>still", "x", false),
            ),
            (
                "hello <think>no</think>",
                ("", "hello <think>no</think>", false),
            ),
            ("<thin", ("", "<thin", false)),
            ("<think>cut off", ("cut off", "", true)),
            ("<think>ends in </thi", ("ends in </thi", "", true)),
            ("  ", ("", "  ", false)),
            ("<thinker>", ("", "<thinker>", false)),
            ("<think>é漢</think>🦀", ("é漢", "🦀", false)),
        ];
        for (input, (reasoning, text, unclosed)) in cases {
            for size in [1, 2, 3, 7, 1000] {
                assert_eq!(
                    split_all(input, size),
                    (reasoning.to_owned(), text.to_owned(), unclosed),
                    "{input:?} in chunks of {size}"
                );
            }
        }
    }

    #[test]
    fn a_long_run_of_whitespace_at_the_start_is_read_once() {
        // Quadratic before (the whole held run trimmed again at each character): 4 MiB of
        // spaces took minutes; now it is a linear pass.
        let spaces = " ".repeat(4 << 20);
        let mut splitter = ThinkSplitter::new();
        let start = std::time::Instant::now();
        for chunk in spaces.as_bytes().chunks(4096) {
            splitter.push(std::str::from_utf8(chunk).unwrap());
        }
        let split = splitter.push("<think>r</think>a");
        assert_eq!((split.reasoning.as_str(), split.text.as_str()), ("r", "a"));
        assert!(start.elapsed() < std::time::Duration::from_secs(30));
    }

    #[test]
    fn an_answer_that_continues_passes_as_text() {
        let mut splitter = ThinkSplitter::answering();
        assert_eq!(splitter.push("<think>x</think>").text, "<think>x</think>");
    }
}

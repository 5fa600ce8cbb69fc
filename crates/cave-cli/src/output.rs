//! Printing a run: JSON Lines for programs, a readable transcript for people. Both are
//! generic over `W: Write` and know nothing of where events come from.

use cave_agent::{Event, Status, StopReason};
use serde_json::json;
use std::io::{self, Write};

/// A variable's value after the run, as `--retrieve` prints it.
#[derive(Debug)]
pub enum Retrieved {
    /// A value JSON can hold.
    Json {
        /// The variable.
        name: String,
        /// Its value.
        value: serde_json::Value,
    },
    /// A value JSON cannot hold (a DataFrame, a host object): its repr.
    Repr {
        /// The variable.
        name: String,
        /// `repr()` of it.
        repr: String,
        /// Its Python type.
        python_type: String,
    },
    /// The name is not bound.
    Missing {
        /// The variable.
        name: String,
        /// Why.
        error: String,
    },
}

/// Where a session's events and results go.
pub trait Output {
    /// Prints one event.
    fn event(&mut self, event: &Event) -> io::Result<()>;
    /// Prints a retrieved variable.
    fn retrieved(&mut self, retrieved: &Retrieved) -> io::Result<()>;
    /// Called about ten times a second while waiting (for a spinner).
    fn tick(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One JSON object per line, flushed per event: exactly the core's serde form.
#[derive(Debug)]
pub struct JsonLines<W> {
    out: W,
}

impl<W: Write> JsonLines<W> {
    /// Prints to `out`.
    pub fn new(out: W) -> Self {
        Self { out }
    }

    /// The writer, back.
    pub fn into_inner(self) -> W {
        self.out
    }

    fn line(&mut self, value: &impl serde::Serialize) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, value)?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }
}

impl<W: Write> Output for JsonLines<W> {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        self.line(event)
    }

    fn retrieved(&mut self, retrieved: &Retrieved) -> io::Result<()> {
        let value = match retrieved {
            Retrieved::Json { name, value } => {
                json!({"type": "retrieved", "name": name, "value": value})
            }
            Retrieved::Repr {
                name,
                repr,
                python_type,
            } => {
                json!({"type": "retrieved", "name": name, "repr": repr, "python_type": python_type})
            }
            Retrieved::Missing { name, error } => {
                json!({"type": "retrieved", "name": name, "error": error})
            }
        };
        self.line(&value)
    }
}

/// Output lines kept per block before the rest is summarized.
const SHOWN_LINES: usize = 12;
/// Characters kept per block.
const SHOWN_CHARS: usize = 2000;

/// A transcript for people: prose as light Markdown, code highlighted, output shortened,
/// and a closing line with the stop reason, steps, tokens and time.
#[derive(Debug)]
pub struct Human<W> {
    out: W,
    color: bool,
    /// Prose not yet printed because its line is not finished.
    line: String,
    /// Whether the current Markdown line sits inside a fenced block.
    in_fence: bool,
    thinking: bool,
    /// Live output of the current execution: started, lines and characters shown, cut,
    /// inside a line.
    live_started: bool,
    live_lines: usize,
    live_chars: usize,
    live_cut: bool,
    live_mid_line: bool,
    /// What the spinner says while waiting (interactive output only), its frame, and whether
    /// it is on screen.
    waiting: Option<&'static str>,
    frame: usize,
    spinner_drawn: bool,
}

/// Said when stopping an execution restarted the runtime process.
const STATE_LOST_NOTE: &str = "     runtime restarted: unregistered state was lost";

const FRAMES: &[char] = &['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

const BOLD: &str = "\x1b[1m";
const DIM: &str = "\x1b[2m";
const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const YELLOW: &str = "\x1b[33m";
const BLUE: &str = "\x1b[34m";
const MAGENTA: &str = "\x1b[35m";
const CYAN: &str = "\x1b[36m";
const RESET: &str = "\x1b[0m";

impl<W: Write> Human<W> {
    /// Prints to `out`, with ANSI colors if `color`.
    pub fn new(out: W, color: bool) -> Self {
        Self {
            out,
            color,
            line: String::new(),
            in_fence: false,
            thinking: false,
            live_started: false,
            live_lines: 0,
            live_chars: 0,
            live_cut: false,
            live_mid_line: false,
            waiting: None,
            frame: 0,
            spinner_drawn: false,
        }
    }

    fn paint(&self, style: &str, text: &str) -> String {
        if self.color && !text.is_empty() {
            format!("{style}{text}{RESET}")
        } else {
            text.to_owned()
        }
    }

    /// Writes one styled line.
    fn note(&mut self, style: &str, text: &str) -> io::Result<()> {
        let line = self.paint(style, text);
        writeln!(self.out, "{line}")
    }

    fn flush_prose(&mut self) -> io::Result<()> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            let rendered = self.markdown_line(&line);
            writeln!(self.out, "{rendered}")?;
        }
        Ok(())
    }

    /// Light Markdown for one line: headings, bullets, **bold** and `code`.
    fn markdown_line(&mut self, line: &str) -> String {
        if line.trim_start().starts_with("```") {
            self.in_fence = !self.in_fence;
            return self.paint(DIM, line);
        }
        if self.in_fence {
            return self.paint(CYAN, line);
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with('#') {
            return self.paint(BOLD, trimmed.trim_start_matches('#').trim_start());
        }
        if matches!(trimmed, "---" | "***" | "___") {
            return self.paint(DIM, &"─".repeat(40));
        }
        if let Some(quoted) = trimmed
            .strip_prefix("> ")
            .or_else(|| trimmed.strip_prefix('>').filter(|q| q.is_empty()))
        {
            let inner = self.markdown_line(quoted);
            return format!("{}{inner}", self.paint(DIM, "│ "));
        }
        let (indent, body) = line.split_at(line.len() - trimmed.len());
        let body = match body.strip_prefix("- ").or_else(|| body.strip_prefix("* ")) {
            Some(rest) => format!("• {rest}"),
            None => body.to_owned(),
        };
        let mut out = String::from(indent);
        let mut rest = body.as_str();
        while !rest.is_empty() {
            // Links: `[text](url)` reads as "text (url)".
            if let Some(open) = rest.find('[')
                && let Some(mid) = rest[open..].find("](").map(|m| open + m)
                && let Some(close) = rest[mid..].find(')').map(|c| mid + c)
                && [rest.find("**"), rest.find('`')]
                    .into_iter()
                    .flatten()
                    .all(|other| other > open)
            {
                out.push_str(&rest[..open]);
                out.push_str(&self.paint(CYAN, &rest[open + 1..mid]));
                out.push_str(&self.paint(DIM, &format!(" ({})", &rest[mid + 2..close])));
                rest = &rest[close + 1..];
                continue;
            }
            let next = [rest.find("**"), rest.find('`')]
                .into_iter()
                .flatten()
                .min();
            let Some(at) = next else {
                out.push_str(rest);
                break;
            };
            out.push_str(&rest[..at]);
            let (marker, style) = if rest[at..].starts_with("**") {
                ("**", BOLD)
            } else {
                ("`", CYAN)
            };
            let after = &rest[at + marker.len()..];
            match after.find(marker) {
                Some(end) => {
                    out.push_str(&self.paint(style, &after[..end]));
                    rest = &after[end + marker.len()..];
                }
                None => {
                    out.push_str(&rest[at..]);
                    break;
                }
            }
        }
        out
    }

    fn block(&mut self, marker_style: &str, title: &str) -> io::Result<()> {
        self.flush_prose()?;
        let dot = self.paint(marker_style, "●");
        writeln!(self.out, "{dot} {}", self.paint(BOLD, title))
    }

    /// Writes output shortened to a readable size, with a note of what was cut.
    fn shortened(&mut self, text: &str) -> io::Result<()> {
        let text = text.trim_end();
        let total_chars = text.chars().count();
        let kept: String = text.chars().take(SHOWN_CHARS).collect();
        let lines: Vec<&str> = kept.lines().collect();
        let shown = lines.len().min(SHOWN_LINES);
        for (i, line) in lines[..shown].iter().enumerate() {
            let lead = if i == 0 { "  ⎿  " } else { "     " };
            writeln!(self.out, "{lead}{line}")?;
        }
        let more_lines = lines.len().saturating_sub(shown);
        let more_chars = total_chars.saturating_sub(SHOWN_CHARS);
        let note = match (more_lines, more_chars) {
            (0, 0) => None,
            (lines, 0) => Some(format!("     … {lines} more lines")),
            (0, chars) => Some(format!("     … {chars} more characters")),
            (lines, chars) => Some(format!(
                "     … {lines} more lines and {chars} more characters"
            )),
        };
        if let Some(note) = note {
            self.note(DIM, &note)?;
        }
        Ok(())
    }

    /// After live output was cut: how much more there was, and for a failure its last lines.
    /// `partial`: the last line shown was cut short.
    fn rest_of_live_output(
        &mut self,
        output: &str,
        success: bool,
        partial: bool,
    ) -> io::Result<()> {
        const TAIL_LINES: usize = 4;
        let text = output.trim_end();
        let total_lines = text.lines().count();
        let shown_lines = self.live_lines + usize::from(partial);
        let hidden_lines = total_lines.saturating_sub(shown_lines);
        let hidden_chars = text.chars().count().saturating_sub(self.live_chars);
        let tail: Vec<&str> = if success {
            Vec::new()
        } else {
            let skip = total_lines.saturating_sub(TAIL_LINES).max(shown_lines);
            text.lines().skip(skip).collect()
        };
        let counted = hidden_lines.saturating_sub(tail.len());
        let note = match counted {
            0 => format!("     … {hidden_chars} more characters"),
            1 => "     … 1 more line".to_owned(),
            n => format!("     … {n} more lines"),
        };
        if counted > 0 || (tail.is_empty() && hidden_chars > 0) {
            self.note(DIM, &note)?;
        }
        for line in tail {
            let line: String = line.chars().take(SHOWN_CHARS).collect();
            writeln!(self.out, "     {line}")?;
        }
        Ok(())
    }

    fn code(&mut self, code: &str) -> io::Result<()> {
        for line in code.lines() {
            let highlighted = if self.color {
                highlight_python(line)
            } else {
                line.to_owned()
            };
            writeln!(self.out, "    {highlighted}")?;
        }
        Ok(())
    }
}

impl<W: Write> Human<W> {
    fn clear_spinner(&mut self) -> io::Result<()> {
        if std::mem::take(&mut self.spinner_drawn) {
            write!(self.out, "\r\x1b[K")?;
        }
        Ok(())
    }

    /// What to show while waiting after `event`.
    fn waiting_after(event: &Event) -> Option<&'static str> {
        match event {
            Event::Code { .. } | Event::ExecutionOutput { .. } => Some("running"),
            Event::FinalResponse { .. } | Event::Stopped { .. } => None,
            _ => Some("thinking"),
        }
    }
}

impl<W: Write> Output for Human<W> {
    fn tick(&mut self) -> io::Result<()> {
        // Colors mean a terminal; the spinner only draws at the start of a line.
        let Some(label) = self.waiting.filter(|_| self.color && !self.live_mid_line) else {
            return Ok(());
        };
        self.frame = (self.frame + 1) % FRAMES.len();
        let frame = FRAMES[self.frame];
        write!(
            self.out,
            "\r{}",
            self.paint(DIM, &format!("{frame} {label}…"))
        )?;
        self.spinner_drawn = true;
        self.out.flush()
    }

    fn event(&mut self, event: &Event) -> io::Result<()> {
        self.clear_spinner()?;
        self.waiting = Self::waiting_after(event);
        match event {
            Event::UserPrompt { content, .. } => {
                let prompt = self.paint(BLUE, &format!("> {content}"));
                writeln!(self.out, "\n{}\n", self.paint(BOLD, &prompt))?;
            }
            Event::ThinkingChunk { .. } if !std::mem::replace(&mut self.thinking, true) => {
                self.flush_prose()?;
                self.note(DIM, "✻ Thinking…")?;
            }
            Event::Thinking {
                content,
                duration_ms,
            } => {
                self.thinking = false;
                let note = format!(
                    "  ({} characters of reasoning, {:.1}s)",
                    content.chars().count(),
                    *duration_ms as f64 / 1000.0
                );
                self.note(DIM, &note)?;
            }
            Event::Text { content } => {
                for piece in content.split_inclusive('\n') {
                    match piece.strip_suffix('\n') {
                        Some(done) => {
                            self.line.push_str(done);
                            let line = std::mem::take(&mut self.line);
                            let rendered = self.markdown_line(&line);
                            writeln!(self.out, "{rendered}")?;
                        }
                        None => self.line.push_str(piece),
                    }
                }
            }
            Event::Code { code } => {
                self.in_fence = false;
                self.flush_prose()?;
                writeln!(self.out)?;
                self.block(GREEN, "Code")?;
                self.code(code)?;
                self.live_lines = 0;
                self.live_chars = 0;
                self.live_cut = false;
                self.live_started = false;
                self.live_mid_line = false;
            }
            Event::ExecutionOutput { chunk } => {
                if !std::mem::replace(&mut self.live_started, true) {
                    self.block(GREEN, "Output")?;
                }
                for piece in chunk.split_inclusive('\n') {
                    if self.live_cut {
                        break;
                    }
                    let budget = SHOWN_CHARS.saturating_sub(self.live_chars);
                    if self.live_lines >= SHOWN_LINES || budget == 0 {
                        self.live_cut = true;
                        break;
                    }
                    let piece = match piece.char_indices().nth(budget) {
                        Some((at, _)) => {
                            self.live_cut = true;
                            &piece[..at]
                        }
                        None => piece,
                    };
                    self.live_chars += piece.chars().count();
                    // Output arrives in pieces (print writes the text, then the newline).
                    if !self.live_mid_line {
                        write!(
                            self.out,
                            "{}",
                            if self.live_lines == 0 {
                                "  ⎿  "
                            } else {
                                "     "
                            }
                        )?;
                    }
                    write!(self.out, "{piece}")?;
                    self.live_mid_line = !piece.ends_with('\n');
                    if !self.live_mid_line {
                        self.live_lines += 1;
                    }
                }
            }
            Event::ExecutionResult {
                output,
                success,
                persisted_variable,
                state_lost,
                ..
            } => {
                let partial = std::mem::take(&mut self.live_mid_line);
                if partial {
                    writeln!(self.out)?;
                }
                if !self.live_started {
                    let (style, title) = if *success {
                        (GREEN, "Output")
                    } else {
                        (RED, "Output (the code raised)")
                    };
                    self.block(style, title)?;
                    self.shortened(output)?;
                } else {
                    if self.live_cut {
                        // Shown once: what streamed live stays, the rest is counted, and the
                        // end of a failure (its traceback's last lines) is shown.
                        self.rest_of_live_output(output, *success, partial)?;
                    }
                    if !success {
                        self.note(RED, "     (the code raised)")?;
                    }
                }
                self.live_lines = 0;
                self.live_chars = 0;
                self.live_cut = false;
                if let Some(var) = persisted_variable {
                    self.note(DIM, &format!("     full output kept in `{var}`"))?;
                }
                if *state_lost {
                    self.note(YELLOW, STATE_LOST_NOTE)?;
                }
            }
            Event::ExecutionTimeout {
                timeout,
                state_lost,
            } => {
                self.block(RED, &format!("Execution stopped after {timeout}s"))?;
                if *state_lost {
                    self.note(YELLOW, STATE_LOST_NOTE)?;
                }
            }
            Event::SecurityError { message } => {
                self.block(RED, "Blocked by the code policy")?;
                self.shortened(message)?;
            }
            Event::Status(status) => {
                self.flush_prose()?;
                let text = match status {
                    Status::Compacting => "● Compacting the conversation…".to_owned(),
                    Status::Compacted { before, after } => {
                        format!("● Compacted {before} → {after} messages")
                    }
                    Status::CompactionFailed { message } => {
                        format!("● Compaction failed, the conversation is kept whole: {message}")
                    }
                    Status::OutputRecovery {
                        recovery,
                        max_recoveries,
                    } => format!("● Answer cut off; resuming ({recovery}/{max_recoveries})"),
                    _ => format!("● {status:?}"),
                };
                self.note(YELLOW, &text)?;
            }
            Event::Backoff { delay } => {
                self.flush_prose()?;
                self.note(
                    YELLOW,
                    &format!("↻ The model call failed; retrying in {delay:.1}s"),
                )?;
            }
            Event::FinalResponse { .. } => self.flush_prose()?,
            Event::Stopped {
                stop_reason,
                steps,
                elapsed,
                usage,
                error,
                ..
            } => {
                self.flush_prose()?;
                let mut summary = format!(
                    "{stop_reason} · {steps} step{}",
                    if *steps == 1 { "" } else { "s" }
                );
                if usage.total_tokens > 0 {
                    summary.push_str(&format!(
                        " · {} tokens ({} in, {} out)",
                        usage.total_tokens, usage.prompt_tokens, usage.completion_tokens
                    ));
                }
                summary.push_str(&format!(" · {elapsed:.1}s"));
                let style = if *stop_reason == StopReason::Completed {
                    DIM
                } else {
                    YELLOW
                };
                writeln!(self.out, "\n{}", self.paint(style, &summary))?;
                if let Some(error) = error {
                    self.note(RED, &error.message)?;
                }
            }
            _ => {}
        }
        self.out.flush()
    }

    fn retrieved(&mut self, retrieved: &Retrieved) -> io::Result<()> {
        self.clear_spinner()?;
        self.waiting = None;
        match retrieved {
            Retrieved::Json { name, value } => {
                let pretty = serde_json::to_string_pretty(value).unwrap_or_default();
                writeln!(self.out, "\n{}", self.paint(BOLD, &format!("{name} =")))?;
                for line in pretty.lines() {
                    writeln!(self.out, "  {line}")?;
                }
            }
            Retrieved::Repr {
                name,
                repr,
                python_type,
            } => {
                writeln!(
                    self.out,
                    "\n{}",
                    self.paint(BOLD, &format!("{name} ({python_type}) ="))
                )?;
                for line in repr.lines() {
                    writeln!(self.out, "  {line}")?;
                }
            }
            Retrieved::Missing { name, error } => {
                writeln!(
                    self.out,
                    "\n{}",
                    self.paint(RED, &format!("{name}: {error}"))
                )?;
            }
        }
        self.out.flush()
    }
}

const KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// Colors one line of Python: keywords, strings, numbers and comments.
fn highlight_python(line: &str) -> String {
    let mut out = String::with_capacity(line.len() * 2);
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '#' {
            let rest: String = chars[i..].iter().collect();
            out.push_str(&format!("{DIM}{rest}{RESET}"));
            break;
        }
        if c == '\'' || c == '"' {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            let end = (i + 1).min(chars.len());
            let s: String = chars[start..end].iter().collect();
            out.push_str(&format!("{GREEN}{s}{RESET}"));
            i = end;
            continue;
        }
        if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if KEYWORDS.contains(&word.as_str()) {
                out.push_str(&format!("{MAGENTA}{word}{RESET}"));
            } else {
                out.push_str(&word);
            }
            continue;
        }
        if c.is_ascii_digit() {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '.' || chars[i] == '_')
            {
                i += 1;
            }
            let number: String = chars[start..i].iter().collect();
            out.push_str(&format!("{YELLOW}{number}{RESET}"));
            continue;
        }
        out.push(c);
        i += 1;
    }
    out
}

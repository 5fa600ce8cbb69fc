//! Printing a run: JSON Lines for programs, a readable transcript for people. Both are
//! generic over `W: Write` and know nothing of where events come from.

use crate::{highlight, markdown};
use anstyle::{AnsiColor, Style};
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
    /// Writes one event; it reaches the terminal or the pipe at the next [`flush`](Self::flush)
    /// (the session flushes whenever no further event is ready, so a burst is one write).
    fn event(&mut self, event: &Event) -> io::Result<()>;
    /// Sends what the events written so far left in the buffer.
    fn flush(&mut self) -> io::Result<()>;
    /// Prints a retrieved variable.
    fn retrieved(&mut self, retrieved: &Retrieved) -> io::Result<()>;
    /// Called about ten times a second while waiting (for a spinner).
    fn tick(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One JSON object per line: exactly the core's serde form.
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
        serde_json::to_writer(&mut self.out, event)?;
        self.out.write_all(b"\n")
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
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
pub struct Human<W> {
    out: W,
    /// Where errors and warnings go (stderr in `cave`); `None`: to `out` with the rest.
    errors: Option<Box<dyn Write + Send>>,
    color: bool,
    /// Prose not yet printed: Markdown is rendered a block at a time (a table or a list needs
    /// all its lines).
    prose: String,
    /// Prose blocks printed since the last code or prompt (a blank line goes between them).
    prose_blocks: usize,
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
    /// How images are drawn inline, when the terminal can.
    images: Option<crate::images::ImageProtocol>,
}

impl<W: std::fmt::Debug> std::fmt::Debug for Human<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Human")
            .field("out", &self.out)
            .field("errors", &self.errors.is_some())
            .field("color", &self.color)
            .finish_non_exhaustive()
    }
}

/// Said when stopping an execution restarted the runtime process.
const STATE_LOST_NOTE: &str = "     runtime restarted: unregistered state was lost";

const FRAMES: &[char] = &['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

const BOLD: Style = Style::new().bold();
const DIM: Style = Style::new().dimmed();
const RED: Style = AnsiColor::Red.on_default();
const GREEN: Style = AnsiColor::Green.on_default();
const YELLOW: Style = AnsiColor::Yellow.on_default();
const BLUE: Style = AnsiColor::Blue.on_default();

impl<W: Write> Human<W> {
    /// Prints to `out`, with ANSI colors if `color`.
    pub fn new(out: W, color: bool) -> Self {
        Self {
            out,
            errors: None,
            color,
            prose: String::new(),
            prose_blocks: 0,
            thinking: false,
            live_started: false,
            live_lines: 0,
            live_chars: 0,
            live_cut: false,
            live_mid_line: false,
            waiting: None,
            frame: 0,
            spinner_drawn: false,
            images: None,
        }
    }

    /// Draws the images cells show with `protocol` (a terminal that speaks it).
    pub fn with_images(mut self, protocol: Option<crate::images::ImageProtocol>) -> Self {
        self.images = protocol;
        self
    }

    fn paint(&self, style: Style, text: &str) -> String {
        if self.color && !text.is_empty() {
            format!("{style}{text}{style:#}")
        } else {
            text.to_owned()
        }
    }

    /// Sends errors and warnings (a run's error, retries, compaction trouble, a missing
    /// variable) to `errors`, so that the conversation alone goes to `out`.
    pub fn with_errors(mut self, errors: Box<dyn Write + Send>) -> Self {
        self.errors = Some(errors);
        self
    }

    /// Writes one styled line.
    fn note(&mut self, style: Style, text: &str) -> io::Result<()> {
        let line = self.paint(style, text);
        writeln!(self.out, "{line}")
    }

    /// Writes one styled line where errors and warnings go.
    fn warn(&mut self, style: Style, text: &str) -> io::Result<()> {
        let line = self.paint(style, text);
        match &mut self.errors {
            Some(errors) => {
                // What is already on stdout comes first on a shared terminal.
                self.out.flush()?;
                writeln!(errors, "{line}")?;
                errors.flush()
            }
            None => writeln!(self.out, "{line}"),
        }
    }

    /// Prints all pending prose.
    fn flush_prose(&mut self) -> io::Result<()> {
        let prose = std::mem::take(&mut self.prose);
        self.print_markdown(&prose)
    }

    /// Prints the blocks of pending prose that are complete (up to the last blank line outside
    /// a fenced block); keeps the rest.
    fn print_complete_blocks(&mut self) -> io::Result<()> {
        let Some(end) = last_block_end(&self.prose) else {
            return Ok(());
        };
        let rest = self.prose.split_off(end);
        let done = std::mem::replace(&mut self.prose, rest);
        self.print_markdown(&done)
    }

    fn print_markdown(&mut self, text: &str) -> io::Result<()> {
        let lines = markdown::render(text, self.color);
        if lines.is_empty() {
            return Ok(());
        }
        if self.prose_blocks > 0 {
            writeln!(self.out)?;
        }
        self.prose_blocks += 1;
        for line in lines {
            writeln!(self.out, "{line}")?;
        }
        Ok(())
    }

    fn block(&mut self, marker_style: Style, title: &str) -> io::Result<()> {
        self.flush_prose()?;
        let dot = self.paint(marker_style, "●");
        writeln!(self.out, "{dot} {}", self.paint(BOLD, title))
    }

    /// Writes output shortened to a readable size, with a note of what was cut.
    fn shortened(&mut self, text: &str) -> io::Result<()> {
        let text = text.trim_end();
        let total_chars = text.chars().count();
        let (kept, _) = cave_agent::shorten(text, SHOWN_CHARS);
        let lines: Vec<&str> = kept.lines().collect();
        let shown = lines.len().min(SHOWN_LINES);
        for (i, line) in lines[..shown].iter().enumerate() {
            let lead = if i == 0 { "  ⎿  " } else { "     " };
            writeln!(self.out, "{lead}{line}")?;
        }
        let more_lines = lines.len().saturating_sub(shown);
        let more_chars = total_chars - kept.chars().count();
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
            let (line, _) = cave_agent::shorten(line, SHOWN_CHARS);
            writeln!(self.out, "     {line}")?;
        }
        Ok(())
    }

    fn code(&mut self, code: &str) -> io::Result<()> {
        let lines = if self.color {
            highlight::python_lines(code)
        } else {
            code.lines().map(str::to_owned).collect()
        };
        for line in lines {
            writeln!(self.out, "    {line}")?;
        }
        Ok(())
    }
}

impl<W: Write> Human<W> {
    /// A sub-agent's event, compact and indented under the execution that runs it: its
    /// prompt, code, result, answer and stop (its streaming prose is left to its answer).
    fn nested(&mut self, agent: &str, event: &Event) -> io::Result<()> {
        if let Event::SubAgent {
            agent: inner,
            event,
        } = event
        {
            return self.nested(&format!("{agent} › {inner}"), event);
        }
        if std::mem::take(&mut self.live_mid_line) {
            writeln!(self.out)?;
        }
        let bar = self.paint(DIM, "     ┆");
        let head = format!("{bar} {}", self.paint(BOLD, agent));
        let lines = |text: &str, max: usize| -> Vec<String> {
            let all: Vec<&str> = text.lines().collect();
            let mut shown: Vec<String> = all
                .iter()
                .take(max)
                .map(|l| cave_agent::shorten(l, SHOWN_CHARS).0.to_owned())
                .collect();
            if all.len() > max {
                shown.push(format!("… {} more lines", all.len() - max));
            }
            shown
        };
        match event {
            Event::UserPrompt { content, .. } => {
                writeln!(
                    self.out,
                    "{head} {}",
                    self.paint(BLUE, &format!("> {content}"))
                )?;
            }
            Event::Code { code, .. } => {
                writeln!(self.out, "{head} {}", self.paint(GREEN, "runs"))?;
                for line in lines(code, SHOWN_LINES) {
                    writeln!(self.out, "{bar}     {line}")?;
                }
            }
            Event::ExecutionResult {
                output, success, ..
            } => {
                let (style, label) = if *success {
                    (DIM, "output")
                } else {
                    (RED, "error")
                };
                if !output.trim().is_empty() {
                    writeln!(self.out, "{head} {}", self.paint(style, label))?;
                    for line in lines(output, 4) {
                        writeln!(self.out, "{bar}     {line}")?;
                    }
                }
            }
            Event::SecurityError { message, .. } => {
                writeln!(self.out, "{head} {}", self.paint(RED, message))?;
            }
            Event::ExecutionTimeout { timeout, .. } => {
                let text = format!("execution stopped after {timeout}s");
                writeln!(self.out, "{head} {}", self.paint(YELLOW, &text))?;
            }
            Event::FinalResponse { content } => {
                writeln!(self.out, "{head} answers")?;
                for line in lines(content, SHOWN_LINES) {
                    writeln!(self.out, "{bar}     {line}")?;
                }
            }
            Event::Stopped {
                stop_reason,
                steps,
                elapsed,
                ..
            } => {
                let text = format!(
                    "{stop_reason} · {steps} step{} · {elapsed:.1}s",
                    if *steps == 1 { "" } else { "s" }
                );
                let style = if *stop_reason == StopReason::Completed {
                    DIM
                } else {
                    YELLOW
                };
                writeln!(self.out, "{head} {}", self.paint(style, &text))?;
            }
            _ => {}
        }
        Ok(())
    }

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
            // The approval question is on the terminal: no spinner over it.
            Event::FinalResponse { .. }
            | Event::Stopped { .. }
            | Event::ApprovalRequested { .. } => None,
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
        // A step's cost is said after what ended it, and changes nothing the person waits for.
        if !matches!(event, Event::Step { .. }) {
            self.waiting = Self::waiting_after(event);
        }
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
                self.prose.push_str(content);
                self.print_complete_blocks()?;
            }
            Event::Code { code, .. } => {
                self.flush_prose()?;
                self.prose_blocks = 0;
                writeln!(self.out)?;
                self.block(GREEN, "Code")?;
                self.code(code)?;
                self.live_lines = 0;
                self.live_chars = 0;
                self.live_cut = false;
                self.live_started = false;
                self.live_mid_line = false;
            }
            Event::ExecutionOutput { chunk } => self.live_output(chunk)?,
            Event::ExecutionResult {
                output,
                success,
                persisted_variable,
                state_lost,
                ..
            } => {
                self.execution_result(output, *success, persisted_variable.as_deref(), *state_lost)?
            }
            Event::ExecutionTimeout {
                timeout,
                state_lost,
            } => {
                self.block(RED, &format!("Execution stopped after {timeout}s"))?;
                if *state_lost {
                    self.note(YELLOW, STATE_LOST_NOTE)?;
                }
                self.prose_blocks = 1;
            }
            Event::SecurityError { message, .. } => {
                self.block(RED, "Blocked by the code policy")?;
                self.shortened(message)?;
                self.prose_blocks = 1;
            }
            Event::Status(status) => self.status(status)?,
            Event::Backoff { delay, reason } => {
                self.flush_prose()?;
                let why = reason
                    .as_deref()
                    .map(|r| format!(" ({})", cave_agent::one_line(r, 160)))
                    .unwrap_or_default();
                self.warn(
                    YELLOW,
                    &format!("↻ The model call failed{why}; retrying in {delay:.1}s"),
                )?;
            }
            Event::Display {
                mime_types,
                files,
                item,
                ..
            } => self.shown(mime_types, files, item.as_deref())?,
            Event::SubAgent { agent, event } => self.nested(agent, event)?,
            Event::Egress(connections) => self.egress(connections)?,
            Event::ApprovalRequested { .. } => {}
            Event::ExecutionRefused { reason } => {
                let why = reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default();
                self.note(YELLOW, &format!("  ⎿  not approved{why}; nothing ran"))?;
            }
            Event::FinalResponse { .. } => self.flush_prose()?,
            Event::Stopped {
                stop_reason,
                steps,
                elapsed,
                usage,
                error,
                ledger,
                ..
            } => {
                self.stopped(*stop_reason, *steps, *elapsed, usage, error.as_ref())?;
                self.ledger(ledger)?;
            }
            _ => {}
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
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
                self.warn(RED, &format!("{name}: {error}"))?;
            }
        }
        self.out.flush()
    }
}

/// How each kind of event reads, for `Output::event`.
impl<W: Write> Human<W> {
    /// The cell's connections through the egress proxy: one line each, refusals in yellow.
    fn egress(&mut self, connections: &cave_agent::Connections) -> io::Result<()> {
        self.flush_prose()?;
        for connection in &connections.list {
            let style = if connection.allowed { DIM } else { YELLOW };
            let text = cave_agent::one_line(&connection.to_string(), 200);
            self.note(style, &format!("  ⎿  network: {text}"))?;
        }
        if connections.omitted > 0 {
            let text = format!("  ⎿  network: {} more connections", connections.omitted);
            self.note(DIM, &text)?;
        }
        Ok(())
    }

    /// A piece of a running cell's output, shown live up to the block's size.
    fn live_output(&mut self, chunk: &str) -> io::Result<()> {
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
        Ok(())
    }

    /// A cell's result: what was not shown live, whether it raised, where its full output is
    /// kept, and whether the runtime's state was lost.
    fn execution_result(
        &mut self,
        output: &str,
        success: bool,
        persisted_variable: Option<&str>,
        state_lost: bool,
    ) -> io::Result<()> {
        let partial = std::mem::take(&mut self.live_mid_line);
        if partial {
            writeln!(self.out)?;
        }
        if !self.live_started {
            let (style, title) = if success {
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
                self.rest_of_live_output(output, success, partial)?;
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
        if state_lost {
            self.note(YELLOW, STATE_LOST_NOTE)?;
        }
        // The next step's prose starts after a blank line.
        self.prose_blocks = 1;
        Ok(())
    }

    /// A status line (compaction, output recovery, sandbox layers unavailable), where
    /// warnings go.
    fn status(&mut self, status: &Status) -> io::Result<()> {
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
            Status::ToolCallsAnswered { tools } => format!(
                "● The model called {} (there are no tools here); told to write code instead",
                tools.join(", ")
            ),
            Status::Isolation { layers } => {
                // Said on stderr when the runtime starts; unavailable layers are the
                // ones worth repeating.
                let missing: Vec<&String> = layers
                    .iter()
                    .filter(|l| l.contains("unavailable"))
                    .collect();
                if missing.is_empty() {
                    return Ok(());
                }
                format!(
                    "● Sandbox layers unavailable: {}",
                    missing
                        .iter()
                        .map(|l| l.as_str())
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            }
            _ => format!("● {status:?}"),
        };
        self.warn(YELLOW, &text)?;
        Ok(())
    }

    /// An item a cell showed: its rich forms, and the file each was written to.
    fn shown(
        &mut self,
        mime_types: &[String],
        files: &std::collections::BTreeMap<String, String>,
        item: Option<&cave_agent::DisplayItem>,
    ) -> io::Result<()> {
        let rich: Vec<&String> = mime_types.iter().filter(|m| *m != "text/plain").collect();
        if rich.is_empty() {
            return Ok(());
        }
        if self.live_mid_line {
            writeln!(self.out)?;
            self.live_mid_line = false;
        }
        for mime in rich {
            let line = match files.get(mime) {
                Some(path) => format!("     ▣ {mime} → {path}"),
                None => format!("     ▣ {mime}"),
            };
            self.note(BLUE, &line)?;
        }
        // The first image the terminal can draw, drawn.
        if let (Some(protocol), Some(item)) = (self.images, item) {
            let drawn = item.rich_forms().find_map(|(mime, data)| {
                protocol.encode(mime, data.as_bytes(), crate::images::IMAGE_COLUMNS)
            });
            if let Some(sequences) = drawn {
                write!(self.out, "{sequences}")?;
            }
        }
        Ok(())
    }

    /// The closing line: why the run stopped, its steps, tokens and time; its error.
    /// The session's account so far, under the run's closing line (when a model was asked).
    fn ledger(&mut self, ledger: &cave_agent::Ledger) -> io::Result<()> {
        if ledger.model_calls == 0 {
            return Ok(());
        }
        let line = format!("session · {}", ledger.summary_parts().join(" · "));
        writeln!(self.out, "{}", self.paint(DIM, &line))
    }

    fn stopped(
        &mut self,
        stop_reason: StopReason,
        steps: u32,
        elapsed: f64,
        usage: &cave_agent::Usage,
        error: Option<&cave_agent::StopError>,
    ) -> io::Result<()> {
        self.flush_prose()?;
        let mut summary = format!(
            "{stop_reason} · {steps} step{}",
            if steps == 1 { "" } else { "s" }
        );
        if usage.total_tokens > 0 {
            // `~`: the server reported no usage, so these are estimates.
            let about = if usage.estimated { "~" } else { "" };
            summary.push_str(&format!(
                " · {about}{} tokens ({about}{} in, {about}{} out)",
                usage.total_tokens, usage.prompt_tokens, usage.completion_tokens
            ));
        }
        summary.push_str(&format!(" · {elapsed:.1}s"));
        let style = if stop_reason == StopReason::Completed {
            DIM
        } else {
            YELLOW
        };
        writeln!(self.out, "\n{}", self.paint(style, &summary))?;
        if let Some(error) = error {
            self.warn(RED, &error.message)?;
        }
        Ok(())
    }
}

/// Where the last complete Markdown block of `text` ends: after its last blank line that is
/// not inside a fenced code block.
fn last_block_end(text: &str) -> Option<usize> {
    let mut in_fence = false;
    let mut end = None;
    let mut offset = 0;
    let mut previous_blank = false;
    for line in text.split_inclusive('\n') {
        let complete = line.ends_with('\n');
        let trimmed = line.trim();
        if complete && (trimmed.starts_with("```") || trimmed.starts_with("~~~")) {
            in_fence = !in_fence;
        }
        offset += line.len();
        let blank = complete && trimmed.is_empty();
        if blank && !in_fence && !previous_blank {
            end = Some(offset);
        }
        previous_blank = blank;
    }
    end
}

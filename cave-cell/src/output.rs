//! A cell's output held up to a cap: its beginning and its end, with a count of what was
//! dropped between them, so that a printing loop cannot grow the host; and, past that cap,
//! the whole output written to a file as it comes ([`OutputSpool`]), up to a limit.

use cave_core::{DisplayItem, LiveOutput, SpooledOutput, lock, prompt};
use std::io::Write as _;
use std::path::PathBuf;

/// The output of one cell kept whole by default (in a file past what is held): 1 GiB.
pub const DEFAULT_MAX_CELL_OUTPUT: u64 = 1 << 30;

/// Text kept up to a cap: nothing is dropped until the cap is reached; past it, the first
/// half and the last half are kept and the bytes and lines between are counted.
#[derive(Clone, Debug)]
pub struct CappedOutput {
    head_cap: usize,
    tail_cap: usize,
    head: String,
    tail: String,
    dropped_bytes: u64,
    dropped_lines: u64,
}

impl CappedOutput {
    /// Keeps up to `cap` bytes (at least 2).
    pub fn new(cap: usize) -> Self {
        let cap = cap.max(2);
        Self {
            head_cap: cap / 2,
            tail_cap: cap - cap / 2,
            head: String::new(),
            tail: String::new(),
            dropped_bytes: 0,
            dropped_lines: 0,
        }
    }

    /// Adds text.
    pub fn push(&mut self, mut text: &str) {
        if self.tail.is_empty() && self.head.len() < self.head_cap {
            let room = floor_boundary(text, self.head_cap - self.head.len());
            self.head.push_str(&text[..room]);
            text = &text[room..];
        }
        if text.is_empty() {
            return;
        }
        self.tail.push_str(text);
        // Trimmed to its cap once it holds twice as much: amortised, one copy per byte.
        if self.tail.len() > 2 * self.tail_cap {
            self.trim_tail();
        }
    }

    /// The text held so far, its beginning and its end (whole while nothing was dropped).
    pub fn held(&self) -> (&str, &str) {
        (&self.head, &self.tail)
    }

    /// Bytes dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped_bytes + self.tail.len().saturating_sub(self.tail_cap) as u64
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    /// Returns true if and only if nothing was pushed (or only empty text).
    pub fn is_empty(&self) -> bool {
        self.head.is_empty() && self.tail.is_empty()
    }

    /// Returns true if and only if the text held so far ends with a line break.
    pub fn ends_with_newline(&self) -> bool {
        let last = if self.tail.is_empty() {
            &self.head
        } else {
            &self.tail
        };
        last.ends_with('\n')
    }

    /// The text: whole when it fitted, else its beginning, `note(bytes, lines)` and its end.
    pub fn finish(mut self, note: impl FnOnce(u64, u64) -> String) -> String {
        self.trim_tail();
        if self.dropped_bytes == 0 {
            self.head.push_str(&self.tail);
            return self.head;
        }
        // The end starts on a line of its own when one starts near its beginning.
        if let Some(newline) = self.tail[..self.tail.len().min(4096)].find('\n') {
            self.dropped_bytes += newline as u64 + 1;
            self.dropped_lines += 1;
            self.tail.drain(..=newline);
        }
        let mut text = self.head;
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&note(self.dropped_bytes, self.dropped_lines));
        text.push_str(&self.tail);
        text
    }

    fn trim_tail(&mut self) {
        let excess = self.tail.len().saturating_sub(self.tail_cap);
        if excess == 0 {
            return;
        }
        let cut = ceil_boundary(&self.tail, excess);
        self.dropped_bytes += cut as u64;
        self.dropped_lines += bytecount(&self.tail.as_bytes()[..cut]);
        self.tail.drain(..cut);
    }
}

fn bytecount(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b == b'\n').count() as u64
}

/// The largest char boundary of `text` at or below `at`.
fn floor_boundary(text: &str, at: usize) -> usize {
    if at >= text.len() {
        return text.len();
    }
    (0..=at)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0)
}

/// The smallest char boundary of `text` at or above `at`.
fn ceil_boundary(text: &str, at: usize) -> usize {
    (at..=text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len())
}

/// Where a cell's whole output goes once it passes what the host holds: a new file in `dir`
/// (one the runtime's Python can read), up to `limit` bytes, the rest counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputSpool {
    dir: PathBuf,
    limit: u64,
    /// The file is unlinked as soon as it is open and read back through its descriptor: it
    /// cannot outlive the host, even one that is killed.
    unlinked: bool,
}

impl OutputSpool {
    /// Spools into a named file in `dir` (the file is removed with its [`SpooledOutput`]),
    /// keeping at most `limit` bytes.
    pub fn new(dir: impl Into<PathBuf>, limit: u64) -> Self {
        Self {
            dir: dir.into(),
            limit,
            unlinked: false,
        }
    }

    /// The file is unlinked once open: only this process reads it (through
    /// [`SpooledOutput::file`]), and nothing is left behind whatever ends the process.
    pub fn unlinked(mut self) -> Self {
        self.unlinked = true;
        self
    }

    /// The most bytes it keeps.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    fn open(&self) -> std::io::Result<(std::fs::File, PathBuf)> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        loop {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = self
                .dir
                .join(format!(".cave-output-{}-{n}.txt", std::process::id()));
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => return Ok((file, path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// The file being written while a cell runs.
#[derive(Debug)]
struct Spooling {
    out: std::io::BufWriter<std::fs::File>,
    path: Option<PathBuf>,
    bytes: u64,
    chars: u64,
    cut: u64,
    limit: u64,
}

impl Spooling {
    fn start(spool: &OutputSpool) -> std::io::Result<Self> {
        let (file, path) = spool.open()?;
        let path = if spool.unlinked {
            std::fs::remove_file(&path)?;
            None
        } else {
            Some(path)
        };
        Ok(Self {
            out: std::io::BufWriter::with_capacity(64 << 10, file),
            path,
            bytes: 0,
            chars: 0,
            cut: 0,
            limit: spool.limit,
        })
    }

    fn write(&mut self, text: &str) -> std::io::Result<()> {
        let room = usize::try_from(self.limit.saturating_sub(self.bytes)).unwrap_or(usize::MAX);
        let kept = if text.len() <= room {
            text
        } else {
            &text[..floor_boundary(text, room)]
        };
        self.cut += (text.len() - kept.len()) as u64;
        if kept.is_empty() {
            return Ok(());
        }
        self.out.write_all(kept.as_bytes())?;
        self.bytes += kept.len() as u64;
        self.chars += kept.chars().count() as u64;
        Ok(())
    }

    fn finish(self) -> std::io::Result<SpooledOutput> {
        let Self {
            out,
            path,
            bytes,
            chars,
            cut,
            limit,
        } = self;
        let removal = path.clone();
        let file = out.into_inner().map_err(|e| {
            if let Some(path) = &removal {
                let _ = std::fs::remove_file(path);
            }
            e.into_error()
        })?;
        Ok(SpooledOutput::new(file, path, bytes, chars, cut, limit))
    }

    /// Gives up on the file (it could not be written).
    fn abandon(self) {
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A running cell's output as a runtime collects it: sent live up to the cap (past it, the
/// pieces are not queued: a consumer slower than the cell must not make the host hold them),
/// and held up to the cap, its beginning and its end, for the result. With a spool
/// ([`with_spool`](Self::with_spool)), the whole output also goes to a file once it passes the
/// cap.
#[derive(Debug)]
pub struct CellOutput {
    cap: usize,
    text: CappedOutput,
    spool: Option<OutputSpool>,
    spooling: Option<Spooling>,
    /// Why the whole output could not be kept, when its file failed.
    spool_failed: Option<String>,
    live: Option<tokio::sync::mpsc::UnboundedSender<LiveOutput>>,
    live_left: usize,
    /// Where display items go: the live channel, kept when the text stops going live.
    displays: Option<tokio::sync::mpsc::UnboundedSender<LiveOutput>>,
    /// Items sent, and their bytes; items left out past the bounds.
    displays_sent: usize,
    display_bytes: usize,
    displays_left_out: usize,
    /// The cell's span, the parent of its host calls' spans.
    span: tracing::Span,
    /// What the cell's host calls are counted by (the agent's sink gives one).
    host_calls: Option<std::sync::Arc<cave_core::HostCallMeter>>,
}

impl CellOutput {
    /// Collects up to `cap` bytes, sending pieces to `live` as they come (up to `cap` too, the
    /// note that live output stops included).
    /// Display items go to `live` too, at most [`MAX_DISPLAY_ITEMS`](cave_core::MAX_DISPLAY_ITEMS)
    /// of them and 8 × `cap` bytes a cell; the result notes how many more there were.
    pub fn new(cap: usize, live: Option<tokio::sync::mpsc::UnboundedSender<LiveOutput>>) -> Self {
        Self {
            cap,
            text: CappedOutput::new(cap),
            spool: None,
            spooling: None,
            spool_failed: None,
            displays: live.clone(),
            live,
            live_left: cap.saturating_sub(LIVE_NOTE_ROOM),
            displays_sent: 0,
            display_bytes: 0,
            displays_left_out: 0,
            span: tracing::Span::current(),
            host_calls: None,
        }
    }

    /// Counts the cell's host calls with `meter` (what the sink the cell writes to gives:
    /// [`OutputSink::host_calls`](cave_core::OutputSink::host_calls)).
    pub fn with_host_calls(
        mut self,
        meter: Option<std::sync::Arc<cave_core::HostCallMeter>>,
    ) -> Self {
        self.host_calls = meter;
        self
    }

    /// The meter the cell's host calls are counted by, if any: what
    /// [`run_host_call`](crate::run_host_call) takes.
    pub fn host_calls(&self) -> Option<std::sync::Arc<cave_core::HostCallMeter>> {
        self.host_calls.clone()
    }

    /// Keeps the whole output, past the cap, in a file of `spool`'s.
    pub fn with_spool(mut self, spool: OutputSpool) -> Self {
        self.spool = Some(spool);
        self
    }

    /// Its span is `span` (by default, the span current where it was made): a runtime that
    /// makes it on another thread than the cell's caller passes the caller's.
    pub fn with_span(mut self, span: tracing::Span) -> Self {
        self.span = span;
        self
    }

    /// The cell's span: what its host calls' spans are children of.
    pub fn span(&self) -> tracing::Span {
        self.span.clone()
    }

    /// Adds an item the cell showed.
    pub fn display(&mut self, item: DisplayItem) {
        let size = item.size();
        let within = self.displays_sent < cave_core::MAX_DISPLAY_ITEMS
            && self.display_bytes.saturating_add(size) <= self.cap.saturating_mul(8);
        match &self.displays {
            Some(live) if within => {
                self.displays_sent += 1;
                self.display_bytes += size;
                let _ = live.send(LiveOutput::Display(item));
            }
            _ => self.displays_left_out += 1,
        }
    }

    /// Adds a piece of output.
    pub fn push(&mut self, text: &str) {
        if let Some(live) = &self.live {
            // Charged what it takes while queued, not only its text: `print` writes a line in
            // several pieces of a few bytes, and a consumer slower than the cell would
            // otherwise hold several times the cap.
            let cost = text.len() + LIVE_PIECE_COST;
            if cost <= self.live_left {
                self.live_left -= cost;
                let _ = live.send(LiveOutput::Text(text.to_owned()));
            } else {
                // Once, and nothing live after it: what follows is in the result's end.
                let _ = live.send(LiveOutput::Text(prompt::live_output_stopped(self.cap)));
                self.live = None;
            }
        }
        self.spool_piece(text);
        self.text.push(text);
    }

    /// Writes `text` to the spool's file, starting the file (with what is held so far, all of
    /// the output until now) when `text` takes the output past the cap.
    fn spool_piece(&mut self, text: &str) {
        let written = match &mut self.spooling {
            Some(spooling) => spooling.write(text),
            None => {
                let Some(spool) = &self.spool else { return };
                if self.spool_failed.is_some()
                    || self.text.len().saturating_add(text.len()) <= self.cap
                {
                    return;
                }
                let (head, tail) = self.text.held();
                Spooling::start(spool).and_then(|mut spooling| {
                    spooling.write(head)?;
                    spooling.write(tail)?;
                    spooling.write(text)?;
                    self.spooling = Some(spooling);
                    Ok(())
                })
            }
        };
        if let Err(error) = written {
            if let Some(spooling) = self.spooling.take() {
                spooling.abandon();
            }
            tracing::warn!(%error, "a cell's whole output could not be written to its file");
            self.spool_failed = Some(error.to_string());
        }
    }

    /// Returns true if and only if nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// Returns true if and only if the output so far ends with a line break.
    pub fn ends_with_newline(&self) -> bool {
        self.text.ends_with_newline()
    }

    /// The output for the result: whole when within the cap, else its beginning, a note of
    /// what is not in it and its end; and, past the cap with a spool, the whole output in its
    /// file. The note says which: the middle is in the file
    /// ([`prompt::output_spooled`](prompt::output_spooled)), or dropped
    /// ([`prompt::output_dropped`](prompt::output_dropped)).
    pub fn finish(mut self) -> (String, Option<SpooledOutput>) {
        let cap = self.cap;
        if self.displays_left_out > 0 {
            let note = prompt::displays_left_out(self.displays_left_out, cap);
            self.text.push(&note);
        }
        let spooled = self.spooling.take().and_then(|s| match s.finish() {
            Ok(spooled) => Some(spooled),
            Err(error) => {
                self.spool_failed = Some(error.to_string());
                None
            }
        });
        let failed = self.spool_failed.take();
        let text = self.text.finish(|bytes, lines| match &spooled {
            Some(spooled) => prompt::output_spooled(
                bytes,
                lines,
                spooled.bytes(),
                spooled.cut(),
                spooled.limit(),
            ),
            None => {
                let mut note = prompt::output_dropped(bytes, lines, cap);
                if let Some(error) = &failed {
                    note.push_str(&prompt::output_not_spooled(error));
                }
                note
            }
        });
        (text, spooled)
    }
}

/// What one live piece takes besides its text while it waits to be taken: the string's
/// allocation (header and rounding) and its slot in the channel.
const LIVE_PIECE_COST: usize = 64;

/// Room kept in the live cap for the note that live output stops.
const LIVE_NOTE_ROOM: usize = 256;

/// The output written while no cell runs that a runtime keeps for the next cell: 64 KiB.
pub const STRAY_OUTPUT_CAP: usize = 64 << 10;

/// Output written while no cell runs (a thread or process a cell left running), kept up to
/// [`STRAY_OUTPUT_CAP`] until the next cell takes it, the rest counted.
#[derive(Debug)]
pub struct StrayOutput(std::sync::Mutex<Option<CappedOutput>>);

impl Default for StrayOutput {
    fn default() -> Self {
        Self(std::sync::Mutex::new(None))
    }
}

impl StrayOutput {
    /// Keeps `text`, within the cap.
    pub fn push(&self, text: &str) {
        let mut held = lock(&self.0);
        held.get_or_insert_with(|| CappedOutput::new(STRAY_OUTPUT_CAP))
            .push(text);
    }

    /// What was written since the last call, as the model reads it before a cell's output
    /// (`None` if nothing was).
    pub fn take(&self) -> Option<String> {
        let held = lock(&self.0).take()?;
        let text = held.finish(|bytes, _| prompt::written_outside_dropped(bytes));
        Some(prompt::written_outside_cells(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(bytes: u64, lines: u64) -> String {
        format!("[{bytes}/{lines}]")
    }

    /// A directory of this test's own, removed at the end.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cave-spool-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn lines(from: usize, to: usize) -> String {
        (from..to).map(|i| format!("{i:07}\n")).collect()
    }

    #[test]
    fn past_the_cap_the_whole_output_is_in_the_file() {
        let dir = scratch("whole");
        let mut out = CellOutput::new(1000, None).with_spool(OutputSpool::new(&dir, 1 << 20));
        let mut all = String::new();
        for i in 0..100 {
            let piece = lines(i * 10, i * 10 + 10);
            all.push_str(&piece);
            out.push(&piece);
        }
        let (text, spooled) = out.finish();
        let spooled = spooled.expect("spooled past the cap");
        assert_eq!(spooled.bytes(), all.len() as u64);
        assert_eq!(spooled.chars(), all.len() as u64);
        assert_eq!(spooled.cut(), 0);
        assert_eq!(spooled.read_to_string().unwrap(), all);
        assert!(text.starts_with("0000000\n"), "{text}");
        assert!(text.ends_with("0000999\n"), "{text}");
        assert!(
            text.contains("of output not shown here; the whole output, 7.8 KiB, is kept.]"),
            "{text}"
        );
        let path = spooled.path().expect("named").to_owned();
        assert!(path.starts_with(&dir));
        drop(spooled);
        assert!(!path.exists(), "the file goes with its output");
        std::fs::remove_dir(&dir).expect("nothing left in the directory");
    }

    #[test]
    fn within_the_cap_nothing_is_spooled() {
        let dir = scratch("within");
        let mut out = CellOutput::new(1000, None).with_spool(OutputSpool::new(&dir, 1 << 20));
        out.push("small\n");
        assert_eq!(out.finish(), ("small\n".to_owned(), None));
        std::fs::remove_dir(&dir).expect("no file made");
    }

    #[test]
    fn past_the_limit_the_rest_is_cut_and_counted() {
        let dir = scratch("limit");
        let mut out =
            CellOutput::new(100, None).with_spool(OutputSpool::new(&dir, 1000).unlinked());
        let all = lines(0, 500);
        for chunk in all.as_bytes().chunks(64) {
            out.push(std::str::from_utf8(chunk).unwrap());
        }
        let (text, spooled) = out.finish();
        let spooled = spooled.expect("spooled");
        assert!(spooled.path().is_none());
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "unlinked at once"
        );
        assert_eq!(spooled.bytes(), 1000);
        assert_eq!(spooled.cut(), all.len() as u64 - 1000);
        assert_eq!(spooled.read_to_string().unwrap(), all[..1000]);
        assert!(
            text.contains("is kept up to the limit of 1000 B a cell: the 2.9 KiB written past it were dropped.]"),
            "{text}"
        );
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn a_spool_that_cannot_be_written_says_so_and_keeps_the_ends() {
        let mut out = CellOutput::new(100, None)
            .with_spool(OutputSpool::new("/nonexistent/cave-spool", 1 << 20));
        let all = lines(0, 100);
        out.push(&all);
        let (text, spooled) = out.finish();
        assert!(spooled.is_none());
        assert!(text.contains("of output dropped here"), "{text}");
        assert!(
            text.contains("[The whole output could not be kept in a file either: "),
            "{text}"
        );
    }

    #[test]
    fn output_within_the_cap_is_whole() {
        let mut out = CappedOutput::new(16);
        for piece in ["abc", "def\n", "ghijklmn"] {
            out.push(piece);
        }
        assert_eq!(out.dropped(), 0);
        assert_eq!(out.finish(note), "abcdef\nghijklmn");
    }

    #[test]
    fn output_past_the_cap_keeps_its_ends_and_counts_the_rest() {
        let mut out = CappedOutput::new(40);
        let mut all = String::new();
        for i in 0..1000 {
            let line = format!("line {i:04}\n");
            all.push_str(&line);
            out.push(&line);
        }
        let text = out.finish(note);
        assert!(text.starts_with("line 0000\nline 0001\n["), "{text}");
        assert!(text.ends_with("line 0999\n"), "{text}");
        let open = text.find('[').unwrap();
        let close = text.find(']').unwrap();
        let (bytes, lines) = text[open + 1..close].split_once('/').unwrap();
        let kept = text.len() - (close + 1 - open);
        assert_eq!(bytes.parse::<usize>().unwrap() + kept, all.len());
        let kept_lines = text.matches('\n').count() as u64;
        assert_eq!(lines.parse::<u64>().unwrap() + kept_lines, 1000);
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        let mut out = CappedOutput::new(7);
        for _ in 0..100 {
            out.push("é漢🦀");
        }
        let text = out.finish(note);
        assert!(text.contains('['));
        assert!(text.len() < 7 + 20, "{text}");
    }

    #[test]
    fn live_output_stops_at_the_cap_with_a_note() {
        let (live, mut received) = tokio::sync::mpsc::unbounded_channel();
        let mut out = CellOutput::new(1000, Some(live));
        for _ in 0..80 {
            out.push("0123456789\n");
        }
        // Display items still go live after the text stopped.
        out.display(DisplayItem::new([(
            "text/html".to_owned(),
            cave_core::DisplayData::Text("<b>x</b>".into()),
        )]));
        let mut shown = String::new();
        let mut items = 0;
        while let Ok(piece) = received.try_recv() {
            match piece {
                LiveOutput::Text(text) => shown.push_str(&text),
                LiveOutput::Display(_) => items += 1,
            }
        }
        assert_eq!(items, 1);
        assert!(shown.len() <= 1000, "{} bytes live", shown.len());
        assert!(shown.ends_with(&prompt::live_output_stopped(1000)));
        assert!(shown.len() < 880, "live stopped before the end");
        assert_eq!(out.finish().0.len(), 880, "all of it held: within the cap");
    }

    #[test]
    fn tiny_pieces_are_charged_what_they_take() {
        let (live, mut received) = tokio::sync::mpsc::unbounded_channel();
        let mut out = CellOutput::new(100_000, Some(live));
        for _ in 0..100_000 {
            out.push("x");
        }
        let mut pieces = 0;
        while let Ok(LiveOutput::Text(_)) = received.try_recv() {
            pieces += 1;
        }
        // Each piece is charged its text and LIVE_PIECE_COST; then the note.
        assert_eq!(
            pieces,
            (100_000 - LIVE_NOTE_ROOM) / (1 + LIVE_PIECE_COST) + 1
        );
        assert_eq!(out.finish().0.len(), 100_000, "all of it held");
    }

    #[test]
    fn display_items_are_bounded_per_cell_and_the_rest_counted() {
        let item = |n: usize| {
            DisplayItem::new([(
                "image/png".to_owned(),
                cave_core::DisplayData::Bytes(vec![0; n]),
            )])
        };
        let sent = |received: &mut tokio::sync::mpsc::UnboundedReceiver<LiveOutput>| {
            let mut sent = 0;
            while let Ok(LiveOutput::Display(_)) = received.try_recv() {
                sent += 1;
            }
            sent
        };
        // By count.
        let (live, mut received) = tokio::sync::mpsc::unbounded_channel();
        let mut out = CellOutput::new(1 << 20, Some(live));
        for _ in 0..cave_core::MAX_DISPLAY_ITEMS + 44 {
            out.display(item(0));
        }
        assert_eq!(sent(&mut received), cave_core::MAX_DISPLAY_ITEMS);
        let (text, _) = out.finish();
        assert!(text.contains("44 more display items not shown"), "{text}");
        // By size: 8 × the cap in bytes, so seven items of a thousand bytes.
        let (live, mut received) = tokio::sync::mpsc::unbounded_channel();
        let mut out = CellOutput::new(1000, Some(live));
        for _ in 0..10 {
            out.display(item(1000));
        }
        assert_eq!(sent(&mut received), 7);
        assert!(out.finish().0.contains("3 more display items not shown"));
    }
}

//! Python highlighting for the terminal, with tree-sitter-highlight and the grammar's own
//! highlight query: the whole block is parsed at once, so a multi-line string stays a string.

use anstyle::{AnsiColor, Style};
use std::sync::OnceLock;
use tree_sitter_highlight::{HighlightConfiguration, HighlightEvent, Highlighter};

/// Code larger than this is shown without colours.
const MAX_HIGHLIGHTED_BYTES: usize = 16 * 1024;

/// The capture names we color, and how.
const NAMES: &[(&str, Style)] = &[
    ("keyword", AnsiColor::Magenta.on_default()),
    ("string", AnsiColor::Green.on_default()),
    ("escape", AnsiColor::Cyan.on_default()),
    ("number", AnsiColor::Yellow.on_default()),
    ("constant.builtin", AnsiColor::Yellow.on_default()),
    ("comment", Style::new().dimmed()),
    ("function", AnsiColor::Blue.on_default()),
    ("function.builtin", AnsiColor::Cyan.on_default()),
    ("type", AnsiColor::Cyan.on_default()),
    ("operator", Style::new()),
];

fn configuration() -> Option<&'static HighlightConfiguration> {
    static CONFIG: OnceLock<Option<HighlightConfiguration>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut config = HighlightConfiguration::new(
                tree_sitter_python::LANGUAGE.into(),
                "python",
                tree_sitter_python::HIGHLIGHTS_QUERY,
                "",
                "",
            )
            .ok()?;
            let names: Vec<&str> = NAMES.iter().map(|(n, _)| *n).collect();
            config.configure(&names);
            Some(config)
        })
        .as_ref()
}

/// `code` cut into pieces, each with the capture name it is coloured as (`None`: plain), in
/// order; `None` when it is too large to highlight or highlighting fails.
pub(crate) fn python_spans(code: &str) -> Option<Vec<(Option<&'static str>, &str)>> {
    // Highlighting cost grows faster than the code: a cell larger than any a person reads is
    // shown plain, so model output cannot stall the terminal or the viewer.
    if code.len() > MAX_HIGHLIGHTED_BYTES {
        return None;
    }
    let config = configuration()?;
    let mut highlighter = Highlighter::new();
    let events = highlighter
        .highlight(config, code.as_bytes(), None, None, |_| None)
        .ok()?;
    let mut spans = Vec::new();
    let mut stack: Vec<Option<&'static str>> = Vec::new();
    for event in events {
        match event.ok()? {
            HighlightEvent::HighlightStart(h) => stack.push(NAMES.get(h.0).map(|(n, _)| *n)),
            HighlightEvent::HighlightEnd => {
                stack.pop();
            }
            HighlightEvent::Source { start, end } => {
                let name = stack.last().copied().flatten();
                spans.push((name, code.get(start..end).unwrap_or("")));
            }
        }
    }
    Some(spans)
}

/// `code` with ANSI colors, line by line (each line's styles are closed at its end, so lines
/// can be indented or shortened independently). Plain text if highlighting fails.
pub(crate) fn python_lines(code: &str) -> Vec<String> {
    let Some(spans) = python_spans(code) else {
        return code.lines().map(str::to_owned).collect();
    };
    let mut lines = vec![String::new()];
    for (name, text) in spans {
        let style = NAMES
            .iter()
            .find(|(n, _)| Some(*n) == name)
            .map_or(Style::new(), |(_, s)| *s);
        for (i, piece) in text.split('\n').enumerate() {
            if i > 0 {
                lines.push(String::new());
            }
            if piece.is_empty() {
                continue;
            }
            let line = lines.last_mut().expect("never empty");
            if style == Style::new() {
                line.push_str(piece);
            } else {
                line.push_str(&format!("{style}{piece}{style:#}"));
            }
        }
    }
    if code.ends_with('\n') {
        lines.pop();
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::python_lines;

    #[test]
    fn deep_and_huge_code_highlights_quickly() {
        let started = std::time::Instant::now();
        let deep = format!("x = {}0{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(python_lines(&deep).len(), 1);
        let huge = format!("print({})", vec!["'a'"; 300_000].join("+"));
        assert_eq!(python_lines(&huge).len(), 1);
        // Just under the limit, as deep as it can be.
        let limit = super::MAX_HIGHLIGHTED_BYTES / 2 - 4;
        let deep = format!("x = {}0{}", "[".repeat(limit), "]".repeat(limit));
        assert_eq!(python_lines(&deep).len(), 1);
        let terms = vec!["'a'"; super::MAX_HIGHLIGHTED_BYTES / 4 - 4].join("+");
        assert_eq!(python_lines(&format!("({terms})")).len(), 1);
        // A generous bound on a debug build: only a blow-up takes this long.
        assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
    }

    #[test]
    fn a_multi_line_string_is_one_string() {
        let lines = python_lines("s = \"\"\"\n# not a comment\n\"\"\"\n# a comment");
        assert!(lines[1].contains("\u{1b}[32m"), "{:?}", lines[1]);
        assert!(lines[3].contains("\u{1b}[2m"), "{:?}", lines[3]);
    }
}

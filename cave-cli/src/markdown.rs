//! Markdown for the terminal, with pulldown-cmark: headings, emphasis, code spans, links,
//! nested lists, block quotes, rules, aligned tables, and code blocks (Python highlighted).

use crate::highlight;
use anstyle::{AnsiColor, Style};
use pulldown_cmark::{Alignment, CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};
use unicode_width::UnicodeWidthStr;

const BOLD: Style = Style::new().bold();
const ITALIC: Style = Style::new().italic();
const DIM: Style = Style::new().dimmed();
const CODE: Style = AnsiColor::Cyan.on_default();
const STRIKE: Style = Style::new().strikethrough();
/// Levels of quotes and lists shown as indentation; deeper ones are shown at this depth (model
/// output can nest thousands deep, and indentation per level would grow quadratically).
const MAX_SHOWN_DEPTH: usize = 8;

/// Lines of `markdown` as a terminal shows them (ANSI styles when `color`).
pub(crate) fn render(markdown: &str, color: bool) -> Vec<String> {
    let mut r = Renderer {
        color,
        ..Renderer::default()
    };
    let options = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH;
    for event in Parser::new_ext(markdown, options) {
        r.event(event);
    }
    r.end_line();
    r.lines
}

#[derive(Default)]
struct Renderer {
    color: bool,
    lines: Vec<String>,
    /// The line being written: styled text, and its display width.
    line: String,
    /// Inline styles in force (bold, italic, code, link...).
    styles: Vec<Style>,
    /// What starts each line here: quote bars and list indentation.
    prefixes: Vec<String>,
    /// The marker of the list item just opened, written before its first text.
    marker: Option<String>,
    /// Open lists: the next number of an ordered one, `None` for bullets.
    lists: Vec<Option<u64>>,
    /// Link targets, shown after the link text.
    links: Vec<String>,
    code: Option<(String, String)>,
    table: Option<Table>,
    /// Top-level blocks written: a blank line goes between them.
    blocks: usize,
}

#[derive(Default)]
struct Table {
    alignments: Vec<Alignment>,
    rows: Vec<Vec<(String, usize)>>,
    cell: Option<(String, usize)>,
}

impl Renderer {
    fn paint(&self, style: Style, text: &str) -> String {
        if self.color && style != Style::new() && !text.is_empty() {
            format!("{style}{text}{style:#}")
        } else {
            text.to_owned()
        }
    }

    /// What starts each line: the quote bars, at most `MAX_SHOWN_DEPTH` of them.
    fn prefix(&self) -> String {
        self.prefixes[..self.prefixes.len().min(MAX_SHOWN_DEPTH)].concat()
    }

    /// The combined inline style.
    fn style(&self) -> Style {
        self.styles.iter().fold(Style::new(), |acc, s| {
            let mut style = acc;
            if let Some(fg) = s.get_fg_color() {
                style = style.fg_color(Some(fg));
            }
            style.effects(style.get_effects() | s.get_effects())
        })
    }

    fn text(&mut self, text: &str) {
        let styled = self.paint(self.style(), text);
        let width = text.width();
        if let Some(table) = &mut self.table {
            let cell = table.cell.get_or_insert_with(Default::default);
            cell.0.push_str(&styled);
            cell.1 += width;
            return;
        }
        if self.line.is_empty() {
            let mut start = self.prefix();
            if let Some(marker) = self.marker.take() {
                start.push_str(&marker);
            }
            self.line = start;
        }
        self.line.push_str(&styled);
    }

    fn end_line(&mut self) {
        if !self.line.is_empty() {
            self.lines.push(std::mem::take(&mut self.line));
        }
    }

    /// A block starts at the top level: a blank line after the one before.
    fn start_block(&mut self) {
        self.end_line();
        if self.prefixes.is_empty() && self.lists.is_empty() {
            if self.blocks > 0 {
                self.lines.push(String::new());
            }
            self.blocks += 1;
        }
    }

    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Start(tag) => self.start(tag),
            Event::End(tag) => self.end(tag),
            Event::Text(text) => match &mut self.code {
                Some((_, code)) => code.push_str(&text),
                None => self.text(&text),
            },
            Event::Code(code) => {
                self.styles.push(CODE);
                self.text(&code);
                self.styles.pop();
            }
            Event::SoftBreak => self.text(" "),
            Event::HardBreak => self.end_line(),
            Event::Rule => {
                self.start_block();
                let rule = self.paint(DIM, &"─".repeat(40));
                self.lines.push(format!("{}{rule}", self.prefix()));
            }
            Event::Html(html) | Event::InlineHtml(html) => self.text(&html),
            Event::TaskListMarker(done) => self.text(if done { "[x] " } else { "[ ] " }),
            Event::FootnoteReference(name) => self.text(&format!("[{name}]")),
            _ => {}
        }
    }

    fn start(&mut self, tag: Tag<'_>) {
        match tag {
            // A list item's first paragraph goes on its marker's line.
            Tag::Paragraph if self.marker.is_none() => self.start_block(),
            Tag::Heading { level, .. } => {
                self.start_block();
                self.styles.push(if level == HeadingLevel::H1 {
                    BOLD.underline()
                } else {
                    BOLD
                });
            }
            Tag::BlockQuote(_) => {
                self.start_block();
                let bar = self.paint(DIM, "│ ");
                self.prefixes.push(bar);
            }
            Tag::CodeBlock(kind) => {
                self.start_block();
                let language = match kind {
                    CodeBlockKind::Fenced(info) => info
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .to_ascii_lowercase(),
                    CodeBlockKind::Indented => String::new(),
                };
                self.code = Some((language, String::new()));
            }
            Tag::List(start) => {
                if self.lists.is_empty() {
                    self.start_block();
                } else {
                    self.end_line();
                }
                self.lists.push(start);
            }
            Tag::Item => {
                self.end_line();
                let marker = match self.lists.last_mut() {
                    Some(Some(n)) => {
                        *n += 1;
                        format!("{}. ", *n - 1)
                    }
                    _ => "• ".to_owned(),
                };
                // Nested items are indented under their parent's text.
                let depth = self.lists.len().saturating_sub(1).min(MAX_SHOWN_DEPTH);
                self.marker = Some(format!("{}{marker}", "  ".repeat(depth)));
            }
            Tag::Emphasis => self.styles.push(ITALIC),
            Tag::Strong => self.styles.push(BOLD),
            Tag::Strikethrough => self.styles.push(STRIKE),
            Tag::Link { dest_url, .. } => {
                self.styles.push(CODE);
                self.links.push(dest_url.into_string());
            }
            Tag::Image { dest_url, .. } => {
                self.links.push(dest_url.into_string());
            }
            Tag::Table(alignments) => {
                self.start_block();
                self.table = Some(Table {
                    alignments,
                    ..Table::default()
                });
            }
            Tag::TableHead | Tag::TableRow => {
                if let Some(table) = &mut self.table {
                    table.rows.push(Vec::new());
                }
            }
            Tag::TableCell => {
                if let Some(table) = &mut self.table {
                    table.cell = Some((String::new(), 0));
                }
            }
            _ => {}
        }
    }

    fn end(&mut self, tag: TagEnd) {
        match tag {
            TagEnd::Paragraph => self.end_line(),
            TagEnd::Heading(_) => {
                self.styles.pop();
                self.end_line();
            }
            TagEnd::BlockQuote(_) => {
                self.end_line();
                self.prefixes.pop();
            }
            TagEnd::CodeBlock => {
                if let Some((language, code)) = self.code.take() {
                    let lines =
                        if self.color && matches!(language.as_str(), "python" | "py" | "python3") {
                            highlight::python_lines(&code)
                        } else {
                            code.lines().map(|l| self.paint(CODE, l)).collect()
                        };
                    let prefix = self.prefix();
                    self.lines
                        .extend(lines.into_iter().map(|l| format!("{prefix}    {l}")));
                }
            }
            TagEnd::List(_) => {
                self.end_line();
                self.lists.pop();
            }
            TagEnd::Item => {
                // An item with no text still shows its marker.
                if let Some(marker) = self.marker.take() {
                    self.lines.push(format!("{}{marker}", self.prefix()));
                }
                self.end_line();
            }
            TagEnd::Emphasis | TagEnd::Strong | TagEnd::Strikethrough => {
                self.styles.pop();
            }
            TagEnd::Link => {
                self.styles.pop();
                if let Some(url) = self.links.pop() {
                    let shown = self.paint(DIM, &format!(" ({url})"));
                    self.push_raw(&shown, url.width() + 3);
                }
            }
            TagEnd::Image => {
                if let Some(url) = self.links.pop() {
                    self.text(&format!(" ({url})"));
                }
            }
            TagEnd::TableCell => {
                if let Some(table) = &mut self.table
                    && let Some(cell) = table.cell.take()
                    && let Some(row) = table.rows.last_mut()
                {
                    row.push(cell);
                }
            }
            TagEnd::Table => {
                if let Some(table) = self.table.take() {
                    let prefix = self.prefix();
                    for line in table_lines(&table, |s| self.paint(DIM, s)) {
                        self.lines.push(format!("{prefix}{line}"));
                    }
                }
            }
            _ => {}
        }
    }

    /// Appends already styled text of a known width.
    fn push_raw(&mut self, styled: &str, width: usize) {
        if let Some(table) = &mut self.table {
            let cell = table.cell.get_or_insert_with(Default::default);
            cell.0.push_str(styled);
            cell.1 += width;
        } else {
            self.line.push_str(styled);
        }
    }
}

/// A table's lines: columns padded to their widest cell and aligned as declared, the header
/// underlined.
fn table_lines(table: &Table, dim: impl Fn(&str) -> String) -> Vec<String> {
    let columns = table.rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; columns];
    for row in &table.rows {
        for (i, (_, width)) in row.iter().enumerate() {
            widths[i] = widths[i].max(*width);
        }
    }
    let separator = dim(" │ ");
    let mut out = Vec::new();
    for (r, row) in table.rows.iter().enumerate() {
        let cells: Vec<String> = (0..columns)
            .map(|i| {
                let (text, width) = row.get(i).cloned().unwrap_or_default();
                let pad = widths[i].saturating_sub(width);
                match table.alignments.get(i) {
                    Some(Alignment::Right) => format!("{}{text}", " ".repeat(pad)),
                    Some(Alignment::Center) => {
                        format!("{}{text}{}", " ".repeat(pad / 2), " ".repeat(pad - pad / 2))
                    }
                    _ => format!("{text}{}", " ".repeat(pad)),
                }
            })
            .collect();
        out.push(cells.join(&separator).trim_end().to_owned());
        if r == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "─".repeat(*w)).collect();
            out.push(dim(&rule.join("─┼─")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::render;

    #[test]
    fn nesting_as_deep_as_a_model_writes_stays_linear() {
        let quotes = format!("{}deep", "> ".repeat(50_000));
        let lines = render(&quotes, false);
        assert!(
            lines.iter().map(String::len).sum::<usize>() < 1_000,
            "{}",
            lines.len()
        );
        let list: String = (0..3_000)
            .map(|i| format!("{}- item\n", "  ".repeat(i)))
            .collect();
        let lines = render(&list, false);
        assert!(lines.iter().map(String::len).sum::<usize>() < 3_000 * 40);
        let emphasis = format!("{}x{}", "*_".repeat(20_000), "_*".repeat(20_000));
        assert!(!render(&emphasis, true).is_empty());
    }

    #[test]
    fn tables_align_and_lists_nest() {
        let lines = render(
            "| a | bb |\n|--:|:-:|\n| 100 | x |\n\n1. one\n   - inner\n2. two\n",
            false,
        );
        assert_eq!(
            lines,
            [
                "  a │ bb",
                "────┼───",
                "100 │ x",
                "",
                "1. one",
                "  • inner",
                "2. two"
            ]
        );
    }
}

//! Shaping execution output for the model: large output is stored in the runtime and the
//! model gets a marker pointing at it, with a preview.

use crate::Message;
use unicode_segmentation::UnicodeSegmentation;

const OPEN: &str = "<persisted-output>";
const CLOSE: &str = "</persisted-output>";
const DECLARATION_HEAD: &str = "<persisted-output>\nOutput too large to inline (";
const DECLARATION_VAR: &str = " chars). The full text is in the runtime variable `";
const PREVIEW_HEAD: &str = "\n\nPreview (first ";

/// The marker the model gets instead of an output of `chars` characters stored in `variable`.
///
/// The declaration (up to the preview) has a fixed shape: the agent finds the highest
/// variable index in a resumed history from it, and compaction shrinks a marker to it.
pub fn persisted_marker(
    output: &str,
    chars: usize,
    variable: &str,
    preview_chars: usize,
) -> String {
    let mut marker = format!(
        "{DECLARATION_HEAD}{chars}{DECLARATION_VAR}{variable}` (a str). Read it there instead of running \
the code again: slice it (`{variable}[:2000]`), search it \
(`[line for line in {variable}.splitlines() if 'error' in line]`) or parse it."
    );
    if preview_chars > 0 {
        let (head, cut) = preview(output, preview_chars);
        marker.push_str(PREVIEW_HEAD);
        marker.push_str(&format!("{preview_chars} chars):\n{head}"));
        if cut {
            marker.push_str("\n...");
        }
    }
    marker.push('\n');
    marker.push_str(CLOSE);
    marker
}

/// The first `max` characters of `content` for a preview, and whether it was cut.
///
/// The cut falls on a line break in the second half of the preview if there is one, else at
/// `max`; never inside a grapheme cluster (an emoji or a letter with its accents stays whole).
pub fn preview(content: &str, max: usize) -> (&str, bool) {
    let Some((limit, _)) = content.char_indices().nth(max) else {
        return (content, false);
    };
    let head = &content[..limit];
    if let Some(nl) = head.rfind('\n')
        && head[..nl].chars().count() > max / 2
    {
        return (&head[..nl], true);
    }
    // Back off to the last grapheme boundary at or before the limit.
    let boundary = content
        .grapheme_indices(true)
        .map(|(i, _)| i)
        .take_while(|&i| i <= limit)
        .last()
        .unwrap_or(0);
    (&content[..boundary], true)
}

/// The highest `n` of a `{prefix}_{n}` variable declared by a persisted-output marker in the
/// history (0 if none). User text that merely mentions such a name does not count.
pub fn highest_persisted_index(history: &[Message], prefix: &str) -> u64 {
    let needle = format!("{DECLARATION_VAR}{prefix}_");
    let mut highest = 0;
    for message in history {
        let text = message.content();
        let mut from = 0;
        while let Some(at) = text[from..].find(DECLARATION_HEAD) {
            let start = from + at + DECLARATION_HEAD.len();
            from = start;
            let rest = &text[start..];
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let Some(after) = rest[digits..].strip_prefix(needle.as_str()) else {
                continue;
            };
            let index_len = after.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 || index_len == 0 || !after[index_len..].starts_with("` (a str).") {
                continue;
            }
            // An index past u64 (or i64, as the Python peer allows) is ignored, not an error.
            if let Ok(n) = after[..index_len].parse::<u64>()
                && n <= i64::MAX as u64
            {
                highest = highest.max(n);
            }
        }
    }
    highest
}

/// Shrinks a marker in `content` to its declaration (drops the preview), keeping the text
/// around it. `None` if there is no marker; `content` unchanged if it has no preview.
/// Idempotent.
pub fn strip_persisted_preview(content: &str) -> Option<String> {
    let open = content.find(OPEN)?;
    // The preview may itself contain the closing tag: the block ends at the last one.
    let close = content.rfind(CLOSE)?;
    if close < open {
        return None;
    }
    let block = &content[open..close];
    let Some(preview_at) = block.find(PREVIEW_HEAD) else {
        return Some(content.to_owned());
    };
    let mut out = String::with_capacity(content.len());
    out.push_str(&content[..open]);
    out.push_str(&block[..preview_at]);
    out.push('\n');
    out.push_str(&content[close..]);
    Some(out)
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn preview_cuts_at_a_late_newline_else_hard() {
        assert_eq!(preview("abc", 5), ("abc", false));
        assert_eq!(preview("abcdef\ngh", 8), ("abcdef", true));
        assert_eq!(preview("ab\ncdefgh", 8), ("ab\ncdefg", true));
    }

    #[test]
    fn preview_keeps_graphemes_whole() {
        // "e" + combining acute: cutting between them would orphan the accent.
        let (head, cut) = preview("abe\u{301}x", 3);
        assert_eq!((head, cut), ("ab", true));
        let (head, _) = preview("👍🏽👍🏽", 1);
        assert_eq!(head, "");
    }

    #[test]
    fn marker_round_trip() {
        let out = "x".repeat(50) + "\n" + &"y".repeat(50);
        let marker = persisted_marker(&out, 101, "_output_7", 60);
        assert!(
            marker.starts_with("<persisted-output>\n") && marker.ends_with("\n</persisted-output>")
        );
        assert!(marker.contains(&"x".repeat(50)) && marker.contains("\n..."));
        let history = [Message::execution_result(format!("wrap {marker} end"))];
        assert_eq!(highest_persisted_index(&history, "_output"), 7);
        assert_eq!(highest_persisted_index(&history, "_out"), 0);
        let stripped = strip_persisted_preview(history[0].content()).unwrap();
        assert!(!stripped.contains("Preview") && stripped.starts_with("wrap <persisted-output>"));
        assert!(stripped.ends_with("\n</persisted-output> end"));
        assert_eq!(strip_persisted_preview(&stripped).unwrap(), stripped);
        assert_eq!(strip_persisted_preview("plain"), None);
    }

    #[test]
    fn mentions_and_huge_indices_do_not_count() {
        let history = [
            Message::user("please inspect `_output_99`"),
            Message::execution_result(persisted_marker(
                "a",
                9,
                "_output_99999999999999999999999",
                0,
            )),
            Message::execution_result(persisted_marker("a", 9, "输出_3", 0)),
        ];
        assert_eq!(highest_persisted_index(&history, "_output"), 0);
        assert_eq!(highest_persisted_index(&history, "输出"), 3);
    }
}

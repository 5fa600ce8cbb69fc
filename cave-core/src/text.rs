//! Text shortened for a person or a model: the one grapheme-safe cut, a preview, a line.
//! A leaf module: every other module may use it.

use unicode_segmentation::UnicodeSegmentation;

/// The first `max` characters of `content` for a preview, and whether it was cut.
///
/// The cut falls on a line break in the second half of the preview if there is one, else as
/// [`shorten`] cuts.
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
    (&content[..grapheme_floor(content, limit)], true)
}

/// At most the first `max` characters of `text`, and whether anything was cut: the one way
/// text is shortened for a message, a log line or an error. Never inside a grapheme cluster
/// (an emoji sequence, a letter with its accents stays whole: the cut backs off before it);
/// the work is bounded by `max`, however long `text` is.
pub fn shorten(text: &str, max: usize) -> (&str, bool) {
    match text.char_indices().nth(max) {
        Some((limit, _)) => (&text[..grapheme_floor(text, limit)], true),
        None => (text, false),
    }
}

/// The last grapheme boundary of `text` at or before the byte `limit` (reading no further).
fn grapheme_floor(text: &str, limit: usize) -> usize {
    text.grapheme_indices(true)
        .map(|(i, _)| i)
        .take_while(|&i| i <= limit)
        .last()
        .unwrap_or(0)
}

/// `text` on one line, for a name or a reason shown inline: runs of white space and control
/// characters as one space, at most `max` characters (cut as [`preview`] cuts, then `…`). The
/// work is bounded by `max`, however long `text` is.
pub fn one_line(text: &str, max: usize) -> String {
    // Past this many bytes there are more than `max` characters: the rest is never shown.
    let enough = max.saturating_mul(4).saturating_add(4);
    let mut flat = String::with_capacity(text.len().min(enough));
    for word in text
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
    {
        if !flat.is_empty() {
            flat.push(' ');
        }
        flat.push_str(word);
        if flat.len() > enough {
            break;
        }
    }
    match preview(&flat, max) {
        (head, true) => format!("{head}…"),
        (_, false) => flat,
    }
}

#[cfg(test)]
mod tests {
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
    fn one_line_folds_white_space_and_control_characters_and_cuts_whole_graphemes() {
        assert_eq!(one_line("  a\n\tb\u{1b}[31mc  ", 80), "a b [31mc");
        assert_eq!(one_line("abcdef", 3), "abc…");
        assert_eq!(one_line("abe\u{301}x", 3), "ab…");
        assert_eq!(one_line("", 3), "");
        // Bounded by `max`, not by the input.
        let huge = "word ".repeat(1 << 20);
        assert_eq!(one_line(&huge, 9), "word word…");
    }

    #[test]
    fn shortening_keeps_graphemes_whole() {
        assert_eq!(shorten("hello", 5), ("hello", false));
        assert_eq!(shorten("hello", 3), ("hel", true));
        assert_eq!(shorten("", 0), ("", false));
        // A family emoji is one grapheme of five characters: cut inside it, it goes whole.
        let family = "ab👨\u{200d}👩\u{200d}👧cd";
        assert_eq!(shorten(family, 4), ("ab", true));
        assert_eq!(shorten(family, 7), (&family[..family.len() - 2], true));
        // A letter and its combining accent stay together.
        assert_eq!(shorten("cafe\u{301}!", 4), ("caf", true));
        assert_eq!(shorten("cafe\u{301}!", 5), ("cafe\u{301}", true));
    }
}

//! Python string literals, decoded exactly as Python decodes them, so that a name spelled with
//! escapes (`'\x65val'`, `'\N{LATIN SMALL LETTER E}val'`, `'\145val'`) is compared as the name
//! it is.

/// How a literal's prefix asks for its body to be read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Prefix {
    /// `r`: backslashes are plain characters.
    pub raw: bool,
    /// `b`: a bytes literal (decoded here as Latin-1, byte for character).
    pub bytes: bool,
    /// `f`: doubled braces stand for one brace.
    pub format: bool,
}

impl Prefix {
    /// The prefix letters before the opening quote (`rb`, `F`, `u`...).
    pub(crate) fn parse(letters: &str) -> Self {
        let has = |c: char| letters.chars().any(|l| l.eq_ignore_ascii_case(&c));
        Self {
            raw: has('r'),
            bytes: has('b'),
            format: has('f'),
        }
    }
}

/// The value of a literal's body (the text between its quotes), or `None` where Python would
/// refuse the literal (a malformed `\x`, `\u`, `\U` or `\N{...}` escape).
pub(crate) fn decode(body: &str, prefix: Prefix) -> Option<String> {
    let mut out = String::with_capacity(body.len());
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' | '}' if prefix.format => {
                // `{{` is one brace; a single one would have started a field (not a literal).
                if chars.peek() == Some(&c) {
                    chars.next();
                }
                out.push(c);
            }
            '\\' if !prefix.raw => decode_escape(&mut chars, prefix.bytes, &mut out)?,
            '\\' => {
                // Raw: the backslash stays, and the quote or backslash after it too.
                out.push('\\');
                if let Some(next) = chars.next() {
                    out.push(next);
                }
            }
            _ => out.push(c),
        }
    }
    Some(out)
}

fn decode_escape(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    bytes: bool,
    out: &mut String,
) -> Option<()> {
    let Some(c) = chars.next() else {
        // A lone backslash at the end cannot come from a parsed literal; keep it.
        out.push('\\');
        return Some(());
    };
    let simple = match c {
        '\n' => Some(None),
        '\r' => {
            if chars.peek() == Some(&'\n') {
                chars.next();
            }
            Some(None)
        }
        '\\' => Some(Some('\\')),
        '\'' => Some(Some('\'')),
        '"' => Some(Some('"')),
        'a' => Some(Some('\x07')),
        'b' => Some(Some('\x08')),
        'f' => Some(Some('\x0c')),
        'n' => Some(Some('\n')),
        'r' => Some(Some('\r')),
        't' => Some(Some('\t')),
        'v' => Some(Some('\x0b')),
        _ => None,
    };
    if let Some(decoded) = simple {
        out.extend(decoded);
        return Some(());
    }
    match c {
        '0'..='7' => {
            let mut value = c.to_digit(8)?;
            for _ in 0..2 {
                match chars.peek().and_then(|d| d.to_digit(8)) {
                    Some(d) => {
                        value = value * 8 + d;
                        chars.next();
                    }
                    None => break,
                }
            }
            if bytes {
                value &= 0xff;
            }
            out.push(char_or_replacement(value));
        }
        'x' => {
            let value = hex_digits(chars, 2)?;
            out.push(char_or_replacement(value));
        }
        'u' | 'U' if !bytes => {
            let value = hex_digits(chars, if c == 'u' { 4 } else { 8 })?;
            if value > 0x10ffff {
                return None;
            }
            out.push(char_or_replacement(value));
        }
        'N' if !bytes => {
            if chars.next() != Some('{') {
                return None;
            }
            let mut name = String::new();
            loop {
                match chars.next()? {
                    '}' => break,
                    ch => name.push(ch),
                }
            }
            out.push(named_character(&name)?);
        }
        other => {
            // Not an escape: Python keeps both characters.
            out.push('\\');
            out.push(other);
        }
    }
    Some(())
}

fn hex_digits(chars: &mut std::iter::Peekable<std::str::Chars<'_>>, count: usize) -> Option<u32> {
    let mut value = 0u32;
    for _ in 0..count {
        value = value * 16 + chars.next()?.to_digit(16)?;
    }
    Some(value)
}

/// A code point as a `char`; a lone surrogate (which Python allows in a `str` and Rust does not)
/// becomes U+FFFD, which no name contains.
fn char_or_replacement(value: u32) -> char {
    char::from_u32(value).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// `\N{...}`: Python matches names case-insensitively and knows the standard's aliases.
fn named_character(name: &str) -> Option<char> {
    let upper = name.to_ascii_uppercase();
    unicode_names2::character(&upper)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(body: &str) -> Option<String> {
        decode(body, Prefix::default())
    }

    #[test]
    fn escapes_decode_as_python_decodes_them() {
        assert_eq!(plain(r"\x65val").as_deref(), Some("eval"));
        assert_eq!(plain(r"\145val").as_deref(), Some("eval"));
        assert_eq!(plain(r"\u0065val").as_deref(), Some("eval"));
        assert_eq!(plain(r"\U00000065val").as_deref(), Some("eval"));
        assert_eq!(
            plain(r"\N{LATIN SMALL LETTER E}val").as_deref(),
            Some("eval")
        );
        assert_eq!(
            plain(r"\N{latin small letter e}val").as_deref(),
            Some("eval")
        );
        assert_eq!(plain("ev\\\nal").as_deref(), Some("eval"));
        assert_eq!(plain(r"\q\'").as_deref(), Some("\\q'"));
        assert_eq!(plain(r"\x6").as_deref(), None);
        assert_eq!(plain(r"\N{NO SUCH CHARACTER NAME}").as_deref(), None);
        let raw = Prefix::parse("r");
        assert_eq!(decode(r"\x65val", raw).as_deref(), Some(r"\x65val"));
        let bytes = Prefix::parse("b");
        assert_eq!(
            decode(r"\x65v\u0061l", bytes).as_deref(),
            Some(r"ev\u0061l")
        );
        let format = Prefix::parse("f");
        assert_eq!(decode("{{x}}", format).as_deref(), Some("{x}"));
    }
}

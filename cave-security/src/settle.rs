//! Words the policy settles from the tokens around them, without a syntax tree: a door that
//! reaches a name by string, called as `getattr(frame, 'total')` or `getattr(frame, prefix + i)`.
//!
//! The tree shows such a call as a call of the door with its arguments, and nothing else that
//! holds the word: what the walk checks of it is the door's own name (a call, or an attribute
//! when called as `x.getattr(...)`) and the name its second argument reaches, when that argument
//! is a string or a sum of strings (`literal`). An argument that begins with a name is neither,
//! whatever follows it (a string's prefix touches its quote: `rb'x'` is a string): it is
//! computed, as is a string followed by anything that makes it part of a larger expression
//! but `+` and another string. A form the scan does not take whole (anything between the tokens
//! but spaces and tabs, a first argument that is not a name with attributes, items and calls on
//! one line, a string with a prefix and no field, an escape or a line break, a string followed
//! by a string or `+` and a string) is not settled here, and its statement is parsed as before.
//! The tests hold the result to the whole cell's walk.

use crate::statements;

/// Doors whose second argument is the name they reach (`literal_arg(1)` in the walk).
const SECOND_ARGUMENT_DOORS: &[&str] =
    &["getattr", "hasattr", "delattr", "setattr", "getattr_static"];

/// What a door call's second argument is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reached<'c> {
    /// A plain string literal's text (ASCII, no escape: the text is its value).
    Literal(&'c str),
    /// An expression that begins with a name: no string, computed at run time.
    Computed,
}

/// A door called as `door(a.b, ARG`, where ARG is a plain one-line string that the argument
/// ends after, or plainly no string (`c`, `f.g(h)`, `'x' + c`, `'x'.join(c)`, `f'x{c}'`), read
/// from the word at `at`: the door's name and what its second argument reaches. `None` for any
/// other form.
pub(crate) fn door_call(code: &str, at: usize) -> Option<(&str, Reached<'_>)> {
    let bytes = code.as_bytes();
    let door_end = identifier_end(bytes, at)?;
    let door = &code[at..door_end];
    if !SECOND_ARGUMENT_DOORS.contains(&door) {
        return None;
    }
    let mut i = expect(bytes, blanks(bytes, door_end), b'(')?;
    i = primary_end(bytes, blanks(bytes, i))?;
    i = blanks(bytes, expect(bytes, blanks(bytes, i), b',')?);
    let reached = match bytes.get(i)? {
        b'\'' | b'"' => {
            let (text, end) = plain_string(code, i)?;
            let next = blanks(bytes, end);
            match bytes.get(next)? {
                // The string is the whole argument.
                b')' | b',' => Reached::Literal(text),
                // `'total_' + name`: a name in the sum.
                b'+' => {
                    name_end(bytes, blanks(bytes, next + 1))?;
                    Reached::Computed
                }
                // An attribute, an item or a call of the string, or an operator but `+`.
                b'.' | b'[' | b'(' | b'%' | b'*' | b'/' | b'-' | b'<' | b'>' | b'=' | b'!'
                | b'&' | b'|' | b'^' | b'@' => Reached::Computed,
                // `if`, `or`, `in`: a keyword (another string's prefix touches its quote).
                _ => {
                    name_end(bytes, next)?;
                    Reached::Computed
                }
            }
        }
        _ => {
            let end = identifier_end(bytes, i)?;
            match bytes.get(end) {
                // `f'total_{i}'`: a field makes the string no literal.
                Some(b'\'' | b'"') if formatted(&code[i..end]) && has_field(bytes, end) => {
                    Reached::Computed
                }
                Some(b'\'' | b'"') => return None,
                // Whatever follows the name, it is in the argument.
                _ => Reached::Computed,
            }
        }
    };
    Some((door, reached))
}

/// A plain one-line string whose quote is at `at`, with no prefix or escape: its text (ASCII,
/// so its value) and where it ends.
fn plain_string(code: &str, at: usize) -> Option<(&str, usize)> {
    let bytes = code.as_bytes();
    let quote = bytes[at];
    let body = at + 1;
    // To the first quote of its kind, backslash or line break (never past the line): only the
    // quote ends a plain one-line string.
    let stop = body
        + bytes[body..]
            .iter()
            .position(|&b| b == quote || matches!(b, b'\\' | b'\n' | b'\r'))?;
    let text = &code[body..stop];
    // `'''`: a triple-quoted string.
    if bytes[stop] != quote
        || (stop == body && bytes.get(stop + 1) == Some(&quote))
        || !text.is_ascii()
    {
        return None;
    }
    Some((text, stop + 1))
}

/// Whether a string prefix makes an f-string.
fn formatted(prefix: &str) -> bool {
    ["f", "rf", "fr"]
        .iter()
        .any(|f| prefix.eq_ignore_ascii_case(f))
}

/// Whether the f-string whose opening quote is at `at` has a field (a `{` not doubled) before
/// its first quote, backslash or line break: its text up to there is plain.
fn has_field(bytes: &[u8], at: usize) -> bool {
    let quote = bytes[at];
    let mut i = at + 1;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'{' if bytes.get(i + 1) == Some(&b'{') => i += 2,
            b'{' => return true,
            b'\\' | b'\n' | b'\r' => return false,
            _ if b == quote => return false,
            _ => i += 1,
        }
    }
    false
}

/// The end of the name at `at`, if one starts there that is no string's prefix (a prefix
/// touches its quote).
fn name_end(bytes: &[u8], at: usize) -> Option<usize> {
    let end = identifier_end(bytes, at)?;
    (!matches!(bytes.get(end), Some(b'\'' | b'"'))).then_some(end)
}

/// The end of the identifier that starts at `at`, where Python ends it
/// (`statements::identifier_end`); `None` unless it is all ASCII (Python folds other names).
fn identifier_end(bytes: &[u8], at: usize) -> Option<usize> {
    let first = *bytes.get(at)?;
    if !(first.is_ascii_alphabetic() || first == b'_') {
        return None;
    }
    let end = statements::identifier_end(bytes, at);
    bytes[at..end].is_ascii().then_some(end)
}

/// The longest first argument read, in bytes: a longer one is left to the tree, so that the
/// doors of one line are read in time linear in it however they are nested.
const MAX_FIRST_ARGUMENT: usize = 200;

/// The end of the first argument starting at `at` when it is a primary: a name followed, with
/// nothing between, by attributes (`.name`), items and calls whose brackets hold names, numbers,
/// spaces and `.,:+-*/%` only (no string, comment, brace or line break: nothing that could hide
/// a bracket). `frame`, `self.frames[i]`, `df.loc[0:5, cols]`, `rows(3).first`.
fn primary_end(bytes: &[u8], at: usize) -> Option<usize> {
    let bytes = &bytes[..bytes.len().min(at.saturating_add(MAX_FIRST_ARGUMENT))];
    let mut end = identifier_end(bytes, at)?;
    loop {
        end = match bytes.get(end) {
            Some(b'.') => identifier_end(bytes, end + 1)?,
            Some(b'[' | b'(') => brackets_end(bytes, end)?,
            // Cut by the bound: perhaps not the end.
            None => return None,
            Some(_) => return Some(end),
        };
    }
}

/// Past the brackets opening at `at` and what they hold (see `primary_end`).
fn brackets_end(bytes: &[u8], at: usize) -> Option<usize> {
    // The closing bracket each open one waits for; deeper nesting is left to the tree.
    let mut waiting = [0u8; 16];
    let mut depth = 0;
    for (i, &b) in bytes.iter().enumerate().skip(at) {
        match b {
            b'(' | b'[' => {
                *waiting.get_mut(depth)? = if b == b'(' { b')' } else { b']' };
                depth += 1;
            }
            b')' | b']' => {
                depth = depth.checked_sub(1)?;
                if waiting[depth] != b {
                    return None;
                }
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            b'_' | b' ' | b'\t' | b'.' | b',' | b':' | b'+' | b'-' | b'*' | b'/' | b'%' => {}
            _ if b.is_ascii_alphanumeric() => {}
            _ => return None,
        }
    }
    None
}

/// Past the spaces and tabs at `at` (a line break, a backslash or a comment stops the scan).
fn blanks(bytes: &[u8], at: usize) -> usize {
    at + bytes
        .get(at..)
        .unwrap_or_default()
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t'))
        .count()
}

/// Past `byte` at `at`, if it is there.
fn expect(bytes: &[u8], at: usize, byte: u8) -> Option<usize> {
    (bytes.get(at) == Some(&byte)).then_some(at + 1)
}

#[cfg(test)]
mod tests {
    use super::{Reached, door_call};

    #[test]
    fn the_forms_taken_whole_are_read() {
        fn read(code: &str) -> Option<(&str, Reached<'_>)> {
            door_call(code, 0)
        }
        assert_eq!(
            read("getattr(frame, 'total')"),
            Some(("getattr", Reached::Literal("total")))
        );
        assert_eq!(
            read("hasattr( a.b ,\t\"x\" ).y"),
            Some(("hasattr", Reached::Literal("x")))
        );
        assert_eq!(
            read("getattr(a, '')"),
            Some(("getattr", Reached::Literal("")))
        );
        assert_eq!(
            read("getattr(a, \"it's\")"),
            Some(("getattr", Reached::Literal("it's")))
        );
        for first in [
            "self.frames[i]",
            "df.loc[0:5, cols]",
            "rows(3).first",
            "a[b(c[1], d)][-1]",
            "m(*a, **k)",
        ] {
            let code = format!("getattr({first}, 'b')");
            assert_eq!(
                read(&code),
                Some(("getattr", Reached::Literal("b"))),
                "{code:?}"
            );
        }
        assert_eq!(
            read("getattr(a, 'b', c)"),
            Some(("getattr", Reached::Literal("b")))
        );
        assert_eq!(
            read("getattr(a, 'b' ,)"),
            Some(("getattr", Reached::Literal("b")))
        );
        for computed in [
            "getattr(a, name.attr)",
            "getattr(a, prefix + 'x')",
            "getattr(a, f(x))",
            "getattr(a, lambda: 'b')",
            "getattr(a, c if d else 'b')",
            "getattr(a, name='b')",
            "getattr(a, 'b' + c)",
            "getattr(a, 'b'.upper())",
            "getattr(a, 'b'[0])",
            "getattr(a, 'b' % c)",
            "getattr(a, 'b' if c else 'd')",
            "getattr(a, f'b{c}')",
            "getattr(a, RF\"b{{c}}{d}\")",
        ] {
            assert_eq!(
                read(computed),
                Some(("getattr", Reached::Computed)),
                "{computed:?}"
            );
        }
    }

    #[test]
    fn every_other_form_is_left_to_the_tree() {
        for code in [
            "getattr",
            "getattr(a)",
            "getattr(a, 'b' 'c')",
            "getattr(a, 'b' + 'c')",
            "getattr(a, 'b' + r'c')",
            "getattr(a, 'b' + 1)",
            "getattr(a, 'b' r'c')",
            "getattr(a, 'b'\\\nc)",
            "getattr(a, 'b' # c\n)",
            "getattr(a, rb'b')",
            "getattr(a, f'b')",
            "getattr(a, f'b{{c}}')",
            "getattr(a, f'b\\{c}')",
            "getattr(a, f'''{b}''')",
            "getattr(a, b'{c}')",
            "getattr(a, u\"b\")",
            "getattr(a, ('b'))",
            "getattr(a, ｘ)",
            "getattr(a, xｘ)",
            "getattr(a, '''b''')",
            "getattr(a, r'b')",
            "getattr(a, 'b\\x41')",
            "getattr(a, 'b\ncd')",
            "getattr(a,\n'b')",
            "getattr(a, \\\n'b')",
            "getattr(a, # c\n'b')",
            "getattr\n(a, 'b')",
            "getattr(*a, 'b')",
            "getattr(a['k'], 'b')",
            "getattr(a(k=1), 'b')",
            "getattr(a(b)[c), 'b')",
            "getattr(a(b, 'b')",
            "getattr(a (b), 'b')",
            "getattr(a[{b}], 'b')",
            "getattr(a[b # c
], 'b')",
            "getattr(a(
), 'b')",
            "getattr(a[b] + c, 'd')",
            "getattr(a if b else c, 'd')",
            "getattr(a, 'ｂ')",
            "getattr(aｂ, 'c')",
            "getattr(a, 'b'",
            "getattr(a, 'b",
            "vars(a, 'b')",
            "getattrs(a, 'b')",
        ] {
            assert_eq!(door_call(code, 0), None, "{code:?}");
        }
        // Bounded: nesting and length past what the scan reads are left to the tree.
        let nested =
            |depth: usize| format!("getattr(a{}b{}, 'c')", "[".repeat(depth), "]".repeat(depth));
        assert!(door_call(&nested(16), 0).is_some());
        assert_eq!(door_call(&nested(17), 0), None);
        let long = |n: usize| format!("getattr(a[{}], 'c')", "b".repeat(n));
        assert!(door_call(&long(190), 0).is_some());
        assert_eq!(door_call(&long(200), 0), None);
    }
}

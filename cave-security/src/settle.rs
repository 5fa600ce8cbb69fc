//! Words the policy settles from the tokens around them, without a syntax tree: a door that
//! reaches a name by string, called as `getattr(frame, 'total')`.
//!
//! The tree shows such a call as a call of the door with two arguments, and nothing else that
//! holds the word: what the walk checks of it is the door's own name (a call, or an attribute
//! when called as `x.getattr(...)`) and the name its second argument reaches. A form the
//! scan does not take whole (anything between the tokens but spaces and tabs, a string with a
//! prefix, an escape or a line break, a concatenation, a third argument) is not settled here,
//! and its statement is parsed as before. The tests hold the result to the whole cell's walk.

use crate::statements;

/// Doors whose second argument is the name they reach (`literal_arg(1)` in the walk).
const SECOND_ARGUMENT_DOORS: &[&str] =
    &["getattr", "hasattr", "delattr", "setattr", "getattr_static"];

/// What a door call's second argument is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reached<'c> {
    /// A plain string literal's text (ASCII, no escape: the text is its value).
    Literal(&'c str),
    /// A name or a dotted name: computed at run time.
    Computed,
}

/// A door called as `door(a.b, 'name')` or `door(a.b, c.d)`, read from the word at `at`:
/// the door's name and what its second argument reaches. `None` for any other form.
pub(crate) fn door_call(code: &str, at: usize) -> Option<(&str, Reached<'_>)> {
    let bytes = code.as_bytes();
    let door_end = identifier_end(bytes, at)?;
    let door = &code[at..door_end];
    if !SECOND_ARGUMENT_DOORS.contains(&door) {
        return None;
    }
    let mut i = expect(bytes, blanks(bytes, door_end), b'(')?;
    i = dotted_name_end(bytes, blanks(bytes, i))?;
    i = blanks(bytes, expect(bytes, blanks(bytes, i), b',')?);
    let (reached, end) = match bytes.get(i)? {
        quote @ (b'\'' | b'"') => {
            let body = i + 1;
            // To the first quote of its kind, backslash or line break (never past the line):
            // only the quote ends a plain one-line string.
            let stop = body
                + bytes[body..]
                    .iter()
                    .position(|b| b == quote || matches!(b, b'\\' | b'\n' | b'\r'))?;
            let text = &code[body..stop];
            // `'''`: a triple-quoted string.
            if bytes[stop] != *quote
                || (stop == body && bytes.get(stop + 1) == Some(quote))
                || !text.is_ascii()
            {
                return None;
            }
            (Reached::Literal(text), stop + 1)
        }
        _ => (Reached::Computed, dotted_name_end(bytes, i)?),
    };
    expect(bytes, blanks(bytes, end), b')')?;
    Some((door, reached))
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

/// The end of `name(.name)*` starting at `at`, with nothing between its parts.
fn dotted_name_end(bytes: &[u8], at: usize) -> Option<usize> {
    let mut end = identifier_end(bytes, at)?;
    while bytes.get(end) == Some(&b'.') {
        end = identifier_end(bytes, end + 1)?;
    }
    Some(end)
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
        assert_eq!(
            read("getattr(a, name.attr)"),
            Some(("getattr", Reached::Computed))
        );
    }

    #[test]
    fn every_other_form_is_left_to_the_tree() {
        for code in [
            "getattr",
            "getattr(a)",
            "getattr(a, 'b', c)",
            "getattr(a, 'b',)",
            "getattr(a, 'b' 'c')",
            "getattr(a, 'b' + c)",
            "getattr(a, '''b''')",
            "getattr(a, r'b')",
            "getattr(a, f'{b}')",
            "getattr(a, 'b\\x41')",
            "getattr(a, 'b\ncd')",
            "getattr(a,\n'b')",
            "getattr(a, \\\n'b')",
            "getattr(a, # c\n'b')",
            "getattr\n(a, 'b')",
            "getattr(*a, 'b')",
            "getattr(a(), 'b')",
            "getattr(a[0], 'b')",
            "getattr(a, 'ｂ')",
            "getattr(aｂ, 'c')",
            "getattr(a, 'b'",
            "getattr(a, 'b",
            "vars(a, 'b')",
            "getattrs(a, 'b')",
        ] {
            assert_eq!(door_call(code, 0), None, "{code:?}");
        }
    }
}

//! Doc comments as Python docstrings.

use syn::{Attribute, Expr, Lit, Meta};

/// The text of the `///` comments, one leading space removed per line.
pub(crate) fn text(attrs: &[Attribute]) -> Option<String> {
    let mut lines = Vec::new();
    for attr in attrs {
        if !attr.path().is_ident("doc") {
            continue;
        }
        if let Meta::NameValue(pair) = &attr.meta
            && let Expr::Lit(lit) = &pair.value
            && let Lit::Str(s) = &lit.lit
        {
            let value = s.value();
            for line in value.lines() {
                lines.push(line.strip_prefix(' ').unwrap_or(line).to_owned());
            }
        }
    }
    let text = lines.join("\n").trim().to_owned();
    (!text.is_empty()).then_some(text)
}

/// The docstring: the doc text, with a rustdoc `# Arguments` (or `# Parameters`) list of
/// ``* `name` - text`` items turned into a Google-style `Args:` section.
pub(crate) fn docstring(attrs: &[Attribute]) -> Option<String> {
    let text = text(attrs)?;
    let mut body = Vec::new();
    let mut args: Vec<(String, String)> = Vec::new();
    let mut in_args = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(heading) = trimmed.strip_prefix('#') {
            let heading = heading.trim_start_matches('#').trim().to_ascii_lowercase();
            in_args = heading == "arguments" || heading == "parameters" || heading == "args";
            if in_args {
                continue;
            }
        }
        if in_args {
            if let Some((name, description)) = argument(trimmed) {
                args.push((name, description));
            } else if let (Some(last), false) = (args.last_mut(), trimmed.is_empty()) {
                // A continuation line of the item above.
                last.1.push(' ');
                last.1.push_str(trimmed);
            }
            continue;
        }
        body.push(line);
    }
    let mut out = body.join("\n").trim().to_owned();
    if !args.is_empty() {
        out.push_str("\n\nArgs:");
        for (name, description) in args {
            out.push_str(&format!("\n    {name}: {description}"));
        }
    }
    Some(out.trim().to_owned())
}

/// ``* `name` - text``, ``- `name`: text`` and the like.
fn argument(line: &str) -> Option<(String, String)> {
    let rest = line
        .strip_prefix('*')
        .or_else(|| line.strip_prefix('-'))?
        .trim();
    let rest = rest.strip_prefix('`')?;
    let (name, rest) = rest.split_once('`')?;
    let description = rest
        .trim_start()
        .trim_start_matches([':', '-', '–', '—'])
        .trim();
    Some((name.to_owned(), description.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arguments_list_becomes_an_args_section() {
        let attrs: Vec<Attribute> = vec![
            syn::parse_quote!(#[doc = " Adds a task."]),
            syn::parse_quote!(#[doc = ""]),
            syn::parse_quote!(#[doc = " # Arguments"]),
            syn::parse_quote!(#[doc = " * `title` - what to do"]),
            syn::parse_quote!(#[doc = "   (short)."]),
            syn::parse_quote!(#[doc = " - `due`: the day"]),
        ];
        assert_eq!(
            docstring(&attrs).unwrap(),
            "Adds a task.\n\nArgs:\n    title: what to do (short).\n    due: the day"
        );
        assert_eq!(docstring(&[]), None);
    }
}

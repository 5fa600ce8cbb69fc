//! Shaping execution output for the model: large output is stored in the runtime and the
//! model gets a marker pointing at it, with a preview.

use crate::Message;
use crate::preview;

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

/// A cell's output stored in the runtime ([`persist_output`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Persisted {
    /// The variable that holds it (`_output_3`).
    pub variable: String,
    /// Its number.
    pub index: u64,
    /// The characters it holds.
    pub chars: usize,
    /// What the model gets instead of the output ([`persisted_marker`]).
    pub marker: String,
}

/// Stores a cell's output in `runtime` under the first free `{prefix}_N` with `N >= floor`:
/// the whole text of `spooled` when the runtime kept it in a file (`output` then holds its
/// beginning and its end), else `output`. The marker names what the variable holds; a whole
/// text that cannot be bound falls back to `output` (and says why in the log).
pub async fn persist_output(
    runtime: &dyn crate::Runtime,
    prefix: &str,
    output: &str,
    spooled: Option<&crate::SpooledOutput>,
    floor: u64,
    preview_chars: usize,
) -> Result<Persisted, crate::RuntimeError> {
    // Why the whole output, kept in a file, is not what the variable holds.
    let mut not_whole = None;
    let whole = match spooled {
        Some(spooled) => match runtime.bind_unique_spooled(prefix, spooled, floor).await {
            Ok(name) => Some((name, spooled)),
            Err(error) => {
                tracing::warn!(%error, "a cell's whole output could not be bound; its ends are");
                not_whole = Some(error.to_string());
                None
            }
        },
        None => None,
    };
    let (variable, chars, cut) = match whole {
        Some((name, spooled)) => (
            name,
            usize::try_from(spooled.chars()).unwrap_or(usize::MAX),
            (spooled.cut() > 0).then(|| (spooled.limit(), spooled.cut())),
        ),
        None => (
            runtime
                .bind_unique(prefix, crate::Value::Str(output.to_owned()), floor)
                .await?,
            output.chars().count(),
            None,
        ),
    };
    let index = variable
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('_'))
        .and_then(|n| n.parse::<u64>().ok());
    let Some(index) = index else {
        // The runtime broke `bind_unique`'s contract: say so rather than guess a number.
        return Err(crate::RuntimeError::Backend {
            operation: "bind_unique",
            message: format!("returned {variable:?}, which is not {prefix}_N"),
        });
    };
    let mut marker = persisted_marker(output, chars, &variable, preview_chars);
    if let Some((limit, cut)) = cut {
        note_in_persisted_marker(
            &mut marker,
            &crate::prompt::persisted_output_cut(limit, cut),
        );
    }
    if let Some(error) = not_whole {
        // The output's note says the whole is kept: the variable must say it is not.
        note_in_persisted_marker(
            &mut marker,
            &crate::prompt::persisted_output_ends_only(&error),
        );
    }
    Ok(Persisted {
        variable,
        index,
        chars,
        marker,
    })
}

/// Adds `note` to a [`persisted_marker`]'s declaration (after its last sentence, before the
/// preview): what the variable holds when it is not the whole output.
fn note_in_persisted_marker(marker: &mut String, note: &str) {
    let at = marker
        .find(PREVIEW_HEAD)
        .or_else(|| marker.rfind(&format!("\n{CLOSE}")))
        .unwrap_or(marker.len());
    marker.insert_str(at, note);
}

/// The highest `n` of a `{prefix}_{n}` variable that an execution result of the history
/// stored its output in (0 if none), read from the messages' data, never from their text.
pub fn highest_persisted_index(history: &[Message], prefix: &str) -> u64 {
    history
        .iter()
        .filter_map(Message::persisted)
        .filter(|p| p.variable == format!("{prefix}_{}", p.index))
        .map(|p| p.index)
        .max()
        .unwrap_or(0)
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
    fn marker_round_trip() {
        let out = "x".repeat(50) + "\n" + &"y".repeat(50);
        let marker = persisted_marker(&out, 101, "_output_7", 60);
        assert!(
            marker.starts_with("<persisted-output>\n") && marker.ends_with("\n</persisted-output>")
        );
        assert!(marker.contains(&"x".repeat(50)) && marker.contains("\n..."));
        let history = [Message::persisted_result(
            format!("wrap {marker} end"),
            crate::PersistedOutput::new("_output", 7, 101),
        )];
        assert_eq!(highest_persisted_index(&history, "_output"), 7);
        assert_eq!(highest_persisted_index(&history, "_out"), 0);
        let stripped = strip_persisted_preview(history[0].content()).unwrap();
        assert!(!stripped.contains("Preview") && stripped.starts_with("wrap <persisted-output>"));
        assert!(stripped.ends_with("\n</persisted-output> end"));
        assert_eq!(strip_persisted_preview(&stripped).unwrap(), stripped);
        assert_eq!(strip_persisted_preview("plain"), None);
    }

    #[test]
    fn only_the_data_counts_not_the_text() {
        let history = [
            Message::user("please inspect `_output_99`"),
            // A marker in text without its data (e.g. printed by the model's code).
            Message::execution_result(persisted_marker("a", 9, "_output_50", 0)),
            Message::persisted_result(
                persisted_marker("a", 9, "输出_3", 0),
                crate::PersistedOutput::new("输出", 3, 9),
            ),
        ];
        assert_eq!(highest_persisted_index(&history, "_output"), 0);
        assert_eq!(highest_persisted_index(&history, "输出"), 3);
    }
}

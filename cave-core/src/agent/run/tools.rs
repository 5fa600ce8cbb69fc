//! Tool calls a model makes unasked: assembled from their pieces, and either read as the
//! turn's code (a tool that runs code) or answered with a correction. The request advertises
//! no tools, so neither kind is a tool call the history records: the first becomes an ordinary
//! code message, the second an assistant message and a user message.

use crate::ToolCallDelta;

/// The most tool calls one answer is read for; more are counted, not kept.
const MAX_CALLS: usize = 16;

/// The most bytes of arguments one answer's tool calls are kept for (code included).
const MAX_ARGUMENT_BYTES: usize = 4 << 20;

/// Argument names whose string is code, whatever the tool is called.
const CODE_ARGUMENTS: [&str; 4] = ["code", "source", "script", "input"];

/// Words in a tool's name that say it runs code (`python`, `execute`, `run_code`, …).
const CODE_TOOL_WORDS: [&str; 6] = [
    "python",
    "exec",
    "run_code",
    "code_interpreter",
    "jupyter",
    "shell_python",
];

/// One tool call, as its pieces arrived.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct ToolCall {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) arguments: String,
}

/// An answer's tool calls, bounded.
#[derive(Debug, Default)]
pub(super) struct ToolCalls {
    calls: Vec<(u32, ToolCall)>,
    bytes: usize,
    /// Pieces past the bounds.
    dropped: bool,
}

impl ToolCalls {
    /// Adds a piece.
    pub(super) fn push(&mut self, piece: ToolCallDelta) {
        let at = match self
            .calls
            .iter()
            .position(|(index, _)| *index == piece.index)
        {
            Some(at) => at,
            None if self.calls.len() < MAX_CALLS => {
                self.calls.push((piece.index, ToolCall::default()));
                self.calls.len() - 1
            }
            None => {
                self.dropped = true;
                return;
            }
        };
        let call = &mut self.calls[at].1;
        if let Some(id) = piece.id.filter(|id| call.id.is_empty() && id.len() <= 256) {
            call.id = id;
        }
        if let Some(name) = piece.name
            && call.name.len() + name.len() <= 256
        {
            call.name.push_str(&name);
        }
        if self.bytes + piece.arguments.len() > MAX_ARGUMENT_BYTES {
            self.dropped = true;
            return;
        }
        self.bytes += piece.arguments.len();
        call.arguments.push_str(&piece.arguments);
    }

    /// Returns true if and only if no call came.
    pub(super) fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The calls, in the order they began.
    pub(super) fn calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.calls.iter().map(|(_, call)| call)
    }

    /// The first call that carries code, and that code: only when every piece was kept (code
    /// cut by the bounds would run a different program).
    pub(super) fn code(&self) -> Option<(&ToolCall, String)> {
        if self.dropped {
            return None;
        }
        self.calls()
            .find_map(|call| code_of(&call.name, &call.arguments).map(|code| (call, code)))
    }
}

/// Returns true if and only if a tool's name says that it runs code.
fn runs_code(name: &str) -> bool {
    let name = name.to_ascii_lowercase().replace(['-', '.', ' '], "_");
    CODE_TOOL_WORDS.iter().any(|word| name.contains(word))
}

/// The code a tool call carries: a string argument named like code; the only string argument
/// of a tool that runs code; or, for such a tool, arguments that are not a JSON object (the
/// raw code, as gpt-oss sends its `python` tool's).
fn code_of(name: &str, arguments: &str) -> Option<String> {
    let code = match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(serde_json::Value::Object(fields)) => {
            let named = CODE_ARGUMENTS
                .iter()
                .find_map(|key| fields.get(*key).and_then(|v| v.as_str()));
            let only = || {
                let mut strings = fields.values().filter_map(|v| v.as_str());
                match (strings.next(), strings.next()) {
                    (Some(only), None) if runs_code(name) => Some(only),
                    _ => None,
                }
            };
            named.or_else(only).map(str::to_owned)
        }
        Ok(serde_json::Value::String(code)) if runs_code(name) => Some(code),
        Ok(_) => None,
        Err(_) if runs_code(name) => Some(arguments.to_owned()),
        Err(_) => None,
    }?;
    let code = code.trim_matches('\n').to_owned();
    (!code.trim().is_empty()).then_some(code)
}

/// How the answer's calls read in the history: `name(arguments)`, shortened.
pub(super) fn rendered(calls: &ToolCalls) -> String {
    calls
        .calls()
        .map(|call| {
            let (arguments, cut) = crate::preview(&call.arguments, 200);
            let more = if cut { "…" } else { "" };
            format!("{}({arguments}{more})", display_name(&call.name))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A call's name as the model and the events read it (`?` for a call that gave none).
pub(super) fn display_name(name: &str) -> &str {
    if name.is_empty() { "?" } else { name }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call's index, its name on the first piece, and a fragment of its arguments.
    type Piece<'a> = (u32, Option<&'a str>, &'a str);

    fn calls(pieces: &[Piece<'_>]) -> ToolCalls {
        let mut calls = ToolCalls::default();
        for (index, name, arguments) in pieces {
            let mut piece = ToolCallDelta::new(*index).with_arguments(*arguments);
            if let Some(name) = name {
                piece = piece.with_name(*name).with_id(format!("call_{index}"));
            }
            calls.push(piece);
        }
        calls
    }

    #[test]
    fn code_is_found_in_the_arguments_that_carry_it() {
        let cases: [(&[Piece<'_>], Option<&str>); 9] = [
            (
                &[(0, Some("python"), "{\"code\": \"print(1)\"}")],
                Some("print(1)"),
            ),
            (
                &[
                    (0, Some("python"), "{\"co"),
                    (0, None, "de\": \"x = 2\\n\"}"),
                ],
                Some("x = 2"),
            ),
            (
                &[(0, Some("anything"), "{\"source\": \"y = 3\"}")],
                Some("y = 3"),
            ),
            (
                &[(0, Some("execute"), "{\"cmd\": \"z = 4\"}")],
                Some("z = 4"),
            ),
            (
                &[(0, Some("run_code"), "{\"a\": \"1\", \"b\": \"2\"}")],
                None,
            ),
            (
                &[(0, Some("python"), "import os\nprint(os.getcwd())")],
                Some("import os\nprint(os.getcwd())"),
            ),
            (&[(0, Some("get_weather"), "{\"city\": \"Paris\"}")], None),
            (&[(0, Some("search"), "not json")], None),
            (
                &[
                    (0, Some("get_weather"), "{}"),
                    (1, Some("python"), "{\"code\": \"w = 5\"}"),
                ],
                Some("w = 5"),
            ),
        ];
        for (pieces, expected) in cases {
            let calls = calls(pieces);
            assert_eq!(
                calls.code().map(|(_, code)| code).as_deref(),
                expected,
                "{pieces:?}"
            );
        }
    }

    #[test]
    fn calls_are_bounded() {
        let mut many = ToolCalls::default();
        for index in 0..100 {
            many.push(
                ToolCallDelta::new(index)
                    .with_name("python")
                    .with_arguments("{\"code\": \"x\"}"),
            );
        }
        assert_eq!(many.calls().count(), MAX_CALLS);
        // A call past the bounds could hide code: nothing is run.
        assert!(many.code().is_none());
        let mut huge = ToolCalls::default();
        huge.push(ToolCallDelta::new(0).with_name("python"));
        for _ in 0..5 {
            huge.push(ToolCallDelta::new(0).with_arguments("x".repeat(1 << 20)));
        }
        assert!(huge.code().is_none());
        assert!(rendered(&huge).chars().count() < 300);
    }
}

//! Every text the model is shown, in one place, and the template renderer for the system prompt.

use crate::{ChatMessage, ChatRequest, ChatRole, Message, Value};
use std::fmt;

/// Who the agent is: the first paragraph of the system prompt.
pub const DEFAULT_INSTRUCTIONS: &str = "You are an agent that solves tasks by writing and running Python code. \
The functions, variables and types listed below are live objects in your Python session: use them.";

/// How the agent works. `{python_block_identifier}` is replaced once, when the agent is built.
pub const DEFAULT_SYSTEM_INSTRUCTIONS: &str = "How to work:
- Each message may contain one {python_block_identifier} code block. It runs in a persistent Python session, like a notebook cell, and you see what it printed before you continue.
- Variables, imports and functions you define stay available in later steps.
- Print what you need to see; the value of a bare expression on the last line is shown too.
- Use the functions, variables and types listed below. They are real objects: what you do to them is what the user gets.
- Never work out results in your head and never invent output: run code, and answer from what it printed.
- Put all the code of a step in a single block. Only the first block of a message runs; text after it is ignored.
- When the task is done, give your final answer in plain text, without a code block.

A step looks like this:
```{python_block_identifier}
total = add(5, 3)
print(total)
```";

/// The system prompt's layout. Placeholders: `{instructions}`, `{system_instructions}`,
/// `{functions}`, `{variables}`, `{types}`, `{skills}`, `{current_time}`; `{{` and `}}` are
/// literal braces.
pub const DEFAULT_SYSTEM_PROMPT_TEMPLATE: &str = "{instructions}

{system_instructions}

You have access to:

<functions>
{functions}
</functions>

<variables>
{variables}
</variables>

<types>
{types}
</types>

<skills>
{skills}
</skills>
";

/// The placeholders a system prompt template may use.
pub const TEMPLATE_PLACEHOLDERS: &[&str] = &[
    "instructions",
    "system_instructions",
    "functions",
    "variables",
    "types",
    "skills",
    "current_time",
];

/// Appended to the system instructions when the agent has skills.
pub const SKILLS_INSTRUCTION: &str = "
- The <skills> section lists skills: packaged instructions for kinds of tasks. When a task matches one, first call activate_skill(\"name\") and print what it returns; follow those instructions. read_skill_file(\"name\", \"path\") returns one of the skill's files that activate_skill listed.";

/// Appended to the system instructions with tool search: the prompt names objects, and the
/// model finds their methods (and the functions not listed) from its code.
pub const TOOL_SEARCH_INSTRUCTION: &str = "
- Objects below are named, not described method by method. To find what can do a task, run print(search_tools(\"what you need, in a few words\")): it lists the best matching functions and methods with their parameters and docs (search_tools(query, limit=10) for more). help(obj.method) shows one in full. Search before you guess a name.";

/// Appended to the system instructions when the runtime holds host functions or objects.
pub const CONCURRENT_CALLS_INSTRUCTION: &str = "
- A call of a listed function or method waits for the host. To make several at once, await them together: results = await asyncio.gather(*(f.aio(x) for x in items)) (every such function and method has the awaitable form .aio, with the same parameters).";

/// A host object in a description with tool search: its type, what it is, how many methods.
pub fn compact_object(type_name: &str, summary: &str, methods: usize) -> String {
    let summary = crate::one_line(summary, 200);
    let what = if summary.is_empty() {
        String::new()
    } else {
        format!(" {summary}")
    };
    let noun = if methods == 1 { "method" } else { "methods" };
    format!("{type_name}:{what} ({methods} {noun}: search_tools finds them)")
}

/// The last line of the functions section when it lists only some.
pub fn more_functions(n: usize) -> String {
    format!("- … and {n} more functions: search_tools finds them")
}

/// What `search_tools` returns when nothing matches.
pub fn no_tools_found(query: &str, tools: usize) -> String {
    format!(
        "No function or method matches {:?} ({tools} searched). Try other words: what the tool acts on, or what it returns.",
        crate::one_line(query, 200)
    )
}

/// The docstring of `search_tools`.
pub const SEARCH_TOOLS_DOC: &str = "Finds the host's functions and methods that match a query (words of what you need), best first, each with its parameters and doc. Print the result.";

/// The `<skills>` section when the agent has none.
pub const NO_SKILLS: &str = "No skills available";

/// Appended to the system instructions when executions have a time limit.
pub fn exec_time_limit_line(seconds: f64) -> String {
    format!(
        "\n- Each execution is stopped after {} seconds. Give network requests and database queries \
their own time limits (for example requests.get(url, timeout=10)) so that they cannot hang.",
        py_float(seconds)
    )
}

/// Wraps an execution's output for the model.
pub fn execution_output(body: &str) -> String {
    format!(
        "\n<execution_output>\n{body}\n</execution_output>\n\nIf more work is needed, continue with the next \
code block; otherwise give your final answer in plain text. Everything defined by earlier executions is \
still available.\n"
    )
}

/// Tells the model its code was refused by the code policy.
/// What the model reads when the host's approver refused its cell.
pub fn cell_refused(reason: Option<&str>) -> String {
    let why = reason
        .filter(|r| !r.trim().is_empty())
        .map(|r| format!(" The reason given: {r}"))
        .unwrap_or_default();
    format!(
        "\n<not_approved>\nThe user did not approve running this code, so nothing ran.{why}\n</not_approved>\nDo not retry the same code: ask the user, or find another way they would approve.\n"
    )
}

/// What the model reads when the code policy refused its cell.
pub fn security_error(message: &str) -> String {
    format!(
        "\n<security_error>\n{message}\n</security_error>\nThis code was not run because it breaks the code \
policy. Rewrite it without the violation.\n"
    )
}

/// Tells the model its code was stopped at the time limit.
pub fn execution_timeout(seconds: f64) -> String {
    format!(
        "The execution was stopped after {} seconds. Make the code faster, or split the work into smaller steps.",
        py_float(seconds)
    )
}

/// What the model reads when a cell was stopped because the session's processor-time
/// budget of `seconds` ran out while it ran.
pub fn cpu_budget_spent(seconds: f64) -> String {
    format!(
        "The execution was stopped: the session's budget of {} seconds of processor time is spent. No more code can run in this session.",
        py_float(seconds)
    )
}

/// What the model reads when a cell was not run because a budget of the session is spent
/// (`why` says which, and how much was used).
pub fn budget_spent(why: &str) -> String {
    format!("Nothing ran: {why}. No more code can run in this session.")
}

/// Put between the beginning and the end of a cell's output when its middle was dropped
/// (`bytes` and `lines` of it) because the output passed `cap` bytes.
pub fn output_dropped(bytes: u64, lines: u64, cap: usize) -> String {
    format!(
        "[… {} ({lines} lines) of output dropped here: a cell's output is kept up to {}, its \
beginning and its end. Print less, or write large results to a file and read parts of it.]\n",
        format_size(bytes),
        format_size(cap as u64),
    )
}

/// Put where the middle of a cell's output (`bytes` of it, `lines` lines) is left out of the
/// result because the whole output, `kept` bytes, is kept in a file (to be bound to
/// `_output_N`); `cut` bytes past the `limit` were dropped.
pub fn output_spooled(bytes: u64, lines: u64, kept: u64, cut: u64, limit: u64) -> String {
    let mut note = format!(
        "[… {} ({lines} lines) of output not shown here; the whole output, {}, is kept",
        format_size(bytes),
        format_size(kept),
    );
    if cut > 0 {
        note.push_str(&format!(
            " up to the limit of {} a cell: the {} written past it were dropped",
            format_size(limit),
            format_size(cut),
        ));
    }
    note.push_str(".]\n");
    note
}

/// What `_output_N` holds after the runtime restarted, when it held a whole output read from
/// its file (the host does not keep such a text to bind it again).
pub const SPOOLED_OUTPUT_LOST: &str = "[This variable held a cell's whole output, read from a file \
in the runtime; the runtime has restarted since and the text is gone. Run the code again to see it.]";

/// Added to the dropped-output note when the whole output could not be written to its file.
pub fn output_not_spooled(error: &str) -> String {
    format!("[The whole output could not be kept in a file either: {error}.]\n")
}

/// Added to the declaration of a persisted output that was cut at the limit (`limit`, `cut`
/// bytes past it).
pub fn persisted_output_cut(limit: u64, cut: u64) -> String {
    format!(
        " It holds the output's first {}, the limit a cell's output is kept to; the {} written \
after that were dropped.",
        format_size(limit),
        format_size(cut),
    )
}

/// Added to the declaration of a persisted output whose whole text, kept in a file, could not
/// be stored in the runtime (`error`): the variable holds what the result shows.
pub fn persisted_output_ends_only(error: &str) -> String {
    format!(
        " It holds only the beginning and the end shown below, not the whole output: that could not be stored in the runtime ({error})."
    )
}

/// Sent live once a cell's live output reaches `cap` bytes (the result keeps the output's end).
pub fn live_output_stopped(cap: usize) -> String {
    format!(
        "\n[live output stops here: it is shown up to {} a cell; the result keeps the end]\n",
        format_size(cap as u64)
    )
}

/// Put before a cell's output when a thread or a process an earlier cell left running wrote
/// after that cell ended: `written`, what was kept of it.
pub fn written_outside_cells(written: &str) -> String {
    let mut text = String::from(
        "[Written after its cell ended, by a thread or process an earlier cell left running:]\n",
    );
    text.push_str(written);
    if !written.ends_with('\n') {
        text.push('\n');
    }
    text.push_str("[The output of this cell:]\n");
    text
}

/// Put where output written while no cell ran was dropped (`bytes` of it).
pub fn written_outside_dropped(bytes: u64) -> String {
    format!("[… {} more written outside any cell]\n", format_size(bytes))
}

/// Added (after a blank line) when stopping an execution restarted the runtime process.
pub const STATE_LOST_NOTICE: &str = "Stopping it restarted the runtime process: variables, imports and \
functions created by earlier code are gone, and the registered functions, variables and types are back. \
Recreate whatever else you still need.";

/// Added when the runtime could not stop the code yet (it is inside a blocking call).
pub const INTERRUPT_PENDING_NOTICE: &str = "The code is inside a call that cannot be interrupted, so it may \
still be running; the next execution starts when it ends.";

/// Sent when the answer hit the output-token cap.
pub const OUTPUT_RECOVERY_PROMPT: &str = "Your message hit the output limit and was cut off. Continue exactly \
where it stopped, and split the remaining work into smaller steps.";

/// Sent when the answer was cut off by a broken stream.
pub const STREAM_INTERRUPTED_PROMPT: &str =
    "Your message was cut off by a connection problem. Continue exactly where it stopped.";

/// Sent when the answer's reasoning (`<think>…`) was never closed and no answer followed.
pub const UNCLOSED_THINKING_PROMPT: &str = "Your reasoning was never closed with </think>, and no answer \
followed it. Give your answer now: one ```python block to act, or the final answer in plain text.";

/// Sent when the answer called tools (`tools`, their names): there are none to call here.
pub fn tool_calls_unanswered(tools: &[String], tag: &str) -> String {
    let names = tools
        .iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "There are no tools to call here, so your call of {names} did nothing. To act, write one \
```{tag} block: it runs in the runtime, where the functions and objects the system prompt lists \
are bound. Or give your final answer in plain text."
    )
}

/// The output of a cell that printed nothing.
pub const EMPTY_OUTPUT: &str = "No output";

/// Closes a code message whose execution was cancelled.
pub const EXECUTION_CANCELLED: &str = "[Execution cancelled]";

/// Closes a code message whose execution was cancelled by restarting the runtime process.
pub const EXECUTION_CANCELLED_STATE_LOST: &str = "[Execution cancelled; stopping it restarted the runtime process and unregistered state was lost]";

/// Closes a code message whose execution never finished.
pub const EXECUTION_INCOMPLETE: &str = "[Execution did not complete]";

/// Marks a run the user interrupted.
pub const USER_INTERRUPTION: &str = "[Request interrupted by user]";

/// The per-call reminder, sent after the system prompt so that the prompt itself stays
/// byte-stable (and cacheable) across calls.
pub fn date_reminder(now_utc: &str) -> String {
    format!("<system-reminder>\nThe current date and time is {now_utc} UTC.\n</system-reminder>")
}

/// A float as Python's `str()` writes it (`30.0`, `0.5`).
pub fn py_float(x: f64) -> String {
    Value::Float(x).to_string()
}

/// A system prompt template that is not well formed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// A placeholder the renderer does not know.
    #[error(
        "unknown placeholder {{{name}}} in the template; known: {known:?} (write {{{{ and }}}} for literal braces)"
    )]
    UnknownPlaceholder {
        /// The placeholder's name.
        name: String,
        /// The names it may use.
        known: Vec<String>,
    },
    /// A brace that neither opens a placeholder nor is doubled.
    #[error(
        "unmatched '{brace}' at byte {offset} of the template (write {{{{ and }}}} for literal braces)"
    )]
    UnmatchedBrace {
        /// The brace.
        brace: char,
        /// Where.
        offset: usize,
    },
}

/// Renders `template`, replacing `{name}` with its value; `{{` and `}}` are literal braces.
pub fn render_template(template: &str, values: &[(&str, &str)]) -> Result<String, TemplateError> {
    let mut out =
        String::with_capacity(template.len() + values.iter().map(|(_, v)| v.len()).sum::<usize>());
    let mut rest = template;
    let mut offset = 0;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let brace = rest.as_bytes()[i];
        let after = &rest[i + 1..];
        if after.as_bytes().first() == Some(&brace) {
            out.push(brace as char);
            rest = &after[1..];
            offset += i + 2;
            continue;
        }
        if brace == b'}' {
            return Err(TemplateError::UnmatchedBrace {
                brace: '}',
                offset: offset + i,
            });
        }
        let Some(end) = after.find('}') else {
            return Err(TemplateError::UnmatchedBrace {
                brace: '{',
                offset: offset + i,
            });
        };
        let name = &after[..end];
        let value = values
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .ok_or_else(|| TemplateError::UnknownPlaceholder {
                name: name.to_owned(),
                known: values.iter().map(|(k, _)| (*k).to_owned()).collect(),
            })?;
        out.push_str(value);
        rest = &after[end + 1..];
        offset += i + 1 + end + 1;
    }
    out.push_str(rest);
    Ok(out)
}

/// The current UTC time as `YYYY-MM-DD HH:00` (hour granularity keeps requests cacheable).
pub(crate) fn utc_hour_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    UtcHour(secs).to_string()
}

struct UtcHour(u64);

impl fmt::Display for UtcHour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (year, month, day) = civil_date(self.0);
        let hour = (self.0 % 86_400) / 3600;
        write!(f, "{year:04}-{month:02}-{day:02} {hour:02}:00")
    }
}

/// The UTC date of `secs` since the epoch (Howard Hinnant's civil-from-days algorithm).
pub fn civil_date(secs: u64) -> (i64, i64, i64) {
    let days = (secs / 86_400) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A size for people: `512 B`, `4 KiB`, `11.7 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 || value >= 100.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Said at the end of a cell's output when it showed more items than are sent.
pub fn displays_left_out(count: usize, cap: usize) -> String {
    format!(
        "\n[{count} more display item{} not shown: a cell shows at most {} items and {} of them]\n",
        if count == 1 { "" } else { "s" },
        crate::MAX_DISPLAY_ITEMS,
        format_size(cap as u64 * 8)
    )
}

/// The line the model reads about a display item after the cell's output (its text form is
/// in the output already): each rich form, an image's size, the file it was saved as, and the
/// forms left out; `None` for an item with nothing beyond text.
pub fn display_line(
    item: &crate::DisplayItem,
    files: &std::collections::BTreeMap<String, std::path::PathBuf>,
    failures: &[String],
) -> Option<String> {
    let mut parts = Vec::new();
    for (mime, data) in item.rich_forms() {
        let mut part = mime.to_owned();
        if let Some((width, height)) = crate::image_size(mime, data.as_bytes()) {
            part.push_str(&format!(" {width}×{height}"));
        }
        match files.get(mime).and_then(|path| path.file_name()) {
            Some(name) => part.push_str(&format!(" saved as {}", name.to_string_lossy())),
            None if failures.iter().any(|f| f.starts_with(&format!("{mime}:"))) => {
                part.push_str(" (could not be saved)")
            }
            None => {}
        }
        parts.push(part);
    }
    for (mime, size) in &item.omitted {
        parts.push(format!(
            "{mime} of {} left out: over the display limit",
            format_size(*size)
        ));
    }
    (!parts.is_empty()).then(|| format!("[{}]", parts.join("; ")))
}

/// Said after a result when some of its images were not sent to the model.
pub fn images_left_out(count: usize, budget: u64) -> String {
    format!(
        "[{count} more image{} not sent to you: over the {budget} tokens of images a result may carry]",
        if count == 1 { "" } else { "s" }
    )
}

// The summarizer's texts (`ContextCompactor`).

/// What an old execution result becomes when it is cleared.
pub const CLEARED_RESULT: &str = "[Earlier execution output cleared to save context space]";

/// The assistant's reply to a summary, so that turns keep alternating.
pub const SUMMARY_ACKNOWLEDGEMENT: &str =
    "Understood. I have the earlier context from the summary and will continue from there.";

const SUMMARY_SYSTEM: &str = "You summarize a working session between a user and an agent that operates a \
live Python runtime, so that the agent can continue the work with only your summary and the most \
recent turns.";

const SUMMARY_INSTRUCTIONS: &str = "First think in <analysis> tags: go through the transcript in order and \
note the user's requests, what the agent did, what the code produced, errors and how they were \
resolved, and which variables, objects and files now hold results. Then write the summary in \
<summary> tags, with these parts: the user's goals and explicit requests; the state of the \
runtime (variables and what they hold, functions defined, data loaded, outputs stored in \
`_output_N` variables); the work done and its results, with exact figures and names; errors met \
and what fixed them; what remains to do. Be precise: keep names, numbers and decisions; drop \
pleasantries and repeated output. Only the summary is kept.";

/// The summary as it is sent to the model.
pub fn summary_message(summary: &str) -> String {
    format!(
        "This session was compacted. A summary of the earlier conversation follows; the runtime still \
holds everything it described.\n<conversation-summary>\n{summary}\n</conversation-summary>"
    )
}

fn transcript_label(message: &Message) -> &'static str {
    match message {
        Message::System { .. } => "System",
        Message::User { .. } => "User",
        Message::Assistant { .. } => "Agent",
        Message::Code { .. } => "Agent (code)",
        Message::ExecutionResult { .. } => "Execution result",
        Message::Summary { .. } => "Earlier summary",
        Message::SummaryAcknowledgement { .. } => "Agent",
    }
}

/// The request for a summary of `entries`, building on `prior` (given back verbatim).
pub fn summary_request(prior: Option<&str>, entries: &[Message], cap: usize) -> ChatRequest {
    let mut body = String::new();
    if let Some(prior) = prior {
        body.push_str("The summary of what came before (keep what still matters, verbatim where you can):\n<previous-summary>\n");
        body.push_str(prior);
        body.push_str("\n</previous-summary>\n\nWhat happened since:\n");
    } else {
        body.push_str("The transcript:\n");
    }
    body.push_str("<transcript>\n");
    for message in entries {
        let content = message.content();
        let (shown, _) = crate::shorten(content, cap);
        body.push_str(&format!("[{}]\n{shown}\n", transcript_label(message)));
        let cut = content.chars().count() - shown.chars().count();
        if cut > 0 {
            body.push_str(&format!("[… {cut} more characters]\n"));
        }
        body.push('\n');
    }
    body.push_str("</transcript>\n\n");
    body.push_str(SUMMARY_INSTRUCTIONS);
    ChatRequest::new(vec![
        ChatMessage::new(ChatRole::System, SUMMARY_SYSTEM),
        ChatMessage::new(ChatRole::User, body),
    ])
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(4 << 30), "4 GiB");
        assert_eq!(format_size(3 << 19), "1.5 MiB");
        assert_eq!(format_size(12_563_767_296), "11.7 GiB");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(UtcHour(0).to_string(), "1970-01-01 00:00");
        assert_eq!(
            UtcHour(951_782_400 + 13 * 3600 + 59).to_string(),
            "2000-02-29 13:00"
        );
        assert_eq!(UtcHour(1_795_996_800).to_string(), "2026-11-30 00:00");
    }

    #[test]
    fn templates() {
        assert_eq!(
            render_template("{a} {{b}} {a}", &[("a", "x")]).unwrap(),
            "x {b} x"
        );
        assert!(matches!(
            render_template("{c}", &[("a", "x")]),
            Err(TemplateError::UnknownPlaceholder { .. })
        ));
        assert!(matches!(
            render_template("x}", &[]),
            Err(TemplateError::UnmatchedBrace { brace: '}', .. })
        ));
        assert!(matches!(
            render_template("{x", &[]),
            Err(TemplateError::UnmatchedBrace { brace: '{', .. })
        ));
    }

    #[test]
    fn python_floats() {
        assert_eq!(py_float(30.0), "30.0");
        assert_eq!(py_float(0.5), "0.5");
    }
}

//! What the summarizer is told, and how a summary is put back into the conversation.

use cave_core::{ChatMessage, ChatRequest, ChatRole, Message};

/// What an old execution result becomes when it is cleared.
pub const CLEARED_RESULT: &str = "[Earlier execution output cleared to save context space]";

/// The assistant's reply to a summary, so that turns keep alternating.
pub const SUMMARY_ACKNOWLEDGEMENT: &str =
    "Understood. I have the earlier context from the summary and will continue from there.";

const SYSTEM: &str = "You summarize a working session between a user and an agent that operates a \
live Python runtime, so that the agent can continue the work with only your summary and the most \
recent turns.";

const INSTRUCTIONS: &str = "First think in <analysis> tags: go through the transcript in order and \
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

fn label(message: &Message) -> &'static str {
    match message {
        Message::System { .. } => "System",
        Message::User { .. } => "User",
        Message::Assistant { .. } => "Agent",
        Message::Code { .. } => "Agent (code)",
        Message::ExecutionResult { .. } => "Execution result",
        Message::Summary { .. } => "Earlier summary",
        Message::SummaryAcknowledgement { .. } => "Agent",
        _ => "Message",
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
        let shown: String = content.chars().take(cap).collect();
        body.push_str(&format!("[{}]\n{shown}\n", label(message)));
        let cut = content.chars().count().saturating_sub(cap);
        if cut > 0 {
            body.push_str(&format!("[… {cut} more characters]\n"));
        }
        body.push('\n');
    }
    body.push_str("</transcript>\n\n");
    body.push_str(INSTRUCTIONS);
    ChatRequest::new(vec![
        ChatMessage::new(ChatRole::System, SYSTEM),
        ChatMessage::new(ChatRole::User, body),
    ])
}

//! The conversation history: typed messages, and what goes on the wire.

use serde::{Deserialize, Serialize};

/// One message of the history the agent keeps.
///
/// The kinds are distinct so that later stages never guess from text: a summary is known by
/// its type, and a code message is always followed by its execution result. The history
/// serializes with serde (`{"type": "code", "content": "..."}`) and is a stable format.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Message {
    /// The system prompt (rebuilt at every run).
    System {
        /// Prompt text.
        content: String,
    },
    /// A user's prompt, or a note the agent sends as the user (recovery, interruption).
    User {
        /// Message text.
        content: String,
    },
    /// An assistant answer without a code block.
    Assistant {
        /// Message text.
        content: String,
        /// The model's reasoning for this turn, kept for providers that want it back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reasoning: Option<String>,
    },
    /// An assistant turn whose first code block was executed; text ends at the closing fence.
    Code {
        /// Message text, up to and including the closing fence.
        content: String,
        /// The model's reasoning for this turn, kept for providers that want it back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reasoning: Option<String>,
    },
    /// What the execution of the preceding code message returned, as shown to the model.
    ExecutionResult {
        /// Message text.
        content: String,
        /// Where the output went when it was too large to inline (the text then holds a
        /// marker pointing there).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        persisted: Option<PersistedOutput>,
        /// Images the code showed, sent with the text to a model that reads images
        /// ([`AgentBuilder::vision`](crate::AgentBuilder::vision)).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<ImagePart>,
    },
    /// A summary of earlier history, sent as the user.
    Summary {
        /// The text sent to the model (the summary in its wrapper).
        content: String,
        /// The summary alone.
        body: String,
    },
    /// The assistant's acknowledgement of a summary.
    SummaryAcknowledgement {
        /// Message text.
        content: String,
    },
}

/// The version of the saved-history format ([`SavedHistory`]), under the same rule as
/// [`EVENT_FORMAT_VERSION`](crate::EVENT_FORMAT_VERSION): it changes only when a change would
/// break a reader. See `docs/FORMATS.md`.
pub const HISTORY_FORMAT_VERSION: u32 = 1;

/// A conversation as saved: `{"format_version": 1, "messages": [...]}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SavedHistory {
    /// The format the messages are in.
    pub format_version: u32,
    /// The conversation.
    pub messages: Vec<Message>,
}

/// A saved history that cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// It is not a saved history (or not valid JSON).
    #[error("not a saved cave-agent history: {0}")]
    Invalid(#[from] serde_json::Error),
    /// It was written by a newer version of cave-agent.
    #[error(
        "the history is in format version {found}, newer than this cave-agent reads ({HISTORY_FORMAT_VERSION}): upgrade cave-agent"
    )]
    Newer {
        /// The version found.
        found: u32,
    },
}

impl SavedHistory {
    /// The messages, in the current format.
    pub fn new(messages: Vec<Message>) -> Self {
        Self {
            format_version: HISTORY_FORMAT_VERSION,
            messages,
        }
    }

    /// As JSON.
    pub fn to_json(&self) -> String {
        // Messages hold only strings, numbers and options: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a saved history, refusing one from a newer format.
    pub fn from_json(text: &str) -> Result<Self, HistoryError> {
        let saved: SavedHistory = serde_json::from_str(text)?;
        if saved.format_version > HISTORY_FORMAT_VERSION {
            return Err(HistoryError::Newer {
                found: saved.format_version,
            });
        }
        Ok(saved)
    }
}

/// An execution's output stored in the runtime instead of the history, as data: a resumed
/// history continues numbering after `index`, and compaction keeps the pointer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PersistedOutput {
    /// The runtime variable holding the output, `{prefix}_{index}`.
    pub variable: String,
    /// The variable's number.
    pub index: u64,
    /// The output's length in characters.
    pub chars: usize,
}

impl PersistedOutput {
    /// Output of `chars` characters stored as `{prefix}_{index}`.
    pub fn new(prefix: &str, index: u64, chars: usize) -> Self {
        Self {
            variable: format!("{prefix}_{index}"),
            index,
            chars,
        }
    }
}

/// The role a message has on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatRole {
    /// System instructions.
    System,
    /// The user (also execution results and summaries).
    User,
    /// The assistant (also code messages and summary acknowledgements).
    Assistant,
}

/// A message as sent to a chat model: a role and plain text (and, for assistant turns, the
/// reasoning that produced them, which adapters send back only if configured to).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ChatMessage {
    /// Wire role.
    pub role: ChatRole,
    /// Text.
    pub content: String,
    /// The reasoning of an assistant turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// What the message is in the agent's history, for readers of requests (a replayed
    /// cassette matches an execution result by its place, not its text); never sent to a
    /// provider. `None` for messages made outside the agent's history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<MessageKind>,
    /// Images sent with the text (user messages only; for models that read images).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImagePart>,
}

impl ChatMessage {
    /// A message with this role and text.
    pub fn new(role: ChatRole, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            reasoning: None,
            kind: None,
            images: Vec::new(),
        }
    }

    /// The same message, marked as this kind.
    pub fn with_kind(mut self, kind: MessageKind) -> Self {
        self.kind = Some(kind);
        self
    }
}

/// What a wire message is in the agent's history: a [`Message`] variant, or the date
/// reminder the agent adds to each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MessageKind {
    /// [`Message::System`].
    System,
    /// The date and time the agent tells the model at every call (not in the history).
    Reminder,
    /// [`Message::User`].
    User,
    /// [`Message::Assistant`].
    Assistant,
    /// [`Message::Code`].
    Code,
    /// [`Message::ExecutionResult`]: its text depends on the interpreter that ran the code.
    ExecutionResult,
    /// [`Message::Summary`].
    Summary,
    /// [`Message::SummaryAcknowledgement`].
    SummaryAcknowledgement,
}

impl MessageKind {
    /// How the kind is named in messages to people.
    pub fn describe(self) -> &'static str {
        match self {
            MessageKind::System => "the system prompt",
            MessageKind::Reminder => "the date reminder",
            MessageKind::User => "a user message",
            MessageKind::Assistant => "an answer",
            MessageKind::Code => "a code message",
            MessageKind::ExecutionResult => "an execution result",
            MessageKind::Summary => "a summary",
            MessageKind::SummaryAcknowledgement => "a summary's acknowledgement",
        }
    }
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Message::System {
            content: content.into(),
        }
    }
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Message::User {
            content: content.into(),
        }
    }
    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Message::Assistant {
            content: content.into(),
            reasoning: None,
        }
    }
    /// A code message.
    pub fn code(content: impl Into<String>) -> Self {
        Message::Code {
            content: content.into(),
            reasoning: None,
        }
    }
    /// Attaches the turn's reasoning to an assistant or code message (others are unchanged;
    /// empty reasoning is none).
    pub fn with_reasoning(mut self, text: impl Into<String>) -> Self {
        let text = text.into();
        if let Message::Assistant { reasoning, .. } | Message::Code { reasoning, .. } = &mut self {
            *reasoning = (!text.is_empty()).then_some(text);
        }
        self
    }
    /// The reasoning attached to an assistant or code message.
    pub fn reasoning(&self) -> Option<&str> {
        match self {
            Message::Assistant { reasoning, .. } | Message::Code { reasoning, .. } => {
                reasoning.as_deref()
            }
            _ => None,
        }
    }
    /// An execution result message.
    pub fn execution_result(content: impl Into<String>) -> Self {
        Message::ExecutionResult {
            content: content.into(),
            persisted: None,
            images: Vec::new(),
        }
    }
    /// An execution result whose output was stored in the runtime (`content` holds the marker).
    pub fn persisted_result(content: impl Into<String>, persisted: PersistedOutput) -> Self {
        Message::ExecutionResult {
            content: content.into(),
            persisted: Some(persisted),
            images: Vec::new(),
        }
    }
    /// This execution result with `images` (other messages carry none: unchanged).
    pub fn with_images(mut self, images: Vec<ImagePart>) -> Self {
        if let Message::ExecutionResult { images: own, .. } = &mut self {
            *own = images;
        }
        self
    }
    /// The images sent with this message.
    pub fn images(&self) -> &[ImagePart] {
        match self {
            Message::ExecutionResult { images, .. } => images,
            _ => &[],
        }
    }
    /// Where an execution result's output was stored, if it was.
    pub fn persisted(&self) -> Option<&PersistedOutput> {
        match self {
            Message::ExecutionResult { persisted, .. } => persisted.as_ref(),
            _ => None,
        }
    }

    /// The text sent to the model.
    pub fn content(&self) -> &str {
        match self {
            Message::System { content }
            | Message::User { content }
            | Message::Assistant { content, .. }
            | Message::Code { content, .. }
            | Message::ExecutionResult { content, .. }
            | Message::Summary { content, .. }
            | Message::SummaryAcknowledgement { content } => content,
        }
    }

    /// The role this message has on the wire.
    pub fn chat_role(&self) -> ChatRole {
        match self {
            Message::System { .. } => ChatRole::System,
            Message::User { .. } | Message::ExecutionResult { .. } | Message::Summary { .. } => {
                ChatRole::User
            }
            Message::Assistant { .. }
            | Message::Code { .. }
            | Message::SummaryAcknowledgement { .. } => ChatRole::Assistant,
        }
    }

    /// What this message is, as wire messages carry it.
    pub fn kind(&self) -> MessageKind {
        match self {
            Message::System { .. } => MessageKind::System,
            Message::User { .. } => MessageKind::User,
            Message::Assistant { .. } => MessageKind::Assistant,
            Message::Code { .. } => MessageKind::Code,
            Message::ExecutionResult { .. } => MessageKind::ExecutionResult,
            Message::Summary { .. } => MessageKind::Summary,
            Message::SummaryAcknowledgement { .. } => MessageKind::SummaryAcknowledgement,
        }
    }

    /// This message as sent to a chat model.
    pub fn to_chat(&self) -> ChatMessage {
        ChatMessage {
            role: self.chat_role(),
            content: self.content().to_owned(),
            reasoning: self.reasoning().map(str::to_owned),
            kind: Some(self.kind()),
            images: self.images().to_vec(),
        }
    }
}

/// An image sent with a message to a model that reads images (a figure a cell showed).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ImagePart {
    /// Its MIME type (`image/png`, `image/jpeg`).
    pub mime_type: String,
    /// The image, base64.
    pub data: String,
    /// Its width in pixels.
    pub width: u32,
    /// Its height in pixels.
    pub height: u32,
}

impl ImagePart {
    /// An image of this type and size.
    pub fn new(mime_type: impl Into<String>, bytes: &[u8], width: u32, height: u32) -> Self {
        use base64::Engine as _;
        Self {
            mime_type: mime_type.into(),
            data: base64::engine::general_purpose::STANDARD.encode(bytes),
            width,
            height,
        }
    }

    /// The image as a `data:` URL, as chat APIs take it.
    pub fn data_url(&self) -> String {
        format!("data:{};base64,{}", self.mime_type, self.data)
    }
}

impl std::fmt::Debug for ImagePart {
    /// Its type and size, not its bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ImagePart({} {}×{}, {} base64 bytes)",
            self.mime_type,
            self.width,
            self.height,
            self.data.len()
        )
    }
}

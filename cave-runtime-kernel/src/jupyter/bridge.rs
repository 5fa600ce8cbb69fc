//! The bridge between the worker's frames and the kernel's stdin channel, without I/O.
//!
//! The worker in the kernel sends its frames in the prompts of `input_request`s and reads the
//! host's in the `input_reply`s (`cave_kernel.py`, `_Jupyter`). [`Bridge`] holds the state of
//! that exchange and has one method per input: bytes from the host, the host closing its end,
//! a message from the kernel, time passing. Each leaves what is to be sent in
//! [`Bridge::take_for_kernel`] and [`Bridge::take_for_host`]; `carrier.rs` moves them. Time is passed in,
//! so the tests drive every path without a server.

use super::MARK;
use crate::marshal::Data;
use crate::worker::framed;
use base64::Engine as _;
use cave_core::Value;
use jupyter_protocol::{
    Channel, ExecutionState, InputReply, JupyterMessage, JupyterMessageContent,
};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::Duration;
use tokio::time::Instant;

/// The most bytes of frames one answer carries (base64 makes it a third larger); gateways
/// refuse WebSocket messages past about 10 MiB.
pub(super) const CHUNK: usize = 4 << 20;
/// The most executions whose IOPub output the bridge counts at once (a session runs a few).
const MAX_COUNTED: usize = 4096;
/// How long a kernel the runtime attached to gets to stop its worker when let go.
const RELEASE_GRACE: Duration = Duration::from_secs(10);
/// How long the bridge waits for a cell's output on IOPub to catch up with its frames.
pub(super) const OUTPUT_GRACE: Duration = Duration::from_secs(5);

/// Why the link between the runtime and the worker in the kernel ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum End {
    /// The runtime closed its end (a kernel it started is then shut down).
    HostClosed,
    /// The runtime let go of a kernel it attached to, and the worker did not stop in time.
    ReleaseTimedOut,
    /// The worker's execute request ended: it stopped, or failed with this error.
    WorkerEnded {
        /// The error the worker raised, if it failed.
        failure: Option<String>,
    },
    /// The kernel died (its server is restarting it).
    KernelDied,
    /// The kernel asked for input that is not the worker's (a cell called `input()`).
    ForeignInput,
    /// The worker sent more frames without a break than it can (a broken or hostile worker).
    Flood {
        /// Bytes pending.
        pending: usize,
        /// The frame limit.
        max_frame: usize,
    },
    /// The WebSocket to the server was lost and could not be opened again.
    SocketLost {
        /// What the socket said.
        cause: String,
        /// Why it could not be reopened: `None` when it had been reopened once already.
        reopen_failed: Option<String>,
        /// The largest message sent, in bytes (a server closes on one past its limit).
        largest_sent: usize,
    },
    /// The bootstrap request could not be sent.
    Bootstrap(String),
    /// Writing to the local socket failed.
    LocalSocket(String),
    /// A frame the bridge makes could not be encoded.
    Frame(String),
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::HostClosed => f.write_str("the runtime closed the link"),
            End::ReleaseTimedOut => {
                f.write_str("the runtime let the kernel go (the worker did not stop in time)")
            }
            End::WorkerEnded { failure: None } => {
                f.write_str("the worker in the Jupyter kernel stopped")
            }
            End::WorkerEnded {
                failure: Some(failure),
            } => write!(f, "the worker in the Jupyter kernel failed: {failure}"),
            End::KernelDied => f.write_str("the Jupyter kernel died (the server is restarting it)"),
            End::ForeignInput => f.write_str(
                "the kernel asked for input the runtime does not understand (a cell called input()?)",
            ),
            End::Flood { pending, max_frame } => write!(
                f,
                "the kernel sent {pending} bytes of frames without a break, over twice the frame limit ({max_frame} bytes): a protocol violation"
            ),
            End::SocketLost {
                cause,
                reopen_failed: None,
                largest_sent,
            } => write!(
                f,
                "the WebSocket to the Jupyter server was lost again ({cause}); it had been reopened once already{}",
                size_hint(*largest_sent)
            ),
            End::SocketLost {
                cause,
                reopen_failed: Some(why),
                ..
            } => write!(
                f,
                "the WebSocket to the Jupyter server was lost ({cause}) and could not be reopened: {why}"
            ),
            End::Bootstrap(why) => write!(f, "the bootstrap request could not be sent: {why}"),
            End::LocalSocket(why) => write!(f, "the local socket: {why}"),
            End::Frame(why) => f.write_str(why),
        }
    }
}

/// The last answer sent, kept to be sent again: after a lost WebSocket it may not have reached
/// the kernel, which would then wait for it forever.
struct Answered {
    seq: u64,
    request: JupyterMessage,
    answer: String,
}

/// Frames the worker sent, held until the output they follow has arrived.
struct Held {
    data: Vec<u8>,
    published: HashMap<u64, usize>,
    deadline: Instant,
}

/// The state of the exchange with the worker in the kernel.
pub(super) struct Bridge {
    max_frame: usize,
    /// How long a prompt is left unanswered before an empty answer.
    heartbeat: Duration,
    /// Started by the runtime (closing the link ends it) or attached to (let go gracefully).
    owned: bool,
    /// The id of the execute request the worker runs in.
    bootstrap_id: String,
    /// The worker's request for its sources, until the host has sent a whole frame.
    sources: Option<JupyterMessage>,
    /// Host frames waiting for the next answer.
    outgoing: Vec<u8>,
    /// The worker's frames of an exchange that has more chunks to come.
    incoming: Vec<u8>,
    /// The open prompt, and its number.
    waiting: Option<(JupyterMessage, Option<u64>)>,
    /// When the open prompt is answered empty if nothing else goes first.
    heartbeat_at: Instant,
    /// The worker has frames its open prompt does not carry (a thread's host call sent while
    /// another thread waited for the answer): the prompt is answered at once, so that the
    /// next one brings them.
    woken: bool,
    /// The number of the last prompt taken.
    last_seq: Option<u64>,
    answered: Option<Answered>,
    held: Option<Held>,
    /// Characters of output received on IOPub, per execution.
    received: HashMap<u64, usize>,
    /// The execution whose tagged output came last.
    last_tagged: Option<u64>,
    /// The executions the last delivered prompt counted.
    counted: HashSet<u64>,
    /// The error the bootstrap request raised, if any.
    failure: Option<String>,
    /// Set when the runtime let go of a kernel it attached to: the worker is told to stop
    /// (so the kernel is left idle, with its namespace) until then.
    releasing: Option<Instant>,
    to_kernel: Vec<JupyterMessage>,
    to_host: Vec<u8>,
}

impl Bridge {
    /// A bridge for the worker that runs in execute request `bootstrap_id`.
    pub(super) fn new(
        bootstrap_id: String,
        owned: bool,
        max_frame: usize,
        heartbeat: Duration,
        now: Instant,
    ) -> Self {
        Self {
            max_frame,
            heartbeat,
            owned,
            bootstrap_id,
            sources: None,
            outgoing: Vec::new(),
            incoming: Vec::new(),
            waiting: None,
            heartbeat_at: now,
            woken: false,
            last_seq: None,
            answered: None,
            held: None,
            received: HashMap::new(),
            last_tagged: None,
            counted: HashSet::new(),
            failure: None,
            releasing: None,
            to_kernel: Vec::new(),
            to_host: Vec::new(),
        }
    }

    /// Messages to send to the kernel, in order.
    pub(super) fn take_for_kernel(&mut self) -> Vec<JupyterMessage> {
        std::mem::take(&mut self.to_kernel)
    }

    /// Bytes (whole frames) to write to the host's socket.
    pub(super) fn take_for_host(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.to_host)
    }

    /// Bytes of the worker's frames the bridge holds (taken from the kernel, not yet written
    /// to the host): a cell's end held behind its output is not a cell still running.
    pub(super) fn holding(&self) -> usize {
        self.incoming.len() + self.held.as_ref().map_or(0, |h| h.data.len()) + self.to_host.len()
    }

    /// Whether the host's end is still read (not once the runtime let the kernel go).
    pub(super) fn reads_host(&self) -> bool {
        self.releasing.is_none()
    }

    /// The next time [`tick`](Self::tick) has something to do.
    pub(super) fn deadline(&self) -> Option<Instant> {
        [
            self.held.as_ref().map(|h| h.deadline),
            self.releasing,
            self.waiting.as_ref().map(|_| self.heartbeat_at),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The last answer, to send again after the WebSocket was reopened with nothing unsent:
    /// it may have been lost with the socket, and the worker waits for it (a copy that did
    /// arrive twice is told apart by its number).
    pub(super) fn last_answer_again(&self) -> Option<JupyterMessage> {
        let last = self.answered.as_ref()?;
        (self.last_seq == Some(last.seq)).then(|| reply_to(&last.request, last.answer.clone()))
    }

    /// Bytes the host wrote.
    pub(super) fn host_wrote(&mut self, bytes: &[u8]) {
        self.outgoing.extend_from_slice(bytes);
        self.answer_sources();
    }

    /// The host closed its end: a kernel the runtime started ends with it; one it attached to
    /// is told to stop its worker, and let go once it has (or after a grace).
    pub(super) fn host_closed(&mut self, now: Instant) -> Result<(), End> {
        if self.owned || self.sources.is_some() {
            return Err(End::HostClosed);
        }
        // A frame cut short by the end goes no further.
        let mut whole = 0;
        while let Some(n) = frame_len(&self.outgoing[whole..]) {
            if self.outgoing.len() - whole < n {
                break;
            }
            whole += n;
        }
        self.outgoing.truncate(whole);
        let stop = Data::Owned(Value::Tuple(vec!["stop".into(), Value::Int(0)]));
        let stop = framed(&stop, self.max_frame).map_err(|e| End::Frame(e.to_string()))?;
        self.outgoing.extend_from_slice(&stop);
        self.releasing = Some(now + RELEASE_GRACE);
        Ok(())
    }

    /// Time passed: held frames whose output arrived (or waited long enough) go to the host,
    /// an open prompt is answered with the host's frames or a heartbeat.
    pub(super) fn tick(&mut self, now: Instant) -> Result<(), End> {
        if self.releasing.is_some_and(|until| now >= until) {
            return Err(End::ReleaseTimedOut);
        }
        self.deliver_held(now)?;
        if self.waiting.is_some()
            && (self.woken || !self.outgoing.is_empty() || now >= self.heartbeat_at)
        {
            self.woken = false;
            let (request, seq) = self.waiting.take().expect("waiting");
            let n = self.outgoing.len().min(CHUNK);
            let more = self.outgoing.len() > n;
            let text = answer(&self.outgoing[..n], more, seq);
            self.outgoing.drain(..n);
            self.to_kernel.push(reply_to(&request, text.clone()));
            self.answered = seq.map(|seq| Answered {
                seq,
                request,
                answer: text,
            });
        }
        Ok(())
    }

    /// A message from the kernel.
    pub(super) fn kernel_sent(&mut self, message: JupyterMessage, now: Instant) -> Result<(), End> {
        let from_bootstrap = message
            .parent_header
            .as_ref()
            .is_some_and(|p| p.msg_id == self.bootstrap_id);
        match &message.content {
            JupyterMessageContent::InputRequest(request) => {
                let prompt = request.prompt.clone();
                self.prompt(message, &prompt, now)
            }
            JupyterMessageContent::StreamContent(_) if message.metadata["cave_wake"] == true => {
                self.woken = true;
                Ok(())
            }
            JupyterMessageContent::StreamContent(stream) => {
                let tagged = message.metadata["cave_execution"].as_u64();
                self.stream(tagged, &stream.text)
            }
            JupyterMessageContent::ErrorOutput(error) if from_bootstrap => {
                self.failure = Some(format!("{}: {}", error.ename, error.evalue));
                Ok(())
            }
            JupyterMessageContent::ExecuteReply(_) if from_bootstrap => Err(End::WorkerEnded {
                failure: self.failure.take(),
            }),
            JupyterMessageContent::Status(status) => match status.execution_state {
                ExecutionState::Restarting
                | ExecutionState::AutoRestarting
                | ExecutionState::Dead => Err(End::KernelDied),
                _ => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// The worker's `input_request`: its sources request, or an exchange of frames.
    fn prompt(&mut self, message: JupyterMessage, prompt: &str, now: Instant) -> Result<(), End> {
        if prompt.strip_prefix(MARK) == Some("sources") {
            // The sources frame is the first thing the runtime sends.
            self.sources = Some(message);
            self.answer_sources();
            return Ok(());
        }
        let Some(prompt) = read_prompt(prompt) else {
            return Err(End::ForeignInput);
        };
        if let (Some(seq), Some(last)) = (prompt.seq, self.last_seq)
            && seq <= last
        {
            // A prompt taken already: the worker asks again (it got a copy of an earlier
            // answer), or the server replayed it. Its frames are not taken twice; its answer,
            // if sent, is sent again.
            if seq == last {
                match &self.answered {
                    Some(done) if done.seq == seq => {
                        self.to_kernel.push(reply_to(&message, done.answer.clone()));
                    }
                    _ => self.wait_on(message, prompt.seq, now),
                }
            }
            return Ok(());
        }
        self.last_seq = prompt.seq.or(self.last_seq);
        self.incoming.extend_from_slice(&prompt.data);
        // The worker sends a frame or two per exchange, each within the frame limit: more is a
        // broken (or hostile) worker, not data to keep.
        let pending = self.incoming.len() + self.held.as_ref().map_or(0, |h| h.data.len());
        if pending > 2 * (self.max_frame + 4) {
            return Err(End::Flood {
                pending,
                max_frame: self.max_frame,
            });
        }
        if prompt.more || prompt.last || prompt.now {
            // A chunk of more to come, the worker's last words, or frames that must go before
            // what the cell writes next: acknowledged at once.
            let text = answer(&[], false, prompt.seq);
            self.to_kernel.push(reply_to(&message, text.clone()));
            self.answered = prompt.seq.map(|seq| Answered {
                seq,
                request: message,
                answer: text,
            });
        } else {
            self.wait_on(message, prompt.seq, now);
        }
        if !prompt.more {
            let data = std::mem::take(&mut self.incoming);
            match self.held.as_mut() {
                // Still waiting for earlier output: later frames queue behind, and wait for
                // every count either prompt gave (an execution that ended between the two is
                // in the first prompt's counts only).
                Some(held) => {
                    held.data.extend_from_slice(&data);
                    for (id, n) in prompt.published {
                        let count = held.published.entry(id).or_insert(0);
                        *count = (*count).max(n);
                    }
                }
                None => {
                    self.held = Some(Held {
                        data,
                        published: prompt.published,
                        deadline: now + OUTPUT_GRACE,
                    })
                }
            }
        }
        Ok(())
    }

    /// Keeps `request` open until the host has frames or a heartbeat is due.
    fn wait_on(&mut self, request: JupyterMessage, seq: Option<u64>, now: Instant) {
        self.waiting = Some((request, seq));
        self.heartbeat_at = now + self.heartbeat;
    }

    /// Answers the worker's sources request once the host's first frame is whole.
    fn answer_sources(&mut self) {
        let Some(n) = frame_len(&self.outgoing).filter(|&n| self.outgoing.len() >= n) else {
            return;
        };
        let Some(request) = self.sources.take() else {
            return;
        };
        self.to_kernel
            .push(reply_to(&request, answer(&self.outgoing[..n], false, None)));
        self.outgoing.drain(..n);
    }

    /// Output a cell printed, published on IOPub: passed on as the worker's `out` frame.
    fn stream(&mut self, tagged: Option<u64>, text: &str) -> Result<(), End> {
        // Untagged output is the server's own (its rate-limit notice): it belongs where it
        // broke in, the execution whose output came last.
        if tagged.is_some() {
            self.last_tagged = tagged;
        }
        let execution = tagged.or(self.last_tagged);
        // Bounded: a cell may tag stream messages with any ids it likes.
        if let Some(id) = tagged
            && (self.received.len() < MAX_COUNTED || self.received.contains_key(&id))
        {
            *self.received.entry(id).or_insert(0) += text.chars().count();
        }
        if self.releasing.is_none() {
            let frame = output_frame(execution.unwrap_or(0), text.to_owned(), self.max_frame)?;
            self.to_host.extend_from_slice(&frame);
        }
        Ok(())
    }

    /// Held frames go to the host once the output they follow has arrived, or its grace ran
    /// out (then the cell's output says what is missing, before the frames that end it).
    fn deliver_held(&mut self, now: Instant) -> Result<(), End> {
        let Some(held) = &self.held else {
            return Ok(());
        };
        let caught_up = held
            .published
            .iter()
            .all(|(id, n)| self.received.get(id).copied().unwrap_or(0) >= *n);
        if !caught_up && now < held.deadline {
            return Ok(());
        }
        let held = self.held.take().expect("held");
        if !caught_up && self.releasing.is_none() {
            for (id, published) in &held.published {
                let got = self.received.get(id).copied().unwrap_or(0);
                // Bounded as the counts are: the ids come from the kernel.
                if got < *published
                    && (self.received.len() < MAX_COUNTED || self.received.contains_key(id))
                {
                    tracing::warn!(
                        execution = id,
                        missing = published - got,
                        "output published on IOPub did not arrive"
                    );
                    let note =
                        output_frame(*id, lost_output_note(published - got), self.max_frame)?;
                    self.to_host.extend_from_slice(&note);
                    // Said once: what arrives late is passed on, not said again.
                    self.received.insert(*id, *published);
                }
            }
        }
        // Executions the worker no longer counts have ended: forget theirs.
        let counted = &self.counted;
        self.received
            .retain(|id, _| held.published.contains_key(id) || !counted.contains(id));
        self.counted = held.published.keys().copied().collect();
        if self.releasing.is_none() {
            self.to_host.extend_from_slice(&held.data);
        }
        Ok(())
    }
}

/// An `out` frame of execution `id`.
fn output_frame(id: u64, text: String, max_frame: usize) -> Result<Vec<u8>, End> {
    let message = Data::Owned(Value::Tuple(vec![
        "out".into(),
        Value::Int(id.into()),
        Value::Str(text),
    ]));
    framed(&message, max_frame).map_err(|e| End::Frame(e.to_string()))
}

/// The worker's side of one exchange, read from its prompt.
pub(super) struct Prompt {
    /// The prompt's number, echoed in the answer.
    pub(super) seq: Option<u64>,
    pub(super) more: bool,
    pub(super) last: bool,
    /// Answer at once (the worker must not wait for frames of the host's).
    pub(super) now: bool,
    /// Characters of each execution's output published on IOPub so far.
    pub(super) published: HashMap<u64, usize>,
    pub(super) data: Vec<u8>,
}

/// Reads one of the worker's prompts; `None` for any other text.
pub(super) fn read_prompt(prompt: &str) -> Option<Prompt> {
    let rest = prompt.strip_prefix(MARK)?;
    let (header, data) = rest.split_once('\n')?;
    let header: serde_json::Value = serde_json::from_str(header).ok()?;
    let data = base64::engine::general_purpose::STANDARD
        .decode(data)
        .ok()?;
    let published = header["out"]
        .as_object()
        .map(|out| {
            out.iter()
                .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_u64()? as usize)))
                .collect()
        })
        .unwrap_or_default();
    Some(Prompt {
        seq: header["seq"].as_u64(),
        more: header["more"].as_bool().unwrap_or(false),
        last: header["final"].as_bool().unwrap_or(false),
        now: header["now"].as_bool().unwrap_or(false),
        published,
        data,
    })
}

/// An answer carrying `data`, to the prompt numbered `seq`.
pub(super) fn answer(data: &[u8], more: bool, seq: Option<u64>) -> String {
    let header = match seq {
        Some(seq) => serde_json::json!({ "more": more, "seq": seq }),
        None => serde_json::json!({ "more": more }),
    };
    format!(
        "{MARK}{header}\n{}",
        base64::engine::general_purpose::STANDARD.encode(data)
    )
}

/// What a cell's output says when part of it never came from the server.
fn lost_output_note(missing: usize) -> String {
    format!(
        "\n[{missing} characters of this cell's output did not arrive from the Jupyter server within {} s: \
         servers drop IOPub output past their rate limit (iopub_data_rate_limit, 1 MB/s by default). \
         Print less, or write large output to a file and read parts of it.]\n",
        OUTPUT_GRACE.as_secs()
    )
}

/// What to say about a connection lost after a large message.
pub(super) fn size_hint(largest: usize) -> String {
    if largest < 1 << 20 {
        return String::new();
    }
    format!(
        "; the largest message sent was {:.1} MiB: a server whose WebSocket message limit is lower closes the connection (Jupyter Server's default is 10 MiB; the runtime sends at most {} MiB of frames, base64, per message)",
        largest as f64 / 1048576.0,
        CHUNK >> 20
    )
}

/// The size of a message's answer, the part that grows with the frames it carries.
pub(super) fn message_size(message: &JupyterMessage) -> usize {
    match &message.content {
        JupyterMessageContent::InputReply(reply) => reply.value.len(),
        JupyterMessageContent::ExecuteRequest(request) => request.code.len(),
        _ => 0,
    }
}

/// The length of the first frame in `bytes`, once its header is there.
pub(super) fn frame_len(bytes: &[u8]) -> Option<usize> {
    let header: [u8; 4] = bytes.get(..4)?.try_into().ok()?;
    Some(4 + u32::from_be_bytes(header) as usize)
}

fn reply_to(request: &JupyterMessage, value: String) -> JupyterMessage {
    JupyterMessage::new(
        InputReply {
            value,
            ..InputReply::default()
        },
        Some(request),
    )
    .with_channel(Channel::Stdin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jupyter_protocol::{ErrorOutput, ExecuteReply, ExecuteRequest, Status, StreamContent};

    const HEARTBEAT: Duration = Duration::from_secs(30);
    const MAX_FRAME: usize = 1 << 20;

    /// The execute request the worker runs in, and a bridge for it.
    fn bridge(owned: bool, now: Instant) -> (Bridge, JupyterMessage) {
        let bootstrap = JupyterMessage::new(ExecuteRequest::new("worker".into()), None);
        let bridge = Bridge::new(
            bootstrap.header.msg_id.clone(),
            owned,
            MAX_FRAME,
            HEARTBEAT,
            now,
        );
        (bridge, bootstrap)
    }

    /// A frame carrying `text` (its length, then the bytes; the bridge does not decode them).
    fn frame(text: &str) -> Vec<u8> {
        let mut frame = (text.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(text.as_bytes());
        frame
    }

    /// The worker's prompt numbered `seq`, carrying `data`, counting `out` characters of
    /// output per execution.
    fn prompt(seq: u64, more: bool, out: serde_json::Value, data: &[u8]) -> JupyterMessage {
        let header = serde_json::json!({"seq": seq, "more": more, "final": false, "out": out});
        let text = format!(
            "{MARK}{header}\n{}",
            base64::engine::general_purpose::STANDARD.encode(data)
        );
        input_request(text)
    }

    fn input_request(prompt: String) -> JupyterMessage {
        JupyterMessage::new(
            jupyter_protocol::InputRequest {
                prompt,
                password: false,
            },
            None,
        )
    }

    /// The frames an answer carries, and its header.
    fn answered(message: &JupyterMessage) -> (serde_json::Value, Vec<u8>) {
        let JupyterMessageContent::InputReply(reply) = &message.content else {
            panic!("not an answer: {message:?}");
        };
        let rest = reply.value.strip_prefix(MARK).expect("marked");
        let (header, data) = rest.split_once('\n').expect("two parts");
        let data = base64::engine::general_purpose::STANDARD
            .decode(data)
            .expect("base64");
        (serde_json::from_str(header).expect("json"), data)
    }

    fn stream(execution: Option<u64>, text: &str) -> JupyterMessage {
        let mut message = JupyterMessage::new(StreamContent::stdout(text), None);
        if let Some(id) = execution {
            message.metadata = serde_json::json!({ "cave_execution": id });
        }
        message
    }

    #[test]
    fn the_sources_request_is_answered_with_the_first_whole_frame_only() {
        let now = Instant::now();
        let (mut bridge, _) = bridge(true, now);
        bridge
            .kernel_sent(input_request(format!("{MARK}sources")), now)
            .unwrap();
        assert!(bridge.take_for_kernel().is_empty(), "nothing to send yet");
        let sources = frame("sources");
        bridge.host_wrote(&sources[..5]);
        assert!(bridge.take_for_kernel().is_empty(), "a partial frame waits");
        let mut rest = sources[5..].to_vec();
        rest.extend(frame("next"));
        bridge.host_wrote(&rest);
        let sent = bridge.take_for_kernel();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].header.msg_type, "input_reply");
        assert_eq!(answered(&sent[0]).1, sources);
        // The next frame goes with the next answer.
        bridge
            .kernel_sent(prompt(1, false, serde_json::json!({}), &[]), now)
            .unwrap();
        bridge.tick(now).unwrap();
        let sent = bridge.take_for_kernel();
        assert_eq!(answered(&sent[0]).1, frame("next"));
    }

    #[test]
    fn a_prompt_delivers_the_workers_frames_and_is_answered_with_the_hosts() {
        let now = Instant::now();
        let (mut bridge, _) = bridge(true, now);
        let reply = frame("reply");
        bridge
            .kernel_sent(prompt(1, false, serde_json::json!({}), &reply), now)
            .unwrap();
        bridge.tick(now).unwrap();
        assert_eq!(bridge.take_for_host(), reply, "no output to wait for");
        assert!(
            bridge.take_for_kernel().is_empty(),
            "the prompt waits for the host"
        );
        bridge.host_wrote(&frame("request"));
        bridge.tick(now).unwrap();
        let sent = bridge.take_for_kernel();
        let (header, data) = answered(&sent[0]);
        assert_eq!(header, serde_json::json!({"more": false, "seq": 1}));
        assert_eq!(data, frame("request"));
    }

    #[test]
    fn a_chunk_with_more_to_come_is_acknowledged_and_joined_to_the_next() {
        let now = Instant::now();
        let (mut bridge, _) = bridge(true, now);
        let whole = frame("a frame in two chunks");
        bridge
            .kernel_sent(prompt(1, true, serde_json::json!({}), &whole[..6]), now)
            .unwrap();
        let sent = bridge.take_for_kernel();
        assert_eq!(answered(&sent[0]).0["seq"], 1, "acknowledged at once");
        bridge.tick(now).unwrap();
        assert!(
            bridge.take_for_host().is_empty(),
            "half a frame is not delivered"
        );
        bridge
            .kernel_sent(prompt(2, false, serde_json::json!({}), &whole[6..]), now)
            .unwrap();
        bridge.tick(now).unwrap();
        assert_eq!(bridge.take_for_host(), whole);
    }

    #[test]
    fn a_prompt_that_asks_to_be_answered_now_is_acknowledged_at_once() {
        let now = Instant::now();
        let (mut bridge, _) = bridge(true, now);
        let header = serde_json::json!({"seq": 1, "more": false, "now": true, "out": {}});
        let item = frame("display");
        let text = format!(
            "{MARK}{header}\n{}",
            base64::engine::general_purpose::STANDARD.encode(&item)
        );
        bridge.kernel_sent(input_request(text), now).unwrap();
        let sent = bridge.take_for_kernel();
        assert_eq!(sent.len(), 1, "answered without waiting for the host");
        assert_eq!(answered(&sent[0]).1, Vec::<u8>::new());
        bridge.tick(now).unwrap();
        assert_eq!(bridge.take_for_host(), item, "and its frames delivered");
    }

    #[test]
    fn frames_wait_for_every_count_their_prompts_gave() {
        let now = Instant::now();
        let (mut bridge, _) = bridge(true, now);
        // The first prompt counts execution 7's output; by the second, 7 has ended and is
        // no longer counted. The frames of both wait for 7's output all the same.
        bridge
            .kernel_sent(
                prompt(1, false, serde_json::json!({"7": 4}), &frame("call")),
                now,
            )
            .unwrap();
        bridge.tick(now).unwrap();
        bridge
            .kernel_sent(prompt(2, false, serde_json::json!({}), &frame("done")), now)
            .unwrap();
        bridge.tick(now).unwrap();
        assert!(bridge.take_for_host().is_empty(), "held for 7's output");
        bridge.kernel_sent(stream(Some(7), "True"), now).unwrap();
        bridge.tick(now).unwrap();
        let delivered = String::from_utf8_lossy(&bridge.take_for_host()).into_owned();
        let (output, done) = (delivered.find("True"), delivered.find("done"));
        assert!(
            matches!((output, done), (Some(o), Some(d)) if o < d),
            "the output comes before the frames: {delivered:?}"
        );
    }

    #[test]
    fn a_wake_answers_the_open_prompt_at_once() {
        let now = Instant::now();
        let (mut bridge, _) = bridge(true, now);
        bridge
            .kernel_sent(prompt(1, false, serde_json::json!({}), &[]), now)
            .unwrap();
        bridge.tick(now).unwrap();
        assert!(bridge.take_for_kernel().is_empty(), "waits for the host");
        let mut wake = stream(None, "");
        wake.metadata = serde_json::json!({ "cave_wake": true });
        bridge.kernel_sent(wake, now).unwrap();
        bridge.tick(now).unwrap();
        let sent = bridge.take_for_kernel();
        assert_eq!(sent.len(), 1, "answered at once");
        assert_eq!(answered(&sent[0]).1, Vec::<u8>::new());
        assert!(bridge.take_for_host().is_empty(), "a wake is not output");
        // The next prompt waits again.
        bridge
            .kernel_sent(prompt(2, false, serde_json::json!({}), &[]), now)
            .unwrap();
        bridge.tick(now).unwrap();
        assert!(bridge.take_for_kernel().is_empty());
    }

    #[test]
    fn frames_wait_for_their_output_then_say_what_never_came() {
        let now = Instant::now();
        let (mut bridge, _) = bridge(true, now);
        let done = frame("done");
        bridge
            .kernel_sent(prompt(1, false, serde_json::json!({"7": 10}), &done), now)
            .unwrap();
        bridge.tick(now).unwrap();
        assert!(
            bridge.take_for_host().is_empty(),
            "held for the output it follows"
        );
        bridge.kernel_sent(stream(Some(7), "hello"), now).unwrap();
        let output = bridge.take_for_host();
        assert!(
            output.windows(5).any(|w| w == b"hello"),
            "output is passed on at once"
        );
        bridge.tick(now + OUTPUT_GRACE / 2).unwrap();
        assert!(bridge.take_for_host().is_empty(), "still within the grace");
        bridge.tick(now + OUTPUT_GRACE).unwrap();
        let late = String::from_utf8_lossy(&bridge.take_for_host()).into_owned();
        let note = late.find("5 characters of this cell's output did not arrive");
        let frames = late.find("done");
        assert!(
            matches!((note, frames), (Some(n), Some(f)) if n < f),
            "the note comes before the frames that end the cell: {late:?}"
        );
    }

    #[test]
    fn output_that_arrives_in_time_releases_the_frames_without_a_note() {
        let now = Instant::now();
        let (mut bridge, _) = bridge(true, now);
        bridge
            .kernel_sent(
                prompt(1, false, serde_json::json!({"3": 2}), &frame("done")),
                now,
            )
            .unwrap();
        bridge.kernel_sent(stream(Some(3), "ok"), now).unwrap();
        bridge.tick(now).unwrap();
        let delivered = String::from_utf8_lossy(&bridge.take_for_host()).into_owned();
        assert!(
            delivered.contains("ok") && delivered.contains("done"),
            "{delivered:?}"
        );
        assert!(!delivered.contains("did not arrive"), "{delivered:?}");
    }

    #[test]
    fn untagged_output_belongs_to_the_execution_whose_output_came_last() {
        let now = Instant::now();
        let (mut bridge, _) = bridge(true, now);
        bridge.kernel_sent(stream(Some(9), "a"), now).unwrap();
        bridge.take_for_host();
        bridge
            .kernel_sent(stream(None, "server notice"), now)
            .unwrap();
        let frame = bridge.take_for_host();
        let (value, _) = crate::marshal::decode(&frame[4..]).expect("a frame");
        assert_eq!(
            value,
            Value::Tuple(vec!["out".into(), Value::Int(9), "server notice".into()])
        );
    }

    #[test]
    fn a_prompt_seen_again_is_answered_again_and_its_frames_not_taken_twice() {
        let now = Instant::now();
        let (mut bridge, _) = bridge(true, now);
        let data = frame("once");
        let first = prompt(4, false, serde_json::json!({}), &data);
        bridge.kernel_sent(first.clone(), now).unwrap();
        bridge.host_wrote(&frame("answer"));
        bridge.tick(now).unwrap();
        let answer = bridge.take_for_kernel();
        assert_eq!(bridge.take_for_host(), data);
        bridge.kernel_sent(first, now).unwrap();
        bridge.tick(now).unwrap();
        let again = bridge.take_for_kernel();
        assert_eq!(again.len(), 1);
        assert_eq!(answered(&again[0]), answered(&answer[0]));
        assert!(
            bridge.take_for_host().is_empty(),
            "the frames were taken once"
        );
        // An older prompt (a replay) is dropped.
        bridge
            .kernel_sent(prompt(2, false, serde_json::json!({}), &frame("old")), now)
            .unwrap();
        bridge.tick(now).unwrap();
        assert!(bridge.take_for_kernel().is_empty() && bridge.take_for_host().is_empty());
        // After a reopened socket with nothing unsent, the last answer goes again.
        let repeated = bridge.last_answer_again().expect("an answer to repeat");
        assert_eq!(answered(&repeated), answered(&answer[0]));
    }

    #[test]
    fn an_idle_prompt_gets_an_empty_answer_when_a_heartbeat_is_due() {
        let now = Instant::now();
        let (mut bridge, _) = bridge(true, now);
        bridge
            .kernel_sent(prompt(1, false, serde_json::json!({}), &[]), now)
            .unwrap();
        bridge.tick(now).unwrap();
        assert_eq!(bridge.deadline(), Some(now + HEARTBEAT));
        bridge.tick(now + HEARTBEAT / 2).unwrap();
        assert!(bridge.take_for_kernel().is_empty());
        bridge.tick(now + HEARTBEAT).unwrap();
        let sent = bridge.take_for_kernel();
        assert_eq!(answered(&sent[0]).1, Vec::<u8>::new());
        assert_eq!(bridge.deadline(), None, "nothing left to wait for");
    }

    #[test]
    fn an_answer_carries_at_most_a_chunk_of_frames() {
        let now = Instant::now();
        let (mut bridge, _) = bridge(true, now);
        bridge
            .kernel_sent(prompt(1, false, serde_json::json!({}), &[]), now)
            .unwrap();
        bridge.host_wrote(&vec![0; CHUNK + 10]);
        bridge.tick(now).unwrap();
        let (header, data) = answered(&bridge.take_for_kernel()[0]);
        assert_eq!(header["more"], true);
        assert_eq!(data.len(), CHUNK);
    }

    #[test]
    fn closing_the_host_end_ends_a_started_kernel_and_lets_an_attached_one_stop() {
        let now = Instant::now();
        let (mut owned, _) = bridge(true, now);
        assert_eq!(owned.host_closed(now), Err(End::HostClosed));

        let (mut attached, _) = bridge(false, now);
        let whole = frame("whole");
        attached.host_wrote(&whole);
        attached.host_wrote(&frame("cut short")[..3]);
        attached.host_closed(now).unwrap();
        assert!(!attached.reads_host());
        attached
            .kernel_sent(prompt(1, false, serde_json::json!({}), &[]), now)
            .unwrap();
        attached.tick(now).unwrap();
        let (_, data) = answered(&attached.take_for_kernel()[0]);
        let stop = framed(
            &Data::Owned(Value::Tuple(vec!["stop".into(), Value::Int(0)])),
            MAX_FRAME,
        )
        .unwrap();
        assert_eq!(data, [whole, stop].concat(), "whole frames, then stop");
        assert_eq!(
            attached.tick(now + RELEASE_GRACE),
            Err(End::ReleaseTimedOut)
        );
    }

    #[test]
    fn how_the_link_ends_is_typed_and_said() {
        let now = Instant::now();
        let (mut b, bootstrap) = bridge(true, now);
        let error = ErrorOutput {
            ename: "ImportError".into(),
            evalue: "no cave_kernel".into(),
            traceback: Vec::new(),
        };
        b.kernel_sent(JupyterMessage::new(error, Some(&bootstrap)), now)
            .unwrap();
        let end = b
            .kernel_sent(
                JupyterMessage::new(ExecuteReply::default(), Some(&bootstrap)),
                now,
            )
            .unwrap_err();
        assert_eq!(
            end.to_string(),
            "the worker in the Jupyter kernel failed: ImportError: no cave_kernel"
        );
        // Another request's reply is not the worker's.
        let (mut b, _) = bridge(true, now);
        b.kernel_sent(JupyterMessage::new(ExecuteReply::default(), None), now)
            .unwrap();
        let dead = Status {
            execution_state: ExecutionState::Dead,
        };
        assert_eq!(
            b.kernel_sent(JupyterMessage::new(dead, None), now),
            Err(End::KernelDied)
        );
        let (mut b, _) = bridge(true, now);
        assert_eq!(
            b.kernel_sent(input_request("Your name? ".into()), now),
            Err(End::ForeignInput)
        );
        let (mut b, _) = bridge(true, now);
        let flood = vec![0u8; 2 * (MAX_FRAME + 4) + 1];
        assert!(matches!(
            b.kernel_sent(prompt(1, true, serde_json::json!({}), &flood), now),
            Err(End::Flood { .. })
        ));
        let lost = End::SocketLost {
            cause: "closed".into(),
            reopen_failed: None,
            largest_sent: 5 << 20,
        };
        assert!(
            lost.to_string()
                .contains("reopened once already; the largest message sent was 5.0 MiB")
        );
    }

    /// Messages a server could send, read as the WebSocket client reads them (JSON, then
    /// `JupyterMessage::from_value`) and then by the bridge (the runtime's prompts, the tags of
    /// stream output): each ends in a value or an error (`cargo xtask fuzz` runs a million).
    #[test]
    fn fuzz_messages_from_the_server() {
        let prompt = format!(
            "{MARK}{}\n{}",
            serde_json::json!({"seq": 3, "more": true, "final": false, "out": {"7": 12, "8": 0}}),
            base64::engine::general_purpose::STANDARD.encode(b"\x00\x00\x00\x02hi")
        );
        let request = JupyterMessage::new(
            jupyter_protocol::InputRequest {
                prompt: prompt.clone(),
                password: false,
            },
            None,
        );
        let mut stream =
            JupyterMessage::new(jupyter_protocol::StreamContent::stdout("tick\n"), None);
        stream.metadata = serde_json::json!({"cave_execution": 7});
        let seeds: Vec<Vec<u8>> = [&request, &stream]
            .iter()
            .map(|m| serde_json::to_vec(m).unwrap())
            .chain([prompt.into_bytes()])
            .collect();
        cave_testing::fuzz::soak("jupyter-messages", &seeds, |input| {
            if let Some(prompt) = read_prompt(&String::from_utf8_lossy(input)) {
                let _ = frame_len(&prompt.data);
            }
            let Ok(value) = serde_json::from_slice::<serde_json::Value>(input) else {
                return;
            };
            let Ok(message) = JupyterMessage::from_value(value) else {
                return;
            };
            let _ = message_size(&message);
            // The whole state machine, on whatever the server sends.
            let mut bridge = Bridge::new("boot".into(), false, 1 << 10, HEARTBEAT, Instant::now());
            let _ = bridge.kernel_sent(message.clone(), Instant::now());
            let _ = bridge.tick(Instant::now() + OUTPUT_GRACE);
            match &message.content {
                JupyterMessageContent::InputRequest(request) => {
                    if let Some(prompt) = read_prompt(&request.prompt) {
                        let _ = frame_len(&prompt.data);
                        let _ = answer(&prompt.data, prompt.more, prompt.seq);
                    }
                }
                JupyterMessageContent::StreamContent(stream) => {
                    let _ = (
                        message.metadata["cave_execution"].as_u64(),
                        stream.text.chars().count(),
                    );
                }
                _ => {}
            }
        });
    }

    #[test]
    fn prompts_and_answers_carry_frames_and_counts() {
        let prompt = format!(
            "{MARK}{}\n{}",
            serde_json::json!({"seq": 3, "more": false, "final": false, "out": {"7": 12}}),
            base64::engine::general_purpose::STANDARD.encode(b"\x00\x00\x00\x02hi")
        );
        let read = read_prompt(&prompt).expect("a prompt");
        assert!(!read.more && !read.last);
        assert_eq!(read.seq, Some(3));
        assert_eq!(read.published.get(&7), Some(&12));
        assert_eq!(read.data, b"\x00\x00\x00\x02hi");
        assert_eq!(frame_len(&read.data), Some(6));
        assert_eq!(frame_len(b"\x00\x00"), None);
        // What a cell's own input() would send is not a prompt of the runtime.
        assert!(read_prompt("Your name? ").is_none());
        let answered = answer(b"xyz", true, Some(3));
        assert!(answered.starts_with(MARK));
        let (header, data) = answered[MARK.len()..].split_once('\n').expect("two parts");
        assert_eq!(header, r#"{"more":true,"seq":3}"#);
        assert!(answer(b"", false, None).contains(r#"{"more":false}"#));
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .unwrap(),
            b"xyz"
        );
    }

    #[test]
    fn a_loss_after_a_large_message_names_the_size_limit() {
        assert_eq!(size_hint(1000), "");
        let hint = size_hint(5 << 20);
        assert!(
            hint.contains("5.0 MiB") && hint.contains("10 MiB"),
            "{hint}"
        );
    }
}

//! A real HTTP/1.1 server on 127.0.0.1 that speaks server-sent events like an OpenAI-compatible
//! chat-completions endpoint, and injects scripted faults: error statuses with headers, stalls,
//! connections dropped mid-stream. Connections are kept alive between requests, as hosted APIs
//! keep them (unless the request asks to close).

use serde_json::{Value as Json, json};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server answers to one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A plain response (an error, usually).
    Status {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// A stream of server-sent events.
    Sse(Vec<Part>),
}

/// One step of a streamed reply.
#[derive(Clone, Debug)]
pub enum Part {
    /// `data: <json>`.
    Data(Json),
    /// `data: [DONE]`.
    Done,
    /// Never sends anything more (the socket stays open).
    Hang,
    /// Sends nothing for this long (a model thinking before it answers; cave-cli's tests).
    #[allow(dead_code)]
    Pause(std::time::Duration),
    /// Closes the connection without ending the response.
    Drop,
    /// These bytes as they are (comments, CRLF, `data:` without a space…).
    Raw(String),
}

/// A request as the server received it.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Json,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct State {
    script: VecDeque<Reply>,
    /// Played when the script has run out.
    fallback: Option<Reply>,
    /// Kept only while `record` is on (a benchmark sends many requests).
    received: Vec<Received>,
    record: bool,
    /// Connections accepted so far.
    connections: usize,
}

/// The server; it stops when dropped.
pub struct TestServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    /// Starts a server that answers with `script`, one reply per request (then 500s).
    pub async fn start(script: impl IntoIterator<Item = Reply>) -> Self {
        Self::with_state(State {
            script: script.into_iter().collect(),
            record: true,
            ..State::default()
        })
        .await
    }

    /// Starts a server that answers every request with `reply`, recording nothing.
    #[allow(dead_code)]
    pub async fn repeating(reply: Reply) -> Self {
        Self::with_state(State {
            fallback: Some(reply),
            ..State::default()
        })
        .await
    }

    async fn with_state(state: State) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(state));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let _ = socket.set_nodelay(true);
                shared.lock().unwrap().connections += 1;
                let state = shared.clone();
                tokio::spawn(async move {
                    let _ = serve(socket, state).await;
                });
            }
        });
        Self { addr, state, task }
    }

    /// The base URL to configure a model with.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Starts (or stops) keeping the requests it receives.
    #[allow(dead_code)]
    pub fn record(&self, on: bool) {
        self.state.lock().unwrap().record = on;
    }

    /// The requests received so far.
    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// How many connections clients have opened so far.
    #[allow(dead_code)]
    pub fn connections(&self) -> usize {
        self.state.lock().unwrap().connections
    }
}

/// Answers requests on one connection until the client closes it, asks to, or a scripted fault
/// ends it.
async fn serve(mut socket: TcpStream, state: Arc<Mutex<State>>) -> std::io::Result<()> {
    let mut buf = Vec::new();
    while serve_one(&mut socket, &mut buf, &state).await? {}
    socket.shutdown().await
}

/// Answers one request; whether the connection may carry another (not when the client closed
/// it, asked to, or a scripted fault ended it). Bytes past this request stay in `buf`.
async fn serve_one(
    socket: &mut TcpStream,
    buf: &mut Vec<u8>,
    state: &Mutex<State>,
) -> std::io::Result<bool> {
    // Read the head, then the body by Content-Length.
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Ok(false);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.lines();
    let path = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| {
            l.split_once(':')
                .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        })
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let end = (head_end + length).min(buf.len());
    let body = serde_json::from_slice(&buf[head_end..end]).unwrap_or(Json::Null);
    buf.drain(..end);
    let keep = !headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("connection") && v.eq_ignore_ascii_case("close"));
    // A proxy in front (LiteLLM) lists the models first: answered aside, so the script is
    // the chat requests alone.
    if path.ends_with("/models") {
        let list = json!({"object": "list", "data": []}).to_string();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            list.len()
        );
        socket.write_all(head.as_bytes()).await?;
        socket.write_all(list.as_bytes()).await?;
        return Ok(keep);
    }
    let reply = {
        let mut state = state.lock().unwrap();
        if state.record {
            state.received.push(Received {
                path,
                headers,
                body,
            });
        }
        state.script.pop_front().or_else(|| state.fallback.clone())
    };
    match reply.unwrap_or_else(|| status(500, "the test script ran out of replies")) {
        Reply::Status {
            status,
            headers,
            body,
        } => {
            // A content type among the headers replaces the default.
            let typed = headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case("content-type"));
            let mut head = format!(
                "HTTP/1.1 {status} Scripted\r\n{}content-length: {}\r\n",
                if typed {
                    ""
                } else {
                    "content-type: application/json\r\n"
                },
                body.len()
            );
            for (n, v) in headers {
                head.push_str(&format!("{n}: {v}\r\n"));
            }
            head.push_str("\r\n");
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(body.as_bytes()).await?;
        }
        Reply::Sse(parts) => {
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                .await?;
            for part in parts {
                let data = match part {
                    Part::Data(json) => format!("data: {json}\n\n"),
                    Part::Done => "data: [DONE]\n\n".to_owned(),
                    Part::Raw(raw) => raw,
                    Part::Hang => {
                        std::future::pending::<()>().await;
                        continue;
                    }
                    Part::Pause(pause) => {
                        tokio::time::sleep(pause).await;
                        continue;
                    }
                    // Without the terminating chunk, the client sees a broken body.
                    Part::Drop => return Ok(false),
                };
                socket
                    .write_all(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes())
                    .await?;
                socket.flush().await?;
            }
            socket.write_all(b"0\r\n\r\n").await?;
        }
    }
    Ok(keep)
}

/// An error reply with a JSON body.
pub fn status(code: u16, message: &str) -> Reply {
    Reply::Status {
        status: code,
        headers: vec![],
        body: json!({"error": {"message": message, "type": null, "code": null}}).to_string(),
    }
}

/// An error reply with extra headers and a raw body.
pub fn status_with(code: u16, headers: &[(&str, &str)], body: Json) -> Reply {
    Reply::Status {
        status: code,
        headers: headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect(),
        body: body.to_string(),
    }
}

pub fn text(content: &str) -> Part {
    Part::Data(
        json!({"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]}),
    )
}

pub fn reasoning(field: &str, content: &str) -> Part {
    Part::Data(json!({"choices": [{"index": 0, "delta": {field: content}, "finish_reason": null}]}))
}

pub fn finish(reason: &str) -> Part {
    Part::Data(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}))
}

pub fn usage(prompt: u64, completion: u64) -> Part {
    Part::Data(
        json!({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}),
    )
}

pub fn finish_with_usage(reason: &str, prompt: u64, completion: u64) -> Part {
    Part::Data(json!({
        "choices": [{"index": 0, "delta": {}, "finish_reason": reason}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    }))
}

/// A complete streamed answer: `content` in chunks of `size` characters, then `finish`.
pub fn answer(content: &str, size: usize, finish_reason: &str) -> Reply {
    let chars: Vec<char> = content.chars().collect();
    let mut parts: Vec<Part> = chars
        .chunks(size)
        .map(|c| text(&c.iter().collect::<String>()))
        .collect();
    parts.push(finish(finish_reason));
    parts.push(Part::Done);
    Reply::Sse(parts)
}

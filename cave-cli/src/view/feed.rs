//! The session a viewer shows: its events in order, each prepared once for the page (code
//! highlighted, shown files given addresses, the model's prose and answers written as HTML
//! from their Markdown, the session's ledger in a line), and the files those addresses stand
//! for.

use serde_json::{Value as Json, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::watch;

/// How far a `sub_agent` event is unwrapped to reach the event inside (sub-agents nest a few
/// levels; the bound keeps a hostile file from costing more).
const MAX_NESTING: usize = 64;

/// The events of one session, shared by whatever feeds it (a run, a followed file) and the
/// server that shows it; cheap to clone.
#[derive(Clone, Debug)]
pub struct Feed {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    log: Mutex<Log>,
    /// How many entries there are, and whether the session has ended.
    progress: watch::Sender<Progress>,
}

/// How far a session has come.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Entries so far.
    pub(crate) entries: usize,
    /// No more will come.
    pub(crate) ended: bool,
}

#[derive(Debug, Default)]
struct Log {
    /// Each entry as the page receives it (one JSON object).
    entries: Vec<Arc<str>>,
    /// The file behind each shown form: (entry, MIME type) → path.
    files: HashMap<(usize, String), PathBuf>,
    /// Where relative paths are read from when they are not in the current directory.
    base: Option<PathBuf>,
    /// The prose streamed since the last code, step or answer, by agent (`""` for the
    /// session's own, sub-agents by their path): written as HTML on the event that ends it.
    prose: HashMap<String, String>,
}

impl Feed {
    /// An empty session. Relative paths of shown files are read from the current directory,
    /// then from `base` (the directory of the file the events came from).
    pub fn new(base: Option<PathBuf>) -> Self {
        let (progress, _) = watch::channel(Progress::default());
        Self {
            shared: Arc::new(Shared {
                log: Mutex::new(Log {
                    base,
                    ..Log::default()
                }),
                progress,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        // A panic while holding the lock leaves a consistent log (entries are pushed whole).
        self.shared
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds one line of an event stream (`cave run --json`); `number` is its line number, for
    /// the note shown in its place when it is not an event. Blank lines are skipped.
    pub fn push_line(&self, line: &str, number: usize) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        match serde_json::from_str::<Json>(line) {
            Ok(event) if event.get("type").is_some_and(Json::is_string) => self.push(event),
            Ok(_) => self.push_note(number, "it is JSON but not an event (no \"type\")"),
            Err(e) => self.push_note(number, &format!("it is not JSON ({e})")),
        }
    }

    /// Says in the session that line `number` could not be shown, and why.
    pub fn push_note(&self, number: usize, why: &str) {
        self.push(json!({"type": "unreadable", "line": number, "message": why}));
    }

    /// Adds one event (the core's serde form).
    pub fn push(&self, mut event: Json) {
        // Highlighting is done before the log is locked: pages read it meanwhile.
        let (inner, _) = innermost(&mut event);
        if inner.get("type").and_then(Json::as_str) == Some("code") {
            let code = inner.get("code").and_then(Json::as_str).unwrap_or("");
            if let Some(spans) = crate::highlight::python_spans(code) {
                let spans: Vec<Json> = spans
                    .into_iter()
                    .map(|(name, text)| json!([name, text]))
                    .collect();
                inner["spans"] = Json::Array(spans);
            }
        }
        let mut log = self.lock();
        let index = log.entries.len();
        let (inner, agent) = innermost(&mut event);
        log.prepare_prose(inner, agent);
        if inner.get("type").and_then(Json::as_str) == Some("display") {
            let files: Vec<(String, String)> = inner
                .get("files")
                .and_then(Json::as_object)
                .map(|files| {
                    files
                        .iter()
                        .filter_map(|(mime, path)| Some((mime.clone(), path.as_str()?.into())))
                        .collect()
                })
                .unwrap_or_default();
            let mut urls = serde_json::Map::new();
            // Only a well-formed type gets an address: it is part of the path.
            for (mime, path) in files.into_iter().filter(|(mime, _)| valid_mime(mime)) {
                urls.insert(mime.clone(), json!(format!("display/{index}/{mime}")));
                log.files.insert((index, mime), PathBuf::from(path));
            }
            inner["urls"] = Json::Object(urls);
        }
        if let Json::Object(fields) = &mut event {
            fields.insert("n".into(), json!(index));
        }
        log.entries.push(Arc::from(event.to_string()));
        let entries = log.entries.len();
        drop(log);
        self.shared.progress.send_modify(|p| p.entries = entries);
    }

    /// Says that no more events will come (the run ended): the page stops waiting.
    pub fn end(&self) {
        self.shared.progress.send_modify(|p| p.ended = true);
    }

    /// Entry `index`, as the page receives it.
    pub(crate) fn entry(&self, index: usize) -> Option<Arc<str>> {
        self.lock().entries.get(index).cloned()
    }

    /// How many entries there are so far.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Returns true if and only if the session has no entries yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Follows the session's progress.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Progress> {
        self.shared.progress.subscribe()
    }

    /// The file behind entry `index`'s form `mime`, if that entry showed one.
    pub(crate) fn file(&self, index: usize, mime: &str) -> Option<PathBuf> {
        let log = self.lock();
        let path = log.files.get(&(index, mime.to_owned()))?;
        if path.is_absolute() || path.exists() {
            return Some(path.clone());
        }
        Some(
            log.base
                .as_ref()
                .map_or_else(|| path.clone(), |base| base.join(path)),
        )
    }
}

impl Log {
    /// Keeps the prose `event` streams, and writes what has been kept as HTML on the event
    /// that ends it (a cell's code, a step's end, the answer, the run's end); the answer's own
    /// HTML, and the session's ledger in a line on its run's end.
    fn prepare_prose(&mut self, event: &mut Json, agent: String) {
        let kind = event
            .get("type")
            .and_then(Json::as_str)
            .unwrap_or("")
            .to_owned();
        let kind = kind.as_str();
        match kind {
            "user_prompt" => {
                self.prose.remove(&agent);
            }
            "text" => {
                let prose = self.prose.entry(agent).or_default();
                // Past what is rendered, nothing more is kept (the page has the text).
                if prose.len() <= super::prose::MAX_MARKDOWN {
                    prose.push_str(event.get("content").and_then(Json::as_str).unwrap_or(""));
                }
            }
            "code" | "step" | "final_response" | "stopped" => {
                let prose = self.prose.remove(&agent).unwrap_or_default();
                if let Some(html) = Some(prose)
                    .filter(|p| !p.trim().is_empty())
                    .and_then(|p| super::prose::to_html(&p))
                {
                    event["prose_html"] = Json::String(html);
                }
                if kind == "final_response"
                    && let Some(html) = event
                        .get("content")
                        .and_then(Json::as_str)
                        .and_then(super::prose::to_html)
                {
                    event["html"] = Json::String(html);
                }
                if kind == "stopped"
                    && let Some(line) = event
                        .get("ledger")
                        .and_then(|l| serde_json::from_value::<cave_agent::Ledger>(l.clone()).ok())
                        .filter(|l| l.model_calls > 0)
                        .map(|l| format!("session · {}", l.summary_parts().join(" · ")))
                {
                    event["ledger_line"] = Json::String(line);
                }
            }
            _ => {}
        }
    }
}

/// The event inside any `sub_agent` wrappers, and the path of agents it came through (`""`
/// for the session's own).
fn innermost(event: &mut Json) -> (&mut Json, String) {
    let mut inner = event;
    let mut agents = String::new();
    for _ in 0..MAX_NESTING {
        if inner.get("type").and_then(Json::as_str) != Some("sub_agent")
            || inner.get("event").is_none()
        {
            break;
        }
        agents.push('\u{0}');
        agents.push_str(inner.get("agent").and_then(Json::as_str).unwrap_or(""));
        inner = &mut inner["event"];
    }
    (inner, agents)
}

/// `type/subtype` of the characters MIME types are made of.
pub(crate) fn valid_mime(mime: &str) -> bool {
    let token = |s: &str| {
        s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.len() <= 127
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(&b))
    };
    matches!(mime.split_once('/'), Some((kind, sub)) if token(kind) && token(sub))
}

/// The directory of `file`, for the relative paths it names.
pub fn base_of(file: &Path) -> Option<PathBuf> {
    file.parent().map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(feed: &Feed, index: usize) -> Json {
        serde_json::from_str(&feed.entry(index).unwrap()).unwrap()
    }

    #[test]
    fn code_is_highlighted_and_shown_files_get_addresses() {
        let feed = Feed::new(Some(PathBuf::from("/runs")));
        feed.push_line(r#"{"type":"code","code":"import os"}"#, 1);
        feed.push_line("", 2);
        feed.push_line(
            r#"{"type":"sub_agent","agent":"a","event":{"type":"display","mime_types":["image/png","text/plain"],"text":"F","files":{"image/png":"d/display-1.png","bad mime":"/x"}}}"#,
            3,
        );
        assert_eq!(feed.len(), 2);
        let code = entry(&feed, 0);
        assert_eq!(code["n"], 0);
        assert_eq!(code["spans"][0], json!(["keyword", "import"]));
        let shown = entry(&feed, 1);
        assert_eq!(
            shown["event"]["urls"],
            json!({"image/png": "display/1/image/png"})
        );
        assert_eq!(
            feed.file(1, "image/png").unwrap(),
            PathBuf::from("/runs/d/display-1.png")
        );
        assert_eq!(feed.file(1, "bad mime"), None);
        assert_eq!(feed.file(0, "image/png"), None);
    }

    #[test]
    fn prose_is_written_as_html_where_it_ends_and_the_ledger_in_a_line() {
        let feed = Feed::new(None);
        feed.push(json!({"type": "user_prompt", "content": "q", "format_version": 1}));
        feed.push(json!({"type": "text", "content": "Let me **look"}));
        feed.push(json!({"type": "text", "content": "** first. <b>x</b>\n"}));
        // A sub-agent's prose is its own.
        feed.push(json!({"type": "sub_agent", "agent": "a", "event": {"type": "text", "content": "*inner*"}}));
        feed.push(json!({"type": "code", "code": "x = 1"}));
        let code = entry(&feed, 4);
        assert_eq!(
            code["prose_html"],
            "<p>Let me <strong>look</strong> first. &lt;b&gt;x&lt;/b&gt;</p>\n"
        );
        feed.push(json!({"type": "step", "step": 1}));
        assert!(entry(&feed, 5).get("prose_html").is_none(), "taken once");
        feed.push(json!({"type": "sub_agent", "agent": "a", "event": {"type": "final_response", "content": "*inner*"}}));
        let inner = entry(&feed, 6);
        assert_eq!(inner["event"]["prose_html"], "<p><em>inner</em></p>\n");
        assert_eq!(inner["event"]["html"], "<p><em>inner</em></p>\n");
        let mut ledger = cave_agent::Ledger::new();
        ledger.model_calls = 2;
        ledger.cells = 1;
        feed.push(json!({"type": "stopped", "stop_reason": "completed", "ledger": ledger}));
        let line = entry(&feed, 7)["ledger_line"].as_str().unwrap().to_owned();
        assert!(line.starts_with("session · 0 tokens · "), "{line}");
        assert!(line.contains(" · 1 cell"), "{line}");
    }

    #[test]
    fn lines_that_are_not_events_become_notes() {
        let feed = Feed::new(None);
        feed.push_line("not json", 7);
        feed.push_line("[1, 2]", 8);
        assert_eq!(entry(&feed, 0)["type"], "unreadable");
        assert_eq!(entry(&feed, 0)["line"], 7);
        assert!(
            entry(&feed, 1)["message"]
                .as_str()
                .unwrap()
                .contains("not an event")
        );
    }

    #[test]
    fn deep_nesting_is_unwrapped_only_so_far() {
        let mut text = r#"{"type":"code","code":"x"}"#.to_owned();
        for _ in 0..100 {
            text = format!(r#"{{"type":"sub_agent","agent":"a","event":{text}}}"#);
        }
        // serde_json refuses nesting past 128; at 100 the feed stops unwrapping at 64.
        let feed = Feed::new(None);
        feed.push_line(&text, 1);
        assert_eq!(feed.len(), 1);
        assert!(!feed.entry(0).unwrap().contains("spans"));
    }

    #[test]
    fn mime_types_are_checked() {
        for good in ["image/png", "image/svg+xml", "application/vnd.x-y.z+json"] {
            assert!(valid_mime(good), "{good}");
        }
        for bad in [
            "png",
            "image/",
            "/png",
            "a/b/c",
            "text/html;x",
            "../x",
            "a/.. /b",
        ] {
            assert!(!valid_mime(bad), "{bad}");
        }
    }
}

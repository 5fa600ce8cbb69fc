//! Wiring: a model, a runtime and an agent from the configuration, and the run and chat loops.

use crate::args::{Cli, Command, Provider, SkillsCommand};
use crate::config::{self, Config, ModelSource, OutputMode, RuntimeChoice};
use crate::exit::Exit;
use crate::output::{Human, JsonLines, Output, Retrieved};
use crate::stop::{TerminalSettings, Termination, stop_requested};
use anyhow::Context;
use cave_agent::AgentExt;
use cave_agent::ContextCompactor;
use cave_agent::inproc::{CapturedStreams, StdioCapture};
use cave_agent::models::{ApiKey, LiteLlmModel, OpenAiModel, RecordingModel, ReplayModel};
use cave_agent::{
    Agent, CancellationToken, CellLimits, DiscardOutput, Event, InProcRuntime, KernelRuntime,
    MethodFilter, Model, Resource, Resources, Runtime, RuntimeError, RuntimeExt, SecretRedactor,
    StopReason,
};
use futures_util::{FutureExt as _, StreamExt};
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::sync::Arc;

/// Runs the command; returns how `cave` exits.
pub fn run(
    mut cli: Cli,
    api_key: Option<ApiKey>,
    key_text: Option<String>,
    secrets: config::TakenSecrets,
) -> Exit {
    // A session directory given: what it saved of the runtime options fills those not given
    // again, before anything reads them.
    let persisted = match &mut cli.command {
        Command::Run(args) => Persisted::open(&mut args.common),
        Command::Chat(args) => Persisted::open(&mut args.common),
        _ => Ok(None),
    };
    let serving = matches!(cli.command, Command::Mcp(crate::args::McpCommand::Serve(_)));
    let rt = match async_runtime(serving) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cave: could not start the async runtime: {e}");
            return Exit::Stopped;
        }
    };
    let (common, prompts) = match &cli.command {
        Command::Run(args) => (&args.common, Some(args.prompts.clone())),
        Command::Chat(args) => (&args.common, None),
        Command::Skills(command) => return skills_command(command),
        Command::Doctor => return doctor(),
        Command::View(args) => return rt.block_on(view_command(args)),
        Command::Mcp(crate::args::McpCommand::List { server, headers }) => {
            return rt.block_on(mcp_list(server, headers));
        }
        Command::Mcp(crate::args::McpCommand::Serve(args)) => {
            let served = config::resolve_serve(args, &secrets)
                .map_err(anyhow::Error::from)
                .and_then(|config| rt.block_on(mcp_serve(config)));
            return match served {
                Ok(()) => Exit::Completed,
                Err(e) => {
                    let redactor = secrets.redactor(key_text.as_deref());
                    eprintln!("cave: {}", redactor.redact(&format!("{e:#}")));
                    Exit::Usage
                }
            };
        }
    };
    // The key, the secrets and the MCP servers' header values: never printed.
    let redactor = secrets.redactor(key_text.as_deref());
    let termination = {
        let _runtime = rt.enter();
        match Termination::listen() {
            Ok(termination) => termination,
            Err(e) => {
                eprintln!("cave: cannot listen for SIGTERM and SIGHUP: {e}");
                return Exit::Stopped;
            }
        }
    };
    // Held to the end of `run`, whichever way it ends: dropping it sends the spans left.
    let mut traces = None;
    let resolved = config::resolve(common, api_key, &secrets).map_err(anyhow::Error::from);
    let session = resolved.and_then(|mut config| {
        if let Some(otlp) = config.traces.take() {
            traces = Some(cave_agent::otel::install(otlp).context("--otlp")?);
        }
        let persisted = persisted.context("--session")?;
        rt.block_on(Session::build(config, &redactor, persisted, termination))
    });
    let mut session = match session {
        Ok(session) => session,
        Err(e) => {
            eprintln!("cave: {}", redactor.redact(&format!("{e:#}")));
            return Exit::Usage;
        }
    };
    let result = match prompts {
        Some(prompts) => rt.block_on(session.run_prompts(prompts)),
        None => session.chat(&rt),
    };
    if session.display_dir.is_dir() {
        eprintln!(
            "cave: what the cells showed is in {}",
            session.display_dir.display()
        );
    }
    for tools in std::mem::take(&mut session.mcp) {
        rt.block_on(tools.server().close(MCP_GRACE));
    }
    let terminated = session.termination.signal();
    if let Some(view) = session.view.take() {
        let keep = matches!(cli.command, Command::Run(_))
            && terminated.is_none()
            && std::io::IsTerminal::is_terminal(&io::stdin());
        rt.block_on(view.finish(keep));
    }
    let missing = rt.block_on(session.retrieve_all()).unwrap_or_default();
    for message in &missing {
        eprintln!("cave: {}", redactor.redact(message));
    }
    let exit = match result {
        // A variable asked for and not there: the run did not give what was expected.
        Ok(Some(StopReason::Completed)) | Ok(None) if !missing.is_empty() => Exit::Stopped,
        Ok(Some(StopReason::Completed)) | Ok(None) => Exit::Completed,
        Ok(Some(_)) => Exit::Stopped,
        // A reader that closed stdout had what it wanted.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Exit::Completed,
        Err(e) => {
            eprintln!("cave: {e}");
            Exit::Stopped
        }
    };
    let Some(signal) = terminated else {
        return exit;
    };
    // After the session: with `--json` its capture holds descriptor 2 until then.
    drop(session);
    eprintln!("cave: stopped by {signal}");
    drop(traces);
    // `chat`'s line editor may be blocked reading a line that will not come: not waited for.
    rt.shutdown_background();
    Exit::Stopped
}

/// The async runtime. One thread for a session of `run` or `chat`: per step the agent, the
/// model's connection and the runtime's channels hand work to each other dozens of times, and
/// across threads each hand-off is a wake-up that costs more than the work (≈0.4 ms a step
/// here). Worker threads for `mcp serve`, whose clients are many.
fn async_runtime(serving: bool) -> io::Result<tokio::runtime::Runtime> {
    if serving {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
}

/// The host's stdout (a duplicate of the descriptor `cave` started with, so that nothing a cell
/// writes to descriptor 1 reaches it). Holds each event's text until it is flushed, then writes
/// it redacted (so a key split across writes is still found).
/// A standard stream that removes the API key from everything written to it.
struct RedactingStdout {
    out: std::fs::File,
    buffer: Vec<u8>,
    redactor: SecretRedactor,
}

impl Write for RedactingStdout {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buffer.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let text = String::from_utf8_lossy(&self.buffer).into_owned();
        self.buffer.clear();
        self.out.write_all(self.redactor.redact(&text).as_bytes())?;
        self.out.flush()
    }
}

/// Events written at most before the output is flushed while more keep coming.
const HELD_EVENTS: usize = 64;

/// The session's runtime, by kind: both are `Runtime`s; the in-process one also shares this
/// process's descriptors.
#[derive(Clone)]
enum Backend {
    InProc(InProcRuntime),
    Kernel(KernelRuntime),
}

impl Backend {
    fn runtime(&self) -> &dyn Runtime {
        match self {
            Backend::InProc(rt) => rt,
            Backend::Kernel(rt) => rt,
        }
    }

    /// The same runtime, shared.
    fn shared(&self) -> Arc<dyn Runtime> {
        match self {
            Backend::InProc(rt) => Arc::new(rt.clone()),
            Backend::Kernel(rt) => Arc::new(rt.clone()),
        }
    }

    /// Makes the in-process runtime's cells own the captured descriptors (the kernel's
    /// children have descriptors of their own).
    fn attach_stdio(&self, capture: &StdioCapture) {
        if let Backend::InProc(rt) = self {
            rt.attach_stdio(capture);
        }
    }
}

struct Session {
    agent: Agent,
    runtime: Backend,
    /// `--json`: descriptors 1 and 2 belong to the runtime's cells for the whole session.
    session_capture: Option<StdioCapture>,
    output: Box<dyn Output>,
    retrieve: Vec<String>,
    /// Where the rich forms of what cells show are written.
    display_dir: std::path::PathBuf,
    /// `cave chat` on the kernel runtime: a checkpoint before each turn, with the length the
    /// conversation had, for `/undo` (the newest last).
    undo: Vec<(cave_agent::kernel::Checkpoint, usize)>,
    /// `cave chat`'s name for the branch the session is on (`main` until `/switch`).
    branch: String,
    /// The other branches (`/fork`), each with its agent, runtime and `/undo` checkpoints.
    branches: Vec<ChatBranch>,
    /// `--view`: the page that shows the session as it runs.
    view: Option<LiveView>,
    /// `--mcp`: the servers, which end with the session.
    mcp: Vec<Arc<cave_agent::mcp::McpTools>>,
    /// `--session`: where the session is saved after each turn, and the options it keeps.
    persisted: Option<Persisted>,
    /// Removes the API key from what is said on stderr.
    redactor: SecretRedactor,
    /// SIGTERM or SIGHUP: ends the turn that runs and the session.
    termination: Termination,
}

/// A session directory (`--session`): the directory, what it held when the command started,
/// and the runtime options it keeps.
struct Persisted {
    session: cave_agent::session::Session,
    saved: Option<cave_agent::session::Saved>,
    /// `events.jsonl` in the directory: every event of the session, for `cave view DIR`.
    events: EventLog,
}

/// The name of a session directory's event log.
pub(crate) const SESSION_EVENTS: &str = "events.jsonl";

/// A session directory's event log: each event appended as one JSON line as it happens
/// (redacted as printed, shown files' paths made absolute), so that `cave view DIR` follows a
/// session while a run still writes it. A failure to write is said once; the run goes on.
struct EventLog {
    file: Option<std::fs::File>,
    path: std::path::PathBuf,
}

impl EventLog {
    fn open(dir: &std::path::Path) -> Self {
        let path = dir.join(SESSION_EVENTS);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path);
        let file = match file {
            Ok(file) => Some(file),
            Err(e) => {
                eprintln!(
                    "cave: {} cannot be written ({e}); the session is saved without its event log",
                    path.display()
                );
                None
            }
        };
        Self { file, path }
    }

    fn append(&mut self, event: &Event, redactor: &SecretRedactor) {
        use std::io::Write as _;
        let Some(file) = &mut self.file else { return };
        let Some(mut json) = redacted_json(event, redactor) else {
            return;
        };
        absolute_display_paths(&mut json);
        let mut line = json.to_string();
        line.push('\n');
        // One write of the whole line: a reader never sees half of it as a line.
        if let Err(e) = file.write_all(line.as_bytes()) {
            eprintln!(
                "cave: {} could not be written further: {e}",
                self.path.display()
            );
            self.file = None;
        }
    }
}

/// `event` as printed: its JSON with the key removed.
fn redacted_json(event: &Event, redactor: &SecretRedactor) -> Option<serde_json::Value> {
    let text = serde_json::to_string(event).ok()?;
    serde_json::from_str(&redactor.redact(&text)).ok()
}

/// Makes the paths of the files a `display` event names (inside any `sub_agent` wrappers)
/// absolute, so that a viewer started elsewhere finds them.
fn absolute_display_paths(event: &mut serde_json::Value) {
    let mut inner = event;
    // Sub-agents nest a few levels; the bound is the viewer's.
    for _ in 0..64 {
        if inner["type"] != "sub_agent" {
            break;
        }
        inner = &mut inner["event"];
    }
    if let Some(files) = inner.get_mut("files").and_then(|f| f.as_object_mut()) {
        for path in files.values_mut() {
            if let Some(absolute) = path
                .as_str()
                .and_then(|p| std::path::absolute(p).ok())
                .map(|p| p.display().to_string())
            {
                *path = serde_json::Value::String(absolute);
            }
        }
    }
}

impl Persisted {
    /// Opens `--session DIR` (if given) and fills the runtime options not given again from
    /// what it saved.
    fn open(common: &mut crate::args::CommonArgs) -> anyhow::Result<Option<Self>> {
        let Some(dir) = &common.session else {
            return Ok(None);
        };
        let mut session = cave_agent::session::Session::open(dir)?;
        if let Some(bytes) = common.session_max {
            session = session.max_bytes(bytes);
        }
        let saved = session.load()?;
        let runtime = &mut common.runtime;
        if let Some(saved) = &saved {
            let kept = |key: &str| -> Vec<String> {
                saved.registration[key]
                    .as_array()
                    .map(|items| {
                        items
                            .iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let fill = |given: &mut Vec<String>, key: &str| {
                if given.is_empty() {
                    *given = kept(key);
                }
            };
            fill(&mut runtime.vars, "var");
            fill(&mut runtime.var_descs, "var_desc");
            fill(&mut runtime.mcp, "mcp");
            fill(&mut runtime.mcp_headers, "mcp_header");
            if runtime.py.is_empty() {
                runtime.py = kept("py").into_iter().map(Into::into).collect();
            }
            if runtime.skills.is_empty() {
                runtime.skills = kept("skills").into_iter().map(Into::into).collect();
            }
        }
        // Paths absolute, so that a later start from another directory finds them.
        let absolute = |paths: &[std::path::PathBuf]| -> Vec<String> {
            paths
                .iter()
                .map(|p| {
                    std::path::absolute(p)
                        .unwrap_or_else(|_| p.clone())
                        .display()
                        .to_string()
                })
                .collect()
        };
        let registration = serde_json::json!({
            "var": runtime.vars,
            "var_desc": runtime.var_descs,
            "py": absolute(&runtime.py),
            "skills": absolute(&runtime.skills),
            "mcp": runtime.mcp,
            "mcp_header": runtime.mcp_headers,
        });
        Ok(Some(Self {
            events: EventLog::open(session.dir()),
            session: session.registration(registration),
            saved,
        }))
    }
}

/// The session shown as a web page while it runs (`--view`).
struct LiveView {
    feed: crate::view::Feed,
    viewer: crate::view::Viewer,
    redactor: SecretRedactor,
}

impl LiveView {
    async fn start(addr: std::net::SocketAddr, redactor: &SecretRedactor) -> anyhow::Result<Self> {
        let feed = crate::view::Feed::new(None);
        let viewer = crate::view::Viewer::serve(addr, feed.clone(), "live session")
            .await
            .context("--view")?;
        eprintln!("cave: viewing the session at {}", viewer.url());
        Ok(Self {
            feed,
            viewer,
            redactor: redactor.clone(),
        })
    }

    /// Shows `event` on the page, as it is printed (the key removed).
    fn show(&self, event: &Event) {
        match redacted_json(event, &self.redactor) {
            Some(json) => self.feed.push(json),
            None => self
                .feed
                .push_note(self.feed.len() + 1, "the event could not be read back"),
        }
    }

    /// Tells open pages the session is over; with `keep`, serves them until Ctrl-C.
    async fn finish(self, keep: bool) {
        self.feed.end();
        if keep {
            eprintln!("cave: the page stays at {} until Ctrl-C", self.viewer.url());
            let _ = stop_requested().await;
        }
        // Pages that are open get the last events and the end before the server stops.
        self.viewer.close(std::time::Duration::from_secs(2)).await;
    }
}

/// How many turns `/undo` can take back; older checkpoints are let go (each is a process).
const UNDO_DEPTH: usize = 16;

/// The name of the branch a chat starts on.
const MAIN_BRANCH: &str = "main";

/// How many branches a chat holds besides the one it is on (each is a process).
const MAX_CHAT_BRANCHES: usize = 16;

/// A branch of a chat that is not the one the chat is on: what `/switch` swaps in.
struct ChatBranch {
    name: String,
    agent: Agent,
    runtime: Backend,
    undo: Vec<(cave_agent::kernel::Checkpoint, usize)>,
}

/// A chat command: `/undo`, `/fork [NAME]`, `/branches`, `/switch NAME`.
#[derive(Debug, PartialEq, Eq)]
enum ChatCommand {
    Undo,
    Fork(Option<String>),
    Branches,
    Switch(String),
}

impl ChatCommand {
    /// The command `line` is, if it is one; a line starting with `/` that is not, or has the
    /// wrong arguments, says so (`Err`).
    fn parse(line: &str) -> Option<Result<Self, String>> {
        let mut words = line.split_whitespace();
        // `/word`: a command (or a mistyped one); a line like `/etc/hosts is…` is a prompt.
        let command = words
            .next()?
            .strip_prefix('/')
            .filter(|c| !c.is_empty() && c.chars().all(|c| c.is_ascii_lowercase()))?;
        let rest: Vec<&str> = words.collect();
        let name = |word: &str| -> Result<String, String> {
            let fits = !word.is_empty()
                && word.len() <= 32
                && word
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if fits {
                Ok(word.to_owned())
            } else {
                Err(format!(
                    "{word:?} is not a branch name: up to 32 letters, digits, '-' and '_'"
                ))
            }
        };
        Some(match (command, rest.as_slice()) {
            ("undo", []) => Ok(Self::Undo),
            ("fork", []) => Ok(Self::Fork(None)),
            ("fork", [word]) => name(word).map(|n| Self::Fork(Some(n))),
            ("branches", []) => Ok(Self::Branches),
            ("switch", [word]) => name(word).map(Self::Switch),
            ("undo" | "branches", _) => Err(format!("/{command} takes no argument")),
            ("fork", _) => Err("/fork takes at most a name: /fork [NAME]".to_owned()),
            ("switch", _) => Err("/switch takes a branch's name: /switch NAME".to_owned()),
            _ => Err(format!(
                "no command /{command}: the commands are /undo, /fork [NAME], /branches and /switch NAME"
            )),
        })
    }
}

impl Session {
    async fn build(
        config: Config,
        redactor: &SecretRedactor,
        mut persisted: Option<Persisted>,
        termination: Termination,
    ) -> anyhow::Result<Self> {
        let Config {
            model,
            record,
            runtime: provisions,
            guards:
                config::GuardsConfig {
                    policy,
                    approve,
                    audit,
                },
            context_window,
            compact_model,
            agent: settings,
            output,
            retrieve,
            display_dir,
            view,
            api_key: _,
            // Installed by `run`, which holds the exporter.
            traces: _,
        } = config;
        let model: Box<dyn Model> = open_model(model)?;
        let model: Box<dyn Model> = match record {
            Some(path) => Box::new(RecordingModel::create(model, &path)?),
            None => model,
        };
        let model: Arc<dyn Model> = Arc::from(model);
        let summarizer: Arc<dyn Model> = match compact_model {
            Some(source) => Arc::from(open_model(source)?),
            None => model.clone(),
        };
        let compactor = compactor(&model, summarizer, context_window);
        let (runtime, provisions) = open_runtime(provisions, audit.as_ref()).await?;

        let info = model.info();
        let mut builder = match &runtime {
            Backend::InProc(rt) => Agent::builder(model, rt.clone()),
            Backend::Kernel(rt) => Agent::builder(model, rt.clone()),
        };
        if let Some(approve) = approve {
            builder
                .approver(Arc::new(crate::approve::Prompted::new(matches!(
                    output,
                    OutputMode::Json
                ))))
                .approve_cells(approve.cells());
        }
        // Every call into the host is audited, and asked about with `--approve calls|all`.
        let call_approver = builder
            .call_approver()
            .filter(|_| approve.is_some_and(|a| a.calls()));
        let guard = call_guard(call_approver, audit.clone());
        let (servers, skills) = provide(&runtime, provisions, guard).await?;
        if let Some(listing) = skills {
            builder.skills(listing);
        }
        builder.compactor(compactor);
        // Exact counts for OpenAI models, the script-aware estimate otherwise.
        builder.estimator(cave_agent::compact::estimator_for(&info.id));
        if let Some(policy) = policy {
            builder.policy(policy);
        }
        if let Some(audit) = audit {
            builder.observer(audit);
        }
        settings.apply(&mut builder);
        builder.display_dir(&display_dir);
        // A saved session: its values in the fresh runtime (what the host registers is
        // registered already), its conversation, and one line saying what came back.
        if let Some(persisted) = &mut persisted
            && let Some(saved) = persisted.saved.take()
        {
            let restored = persisted
                .session
                .resume_from(saved, &mut builder, runtime.runtime())
                .await?;
            eprintln!("cave: {}", redactor.redact(&restored.line()));
        }
        let agent = builder.build()?;
        let (output, session_capture) = open_output(output, &runtime, redactor)?;
        let view = match view {
            Some(addr) => Some(LiveView::start(addr, redactor).await?),
            None => None,
        };
        Ok(Self {
            agent,
            runtime,
            session_capture,
            output,
            retrieve,
            display_dir,
            undo: Vec::new(),
            branch: MAIN_BRANCH.to_owned(),
            branches: Vec::new(),
            view,
            mcp: servers,
            persisted,
            redactor: redactor.clone(),
            termination,
        })
    }

    /// `--session`: saves the conversation and the namespace after a turn. A failure is said,
    /// not fatal: the previous save stays whole. After a turn in which the runtime lost its
    /// state, the values saved before are kept rather than replaced by the emptied namespace.
    async fn persist(&self, state_lost: bool) {
        let Some(persisted) = &self.persisted else {
            return;
        };
        if state_lost {
            eprintln!(
                "cave: the runtime lost its state this turn; the session keeps the values saved before it"
            );
        }
        let saved = persisted.session.save_turn(&self.agent, state_lost).await;
        match saved {
            Ok(report) if report.skipped.is_empty() => {}
            Ok(report) => eprintln!(
                "cave: the session keeps all but: {}",
                self.redactor.redact(&report.skipped_summary())
            ),
            Err(e) => eprintln!(
                "cave: the session could not be saved (the previous save stays): {}",
                self.redactor.redact(&e.to_string())
            ),
        }
    }

    /// Runs one turn, printing its events; Ctrl-C cancels it.
    async fn turn(&mut self, prompt: String) -> io::Result<Option<StopReason>> {
        // For people: descriptor 1 is the cells' only while a turn runs, so that the line
        // editor between turns keeps the terminal.
        let _turn_capture = match &self.session_capture {
            Some(_) => None,
            None if matches!(self.runtime, Backend::InProc(_)) => {
                let capture =
                    StdioCapture::start(CapturedStreams::Stdout).map_err(io::Error::other)?;
                self.runtime.attach_stdio(&capture);
                Some(capture)
            }
            None => None,
        };
        let cancel = CancellationToken::new();
        let _terminates = self.termination.guard(&cancel);
        let on_interrupt = cancel.clone();
        let watcher = tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                on_interrupt.cancel();
            }
        });
        let mut reason = None;
        let mut state_lost = false;
        let mut events = self.agent.stream_until(prompt, cancel);
        let mut result = Ok(());
        let mut ticker = tokio::time::interval(std::time::Duration::from_millis(100));
        let mut held = 0;
        loop {
            // Events that are ready go out in one write (at most `HELD_EVENTS` of them, so that
            // a fast stream is still seen as it goes); the buffer is sent before waiting.
            let ready = if held < HELD_EVENTS {
                events.next().now_or_never()
            } else {
                None
            };
            if ready.is_none() {
                held = 0;
                if let Err(e) = self.output.flush() {
                    result = Err(e);
                    break;
                }
            }
            held += 1;
            // `next` is cancel-safe: a tick that wins the race loses no event.
            let event = match ready {
                Some(event) => event,
                None => tokio::select! {
                    event = events.next() => event,
                    _ = ticker.tick() => {
                        if let Err(e) = self.output.tick() {
                            result = Err(e);
                            break;
                        }
                        continue;
                    }
                },
            };
            let Some(event) = event else { break };
            if let Event::Stopped { stop_reason, .. } = &event {
                reason = Some(*stop_reason);
            }
            state_lost |= event.lost_state();
            if let Some(view) = &self.view {
                view.show(&event);
            }
            if let Some(persisted) = &mut self.persisted {
                persisted.events.append(&event, &self.redactor);
            }
            if let Err(e) = self.output.event(&event) {
                result = Err(e);
                break;
            }
        }
        drop(events);
        if let Err(e) = self.output.flush()
            && result.is_ok()
        {
            result = Err(e);
        }
        watcher.abort();
        self.persist(state_lost).await;
        result.map(|()| reason)
    }

    async fn run_prompts(&mut self, prompts: Vec<String>) -> io::Result<Option<StopReason>> {
        let mut last = None;
        for prompt in prompts {
            if self.termination.received() {
                break;
            }
            last = self.turn(prompt).await?;
        }
        Ok(last)
    }

    fn chat(&mut self, rt: &tokio::runtime::Runtime) -> io::Result<Option<StopReason>> {
        let mut editor = rustyline::DefaultEditor::new().map_err(io::Error::other)?;
        let terminal = TerminalSettings::save();
        let mut last = None;
        loop {
            if self.termination.received() {
                return Ok(last);
            }
            // Read on a thread of its own, so that the runtime goes on meanwhile (a Jupyter
            // connection's pings, MCP servers' messages, a spare kernel starting).
            let reading = rt.spawn_blocking(move || {
                let line = editor.readline("you › ");
                (line, editor)
            });
            let termination = self.termination.clone();
            let read = rt.block_on(async {
                tokio::select! {
                    read = reading => Some(read),
                    () = termination.arrived() => None,
                }
            });
            // SIGTERM or SIGHUP while waiting for a line: the reading thread stays blocked in
            // it (`run` then does not wait for it).
            let Some(read) = read else {
                terminal.restore();
                return Ok(last);
            };
            let line;
            (line, editor) = read.map_err(io::Error::other)?;
            match line {
                Ok(line) if line.trim().is_empty() => continue,
                Ok(line) if ChatCommand::parse(&line).is_some() => {
                    let _ = editor.add_history_entry(line.as_str());
                    match ChatCommand::parse(&line) {
                        Some(Ok(ChatCommand::Undo)) => rt.block_on(self.undo()),
                        Some(Ok(ChatCommand::Fork(name))) => rt.block_on(self.fork(name)),
                        Some(Ok(ChatCommand::Branches)) => self.list_branches(),
                        Some(Ok(ChatCommand::Switch(name))) => self.switch(&name),
                        Some(Err(problem)) => eprintln!("cave: {problem}"),
                        None => {}
                    }
                }
                Ok(line) => {
                    let _ = editor.add_history_entry(line.as_str());
                    rt.block_on(self.mark_turn());
                    last = rt.block_on(self.turn(line))?;
                }
                Err(rustyline::error::ReadlineError::Interrupted) => continue,
                Err(rustyline::error::ReadlineError::Eof) => return Ok(last),
                Err(e) => return Err(io::Error::other(e)),
            }
        }
    }

    /// Before a chat turn on the kernel runtime: a checkpoint for `/undo`.
    async fn mark_turn(&mut self) {
        let Backend::Kernel(runtime) = &self.runtime else {
            return;
        };
        match runtime.checkpoint().await {
            Ok(checkpoint) => {
                if self.undo.len() == UNDO_DEPTH {
                    self.undo.remove(0);
                }
                self.undo.push((checkpoint, self.agent.history().len()));
            }
            Err(error) => eprintln!("cave: /undo will not reach before this turn: {error}"),
        }
    }

    /// `/undo`: the last turn taken back, in the conversation and in the namespace.
    async fn undo(&mut self) {
        let Backend::Kernel(runtime) = &self.runtime else {
            eprintln!(
                "cave: /undo needs --runtime kernel (a checkpoint is a paused copy of its process)"
            );
            return;
        };
        let Some((checkpoint, len)) = self.undo.pop() else {
            eprintln!("cave: nothing to undo");
            return;
        };
        match runtime.rollback(&checkpoint).await {
            Ok(()) => {
                self.agent.truncate_history(len);
                eprintln!(
                    "cave: undone: the last turn, and what its code did to the namespace ({} more /undo available)",
                    self.undo.len()
                );
            }
            Err(error) => {
                // The checkpoints belonged to a process that is gone: none of them can work.
                self.undo.clear();
                eprintln!("cave: could not undo: {error}");
            }
        }
    }

    /// `/fork [NAME]`: a branch of the chat as it is now (the conversation and a copy of the
    /// runtime's namespace), to `/switch` to; the chat stays on its branch.
    async fn fork(&mut self, name: Option<String>) {
        let Backend::Kernel(runtime) = &self.runtime else {
            eprintln!(
                "cave: /fork needs --runtime kernel (a branch is a copy of its process; the in-process runtime's namespace is this process's)"
            );
            return;
        };
        if self.branches.len() >= MAX_CHAT_BRANCHES {
            eprintln!(
                "cave: a chat holds at most {MAX_CHAT_BRANCHES} other branches (each is a process)"
            );
            return;
        }
        let name = name.unwrap_or_else(|| {
            (1..)
                .map(|n| format!("branch-{n}"))
                .find(|n| !self.branch_taken(n))
                .unwrap_or_default()
        });
        if self.branch_taken(&name) {
            eprintln!("cave: there is a branch {name} already");
            return;
        }
        match runtime.fork().await {
            Ok(copy) => {
                let agent = self.agent.fork_onto(Arc::new(copy.clone()));
                eprintln!(
                    "cave: forked {name} from {} (/switch {name} to go on there)",
                    self.branch
                );
                self.branches.push(ChatBranch {
                    name,
                    agent,
                    runtime: Backend::Kernel(copy),
                    undo: Vec::new(),
                });
            }
            Err(error) => eprintln!("cave: could not fork: {error}"),
        }
    }

    fn branch_taken(&self, name: &str) -> bool {
        self.branch == name || self.branches.iter().any(|b| b.name == name)
    }

    /// `/branches`: each branch and how long its conversation is; the current one marked.
    fn list_branches(&self) {
        let turns = |agent: &Agent| {
            agent
                .history()
                .iter()
                .filter(|m| matches!(m, cave_agent::Message::User { .. }))
                .count()
        };
        eprintln!("* {} ({} prompts)", self.branch, turns(&self.agent));
        for branch in &self.branches {
            eprintln!("  {} ({} prompts)", branch.name, turns(&branch.agent));
        }
    }

    /// `/switch NAME`: the chat goes on in branch NAME; the one it was on is kept.
    fn switch(&mut self, name: &str) {
        if name == self.branch {
            eprintln!("cave: already on {name}");
            return;
        }
        let Some(other) = self.branches.iter_mut().find(|b| b.name == name) else {
            let names: Vec<&str> = self.branches.iter().map(|b| b.name.as_str()).collect();
            eprintln!(
                "cave: no branch {name} (the others are: {})",
                if names.is_empty() {
                    "none; /fork makes one".to_owned()
                } else {
                    names.join(", ")
                }
            );
            return;
        };
        std::mem::swap(&mut self.branch, &mut other.name);
        std::mem::swap(&mut self.agent, &mut other.agent);
        std::mem::swap(&mut self.runtime, &mut other.runtime);
        std::mem::swap(&mut self.undo, &mut other.undo);
        eprintln!("cave: on {name} now ({} kept)", other.name);
    }

    /// Prints each `--retrieve` variable that is bound; returns a one-line message for each
    /// one that is not (for stderr, and exit status 1).
    async fn retrieve_all(&mut self) -> io::Result<Vec<String>> {
        let mut missing = Vec::new();
        for name in std::mem::take(&mut self.retrieve) {
            let retrieved = match self.runtime.runtime().get(&name).await {
                Ok(value) => match serde_json::to_value(&value) {
                    Ok(value) => Retrieved::Json { name, value },
                    Err(_) => self.repr(name, value.python_type().to_owned()).await,
                },
                Err(RuntimeError::Unsupported { python_type, .. }) => {
                    self.repr(name, python_type).await
                }
                Err(RuntimeError::Unbound { .. }) => {
                    missing.push(self.not_bound(&name).await);
                    continue;
                }
                Err(e) => Retrieved::Missing {
                    name,
                    error: e.to_string(),
                },
            };
            self.output.retrieved(&retrieved)?;
        }
        Ok(missing)
    }

    /// "--retrieve x: not bound; registered variables: a, b; also bound: c".
    async fn not_bound(&self, name: &str) -> String {
        let runtime = self.runtime.runtime();
        let registered = match runtime.retrieve(name).await {
            Err(RuntimeError::UnknownVariable { available, .. }) => available,
            _ => Vec::new(),
        };
        let others: Vec<String> = runtime
            .namespace()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|bound| !bound.callable && !registered.contains(&bound.name))
            .map(|bound| bound.name)
            .collect();
        let list = |names: &[String]| {
            let shown: Vec<&str> = names.iter().take(20).map(String::as_str).collect();
            let more = names.len().saturating_sub(shown.len());
            let mut text = shown.join(", ");
            if more > 0 {
                text.push_str(&format!(" and {more} more"));
            }
            text
        };
        let mut message = format!("--retrieve {name}: no such variable in the runtime");
        match (registered.is_empty(), others.is_empty()) {
            (true, true) => message.push_str("; nothing is bound"),
            (false, true) => {
                message.push_str(&format!("; registered variables: {}", list(&registered)))
            }
            (true, false) => message.push_str(&format!("; bound: {}", list(&others))),
            (false, false) => message.push_str(&format!(
                "; registered variables: {}; also bound: {}",
                list(&registered),
                list(&others)
            )),
        }
        message
    }

    async fn repr(&self, name: String, python_type: String) -> Retrieved {
        match self
            .runtime
            .runtime()
            .execute(&format!("print(repr({name}), end='')"), &DiscardOutput)
            .await
        {
            Ok(run) if run.success() => Retrieved::Repr {
                name,
                repr: run.output,
                python_type,
            },
            Ok(run) => Retrieved::Missing {
                name,
                error: run.output,
            },
            Err(e) => Retrieved::Missing {
                name,
                error: e.to_string(),
            },
        }
    }
}

/// `cave skills list|validate PATH`: reads and checks skills, runs nothing.
/// `network active, filesystem unavailable (why), …`.
/// How long an MCP server has to end by itself when the session ends, before it is killed.
const MCP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Starts (or reaches) the MCP server `name` and lists its tools.
async fn start_mcp(
    name: &str,
    server: &config::McpSource,
    timeout: std::time::Duration,
) -> anyhow::Result<Arc<cave_agent::mcp::McpTools>> {
    let server = match server {
        config::McpSource::Stdio(server) => cave_agent::mcp::McpServer::stdio(name, server).await?,
        config::McpSource::Http(server) => cave_agent::mcp::McpServer::http(name, server).await?,
    };
    let tools = cave_agent::mcp::McpTools::new(Arc::new(server), timeout).await?;
    Ok(Arc::new(tools))
}

/// `cave mcp list NAME=COMMAND|URL`: the object and methods the model would get.
async fn mcp_list(spec: &str, headers: &[String]) -> Exit {
    let listed = async {
        let (name, mut server) = config::mcp_server(spec)?;
        for header in headers {
            config::mcp_header(&mut server, header, config::environment_value)?;
        }
        let tools = start_mcp(&name, &server, cave_agent::mcp::DEFAULT_CALL_TIMEOUT).await?;
        let mut registry = cave_agent::Registry::new();
        registry.claim(Resources::new().object(tools.binding()))?;
        let description = registry.describe();
        let shown = format!(
            "<variables>\n{}\n</variables>\n\n<types>\n{}\n</types>",
            description.variables, description.types
        );
        tools.server().close(MCP_GRACE).await;
        anyhow::Ok(shown)
    };
    match listed.await {
        Ok(shown) => {
            println!("{shown}");
            Exit::Completed
        }
        Err(e) => {
            eprintln!("cave: {e:#}");
            Exit::Usage
        }
    }
}

/// `cave mcp serve`: one session, served until the client closes stdin (or, over HTTP, until
/// Ctrl-C).
async fn mcp_serve(config: config::ServeConfig) -> anyhow::Result<()> {
    use cave_agent::mcp::serve::{ClientApprovals, SessionServer};
    let config::ServeConfig {
        runtime: provisions,
        guards:
            config::GuardsConfig {
                policy,
                approve,
                audit,
            },
        cell_timeout,
        max_output,
        http,
        max_branches,
    } = config;
    // Over stdio, descriptors 0 and 1 carry MCP: the server keeps duplicates, and cells get
    // /dev/null to read and, in this process, a capture to write to.
    let stdio = match http {
        None => Some(McpStdio::take()?),
        Some(_) => None,
    };
    let (backend, provisions) = open_runtime(provisions, audit.as_ref()).await?;
    let _capture = match (&stdio, &backend) {
        (Some(_), Backend::InProc(rt)) => {
            cave_agent::inproc::send_stray_output_to_stderr()?;
            let capture = StdioCapture::start(CapturedStreams::Stdout)
                .context("could not capture descriptor 1")?;
            rt.attach_stdio(&capture);
            Some(capture)
        }
        _ => None,
    };
    let approvals = ClientApprovals::new();
    let call_approver = approve
        .filter(|a| a.calls())
        .map(|_| approvals.clone() as Arc<dyn cave_agent::Approver>);
    let guard = call_guard(call_approver, audit.clone());
    let (servers, skills) = provide(&backend, provisions, guard).await?;
    let mut server = SessionServer::new(backend.shared()).with_max_branches(max_branches);
    if let Some(policy) = policy {
        server = server.with_policy(Arc::new(policy));
    }
    if let Some(approve) = approve {
        server = server.with_approvals(approvals, approve.cells());
    }
    if let Some(audit) = audit {
        server = server.with_observer(audit);
    }
    if let Some(limit) = cell_timeout {
        server = server.with_cell_timeout(limit);
    }
    if let Some(chars) = max_output {
        server = server.with_max_output(chars);
    }
    if let Some(listing) = skills {
        server = server.with_notes(format!(
            "<skills>\n{listing}\n</skills>{}",
            cave_agent::prompt::SKILLS_INSTRUCTION
        ));
    }
    let served = match (stdio, http) {
        (Some(stdio), _) => {
            eprintln!("cave: serving the session over MCP on stdio");
            server
                .serve_stdio(stdio.input, stdio.output)
                .await
                .map_err(anyhow::Error::from)
        }
        (None, Some((addr, token, generated))) => serve_http(server, addr, &token, generated).await,
        (None, None) => Ok(()),
    };
    for tools in servers {
        tools.server().close(MCP_GRACE).await;
    }
    served
}

/// Descriptors 0 and 1 as the MCP transport: duplicates for the server, `/dev/null` left at 0.
struct McpStdio {
    input: tokio::fs::File,
    output: tokio::fs::File,
}

impl McpStdio {
    fn take() -> anyhow::Result<Self> {
        use std::os::fd::AsRawFd;
        let input = io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .context("could not duplicate stdin")?;
        let output = io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .context("could not duplicate stdout")?;
        let null = std::fs::File::open("/dev/null").context("could not open /dev/null")?;
        // SAFETY: both descriptors are open; 0 is replaced in one call.
        if unsafe { libc::dup2(null.as_raw_fd(), 0) } < 0 {
            return Err(io::Error::last_os_error()).context("could not give cells /dev/null");
        }
        Ok(Self {
            input: tokio::fs::File::from_std(input.into()),
            output: tokio::fs::File::from_std(output.into()),
        })
    }
}

/// `--http`: serves until Ctrl-C.
async fn serve_http(
    server: cave_agent::mcp::serve::SessionServer,
    addr: std::net::SocketAddr,
    token: &str,
    generated: bool,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--http {addr}: cannot listen there"))?;
    let serving = server.serve_http(listener, token)?;
    eprintln!(
        "cave: serving the session over MCP at {} (Ctrl-C stops)",
        serving.url()
    );
    if generated {
        // Made up for this session, and shown once: to the user who started it.
        eprintln!("cave: clients send the header: Authorization: Bearer {token}");
    } else {
        eprintln!(
            "cave: clients send the header: Authorization: Bearer ${}",
            config::SERVE_TOKEN_VARIABLE
        );
    }
    stop_requested()
        .await
        .context("cannot wait for Ctrl-C or SIGTERM")?;
    serving.stop().await;
    Ok(())
}

/// `cave view FILE|DIR`: serves the session in FILE (or a `--session` directory's event log),
/// following it as it grows, until Ctrl-C.
async fn view_command(args: &crate::args::ViewArgs) -> Exit {
    let file = if args.file.is_dir() {
        let log = args.file.join(SESSION_EVENTS);
        if !log.is_file() {
            eprintln!(
                "cave: {} holds no {SESSION_EVENTS}: give a file `cave run --json` wrote, or a directory `cave run --session` keeps (it writes its events there as they happen)",
                args.file.display()
            );
            return Exit::Usage;
        }
        log
    } else {
        args.file.clone()
    };
    let feed = crate::view::Feed::new(crate::view::base_of(&file));
    if let Err(e) = crate::view::follow(&file, feed.clone()) {
        eprintln!("cave: {e}");
        return Exit::Usage;
    }
    let title = args.file.display().to_string();
    let viewer = match crate::view::Viewer::serve(args.addr, feed, &title).await {
        Ok(viewer) => viewer,
        Err(e) => {
            eprintln!("cave: {e}");
            return Exit::Usage;
        }
    };
    eprintln!("cave: viewing {title} at {} (Ctrl-C stops)", viewer.url());
    match stop_requested().await {
        Ok(()) => Exit::Completed,
        Err(e) => {
            eprintln!("cave: cannot wait for Ctrl-C or SIGTERM: {e}");
            Exit::Stopped
        }
    }
}

fn sandbox_summary(layers: &[cave_agent::kernel::Layer]) -> String {
    use cave_agent::kernel::LayerState;
    layers
        .iter()
        .map(|layer| match &layer.state {
            LayerState::Active(_) => format!("{} active", layer.name),
            LayerState::Unavailable(why) => format!("{} UNAVAILABLE ({why})", layer.name),
            _ => format!("{} off", layer.name),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `cave doctor`.
fn doctor() -> Exit {
    println!("Sandbox layers of the kernel runtime on this machine (--sandbox strict):");
    for layer in cave_agent::kernel::sandbox_support() {
        match &layer.state {
            cave_agent::kernel::LayerState::Active(how) => {
                println!("  {}: supported ({how})", layer.name);
            }
            _ => println!("  {layer}"),
        }
    }
    println!("Processes: {}", cave_agent::kernel::containment_support());
    println!(
        "Egress allowlist (--allow-net): {}",
        cave_agent::kernel::egress_support()
    );
    println!(
        "Default limits (--sandbox strict): {}",
        cave_agent::kernel::KernelConfig::new().limits_in_force()
    );
    match KernelRuntime::new() {
        Ok(rt) => println!(
            "Python: {}",
            rt.python().unwrap_or(std::path::Path::new("-")).display()
        ),
        Err(e) => println!("Python: {e}"),
    }
    let missing: Vec<String> = cave_agent::kernel::Need::ALL
        .into_iter()
        .filter_map(cave_agent::kernel::Need::lacking)
        .collect();
    if missing.is_empty() {
        println!("Missing here: nothing");
    } else {
        println!("Missing here (the layers above say what holds without it):");
        for line in missing {
            println!("  {line}");
        }
    }
    Exit::Completed
}

fn skills_command(command: &SkillsCommand) -> Exit {
    let (path, list) = match command {
        SkillsCommand::List { path } => (path, true),
        SkillsCommand::Validate { path } => (path, false),
    };
    let found = cave_agent::skills::discover(path);
    for warning in &found.warnings {
        eprintln!("cave: warning: {warning}");
    }
    for error in &found.errors {
        eprintln!("cave: {error}");
    }
    if list {
        let rows: Vec<[String; 4]> = found
            .skills
            .iter()
            .map(|s| {
                let description: String = s
                    .description
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ");
                // At most 60 characters, the last one `…` when cut.
                let description = match cave_agent::shorten(&description, 60) {
                    (_, true) => format!("{}…", cave_agent::shorten(&description, 59).0),
                    (_, false) => description,
                };
                [
                    s.name.clone(),
                    description,
                    s.files.len().to_string(),
                    if s.injects() { "yes" } else { "no" }.to_owned(),
                ]
            })
            .collect();
        let header = ["NAME", "DESCRIPTION", "FILES", "INJECTS"].map(str::to_owned);
        let width = |i: usize| {
            std::iter::once(&header)
                .chain(&rows)
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths = [width(0), width(1), width(2)];
        for row in std::iter::once(&header).chain(&rows) {
            println!(
                "{:w0$}  {:w1$}  {:>w2$}  {}",
                row[0],
                row[1],
                row[2],
                row[3],
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2]
            );
        }
    } else if found.is_valid() {
        println!(
            "{}: {} skill{}, valid",
            path.display(),
            found.skills.len(),
            if found.skills.len() == 1 { "" } else { "s" }
        );
    }
    if found.is_valid() {
        Exit::Completed
    } else {
        Exit::Stopped
    }
}

fn open_model(source: ModelSource) -> anyhow::Result<Box<dyn Model>> {
    Ok(match source {
        ModelSource::Server {
            provider: Provider::Openai,
            config,
        } => Box::new(OpenAiModel::new(config)?),
        ModelSource::Server {
            provider: Provider::Litellm,
            config,
        } => Box::new(LiteLlmModel::new(config)?),
        // An execution result that differs from the recording (another Python's wording) is
        // played anyway, and said.
        ModelSource::Replay(path) => Box::new(
            ReplayModel::open(&path)?.on_difference(|difference| eprintln!("cave: {difference}")),
        ),
    })
}

/// The compactor: summaries by `summarizer` within `context_window`, the model's output cap
/// kept free, exact counts for OpenAI models and the script-aware estimate otherwise.
fn compactor(
    model: &Arc<dyn Model>,
    summarizer: Arc<dyn Model>,
    context_window: u64,
) -> ContextCompactor {
    let mut compactor = ContextCompactor::new(summarizer).with_context_window(context_window);
    if let Some(tokens) = model.info().max_output_tokens {
        compactor = compactor.with_output_reserve(u64::from(tokens));
    }
    compactor
}

/// The runtime chosen, started now where starting can fail in a way the user should hear
/// before the model is asked (a Jupyter server's URL or token, the sandbox's layers, which
/// are then reported, and recorded in the audit log).
/// Writes each connection through the egress proxy to the audit trail (`"kind": "egress"`).
struct AuditedEgress(Arc<cave_agent::AuditLog>);

impl cave_agent::kernel::EgressObserver for AuditedEgress {
    fn connection(&self, record: &cave_agent::kernel::EgressRecord) {
        self.0.record(
            "egress",
            serde_json::json!({
                "host": record.host,
                "port": record.port,
                "address": record.address.map(|a| a.to_string()),
                "allowed": record.allowed,
                "reason": record.reason,
                "sent": record.sent,
                "received": record.received,
            }),
        );
    }
}

async fn open_runtime(
    config: config::RuntimeConfig,
    audit: Option<&Arc<cave_agent::AuditLog>>,
) -> anyhow::Result<(Backend, Provisions)> {
    let config::RuntimeConfig {
        variables,
        python_files,
        choice,
        skills,
        mcp,
        mcp_timeout,
    } = config;
    let provisions = Provisions {
        variables,
        python_files,
        skills,
        mcp,
        mcp_timeout,
    };
    let backend = match choice {
        RuntimeChoice::InProc { max_cell_output } => {
            let runtime =
                InProcRuntime::new().context("the in-process Python runtime could not start")?;
            runtime.set_cell_limits(CellLimits::default().max_cell_output(max_cell_output));
            Backend::InProc(runtime)
        }
        RuntimeChoice::Jupyter(config) => {
            let url = config.url().to_owned();
            let rt = KernelRuntime::jupyter(*config);
            rt.start()
                .await
                .with_context(|| format!("no Jupyter kernel at {url}"))?;
            Backend::Kernel(rt)
        }
        RuntimeChoice::Kernel(config) => {
            let sandboxed = !config.sandbox_in_force().is_off();
            let mut config = *config;
            if let Some(audit) = audit {
                config = config.egress_observer(Arc::new(AuditedEgress(audit.clone())));
            }
            let rt = KernelRuntime::with_config(config)
                .context("the kernel runtime could not be set up")?;
            if sandboxed {
                rt.start()
                    .await
                    .context(
                        "the sandboxed kernel runtime could not start (`cave doctor` lists the layers this machine supports; --sandbox off runs without them)",
                    )?;
                let layers = rt.sandbox_layers().await.unwrap_or_default();
                eprintln!("cave: sandbox: {}", sandbox_summary(&layers));
                if let Some(limits) = rt.limits().await {
                    eprintln!("cave: limits: {limits}");
                }
                if let Some(audit) = audit {
                    let layers: Vec<String> = layers.iter().map(ToString::to_string).collect();
                    audit.record("sandbox", serde_json::json!({ "layers": layers }));
                }
            }
            Backend::Kernel(rt)
        }
    };
    Ok((backend, provisions))
}

/// What the options give a runtime once it runs.
struct Provisions {
    variables: Vec<cave_agent::Variable>,
    python_files: Vec<std::path::PathBuf>,
    skills: cave_agent::SkillSet,
    mcp: Vec<(String, config::McpSource)>,
    mcp_timeout: std::time::Duration,
}

/// Gives the runtime the variables, Python files, skills and MCP servers, each host call
/// through `guard`; the servers' objects follow their tool lists. Returns the servers (to close
/// when the session ends) and the skills' listing.
async fn provide(
    backend: &Backend,
    provisions: Provisions,
    guard: impl Fn(Resource) -> Resource + Send + Sync + 'static,
) -> anyhow::Result<(Vec<Arc<cave_agent::mcp::McpTools>>, Option<String>)> {
    let runtime = backend.runtime();
    let guard = Arc::new(guard);
    let resources = provisions
        .variables
        .into_iter()
        .fold(Resources::new(), Resources::variable);
    runtime.register(resources).await?;
    for path in &provisions.python_files {
        runtime
            .register_python_file(path, false)
            .await
            .with_context(|| format!("--py {}", path.display()))?;
    }
    let listing = provisions
        .skills
        .install_into(runtime, |batch| batch.map(&*guard))
        .await
        .context("--skills")?;
    // A header's value (a token) is redacted from everything the model reads and every event,
    // should a server echo it; so is its credential without the scheme (`Bearer …`).
    for (name, server) in &provisions.mcp {
        let config::McpSource::Http(http) = server else {
            continue;
        };
        let mut registry = cave_agent::lock(runtime.registry());
        for (key, value) in &http.headers {
            registry.redact(format!("{name} {key}"), value.clone());
            if let Some((_, credential)) = value.split_once(' ')
                && credential.trim().len() >= 8
            {
                registry.redact(format!("{name} {key}"), credential.trim().to_owned());
            }
        }
    }
    // Started together: slow servers do not add up. On an error the servers started are
    // dropped, which ends them.
    let timeout = provisions.mcp_timeout;
    let started = futures_util::future::join_all(
        provisions
            .mcp
            .iter()
            .map(|(name, server)| start_mcp(name, server, timeout)),
    )
    .await;
    let mut servers = Vec::new();
    let mut failure = None;
    for started in started {
        match started {
            Ok(tools) => servers.push(tools),
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    for tools in &servers {
        let name = tools.server().name();
        let batch = Resources::new().object(tools.binding()).map(&*guard);
        runtime
            .register(batch)
            .await
            .with_context(|| format!("--mcp {name}"))?;
        let guard = guard.clone();
        tools.follow_changes(backend.shared(), move |batch| batch.map(&*guard));
    }
    Ok((servers, listing))
}

/// What every host call is wrapped in: asked about first when `approver` is set, recorded
/// when `audit` is.
fn call_guard(
    approver: Option<Arc<dyn cave_agent::Approver>>,
    audit: Option<Arc<cave_agent::AuditLog>>,
) -> impl Fn(Resource) -> Resource + Send + Sync + 'static {
    move |resource: Resource| match resource {
        Resource::Function(mut function) => {
            if let Some(approver) = &approver {
                function = cave_agent::requiring_approval(function, approver.clone());
            }
            if let Some(log) = &audit {
                function = cave_agent::audited(function, log.clone());
            }
            Resource::Function(function)
        }
        Resource::Object(mut object) => {
            if let Some(approver) = &approver {
                object = cave_agent::object_requiring_approval(
                    object,
                    approver.clone(),
                    MethodFilter::All,
                );
            }
            if let Some(log) = &audit {
                object = cave_agent::audited_object(object, log.clone(), MethodFilter::All);
            }
            Resource::Object(object)
        }
        other => other,
    }
}

/// Where the session's events go (through the redactor), and, for JSON Lines with the
/// in-process runtime, the capture that keeps what cells write off stdout.
fn open_output(
    mode: OutputMode,
    runtime: &Backend,
    redactor: &SecretRedactor,
) -> anyhow::Result<(Box<dyn Output>, Option<StdioCapture>)> {
    let host_stdout = io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .context("could not duplicate stdout")?;
    let capture = if mode == OutputMode::Json && matches!(runtime, Backend::InProc(_)) {
        // Only events may reach stdout: what cells write to descriptors 1 and 2 is theirs, and
        // output outside any cell goes to stderr.
        cave_agent::inproc::send_stray_output_to_stderr()?;
        let capture = StdioCapture::start(CapturedStreams::StdoutAndStderr)
            .context("could not capture the standard descriptors")?;
        runtime.attach_stdio(&capture);
        Some(capture)
    } else {
        None
    };
    let stdout = RedactingStdout {
        out: host_stdout.into(),
        buffer: Vec::new(),
        redactor: redactor.clone(),
    };
    let output: Box<dyn Output> = match mode {
        OutputMode::Json => Box::new(JsonLines::new(stdout)),
        OutputMode::Human { color, images } => {
            // The conversation on stdout; errors and warnings on stderr.
            let stderr = RedactingStdout {
                out: io::stderr()
                    .as_fd()
                    .try_clone_to_owned()
                    .context("could not duplicate stderr")?
                    .into(),
                buffer: Vec::new(),
                redactor: redactor.clone(),
            };
            Box::new(
                Human::new(stdout, color)
                    .with_errors(Box::new(stderr))
                    .with_images(images),
            )
        }
    };
    Ok((output, capture))
}

#[cfg(test)]
mod tests {
    use super::ChatCommand;

    /// A `/word` line is a command (or a mistyped one, said as such); a line that merely starts
    /// with a path is a prompt.
    #[test]
    fn chat_commands_are_told_from_prompts() {
        assert_eq!(ChatCommand::parse("/undo"), Some(Ok(ChatCommand::Undo)));
        assert_eq!(
            ChatCommand::parse("  /fork  try-2 "),
            Some(Ok(ChatCommand::Fork(Some("try-2".to_owned()))))
        );
        assert_eq!(
            ChatCommand::parse("/switch main"),
            Some(Ok(ChatCommand::Switch("main".to_owned())))
        );
        assert!(matches!(ChatCommand::parse("/switch"), Some(Err(_))));
        assert!(matches!(ChatCommand::parse("/fork a/b"), Some(Err(_))));
        assert!(matches!(ChatCommand::parse("/undo now"), Some(Err(_))));
        assert!(matches!(ChatCommand::parse("/help"), Some(Err(e)) if e.contains("/fork [NAME]")));
        assert_eq!(ChatCommand::parse("/etc/hosts has a typo"), None);
        assert_eq!(ChatCommand::parse("fork it"), None);
        assert_eq!(ChatCommand::parse("/"), None);
    }
}

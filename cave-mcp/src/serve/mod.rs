//! A runtime's session as an MCP server: tools to run a cell, read a variable as JSON and list
//! what is bound, over stdio or streamable HTTP (loopback, with a token). The host's code
//! policy, cell time limit, approvals (asked of the client as MCP elicitation) and audit apply
//! as they do to an agent's cells.
//!
//! Branches: on a runtime that can fork (the kernel runtime), `fork` makes a branch of the
//! session (a copy of its namespace that goes on on its own), named in the result; the other
//! tools take a `branch` to act on one, and `drop_branch` ends it. A server holds at most
//! [`DEFAULT_MAX_BRANCHES`] live branches unless told otherwise (`with_max_branches`).
//!
//! Approvals: a client on a protocol with the `initialize` handshake is asked with an
//! `elicitation/create` request while its `tools/call` waits; a client on 2026-07-28 or later
//! (where servers send no requests of their own) gets an `InputRequiredResult`, and the cell
//! waits, paused at its question, for the call to be sent again with the answer. A client that
//! declared no elicitation support is never asked: what needs approval is refused.

mod approval;
mod cell;
mod http;

pub use approval::ClientApprovals;
pub use http::{HttpServing, generate_token};

use crate::McpError;
use approval::Question;
use cave_core::{
    Approval, CodePolicy, Event, EventObserver, Runtime, RuntimeError, RuntimeExt, lock,
};
use cell::CellResult;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ElicitRequest,
    Implementation, InputRequest, InputRequiredResult, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value as Json, json};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// How long a cell paused at a question waits for the client to send its call again with the
/// answer (protocol 2026-07-28); then the question is refused.
pub const ANSWER_WAIT: Duration = Duration::from_secs(600);

/// How long `list_bound`'s listing of the namespace may take without a cell time limit.
const LISTING_LIMIT: Duration = Duration::from_secs(30);

/// The key of the approval among a call's input requests.
const APPROVAL_KEY: &str = "approval";

/// How many live branches a server holds unless told otherwise: each is a process.
pub const DEFAULT_MAX_BRANCHES: usize = 8;

/// The live branches of a served session, by name, and how many may live at once.
#[derive(Default)]
struct Branches {
    live: std::collections::BTreeMap<String, Arc<Shared>>,
    /// Names handed out so far (`b1`, `b2`, …): a name is never reused.
    made: u64,
}

/// One persistent session served over MCP: every client (and every HTTP session) reaches the
/// same runtime, one cell at a time.
#[derive(Clone)]
pub struct SessionServer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SessionServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionServer")
            .field("policy", &self.shared.policy.is_some())
            .field("approve_cells", &self.shared.approve_cells)
            .field("cell_timeout", &self.shared.cell_timeout)
            .finish_non_exhaustive()
    }
}

/// What every handler of the session shares.
pub(crate) struct Shared {
    pub(crate) runtime: Arc<dyn Runtime>,
    pub(crate) policy: Option<Arc<dyn CodePolicy>>,
    pub(crate) approvals: Option<Arc<ClientApprovals>>,
    pub(crate) approve_cells: bool,
    observer: Option<Arc<dyn EventObserver>>,
    pub(crate) cell_timeout: Option<Duration>,
    pub(crate) max_output: usize,
    pub(crate) persisted_floor: AtomicU64,
    /// Said to clients when they connect, after what the server is.
    notes: String,
    /// One cell at a time; held by a cell paused at a question too.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Cells paused at a question, by the token their client sends back with the answer.
    paused: Mutex<HashMap<String, Paused>>,
    /// The session's live branches (shared by every copy of the server; empty in a branch).
    branches: Arc<Mutex<Branches>>,
    max_branches: usize,
}

impl Shared {
    /// The same session (runtime, turn, stored outputs' numbering) with settings of its own to
    /// change; no cell paused at a question comes along.
    fn copy(&self) -> Self {
        Self {
            runtime: self.runtime.clone(),
            policy: self.policy.clone(),
            approvals: self.approvals.clone(),
            approve_cells: self.approve_cells,
            observer: self.observer.clone(),
            cell_timeout: self.cell_timeout,
            max_output: self.max_output,
            persisted_floor: AtomicU64::new(
                self.persisted_floor
                    .load(std::sync::atomic::Ordering::SeqCst),
            ),
            notes: self.notes.clone(),
            turn: self.turn.clone(),
            paused: Mutex::default(),
            branches: self.branches.clone(),
            max_branches: self.max_branches,
        }
    }

    /// A branch's session: these settings on `runtime`, with a turn and an output numbering
    /// of its own.
    fn branch(&self, runtime: Arc<dyn Runtime>) -> Self {
        Self {
            runtime,
            turn: Arc::default(),
            branches: Arc::default(),
            ..self.copy()
        }
    }

    pub(crate) fn observe(&self, event: Event) {
        if let Some(observer) = &self.observer {
            observer.observe(&event);
        }
    }
}

/// A cell on its way: its task, the questions it asks, and the turn it holds.
struct Running {
    task: tokio::task::JoinHandle<CellResult>,
    questions: mpsc::UnboundedReceiver<Question>,
    _turn: tokio::sync::OwnedMutexGuard<()>,
}

/// A cell paused at a question until its client answers (or [`ANSWER_WAIT`] passes).
struct Paused {
    running: Running,
    answer: tokio::sync::oneshot::Sender<Approval>,
}

impl SessionServer {
    /// Serves `runtime` (with what the host registered in it) with no policy, no approvals, no
    /// time limit, and the agent's inline output limit.
    pub fn new(runtime: Arc<dyn Runtime>) -> Self {
        Self {
            shared: Arc::new(Shared {
                runtime,
                policy: None,
                approvals: None,
                approve_cells: false,
                observer: None,
                cell_timeout: None,
                max_output: cave_core::DEFAULT_MAX_EXEC_OUTPUT,
                persisted_floor: AtomicU64::new(1),
                notes: String::new(),
                turn: Arc::default(),
                paused: Mutex::default(),
                branches: Arc::default(),
                max_branches: DEFAULT_MAX_BRANCHES,
            }),
        }
    }

    /// Changes this server's settings; a copy made before (`clone`) keeps its own, and the
    /// two still share the session (its runtime, its one cell at a time).
    fn configure(mut self, change: impl FnOnce(&mut Shared)) -> Self {
        if Arc::get_mut(&mut self.shared).is_none() {
            self.shared = Arc::new(self.shared.copy());
        }
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            change(shared);
        }
        self
    }

    /// Screens each cell with `policy`: a refused cell does not run, and the client is told
    /// why.
    pub fn with_policy(self, policy: Arc<dyn CodePolicy>) -> Self {
        self.configure(|s| s.policy = Some(policy))
    }

    /// Asks the client about what `approvals` guards (the host calls wrapped with it), and,
    /// with `cells`, about each cell before it runs.
    pub fn with_approvals(self, approvals: Arc<ClientApprovals>, cells: bool) -> Self {
        self.configure(|s| {
            s.approvals = Some(approvals);
            s.approve_cells = cells;
        })
    }

    /// Tells `observer` what happens to each cell, as the agent's events (an audit log).
    pub fn with_observer(self, observer: Arc<dyn EventObserver>) -> Self {
        self.configure(|s| s.observer = Some(observer))
    }

    /// Stops a cell that runs longer than `limit`.
    pub fn with_cell_timeout(self, limit: Duration) -> Self {
        self.configure(|s| s.cell_timeout = Some(limit))
    }

    /// Outputs longer than `chars` are stored in the runtime (`_output_N`) and the client gets
    /// their beginning and a marker.
    pub fn with_max_output(self, chars: usize) -> Self {
        self.configure(|s| s.max_output = chars)
    }

    /// Holds at most `n` live branches (`fork` refuses past it; 0: no forking).
    pub fn with_max_branches(self, n: usize) -> Self {
        self.configure(|s| s.max_branches = n)
    }

    /// Adds `notes` to what clients are told when they connect (the sandbox's layers, the
    /// skills).
    pub fn with_notes(self, notes: impl Into<String>) -> Self {
        let notes = notes.into();
        self.configure(|s| s.notes = notes)
    }

    /// Serves one client over `read` and `write` (the process's stdin and stdout, say) until
    /// it closes its side.
    pub async fn serve_stdio<R, W>(self, read: R, write: W) -> Result<(), McpError>
    where
        R: tokio::io::AsyncRead + Send + Unpin + 'static,
        W: tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let failed = |e: &dyn std::fmt::Display| McpError::Protocol {
            server: "cave".to_owned(),
            message: e.to_string(),
        };
        let service = self.serve((read, write)).await.map_err(|e| failed(&e))?;
        service.waiting().await.map_err(|e| failed(&e))?;
        Ok(())
    }

    /// The tools this server offers: `fork` and `drop_branch` (and `branch` on the others)
    /// only where the runtime can fork and branches are allowed.
    fn tools(&self) -> Vec<Tool> {
        let forks = self.shared.runtime.can_fork() && self.shared.max_branches > 0;
        let mut tools = Self::all_tools();
        if !forks {
            tools.retain(|t| t.name != "fork" && t.name != "drop_branch");
            for tool in &mut tools {
                if let Some(Json::Object(properties)) =
                    Arc::make_mut(&mut tool.input_schema).get_mut("properties")
                {
                    properties.remove("branch");
                }
            }
        }
        tools
    }

    fn all_tools() -> Vec<Tool> {
        let schema = |value: Json| match value {
            Json::Object(map) => Arc::new(map),
            _ => Arc::default(),
        };
        let branch = json!({
            "type": "string",
            "description": "A branch made by fork to act on (by default, the session itself)."
        });
        vec![
            Tool::new(
                "run_cell",
                "Run Python code in the session's persistent namespace, as a notebook cell: \
                 what earlier cells defined is still there, a trailing expression's value is \
                 shown, and top-level `await` works. Returns the output (a traceback when the \
                 code raised) and the images it showed.",
                schema(json!({
                    "type": "object",
                    "properties": {
                        "code": {"type": "string", "description": "The Python code."},
                        "branch": branch,
                    },
                    "required": ["code"],
                })),
            ),
            Tool::new(
                "get_variable",
                "The value of a variable in the session's namespace, as JSON (for data: \
                 numbers, strings, lists, dicts, and the like).",
                schema(json!({
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "description": "The variable's name."},
                        "branch": branch,
                    },
                    "required": ["name"],
                })),
            ),
            Tool::new(
                "list_bound",
                "What the session has: the functions, objects and variables the host provides \
                 (with their signatures and descriptions), the names cells have bound, and the \
                 runtime's isolation, and the live branches.",
                schema(json!({"type": "object", "properties": {"branch": branch}})),
            ),
            Tool::new(
                "fork",
                "Make a branch of the session: a copy of its namespace (every variable, import \
                 and object, and what the host provides) that goes on on its own, to try \
                 something without changing the session. Returns the branch's name, which \
                 run_cell, get_variable and list_bound take as `branch`. A branch of a branch \
                 works. End one with drop_branch when done: a server holds few at once.",
                schema(json!({
                    "type": "object",
                    "properties": {"from": {
                        "type": "string",
                        "description": "The branch to copy (by default, the session itself)."
                    }},
                })),
            ),
            Tool::new(
                "drop_branch",
                "End a branch made by fork: its namespace is gone.",
                schema(json!({
                    "type": "object",
                    "properties": {"branch": {"type": "string", "description": "The branch's name."}},
                    "required": ["branch"],
                })),
            ),
        ]
    }

    /// `run_cell`: starts the cell (after the one running) and drives it.
    async fn run_cell(
        &self,
        code: String,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let turn = self.shared.turn.clone().lock_owned().await;
        let (to, questions) = mpsc::unbounded_channel();
        if let Some(approvals) = &self.shared.approvals {
            approvals.route(to);
        }
        let shared = self.shared.clone();
        let task = tokio::spawn(async move { cell::run(&shared, code).await });
        let running = Running {
            task,
            questions,
            _turn: turn,
        };
        self.drive(running, context).await
    }

    /// Waits for the cell, asking the client each question it asks; returns its result, or,
    /// on a protocol without server requests, the question (the cell paused until the call
    /// comes back with the answer).
    async fn drive(
        &self,
        mut running: Running,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let mut cancelled = false;
        loop {
            tokio::select! {
                result = &mut running.task => {
                    let result = result.unwrap_or_else(|e| CellResult {
                        text: format!("the cell's task failed: {e}"),
                        images: Vec::new(),
                        is_error: true,
                    });
                    return Ok(result.into_tool_result().into());
                }
                Some(question) = running.questions.recv() => {
                    match how_to_ask(context) {
                        Asking::Never(why) => {
                            let _ = question.answer.send(approval::refused(why));
                        }
                        Asking::Now => {
                            let answer = ask_now(context, &question).await;
                            let _ = question.answer.send(answer);
                        }
                        Asking::Later => return Ok(self.pause(running, question).into()),
                    }
                }
                () = context.ct.cancelled(), if !cancelled => {
                    // The client gave up on the call: stop the cell, and let it end.
                    cancelled = true;
                    if let Some(interrupter) = self.shared.runtime.interrupter() {
                        interrupter.interrupt();
                    }
                }
            }
        }
    }

    /// Pauses `running` at `question`; the client answers by sending the call again with the
    /// token.
    fn pause(&self, running: Running, question: Question) -> InputRequiredResult {
        let token = generate_token();
        let params = approval::elicitation(&question.request);
        lock(&self.shared.paused).insert(
            token.clone(),
            Paused {
                running,
                answer: question.answer,
            },
        );
        let shared = self.shared.clone();
        let expiring = token.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ANSWER_WAIT).await;
            let paused = lock(&shared.paused).remove(&expiring);
            if let Some(paused) = paused {
                let _ = paused
                    .answer
                    .send(approval::refused("the MCP client did not answer in time"));
                finish_unattended(paused.running).await;
            }
        });
        let requests = [(
            APPROVAL_KEY.to_owned(),
            InputRequest::Elicitation(ElicitRequest::new(params)),
        )]
        .into_iter()
        .collect();
        InputRequiredResult::new(Some(requests), Some(token))
    }

    /// A call sent again with the answer to a paused cell's question.
    async fn resume(
        &self,
        params: &CallToolRequestParams,
        token: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // The cell may be paused in a branch: its server drives it on.
        let mut server = self.clone();
        let mut paused = lock(&self.shared.paused).remove(token);
        if paused.is_none() {
            let branches = lock(&self.shared.branches);
            for shared in branches.live.values() {
                if let Some(found) = lock(&shared.paused).remove(token) {
                    paused = Some(found);
                    server = SessionServer {
                        shared: shared.clone(),
                    };
                    break;
                }
            }
        }
        let Some(paused) = paused else {
            return Ok(CallToolResult::error(vec![ContentBlock::text(
                "no cell is waiting for this answer (it was answered, or it waited too long and was refused): run the cell again",
            )])
            .into());
        };
        let answer = params
            .input_responses
            .as_ref()
            .and_then(|responses| responses.get(APPROVAL_KEY))
            .and_then(|response| serde_json::from_value(response.clone()).ok())
            .map_or_else(
                || approval::refused("the MCP client sent no answer"),
                |result| approval::answer(&result),
            );
        let _ = paused.answer.send(answer);
        server.drive(paused.running, context).await
    }

    /// `get_variable`.
    async fn get_variable(&self, name: &str) -> CallToolResult {
        let runtime = &self.shared.runtime;
        let value = match runtime.get(name).await {
            Ok(value) => value,
            Err(RuntimeError::Unsupported { python_type, .. }) => {
                return CallToolResult::error(vec![ContentBlock::text(format!(
                    "{name} is a {python_type}, which has no JSON form: run_cell with print({name}) (or convert it) instead"
                ))]);
            }
            Err(e) => return CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
        };
        match serde_json::to_value(&value) {
            Ok(json) => {
                let secrets = cave_core::SecretRedactor::new(runtime.secrets());
                let text = secrets.redact(&json.to_string());
                match serde_json::from_str::<Json>(&text) {
                    Ok(json) => CallToolResult::structured(json!({"name": name, "value": json})),
                    Err(e) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
                }
            }
            Err(_) => CallToolResult::error(vec![ContentBlock::text(format!(
                "{name} is a {}, which has no JSON form: run_cell with print({name}) instead",
                value.python_type()
            ))]),
        }
    }

    /// `list_bound`.
    async fn list_bound(&self) -> CallToolResult {
        let runtime = &self.shared.runtime;
        let mut text = self.host_description();
        // The listing is a cell of the host's, and a cell may have rebound the builtins it
        // calls (`print`, `sorted`): it gets the cells' time limit, and is stopped past it.
        let limit = self.shared.cell_timeout.unwrap_or(LISTING_LIMIT);
        let listed = match tokio::time::timeout(limit, runtime.namespace()).await {
            Ok(listed) => listed,
            Err(_) => {
                if let Some(interrupter) = runtime.interrupter() {
                    interrupter.interrupt();
                }
                Err(RuntimeError::Backend {
                    operation: "namespace",
                    message: format!("the listing did not finish within {limit:?}"),
                })
            }
        };
        match listed {
            Ok(names) => {
                text.push_str("\n\nBound in the namespace now:");
                if names.is_empty() {
                    text.push_str(" nothing");
                }
                for bound in names {
                    text.push_str(&format!("\n  {} ({})", bound.name, bound.python_type));
                }
            }
            Err(e) => text.push_str(&format!("\n\nThe namespace could not be listed: {e}")),
        }
        text.push_str("\n\n");
        text.push_str(&self.isolation());
        let branches = live_branches(&lock(&self.shared.branches));
        text.push_str(&format!("\n\nBranches: {branches}"));
        CallToolResult::success(vec![ContentBlock::text(text)])
    }

    /// The server of live branch `name`, or the error that says there is none.
    fn branch(&self, name: &str) -> Result<SessionServer, CallToolResult> {
        let branches = lock(&self.shared.branches);
        match branches.live.get(name) {
            Some(shared) => Ok(SessionServer {
                shared: shared.clone(),
            }),
            None => Err(CallToolResult::error(vec![ContentBlock::text(format!(
                "no branch {name:?}: {}",
                live_branches(&branches)
            ))])),
        }
    }

    /// `fork`: a branch of the session (or of branch `from`), named in the result.
    async fn fork(&self, from: Option<&str>) -> CallToolResult {
        let source = match from {
            None => self.clone(),
            Some(name) => match self.branch(name) {
                Ok(server) => server,
                Err(refusal) => return refusal,
            },
        };
        {
            let branches = lock(&self.shared.branches);
            if branches.live.len() >= self.shared.max_branches {
                return CallToolResult::error(vec![ContentBlock::text(format!(
                    "this server holds at most {} live branches: drop_branch one first ({})",
                    self.shared.max_branches,
                    live_branches(&branches)
                ))]);
            }
        }
        // Between cells: the source's turn is held while it is copied.
        let _turn = source.shared.turn.clone().lock_owned().await;
        let runtime = match source.shared.runtime.fork().await {
            Ok(runtime) => runtime,
            Err(e) => {
                return CallToolResult::error(vec![ContentBlock::text(format!(
                    "the session could not be forked: {e}"
                ))]);
            }
        };
        let mut branches = lock(&self.shared.branches);
        if branches.live.len() >= self.shared.max_branches {
            return CallToolResult::error(vec![ContentBlock::text(format!(
                "this server holds at most {} live branches: drop_branch one first",
                self.shared.max_branches
            ))]);
        }
        branches.made += 1;
        let name = format!("b{}", branches.made);
        let shared = Arc::new(source.shared.branch(runtime));
        branches.live.insert(name.clone(), shared);
        CallToolResult::structured(json!({"branch": name}))
    }

    /// `drop_branch`.
    fn drop_branch(&self, name: &str) -> CallToolResult {
        let mut branches = lock(&self.shared.branches);
        match branches.live.remove(name) {
            Some(_) => {
                CallToolResult::success(vec![ContentBlock::text(format!("branch {name} ended"))])
            }
            None => CallToolResult::error(vec![ContentBlock::text(format!(
                "no branch {name:?}: {}",
                live_branches(&branches)
            ))]),
        }
    }

    /// The host's resources as the model would see them.
    fn host_description(&self) -> String {
        let description = self.shared.runtime.describe();
        format!(
            "Provided by the host:\n<functions>\n{}\n</functions>\n<variables>\n{}\n</variables>\n<types>\n{}\n</types>",
            description.functions, description.variables, description.types
        )
    }

    /// The runtime's isolation layers, one line.
    fn isolation(&self) -> String {
        let layers = self.shared.runtime.isolation();
        if layers.is_empty() {
            return "Isolation: none (the runtime shares the server's process)".to_owned();
        }
        let layers: Vec<String> = layers.iter().map(ToString::to_string).collect();
        format!("Isolation: {}", layers.join("; "))
    }
}

/// The live branches, as a sentence's end.
fn live_branches(branches: &Branches) -> String {
    if branches.live.is_empty() {
        "no branch is live".to_owned()
    } else {
        let names: Vec<&str> = branches.live.keys().map(String::as_str).collect();
        format!("the live branches are {}", names.join(", "))
    }
}

/// How a question can reach the client of a request.
enum Asking {
    /// It declared no elicitation: the question is refused, with this reason.
    Never(&'static str),
    /// With an `elicitation/create` request, while the call waits.
    Now,
    /// In the call's result, the cell paused until the call comes back (2026-07-28 on).
    Later,
}

fn how_to_ask(context: &RequestContext<RoleServer>) -> Asking {
    let elicits = context
        .client_capabilities()
        .is_some_and(|capabilities| capabilities.elicitation.is_some());
    if !elicits {
        return Asking::Never(
            "the MCP client cannot be asked (it declared no elicitation support), so what needs approval is refused",
        );
    }
    match context.protocol_version() {
        Some(version) if !version.has_initialize() => Asking::Later,
        _ => Asking::Now,
    }
}

/// Asks with an `elicitation/create` request.
async fn ask_now(context: &RequestContext<RoleServer>, question: &Question) -> Approval {
    let params = approval::elicitation(&question.request);
    match context.peer.create_elicitation(params).await {
        Ok(result) => approval::answer(&result),
        Err(e) => approval::refused(&format!("the MCP client could not be asked: {e}")),
    }
}

/// Lets a cell nobody waits for any more run to its end, refusing its questions.
async fn finish_unattended(mut running: Running) {
    loop {
        tokio::select! {
            _ = &mut running.task => return,
            Some(question) = running.questions.recv() => {
                let _ = question
                    .answer
                    .send(approval::refused("the MCP client did not answer in time"));
            }
        }
    }
}

impl ServerHandler for SessionServer {
    fn get_info(&self) -> ServerConfig {
        let mut instructions = "A persistent Python session (cave-agent). run_cell runs code in \
             it; what one cell defines, the next can use. get_variable reads a variable as \
             JSON; list_bound says what the host provides and what cells have bound."
            .to_owned();
        if !self.shared.notes.is_empty() {
            instructions.push_str("\n\n");
            instructions.push_str(&self.shared.notes);
        }
        instructions.push_str("\n\n");
        instructions.push_str(&self.isolation());
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("cave", env!("CARGO_PKG_VERSION")))
            .with_instructions(instructions)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools().into_iter().find(|tool| tool.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if let Some(token) = &request.request_state {
            return self.resume(&request, token, &context).await;
        }
        let argument = |key: &str| -> Result<String, ErrorData> {
            request
                .arguments
                .as_ref()
                .and_then(|arguments| arguments.get(key))
                .and_then(Json::as_str)
                .map(str::to_owned)
                .ok_or_else(|| {
                    ErrorData::invalid_params(
                        format!("{} takes a string argument {key:?}", request.name),
                        None,
                    )
                })
        };
        let optional = |key: &str| -> Result<Option<String>, ErrorData> {
            match request.arguments.as_ref().and_then(|a| a.get(key)) {
                None | Some(Json::Null) => Ok(None),
                Some(Json::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(ErrorData::invalid_params(
                    format!("{}'s argument {key:?} is a string", request.name),
                    None,
                )),
            }
        };
        let name = request.name.as_ref();
        match name {
            "fork" => return Ok(self.fork(optional("from")?.as_deref()).await.into()),
            "drop_branch" => return Ok(self.drop_branch(&argument("branch")?).into()),
            "run_cell" | "get_variable" | "list_bound" => {}
            other => {
                return Err(ErrorData::invalid_params(
                    format!(
                        "no tool {other:?}: the tools are run_cell, get_variable, list_bound, fork and drop_branch"
                    ),
                    None,
                ));
            }
        }
        let server = match optional("branch")? {
            None => self.clone(),
            Some(branch) => match self.branch(&branch) {
                Ok(server) => server,
                Err(refusal) => return Ok(refusal.into()),
            },
        };
        match name {
            "run_cell" => server.run_cell(argument("code")?, &context).await,
            "get_variable" => Ok(server.get_variable(&argument("name")?).await.into()),
            _ => Ok(server.list_bound().await.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Configuring a copy of a server changes the copy only (and does not panic).
    #[test]
    fn a_clone_is_configured_on_its_own() {
        let runtime: Arc<dyn Runtime> = Arc::new(cave_testing::EchoRuntime::default());
        let first = SessionServer::new(runtime);
        let second = first.clone().with_cell_timeout(Duration::from_secs(3));
        assert_eq!(first.shared.cell_timeout, None);
        assert_eq!(second.shared.cell_timeout, Some(Duration::from_secs(3)));
        assert!(Arc::ptr_eq(&first.shared.turn, &second.shared.turn));
    }
}

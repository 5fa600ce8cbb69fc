//! The agent: one loop that streams the model, runs its first code block, and feeds the output
//! back, until the model answers or a limit stops it.

mod announce;
mod emit;
mod run;
mod search;
mod sub;

pub use emit::EventStream;
pub use sub::SubAgent;

use crate::RuntimeExt;
use crate::prompt::{self, TemplateError};
use crate::{
    ByteEstimator, CodePolicy, Compactor, Event, Message, Model, ModelInfo, NameError, NameKind,
    NoCompaction, Runtime, StopError, StopErrorKind, StopReason, TokenAnchor, TokenEstimator,
    Usage, highest_persisted_index, validate_name,
};
use futures_util::StreamExt;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How many times in a run an answer cut off by the output cap (or a broken stream) is resumed.
pub const MAX_OUTPUT_RECOVERIES: u32 = 3;

/// The tokens of images sent with one execution result when vision is on (about six
/// 1024 × 768 figures at high detail).
pub const DEFAULT_IMAGE_TOKENS: u64 = 6_000;

/// The characters of a cell's output shown inline; past them the output is stored in the
/// runtime and a marker with a preview is shown instead.
pub const DEFAULT_MAX_EXEC_OUTPUT: usize = 5000;

/// The characters of a stored output's preview in its marker.
pub const DEFAULT_PREVIEW_CHARS: usize = 2000;

/// How long an interrupted execution gets to unwind before the host stops waiting for it.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// The prefix of the variables stored outputs are bound to (`_output_1`, …).
pub const DEFAULT_PERSISTED_PREFIX: &str = "_output";

/// An LLM operating a live Python runtime.
///
/// Build one with [`AgentBuilder::new`] (or the facade's `Agent::builder`, which compacts).
/// [`stream`](Agent::stream) runs a prompt and yields [`Event`]s; [`run`](Agent::run) drains
/// the same stream into an [`AgentResponse`]. The agent
/// keeps the conversation across runs; the runtime keeps the objects.
pub struct Agent {
    model: Arc<dyn Model>,
    model_info: ModelInfo,
    runtime: Arc<dyn Runtime>,
    policy: Option<Arc<dyn CodePolicy>>,
    compactor: Arc<dyn Compactor>,
    estimator: Arc<dyn TokenEstimator>,
    config: Config,
    history: Vec<Message>,
    persisted_floor: u64,
    anchor: Option<TokenAnchor>,
    sub_agents: Vec<Arc<SubAgent>>,
    /// The sub-agents are bound in the runtime (done at the first run).
    sub_agents_registered: bool,
    /// `search_tools` is bound in the runtime (done at the first run that searches).
    tool_search_registered: bool,
    approver: Option<Arc<announce::Announcing>>,
    /// Whether the approver is asked before each cell.
    approve_cells: bool,
    observer: Option<Arc<dyn crate::EventObserver>>,
    /// The isolation last reported (a status when it changes).
    isolation: Vec<crate::Layer>,
    /// Display items shown so far (their files are numbered by it).
    displays: u64,
    /// What the session has cost so far.
    ledger: crate::Ledger,
}

/// The agent's settings (see [`AgentBuilder`] for each): the builder holds them as given,
/// and `build` checks them and completes the two it derives (the output prefix, the system
/// instructions).
#[derive(Clone, Debug)]
struct Config {
    max_steps: u32,
    max_run_time: Option<Duration>,
    max_total_tokens: Option<u64>,
    max_input_tokens: Option<u64>,
    max_output_tokens: Option<u64>,
    /// The session's budgets: money (US dollars), the runtime's processor time, host calls.
    max_cost: Option<f64>,
    max_cpu_time: Option<Duration>,
    max_host_calls: Option<u64>,
    /// What a million tokens cost, for calls the provider reports no cost for.
    price: Option<crate::Price>,
    max_exec_timeout: Option<Duration>,
    max_exec_output: usize,
    exec_output_preview_chars: usize,
    persisted_output_prefix: String,
    stream_idle_timeout: Option<Duration>,
    instructions: String,
    /// Formatted with the block identifier by `build`.
    system_instructions: String,
    prompt_template: String,
    python_block_identifier: String,
    /// The `<skills>` listing, when the agent has skills.
    skills: Option<String>,
    /// Where the rich forms of display items are written.
    display_dir: Option<std::path::PathBuf>,
    /// Send the images cells show to the model, within this many tokens a result (`None`: do
    /// not send them).
    image_budget: Option<u64>,
    /// Cells' code and output are recorded on their spans.
    trace_content: bool,
    /// When the prompt names objects only and the model searches for tools.
    tool_search: crate::ToolSearch,
    /// The tokens the full descriptions may take before `auto` searches.
    tool_listing_budget: u64,
}

impl Agent {
    /// Runs `prompt`, yielding events as they happen; the last one is always `Stopped`.
    pub fn stream(&mut self, prompt: impl Into<String>) -> EventStream<'_> {
        self.stream_until(prompt, CancellationToken::new())
    }

    /// Like [`stream`](Agent::stream); cancelling `cancel` stops the run with
    /// `stopped{cancelled}` (the execution in flight is interrupted where the runtime can).
    pub fn stream_until(
        &mut self,
        prompt: impl Into<String>,
        cancel: CancellationToken,
    ) -> EventStream<'_> {
        let emitter = emit::Emitter::new(self.observer.clone());
        let prompt = prompt.into();
        let span = run::spans::run(&self.model_info.id);
        EventStream::new(
            emitter.clone(),
            tracing::Instrument::instrument(
                run::drive(self, prompt, cancel, emitter, span.clone()),
                span,
            ),
        )
    }

    /// Runs `prompt` to its end: [`stream`](Agent::stream), drained.
    pub async fn run(&mut self, prompt: impl Into<String>) -> AgentResponse {
        self.run_until(prompt, CancellationToken::new()).await
    }

    /// Like [`run`](Agent::run), cancellable.
    pub async fn run_until(
        &mut self,
        prompt: impl Into<String>,
        cancel: CancellationToken,
    ) -> AgentResponse {
        AgentResponse::collect(self.stream_until(prompt, cancel)).await
    }

    /// The conversation so far (system prompt first, once a run has started).
    pub fn history(&self) -> &[Message] {
        &self.history
    }

    /// Appends a message to the conversation.
    pub fn push_message(&mut self, message: Message) {
        self.history.push(message);
    }

    /// Keeps the first `len` messages of the conversation and drops the rest: undoing the
    /// turns after a point, e.g. with a checkpoint of the runtime taken there
    /// (`KernelRuntime::rollback`). Cut between runs, at a length [`history`](Self::history)
    /// had, so that every code message keeps its result. A longer `len` changes nothing.
    pub fn truncate_history(&mut self, len: usize) {
        if len < self.history.len() {
            self.history.truncate(len);
            // The token count measured on the longer conversation no longer holds.
            self.anchor = None;
        }
    }

    /// Takes the conversation out (to save it, or to seed another agent).
    pub fn take_history(&mut self) -> Vec<Message> {
        std::mem::take(&mut self.history)
    }

    /// A branch of this agent: the same model and settings, a copy of the conversation, and a
    /// fork of the runtime ([`Runtime::fork`]), so that each goes on from here on its own (best
    /// of N: several branches try a task, the host keeps one). Host objects are the same
    /// objects in every branch, and so are the sub-agents, the approver and the observer. A
    /// branch writes its display files in a directory of its own beneath the display
    /// directory (`branch-N`), so that its numbering does not overwrite this agent's.
    /// Fails as the runtime's fork does: a runtime that cannot copy its namespace (in-process,
    /// a kernel behind a Jupyter server) says which runtime can.
    pub async fn fork(&self) -> Result<Agent, crate::RuntimeError> {
        Ok(self.fork_onto(self.runtime.fork().await?))
    }

    /// [`fork`](Self::fork) onto `runtime`, a branch of this agent's runtime that the caller
    /// made (`KernelRuntime::fork`, to keep its concrete type for checkpoints).
    pub fn fork_onto(&self, runtime: Arc<dyn Runtime>) -> Agent {
        static BRANCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let mut config = self.config.clone();
        if let Some(dir) = &mut config.display_dir {
            let n = BRANCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            dir.push(format!("branch-{n}"));
        }
        Agent {
            model: self.model.clone(),
            model_info: self.model_info.clone(),
            runtime,
            policy: self.policy.clone(),
            compactor: self.compactor.clone(),
            estimator: self.estimator.clone(),
            config,
            history: self.history.clone(),
            persisted_floor: self.persisted_floor,
            anchor: self.anchor,
            sub_agents: self.sub_agents.clone(),
            sub_agents_registered: self.sub_agents_registered,
            tool_search_registered: self.tool_search_registered,
            approver: self.approver.clone(),
            approve_cells: self.approve_cells,
            observer: self.observer.clone(),
            isolation: self.isolation.clone(),
            displays: self.displays,
            ledger: self.ledger.clone(),
        }
    }

    /// The runtime the model's code runs in.
    pub fn runtime(&self) -> &Arc<dyn Runtime> {
        &self.runtime
    }

    /// What the session has cost so far: every run of this agent, and what the ledger it was
    /// built with held ([`AgentBuilder::ledger`]). A fork starts with a copy.
    pub fn ledger(&self) -> &crate::Ledger {
        &self.ledger
    }

    /// The sub-agents its code can drive.
    pub fn sub_agents(&self) -> &[Arc<SubAgent>] {
        &self.sub_agents
    }

    /// What the model declared about itself.
    pub fn model_info(&self) -> &ModelInfo {
        &self.model_info
    }

    /// Whether the next run's prompt names objects only, and the model finds functions and
    /// methods with `search_tools` ([`AgentBuilder::tool_search`]).
    pub fn searches_tools(&self) -> bool {
        self.description().1
    }

    /// What the prompt describes, and whether it does so with tool search.
    fn description(&self) -> (crate::Description, bool) {
        let c = &self.config;
        let compact = || (self.runtime.describe_compact(), true);
        match c.tool_search {
            crate::ToolSearch::Never => (self.runtime.describe(), false),
            crate::ToolSearch::Always => compact(),
            crate::ToolSearch::Auto => {
                let full = self.runtime.describe();
                let tokens = [&full.functions, &full.variables, &full.types]
                    .iter()
                    .map(|section| self.estimator.estimate(section))
                    .sum::<u64>();
                if tokens > c.tool_listing_budget {
                    compact()
                } else {
                    (full, false)
                }
            }
        }
    }

    /// The system prompt as the next run will send it.
    pub fn system_prompt(&self) -> String {
        self.rendered_system_prompt().0
    }

    /// The system prompt, and whether it has the model search for tools (a run binds
    /// `search_tools` then).
    fn rendered_system_prompt(&self) -> (String, bool) {
        let (description, searching) = self.description();
        let now = prompt::utc_hour_now();
        let c = &self.config;
        let mut system_instructions = c.system_instructions.clone();
        if let Some(t) = c.max_exec_timeout {
            system_instructions.push_str(&prompt::exec_time_limit_line(t.as_secs_f64()));
        }
        if c.skills.is_some() {
            system_instructions.push_str(prompt::SKILLS_INSTRUCTION);
        }
        if searching {
            system_instructions.push_str(prompt::TOOL_SEARCH_INSTRUCTION);
        }
        if crate::lock(self.runtime.registry()).has_host_calls() {
            system_instructions.push_str(prompt::CONCURRENT_CALLS_INSTRUCTION);
        }
        let values = [
            ("instructions", c.instructions.as_str()),
            ("system_instructions", system_instructions.as_str()),
            ("functions", description.functions.as_str()),
            ("variables", description.variables.as_str()),
            ("types", description.types.as_str()),
            ("skills", c.skills.as_deref().unwrap_or(prompt::NO_SKILLS)),
            ("current_time", now.as_str()),
        ];
        // The template was checked when the agent was built; rendering cannot fail here.
        let rendered = prompt::render_template(&c.prompt_template, &values).unwrap_or_else(|e| {
            tracing::error!(error = %e, "system prompt template failed after validation");
            c.prompt_template.clone()
        });
        (rendered, searching)
    }
}

impl fmt::Debug for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agent")
            .field("model", &self.model_info.id)
            .field("config", &self.config)
            .field("history_len", &self.history.len())
            .finish_non_exhaustive()
    }
}

/// Builds an [`Agent`]; [`build`](AgentBuilder::build) checks the settings.
#[derive(Clone)]
pub struct AgentBuilder {
    model: Arc<dyn Model>,
    runtime: Arc<dyn Runtime>,
    policy: Option<Arc<dyn CodePolicy>>,
    compactor: Option<Arc<dyn Compactor>>,
    estimator: Option<Arc<dyn TokenEstimator>>,
    /// The settings as given (checked and completed by `build`).
    config: Config,
    history: Vec<Message>,
    ledger: crate::Ledger,
    sub_agents: Vec<Arc<SubAgent>>,
    approver: Option<Arc<announce::Announcing>>,
    approve_cells: bool,
    observer: Option<Arc<dyn crate::EventObserver>>,
}

impl AgentBuilder {
    /// Starts building an agent for this model and runtime, with the core's defaults: no
    /// compaction ([`NoCompaction`]) and [`ByteEstimator`]'s counts. The facade's
    /// `cave_agent::Agent::builder` starts from here and adds cave-compact's compaction and
    /// script-aware estimate.
    ///
    /// Keep a clone of the runtime (e.g. pass an `Arc`) to retrieve objects after a run.
    pub fn new(model: impl Model + 'static, runtime: impl Runtime + 'static) -> Self {
        Self {
            model: Arc::new(model),
            runtime: Arc::new(runtime),
            policy: None,
            compactor: None,
            estimator: None,
            config: Config {
                max_steps: 10,
                max_run_time: None,
                max_total_tokens: None,
                max_input_tokens: None,
                max_output_tokens: None,
                max_cost: None,
                max_cpu_time: None,
                max_host_calls: None,
                price: None,
                max_exec_timeout: None,
                max_exec_output: DEFAULT_MAX_EXEC_OUTPUT,
                exec_output_preview_chars: DEFAULT_PREVIEW_CHARS,
                persisted_output_prefix: DEFAULT_PERSISTED_PREFIX.to_owned(),
                stream_idle_timeout: Some(Duration::from_secs(120)),
                instructions: prompt::DEFAULT_INSTRUCTIONS.to_owned(),
                system_instructions: prompt::DEFAULT_SYSTEM_INSTRUCTIONS.to_owned(),
                prompt_template: prompt::DEFAULT_SYSTEM_PROMPT_TEMPLATE.to_owned(),
                python_block_identifier: "python".to_owned(),
                skills: None,
                display_dir: None,
                image_budget: None,
                trace_content: false,
                tool_search: crate::ToolSearch::Auto,
                tool_listing_budget: crate::DEFAULT_TOOL_LISTING_BUDGET,
            },
            history: Vec::new(),
            ledger: crate::Ledger::new(),
            sub_agents: Vec::new(),
            approver: None,
            approve_cells: true,
            observer: None,
        }
    }

    /// Records each cell's code and output (redacted) on its span, as
    /// `gen_ai.tool.call.arguments` and `gen_ai.tool.call.result` (default: off; the spans
    /// carry names, models, token counts and outcomes only). The spans follow the
    /// OpenTelemetry GenAI conventions; any `tracing` subscriber receives them.
    pub fn trace_content(&mut self, on: bool) -> &mut Self {
        self.config.trace_content = on;
        self
    }

    /// Shows every event of every run to `observer` as it happens: an audit log
    /// (`cave_guards::AuditLog` records each run's prompt, cells and their outcomes, approvals
    /// and stop; its `audited` wrapper records host calls).
    pub fn observer(&mut self, observer: Arc<dyn crate::EventObserver>) -> &mut Self {
        self.observer = Some(observer);
        self
    }

    /// Asks `approver` before running each cell the code policy let through (an
    /// `approval_requested` event first); a refusal is told to the model, which can react.
    /// Guard host functions and objects with `cave_guards::requiring_approval` and
    /// `object_requiring_approval`, given [`call_approver`](Self::call_approver), so that their
    /// requests show in the events too.
    pub fn approver(&mut self, approver: Arc<dyn crate::Approver>) -> &mut Self {
        self.approver = Some(Arc::new(announce::Announcing::new(approver)));
        self
    }

    /// Whether the approver is asked before each cell (default `true`); `false` leaves it to
    /// the guarded host calls alone.
    pub fn approve_cells(&mut self, ask: bool) -> &mut Self {
        self.approve_cells = ask;
        self
    }

    /// The approver to guard host calls with: the one given to [`approver`](Self::approver),
    /// announcing each request as an `approval_requested` event while this agent's code runs.
    /// `None` before an approver is set.
    pub fn call_approver(&self) -> Option<Arc<dyn crate::Approver>> {
        self.approver.clone().map(|a| a as Arc<dyn crate::Approver>)
    }

    /// Gives the agent's code another agent to drive (see [`SubAgent`]): bound in the runtime
    /// under its name at the first run, its events shown nested while this agent's code runs,
    /// its run cancelled with this agent's execution.
    pub fn sub_agent(&mut self, sub_agent: Arc<SubAgent>) -> &mut Self {
        self.sub_agents.push(sub_agent);
        self
    }

    /// The `<skills>` section of the system prompt (a `- name: description` line per skill,
    /// as `cave_skills::SkillSet::listing` writes it); with it, the system instructions say
    /// how to use skills. Register the functions that load them (`activate_skill`) with the
    /// runtime. An empty listing means no skills.
    pub fn skills(&mut self, listing: impl Into<String>) -> &mut Self {
        let listing = listing.into();
        self.config.skills = (!listing.trim().is_empty()).then_some(listing);
        self
    }

    /// When the system prompt names host objects only (each with its type, the first line of
    /// its doc and its number of methods) and the model finds functions and methods with
    /// `search_tools(query)` in its code, which the agent binds in the runtime (unless the
    /// host bound that name itself): `Auto` (the default) when the full descriptions would
    /// take more than [`tool_listing_budget`](Self::tool_listing_budget) tokens by the
    /// estimator's count, `Always`, or `Never`. Either way the prompt stays the same while
    /// the model searches, so a provider's prompt cache keeps it.
    pub fn tool_search(&mut self, mode: crate::ToolSearch) -> &mut Self {
        self.config.tool_search = mode;
        self
    }

    /// The tokens the descriptions of functions, variables and types may take before `Auto`
    /// tool search names objects only (default [`DEFAULT_TOOL_LISTING_BUDGET`](crate::DEFAULT_TOOL_LISTING_BUDGET)).
    pub fn tool_listing_budget(&mut self, tokens: u64) -> &mut Self {
        self.config.tool_listing_budget = tokens;
        self
    }

    /// Writes the rich forms of what cells show (`display(obj)`, a figure, a DataFrame's
    /// HTML) as files `display-N.png`, `display-N.html`, … under `dir` (made when first
    /// needed); each `display` event names its files, and the model reads the names. Default:
    /// none, no files (the items are still in the events and the response).
    pub fn display_dir(&mut self, dir: impl Into<std::path::PathBuf>) -> &mut Self {
        self.config.display_dir = Some(dir.into());
        self
    }

    /// For a model that reads images: the PNG and JPEG images cells show (figures, charts) go
    /// with the execution result as image parts, up to [`DEFAULT_IMAGE_TOKENS`] tokens of
    /// them a result by the estimator's count (the rest are named, not sent). Old results'
    /// images are cleared with their text when the history is compacted. Default: off.
    pub fn vision(&mut self, on: bool) -> &mut Self {
        self.config.image_budget =
            on.then_some(self.config.image_budget.unwrap_or(DEFAULT_IMAGE_TOKENS));
        self
    }

    /// The tokens of images sent with one execution result (turns vision on).
    pub fn max_image_tokens(&mut self, tokens: u64) -> &mut Self {
        self.config.image_budget = Some(tokens);
        self
    }

    /// Model calls per run, recovery calls included (default 10).
    pub fn max_steps(&mut self, steps: u32) -> &mut Self {
        self.config.max_steps = steps;
        self
    }
    /// Wall time per run, checked between steps (default none).
    pub fn max_run_time(&mut self, limit: Duration) -> &mut Self {
        self.config.max_run_time = Some(limit);
        self
    }
    /// Tokens per run, prompt and completion together, checked between steps.
    pub fn max_total_tokens(&mut self, tokens: u64) -> &mut Self {
        self.config.max_total_tokens = Some(tokens);
        self
    }
    /// Prompt tokens per run, checked between steps.
    pub fn max_input_tokens(&mut self, tokens: u64) -> &mut Self {
        self.config.max_input_tokens = Some(tokens);
        self
    }
    /// Completion tokens per run, checked between steps.
    pub fn max_output_tokens(&mut self, tokens: u64) -> &mut Self {
        self.config.max_output_tokens = Some(tokens);
        self
    }
    /// Money the session may spend on the model, in US dollars: its [`Ledger`](crate::Ledger)'s
    /// cost (reported by the provider, or computed with [`price`](Self::price)), checked before
    /// each step and each cell. Without a price, calls the provider reports no cost for count
    /// nothing: set one.
    pub fn max_cost(&mut self, usd: f64) -> &mut Self {
        self.config.max_cost = Some(usd);
        self
    }
    /// Processor time the session's cells may use in the runtime (its worker's control group
    /// or process; the runtime's thread in-process), checked before each cell and while one
    /// runs: a cell still running when it is spent is stopped. Needs a runtime that measures it
    /// ([`Runtime::resource_usage`]) and can be interrupted.
    pub fn max_cpu_time(&mut self, limit: Duration) -> &mut Self {
        self.config.max_cpu_time = Some(limit);
        self
    }
    /// Calls of host functions, methods and MCP tools the session may make, checked before
    /// each step and at each call: a call past it raises `PermissionError` in the cell.
    pub fn max_host_calls(&mut self, calls: u64) -> &mut Self {
        self.config.max_host_calls = Some(calls);
        self
    }
    /// The model's price, for the ledger's cost of calls the provider reports no cost for
    /// (a LiteLLM proxy reports its own; OpenAI does not).
    pub fn price(&mut self, price: crate::Price) -> &mut Self {
        self.config.price = Some(price);
        self
    }
    /// The ledger the session starts from: what an earlier process spent on it (a resumed
    /// session, `cave run --session`), so that its figures and budgets go on from there.
    pub fn ledger(&mut self, ledger: crate::Ledger) -> &mut Self {
        self.ledger = ledger;
        self
    }
    /// Time limit per execution; needs a runtime that can be interrupted.
    pub fn max_exec_timeout(&mut self, limit: Duration) -> &mut Self {
        self.config.max_exec_timeout = Some(limit);
        self
    }
    /// Longest output (in characters) sent to the model inline (default 5000); longer output
    /// is stored in the runtime and the model gets a marker with a preview.
    pub fn max_exec_output(&mut self, chars: usize) -> &mut Self {
        self.config.max_exec_output = chars;
        self
    }
    /// Length of that preview in characters (default 2000; 0 for none).
    pub fn exec_output_preview_chars(&mut self, chars: usize) -> &mut Self {
        self.config.exec_output_preview_chars = chars;
        self
    }
    /// Prefix of the variables large output is stored in (default `_output`: `_output_1`, …).
    pub fn persisted_output_prefix(&mut self, prefix: impl Into<String>) -> &mut Self {
        self.config.persisted_output_prefix = prefix.into();
        self
    }
    /// Longest wait for the model's next delta, connecting included (default 120 s).
    pub fn stream_idle_timeout(&mut self, limit: Option<Duration>) -> &mut Self {
        self.config.stream_idle_timeout = limit;
        self
    }
    /// Who the agent is (the prompt's first paragraph).
    pub fn instructions(&mut self, text: impl Into<String>) -> &mut Self {
        self.config.instructions = text.into();
        self
    }
    /// How the agent works; `{python_block_identifier}` is replaced, `{{`/`}}` are braces.
    pub fn system_instructions(&mut self, text: impl Into<String>) -> &mut Self {
        self.config.system_instructions = text.into();
        self
    }
    /// The system prompt's layout (see [`prompt::DEFAULT_SYSTEM_PROMPT_TEMPLATE`]).
    pub fn prompt_template(&mut self, template: impl Into<String>) -> &mut Self {
        self.config.prompt_template = template.into();
        self
    }
    /// The fence tag of executable blocks (default `python`).
    pub fn python_block_identifier(&mut self, tag: impl Into<String>) -> &mut Self {
        self.config.python_block_identifier = tag.into();
        self
    }
    /// The conversation to continue (e.g. a saved history).
    pub fn history(&mut self, messages: Vec<Message>) -> &mut Self {
        self.history = messages;
        self
    }
    /// Checks every cell before it runs.
    pub fn policy(&mut self, policy: impl CodePolicy + 'static) -> &mut Self {
        self.policy = Some(Arc::new(policy));
        self
    }
    /// Keeps the history inside the context window. Default: [`NoCompaction`] (every message
    /// kept) on the core alone; cave-compact's `ContextCompactor`, whose summaries the agent's
    /// own model writes, through the facade's `Agent::builder`.
    pub fn compactor(&mut self, compactor: impl Compactor + 'static) -> &mut Self {
        self.compactor = Some(Arc::new(compactor));
        self
    }
    /// Counts tokens where the provider does not (usage of streams that report none,
    /// budgets, and the history's size between provider counts). Default: [`ByteEstimator`] on
    /// the core alone; cave-compact's `ScriptEstimator`, which never under-counts other
    /// scripts, through the facade's `Agent::builder` (`estimator_for(model_id)` counts exactly
    /// for OpenAI models).
    pub fn estimator(&mut self, estimator: impl TokenEstimator + 'static) -> &mut Self {
        self.estimator = Some(Arc::new(estimator));
        self
    }

    /// Checks the settings and builds the agent.
    pub fn build(&self) -> Result<Agent, BuildError> {
        if self.config.max_exec_timeout.is_some() && self.runtime.interrupter().is_none() {
            return Err(BuildError::ExecTimeoutNeedsInterrupt);
        }
        if self.config.max_exec_timeout.is_some_and(|t| t.is_zero()) {
            return Err(BuildError::ZeroExecTimeout);
        }
        if let Some(usd) = self.config.max_cost.filter(|c| !c.is_finite() || *c < 0.0) {
            return Err(BuildError::Budget {
                which: "max_cost",
                value: usd.to_string(),
            });
        }
        if self.config.max_cpu_time.is_some() {
            if self.runtime.interrupter().is_none() {
                return Err(BuildError::CpuBudgetNeedsInterrupt);
            }
            if self.runtime.resource_usage().is_none() {
                return Err(BuildError::CpuBudgetUnmeasured);
            }
        }
        let tag = &self.config.python_block_identifier;
        if tag.is_empty() || tag.chars().any(|c| c.is_whitespace() || c == '`') {
            return Err(BuildError::BlockIdentifier {
                identifier: tag.clone(),
            });
        }
        let prefix = &self.config.persisted_output_prefix;
        let prefix = validate_name(NameKind::Prefix, &format!("{prefix}_1"))
            .map(|name| name[..name.len() - 2].to_owned())
            .map_err(|source| BuildError::PersistedOutputPrefix {
                prefix: prefix.clone(),
                source,
            })?;
        let system_instructions = prompt::render_template(
            &self.config.system_instructions,
            &[("python_block_identifier", tag)],
        )
        .map_err(|source| BuildError::Template {
            which: "system_instructions",
            source,
        })?;
        let known: Vec<(&str, &str)> = prompt::TEMPLATE_PLACEHOLDERS
            .iter()
            .map(|&k| (k, ""))
            .collect();
        prompt::render_template(&self.config.prompt_template, &known).map_err(|source| {
            BuildError::Template {
                which: "prompt_template",
                source,
            }
        })?;

        let model_info = self.model.info();
        let compactor = self
            .compactor
            .clone()
            .unwrap_or_else(|| Arc::new(NoCompaction));
        let estimator = self
            .estimator
            .clone()
            .unwrap_or_else(|| Arc::new(ByteEstimator));
        Ok(Agent {
            model: self.model.clone(),
            model_info,
            runtime: self.runtime.clone(),
            policy: self.policy.clone(),
            compactor,
            estimator,
            persisted_floor: highest_persisted_index(&self.history, &prefix) + 1,
            config: Config {
                persisted_output_prefix: prefix,
                system_instructions,
                python_block_identifier: tag.clone(),
                ..self.config.clone()
            },
            history: self.history.clone(),
            anchor: None,
            sub_agents: self.sub_agents.clone(),
            sub_agents_registered: self.sub_agents.is_empty(),
            tool_search_registered: false,
            approver: self.approver.clone(),
            approve_cells: self.approve_cells,
            observer: self.observer.clone(),
            isolation: Vec::new(),
            displays: 0,
            ledger: self.ledger.clone(),
        })
    }
}

impl fmt::Debug for AgentBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentBuilder")
            .field("model", &self.model.info().id)
            .finish_non_exhaustive()
    }
}

/// The agent's settings do not hold together.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// `max_exec_timeout` was set but the runtime cannot stop running code.
    #[error(
        "max_exec_timeout needs a runtime that can stop running code, and this runtime cannot; \
use a runtime whose interrupter() is Some (the kernel runtime, or the in-process runtime) or drop the limit"
    )]
    ExecTimeoutNeedsInterrupt,
    /// `max_exec_timeout` was zero.
    #[error("max_exec_timeout must be longer than zero")]
    ZeroExecTimeout,
    /// A budget is negative or not a number.
    #[error("{which} must be a number of zero or more, not {value}")]
    Budget {
        /// Which setting.
        which: &'static str,
        /// The value given.
        value: String,
    },
    /// `max_cpu_time` was set but the runtime cannot stop running code.
    #[error(
        "max_cpu_time needs a runtime that can stop running code, and this runtime cannot; use the kernel or the in-process runtime, or drop the limit"
    )]
    CpuBudgetNeedsInterrupt,
    /// `max_cpu_time` was set but the runtime does not measure processor time.
    #[error(
        "max_cpu_time needs a runtime that measures its processor time, and this one does not (a kernel behind a Jupyter server cannot be measured from the host); use the kernel or the in-process runtime, or drop the limit"
    )]
    CpuBudgetUnmeasured,
    /// The persisted-output prefix cannot start a Python identifier.
    #[error(
        "persisted_output_prefix must be able to start a Python identifier, and '{prefix}' cannot: \
it would name the variable '{prefix}_1' ({source})"
    )]
    PersistedOutputPrefix {
        /// The prefix given.
        prefix: String,
        /// Why the name is refused.
        source: NameError,
    },
    /// The fence tag is empty or contains whitespace or backticks.
    #[error(
        "python_block_identifier must be a non-empty tag without whitespace or backticks, not {identifier:?}"
    )]
    BlockIdentifier {
        /// The tag given.
        identifier: String,
    },
    /// A prompt template does not render.
    #[error("{which} does not render: {source}")]
    Template {
        /// Which setting.
        which: &'static str,
        /// Why.
        source: TemplateError,
    },
}

/// The outcome of a run, as [`Agent::run`] returns it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct AgentResponse {
    /// The final answer, or the last thing the model said.
    pub content: String,
    /// Why the run stopped.
    pub stop_reason: StopReason,
    /// Model calls made.
    pub steps: u32,
    /// Tokens spent.
    pub usage: Usage,
    /// Wall time.
    pub elapsed: Duration,
    /// The code that ran, in order.
    pub code_snippets: Vec<String>,
    /// What the code showed (`display(obj)`, rich last values, figures), in order, every
    /// form: the events name the files they were written to.
    pub displays: Vec<crate::DisplayItem>,
    /// What failed, for the error stop reasons and `budget_exhausted`: match on its kind.
    pub error: Option<StopError>,
    /// The runtime lost the names the code had bound during the run (its process died or was
    /// ended at a limit): a session saved after it keeps the values saved before.
    pub state_lost: bool,
    /// What the session has cost, this run included ([`Agent::ledger`] after it).
    pub ledger: crate::Ledger,
}

impl AgentResponse {
    /// Returns true if and only if the model gave its final answer.
    pub fn completed(&self) -> bool {
        self.stop_reason == StopReason::Completed
    }

    /// Drains a run's events into its response.
    pub async fn collect(mut events: EventStream<'_>) -> AgentResponse {
        let mut code_snippets = Vec::new();
        let mut displays = Vec::new();
        let mut state_lost = false;
        while let Some(event) = events.next().await {
            state_lost |= event.lost_state();
            match event {
                Event::Code { code, .. } => code_snippets.push(code),
                Event::Display {
                    item: Some(item), ..
                } => displays.push(*item),
                Event::Stopped {
                    content,
                    stop_reason,
                    steps,
                    elapsed,
                    usage,
                    error,
                    ledger,
                } => {
                    return AgentResponse {
                        content,
                        stop_reason,
                        steps,
                        usage,
                        elapsed: Duration::from_secs_f64(elapsed),
                        code_snippets,
                        displays,
                        error,
                        state_lost,
                        ledger: *ledger,
                    };
                }
                _ => {}
            }
        }
        // The loop always ends with `Stopped`; this is a defect if it ever happens.
        AgentResponse {
            content: String::new(),
            stop_reason: StopReason::InternalError,
            steps: 0,
            usage: Usage::default(),
            elapsed: Duration::ZERO,
            code_snippets,
            displays,
            error: Some(StopError::new(
                StopErrorKind::Internal,
                "the event stream ended without a stopped event",
            )),
            state_lost,
            ledger: crate::Ledger::new(),
        }
    }
}

impl fmt::Display for AgentResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AgentResponse(stop_reason={}, steps={}, tokens={}, content={})",
            self.stop_reason, self.steps, self.usage.total_tokens, self.content
        )
    }
}

//! Command-line arguments: parsing and validation only (no I/O). Adding an option is one line
//! here and one in `config.rs`.

use crate::units;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// Run an LLM that operates a live Python runtime.
#[derive(Debug, Parser)]
#[command(name = "cave", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a task: each PROMPT is one turn of the same session.
    Run(RunArgs),
    /// Chat interactively (Ctrl-C cancels the running turn, Ctrl-D exits; on the kernel
    /// runtime `/undo` takes the last turn back, with what its code did, `/fork [NAME]` makes
    /// a branch, `/branches` lists them, `/switch NAME` goes on in another).
    Chat(ChatArgs),
    /// Inspect Agent Skills (SKILL.md) without running anything.
    #[command(subcommand)]
    Skills(SkillsCommand),
    /// Say what this machine supports: the kernel runtime's sandbox layers (with the reason
    /// for each one it lacks) and the Python found.
    Doctor,
    /// MCP: see what the model would get from a server, or serve a Python session to MCP
    /// clients.
    #[command(subcommand)]
    Mcp(McpCommand),
    /// Show a session as a web page on this machine: FILE is what `cave run --json` printed
    /// (followed as it grows). Ctrl-C stops it.
    View(ViewArgs),
}

/// `cave mcp`.
#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Start the server NAME=COMMAND, print its tools as the model would see them (the
    /// object NAME and its methods), and stop it.
    List {
        /// NAME=COMMAND or NAME=URL, as for `cave run --mcp`.
        #[arg(value_name = "NAME=COMMAND|URL")]
        server: String,
        /// A header for a server over HTTP, its value from the environment variable ENVVAR
        /// (repeatable).
        #[arg(long = "header", value_name = "KEY=ENVVAR")]
        headers: Vec<String>,
    },
    /// Serve one persistent Python session to an MCP client (a coding agent, a desktop
    /// assistant): tools to run a cell, read a variable as JSON and list what is bound. Over
    /// stdio unless --http; the runtime, code policy, approvals (asked of the client) and
    /// audit are those of `cave run`.
    Serve(Box<ServeArgs>),
}

/// `cave mcp serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Where the code runs, and what it is given.
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// What code may do, and who is asked.
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Each cell's time and inline output.
    #[command(flatten)]
    pub cells: CellLimitArgs,
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio (a loopback address; port 0:
    /// any free one). Clients send `Authorization: Bearer TOKEN`, the token taken from
    /// CAVE_MCP_TOKEN or, unset, made up and printed on stderr.
    #[arg(
        long,
        value_name = "ADDR",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "127.0.0.1:0",
        help_heading = "Serving"
    )]
    pub http: Option<std::net::SocketAddr>,
    /// How many branches (the `fork` tool's copies of the session, on the kernel runtime) a
    /// client may hold live at once; 0 turns forking off.
    #[arg(long, value_name = "N", default_value_t = cave_agent::mcp::serve::DEFAULT_MAX_BRANCHES, help_heading = "Serving")]
    pub max_branches: usize,
}

/// `cave view`.
#[derive(Debug, Args)]
pub struct ViewArgs {
    /// The session's events (JSON Lines, as `cave run --json` prints them), or a directory
    /// `--session` keeps (its events.jsonl, written as the session runs).
    #[arg(value_name = "FILE|DIR")]
    pub file: PathBuf,
    /// Where to serve the page: a loopback address and port (port 0: any free one).
    #[arg(long, value_name = "ADDR", default_value_t = crate::view::DEFAULT_ADDR)]
    pub addr: std::net::SocketAddr,
}

/// `cave skills`.
#[derive(Debug, Subcommand)]
pub enum SkillsCommand {
    /// List the skills at PATH: name, description, files, and whether it injects code.
    List {
        /// A SKILL.md, a skill's directory, or a directory of skills.
        #[arg(value_name = "PATH")]
        path: PathBuf,
    },
    /// Check the skills at PATH; exit 1 with every problem when one is invalid.
    Validate {
        /// A SKILL.md, a skill's directory, or a directory of skills.
        #[arg(value_name = "PATH")]
        path: PathBuf,
    },
}

/// `cave run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Shared options.
    #[command(flatten)]
    pub common: CommonArgs,
    /// The prompts, one turn each.
    #[arg(required = true, value_name = "PROMPT")]
    pub prompts: Vec<String>,
}

/// `cave chat`.
#[derive(Debug, Args)]
pub struct ChatArgs {
    /// Shared options.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Which adapter talks to the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Provider {
    /// Any OpenAI-compatible server.
    Openai,
    /// A LiteLLM proxy.
    Litellm,
}

/// A preset code policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PolicyPreset {
    /// `SecurityPolicy::strict()`.
    Strict,
}

/// What `--approve` asks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ApproveWhat {
    /// Each cell, before it runs.
    Cells,
    /// Each call into the host (the skills' functions; Python functions from `--py` run
    /// inside the runtime, with the same powers as the model's own code, so they are covered
    /// by `cells`).
    Calls,
    /// Cells and calls.
    All,
}

impl ApproveWhat {
    /// Whether cells are asked about.
    pub fn cells(self) -> bool {
        matches!(self, ApproveWhat::Cells | ApproveWhat::All)
    }
    /// Whether host calls are asked about.
    pub fn calls(self) -> bool {
        matches!(self, ApproveWhat::Calls | ApproveWhat::All)
    }
}

/// `--images`: how figures are drawn in the terminal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ImagesChoice {
    /// The terminal's protocol, when it says it speaks one; none otherwise.
    Auto,
    /// kitty's graphics protocol.
    Kitty,
    /// iTerm2's inline images.
    Iterm2,
    /// DEC sixel.
    Sixel,
    /// None: a line per figure with its file.
    Off,
}

/// How the kernel runtime's child is isolated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SandboxMode {
    /// Every layer this machine supports: no network, files only in its work directory
    /// (read-only where Python lives), dangerous system calls refused, no new privileges.
    Strict,
    /// No sandbox: the child can do what this user can.
    Off,
}

/// Where the model's code runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RuntimeKind {
    /// CPython embedded in this process.
    Inproc,
    /// Python in a child process: a crash or a hang ends only the child.
    Kernel,
    /// Python in a kernel behind a Jupyter server (Jupyter Server, Kernel Gateway, Enterprise
    /// Gateway): --jupyter-url, and JUPYTER_TOKEN for its token.
    Jupyter,
}

/// Options of both subcommands.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// The model's identifier (default: the LLM_MODEL_ID variable).
    #[arg(long, help_heading = "Model")]
    pub model: Option<String>,
    /// The server's base URL, up to /v1 (default: the LLM_BASE_URL variable). The API key
    /// comes only from LLM_API_KEY.
    #[arg(long, help_heading = "Model")]
    pub base_url: Option<String>,
    /// The adapter.
    #[arg(long, value_enum, default_value = "openai", help_heading = "Model")]
    pub provider: Provider,
    /// Play a recorded cassette instead of calling a model.
    #[arg(
        long,
        value_name = "CASSETTE",
        conflicts_with = "record",
        help_heading = "Model"
    )]
    pub replay: Option<PathBuf>,
    /// Record the model's traffic to a cassette.
    #[arg(long, value_name = "CASSETTE", help_heading = "Model")]
    pub record: Option<PathBuf>,

    /// The model's context window in tokens; older turns are compacted to stay inside it.
    #[arg(
        long,
        value_name = "TOKENS",
        default_value_t = 128_000,
        help_heading = "Model"
    )]
    pub context_window: u64,
    /// The model reads images: figures and other images cells show go with the results
    /// (up to --max-image-tokens of them a result).
    #[arg(long, help_heading = "Model")]
    pub vision: bool,
    /// Tokens of images one result may carry with --vision (by the estimator's count).
    #[arg(
        long,
        value_name = "TOKENS",
        requires = "vision",
        help_heading = "Model"
    )]
    pub max_image_tokens: Option<u64>,
    /// auto, always or never: the prompt names host objects only (and the first 40 functions),
    /// and the model finds methods and functions with search_tools(query) in its code; auto
    /// does so when the full listing would take more than --tool-listing-budget tokens.
    #[arg(
        long,
        value_name = "MODE",
        default_value = "auto",
        help_heading = "Model"
    )]
    pub tool_search: cave_agent::ToolSearch,
    /// Tokens the listing of functions, variables and types may take before --tool-search
    /// auto searches instead [default: 4000].
    #[arg(long, value_name = "TOKENS", help_heading = "Model")]
    pub tool_listing_budget: Option<u64>,
    /// A separate (cheaper) model for summaries when compacting (same server and key).
    #[arg(long, value_name = "ID", help_heading = "Model")]
    pub compact_model: Option<String>,

    /// Where the code runs, and what it is given.
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// What code may do, and who is asked.
    #[command(flatten)]
    pub policy: PolicyArgs,

    /// Keep the session in DIR: the conversation, the runtime options (--var, --py,
    /// --var-desc, --skills, --mcp, --mcp-header) and what the model's code bound are saved
    /// after each turn, and a later start with the same DIR continues from there (options
    /// given again replace the saved ones). Values are restored by Python's pickle, which runs
    /// code: use only session directories you trust like your own files.
    #[arg(long, value_name = "DIR", help_heading = "Session")]
    pub session: Option<PathBuf>,
    /// The most a save keeps of the model's values (e.g. 512M; default 128M): larger ones
    /// are skipped and named when the session resumes.
    #[arg(long, value_name = "SIZE", value_parser = units::parse_size, requires = "session", help_heading = "Session")]
    pub session_max: Option<u64>,

    /// Export traces (OpenTelemetry spans after the GenAI conventions: each run, step, model
    /// call, cell and host call) to the OTLP/HTTP receiver at URL, e.g. http://127.0.0.1:4318
    /// (/v1/traces is added). Without it, OTEL_EXPORTER_OTLP_ENDPOINT (or
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) turns traces on; OTEL_SERVICE_NAME and
    /// OTEL_EXPORTER_OTLP_HEADERS apply either way. Secrets and the API key are never
    /// recorded.
    #[arg(long, value_name = "URL", help_heading = "Traces")]
    pub otlp: Option<String>,
    /// Record each cell's code and output in its span, redacted as events are. Off by default:
    /// traces often go where more people read them than the session's output.
    #[arg(long, help_heading = "Traces")]
    pub trace_content: bool,

    /// Model calls per run.
    #[arg(long, help_heading = "Limits")]
    pub max_steps: Option<u32>,
    /// Time per run, checked between steps (seconds, or with a unit: 30s, 2m).
    #[arg(long, value_name = "DURATION", value_parser = units::parse_seconds, help_heading = "Limits")]
    pub max_run_time: Option<f64>,
    /// Tokens per run.
    #[arg(long, help_heading = "Limits")]
    pub max_total_tokens: Option<u64>,
    /// Prompt tokens per run.
    #[arg(long, help_heading = "Limits")]
    pub max_input_tokens: Option<u64>,
    /// Completion tokens per run.
    #[arg(long, help_heading = "Limits")]
    pub max_output_tokens: Option<u64>,
    /// Money the session may spend on the model, in US dollars (e.g. 0.50): what the server
    /// reports (a LiteLLM proxy), else what --price computes. Checked before each step and
    /// cell; with --session it counts the runs before too.
    #[arg(long, value_name = "USD", value_parser = units::parse_usd, help_heading = "Limits")]
    pub max_cost: Option<f64>,
    /// Processor time the session's cells may use (seconds, or 30s, 2m): a cell still running
    /// when it runs out is stopped, and so is the run.
    #[arg(long, value_name = "DURATION", value_parser = units::parse_seconds, help_heading = "Limits")]
    pub max_cpu: Option<f64>,
    /// Calls of host functions and MCP tools the session may make: a call past it raises
    /// PermissionError in the cell, and the run stops.
    #[arg(long, value_name = "N", help_heading = "Limits")]
    pub max_host_calls: Option<u64>,
    /// The model's price in US dollars per million tokens, IN,OUT or IN,OUT,CACHED (prompt
    /// tokens read from the provider's cache), e.g. 2.5,10: the ledger's cost of the calls the
    /// server reports no cost for.
    #[arg(long, value_name = "IN,OUT[,CACHED]", value_parser = units::parse_price, help_heading = "Limits")]
    pub price: Option<cave_agent::Price>,
    /// Each cell's time and inline output.
    #[command(flatten)]
    pub cells: CellLimitArgs,
    /// Time without data from the model before it counts as stalled (0 disables).
    #[arg(long, value_name = "DURATION", value_parser = units::parse_seconds, help_heading = "Limits")]
    pub stream_idle_timeout: Option<f64>,
    /// Who the agent is (replaces the default first paragraph of the system prompt).
    #[arg(long, help_heading = "Limits")]
    pub instructions: Option<String>,

    /// Print events as JSON Lines on stdout (nothing else goes to stdout).
    #[arg(long, help_heading = "Output")]
    pub json: bool,
    /// After the run, print this variable's value (repeatable).
    #[arg(long = "retrieve", value_name = "NAME", help_heading = "Output")]
    pub retrieve: Vec<String>,
    /// Where the figures, tables and other rich forms cells show are written
    /// (display-N.png, display-N.html, ...). Default: cave-display-DATE-TIME in the current
    /// directory, made when a cell first shows something; the end of the run names it.
    #[arg(long, value_name = "DIR", help_heading = "Output")]
    pub display_dir: Option<PathBuf>,
    /// How figures are drawn in the terminal (for people): detected from the terminal
    /// (`auto`: kitty, iTerm2 or sixel where one is spoken, none otherwise), one of these by
    /// hand, or `off`.
    #[arg(
        long,
        value_enum,
        value_name = "PROTOCOL",
        default_value = "auto",
        help_heading = "Output"
    )]
    pub images: ImagesChoice,
    /// Show the session as a live web page on this machine (the address is printed on
    /// stderr); `--view=ADDR` chooses the loopback address and port. With a terminal on stdin,
    /// the page stays up after the run until Ctrl-C.
    #[arg(
        long,
        value_name = "ADDR",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "127.0.0.1:0",
        help_heading = "Output"
    )]
    pub view: Option<std::net::SocketAddr>,
}

/// The runtime and what it is given: options of `run`, `chat` and `mcp serve`.
#[derive(Debug, Args)]
pub struct RuntimeArgs {
    /// The runtime.
    #[arg(
        long = "runtime",
        value_enum,
        default_value = "inproc",
        help_heading = "Runtime"
    )]
    pub kind: RuntimeKind,
    /// A variable: NAME=JSON, or NAME=@FILE.json (repeatable).
    #[arg(long = "var", value_name = "NAME=JSON", help_heading = "Runtime")]
    pub vars: Vec<String>,
    /// A Python module to inject: its `__exports__`, else its public functions and classes
    /// (repeatable).
    #[arg(long = "py", value_name = "FILE.py", help_heading = "Runtime")]
    pub py: Vec<PathBuf>,
    /// A variable's description for the model: NAME=TEXT (repeatable).
    #[arg(long = "var-desc", value_name = "NAME=TEXT", help_heading = "Runtime")]
    pub var_descs: Vec<String>,
    /// A secret for the model's code: NAME=ENVVAR binds the value of the environment variable
    /// ENVVAR as NAME; every occurrence of it (and of its repr, JSON, base64 and hex forms) is
    /// shown as [redacted: NAME] (repeatable).
    #[arg(long = "secret", value_name = "NAME=ENVVAR", help_heading = "Runtime")]
    pub secrets: Vec<String>,
    /// Agent Skills to offer the model: a SKILL.md, a skill's directory, or a directory of
    /// skills (repeatable).
    #[arg(long = "skills", value_name = "PATH", help_heading = "Runtime")]
    pub skills: Vec<PathBuf>,
    /// An MCP server whose tools the model's code calls as the methods of the object NAME:
    /// NAME=COMMAND starts COMMAND (split as a shell would; no shell runs) and speaks MCP on
    /// its stdio, ending it with the session; NAME=URL (http:// or https://) reaches a server
    /// over streamable HTTP (repeatable).
    #[arg(
        long = "mcp",
        value_name = "NAME=COMMAND|URL",
        help_heading = "Runtime"
    )]
    pub mcp: Vec<String>,
    /// A header for the HTTP MCP server NAME, its value read from the environment variable
    /// ENVVAR (taken out of the environment, never printed): NAME:Authorization=GITHUB_AUTH
    /// (repeatable).
    #[arg(
        long = "mcp-header",
        value_name = "NAME:KEY=ENVVAR",
        help_heading = "Runtime"
    )]
    pub mcp_headers: Vec<String>,
    /// How long an MCP tool call may take (seconds, or 30s, 2m; default: --max-exec-timeout,
    /// else 60s): the call is cancelled and raises TimeoutError.
    #[arg(long, value_name = "DURATION", value_parser = units::parse_seconds, help_heading = "Runtime")]
    pub mcp_timeout: Option<f64>,
    /// How much of a cell's output is kept whole (e.g. 2G) [default: 1G]: past 8 MiB it goes to
    /// a file as it comes, and the model reads all of it in `_output_N`; past this the rest is
    /// dropped, and the model is told how much. Not above --max-file-size.
    #[arg(long, value_name = "SIZE", value_parser = units::parse_size, help_heading = "Runtime")]
    pub max_cell_output: Option<u64>,
    /// The interpreter the kernel runtime starts (default: CAVE_PYTHON, the active
    /// virtualenv, or python3 on PATH).
    #[arg(long, value_name = "PATH", help_heading = "Runtime")]
    pub python: Option<PathBuf>,
    /// Kernel runtime: the child's memory; past it the child is killed, "out of memory" (a
    /// control group where the host can make one, else an address-space limit) (e.g. 2G)
    /// [default with the sandbox: half of this machine's memory, where a control group holds it].
    #[arg(long, value_name = "SIZE", value_parser = units::parse_size, help_heading = "Runtime")]
    pub memory_limit: Option<u64>,
    /// Kernel runtime: the child's address space; past it allocations raise MemoryError (e.g. 4G).
    #[arg(long, value_name = "SIZE", value_parser = units::parse_size, help_heading = "Runtime")]
    pub max_address_space: Option<u64>,
    /// Kernel runtime: the child's CPU time over its life (e.g. 10m).
    #[arg(long, value_name = "DURATION", value_parser = units::parse_seconds, help_heading = "Runtime")]
    pub cpu_limit: Option<f64>,
    /// Kernel runtime: the child's open files [default: 1024].
    #[arg(long, value_name = "N", help_heading = "Runtime")]
    pub max_open_files: Option<u64>,
    /// Kernel runtime: processes and threads of the child (a control group where the host can
    /// make one, else RLIMIT_NPROC, which counts all of the user's processes and spares root)
    /// [default with the sandbox: 512, where a control group holds it].
    #[arg(long, value_name = "N", help_heading = "Runtime")]
    pub max_processes: Option<u64>,
    /// Kernel runtime: the largest file the child may write [default: 4G].
    #[arg(long, value_name = "SIZE", value_parser = units::parse_size, help_heading = "Runtime")]
    pub max_file_size: Option<u64>,
    /// Kernel runtime: no spare process (reset and crash recovery then wait for a cold start).
    #[arg(long, help_heading = "Runtime")]
    pub no_spare: bool,
    /// Kernel runtime: the child's sandbox [default: strict]; `cave doctor` says which layers
    /// this machine supports.
    #[arg(long, value_name = "MODE", help_heading = "Runtime")]
    pub sandbox: Option<SandboxMode>,
    /// Kernel runtime, strict sandbox: the hosts cells may reach, through a proxy the host
    /// runs (`HOST[:PORT],...`; `*.example.org` for its subdomains; no port: 443 and 80);
    /// nothing else is reachable. Names are resolved by the host; one that resolves to a
    /// loopback or private address needs that address listed too.
    #[arg(
        long,
        value_name = "HOSTS",
        value_delimiter = ',',
        help_heading = "Runtime"
    )]
    pub allow_net: Vec<String>,
    /// Kernel runtime, with --allow-net: what the session may download through the proxy in
    /// all (e.g. 500M); past it connections are cut and refused.
    #[arg(long, value_name = "SIZE", value_parser = units::parse_size, help_heading = "Runtime")]
    pub max_egress: Option<u64>,
    /// Jupyter runtime: the server (http://host:port, with its base path); its token comes
    /// from JUPYTER_TOKEN.
    #[arg(long, value_name = "URL", help_heading = "Runtime")]
    pub jupyter_url: Option<String>,
    /// Jupyter runtime: the kernel spec to start [default: python3].
    #[arg(
        long,
        value_name = "NAME",
        help_heading = "Runtime",
        conflicts_with = "jupyter_kernel_id"
    )]
    pub jupyter_kernel: Option<String>,
    /// Jupyter runtime: attach to this running kernel instead of starting one (cells run in
    /// its namespace; it is left running).
    #[arg(long, value_name = "ID", help_heading = "Runtime")]
    pub jupyter_kernel_id: Option<String>,
    /// Jupyter runtime: a variable of the kernel start request, NAME=VALUE (Enterprise
    /// Gateway reads KERNEL_USERNAME, KERNEL_NAMESPACE, KERNEL_IMAGE…) (repeatable).
    #[arg(
        long = "jupyter-env",
        value_name = "NAME=VALUE",
        help_heading = "Runtime"
    )]
    pub jupyter_env: Vec<String>,
    /// Jupyter runtime: also trust the CA certificates in this PEM file, for an https:// server
    /// whose certificate an internal CA signed.
    #[arg(long, value_name = "FILE", help_heading = "Runtime")]
    pub jupyter_ca: Option<std::path::PathBuf>,
}

/// The code policy, approvals and audit: options of `run`, `chat` and `mcp serve`.
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// Refuse code importing these modules and their submodules (comma-separated, repeatable).
    #[arg(
        long,
        value_name = "MOD[,MOD]",
        value_delimiter = ',',
        help_heading = "Code policy"
    )]
    pub deny_import: Vec<String>,
    /// Refuse code calling or referring to these functions (comma-separated, repeatable).
    #[arg(
        long,
        value_name = "NAME[,NAME]",
        value_delimiter = ',',
        help_heading = "Code policy"
    )]
    pub deny_call: Vec<String>,
    /// Refuse code using these attributes (comma-separated, repeatable).
    #[arg(
        long,
        value_name = "NAME[,NAME]",
        value_delimiter = ',',
        help_heading = "Code policy"
    )]
    pub deny_attr: Vec<String>,
    /// Refuse code matching this regular expression (repeatable).
    #[arg(long, value_name = "PATTERN", help_heading = "Code policy")]
    pub deny_regex: Vec<String>,
    /// Start from a preset policy (`strict`: no system modules, no dynamic code, no
    /// interpreter internals).
    #[arg(long = "policy", value_enum, help_heading = "Code policy")]
    pub preset: Option<PolicyPreset>,
    /// Ask before running each cell (`cells`), calling into the host (`calls`), or both
    /// (`all`): on the terminal (y, n, or a for always), or with --json as a JSON line on
    /// stdin answering each `approval_requested` event (`{"approve": true}`; see
    /// docs/FORMATS.md); `cave mcp serve` asks its client (MCP elicitation). No answer
    /// refuses.
    #[arg(long, value_enum, value_name = "WHAT", help_heading = "Code policy")]
    pub approve: Option<ApproveWhat>,
    /// Append an audit trail to FILE (JSON Lines, timestamped): prompts, cells and their
    /// outcomes, policy refusals, approvals, sandbox layers, stop reasons.
    #[arg(long, value_name = "FILE", help_heading = "Code policy")]
    pub audit: Option<PathBuf>,
}

/// Each cell's time and inline output: options of `run`, `chat` and `mcp serve`.
#[derive(Debug, Args)]
pub struct CellLimitArgs {
    /// Time per cell; the running code is interrupted (seconds, or 30s, 2m).
    #[arg(long, value_name = "DURATION", value_parser = units::parse_seconds, help_heading = "Limits")]
    pub max_exec_timeout: Option<f64>,
    /// Characters of a cell's output shown inline (to the model, or the MCP client); longer
    /// output is stored in the runtime as `_output_N` and its beginning shown [default: 5000].
    #[arg(long, value_name = "CHARS", help_heading = "Limits")]
    pub max_exec_output: Option<usize>,
}

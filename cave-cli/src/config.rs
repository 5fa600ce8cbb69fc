//! Arguments and environment, resolved into a clap-free configuration. The only place that
//! reads environment variables and input files.

use crate::args::{
    CommonArgs, PolicyArgs, PolicyPreset, Provider, RuntimeArgs, RuntimeKind, SandboxMode,
};
use cave_agent::SecurityPolicy;
use cave_agent::kernel::{JupyterConfig, KernelConfig, Sandbox};
use cave_agent::models::{ApiKey, ModelConfig};
use cave_agent::{CellLimits, Value, Variable};
use std::path::PathBuf;
use std::time::Duration;

/// Why the command line cannot run as given. Each says which option was wrong and what it
/// takes instead; `cave` prints it and exits with the usage code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// An option's value, or options together, that cannot be used: the message names the
    /// option and what it takes.
    #[error("{0}")]
    Usage(String),
    /// A file an option names could not be read or opened.
    #[error("{option}: could not read {}: {source}", path.display())]
    Unreadable {
        /// The option (`--var`, `--audit`, `--jupyter-ca`, ...).
        option: String,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Returns a [`ConfigError::Usage`] with this message from the function.
macro_rules! usage {
    ($($message:tt)*) => {
        return Err(ConfigError::Usage(format!($($message)*)))
    };
}

/// A missing value or a failure, as the usage error `message` names (a failure's own words,
/// with its causes, after it).
trait OrUsage<T> {
    fn or_usage(self, message: impl FnOnce() -> String) -> Result<T, ConfigError>;
}

impl<T> OrUsage<T> for Option<T> {
    fn or_usage(self, message: impl FnOnce() -> String) -> Result<T, ConfigError> {
        self.ok_or_else(|| ConfigError::Usage(message()))
    }
}

impl<T, E: std::error::Error> OrUsage<T> for Result<T, E> {
    fn or_usage(self, message: impl FnOnce() -> String) -> Result<T, ConfigError> {
        self.map_err(|e| {
            ConfigError::Usage(format!("{}: {}", message(), cave_agent::error_chain(&e)))
        })
    }
}

/// Where the model's answers come from.
#[derive(Debug)]
pub enum ModelSource {
    /// A server, through an adapter.
    Server {
        /// Which adapter.
        provider: Provider,
        /// Its settings (the key included).
        config: ModelConfig,
    },
    /// A recorded cassette.
    Replay(PathBuf),
}

/// Agent limits and texts.
#[derive(Debug, Default)]
pub struct AgentSettings {
    /// `--max-steps`.
    pub max_steps: Option<u32>,
    /// `--max-run-time`.
    pub max_run_time: Option<Duration>,
    /// `--max-total-tokens`.
    pub max_total_tokens: Option<u64>,
    /// `--max-input-tokens`.
    pub max_input_tokens: Option<u64>,
    /// `--max-output-tokens`.
    pub max_output_tokens: Option<u64>,
    /// `--max-cost`.
    pub max_cost: Option<f64>,
    /// `--max-cpu`.
    pub max_cpu: Option<Duration>,
    /// `--max-host-calls`.
    pub max_host_calls: Option<u64>,
    /// `--price`.
    pub price: Option<cave_agent::Price>,
    /// `--max-exec-timeout`.
    pub max_exec_timeout: Option<Duration>,
    /// `--max-exec-output`.
    pub max_exec_output: Option<usize>,
    /// `--stream-idle-timeout`; `Some(None)` disables the watchdog.
    pub stream_idle_timeout: Option<Option<Duration>>,
    /// `--instructions`.
    pub instructions: Option<String>,
    /// `--vision`, with `--max-image-tokens`.
    pub vision: Option<Option<u64>>,
    /// `--trace-content`.
    pub trace_content: bool,
    /// `--tool-search`.
    pub tool_search: cave_agent::ToolSearch,
    /// `--tool-listing-budget`.
    pub tool_listing_budget: Option<u64>,
}

impl AgentSettings {
    /// Sets on `builder` what was given.
    pub fn apply(self, builder: &mut cave_agent::AgentBuilder) {
        if let Some(v) = self.max_steps {
            builder.max_steps(v);
        }
        if let Some(v) = self.max_run_time {
            builder.max_run_time(v);
        }
        if let Some(v) = self.max_total_tokens {
            builder.max_total_tokens(v);
        }
        if let Some(v) = self.max_input_tokens {
            builder.max_input_tokens(v);
        }
        if let Some(v) = self.max_output_tokens {
            builder.max_output_tokens(v);
        }
        if let Some(v) = self.max_cost {
            builder.max_cost(v);
        }
        if let Some(v) = self.max_cpu {
            builder.max_cpu_time(v);
        }
        if let Some(v) = self.max_host_calls {
            builder.max_host_calls(v);
        }
        if let Some(v) = self.price {
            builder.price(v);
        }
        if let Some(v) = self.max_exec_timeout {
            builder.max_exec_timeout(v);
        }
        if let Some(v) = self.max_exec_output {
            builder.max_exec_output(v);
        }
        if let Some(v) = self.stream_idle_timeout {
            builder.stream_idle_timeout(v);
        }
        if let Some(v) = self.instructions {
            builder.instructions(v);
        }
        match self.vision {
            Some(Some(tokens)) => {
                builder.max_image_tokens(tokens);
            }
            Some(None) => {
                builder.vision(true);
            }
            None => {}
        }
        if self.trace_content {
            builder.trace_content(true);
        }
        builder.tool_search(self.tool_search);
        if let Some(tokens) = self.tool_listing_budget {
            builder.tool_listing_budget(tokens);
        }
    }
}

/// How events are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputMode {
    /// JSON Lines.
    Json,
    /// For a person; colors only on a terminal without `NO_COLOR`.
    Human {
        /// Use ANSI colors.
        color: bool,
        /// Draw images with this protocol (a terminal that speaks one).
        images: Option<crate::images::ImageProtocol>,
    },
}

/// Where the model's code runs.
#[derive(Debug)]
pub enum RuntimeChoice {
    /// In this process, keeping a cell's whole output up to `max_cell_output` bytes.
    InProc {
        /// `--max-cell-output`, or the default.
        max_cell_output: u64,
    },
    /// In a child process, with these settings.
    Kernel(Box<KernelConfig>),
    /// In a kernel behind a Jupyter server.
    Jupyter(Box<JupyterConfig>),
}

/// Everything a session needs.
#[derive(Debug)]
pub struct Config {
    /// Where answers come from.
    pub model: ModelSource,
    /// `--record`.
    pub record: Option<PathBuf>,
    /// The runtime and what it is given.
    pub runtime: RuntimeConfig,
    /// `--context-window`.
    pub context_window: u64,
    /// `--compact-model`, as a second model source on the same server.
    pub compact_model: Option<ModelSource>,
    /// The code policy, approvals and audit.
    pub guards: GuardsConfig,
    /// Limits and texts.
    pub agent: AgentSettings,
    /// How events are printed.
    pub output: OutputMode,
    /// `--retrieve`.
    pub retrieve: Vec<String>,
    /// `--display-dir`, or the default directory for this session.
    pub display_dir: PathBuf,
    /// `--view`: serve the session as a live page on this address.
    pub view: Option<std::net::SocketAddr>,
    /// The key, for redacting anything printed.
    pub api_key: Option<ApiKey>,
    /// Where traces are exported (`--otlp`, the `OTEL_*` variables); `None`: nowhere.
    pub traces: Option<cave_agent::otel::OtlpConfig>,
}

/// Where the code runs and what it is given (`run`, `chat`, `mcp serve`).
#[derive(Debug)]
pub struct RuntimeConfig {
    /// `--var` (with `--var-desc`) and `--secret`.
    pub variables: Vec<Variable>,
    /// `--py`.
    pub python_files: Vec<PathBuf>,
    /// `--runtime` and the kernel's settings.
    pub choice: RuntimeChoice,
    /// `--skills`, read and checked.
    pub skills: cave_agent::SkillSet,
    /// `--mcp` (with `--mcp-header`): the MCP servers, by the name their object is bound under.
    pub mcp: Vec<(String, McpSource)>,
    /// `--mcp-timeout`.
    pub mcp_timeout: std::time::Duration,
}

/// What code may do, who is asked, and what is recorded (`run`, `chat`, `mcp serve`).
#[derive(Debug)]
pub struct GuardsConfig {
    /// `--policy` and the `--deny-*` rules, if any.
    pub policy: Option<SecurityPolicy>,
    /// `--approve`: what is asked about.
    pub approve: Option<crate::args::ApproveWhat>,
    /// `--audit FILE`, opened.
    pub audit: Option<std::sync::Arc<cave_agent::AuditLog>>,
}

/// `cave mcp serve`'s settings.
#[derive(Debug)]
pub struct ServeConfig {
    /// The runtime and what it is given.
    pub runtime: RuntimeConfig,
    /// The code policy, approvals and audit.
    pub guards: GuardsConfig,
    /// `--max-exec-timeout`.
    pub cell_timeout: Option<Duration>,
    /// `--max-exec-output`.
    pub max_output: Option<usize>,
    /// `--http`: the address, the token clients must send, and whether it was made up (not
    /// given in the environment).
    pub http: Option<(std::net::SocketAddr, String, bool)>,
    /// `--max-branches`.
    pub max_branches: usize,
}

/// Reads `LLM_API_KEY` and removes it from the process environment, so that no runtime (and
/// no code a model writes) can read it. Call it first thing in `main`, before any thread starts.
pub fn take_api_key() -> Option<String> {
    let key = std::env::var("LLM_API_KEY")
        .ok()
        .filter(|k| !k.trim().is_empty());
    // SAFETY: called at the start of `main`, while the process has a single thread.
    unsafe { std::env::remove_var("LLM_API_KEY") };
    key
}

/// The values of the environment variables `--secret NAME=ENVVAR` names, taken out of the
/// process environment (so that code in the in-process runtime cannot read them there).
#[derive(Default)]
pub struct TakenSecrets(Vec<(String, Option<String>)>);

impl std::fmt::Debug for TakenSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_tuple("TakenSecrets").field(&names).finish()
    }
}

impl TakenSecrets {
    /// The redactor for what `cave` prints: the API key, and every value taken here (the
    /// `--secret` values, the MCP servers' header values, the serving token), each marked with
    /// its variable's name.
    pub fn redactor(&self, api_key: Option<&str>) -> cave_agent::SecretRedactor {
        let taken = self
            .0
            .iter()
            // A serving token too short to be accepted never guards anything, and the error
            // that refuses it must stay readable ("too short" held one such token).
            .filter(|(env, value)| {
                env != SERVE_TOKEN_VARIABLE
                    || value.as_ref().is_some_and(|v| v.len() >= MIN_SERVE_TOKEN)
            })
            .filter_map(|(env, value)| Some((env.clone(), value.clone()?)));
        let key = api_key.map(|k| ("API key".to_owned(), k.to_owned()));
        cave_agent::SecretRedactor::new(key.into_iter().chain(taken)).with_key_shapes()
    }
}

/// Reads and removes the variables `--secret` names. Call it in `main` right after parsing,
/// while the process has a single thread.
pub fn take_secrets(cli: &crate::args::Cli) -> TakenSecrets {
    use crate::args::{Command, McpCommand};
    let mut taken = Vec::new();
    let runtime = match &cli.command {
        Command::Run(args) => &args.common.runtime,
        Command::Chat(args) => &args.common.runtime,
        Command::Mcp(McpCommand::Serve(args)) => {
            if args.http.is_some() {
                // The HTTP token: out of reach of the cells, like the secrets.
                let value = std::env::var(SERVE_TOKEN_VARIABLE)
                    .ok()
                    .filter(|v| !v.is_empty());
                // SAFETY: called from `main` before any thread starts.
                unsafe { std::env::remove_var(SERVE_TOKEN_VARIABLE) };
                taken.push((SERVE_TOKEN_VARIABLE.to_owned(), value));
            }
            &args.runtime
        }
        _ => return TakenSecrets::default(),
    };
    // The MCP servers' header values are secrets too: out of reach of the model's code.
    let header_vars = runtime
        .mcp_headers
        .iter()
        .filter_map(|arg| arg.split_once(':').map(|(_, header)| header));
    for arg in runtime
        .secrets
        .iter()
        .map(String::as_str)
        .chain(header_vars)
    {
        let Some((_, env)) = arg.split_once('=') else {
            continue;
        };
        let value = std::env::var(env).ok().filter(|v| !v.is_empty());
        // SAFETY: called from `main` before any thread starts.
        unsafe { std::env::remove_var(env) };
        taken.push((env.to_owned(), value));
    }
    TakenSecrets(taken)
}

/// The variable `cave mcp serve --http` reads its token from.
pub const SERVE_TOKEN_VARIABLE: &str = "CAVE_MCP_TOKEN";

/// The shortest serving token accepted, in bytes.
const MIN_SERVE_TOKEN: usize = 16;

/// `--secret NAME=ENVVAR` as secret variables.
fn secret_variables(
    args: &RuntimeArgs,
    taken: &TakenSecrets,
) -> Result<Vec<Variable>, ConfigError> {
    args.secrets
        .iter()
        .map(|arg| {
            let (name, env) = arg
                .split_once('=')
                .filter(|(n, e)| !n.is_empty() && !e.is_empty())
                .or_usage(|| format!("--secret expects NAME=ENVVAR, got {arg:?}"))?;
            let value = taken
                .0
                .iter()
                .find(|(e, _)| e == env)
                .and_then(|(_, v)| v.clone())
                .or_usage(|| {
                    format!(
                        "--secret {arg}: the environment variable {env} is not set (or is empty)"
                    )
                })?;
            Ok(Variable::secret(name, value))
        })
        .collect()
}

/// Resolves the shared options. `api_key` and the `--secret` values were taken from the
/// environment at start-up.
pub fn resolve(
    args: &CommonArgs,
    api_key: Option<ApiKey>,
    secrets: &TakenSecrets,
) -> Result<Config, ConfigError> {
    let model = match &args.replay {
        Some(path) => ModelSource::Replay(path.clone()),
        None => {
            // An option wins over its variable; the variables are read here, nowhere else.
            let id = args
                .model
                .clone()
                .or_else(|| std::env::var("LLM_MODEL_ID").ok())
                .filter(|m| !m.trim().is_empty());
            let Some(id) = id else {
                usage!(
                    "no model given: pass --model ID or set LLM_MODEL_ID (or use --replay CASSETTE)"
                );
            };
            let mut config = ModelConfig::new(id);
            let base_url = args
                .base_url
                .clone()
                .or_else(|| std::env::var("LLM_BASE_URL").ok())
                .filter(|u| !u.trim().is_empty());
            if let Some(url) = base_url {
                config = config.base_url(url);
            }
            if let Some(key) = &api_key {
                config = config.api_key(key.clone());
            }
            ModelSource::Server {
                provider: args.provider,
                config,
            }
        }
    };
    if args.context_window < 1_000 {
        usage!(
            "--context-window must be at least 1000 tokens, not {}",
            args.context_window
        );
    }
    if args.max_cost.is_some() && args.price.is_none() && args.provider != Provider::Litellm {
        // Not refused: a server may report its costs all the same (OpenRouter does).
        eprintln!(
            "cave: warning: --max-cost counts what the server reports a call cost, and an OpenAI-compatible server usually reports nothing: give the model's price with --price IN,OUT"
        );
    }
    let agent = AgentSettings {
        max_steps: args.max_steps,
        max_run_time: args
            .max_run_time
            .map(|s| seconds("--max-run-time", s))
            .transpose()?,
        max_total_tokens: args.max_total_tokens,
        max_input_tokens: args.max_input_tokens,
        max_output_tokens: args.max_output_tokens,
        max_cost: args.max_cost,
        max_cpu: args.max_cpu.map(|s| seconds("--max-cpu", s)).transpose()?,
        max_host_calls: args.max_host_calls,
        price: args.price,
        max_exec_timeout: args
            .cells
            .max_exec_timeout
            .map(|s| seconds("--max-exec-timeout", s))
            .transpose()?,
        max_exec_output: args.cells.max_exec_output,
        stream_idle_timeout: args
            .stream_idle_timeout
            .map(|s| seconds("--stream-idle-timeout", s).map(|d| (!d.is_zero()).then_some(d)))
            .transpose()?,
        instructions: args.instructions.clone(),
        vision: args.vision.then_some(args.max_image_tokens),
        trace_content: args.trace_content,
        tool_search: args.tool_search,
        tool_listing_budget: args.tool_listing_budget,
    };
    let traces = resolve_traces(args)?;
    let output = if args.json {
        OutputMode::Json
    } else {
        OutputMode::Human {
            // On a terminal unless NO_COLOR (or TERM=dumb) says otherwise; anywhere with
            // CLICOLOR_FORCE: anstream's reading of the conventions.
            color: anstream::AutoStream::choice(&std::io::stdout()) != anstream::ColorChoice::Never,
            images: images(args.images),
        }
    };
    if let Some(name) = args.retrieve.iter().find(|n| !cave_agent::is_identifier(n)) {
        usage!("--retrieve takes a variable name, not {name:?}");
    }
    if args.max_steps == Some(0) {
        usage!("--max-steps must be at least 1 (a run with no model call does nothing)");
    }
    let compact_model = compact_model(args, &model);
    Ok(Config {
        model,
        record: args.record.clone(),
        runtime: resolve_runtime(&args.runtime, secrets, agent.max_exec_timeout)?,
        guards: resolve_guards(&args.policy)?,
        context_window: args.context_window,
        compact_model,
        agent,
        output,
        retrieve: args.retrieve.clone(),
        display_dir: args.display_dir.clone().unwrap_or_else(default_display_dir),
        view: match args.view {
            Some(addr) if !addr.ip().is_loopback() => {
                usage!("--view: {}", crate::view::ViewError::NotLoopback(addr))
            }
            view => view,
        },
        api_key,
        traces,
    })
}

/// `--otlp URL`, else the standard `OTEL_*` variables: where traces go, if anywhere.
fn resolve_traces(args: &CommonArgs) -> Result<Option<cave_agent::otel::OtlpConfig>, ConfigError> {
    if let Some(url) = &args.otlp
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        usage!(
            "--otlp takes the http:// or https:// URL of an OTLP/HTTP receiver (e.g. http://127.0.0.1:4318), not {url:?}"
        );
    }
    let traces = cave_agent::otel::OtlpConfig::from_env_with(args.otlp.clone());
    if args.trace_content && traces.is_none() {
        usage!(
            "--trace-content records cells in traces, but no traces are exported: give --otlp URL or set OTEL_EXPORTER_OTLP_ENDPOINT"
        );
    }
    Ok(traces)
}

/// A number of seconds given for `flag`, as a duration.
fn seconds(flag: &str, s: f64) -> Result<Duration, ConfigError> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| ConfigError::Usage(format!("{flag} must be a number of seconds ≥ 0, not {s}")))
}

/// The runtime options.
pub fn resolve_runtime(
    args: &RuntimeArgs,
    secrets: &TakenSecrets,
    cell_limit: Option<Duration>,
) -> Result<RuntimeConfig, ConfigError> {
    let mut variables = args
        .vars
        .iter()
        .map(|v| parse_var(v))
        .collect::<Result<Vec<_>, ConfigError>>()?;
    for desc in &args.var_descs {
        let (name, text) = desc
            .split_once('=')
            .or_usage(|| format!("--var-desc expects NAME=TEXT, got {desc:?}"))?;
        let variable = variables
            .iter_mut()
            .find(|v| v.name == name)
            .or_usage(|| format!("--var-desc names {name:?}, which no --var defines"))?;
        variable.description = Some(text.to_owned());
    }
    variables.extend(secret_variables(args, secrets)?);
    Ok(RuntimeConfig {
        variables,
        python_files: args.py.clone(),
        choice: runtime(args)?,
        skills: skills(&args.skills)?,
        mcp: mcp_servers(args, secrets)?,
        // A call may take as long as the cell that makes it, unless told otherwise.
        mcp_timeout: match args.mcp_timeout {
            Some(s) => seconds("--mcp-timeout", s)?,
            None => cell_limit.unwrap_or(cave_agent::mcp::DEFAULT_CALL_TIMEOUT),
        },
    })
}

/// The code policy, approval and audit options.
pub fn resolve_guards(args: &PolicyArgs) -> Result<GuardsConfig, ConfigError> {
    Ok(GuardsConfig {
        policy: policy(args)?,
        approve: args.approve,
        audit: match &args.audit {
            Some(path) => Some(
                cave_agent::AuditLog::append(path)
                    .or_usage(|| format!("--audit {}: cannot open it", path.display()))?,
            ),
            None => None,
        },
    })
}

/// `cave mcp serve`'s options. The HTTP token was taken from the environment at start-up.
pub fn resolve_serve(
    args: &crate::args::ServeArgs,
    secrets: &TakenSecrets,
) -> Result<ServeConfig, ConfigError> {
    let http = match args.http {
        Some(addr) if !addr.ip().is_loopback() => usage!(
            "--http {addr}: the session is served on this machine only (a loopback address: 127.0.0.1 or ::1)"
        ),
        Some(addr) => {
            let given = secrets
                .0
                .iter()
                .find(|(name, _)| name == SERVE_TOKEN_VARIABLE)
                .and_then(|(_, value)| value.clone());
            match given {
                Some(token) if token.len() < MIN_SERVE_TOKEN => usage!(
                    "{SERVE_TOKEN_VARIABLE} is too short: a token of {MIN_SERVE_TOKEN} characters or more (or unset it, and one is made up)"
                ),
                Some(token) => Some((addr, token, false)),
                None => Some((addr, cave_agent::mcp::serve::generate_token(), true)),
            }
        }
        None => None,
    };
    let cell_timeout = args
        .cells
        .max_exec_timeout
        .map(|s| seconds("--max-exec-timeout", s))
        .transpose()?;
    Ok(ServeConfig {
        runtime: resolve_runtime(&args.runtime, secrets, cell_timeout)?,
        guards: resolve_guards(&args.policy)?,
        cell_timeout,
        max_output: args.cells.max_exec_output,
        http,
        max_branches: args.max_branches,
    })
}

/// Where an MCP server is.
#[derive(Debug)]
pub enum McpSource {
    /// A command started with the session.
    Stdio(cave_agent::mcp::StdioServer),
    /// A server over streamable HTTP.
    Http(cave_agent::mcp::HttpServer),
}

/// `--mcp NAME=COMMAND|URL`: the name (an identifier, as the object is bound) and the server.
pub fn mcp_server(spec: &str) -> Result<(String, McpSource), ConfigError> {
    let Some((name, target)) = spec.split_once('=') else {
        usage!(
            "--mcp takes NAME=COMMAND or NAME=URL (e.g. time=\"uvx mcp-server-time\"), not {spec:?}"
        );
    };
    let name = cave_agent::validate_name(cave_agent::NameKind::Object, name.trim())
        .map_err(|e| ConfigError::Usage(format!("--mcp {spec:?}: {e}")))?;
    let target = target.trim();
    if target.starts_with("http://") || target.starts_with("https://") {
        return Ok((
            name,
            McpSource::Http(cave_agent::mcp::HttpServer::new(target)),
        ));
    }
    let server = cave_agent::mcp::StdioServer::from_command_line(target)
        .map_err(|e| ConfigError::Usage(format!("--mcp {name}: {e}")))?;
    Ok((name, McpSource::Stdio(server)))
}

/// The value of the environment variable `name`, when it is set and not empty (`cave mcp
/// list --header`, which runs no model code, reads it in place).
pub fn environment_value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A header for an HTTP server: `KEY=ENVVAR` read from `value_of(ENVVAR)`.
pub fn mcp_header(
    server: &mut McpSource,
    header: &str,
    value_of: impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let Some((key, env)) = header
        .split_once('=')
        .filter(|(k, e)| !k.is_empty() && !e.is_empty())
    else {
        usage!("an MCP header is KEY=ENVVAR (its value is read from ENVVAR), not {header:?}");
    };
    let McpSource::Http(http) = server else {
        usage!("the header {key} is for a server over HTTP; this one is a command");
    };
    let value = value_of(env).or_usage(|| {
        format!("the header {key}: the environment variable {env} is not set (or is empty)")
    })?;
    http.headers.push((key.to_owned(), value));
    Ok(())
}

/// `--mcp` and `--mcp-header NAME:KEY=ENVVAR` (the values taken from the environment at
/// start-up).
fn mcp_servers(
    args: &RuntimeArgs,
    taken: &TakenSecrets,
) -> Result<Vec<(String, McpSource)>, ConfigError> {
    let mut servers = args
        .mcp
        .iter()
        .map(|spec| mcp_server(spec))
        .collect::<Result<Vec<_>, ConfigError>>()?;
    for arg in &args.mcp_headers {
        let Some((name, header)) = arg.split_once(':') else {
            usage!("--mcp-header takes NAME:KEY=ENVVAR, not {arg:?}");
        };
        let Some((_, server)) = servers.iter_mut().find(|(n, _)| n == name) else {
            usage!("--mcp-header {arg}: no --mcp server is called {name:?}");
        };
        mcp_header(server, header, |env| {
            taken
                .0
                .iter()
                .find(|(e, _)| e == env)
                .and_then(|(_, v)| v.clone())
        })
        .or_usage(|| format!("--mcp-header {name}"))?;
    }
    Ok(servers)
}

/// The image protocol `--images` chooses: by hand, or the terminal's (none when stdout is not
/// a terminal).
fn images(choice: crate::args::ImagesChoice) -> Option<crate::images::ImageProtocol> {
    use crate::args::ImagesChoice;
    use crate::images::ImageProtocol;
    match choice {
        ImagesChoice::Auto => std::io::IsTerminal::is_terminal(&std::io::stdout())
            .then(|| ImageProtocol::detect(|name| std::env::var(name).ok()))
            .flatten(),
        ImagesChoice::Kitty => Some(ImageProtocol::Kitty),
        ImagesChoice::Iterm2 => Some(ImageProtocol::Iterm2),
        ImagesChoice::Sixel => Some(ImageProtocol::Sixel),
        ImagesChoice::Off => None,
    }
}

/// `cave-display-YYYYMMDD-HHMMSS` in the current directory (UTC), as an absolute path (the
/// events name files under it).
fn default_display_dir() -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (year, month, day) = cave_agent::prompt::civil_date(secs);
    let in_day = secs % 86_400;
    let name = format!(
        "cave-display-{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        in_day / 3600,
        in_day % 3600 / 60,
        in_day % 60
    );
    std::env::current_dir().unwrap_or_default().join(name)
}

/// `--runtime` and the options of the kernel runtime (refused with the in-process one, where
/// they would silently do nothing).
fn runtime(args: &RuntimeArgs) -> Result<RuntimeChoice, ConfigError> {
    let kernel_only = [
        ("--python", args.python.is_some()),
        ("--memory-limit", args.memory_limit.is_some()),
        ("--max-address-space", args.max_address_space.is_some()),
        ("--cpu-limit", args.cpu_limit.is_some()),
        ("--max-open-files", args.max_open_files.is_some()),
        ("--max-processes", args.max_processes.is_some()),
        ("--max-file-size", args.max_file_size.is_some()),
        ("--no-spare", args.no_spare),
        ("--sandbox", args.sandbox.is_some()),
        ("--allow-net", !args.allow_net.is_empty()),
        ("--max-egress", args.max_egress.is_some()),
    ];
    let jupyter_only = [
        ("--jupyter-url", args.jupyter_url.is_some()),
        ("--jupyter-kernel", args.jupyter_kernel.is_some()),
        ("--jupyter-kernel-id", args.jupyter_kernel_id.is_some()),
        ("--jupyter-env", !args.jupyter_env.is_empty()),
        ("--jupyter-ca", args.jupyter_ca.is_some()),
    ];
    if args.kind != RuntimeKind::Jupyter
        && let Some((flag, _)) = jupyter_only.iter().find(|(_, given)| *given)
    {
        usage!("{flag} applies to the Jupyter runtime: add --runtime jupyter");
    }
    let max_cell_output = args
        .max_cell_output
        .unwrap_or(cave_agent::DEFAULT_MAX_CELL_OUTPUT);
    match args.kind {
        RuntimeKind::Jupyter => {
            // The server decides the interpreter, limits and isolation of its kernels.
            if let Some((flag, _)) = kernel_only
                .iter()
                .filter(|(flag, _)| *flag != "--no-spare")
                .find(|(_, given)| *given)
            {
                usage!(
                    "{flag} applies to the kernel runtime's child process; with --runtime jupyter the server sets its kernels' interpreter, limits and isolation"
                );
            }
            let Some(url) = &args.jupyter_url else {
                usage!(
                    "--runtime jupyter needs --jupyter-url URL (the server, e.g. http://127.0.0.1:8888)"
                );
            };
            let mut jupyter = JupyterConfig::new(url.clone());
            if let Some(token) = std::env::var("JUPYTER_TOKEN")
                .ok()
                .filter(|t| !t.is_empty())
            {
                jupyter = jupyter.token(token);
            }
            if let Some(name) = &args.jupyter_kernel {
                jupyter = jupyter.kernel_name(name.clone());
            }
            if let Some(id) = &args.jupyter_kernel_id {
                jupyter = jupyter.attach(id.clone());
            }
            for pair in &args.jupyter_env {
                let Some((name, value)) = pair.split_once('=').filter(|(n, _)| !n.is_empty())
                else {
                    usage!("--jupyter-env takes NAME=VALUE, not {pair:?}");
                };
                jupyter = jupyter.env(name, value);
            }
            if let Some(path) = &args.jupyter_ca {
                let pem = std::fs::read(path).map_err(|source| ConfigError::Unreadable {
                    option: "--jupyter-ca".to_owned(),
                    path: path.clone(),
                    source,
                })?;
                jupyter = jupyter.ca_certificates(pem);
            }
            Ok(RuntimeChoice::Jupyter(Box::new(
                jupyter
                    .spare(!args.no_spare)
                    .cell_limits(CellLimits::default().max_cell_output(max_cell_output)),
            )))
        }
        RuntimeKind::Inproc => {
            if let Some((flag, _)) = kernel_only.iter().find(|(_, given)| *given) {
                usage!(
                    "{flag} applies to the kernel runtime: add --runtime kernel (the in-process runtime uses this process's limits; choose its Python with CAVE_PYTHON)"
                );
            }
            Ok(RuntimeChoice::InProc { max_cell_output })
        }
        RuntimeKind::Kernel => {
            let mut sandbox = match args.sandbox.unwrap_or(SandboxMode::Strict) {
                SandboxMode::Strict => Sandbox::strict(),
                SandboxMode::Off if !args.allow_net.is_empty() => usage!(
                    "--allow-net applies to the strict sandbox (with --sandbox off every host is reachable)"
                ),
                SandboxMode::Off => Sandbox::off(),
            };
            if !args.allow_net.is_empty() {
                let allowlist = cave_agent::kernel::Allowlist::parse(
                    args.allow_net
                        .iter()
                        .map(|e| e.trim())
                        .filter(|e| !e.is_empty()),
                )
                .map_err(|e| ConfigError::Usage(e.to_string()))?;
                sandbox = sandbox.allow_net(allowlist);
            } else if args.max_egress.is_some() {
                usage!("--max-egress bounds what --allow-net lets through: add --allow-net HOSTS");
            }
            sandbox = sandbox.max_egress(args.max_egress);
            let mut config = KernelConfig::new().spare(!args.no_spare).sandbox(sandbox);
            // An option changes one limit; the others keep the defaults of the sandbox.
            let mut limits = config.limits_in_force();
            let defaults = limits.clone();
            if let Some(bytes) = args.memory_limit {
                limits = limits.memory(bytes);
            }
            if let Some(bytes) = args.max_address_space {
                limits = limits.address_space(bytes);
            }
            if let Some(seconds) = args.cpu_limit {
                if seconds < 1.0 {
                    usage!("--cpu-limit must be at least 1 second, not {seconds}");
                }
                limits = limits.cpu_seconds(seconds.ceil() as u64);
            }
            if let Some(files) = args.max_open_files {
                limits = limits.open_files(files);
            }
            if let Some(processes) = args.max_processes {
                limits = limits.processes(processes);
            }
            if let Some(bytes) = args.max_file_size {
                limits = limits.file_size(bytes);
            }
            if let Some(largest) = limits.file_size
                && max_cell_output > largest
            {
                usage!(
                    "--max-cell-output {} is above the largest file the child may write ({}): lower it, or raise --max-file-size",
                    cave_agent::format_size(max_cell_output),
                    cave_agent::format_size(largest),
                );
            }
            if limits != defaults {
                config = config.limits(limits);
            }
            config = config.cell_limits(CellLimits::default().max_cell_output(max_cell_output));
            if let Some(python) = &args.python {
                config = config.python(python);
            }
            Ok(RuntimeChoice::Kernel(Box::new(config)))
        }
    }
}

/// `--skills`: every path read and checked; any problem is a usage error listing them all.
/// Warnings (a directory named differently from its skill) go to stderr.
fn skills(paths: &[PathBuf]) -> Result<cave_agent::SkillSet, ConfigError> {
    let mut set = cave_agent::SkillSet::new();
    let mut problems = Vec::new();
    for path in paths {
        let found = cave_agent::skills::discover(path);
        for warning in &found.warnings {
            eprintln!("cave: warning: {warning}");
        }
        problems.extend(found.errors.iter().map(ToString::to_string));
        for skill in found.skills {
            if let Err(e) = set.add(skill) {
                problems.push(e.to_string());
            }
        }
    }
    if !problems.is_empty() {
        usage!("--skills: {}", problems.join("\n"));
    }
    Ok(set)
}

/// `NAME=JSON` or `NAME=@FILE`.
fn parse_var(spec: &str) -> Result<Variable, ConfigError> {
    let (name, raw) = spec
        .split_once('=')
        .or_usage(|| format!("--var expects NAME=JSON, got {spec:?}"))?;
    if name.is_empty() {
        usage!("--var {spec:?} has no name before '='");
    }
    let (text, origin) = match raw.strip_prefix('@') {
        Some(path) => (
            std::fs::read_to_string(path)
                .or_usage(|| format!("--var {name}: cannot read {path}"))?,
            format!("the file {path}"),
        ),
        None => (raw.to_owned(), "its value".to_owned()),
    };
    let value: Value = serde_json::from_str(&text).or_usage(|| {
        format!("--var {name}: {origin} is not valid JSON (strings need quotes: {name}='\"text\"')")
    })?;
    Ok(Variable::new(name, value))
}

/// The code policy the flags describe, if any.
fn policy(args: &PolicyArgs) -> Result<Option<SecurityPolicy>, ConfigError> {
    let mut policy = match args.preset {
        Some(PolicyPreset::Strict) => SecurityPolicy::strict(),
        None => SecurityPolicy::new(),
    };
    let list = |items: &[String]| {
        items
            .iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
    };
    if !args.deny_import.is_empty() {
        policy = policy.deny_imports(list(&args.deny_import), None);
    }
    if !args.deny_call.is_empty() {
        policy = policy.deny_calls(list(&args.deny_call), None);
    }
    if !args.deny_attr.is_empty() {
        policy = policy.deny_attributes(list(&args.deny_attr), None);
    }
    for pattern in &args.deny_regex {
        policy = policy
            .deny_regex(pattern, None)
            .or_usage(|| "--deny-regex".to_owned())?;
    }
    Ok((!policy.is_empty()).then_some(policy))
}

/// The summary model: the main model's settings with another id.
fn compact_model(args: &CommonArgs, main: &ModelSource) -> Option<ModelSource> {
    let id = args.compact_model.as_deref()?;
    match main {
        ModelSource::Server { provider, config } => Some(ModelSource::Server {
            provider: *provider,
            config: config.clone().with_model(id),
        }),
        ModelSource::Replay(_) => None,
    }
}

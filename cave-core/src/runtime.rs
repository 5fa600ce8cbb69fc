//! The `Runtime` seam: a persistent Python namespace the model's code runs in.

use crate::{
    Description, HostObject, Registry, Resource, Resources, RuntimeError, Value, from_value, lock,
    to_value,
};
use async_trait::async_trait;
use serde::{Serialize, de::DeserializeOwned};
use std::fmt;
use std::sync::{Arc, Mutex};

/// A persistent Python namespace that the model's code runs in.
///
/// The runtime owns names and state; the agent owns the conversation. Required are the
/// namespace's genuine operations:
/// - [`execute`](Runtime::execute) a cell;
/// - [`register`](Runtime::register) an atomic batch of resources, recorded in the
///   [`registry`](Runtime::registry) the runtime keeps;
/// - [`update`](Runtime::update) a registered variable, [`get`](Runtime::get) any bound name,
///   and say whether a name still holds its registered host object
///   ([`object_bound`](Runtime::object_bound));
/// - [`bind_unique`](Runtime::bind_unique) and [`reset`](Runtime::reset).
///
/// What is the same for every runtime is derived from the registry in [`RuntimeExt`] and
/// cannot be left out or done differently: the prompt's description, the secrets the agent
/// redacts, retrieving a registered variable or host object, typed access.
/// [`interrupter`](Runtime::interrupter) defaults to `None`: a runtime that cannot stop running
/// code does not claim it can; [`isolation`](Runtime::isolation) to no layers.
#[async_trait]
pub trait Runtime: Send + Sync {
    /// Runs a cell. Output is written to `output` as it is produced, where the runtime can
    /// stream it, and returned whole in the [`Execution`]. Code that raises is a *successful*
    /// call with `error` set; `Err` means the runtime itself failed.
    async fn execute(&self, code: &str, output: &dyn OutputSink)
    -> Result<Execution, RuntimeError>;

    /// Registers a batch of resources: all bound, or none (names are validated, NFKC-normalized
    /// and share one namespace across kinds, by [`Registry::claim`]). When it returns `Ok`,
    /// every resource is bound, usable by the next execution and in the
    /// [`registry`](Runtime::registry); on `Err`, nothing of the batch is bound or registered.
    async fn register(&self, batch: Resources) -> Result<(), RuntimeError>;

    /// What is registered: the one record the derived operations read ([`RuntimeExt`]).
    fn registry(&self) -> &Mutex<Registry>;

    /// The [`registry`](Runtime::registry) as a handle that lives as long as the runtime,
    /// whoever holds the runtime: a host function the runtime holds keeps a `Weak` of it to
    /// read what is registered (`search_tools`). `None`: the runtime has no such handle.
    fn shared_registry(&self) -> Option<std::sync::Arc<Mutex<Registry>>> {
        None
    }

    /// Replaces the value of a registered variable.
    async fn update(&self, name: &str, value: Value) -> Result<(), RuntimeError>;

    /// The value of any bound name (`None` is a value, not absence).
    async fn get(&self, name: &str) -> Result<Value, RuntimeError>;

    /// Whether `name` still holds the host object registered under it (the model's code may
    /// have bound something else to the name).
    async fn object_bound(&self, name: &str) -> Result<bool, RuntimeError>;

    /// Whether `name` is bound in the namespace. By default asked of [`get`](Runtime::get)
    /// (a value too large to cross, or without a counterpart, is bound too); a runtime that can
    /// tell without moving the value, or without starting anything, says so itself.
    async fn is_bound(&self, name: &str) -> Result<bool, RuntimeError> {
        match self.get(name).await {
            Ok(_) | Err(RuntimeError::Unsupported { .. }) | Err(RuntimeError::TooLarge { .. }) => {
                Ok(true)
            }
            Err(RuntimeError::Unbound { .. }) => Ok(false),
            Err(other) => Err(other),
        }
    }

    /// How the model's code is isolated, layer by layer; empty when the runtime does not say
    /// (the agent reports it as a status when it changes).
    fn isolation(&self) -> Vec<Layer> {
        Vec::new()
    }

    /// Binds `value` to the first free name `{prefix}_{n}` with `n >= start` that was never
    /// handed out before, and returns it. The check and the binding are one step; the binding
    /// survives `reset`.
    async fn bind_unique(
        &self,
        prefix: &str,
        value: Value,
        start: u64,
    ) -> Result<String, RuntimeError>;

    /// Binds the whole text of a cell's output kept in a file (`Execution::spooled`) to a
    /// fresh `{prefix}_{n}`, as [`bind_unique`](Self::bind_unique) binds a value. By default
    /// the host reads the file and binds the text; a runtime whose Python can read the file
    /// itself reads it there, so the text is never in the host's memory.
    async fn bind_unique_spooled(
        &self,
        prefix: &str,
        spooled: &crate::SpooledOutput,
        start: u64,
    ) -> Result<String, RuntimeError> {
        let text = spooled.text()?;
        self.bind_unique(prefix, Value::Str(text), start).await
    }

    /// Clears the namespace and restores every registered resource, as one step.
    async fn reset(&self) -> Result<(), RuntimeError>;

    /// Runs a Python file in the runtime and registers what it exports: its `__exports__`
    /// (`Function`, `Variable`, `Type` from the `cave_agent.runtime` module, as CaveAgent's
    /// injection modules write them), or else its public top-level functions and classes;
    /// classes their signatures need are bound too, hidden. All or nothing; the objects
    /// survive `reset`. `hidden`: bound for code, not shown in the prompt. Returns what was
    /// registered, as resources (for describing them elsewhere). A runtime without Python
    /// files refuses.
    async fn register_python_file(
        &self,
        path: &std::path::Path,
        hidden: bool,
    ) -> Result<Resources, RuntimeError> {
        let _ = hidden;
        Err(RuntimeError::NotSupported {
            operation: "register_python_file",
            reason: format!("it does not load Python files ({})", path.display()),
        })
    }

    /// The handle that stops running code, if this runtime can.
    fn interrupter(&self) -> Option<Arc<dyn Interrupt>> {
        None
    }

    /// Whether [`fork`](Self::fork) can work here (what a server advertises by).
    fn can_fork(&self) -> bool {
        false
    }

    /// What the runtime's code has used of the machine so far, read now (cheaply: the loop
    /// reads it before and after each cell, and while one runs when a processor-time budget
    /// is set). The reading may start again from zero when the runtime's process is replaced;
    /// `None` when the runtime cannot measure it (the default).
    fn resource_usage(&self) -> Option<ResourceUsage> {
        None
    }

    /// A branch of this session: an independent runtime whose namespace is a copy of this
    /// one's (values, imports, what is registered), each going on from here on its own. A
    /// runtime that cannot copy a live namespace refuses with
    /// [`RuntimeError::NotSupported`], saying which runtime can.
    async fn fork(&self) -> Result<Arc<dyn Runtime>, RuntimeError> {
        Err(RuntimeError::NotSupported {
            operation: "fork",
            reason: "it cannot copy a live namespace: the kernel runtime on a local child process can (KernelRuntime)".to_owned(),
        })
    }
}

/// What every [`Runtime`] does the same way, derived from its registry and its required
/// operations; implemented for every runtime (and `dyn Runtime`), never by one.
#[async_trait]
pub trait RuntimeExt: Runtime {
    /// This runtime with `resources` registered, for building one in an expression
    /// (`InProcRuntime::new()?.registered(resources).await?`); the registration's error as
    /// [`register`](Runtime::register) gives it.
    async fn registered(self, resources: Resources) -> Result<Self, RuntimeError>
    where
        Self: Sized,
    {
        self.register(resources).await?;
        Ok(self)
    }

    /// The registered resources as prompt text.
    fn describe(&self) -> Description {
        lock(self.registry()).describe()
    }

    /// The registered resources as prompt text with tool search: objects named, not listed
    /// method by method ([`Registry::describe_compact`](crate::Registry::describe_compact)).
    fn describe_compact(&self) -> Description {
        lock(self.registry()).describe_compact()
    }

    /// The `(name, value)` of each registered secret variable
    /// ([`Variable::secret`](crate::Variable::secret)), which the agent redacts from
    /// everything the model reads and every event.
    fn secrets(&self) -> Vec<(String, String)> {
        lock(self.registry()).secrets()
    }

    /// The current value of a registered variable (after the model's code changed it). For a
    /// name the code bound itself, [`get`](Runtime::get) or [`get_as`](RuntimeExt::get_as).
    async fn retrieve(&self, name: &str) -> Result<Value, RuntimeError> {
        let available = {
            let registry = lock(self.registry());
            registry
                .variable(name)
                .is_none()
                .then(|| registry.variable_names())
        };
        match available {
            None => self.get(name).await,
            Some(available) => Err(RuntimeError::UnknownVariable {
                name: name.to_owned(),
                available,
                // Only a hint in the message: a runtime that cannot tell says not bound.
                bound: self.is_bound(name).await.unwrap_or(false),
            }),
        }
    }

    /// A registered variable, deserialized.
    async fn retrieve_as<T: DeserializeOwned>(&self, name: &str) -> Result<T, RuntimeError> {
        let value = self.retrieve(name).await?;
        from_value(value).map_err(|source| RuntimeError::Conversion {
            name: name.to_owned(),
            source,
        })
    }

    /// Any bound name (one the model's code made, say), deserialized.
    async fn get_as<T: DeserializeOwned>(&self, name: &str) -> Result<T, RuntimeError> {
        let value = self.get(name).await?;
        from_value(value).map_err(|source| RuntimeError::Conversion {
            name: name.to_owned(),
            source,
        })
    }

    /// Replaces a registered variable with a serialized Rust value.
    async fn update_from<T: Serialize + Sync + ?Sized>(
        &self,
        name: &str,
        value: &T,
    ) -> Result<(), RuntimeError> {
        let value = to_value(value).map_err(|source| RuntimeError::Conversion {
            name: name.to_owned(),
            source,
        })?;
        self.update(name, value).await
    }

    /// The host object registered under `name`, as the concrete type it was registered with
    /// (through approval and audit wrappers), while the name still holds it: the object
    /// itself, with whatever the model's code did to it.
    async fn retrieve_object<T: HostObject>(&self, name: &str) -> Result<Arc<T>, RuntimeError> {
        let object = lock(self.registry())
            .object(name)
            .map(|o| o.object.clone())
            .ok_or_else(|| RuntimeError::NotAnObject {
                name: name.to_owned(),
                expected: std::any::type_name::<T>(),
            })?;
        if !self.object_bound(name).await? {
            return Err(RuntimeError::Unbound {
                name: name.to_owned(),
            });
        }
        downcast_object::<T>(name, object)
    }

    /// Registers `batch` in place of the registered functions and objects of the same names
    /// (an object whose methods changed, say), binding each anew; a name not registered yet is
    /// simply registered. All or nothing: on an error the old entries stay registered, and
    /// bound as they were. A variable or type cannot be replaced this way.
    async fn replace(&self, batch: Resources) -> Result<(), RuntimeError> {
        let names: Vec<String> = batch
            .items()
            .iter()
            .map(|resource| crate::normalize_name(resource.name()))
            .collect();
        let removed = {
            let mut registry = lock(self.registry());
            let replaceable = |entry: &crate::Entry| {
                matches!(entry.resource, Resource::Function(_) | Resource::Object(_))
            };
            if let Some(entry) = names
                .iter()
                .filter_map(|name| registry.entry(name))
                .find(|entry| !replaceable(entry))
            {
                return Err(RuntimeError::InvalidResource {
                    name: entry.name.clone(),
                    problem: "only functions and objects can be replaced".to_owned(),
                });
            }
            names
                .iter()
                .filter_map(|name| registry.remove(name))
                .collect::<Vec<_>>()
        };
        let registered = self.register(batch).await;
        if registered.is_err() {
            lock(self.registry()).reinstate(removed);
        }
        registered
    }

    /// The public names bound in the namespace now (modules left out), sorted: what the
    /// host registered and what cells bound alike. Runs a cell of the host's own.
    async fn namespace(&self) -> Result<Vec<BoundName>, RuntimeError> {
        const LISTING: &str = "print('\\n'.join(f'{k}\\t{type(v).__name__}\\t{int(callable(v))}' for k, v in sorted(globals().items()) if not k.startswith('_') and type(v).__name__ != 'module'), end='')";
        let run = self.execute(LISTING, &DiscardOutput).await?;
        if !run.success() {
            return Err(RuntimeError::Backend {
                operation: "namespace",
                message: run.output,
            });
        }
        Ok(run
            .output
            .lines()
            .filter_map(|line| {
                let mut fields = line.split('\t');
                Some(BoundName {
                    name: fields.next()?.to_owned(),
                    python_type: fields.next()?.to_owned(),
                    callable: fields.next()? == "1",
                })
            })
            .collect())
    }
}

impl<R: Runtime + ?Sized> RuntimeExt for R {}

/// A name bound in a runtime's namespace ([`RuntimeExt::namespace`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BoundName {
    /// The name.
    pub name: String,
    /// Its value's type name (`int`, `DataFrame`).
    pub python_type: String,
    /// Its value can be called (a function, a class).
    pub callable: bool,
}

/// One isolation layer of a runtime and how it stands (`network: active (user and network
/// namespaces)`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Layer {
    /// What it isolates: `network`, `filesystem`, `syscalls`, `no_new_privs`, …
    pub name: &'static str,
    /// How it stands.
    pub state: LayerState,
}

impl Layer {
    /// A layer called `name` standing as `state`.
    pub fn new(name: &'static str, state: LayerState) -> Self {
        Self { name, state }
    }
}

/// How an isolation layer stands.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayerState {
    /// In force, and how.
    Active(String),
    /// Asked for, but this machine cannot enforce it, and why.
    Unavailable(String),
    /// Not asked for.
    Off,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            LayerState::Active(how) => write!(f, "{}: active ({how})", self.name),
            LayerState::Unavailable(why) => write!(f, "{}: unavailable ({why})", self.name),
            LayerState::Off => write!(f, "{}: off", self.name),
        }
    }
}

/// What a runtime's code has used of the machine since its process (or control group)
/// started: [`Runtime::resource_usage`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct ResourceUsage {
    /// Processor time, user and system, in seconds.
    pub cpu_seconds: f64,
    /// The most memory it has held, in bytes, when the runtime can tell.
    pub peak_memory: Option<u64>,
}

impl ResourceUsage {
    /// A reading of `cpu_seconds` and, when known, the peak memory.
    pub fn new(cpu_seconds: f64, peak_memory: Option<u64>) -> Self {
        Self {
            cpu_seconds,
            peak_memory,
        }
    }
}

/// What one cell execution produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Execution {
    /// Everything the cell printed (stdout and stderr in order, the echoed value of a trailing
    /// expression, and the traceback if it raised). A Rust `String` is valid UTF-8 by type:
    /// runtimes replace lone surrogates from Python text with U+FFFD when they convert it.
    pub output: String,
    /// The exception the cell raised, if any.
    pub error: Option<ExecutionError>,
    /// Stopping this execution lost the runtime's non-registered state.
    pub state_lost: bool,
    /// The whole output, kept in a file, when it passed what `output` holds (the runtime's
    /// cap; `output` then has its beginning and its end): what
    /// [`Runtime::bind_unique_spooled`] binds. The file goes when the last clone is dropped.
    pub spooled: Option<Arc<crate::SpooledOutput>>,
    /// The network connections that ended while the cell ran (and any that ended since the
    /// last cell), where the runtime lets the code out through a proxy it accounts for.
    pub connections: Connections,
}

/// Network connections a runtime's proxy let through or refused, and how many more there were
/// than a cell's account holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Connections {
    /// Each connection, in the order they ended (`connections` in JSON).
    #[serde(rename = "connections")]
    pub list: Vec<Connection>,
    /// Connections past the most one account holds, not listed (the audit trail has them).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub omitted: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Connections {
    /// These connections, and `omitted` more.
    pub fn new(list: Vec<Connection>, omitted: u64) -> Self {
        Self { list, omitted }
    }
    /// Returns true if and only if there were none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty() && self.omitted == 0
    }
}

/// One network connection (or one plain-HTTP request) through a runtime's proxy.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Connection {
    /// The host asked for (a name or an address).
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// The address connected to, when one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Whether it was let through.
    pub allowed: bool,
    /// Why it was refused or cut short.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Bytes sent to the destination.
    pub sent: u64,
    /// Bytes received from it.
    pub received: u64,
}

/// One line: `example.org:443, 512 B sent, 4 KiB received`, or `evil.test:443 refused:
/// REASON`.
impl fmt::Display for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.allowed {
            write!(
                f,
                "{}:{}, {} sent, {} received",
                self.host,
                self.port,
                crate::format_size(self.sent),
                crate::format_size(self.received)
            )
        } else {
            write!(
                f,
                "{}:{} refused: {}",
                self.host,
                self.port,
                self.reason.as_deref().unwrap_or("not allowed")
            )
        }
    }
}

impl Connection {
    /// A connection to `host`:`port`, let through or not.
    pub fn new(host: impl Into<String>, port: u16, allowed: bool) -> Self {
        Self {
            host: host.into(),
            port,
            address: None,
            allowed,
            reason: None,
            sent: 0,
            received: 0,
        }
    }
}

impl Execution {
    /// A successful execution with this output.
    pub fn ok(output: impl Into<String>) -> Self {
        Self {
            output: output.into(),
            error: None,
            state_lost: false,
            spooled: None,
            connections: Connections::default(),
        }
    }
    /// An execution that raised.
    pub fn failed(output: impl Into<String>, error: ExecutionError) -> Self {
        Self {
            output: output.into(),
            error: Some(error),
            state_lost: false,
            spooled: None,
            connections: Connections::default(),
        }
    }
    /// The whole output is in `spooled`'s file.
    pub fn with_spooled(mut self, spooled: Option<crate::SpooledOutput>) -> Self {
        self.spooled = spooled.map(Arc::new);
        self
    }
    /// Marks the state as lost.
    pub fn with_state_lost(mut self, lost: bool) -> Self {
        self.state_lost = lost;
        self
    }
    /// The network connections that ended while it ran.
    pub fn with_connections(mut self, connections: Connections) -> Self {
        self.connections = connections;
        self
    }
    /// Returns true if and only if the cell ran without raising.
    pub fn success(&self) -> bool {
        self.error.is_none()
    }
}

/// The exception a cell raised.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecutionError {
    /// The exception's type name, e.g. `ZeroDivisionError`.
    pub python_type: String,
    /// `str()` of the exception.
    pub message: String,
}

impl ExecutionError {
    /// An exception of this type.
    pub fn new(python_type: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            python_type: python_type.into(),
            message: message.into(),
        }
    }
}

/// Receives a cell's output while it runs. Called from any thread; must not block.
pub trait OutputSink: Send + Sync {
    /// Takes the next piece of output.
    fn write(&self, chunk: &str);
    /// Takes an item the cell showed (`display(obj)`, a last value with a rich form, a
    /// figure), in order with the text. Default: dropped.
    fn display(&self, item: crate::DisplayItem) {
        let _ = item;
    }
    /// The meter the cell's host calls are counted by and checked against (the agent's, for
    /// its ledger and its host-call budget). Default: none, nothing counted.
    fn host_calls(&self) -> Option<Arc<crate::HostCallMeter>> {
        None
    }
}

/// The output of one cell a runtime holds in the host's memory by default: 8 MiB, its first
/// and last 4 MiB (the agent's live sink stops at the same size).
pub const DEFAULT_MAX_HELD_OUTPUT: usize = 8 << 20;

/// A piece of a running cell's output as it goes live: text, or an item it showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LiveOutput {
    /// Text.
    Text(String),
    /// An item (`display`).
    Display(crate::DisplayItem),
}

impl LiveOutput {
    /// Hands it to `sink`.
    pub fn deliver(self, sink: &dyn OutputSink) {
        match self {
            LiveOutput::Text(text) => sink.write(&text),
            LiveOutput::Display(item) => sink.display(item),
        }
    }
}

/// An [`OutputSink`] that drops live output (the whole output is still in the [`Execution`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct DiscardOutput;

impl OutputSink for DiscardOutput {
    fn write(&self, _chunk: &str) {}
}

/// Stops the code a runtime is running. Lock-free and non-blocking: callable from `Drop`.
pub trait Interrupt: Send + Sync {
    /// Asks the running code to stop, and says how that went.
    fn interrupt(&self) -> Interruption;
}

/// What an interrupt achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Interruption {
    /// Nothing was running.
    Idle,
    /// The code will stop at its next instruction; state is kept.
    Delivered,
    /// The code is inside a call that cannot be preempted (e.g. a blocking C call); it stops
    /// when that call returns.
    Pending,
    /// The runtime killed its process: registered resources come back, other state is lost.
    StateLost,
}

/// Hands back a host object as the concrete type it was registered with, through the
/// wrappers around it (approval guards, audit records).
pub fn downcast_object<T: HostObject>(
    name: &str,
    object: Arc<dyn HostObject>,
) -> Result<Arc<T>, RuntimeError> {
    let mut object = object;
    // Bounded: wrappers are stacked by the host, a few at most.
    for _ in 0..64 {
        let any: Arc<dyn std::any::Any + Send + Sync> = object.clone();
        if let Ok(found) = any.downcast::<T>() {
            return Ok(found);
        }
        match object.wrapped() {
            Some(inner) => object = inner,
            None => break,
        }
    }
    Err(RuntimeError::NotAnObject {
        name: name.to_owned(),
        expected: std::any::type_name::<T>(),
    })
}

macro_rules! forward_runtime {
    ($($ptr:ty),*) => {$(
        #[async_trait]
        impl<R: Runtime + ?Sized> Runtime for $ptr {
            async fn execute(&self, code: &str, output: &dyn OutputSink) -> Result<Execution, RuntimeError> {
                (**self).execute(code, output).await
            }
            async fn register(&self, batch: Resources) -> Result<(), RuntimeError> {
                (**self).register(batch).await
            }
            fn registry(&self) -> &Mutex<Registry> {
                (**self).registry()
            }
            fn shared_registry(&self) -> Option<std::sync::Arc<Mutex<Registry>>> {
                (**self).shared_registry()
            }
            async fn update(&self, name: &str, value: Value) -> Result<(), RuntimeError> {
                (**self).update(name, value).await
            }
            async fn get(&self, name: &str) -> Result<Value, RuntimeError> {
                (**self).get(name).await
            }
            async fn object_bound(&self, name: &str) -> Result<bool, RuntimeError> {
                (**self).object_bound(name).await
            }
            async fn is_bound(&self, name: &str) -> Result<bool, RuntimeError> {
                (**self).is_bound(name).await
            }
            fn isolation(&self) -> Vec<Layer> {
                (**self).isolation()
            }
            async fn bind_unique(&self, prefix: &str, value: Value, start: u64) -> Result<String, RuntimeError> {
                (**self).bind_unique(prefix, value, start).await
            }
            async fn bind_unique_spooled(&self, prefix: &str, spooled: &crate::SpooledOutput, start: u64) -> Result<String, RuntimeError> {
                (**self).bind_unique_spooled(prefix, spooled, start).await
            }
            async fn reset(&self) -> Result<(), RuntimeError> {
                (**self).reset().await
            }
            async fn register_python_file(&self, path: &std::path::Path, hidden: bool) -> Result<Resources, RuntimeError> {
                (**self).register_python_file(path, hidden).await
            }
            fn interrupter(&self) -> Option<Arc<dyn Interrupt>> {
                (**self).interrupter()
            }
            fn can_fork(&self) -> bool {
                (**self).can_fork()
            }
            fn resource_usage(&self) -> Option<ResourceUsage> {
                (**self).resource_usage()
            }
            async fn fork(&self) -> Result<Arc<dyn Runtime>, RuntimeError> {
                (**self).fork().await
            }
        }
    )*};
}
forward_runtime!(&R, Box<R>, Arc<R>);

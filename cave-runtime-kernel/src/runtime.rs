//! `KernelRuntime`: the `Runtime` seam on a worker, whatever its transport.

use crate::KernelError;
use crate::child::ChildTransport;
use crate::config::KernelConfig;
use crate::config::WorkerSettings;
use crate::link::Transport;
use crate::marshal::Data;
use crate::spec;
use crate::worker::{Callables, NEVER_READY, Status, Worker, lock};
use async_trait::async_trait;
use cave_cell::{CellOutput, OutputSpool};
use cave_core::{
    Entry, Execution, ExecutionError, FunctionBody, Interrupt, Interruption, Layer, LayerState,
    LiveOutput, OutputSink, Registry, Resource, Resources, Runtime, RuntimeError, Value,
    normalize_name,
};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The exception type an execution reports when its process died under it.
pub const PROCESS_DIED: &str = "ProcessDied";

/// A [`Runtime`] on a Python interpreter in a child process.
///
/// The model's code cannot take the host down: a segfault, `os._exit`, an out-of-memory kill
/// or a cell that ignores its interrupt ends the child, the execution reports what happened
/// (with `state_lost`), and the next request gets a fresh process with every registered
/// resource restored. Host functions and host objects stay in the host: the child holds
/// proxies whose calls travel back over the runtime's socket, so an object keeps its identity
/// and the host sees its new state. Values cross as data (Python's `marshal` format, read by a
/// strict decoder; nothing that could run code is ever loaded).
///
/// The process starts on the first request that needs it ([`start`](Self::start) pays up
/// front); a spare one is kept ready so that [`reset`](Runtime::reset) and crash recovery do
/// not wait for a cold start.
#[derive(Clone)]
pub struct KernelRuntime {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// Where workers start: a child process, or a kernel behind a Jupyter server.
    transport: Box<dyn Transport>,
    /// Where fresh workers come from instead, when the runtime was made from a pool.
    pool: Option<Arc<crate::pool::PoolInner>>,
    pub(crate) registry: Arc<Mutex<Registry>>,
    pub(crate) callables: Callables,
    /// The handle of each host function and host object, by name.
    pub(crate) handles: Mutex<HashMap<String, u64>>,
    pub(crate) next_handle: AtomicU64,
    /// Names whose objects the child loaded from a Python file.
    pub(crate) owned: Mutex<HashSet<String>>,
    /// Python files registered (path and source), in order: loaded again in a fresh process.
    pub(crate) files: Mutex<Vec<(String, String)>>,
    pub(crate) current: tokio::sync::Mutex<Option<Arc<Worker>>>,
    spare: Mutex<Spare>,
    executions: AtomicU64,
    last_index: Mutex<HashMap<String, u64>>,
    /// A process died outside an execution: the next execution says state was lost.
    unreported_loss: AtomicBool,
    interrupt: Arc<CellInterrupt>,
    /// The worker's last resource reading (what is said while the worker is being replaced).
    last_resources: Mutex<Option<cave_core::ResourceUsage>>,
}

#[derive(Default)]
enum Spare {
    #[default]
    None,
    Starting,
    Ready(Arc<Worker>),
}

impl KernelRuntime {
    /// A runtime with the default settings. Nothing starts until the first request.
    pub fn new() -> Result<Self, KernelError> {
        Self::with_config(KernelConfig::default())
    }

    /// A runtime with these settings.
    pub fn with_config(config: KernelConfig) -> Result<Self, KernelError> {
        Ok(Self::with_transport(ChildTransport::new(config)?))
    }

    /// A runtime whose workers come from `pool`: started, sandboxed and limited before the
    /// runtime asks, each used by this runtime only. The pool keeps the spares (the runtime
    /// keeps none of its own).
    pub fn from_pool(pool: &crate::KernelPool) -> Self {
        let pool = pool.inner().clone();
        let mut runtime = Self::with_transport(PoolTransport(pool.transport.clone()));
        Arc::get_mut(&mut runtime.inner)
            .expect("a runtime just made is not shared")
            .pool = Some(pool);
        runtime
    }

    /// A runtime whose workers `transport` starts.
    pub(crate) fn with_transport(transport: impl Transport) -> Self {
        Self::with_boxed_transport(Box::new(transport))
    }

    /// A runtime whose workers `transport` starts.
    pub(crate) fn with_boxed_transport(transport: Box<dyn Transport>) -> Self {
        let interrupt = Arc::new(CellInterrupt {
            process: Mutex::new(Weak::new()),
            grace: transport.settings().interrupt_grace,
        });
        Self {
            inner: Arc::new(Inner {
                transport,
                pool: None,
                registry: Arc::new(Mutex::new(Registry::new())),
                callables: Arc::new(Mutex::new(HashMap::new())),
                handles: Mutex::new(HashMap::new()),
                next_handle: AtomicU64::new(1),
                owned: Mutex::new(HashSet::new()),
                files: Mutex::new(Vec::new()),
                current: tokio::sync::Mutex::new(None),
                spare: Mutex::new(Spare::None),
                executions: AtomicU64::new(0),
                last_index: Mutex::new(HashMap::new()),
                unreported_loss: AtomicBool::new(false),
                interrupt,
                last_resources: Mutex::new(None),
            }),
        }
    }

    /// Starts the process now (and binds what is registered) instead of on the first request.
    pub async fn start(&self) -> Result<(), RuntimeError> {
        self.inner.process().await.map(drop)
    }

    /// Ends the process (and the spare): asked to exit, killed after the stop grace. Calling it
    /// again does nothing; a later request starts a fresh process with the registered
    /// resources restored.
    pub async fn stop(&self) {
        let current = self.inner.current.lock().await.take();
        let spare = std::mem::take(&mut *lock(&self.inner.spare));
        if let Spare::Ready(spare) = spare {
            spare.kill(None);
        }
        if let Some(process) = current {
            process.stop(self.inner.settings().stop_grace).await;
        }
    }

    /// The process id of the running child, if one is running (`None` for a kernel behind a
    /// Jupyter server: its process is the server's).
    pub async fn pid(&self) -> Option<u32> {
        let current = self.inner.current.lock().await;
        current.as_ref().filter(|p| p.alive()).and_then(|p| p.pid())
    }

    /// How each sandbox layer stands in the running child. A runtime starts its child lazily,
    /// at the first cell or registration: this is `None` until then. Call
    /// [`start`](Self::start) first to know before any code runs (`cave` does, to print them).
    pub async fn sandbox_layers(&self) -> Option<Vec<Layer>> {
        let current = self.inner.current.lock().await;
        current.as_ref().map(|p| p.link().sandbox())
    }

    /// The process id of the spare child, if one is ready.
    pub fn spare_pid(&self) -> Option<u32> {
        match &*lock(&self.inner.spare) {
            Spare::Ready(p) if p.alive() => p.pid(),
            _ => None,
        }
    }

    /// The version of the running interpreter (`(3, 11, 7)`), once started.
    pub async fn python_version(&self) -> Option<(u32, u32, u32)> {
        self.inner.current.lock().await.as_ref().map(|p| p.version)
    }

    /// How each limit is enforced in the running child (a control group, an rlimit), once
    /// started: e.g. `memory: 2147483648 bytes (control group; a kill when exceeded)`.
    pub async fn enforcement(&self) -> Vec<String> {
        self.inner
            .current
            .lock()
            .await
            .as_ref()
            .map(|p| p.link().enforcement())
            .unwrap_or_default()
    }

    /// The limits in force in the running child (`None` before the first start, and for a
    /// kernel behind a Jupyter server, whose limits are the server's).
    pub async fn limits(&self) -> Option<crate::Limits> {
        let current = self.inner.current.lock().await;
        current.as_ref().and_then(|p| p.link().limits())
    }

    /// The interpreter this runtime starts (`None` for a kernel behind a Jupyter server: its
    /// interpreter is the server's).
    pub fn python(&self) -> Option<&std::path::Path> {
        self.inner.transport.python()
    }
}

impl KernelRuntime {
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }
}

impl std::fmt::Debug for KernelRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelRuntime")
            .field("python", &self.python())
            .field("executions", &self.inner.executions.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A failure of the link to the worker, as the seam types it.
pub(crate) fn died(operation: &'static str, error: KernelError) -> RuntimeError {
    match error {
        KernelError::Died => RuntimeError::ProcessDied {
            operation,
            reason: error.to_string(),
        },
        other => RuntimeError::Backend {
            operation,
            message: other.to_string(),
        },
    }
}

/// A reply other than the one `operation` expects: the worker failing (it says why), or
/// answering what this host does not understand.
fn unexpected(operation: &'static str, status: Status, payload: &Value) -> RuntimeError {
    match status {
        Status::Failed => RuntimeError::Backend {
            operation,
            message: format!("the worker failed: {payload}"),
        },
        status => RuntimeError::Protocol {
            operation,
            message: format!("the worker answered {status:?} with {payload}"),
        },
    }
}

fn reserved(registry: &Registry) -> Value {
    Value::List(
        registry
            .entries()
            .iter()
            .map(|e| Value::Str(e.name.clone()))
            .collect(),
    )
}

/// Whether binding `resources` can fail in Python (so a batch is bound at once, in a started
/// process, rather than when the process starts).
fn needs_python(resources: &Resources) -> bool {
    resources.items().iter().any(|r| match r {
        Resource::Function(f) => matches!(f.body, FunctionBody::Python(_)),
        Resource::Type(_) => true,
        Resource::Variable(v) => v.type_name.is_some(),
        _ => false,
    })
}

impl Inner {
    /// The running process, if there is one (never starts one).
    async fn running(&self) -> Option<Arc<Worker>> {
        self.current.lock().await.clone().filter(|p| p.alive())
    }

    /// The running process, started (or replaced, after a death) when needed, with every
    /// registered resource bound.
    pub(crate) async fn process(self: &Arc<Self>) -> Result<Arc<Worker>, RuntimeError> {
        let mut current = self.current.lock().await;
        if let Some(process) = current.as_ref().filter(|p| p.alive()) {
            return Ok(process.clone());
        }
        if current.take().is_some() {
            self.unreported_loss.store(true, Ordering::SeqCst);
        }
        let process = self.fresh().await?;
        let failure = self.restore(&process).await;
        *current = Some(process.clone());
        drop(current);
        self.ensure_spare();
        match failure {
            Some(error) => Err(error),
            None => Ok(process),
        }
    }

    /// A started process with nothing bound: the spare when it is ready.
    async fn fresh(self: &Arc<Self>) -> Result<Arc<Worker>, RuntimeError> {
        let spare = std::mem::take(&mut *lock(&self.spare));
        match spare {
            Spare::Ready(process) if process.alive() => return Ok(process),
            Spare::Starting => *lock(&self.spare) = Spare::Starting,
            _ => {}
        }
        self.launch().await.map_err(|e| RuntimeError::Backend {
            operation: "start",
            message: e.to_string(),
        })
    }

    /// Starts a worker: a child, or a kernel behind a Jupyter server.
    async fn launch(self: &Arc<Self>) -> Result<Arc<Worker>, KernelError> {
        if let Some(pool) = &self.pool {
            return pool.take(&self.callables).await;
        }
        let started = self.transport.start().await?;
        match Worker::handshake(started, self.settings(), self.callables.clone()).await {
            // A worker that never got ready (a Jupyter kernel lost to a port race with another
            // starting at once, which its server keeps nudging) was ended: one more, fresh.
            Err(KernelError::Start { message }) if message.contains(NEVER_READY) => {
                tracing::warn!(%message, "a worker never got ready; starting another");
                let started = self.transport.start().await?;
                Worker::handshake(started, self.settings(), self.callables.clone()).await
            }
            other => other,
        }
    }

    /// What the runtime applies to its workers.
    pub(crate) fn settings(&self) -> &WorkerSettings {
        self.transport.settings()
    }

    /// Starts a spare process in the background, if wanted and none is there.
    fn ensure_spare(self: &Arc<Self>) {
        // An attached kernel is the one kernel there is.
        if !self.settings().spare || !self.transport.keeps_spares() || self.pool.is_some() {
            return;
        }
        {
            let mut spare = lock(&self.spare);
            match &*spare {
                Spare::Starting => return,
                Spare::Ready(p) if p.alive() => return,
                _ => *spare = Spare::Starting,
            }
        }
        let weak = Arc::downgrade(self);
        let inner = self.clone();
        tokio::spawn(async move {
            let started = inner.launch().await;
            drop(inner);
            let Some(inner) = Weak::upgrade(&weak) else {
                return;
            };
            let mut spare = lock(&inner.spare);
            match started {
                Ok(process) if matches!(*spare, Spare::Starting) => {
                    *spare = Spare::Ready(process);
                }
                Ok(process) => process.kill(None),
                Err(error) => {
                    tracing::warn!(%error, "the spare Python process did not start");
                    *spare = Spare::None;
                }
            }
        });
    }

    /// Loads the registered files and binds every registered entry in a fresh process. An
    /// entry that cannot be bound is unregistered (the others stay bound) and reported.
    async fn restore(&self, process: &Arc<Worker>) -> Option<RuntimeError> {
        let files = lock(&self.files).clone();
        for (file, source) in files {
            match process
                .request(
                    "load",
                    vec![Data::from(file.as_str()), Data::from(source.as_str())],
                )
                .await
            {
                Ok(reply) if reply.status == Status::Ok => {}
                Ok(reply) => {
                    tracing::error!(%file, problem = ?reply.payload, "a Python file could not be loaded again");
                }
                Err(e) => return Some(died("restore", e)),
            }
        }
        let names: Vec<String> = lock(&self.registry)
            .entries()
            .iter()
            .map(|e| e.name.clone())
            .collect();
        let mut failure = None;
        for name in names {
            if let Err(error) = self.bind(process, std::slice::from_ref(&name)).await {
                tracing::error!(%name, %error, "a registered resource could not be restored");
                lock(&self.registry).remove(&name);
                self.forget(&name);
                failure.get_or_insert(RuntimeError::InvalidResource {
                    name: name.clone(),
                    problem: format!(
                        "could not be restored in a fresh process ({error}), so it was unregistered"
                    ),
                });
            }
        }
        failure
    }

    /// Binds registered entries in the process as one step; `Err` names the one that failed.
    /// Values are encoded from the registry itself, under its lock, without a copy.
    async fn bind(&self, process: &Worker, names: &[String]) -> Result<(), RuntimeError> {
        let sent = {
            let registry = lock(&self.registry);
            let owned = lock(&self.owned);
            let mut specs = Vec::with_capacity(names.len());
            for entry in registry
                .entries()
                .iter()
                .filter(|e| names.contains(&e.name))
            {
                let handle = self.handle(&entry.name);
                let (spec, callable) =
                    spec::spec(entry, &registry, handle, owned.contains(&entry.name))?;
                if let Some(callable) = callable {
                    lock(&self.callables).insert(handle, callable);
                }
                specs.push(spec);
            }
            process.begin(
                "bind",
                vec![Data::List(specs), Data::Owned(reserved(&registry))],
            )
        };
        let failed = |e: KernelError| match e {
            KernelError::TooLarge { message } | KernelError::Invalid { message } => {
                RuntimeError::InvalidResource {
                    name: names.first().cloned().unwrap_or_default(),
                    problem: message,
                }
            }
            e => died("register", e),
        };
        let reply = sent
            .map_err(failed)?
            .await
            .map_err(|_| died("register", KernelError::Died))?;
        match (reply.status, reply.payload) {
            (Status::Ok, _) => Ok(()),
            (_, Value::Tuple(pair)) if pair.len() == 2 => Err(RuntimeError::InvalidResource {
                name: pair[0].as_str().unwrap_or_default().to_owned(),
                problem: format!(
                    "could not be created in Python ({})",
                    pair[1].as_str().unwrap_or_default()
                ),
            }),
            (status, payload) => Err(unexpected("register", status, &payload)),
        }
    }

    /// Binds a claimed batch; on failure, unclaims all of it.
    async fn bind_claimed(&self, process: &Worker, entries: &[Entry]) -> Result<(), RuntimeError> {
        let names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
        match self.bind(process, &names).await {
            Ok(()) => Ok(()),
            Err(error) => {
                {
                    let mut registry = lock(&self.registry);
                    for entry in entries {
                        registry.remove(&entry.name);
                    }
                }
                for entry in entries {
                    self.forget(&entry.name);
                }
                Err(match error {
                    RuntimeError::InvalidResource { name, problem } => {
                        RuntimeError::InvalidResource {
                            name,
                            problem: format!("{problem}; nothing of its batch was registered"),
                        }
                    }
                    other => other,
                })
            }
        }
    }

    fn handle(&self, name: &str) -> u64 {
        *lock(&self.handles)
            .entry(name.to_owned())
            .or_insert_with(|| self.next_handle.fetch_add(1, Ordering::Relaxed))
    }

    fn forget(&self, name: &str) {
        if let Some(handle) = lock(&self.handles).remove(name) {
            lock(&self.callables).remove(&handle);
        }
        lock(&self.owned).remove(name);
    }

    async fn request(
        self: &Arc<Self>,
        operation: &'static str,
        args: Vec<Data<'_>>,
    ) -> Result<crate::worker::Reply, RuntimeError> {
        let process = self.process().await?;
        process
            .request(operation, args)
            .await
            .map_err(|e| died(operation, e))
    }

    /// `bind_unique` by `operation` (`payload`: the value, or where the worker reads it); the
    /// caller records what `reset` binds again.
    async fn bind_unique(
        self: &Arc<Self>,
        operation: &'static str,
        prefix: &str,
        start: u64,
        payload: Data<'_>,
    ) -> Result<String, RuntimeError> {
        let prefix = cave_core::unique_prefix(prefix, start)?;
        let from = start.max(
            lock(&self.last_index)
                .get(&prefix)
                .map_or(0, |last| last + 1),
        );
        let taken: Vec<Value> = {
            let registry = lock(&self.registry);
            let head = format!("{prefix}_");
            registry
                .entries()
                .iter()
                .filter(|e| e.name.starts_with(&head))
                .map(|e| Value::Str(e.name.clone()))
                .collect()
        };
        let reply = self
            .request(
                operation,
                vec![
                    Data::from(prefix.as_str()),
                    Data::Owned(Value::Int(from.into())),
                    payload,
                    Data::Owned(Value::List(taken)),
                ],
            )
            .await?;
        let index = match (reply.status, reply.payload) {
            (Status::Ok, Value::Int(index)) => u64::try_from(index).unwrap_or(from),
            (status, payload) => return Err(unexpected(operation, status, &payload)),
        };
        let name = format!("{prefix}_{index}");
        lock(&self.last_index).insert(prefix, index);
        Ok(name)
    }
}

#[async_trait]
impl Runtime for KernelRuntime {
    async fn execute(
        &self,
        code: &str,
        output: &dyn OutputSink,
    ) -> Result<Execution, RuntimeError> {
        let process = self.inner.process().await?;
        let number = self.inner.executions.fetch_add(1, Ordering::SeqCst) + 1;
        let (live, mut chunks) = tokio::sync::mpsc::unbounded_channel::<LiveOutput>();
        // Filled by the process's reader, which sends pieces live up to the cap and keeps the
        // beginning and the end: a consumer slower than the cell does not grow the host.
        let settings = self.inner.settings();
        // Past what the host holds, the whole output goes to a file the worker can read (a
        // worker elsewhere: the host's own, unlinked, read back by the host).
        let spool = match process.link().shared_dir() {
            Some(dir) => OutputSpool::new(dir, settings.cell.max_cell_output),
            None => {
                OutputSpool::new(std::env::temp_dir(), settings.cell.max_cell_output).unlinked()
            }
        };
        let held = settings.cell.held();
        let collected = Arc::new(Mutex::new(
            CellOutput::new(held, Some(live))
                .with_spool(spool)
                .with_host_calls(output.host_calls()),
        ));
        if let Some(stray) = process.take_stray_output() {
            lock(&collected).push(&stray);
        }
        // Before the cell is sent: an interrupt that comes as soon as the cell has begun (say,
        // once it called the host) must find its process.
        self.inner.interrupt.begin(&process);
        let (id, done) = process
            .execute(
                code,
                number,
                self.inner.settings().cell.max_display,
                collected.clone(),
            )
            .map_err(|e| died("execute", e))?;
        tokio::pin!(done);
        let raised = loop {
            tokio::select! {
                raised = &mut done => break raised,
                Some(piece) = chunks.recv() => piece.deliver(output),
            }
        };
        let finish =
            |output: &dyn OutputSink,
             chunks: &mut tokio::sync::mpsc::UnboundedReceiver<LiveOutput>| {
                while let Ok(piece) = chunks.try_recv() {
                    piece.deliver(output);
                }
                std::mem::replace(&mut *lock(&collected), CellOutput::new(0, None)).finish()
            };
        let mut execution = match raised {
            Ok(None) => {
                let (text, spooled) = finish(output, &mut chunks);
                Execution::ok(text).with_spooled(spooled)
            }
            Ok(Some((python_type, message))) => {
                let (text, spooled) = finish(output, &mut chunks);
                Execution::failed(text, ExecutionError::new(python_type, message))
                    .with_spooled(spooled)
            }
            Err(_) => {
                let death = process.death().await;
                {
                    let mut text = lock(&collected);
                    // What the cell printed just before it died, buffered and not yet sent.
                    if let Some((execution, unsent)) = death.unsent
                        && execution == id
                    {
                        text.push(&unsent);
                    }
                    let mut line = format!("{PROCESS_DIED}: {}\n", death.description);
                    if !text.is_empty() && !text.ends_with_newline() {
                        line.insert(0, '\n');
                    }
                    text.push(&line);
                }
                let (text, spooled) = finish(output, &mut chunks);
                // Reported here: the next request starts a fresh process without saying so again.
                self.inner.current.lock().await.take();
                self.inner.ensure_spare();
                Execution::failed(text, ExecutionError::new(PROCESS_DIED, death.description))
                    .with_state_lost(true)
                    .with_spooled(spooled)
            }
        };
        if self.inner.unreported_loss.swap(false, Ordering::SeqCst) {
            execution.state_lost = true;
        }
        Ok(execution.with_connections(process.link().connections().await))
    }

    async fn register(&self, batch: Resources) -> Result<(), RuntimeError> {
        let process = if needs_python(&batch) {
            Some(self.inner.process().await?)
        } else {
            self.inner.running().await
        };
        let entries = lock(&self.inner.registry).claim(batch)?;
        match process {
            Some(process) => self.inner.bind_claimed(&process, &entries).await,
            None => {
                // Bound when the process starts; what can fail there is checked now.
                let registry = lock(&self.inner.registry);
                let checked = entries.iter().try_for_each(|entry| {
                    spec::spec(entry, &registry, 0, false)?;
                    let value = match &entry.resource {
                        Resource::Variable(v) => &v.value,
                        Resource::Binding { value, .. } => value,
                        _ => return Ok(()),
                    };
                    crate::marshal::check(value).map_err(|e| RuntimeError::InvalidResource {
                        name: entry.name.clone(),
                        problem: e.to_string(),
                    })
                });
                drop(registry);
                if let Err(error) = checked {
                    let mut registry = lock(&self.inner.registry);
                    for entry in &entries {
                        registry.remove(&entry.name);
                    }
                    return Err(error);
                }
                Ok(())
            }
        }
    }

    fn registry(&self) -> &Mutex<Registry> {
        &self.inner.registry
    }

    fn shared_registry(&self) -> Option<Arc<Mutex<Registry>>> {
        Some(self.inner.registry.clone())
    }

    async fn object_bound(&self, name: &str) -> Result<bool, RuntimeError> {
        // Not started: registered objects are bound when it starts.
        let Some(process) = self.inner.running().await else {
            return Ok(true);
        };
        let reply = process
            .request(
                "is_proxy",
                vec![Data::Owned(Value::Str(normalize_name(name)))],
            )
            .await
            .map_err(|e| died("object_bound", e))?;
        Ok(reply.payload == Value::Bool(true))
    }

    async fn is_bound(&self, name: &str) -> Result<bool, RuntimeError> {
        // Not started: the namespace will hold what the registry records, and nothing starts
        // for the question.
        let Some(process) = self.inner.running().await else {
            return Ok(lock(&self.inner.registry).is_bound(&normalize_name(name)));
        };
        let reply = process
            .request(
                "is_bound",
                vec![Data::Owned(Value::Str(normalize_name(name)))],
            )
            .await
            .map_err(|e| died("is_bound", e))?;
        match (reply.status, reply.payload) {
            (Status::Ok, Value::Bool(bound)) => Ok(bound),
            (status, payload) => Err(unexpected("is_bound", status, &payload)),
        }
    }

    /// The sandbox layers of the running child (none before it starts, or with the sandbox
    /// off).
    /// The worker's control group (every process its cells started) or, without one, its
    /// process; zero before the first worker starts. `None` for a kernel behind a Jupyter
    /// server, which the host cannot see.
    fn resource_usage(&self) -> Option<cave_core::ResourceUsage> {
        // Local processes (those that can be copied) are measured; a server's kernel is not.
        if !self.inner.transport.copies_workers() {
            return None;
        }
        let mut last = lock(&self.inner.last_resources);
        // The worker is being started or replaced while the lock is held: the last reading.
        if let Ok(current) = self.inner.current.try_lock() {
            *last = match current.as_ref() {
                Some(worker) => worker.link().resource_usage().or(*last),
                None => last.or(Some(cave_core::ResourceUsage::default())),
            };
        }
        *last
    }

    fn isolation(&self) -> Vec<Layer> {
        match self.inner.current.try_lock() {
            Ok(current) => current
                .as_ref()
                .filter(|p| {
                    p.link()
                        .sandbox()
                        .iter()
                        .any(|l| l.state != LayerState::Off)
                })
                .map(|p| p.link().sandbox())
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    async fn update(&self, name: &str, value: Value) -> Result<(), RuntimeError> {
        let key = lock(&self.inner.registry).update_variable(name, value)?;
        let Some(process) = self.inner.running().await else {
            return Ok(());
        };
        self.inner.bind(&process, &[key]).await
    }

    async fn get(&self, name: &str) -> Result<Value, RuntimeError> {
        let reply = self
            .inner
            .request("get", vec![Data::Owned(Value::Str(normalize_name(name)))])
            .await?;
        match reply.status {
            Status::Ok => Ok(reply.payload),
            Status::Unbound => Err(RuntimeError::Unbound {
                name: name.to_owned(),
            }),
            Status::Unsupported => Err(RuntimeError::Unsupported {
                name: name.to_owned(),
                python_type: reply.payload.as_str().unwrap_or("object").to_owned(),
            }),
            Status::TooLarge => Err(RuntimeError::TooLarge {
                name: name.to_owned(),
                size: match reply.payload {
                    Value::Int(size) => u64::try_from(size).unwrap_or(u64::MAX),
                    _ => u64::MAX,
                },
                limit: self.inner.settings().max_frame as u64,
                setting: "KernelConfig::max_frame",
            }),
            status => Err(unexpected("get", status, &reply.payload)),
        }
    }

    async fn bind_unique(
        &self,
        prefix: &str,
        value: Value,
        start: u64,
    ) -> Result<String, RuntimeError> {
        let name = self
            .inner
            .bind_unique("bind_unique", prefix, start, Data::Borrowed(&value))
            .await?;
        lock(&self.inner.registry).record_binding(&name, value);
        Ok(name)
    }

    async fn bind_unique_spooled(
        &self,
        prefix: &str,
        spooled: &cave_core::SpooledOutput,
        start: u64,
    ) -> Result<String, RuntimeError> {
        let process = self.inner.process().await?;
        // The worker reads the file itself when it can see it: the text never crosses the
        // socket, nor sits in the host's memory.
        let readable = match (spooled.path(), process.link().shared_dir()) {
            (Some(path), Some(dir)) => path.starts_with(dir).then(|| path.to_owned()),
            _ => None,
        };
        let name = match readable {
            Some(path) => {
                let path = Value::Str(path.to_string_lossy().into_owned());
                self.inner
                    .bind_unique("bind_unique_file", prefix, start, Data::Borrowed(&path))
                    .await?
            }
            // A worker elsewhere (a Jupyter kernel): the text is sent.
            None => {
                let text = spooled.text()?;
                let text = Value::Str(text);
                self.inner
                    .bind_unique("bind_unique", prefix, start, Data::Borrowed(&text))
                    .await?
            }
        };
        // What `reset` binds again: the text is not kept in the host.
        let lost = Value::Str(cave_core::prompt::SPOOLED_OUTPUT_LOST.to_owned());
        lock(&self.inner.registry).record_binding(&name, lost);
        Ok(name)
    }

    async fn reset(&self) -> Result<(), RuntimeError> {
        let mut current = self.inner.current.lock().await;
        let Some(old) = current.take() else {
            // Nothing started: the namespace holds exactly what is registered.
            self.inner.unreported_loss.store(false, Ordering::SeqCst);
            return Ok(());
        };
        old.kill(None);
        let process = self.inner.fresh().await?;
        let failure = self.inner.restore(&process).await;
        *current = Some(process);
        drop(current);
        self.inner.unreported_loss.store(false, Ordering::SeqCst);
        self.inner.ensure_spare();
        failure.map_or(Ok(()), Err)
    }

    fn can_fork(&self) -> bool {
        self.inner.transport.copies_workers()
    }

    async fn fork(&self) -> Result<Arc<dyn Runtime>, RuntimeError> {
        KernelRuntime::fork(self)
            .await
            .map(|branch| Arc::new(branch) as Arc<dyn Runtime>)
    }

    fn interrupter(&self) -> Option<Arc<dyn Interrupt>> {
        Some(self.inner.interrupt.clone())
    }

    /// In the kernel, the host reads the file and the child runs its source as a module (so a
    /// sandboxed child needs no access to it; its own imports of files beside it do); it runs
    /// again in every fresh process. The prompt shows what it exports (unless `hidden`).
    async fn register_python_file(
        &self,
        path: &std::path::Path,
        hidden: bool,
    ) -> Result<Resources, RuntimeError> {
        let source = std::fs::read_to_string(path).map_err(|e| RuntimeError::InvalidResource {
            name: path.display().to_string(),
            problem: format!("could not be read: {e}"),
        })?;
        let path = path.to_string_lossy().into_owned();
        let process = self.inner.process().await?;
        let reply = process
            .request(
                "load",
                vec![Data::from(path.as_str()), Data::from(source.as_str())],
            )
            .await
            .map_err(|e| died("register_python_file", e))?;
        if reply.status != Status::Ok {
            return Err(RuntimeError::InvalidResource {
                name: path,
                problem: reply.payload.as_str().unwrap_or("it failed").to_owned(),
            });
        }
        let mut resources =
            cave_python::exports::exports_to_resources(&reply.payload, &lock(&self.inner.registry));
        if hidden {
            resources = resources.with_hidden(true);
        }
        let entries = lock(&self.inner.registry).claim(resources)?;
        lock(&self.inner.owned).extend(entries.iter().map(|e| e.name.clone()));
        self.inner.bind_claimed(&process, &entries).await?;
        lock(&self.inner.files).push((path, source));
        Ok(entries.into_iter().map(|e| e.resource).collect())
    }
}

/// A pool's transport, seen by a runtime made from the pool (for its settings and
/// interpreter; its workers come from the pool).
struct PoolTransport(Arc<dyn Transport>);

#[async_trait::async_trait]
impl Transport for PoolTransport {
    fn settings(&self) -> &crate::config::WorkerSettings {
        self.0.settings()
    }

    async fn start(&self) -> Result<crate::link::Started, KernelError> {
        self.0.start().await
    }

    fn keeps_spares(&self) -> bool {
        false
    }

    fn python(&self) -> Option<&std::path::Path> {
        self.0.python()
    }

    fn copies_workers(&self) -> bool {
        self.0.copies_workers()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut current) = self.current.try_lock()
            && let Some(process) = current.take()
        {
            process.release();
        }
        if let Spare::Ready(process) = std::mem::take(&mut *lock(&self.spare)) {
            process.kill(None);
        }
    }
}

/// Interrupts the running cell with `SIGINT` (Python raises `KeyboardInterrupt`, in
/// `time.sleep` as in a busy loop); a cell still running after the grace has its process
/// killed, whether or not anyone still waits for its result.
struct CellInterrupt {
    /// The process of the last execution.
    process: Mutex<Weak<Worker>>,
    grace: Duration,
}

impl CellInterrupt {
    fn begin(&self, process: &Arc<Worker>) {
        *lock(&self.process) = Arc::downgrade(process);
    }
}

impl Interrupt for CellInterrupt {
    fn interrupt(&self) -> Interruption {
        let process = lock(&self.process).clone();
        let Some(live) = process.upgrade().filter(|p| p.alive()) else {
            return Interruption::Idle;
        };
        let Some(execution) = live.executing() else {
            return Interruption::Idle;
        };
        live.interrupt();
        drop(live);
        let grace = self.grace;
        let reason = format!(
            "the cell did not stop within {:.1} s of its interrupt, so its Python process was killed",
            grace.as_secs_f64()
        );
        // Watched from a thread of its own: the interrupt may come from `Drop`, outside any
        // async runtime, and the execution's future may be gone.
        let watch = process.clone();
        let spawned = std::thread::Builder::new()
            .name("cave-kernel-grace".to_owned())
            .spawn(move || {
                // Halfway, a second SIGINT: the first one is dropped if it arrived while the
                // child was still reading the cell, before the cell began.
                std::thread::sleep(grace / 2);
                let still = |p: &Worker| p.alive() && p.executing() == Some(execution);
                match watch.upgrade() {
                    Some(process) if still(&process) => process.interrupt(),
                    _ => return,
                }
                std::thread::sleep(grace / 2);
                let Some(process) = watch.upgrade().filter(|p| still(p)) else {
                    return;
                };
                // The cell may have ended in time with its end still queued behind its output
                // (a printing loop, a loaded machine): read what the worker sent until now
                // first, for at most another grace, and kill only a cell still running then.
                let sent = process.sent_so_far();
                let catching_up = std::time::Instant::now() + grace;
                while still(&process)
                    && process.handled() < sent
                    && std::time::Instant::now() < catching_up
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                process.kill_running(execution, reason);
            });
        if spawned.is_err() {
            if let Some(process) = process.upgrade() {
                process.kill(Some(
                    "the cell was interrupted and its Python process was killed".to_owned(),
                ));
            }
            return Interruption::StateLost;
        }
        Interruption::Delivered
    }
}

impl std::fmt::Debug for CellInterrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CellInterrupt").finish_non_exhaustive()
    }
}

//! `InProcRuntime`: the `Runtime` seam on an embedded CPython.

use crate::InProcError;
use crate::convert::{FromPyError, from_py, text_of, to_py};
use crate::env::{self, executor};
use crate::interrupt::{CellInterrupt, InterruptHandle};
use crate::stdio::{self, CellSink, StdioCapture};
use crate::worker::Worker;
use async_trait::async_trait;
use cave_cell::{CellLimits, CellOutput, OutputSpool, StrayOutput};
use cave_core::lock;
use cave_core::{
    Args, DisplayItem, Entry, Execution, ExecutionError, Function, FunctionBody, HostError,
    Interrupt, LiveOutput, ObjectBinding, OutputSink, Param, Registry, Resource, Resources,
    Runtime, RuntimeError, TypeSchema, TypeShape, Value, Variable, normalize_name,
};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyDict, PyList, PyString, PyTuple};
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::runtime::Handle;
use tokio::sync::mpsc::UnboundedSender;

static RUNTIMES: AtomicU64 = AtomicU64::new(0);

/// A [`Runtime`] on CPython embedded in this process.
///
/// Each runtime has its own namespace and its own thread; several runtimes run side by side
/// in one process, each seeing only its own names and output. Values are Python objects: a
/// host object is called in place and a Python object (e.g. a pandas DataFrame) is never
/// copied. Pure-Python code can be interrupted (`max_exec_timeout` works); code blocked in a C
/// call stops only when the call returns: use the kernel runtime for a guaranteed kill.
#[derive(Clone)]
pub struct InProcRuntime {
    inner: Arc<Inner>,
}

struct Inner {
    worker: Worker,
    namespace: Py<PyDict>,
    /// The runtime's output function (one for all its cells: executions never overlap).
    write: Py<PyAny>,
    /// Where the executor sends the items a cell shows.
    show: Py<PyAny>,
    output: Arc<Mutex<Outputs>>,
    registry: Arc<Mutex<Registry>>,
    state: Mutex<State>,
    interrupt: Arc<CellInterrupt>,
    executions: AtomicU64,
    /// The bounds on each cell's output.
    limits: Mutex<CellLimits>,
    /// The process's captured descriptors, when the host attached them to this runtime.
    stdio: Mutex<Option<Arc<stdio::Shared>>>,
    /// Where host functions' futures run (the creator's tokio runtime, or our own).
    handle: Handle,
    own_runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

/// What a host call shows goes through this (into the running cell's output).
type HostDisplay = Arc<dyn Fn(DisplayItem) + Send + Sync>;

/// What a host call needs of the cell that makes it: where what it shows goes, and the cell's
/// span.
#[derive(Clone)]
struct HostCell {
    show: HostDisplay,
    output: std::sync::Weak<Mutex<Outputs>>,
    /// Whose interrupt ends a call in flight.
    interrupt: Arc<CellInterrupt>,
    /// The calls are an MCP server's tools.
    mcp: bool,
}

impl HostCell {
    /// The running cell as a host call needs it: its span (none between cells), where what
    /// the call shows goes, and its meter.
    fn call_cell(&self) -> cave_cell::HostCallCell {
        let (span, meter) = self
            .output
            .upgrade()
            .and_then(|output| {
                lock(&output)
                    .cell
                    .as_ref()
                    .map(|cell| (cell.span(), cell.host_calls()))
            })
            .unwrap_or_else(|| (tracing::Span::none(), None));
        cave_cell::HostCallCell {
            span,
            show: self.show.clone(),
            meter,
        }
    }
}

/// A Python callable the executor calls back (`write`, `show`).
type Callback = Py<PyAny>;

/// A name and the object to bind to it.
type Named<'py> = (String, Bound<'py, PyAny>);

/// A resource's Python object, created but not bound yet.
#[derive(Default)]
struct Created<'py> {
    /// The name and its object.
    binding: Option<Named<'py>>,
    /// Names bound beside it when free (a host object's class, a source function's helpers).
    extra: Vec<Named<'py>>,
    /// The object is a host object's proxy.
    proxy: bool,
    /// A function, type or object (not a variable): a cell that rebinds it is told so.
    watched: bool,
}

/// Where this runtime's output goes: the running cell's, or, between cells (a thread a cell
/// started, still writing), kept within a cap for the next cell.
#[derive(Default)]
struct Outputs {
    cell: Option<CellOutput>,
    between: StrayOutput,
}

impl Outputs {
    fn push(&mut self, text: &str) {
        match &mut self.cell {
            Some(cell) => cell.push(text),
            None => self.between.push(text),
        }
    }

    /// An item shown: the running cell's, or between cells (a thread outlived its cell) its
    /// text, for the next cell.
    fn display(&mut self, item: DisplayItem) {
        match &mut self.cell {
            Some(cell) => cell.display(item),
            None => self.between.push(&format!("{}\n", item.text())),
        }
    }
}

impl CellSink for Mutex<Outputs> {
    fn captured(&self, text: &str) {
        lock(self).push(text);
    }
}

#[derive(Default)]
struct State {
    /// The proxy bound for each host object, to tell whether the name still holds it.
    proxies: HashMap<String, Py<PyAny>>,
    /// Python objects the host registered as variables, by name.
    py_values: HashMap<String, Py<PyAny>>,
    /// The last index `bind_unique` handed out per prefix.
    last_index: HashMap<String, u64>,
}

fn backend(operation: &'static str) -> impl Fn(PyErr) -> RuntimeError {
    move |e| RuntimeError::Backend {
        operation,
        message: e.to_string(),
    }
}

impl InProcRuntime {
    /// A runtime with an empty namespace. Starts the interpreter on first use (see
    /// [`python_environment`](crate::python_environment) for which packages it sees).
    pub fn new() -> Result<Self, InProcError> {
        env::python_environment()?;
        let (handle, own_runtime) = match Handle::try_current() {
            Ok(handle) => (handle, None),
            Err(_) => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("cave-host-calls")
                    .enable_all()
                    .build()
                    .map_err(|e| InProcError::Setup {
                        message: format!("could not start a tokio runtime: {e}"),
                    })?;
                (rt.handle().clone(), Some(rt))
            }
        };
        let output = Arc::new(Mutex::new(Outputs::default()));
        let sink = output.clone();
        let shown = output.clone();
        let (namespace, write, show) = Python::attach(
            |py| -> Result<(Py<PyDict>, Callback, Callback), InProcError> {
                let setup = |e: PyErr| InProcError::Setup {
                    message: e.to_string(),
                };
                let ns = PyDict::new(py);
                executor(py)?
                    .call_method1("reset_namespace", (&ns,))
                    .map_err(setup)?;
                let write = PyCFunction::new_closure(
                    py,
                    None,
                    None,
                    move |args: &Bound<'_, PyTuple>,
                          _kw: Option<&Bound<'_, PyDict>>|
                          -> PyResult<()> {
                        let text =
                            text_of(args.get_item(0)?.cast::<PyString>().map_err(PyErr::from)?)?;
                        lock(&sink).push(&text);
                        Ok(())
                    },
                )
                .map_err(setup)?;
                // `(bundle, omitted)` of an item the cell showed (see cave_executor's `_send`).
                let show = PyCFunction::new_closure(
                    py,
                    None,
                    None,
                    move |args: &Bound<'_, PyTuple>,
                          _kw: Option<&Bound<'_, PyDict>>|
                          -> PyResult<()> {
                        let executor = executor(args.py())
                            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
                        let value = from_py(args.as_any(), executor).map_err(|e| match e {
                            FromPyError::Unsupported(t) => {
                                PyTypeError::new_err(format!("a display item holds a {t}"))
                            }
                            FromPyError::Python(e) => e,
                        })?;
                        let item = DisplayItem::from_value(value).map_err(PyTypeError::new_err)?;
                        lock(&shown).display(item);
                        Ok(())
                    },
                )
                .map_err(setup)?;
                Ok((
                    ns.unbind(),
                    write.into_any().unbind(),
                    show.into_any().unbind(),
                ))
            },
        )?;
        let interrupt = Arc::new(CellInterrupt::default());
        let on_thread = interrupt.clone();
        let id = RUNTIMES.fetch_add(1, Ordering::Relaxed) + 1;
        let worker = Worker::spawn(format!("cave-python-{id}"), move |py| {
            let ident = py.import("threading").and_then(|t| t.call_method0("get_ident")).and_then(|i| i.extract::<i64>());
            match ident {
                Ok(ident) => on_thread.set_thread(ident as _),
                Err(e) => tracing::error!(error = %e, "could not read the runtime thread's id: interrupts are disabled"),
            }
        })
        .map_err(|e| InProcError::Setup { message: format!("could not start the runtime's thread: {e}") })?;
        Ok(Self {
            inner: Arc::new(Inner {
                worker,
                namespace,
                write,
                show,
                output,
                registry: Arc::new(Mutex::new(Registry::new())),
                state: Mutex::new(State::default()),
                interrupt,
                executions: AtomicU64::new(0),
                limits: Mutex::new(CellLimits::default()),
                stdio: Mutex::new(None),
                handle,
                own_runtime: Mutex::new(own_runtime),
            }),
        })
    }

    /// Sets the bounds on each cell's output: how much the host holds, how much is kept whole
    /// (past what is held, the output goes to a temporary file as it comes, unlinked at once so
    /// that nothing outlives the process, and `_output_N` gets all of it) and the largest form
    /// of an item a cell shows. Default: [`CellLimits::default`].
    pub fn set_cell_limits(&self, limits: CellLimits) {
        *lock(&self.inner.limits) = limits;
    }

    /// The bounds on each cell's output in force.
    pub fn cell_limits(&self) -> CellLimits {
        *lock(&self.inner.limits)
    }

    /// Registers a Python object the host created (e.g. a DataFrame) as a variable: bound as
    /// is, never copied; `retrieve_py` hands it back.
    pub async fn register_py(
        &self,
        name: &str,
        object: Py<PyAny>,
        description: Option<&str>,
    ) -> Result<(), RuntimeError> {
        let inner = self.inner.clone();
        let name = name.to_owned();
        let description = description.map(str::to_owned);
        self.inner
            .worker
            .run("register_py", move |py| {
                let type_name = object
                    .bind(py)
                    .get_type()
                    .qualname()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "object".to_owned());
                let mut variable = Variable::new(name, Value::None).with_type_name(type_name);
                variable.description = description;
                let entries = lock(&inner.registry).claim(Resources::new().variable(variable))?;
                let objects = entries
                    .iter()
                    .map(|e| (e.name.clone(), object.clone_ref(py)))
                    .collect();
                inner.bind_batch(py, &entries, objects)
            })
            .await?
    }

    /// Makes what this runtime's cells write to the captured descriptors (`os.write(1, ...)`,
    /// subprocesses, C extensions) part of their output. The capture is the process's; this
    /// runtime only reads it while it lasts.
    pub fn attach_stdio(&self, capture: &StdioCapture) {
        *lock(&self.inner.stdio) = Some(capture.shared());
    }

    /// The live Python object bound to `name` (any bound name).
    pub async fn retrieve_py(&self, name: &str) -> Result<Py<PyAny>, RuntimeError> {
        let inner = self.inner.clone();
        let key = normalize_name(name);
        let name = name.to_owned();
        self.inner
            .worker
            .run("retrieve_py", move |py| {
                inner
                    .namespace
                    .bind(py)
                    .get_item(&key)
                    .ok()
                    .flatten()
                    .map(Bound::unbind)
                    .ok_or(RuntimeError::Unbound { name })
            })
            .await?
    }
}

impl std::fmt::Debug for InProcRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcRuntime")
            .field("executions", &self.inner.executions.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // A runtime may be dropped inside async code, where a tokio runtime cannot block.
        if let Some(rt) = lock(&self.own_runtime).take() {
            rt.shutdown_background();
        }
    }
}

#[async_trait]
impl Runtime for InProcRuntime {
    async fn execute(
        &self,
        code: &str,
        output: &dyn OutputSink,
    ) -> Result<Execution, RuntimeError> {
        let (live, mut chunks) = tokio::sync::mpsc::unbounded_channel::<LiveOutput>();
        let inner = self.inner.clone();
        let code = code.to_owned();
        // The cell runs on the interpreter's thread: its span, the parent of its host calls',
        // is the caller's.
        let span = tracing::Span::current();
        let meter = output.host_calls();
        let job = self.inner.worker.run("execute", move |py| {
            inner.run_cell(py, &code, live, span, meter)
        });
        tokio::pin!(job);
        let result = loop {
            tokio::select! {
                result = &mut job => break result,
                Some(piece) = chunks.recv() => piece.deliver(output),
            }
        };
        while let Ok(piece) = chunks.try_recv() {
            piece.deliver(output);
        }
        result?
    }

    async fn register(&self, batch: Resources) -> Result<(), RuntimeError> {
        let inner = self.inner.clone();
        self.inner
            .worker
            .run("register", move |py| {
                let entries = lock(&inner.registry).claim(batch)?;
                inner.bind_batch(py, &entries, HashMap::new())
            })
            .await?
    }

    /// The runtime's thread's processor time (threads a cell starts are not counted), and the
    /// host process's peak resident memory (the interpreter lives in the host).
    fn resource_usage(&self) -> Option<cave_core::ResourceUsage> {
        let cpu = self.inner.worker.cpu_seconds()?;
        Some(cave_core::ResourceUsage::new(cpu, process_peak_memory()))
    }

    fn registry(&self) -> &Mutex<Registry> {
        &self.inner.registry
    }

    fn shared_registry(&self) -> Option<Arc<Mutex<Registry>>> {
        Some(self.inner.registry.clone())
    }

    async fn object_bound(&self, name: &str) -> Result<bool, RuntimeError> {
        let inner = self.inner.clone();
        let key = normalize_name(name);
        self.inner
            .worker
            .run("object_bound", move |py| {
                let bound = inner.namespace.bind(py).get_item(&key).ok().flatten();
                let proxy = lock(&inner.state)
                    .proxies
                    .get(&key)
                    .map(|p| p.clone_ref(py));
                matches!((bound, proxy), (Some(b), Some(p)) if b.is(p.bind(py)))
            })
            .await
    }

    async fn update(&self, name: &str, value: Value) -> Result<(), RuntimeError> {
        let key = lock(&self.inner.registry).update_variable(name, value.clone())?;
        lock(&self.inner.state).py_values.remove(&key);
        let inner = self.inner.clone();
        self.inner
            .worker
            .run("update", move |py| {
                let variable = lock(&inner.registry).variable(&key).cloned();
                match variable {
                    Some(v) => inner
                        .variable_object(py, &key, &v, &[])
                        .and_then(|obj| inner.namespace.bind(py).set_item(&key, obj))
                        .map_err(backend("update")),
                    None => Ok(()),
                }
            })
            .await?
    }

    async fn is_bound(&self, name: &str) -> Result<bool, RuntimeError> {
        let inner = self.inner.clone();
        let key = normalize_name(name);
        self.inner
            .worker
            .run("is_bound", move |py| {
                inner
                    .namespace
                    .bind(py)
                    .contains(&key)
                    .map_err(backend("is_bound"))
            })
            .await?
    }

    async fn get(&self, name: &str) -> Result<Value, RuntimeError> {
        let inner = self.inner.clone();
        let key = normalize_name(name);
        let name = name.to_owned();
        self.inner
            .worker
            .run("get", move |py| {
                let executor = executor(py).map_err(|e| RuntimeError::Backend {
                    operation: "get",
                    message: e.to_string(),
                })?;
                let Some(obj) = inner.namespace.bind(py).get_item(&key).ok().flatten() else {
                    return Err(RuntimeError::Unbound { name });
                };
                from_py(&obj, executor).map_err(|e| match e {
                    FromPyError::Unsupported(python_type) => {
                        RuntimeError::Unsupported { name, python_type }
                    }
                    FromPyError::Python(e) => RuntimeError::Backend {
                        operation: "get",
                        message: e.to_string(),
                    },
                })
            })
            .await?
    }

    async fn bind_unique(
        &self,
        prefix: &str,
        value: Value,
        start: u64,
    ) -> Result<String, RuntimeError> {
        let prefix = cave_core::unique_prefix(prefix, start)?;
        let inner = self.inner.clone();
        self.inner
            .worker
            .run("bind_unique", move |py| {
                let obj = to_py(py, &value).map_err(backend("bind_unique"))?;
                inner.bind_unique(py, &prefix, start, obj, value)
            })
            .await?
    }

    async fn bind_unique_spooled(
        &self,
        prefix: &str,
        spooled: &cave_core::SpooledOutput,
        start: u64,
    ) -> Result<String, RuntimeError> {
        use std::os::fd::AsRawFd as _;
        let prefix = cave_core::unique_prefix(prefix, start)?;
        // Open for as long as `spooled` is borrowed, which outlasts this call.
        let fd = spooled.file().as_raw_fd();
        let inner = self.inner.clone();
        self.inner
            .worker
            .run("bind_unique_spooled", move |py| {
                // Read by Python from the file: the text is made once, as a Python str.
                let text = executor(py)
                    .map_err(|e| RuntimeError::Backend {
                        operation: "bind_unique_spooled",
                        message: e.to_string(),
                    })?
                    .call_method1("read_spooled", (fd,))
                    .map_err(backend("bind_unique_spooled"))?;
                // `reset` binds the same object again (kept as the host's own), not this note.
                let lost = Value::Str(cave_core::prompt::SPOOLED_OUTPUT_LOST.to_owned());
                let name = inner.bind_unique(py, &prefix, start, text.clone(), lost)?;
                lock(&inner.state)
                    .py_values
                    .insert(name.clone(), text.unbind());
                Ok(name)
            })
            .await?
    }

    async fn reset(&self) -> Result<(), RuntimeError> {
        let inner = self.inner.clone();
        self.inner
            .worker
            .run("reset", move |py| {
                let executor = executor(py).map_err(|e| RuntimeError::Backend {
                    operation: "reset",
                    message: e.to_string(),
                })?;
                executor
                    .call_method1("reset_namespace", (inner.namespace.bind(py),))
                    .map_err(backend("reset"))?;
                lock(&inner.state).proxies.clear();
                let entries = lock(&inner.registry).entries().to_vec();
                let failed = inner.rebind(py, &entries);
                py.import("gc")
                    .and_then(|gc| gc.call_method0("collect"))
                    .map_err(backend("reset"))?;
                failed.map_or(Ok(()), Err)
            })
            .await?
    }

    /// Refused: the namespace lives in this process's interpreter, which cannot be copied.
    async fn fork(&self) -> Result<Arc<dyn Runtime>, RuntimeError> {
        Err(RuntimeError::NotSupported {
            operation: "fork",
            reason: "the in-process runtime's namespace lives in this process's interpreter, which cannot be copied: the kernel runtime (KernelRuntime, `--runtime kernel`) forks a live session".to_owned(),
        })
    }

    fn interrupter(&self) -> Option<Arc<dyn Interrupt>> {
        Some(Arc::new(InterruptHandle(self.inner.interrupt.clone())))
    }

    /// In-process, the objects are bound as they are (and kept for `reset`); the prompt shows
    /// their signatures, fields and docs (unless `hidden`).
    async fn register_python_file(
        &self,
        path: &std::path::Path,
        hidden: bool,
    ) -> Result<Resources, RuntimeError> {
        let path = path.to_string_lossy().into_owned();
        let inner = self.inner.clone();
        self.inner
            .worker
            .run("register_python_file", move |py| {
                inner.load_file(py, &path, hidden)
            })
            .await?
    }
}

impl Inner {
    fn load_file(
        &self,
        py: Python<'_>,
        path: &str,
        hidden: bool,
    ) -> Result<Resources, RuntimeError> {
        let invalid = |e: PyErr| RuntimeError::InvalidResource {
            name: path.to_owned(),
            problem: e.to_string(),
        };
        let executor = executor(py).map_err(|e| RuntimeError::Backend {
            operation: "register_python_file",
            message: e.to_string(),
        })?;
        let exports = executor
            .call_method1("load_exports", (path,))
            .map_err(invalid)?;
        // The executor describes the exports as plain data, read as the kernel runtime reads it.
        let described = executor
            .call_method1("describe_exports", (&exports,))
            .map_err(invalid)?;
        let described = from_py(&described, executor).map_err(|e| RuntimeError::Backend {
            operation: "register_python_file",
            message: format!("the exports' description did not convert: {e:?}"),
        })?;
        let mut resources =
            cave_python::exports::exports_to_resources(&described, &lock(&self.registry));
        if hidden {
            resources = resources.with_hidden(true);
        }
        let entries = lock(&self.registry).claim(resources)?;
        let mut objects = HashMap::new();
        for item in exports.try_iter().map_err(invalid)? {
            let (_kind, name, obj, _description, _details): (
                String,
                String,
                Bound<'_, PyAny>,
                Option<String>,
                Bound<'_, PyDict>,
            ) = item.map_err(invalid)?.extract().map_err(invalid)?;
            let name = normalize_name(&name);
            // Only what was registered: a needed class skipped because its name is taken
            // must not stand in for the resource that holds the name.
            if entries.iter().any(|e| e.name == name) {
                objects.insert(name, obj.unbind());
            }
        }
        self.bind_batch(py, &entries, objects)?;
        Ok(entries.into_iter().map(|e| e.resource).collect())
    }

    /// Binds `obj` to the first free `{prefix}_{n}`, `n >= start` and past the last one handed
    /// out; `recorded` is what the registry keeps for `reset`.
    fn bind_unique(
        &self,
        py: Python<'_>,
        prefix: &str,
        start: u64,
        obj: Bound<'_, PyAny>,
        recorded: Value,
    ) -> Result<String, RuntimeError> {
        let ns = self.namespace.bind(py);
        let mut registry = lock(&self.registry);
        let mut state = lock(&self.state);
        let mut index = start.max(state.last_index.get(prefix).map_or(0, |last| last + 1));
        let taken = |name: &str| registry.is_bound(name) || ns.contains(name).unwrap_or(true);
        while taken(&format!("{prefix}_{index}")) {
            index += 1;
        }
        let name = format!("{prefix}_{index}");
        ns.set_item(&name, obj).map_err(backend("bind_unique"))?;
        registry.record_binding(&name, recorded);
        state.last_index.insert(prefix.to_owned(), index);
        Ok(name)
    }

    fn run_cell(
        &self,
        py: Python<'_>,
        code: &str,
        live: UnboundedSender<LiveOutput>,
        span: tracing::Span,
        meter: Option<Arc<cave_core::HostCallMeter>>,
    ) -> Result<Execution, RuntimeError> {
        let executor = executor(py).map_err(|e| RuntimeError::Backend {
            operation: "execute",
            message: e.to_string(),
        })?;
        let number = self.executions.fetch_add(1, Ordering::SeqCst) + 1;
        let limits = *lock(&self.limits);
        let (limit, cap) = (limits.max_cell_output, limits.held());
        {
            let mut outputs = lock(&self.output);
            let spool = OutputSpool::new(spool_dir(), limit).unlinked();
            let mut cell = CellOutput::new(cap, Some(live))
                .with_span(span)
                .with_spool(spool)
                .with_host_calls(meter);
            // What threads of earlier cells wrote meanwhile comes first.
            if let Some(between) = outputs.between.take() {
                cell.push(&between);
            }
            outputs.cell = Some(cell);
        }
        let capture = lock(&self.stdio).clone();
        let captured = capture
            .as_ref()
            .and_then(|c| c.begin_cell(self.output.clone()));
        let split = trailing_split(py, code).map_err(backend("execute"))?;
        self.interrupt.begin(number);
        let result = executor.call_method1(
            "run_cell",
            (
                code,
                self.namespace.bind(py),
                format!("<cell {number}>"),
                self.write.bind(py),
                self.show.bind(py),
                limits.max_display,
                split,
            ),
        );
        self.interrupt.end(py);
        if let (Some(capture), Some(token)) = (&capture, captured) {
            // Released while draining: a thread of the cell may still need the interpreter to
            // finish the write being waited for.
            py.detach(|| capture.end_cell(token));
        }
        let held = lock(&self.output).cell.take();
        let (mut output, spooled) = held.map(CellOutput::finish).unwrap_or_default();
        let execution = match result {
            Ok(raised) if raised.is_none() => Execution::ok(output),
            Ok(raised) => {
                let (python_type, message): (String, String) =
                    raised.extract().map_err(backend("execute"))?;
                Execution::failed(output, ExecutionError::new(python_type, message))
            }
            // Raised outside the cell's own frames (an interrupt that landed in the executor).
            Err(error) => {
                let python_type = error
                    .get_type(py)
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "BaseException".to_owned());
                let message = error
                    .value(py)
                    .str()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                output.push_str(&format!("{python_type}: {message}\n"));
                Execution::failed(output, ExecutionError::new(python_type, message))
            }
        };
        Ok(execution.with_spooled(spooled))
    }

    /// Binds a claimed batch as one step: every Python object is created first, and the
    /// namespace changes only when all of them could be. On failure the batch is unclaimed and
    /// nothing of it is bound. `objects` are Python objects the host supplies, by name.
    fn bind_batch(
        &self,
        py: Python<'_>,
        entries: &[Entry],
        objects: HashMap<String, Py<PyAny>>,
    ) -> Result<(), RuntimeError> {
        match self.create_all(py, entries, &objects) {
            Ok(created) => {
                lock(&self.state).py_values.extend(objects);
                self.commit(py, created).map_err(backend("register"))
            }
            Err((name, error)) => {
                let mut registry = lock(&self.registry);
                for entry in entries {
                    registry.remove(&entry.name);
                }
                Err(RuntimeError::InvalidResource {
                    name,
                    problem: format!(
                        "could not be created in Python ({error}); nothing of its batch was registered"
                    ),
                })
            }
        }
    }

    /// Binds every registered entry again after a reset. One that cannot be created is
    /// unregistered (the others stay bound) and reported.
    fn rebind(&self, py: Python<'_>, entries: &[Entry]) -> Option<RuntimeError> {
        let mut failure = None;
        for entry in entries {
            let bound = self
                .create_all(py, std::slice::from_ref(entry), &HashMap::new())
                .and_then(|created| {
                    self.commit(py, created)
                        .map_err(|e| (entry.name.clone(), e))
                });
            if let Err((name, error)) = bound {
                tracing::error!(%name, %error, "a registered resource could not be restored");
                lock(&self.registry).remove(&name);
                failure.get_or_insert(RuntimeError::InvalidResource {
                    name,
                    problem: format!(
                        "could not be restored after the reset ({error}), so it was unregistered"
                    ),
                });
            }
        }
        failure
    }

    /// Creates the Python objects of `entries` without touching the namespace.
    fn create_all<'py>(
        &self,
        py: Python<'py>,
        entries: &[Entry],
        objects: &HashMap<String, Py<PyAny>>,
    ) -> Result<Vec<Created<'py>>, (String, PyErr)> {
        let mut created = Vec::with_capacity(entries.len());
        for entry in entries {
            let one = self
                .create(py, entry, objects, &created)
                .map_err(|e| (entry.name.clone(), e))?;
            created.push(one);
        }
        Ok(created)
    }

    fn create<'py>(
        &self,
        py: Python<'py>,
        entry: &Entry,
        objects: &HashMap<String, Py<PyAny>>,
        batch: &[Created<'py>],
    ) -> PyResult<Created<'py>> {
        // The host's own Python object for this name: supplied now, or kept from before.
        let own = |name: &str| -> Option<Bound<'py, PyAny>> {
            objects.get(name).map(|o| o.bind(py).clone()).or_else(|| {
                lock(&self.state)
                    .py_values
                    .get(name)
                    .map(|o| o.bind(py).clone())
            })
        };
        let mut extra = Vec::new();
        let mut proxy = false;
        let object = match &entry.resource {
            Resource::Variable(v) => match own(&entry.name) {
                Some(obj) => obj,
                None => self.variable_object(py, &entry.name, v, batch)?,
            },
            Resource::Binding { value, .. } => match own(&entry.name) {
                Some(obj) => obj,
                None => to_py(py, value)?,
            },
            Resource::Function(f) => match &f.body {
                FunctionBody::Python(source) => {
                    let (function, helpers) = self.python_function(py, &entry.name, source)?;
                    extra = helpers;
                    function
                }
                _ => self.function_object(py, &entry.name, f, own(&entry.name))?,
            },
            Resource::Type(t) => match own(&entry.name) {
                Some(class) => class,
                None => type_object(py, t)?,
            },
            Resource::Object(o) => {
                let object = self.object_proxy(py, o)?;
                // The object's class is usable by name (hidden from the prompt) if free.
                extra.push((
                    o.object.type_name().to_owned(),
                    object.get_type().into_any(),
                ));
                proxy = true;
                object
            }
            _ => return Ok(Created::default()),
        };
        Ok(Created {
            binding: Some((entry.name.clone(), object)),
            extra,
            proxy,
            watched: !matches!(entry.resource, Resource::Variable(_)),
        })
    }

    /// Binds created objects into the namespace (it fails only if Python refuses a key).
    fn commit(&self, py: Python<'_>, created: Vec<Created<'_>>) -> PyResult<()> {
        let ns = self.namespace.bind(py);
        for c in created {
            let Some((name, object)) = c.binding else {
                continue;
            };
            if c.proxy {
                lock(&self.state)
                    .proxies
                    .insert(name.clone(), object.clone().unbind());
            }
            let companions = PyList::empty(py);
            for (extra, value) in c.extra {
                if !lock(&self.registry).is_bound(&extra) && !ns.contains(&extra)? {
                    ns.set_item(&extra, &value)?;
                    companions.append(value)?;
                }
            }
            ns.set_item(&name, &object)?;
            executor(py)
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?
                .call_method1(
                    "host_bound",
                    (ns, name.as_str(), object, c.watched, companions),
                )?;
        }
        Ok(())
    }

    /// Runs a Python-source function's definition in a scratch scope whose globals are the
    /// namespace: the function sees the namespace when called, and nothing is bound yet.
    /// Returns the function and the other names the source defined (its helpers).
    fn python_function<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        source: &str,
    ) -> PyResult<(Bound<'py, PyAny>, Vec<Named<'py>>)> {
        let source = CString::new(source).map_err(|e| PyTypeError::new_err(e.to_string()))?;
        let scope = PyDict::new(py);
        py.run(&source, Some(self.namespace.bind(py)), Some(&scope))?;
        let function = scope.get_item(name)?.ok_or_else(|| {
            PyRuntimeError::new_err(format!(
                "the Python source of function '{name}' does not define '{name}'"
            ))
        })?;
        let helpers = scope
            .iter()
            .filter_map(|(k, v)| {
                let k: String = k.extract().ok()?;
                (k != name).then_some((k, v))
            })
            .collect();
        Ok((function, helpers))
    }

    /// A variable's object: the host's own Python object, an instance of a registered record
    /// built from a dict (its class bound, or created earlier in the same batch), or the value
    /// converted.
    fn variable_object<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        v: &Variable,
        batch: &[Created<'py>],
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some(obj) = lock(&self.state).py_values.get(name) {
            return Ok(obj.bind(py).clone());
        }
        if let (Some(type_name), Value::Dict(_)) = (&v.type_name, &v.value) {
            let is_record = matches!(
                lock(&self.registry)
                    .type_schema(type_name)
                    .map(|t| &t.shape),
                Some(TypeShape::Fields(_))
            );
            let in_batch = batch
                .iter()
                .filter_map(|c| c.binding.as_ref())
                .find(|(name, _)| name == type_name)
                .map(|(_, class)| class.clone());
            let class = match in_batch {
                Some(class) => Some(class),
                None => self.namespace.bind(py).get_item(type_name)?,
            };
            if is_record && let Some(class) = class {
                let kwargs = to_py(py, &v.value)?;
                return class.call((), Some(kwargs.cast::<PyDict>().map_err(PyErr::from)?));
            }
        }
        to_py(py, &v.value)
    }

    fn function_object<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        f: &Function,
        own: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match &f.body {
            FunctionBody::Bound => own.ok_or_else(|| {
                PyRuntimeError::new_err(format!("no Python object was loaded for '{name}'"))
            }),
            FunctionBody::Python(source) => self.python_function(py, name, source).map(|(f, _)| f),
            FunctionBody::Host(host) => {
                let host = host.clone();
                let handle = self.handle.clone();
                let shown = self.host_display(false);
                let function = name.to_owned();
                let call = PyCFunction::new_closure(
                    py,
                    None,
                    None,
                    move |args: &Bound<'_, PyTuple>, _kw: Option<&Bound<'_, PyDict>>| {
                        let py = args.py();
                        let bound = args.get_item(0)?;
                        let host = host.clone();
                        host_call(
                            py,
                            &handle,
                            &shown,
                            &function,
                            &bound,
                            move |args| async move { host.call(args).await },
                        )
                    },
                )?;
                make_function(
                    py,
                    name,
                    &f.signature.params,
                    f.doc.as_deref(),
                    f.is_async,
                    call.into_any(),
                )
            }
            _ => Err(PyTypeError::new_err(
                "this function body kind is not supported in-process",
            )),
        }
    }

    /// Where items a host call shows go (the running cell's output, see
    /// [`cave_cell::show_from_host`]), and the span its calls are children of.
    fn host_display(&self, mcp: bool) -> HostCell {
        let output = Arc::downgrade(&self.output);
        let shown = output.clone();
        HostCell {
            show: Arc::new(move |item| {
                if let Some(output) = shown.upgrade() {
                    lock(&output).display(item);
                }
            }),
            output,
            interrupt: self.interrupt.clone(),
            mcp,
        }
    }

    fn object_proxy<'py>(&self, py: Python<'py>, o: &ObjectBinding) -> PyResult<Bound<'py, PyAny>> {
        let object = o.object.clone();
        let object_name = o.name.clone();
        let handle = self.handle.clone();
        let shown = self.host_display(cave_core::calls_mcp(&o.object));
        let call = PyCFunction::new_closure(
            py,
            None,
            None,
            move |args: &Bound<'_, PyTuple>, _kw: Option<&Bound<'_, PyDict>>| {
                let py = args.py();
                let method: String = args.get_item(0)?.extract()?;
                let bound = args.get_item(1)?;
                let object = object.clone();
                let name = format!("{object_name}.{method}");
                host_call(py, &handle, &shown, &name, &bound, move |args| async move {
                    object.call(&method, args).await
                })
            },
        )?;
        let methods = PyList::empty(py);
        for m in o.object.methods() {
            methods.append((
                m.name.as_str(),
                params_list(py, &m.signature.params)?,
                m.doc.as_deref(),
                m.property,
            ))?;
        }
        executor(py)
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?
            .call_method1(
                "make_object",
                (o.object.type_name(), o.object.doc(), methods, call),
            )
    }
}

/// A host-declared default as a Python object (`None` when there is none; the flag beside it
/// tells them apart). A default that exists only in Python cannot be recreated from its repr.
fn optional_py<'py>(
    py: Python<'py>,
    name: &str,
    default: Option<&cave_core::ParamDefault>,
) -> PyResult<Bound<'py, PyAny>> {
    match default {
        Some(cave_core::ParamDefault::Value(v)) => to_py(py, v),
        Some(_) => Err(PyTypeError::new_err(format!(
            "'{name}' has a default that exists only in Python; declare host defaults as values"
        ))),
        None => Ok(py.None().into_bound(py)),
    }
}

/// `(name, kind, has_default, default)` per parameter, as the executor takes them. Host
/// signatures carry host values as defaults; a Python-only default cannot be given.
fn params_list<'py>(py: Python<'py>, params: &[Param]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for p in params {
        let default = optional_py(py, &p.name, p.default.as_ref())?;
        list.append((
            p.name.as_str(),
            p.kind.as_str(),
            p.default.is_some(),
            default,
        ))?;
    }
    Ok(list)
}

fn make_function<'py>(
    py: Python<'py>,
    name: &str,
    params: &[Param],
    doc: Option<&str>,
    is_async: bool,
    call: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    executor(py)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?
        .call_method1(
            "make_function",
            (name, params_list(py, params)?, doc, is_async, call),
        )
}

fn type_object<'py>(py: Python<'py>, t: &TypeSchema) -> PyResult<Bound<'py, PyAny>> {
    let executor = executor(py).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    match &t.shape {
        TypeShape::Fields(fields) => {
            let spec = PyList::empty(py);
            for f in fields {
                let default = optional_py(py, &f.name, f.default.as_ref())?;
                spec.append((
                    f.name.as_str(),
                    f.annotation.as_str(),
                    f.default.is_some(),
                    default,
                ))?;
            }
            executor.call_method1("make_record", (t.name.as_str(), t.doc.as_deref(), spec))
        }
        TypeShape::Enum(members) => {
            let spec = PyList::empty(py);
            for (m, v) in members {
                spec.append((m.as_str(), to_py(py, v)?))?;
            }
            executor.call_method1("make_enum", (t.name.as_str(), t.doc.as_deref(), spec))
        }
        _ => {
            let body = PyDict::new(py);
            body.set_item("__doc__", t.doc.as_deref())?;
            py.import("builtins")?.getattr("type")?.call1((
                t.name.as_str(),
                PyTuple::empty(py),
                body,
            ))
        }
    }
}

/// Calls into the host from Python: converts the bound arguments, runs the future with the
/// interpreter released, and turns the result (or the `HostError`) back into Python.
fn host_call<'py, F, Fut>(
    py: Python<'py>,
    handle: &Handle,
    cell: &HostCell,
    name: &str,
    bound: &Bound<'py, PyAny>,
    call: F,
) -> PyResult<Py<PyAny>>
where
    F: FnOnce(Args) -> Fut + Send,
    Fut: std::future::Future<Output = Result<Value, HostError>> + Send,
{
    let executor = executor(py).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    let mut values = Vec::new();
    for item in bound.cast::<PyList>().map_err(PyErr::from)?.iter() {
        let (name, value): (String, Bound<'_, PyAny>) = item.extract()?;
        let value = from_py(&value, executor).map_err(|e| match e {
            FromPyError::Unsupported(t) => PyTypeError::new_err(format!(
                "argument '{name}' is a {t}, which cannot be passed to a host function: pass plain data (numbers, str, bytes, list, tuple, dict, set)"
            )),
            FromPyError::Python(e) => e,
        })?;
        values.push((name, value));
    }
    let args = Args::new(values);
    let call_cell = cell.call_cell();
    let interrupted = cell.interrupt.host_calls();
    let waiting = cell.interrupt.host_call_waiting();
    let result = py.detach(|| {
        handle.block_on(async {
            tokio::select! {
                biased;
                result = cave_cell::run_host_call(call_cell, name, cell.mcp, call(args)) => Some(result),
                // The cell was interrupted (its time limit, Ctrl-C): the call's future is
                // dropped here, and the cell gets what an interrupted cell gets.
                () = interrupted.cancelled() => None,
            }
        })
    });
    drop(waiting);
    let Some(result) = result else {
        return Err(pyo3::exceptions::PyKeyboardInterrupt::new_err(format!(
            "the host call {name} was dropped: its cell was interrupted or has ended"
        )));
    };
    match result {
        Ok(value) => Ok(to_py(py, &value)?.unbind()),
        Err(HostError {
            python_type,
            message,
            ..
        }) => {
            let builtins = py.import("builtins")?;
            let exception = builtins.getattr(python_type.as_str()).ok().filter(|t| {
                t.cast::<pyo3::types::PyType>().is_ok_and(|t| {
                    t.is_subclass_of::<pyo3::exceptions::PyException>()
                        .unwrap_or(false)
                })
            });
            match exception {
                Some(kind) => Err(PyErr::from_value(kind.call1((message,))?)),
                None => Err(PyRuntimeError::new_err(format!("{python_type}: {message}"))),
            }
        }
    }
}

/// The host process's peak resident memory, in bytes.
fn process_peak_memory() -> Option<u64> {
    // SAFETY: an all-zero rusage is valid, and getrusage only writes it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let read = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    // Linux reports kibibytes.
    (read == 0).then(|| {
        u64::try_from(usage.ru_maxrss)
            .unwrap_or(0)
            .saturating_mul(1024)
    })
}

/// Where the cell's trailing expression is, as `run_cell` takes it (`split`): read here from
/// the source, so that the executor compiles the cell without building its syntax tree; `None`
/// when the reading is not sure (the executor parses the cell).
fn trailing_split<'py>(py: Python<'py>, code: &str) -> PyResult<Bound<'py, PyAny>> {
    Ok(match cave_python::executor_split(code) {
        Some(None) => 0u8.into_pyobject(py)?.into_any(),
        Some(Some(at)) => at.into_pyobject(py)?.into_any(),
        None => py.None().into_bound(py),
    })
}

/// Where a cell's whole output is spooled past the cap: the temporary directory, read once
/// (each cell asked the environment for it).
fn spool_dir() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(std::env::temp_dir).clone()
}

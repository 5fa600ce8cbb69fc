//! Stopping a running cell from another thread, for pure-Python code.

use cave_core::{CancellationToken, lock};
use cave_core::{Interrupt, Interruption};
use pyo3::prelude::*;
use std::os::raw::c_long;
use std::sync::{Arc, Mutex};

/// Which execution is running on the runtime's thread, if any.
#[derive(Debug, Default)]
struct Running {
    /// The Python thread id of the runtime's thread (set once it started).
    thread: Option<c_long>,
    /// The runtime's thread, as Rust knows it.
    runtime_thread: Option<std::thread::ThreadId>,
    /// The runtime's thread waits for a host call (its interpreter released).
    in_host_call: bool,
    /// An interrupt was raised in the running execution.
    raised: bool,
    /// The execution in progress (0 = none).
    execution: u64,
    /// Cancelled when the execution is interrupted: what its host calls wait on besides their
    /// futures (a call that never returns holds no Python frame an exception could reach).
    host_calls: CancellationToken,
}

/// Raises `KeyboardInterrupt` in the runtime's thread while a cell runs.
///
/// CPython checks for it between bytecodes, so a pure-Python loop stops within a few
/// milliseconds; code blocked inside a C call (`time.sleep`, a socket read) only sees it when
/// that call returns. The kernel runtime can kill its process instead.
#[derive(Debug, Default)]
pub(crate) struct CellInterrupt {
    running: Mutex<Running>,
}

impl CellInterrupt {
    /// Records the runtime's thread (call on that thread).
    pub(crate) fn set_thread(&self, thread: c_long) {
        let mut running = self.lock();
        running.thread = Some(thread);
        running.runtime_thread = Some(std::thread::current().id());
    }

    /// Marks the runtime's thread as waiting for a host call until the guard is dropped (drop
    /// it with the interpreter attached again); a call from another thread marks nothing.
    pub(crate) fn host_call_waiting(&self) -> HostCallWaiting<'_> {
        let mut running = self.lock();
        let on_runtime_thread = running.runtime_thread == Some(std::thread::current().id());
        if on_runtime_thread {
            running.in_host_call = true;
        }
        HostCallWaiting {
            interrupt: self,
            marked: on_runtime_thread,
        }
    }

    /// Marks an execution as started (call with the interpreter attached).
    pub(crate) fn begin(&self, execution: u64) {
        self.lock().execution = execution;
    }

    /// What a host call made now waits on besides its future: cancelled when the running
    /// execution is interrupted or ends (a call a cell's thread still has in flight then is
    /// dropped, as the kernel runtime drops it), and replaced when that execution ends.
    pub(crate) fn host_calls(&self) -> CancellationToken {
        self.lock().host_calls.clone()
    }

    /// Marks it as finished, drops an interrupt that arrived too late to matter, and gives
    /// back the import locks one that landed inside importlib left held (call with the
    /// interpreter attached, on the runtime's thread).
    pub(crate) fn end(&self, py: Python<'_>) {
        let raised = {
            let mut running = self.lock();
            running.execution = 0;
            // Calls the cell's threads still have in flight end with it; later calls (the next
            // cell's, or a thread's between cells) get a token of their own.
            running.host_calls.cancel();
            running.host_calls = CancellationToken::new();
            if let Some(thread) = running.thread {
                // SAFETY: the interpreter is attached on this thread; a null exception clears
                // a pending asynchronous exception of that thread.
                unsafe {
                    pyo3::ffi::PyThreadState_SetAsyncExc(thread as _, std::ptr::null_mut());
                }
            }
            std::mem::take(&mut running.raised)
        };
        if raised {
            let released = crate::env::executor(py)
                .map_err(|e| e.to_string())
                .and_then(|executor| {
                    executor
                        .call_method0("release_import_locks")
                        .and_then(|n| n.extract::<usize>())
                        .map_err(|e| e.to_string())
                });
            match released {
                Ok(0) => {}
                Ok(n) => tracing::warn!(
                    locks = n,
                    "an interrupt had landed inside importlib: gave back the import locks it left held"
                ),
                Err(e) => tracing::error!(error = %e, "could not give back the import locks"),
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Running> {
        lock(&self.running)
    }
}

/// The runtime's thread waits for a host call while this lives.
pub(crate) struct HostCallWaiting<'a> {
    interrupt: &'a CellInterrupt,
    marked: bool,
}

impl Drop for HostCallWaiting<'_> {
    fn drop(&mut self) {
        if self.marked {
            self.interrupt.lock().in_host_call = false;
        }
    }
}

/// The handle the agent holds.
#[derive(Debug)]
pub(crate) struct InterruptHandle(pub(crate) Arc<CellInterrupt>);

impl Interrupt for InterruptHandle {
    fn interrupt(&self) -> Interruption {
        let (thread, execution) = {
            let running = self.0.lock();
            (running.thread, running.execution)
        };
        let Some(thread) = thread.filter(|_| execution != 0) else {
            return Interruption::Idle;
        };
        // A host call in flight returns at once with `KeyboardInterrupt`, its future dropped.
        self.0.lock().host_calls.cancel();
        // Raising it needs the interpreter, which the running cell holds between switches: do
        // it from a helper thread so this call never blocks.
        let state = self.0.clone();
        let spawned = std::thread::Builder::new()
            .name("cave-interrupt".to_owned())
            .spawn(move || deliver(&state, thread, execution));
        match spawned {
            Ok(_) => Interruption::Delivered,
            Err(e) => {
                tracing::error!(error = %e, "could not start the interrupt thread");
                Interruption::Pending
            }
        }
    }
}

/// How long an interrupt waits for the thread to leave importlib before it is raised anyway
/// (a cell that does little but import may never be seen elsewhere; the locks it may leave
/// held are given back when the cell ends, `CellInterrupt::end`).
const IMPORT_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// What one look at the runtime's thread came to.
enum Step {
    /// The execution ended: nothing more to do.
    Over,
    /// Raised now.
    Raised,
    /// Not now: look again shortly.
    Wait,
    /// The exception raised was swallowed where Python only reports it: raise it again.
    Swallowed,
}

/// Raises `KeyboardInterrupt` in the runtime's thread once it stands where that is safe, and
/// again if it was swallowed, until the execution ends.
///
/// The exception is raised at the thread's next check between bytecodes, which inside
/// importlib can fall between its taking the interpreter's import lock and the `try` that
/// gives it back (`_get_module_lock`): the lock then stays held, and every later import in
/// the process, every runtime's, waits forever. That happened when the interrupt found the
/// thread waiting for the lock, here while it formatted the error of the host call the same
/// interrupt had cancelled. Waiting for it to leave importlib makes that rare; the cell's end
/// repairs what is left. Raised in a weakref callback (importlib's own, run by a collection),
/// the exception is only reported: the executor notes that, and it is raised once more.
fn deliver(state: &CellInterrupt, thread: c_long, execution: u64) {
    let mut waiting_since = std::time::Instant::now();
    let mut raised = false;
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        let step = Python::attach(|py| {
            // The frames are read without the lock held: reading them runs no code of the
            // thread's, but a collection they set off could, and that code may wait for it.
            {
                let running = state.lock();
                if running.execution != execution {
                    return Step::Over;
                }
                // The cancelled call wakes it with `KeyboardInterrupt`; raised now as well, a
                // second one would land in whatever handles the first. Looked at again if the
                // cell goes on (it caught it, or the call had just returned).
                if running.in_host_call {
                    return Step::Wait;
                }
            }
            if raised {
                return if swallowed(py, thread) {
                    Step::Swallowed
                } else {
                    Step::Wait
                };
            }
            if waiting_since.elapsed() < IMPORT_WAIT && in_import_machinery(py, thread) {
                return Step::Wait;
            }
            let mut running = state.lock();
            if running.execution != execution {
                return Step::Over;
            }
            running.raised = true;
            // SAFETY: attached to the interpreter; the exception type is a valid, immortal
            // builtin; the thread id belongs to the runtime's live thread.
            unsafe {
                pyo3::ffi::PyThreadState_SetAsyncExc(
                    thread as _,
                    pyo3::ffi::PyExc_KeyboardInterrupt,
                );
            }
            Step::Raised
        });
        match step {
            Step::Over => return,
            Step::Raised => raised = true,
            Step::Swallowed => {
                raised = false;
                waiting_since = std::time::Instant::now();
            }
            Step::Wait => {}
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(4));
    }
}

/// Whether the executor saw a `KeyboardInterrupt` swallowed in the thread since last asked.
fn swallowed(py: Python<'_>, thread: c_long) -> bool {
    crate::env::executor(py)
        .map_err(|e| e.to_string())
        .and_then(|executor| {
            executor
                .call_method1("take_swallowed_interrupt", (thread,))
                .and_then(|taken| taken.extract::<bool>())
                .map_err(|e| e.to_string())
        })
        .unwrap_or(false)
}

/// Whether the thread's innermost Python frame is importlib's own code (a module being
/// imported runs in a frame of its own, where an exception is safe: importlib unwinds it).
fn in_import_machinery(py: Python<'_>, thread: c_long) -> bool {
    let frame = py
        .import("sys")
        .and_then(|sys| sys.call_method0("_current_frames"))
        .and_then(|frames| frames.get_item(thread));
    let Ok(frame) = frame else {
        // No frame: the thread runs no Python now (it will check before it does).
        return false;
    };
    let module = frame
        .getattr("f_globals")
        .and_then(|globals| globals.get_item("__name__"))
        .and_then(|name| name.extract::<String>());
    matches!(
        module.as_deref(),
        Ok("_frozen_importlib"
            | "_frozen_importlib_external"
            | "importlib._bootstrap"
            | "importlib._bootstrap_external")
    )
}

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
    pub(crate) fn set_thread(&self, thread: c_long) {
        self.lock().thread = Some(thread);
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

    /// Marks it as finished and drops an interrupt that arrived too late to matter (call with
    /// the interpreter attached, on the runtime's thread).
    pub(crate) fn end(&self, _py: Python<'_>) {
        let mut running = self.lock();
        running.execution = 0;
        // Calls the cell's threads still have in flight end with it; later calls (the next
        // cell's, or a thread's between cells) get a token of their own.
        running.host_calls.cancel();
        running.host_calls = CancellationToken::new();
        if let Some(thread) = running.thread {
            // SAFETY: the interpreter is attached on this thread; a null exception clears a
            // pending asynchronous exception of that thread.
            unsafe {
                pyo3::ffi::PyThreadState_SetAsyncExc(thread as _, std::ptr::null_mut());
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Running> {
        lock(&self.running)
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
            .spawn(move || {
                Python::attach(|_py| {
                    let running = state.lock();
                    if running.execution == execution {
                        // SAFETY: attached to the interpreter; the exception type is a valid,
                        // immortal builtin; the thread id belongs to the runtime's live thread.
                        unsafe {
                            pyo3::ffi::PyThreadState_SetAsyncExc(
                                thread as _,
                                pyo3::ffi::PyExc_KeyboardInterrupt,
                            );
                        }
                    }
                })
            });
        match spawned {
            Ok(_) => Interruption::Delivered,
            Err(e) => {
                tracing::error!(error = %e, "could not start the interrupt thread");
                Interruption::Pending
            }
        }
    }
}

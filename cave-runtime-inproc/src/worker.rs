//! The runtime's own thread: every Python operation of a runtime runs there, in order.
//!
//! One thread per runtime gives a FIFO gate for free (executions, bindings, reads and resets
//! never overlap) and keeps Python off tokio's worker threads.

use cave_core::RuntimeError;
use pyo3::prelude::*;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long each side busy-waits before parking. Waking a parked thread costs tens of
/// microseconds on small machines, more than a typical cell takes to run: a short spin turns
/// the common case (a fast cell, or a burst of operations) into a few microseconds.
const SPIN: Duration = Duration::from_micros(50);

type Job = Box<dyn for<'py> FnOnce(Python<'py>) + Send>;

/// Sends jobs to the runtime's thread.
#[derive(Debug)]
pub(crate) struct Worker {
    jobs: mpsc::Sender<Job>,
    thread: std::thread::ThreadId,
    /// The thread's processor-time clock (it lives as long as `jobs`: the thread ends only
    /// when its queue is closed).
    cpu_clock: Option<libc::clockid_t>,
}

impl Worker {
    /// Starts the thread; `on_start` runs on it first (with the interpreter attached).
    pub(crate) fn spawn(
        name: String,
        on_start: impl for<'py> FnOnce(Python<'py>) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        // The main thread's usual stack: CPython sizes its recursion limits for it, and a
        // thread's default (2 MiB) is small for deep C recursion in `repr` or `json`.
        let handle = std::thread::Builder::new()
            .name(name)
            .stack_size(8 << 20)
            .spawn(move || {
                // Attached once for the thread's life, so its Python thread state (and with it
                // `threading.local` data such as the cell event loop) persists across jobs; the
                // interpreter is released while waiting.
                Python::attach(|py| {
                    on_start(py);
                    let mut queue = queue;
                    loop {
                        let (job, returned) = py.detach(move || (next_job(&queue), queue));
                        queue = returned;
                        let Some(job) = job else { break };
                        // A panicking job drops its reply channel (the caller gets an error); the
                        // thread goes on serving the runtime.
                        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| job(py)));
                    }
                })
            })?;
        let cpu_clock = {
            use std::os::unix::thread::JoinHandleExt;
            let mut clock: libc::clockid_t = 0;
            // SAFETY: the thread is running (it ends only when `jobs` is dropped, with self).
            let found = unsafe { libc::pthread_getcpuclockid(handle.as_pthread_t(), &mut clock) };
            (found == 0).then_some(clock)
        };
        Ok(Self {
            jobs,
            thread: handle.thread().id(),
            cpu_clock,
        })
    }

    /// Processor time the runtime's thread has used, in seconds (the cells it ran, and the
    /// brief spins between jobs).
    pub(crate) fn cpu_seconds(&self) -> Option<f64> {
        let clock = self.cpu_clock?;
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: the clock is the live thread's (see `cpu_clock`); `now` is a valid out-pointer.
        let read = unsafe { libc::clock_gettime(clock, &mut now) };
        (read == 0).then(|| now.tv_sec as f64 + now.tv_nsec as f64 / 1e9)
    }

    /// Runs `f` on the thread and returns its result.
    pub(crate) async fn run<R, F>(&self, operation: &'static str, f: F) -> Result<R, RuntimeError>
    where
        R: Send + 'static,
        F: for<'py> FnOnce(Python<'py>) -> R + Send + 'static,
    {
        if std::thread::current().id() == self.thread {
            // A host function called back into the runtime that is running it: the job would
            // wait behind the cell that is waiting for it.
            return Err(RuntimeError::Backend {
                operation,
                message: "a host function called back into the runtime that is running it; \
use another runtime, or return data for the model's code to use"
                    .to_owned(),
            });
        }
        let (reply, result) = tokio::sync::oneshot::channel();
        self.submit(move |py| {
            // Whoever asked is gone (a timed-out or cancelled execution that was still
            // queued): running it now would have effects nobody sees.
            if !reply.is_closed() {
                let _ = reply.send(f(py));
            }
        })?;
        let mut result = result;
        let spin_until = Instant::now() + SPIN;
        while Instant::now() < spin_until {
            match result.try_recv() {
                Ok(value) => return Ok(value),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => std::hint::spin_loop(),
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => break,
            }
        }
        result.await.map_err(|_| RuntimeError::Backend {
            operation,
            message:
                "the runtime's Python thread failed while doing it (a defect: please report it)"
                    .to_owned(),
        })
    }

    /// Queues `f` without waiting for it.
    pub(crate) fn submit(
        &self,
        f: impl for<'py> FnOnce(Python<'py>) + Send + 'static,
    ) -> Result<(), RuntimeError> {
        self.jobs
            .send(Box::new(f))
            .map_err(|_| RuntimeError::Backend {
                operation: "submit",
                message: "the runtime's Python thread has stopped".to_owned(),
            })
    }
}

/// The next job: spin briefly for one, then block.
fn next_job(queue: &mpsc::Receiver<Job>) -> Option<Job> {
    let spin_until = Instant::now() + SPIN;
    while Instant::now() < spin_until {
        match queue.try_recv() {
            Ok(job) => return Some(job),
            Err(mpsc::TryRecvError::Empty) => std::hint::spin_loop(),
            Err(mpsc::TryRecvError::Disconnected) => return None,
        }
    }
    queue.recv().ok()
}

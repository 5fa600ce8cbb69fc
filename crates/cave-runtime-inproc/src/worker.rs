//! The runtime's own thread: every Python operation of a runtime runs there, in order.
//!
//! One thread per runtime gives a FIFO gate for free (executions, bindings, reads and resets
//! never overlap) and keeps Python off tokio's worker threads.

use cave_core::RuntimeError;
use pyo3::prelude::*;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;

type Job = Box<dyn for<'py> FnOnce(Python<'py>) + Send>;

/// Sends jobs to the runtime's thread.
#[derive(Debug)]
pub(crate) struct Worker {
    jobs: mpsc::Sender<Job>,
}

impl Worker {
    /// Starts the thread; `on_start` runs on it first (with the interpreter attached).
    pub(crate) fn spawn(
        name: String,
        on_start: impl for<'py> FnOnce(Python<'py>) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new().name(name).spawn(move || {
            Python::attach(on_start);
            while let Ok(job) = queue.recv() {
                // A panicking job drops its reply channel (the caller gets an error); the
                // thread goes on serving the runtime.
                let _ = std::panic::catch_unwind(AssertUnwindSafe(|| Python::attach(job)));
            }
        })?;
        Ok(Self { jobs })
    }

    /// Runs `f` on the thread and returns its result.
    pub(crate) async fn run<R, F>(&self, operation: &'static str, f: F) -> Result<R, RuntimeError>
    where
        R: Send + 'static,
        F: for<'py> FnOnce(Python<'py>) -> R + Send + 'static,
    {
        let (reply, result) = tokio::sync::oneshot::channel();
        self.submit(move |py| {
            let _ = reply.send(f(py));
        })?;
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

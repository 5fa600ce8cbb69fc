//! Branches of a live session: [`KernelRuntime::fork`], a runtime of its own whose process is a
//! copy-on-write copy of the running one, with the host's side of the registration copied.

use crate::link::{Started, Transport};
use crate::runtime::{Inner, KernelRuntime, died};
use crate::worker::{Worker, lock};
use cave_core::RuntimeError;
use std::sync::Arc;
use std::sync::atomic::Ordering;

impl KernelRuntime {
    /// A branch of this session: an independent runtime whose Python process is a
    /// copy-on-write copy of the running one (every variable, import and object the cells
    /// made), under the same sandbox and limits, in a control group of its own where the host
    /// makes them, and in a copy of the runtime's own work directory (a directory the
    /// configuration names, or the host's current one when the sandbox is off, is shared).
    /// Starts the process if needed; refused while a cell runs.
    ///
    /// The branch's registration is a copy of this one's: host functions and host objects are
    /// reachable from both, and a host object is the *same* object in every branch (an
    /// `Arc`: a `#[derive(PythonType)]` type wrapped in `Shared` has one state for all
    /// branches), while a variable is copied (a cell's change to it is its branch's own). What is registered in one afterwards is that runtime's only.
    /// Branches live on their own: ending or crashing this runtime ends no branch, and a
    /// branch's crash touches no other. A branch of a branch works. A branch keeps no spare
    /// process: after a crash or a reset it starts a fresh one cold.
    ///
    /// The copy costs a few milliseconds and shares memory with this process until either
    /// side writes. Threads a cell started do not exist in the branch; open files and sockets
    /// are shared with it. Only a local child process can fork: a runtime on a kernel behind a
    /// Jupyter server answers [`RuntimeError::NotSupported`].
    pub async fn fork(&self) -> Result<KernelRuntime, RuntimeError> {
        let (started, branch) = self
            .fork_worker(|transport, inner| {
                let branch = KernelRuntime::with_boxed_transport(transport);
                let copy = branch.inner();
                *lock(&copy.registry) = lock(&inner.registry).clone();
                *lock(&copy.owned) = lock(&inner.owned).clone();
                *lock(&copy.files) = lock(&inner.files).clone();
                *lock(&copy.handles) = lock(&inner.handles).clone();
                *lock(&copy.callables) = lock(&inner.callables).clone();
                copy.next_handle
                    .store(inner.next_handle.load(Ordering::SeqCst), Ordering::SeqCst);
                branch
            })
            .await?;
        let copy = branch.inner();
        let worker = Worker::handshake(started, copy.settings(), copy.callables.clone())
            .await
            .map_err(|e| died("fork", e))?;
        *copy.current.lock().await = Some(worker);
        Ok(branch)
    }

    /// Forks the running process (started if needed) into a branch's worker, started and not
    /// yet handshaken, and what `made` makes of the transport of the branch's later fresh
    /// processes and this runtime's side, while nothing can register (the host's side as it
    /// is at the fork).
    pub(crate) async fn fork_worker<T>(
        &self,
        made: impl FnOnce(Box<dyn Transport>, &Inner) -> T,
    ) -> Result<(Started, T), RuntimeError> {
        let inner = self.inner();
        let process = inner.process().await?;
        let current = inner.current.lock().await;
        let process = current
            .as_ref()
            .filter(|p| p.alive() && Arc::ptr_eq(p, &process))
            .cloned()
            .ok_or_else(|| RuntimeError::ProcessDied {
                operation: "fork",
                reason: "the Python process ended before it could be forked".to_owned(),
            })?;
        if process.link().copies().is_none() {
            return Err(RuntimeError::NotSupported {
                operation: "fork",
                reason: "a kernel behind a Jupyter server cannot be copied: only a local child process can (KernelRuntime::new, with_config or from_pool)".to_owned(),
            });
        }
        if process.executing().is_some() {
            return Err(RuntimeError::Backend {
                operation: "fork",
                message: "a cell is running: fork between cells".to_owned(),
            });
        }
        let (started, transport) = process
            .fork(inner.settings().start_timeout)
            .await
            .map_err(|e| died("fork", e))?;
        let made = made(transport, inner);
        drop(current);
        Ok((started, made))
    }

    /// `count` branches of this session ([`fork`](Self::fork)), each made or failed on its own:
    /// one result per branch, in order.
    pub async fn fork_n(&self, count: usize) -> Vec<Result<KernelRuntime, RuntimeError>> {
        let mut branches = Vec::with_capacity(count);
        for _ in 0..count {
            branches.push(self.fork().await);
        }
        branches
    }
}

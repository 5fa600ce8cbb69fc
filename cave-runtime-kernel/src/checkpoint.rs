//! Checkpoints of the namespace: a paused copy of the child (`fork`, copy-on-write) that a
//! rollback hands the socket to, with the host's side of what was registered at that moment.

use crate::runtime::KernelRuntime;
use crate::worker::{Callable, Worker, lock};
use cave_core::{Registry, RuntimeError};
use std::collections::{HashMap, HashSet};
use std::sync::Weak;
use std::sync::atomic::{AtomicU64, Ordering};

/// Checkpoint ids, unique in the host process (a copy only knows the ids made before it).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A state of a [`KernelRuntime`]'s namespace to return to with
/// [`rollback`](KernelRuntime::rollback). It lives as a paused copy of the Python process
/// (sharing its memory until either side writes), ended when this is dropped, when a rollback
/// to an earlier checkpoint undoes it, or with the process.
pub struct Checkpoint {
    id: u64,
    process: Weak<Worker>,
    /// The host's side, as it was: what is registered, and how calls reach it.
    registry: Registry,
    owned: HashSet<String>,
    files: Vec<(String, String)>,
    handles: HashMap<String, u64>,
    callables: HashMap<u64, Callable>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Drop for Checkpoint {
    fn drop(&mut self) {
        if let Some(process) = self.process.upgrade() {
            process.drop_checkpoint(self.id);
        }
    }
}

fn failed(operation: &'static str, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Backend {
        operation,
        message: message.into(),
    }
}

impl KernelRuntime {
    /// Marks the present state of the namespace (every variable, object and import, and what
    /// is registered) so that [`rollback`](Self::rollback) can return to it: the process forks
    /// a paused copy of itself, which costs a few milliseconds and shares memory with it until
    /// either side writes. Starts the process if needed. Refused while a cell runs.
    ///
    /// Each checkpoint held is one more process (it counts against the process limit, and its
    /// pages against the memory limit once they differ). Threads a cell started do not exist in
    /// the copy; open files and sockets are shared with it.
    pub async fn checkpoint(&self) -> Result<Checkpoint, RuntimeError> {
        let inner = self.inner();
        let process = inner.process().await?;
        let _current = inner.current.lock().await;
        if process.executing().is_some() {
            return Err(failed(
                "checkpoint",
                "a cell is running: take checkpoints between cells",
            ));
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        // The host's side first: nothing registers while the current process is locked.
        let checkpoint = Checkpoint {
            id,
            process: std::sync::Arc::downgrade(&process),
            registry: lock(&inner.registry).clone(),
            owned: lock(&inner.owned).clone(),
            files: lock(&inner.files).clone(),
            handles: lock(&inner.handles).clone(),
            callables: lock(&inner.callables).clone(),
        };
        process
            .checkpoint(id)
            .await
            .map_err(|e| failed("checkpoint", e.to_string()))?;
        Ok(checkpoint)
    }

    /// Returns the namespace to `checkpoint`: the process serving now ends and the paused copy
    /// takes its place (its process id changes), with what was registered then. The checkpoint
    /// stays usable; those taken after it are ended. Refused while a cell runs, and for a
    /// checkpoint of a process that has since ended (a crash, [`reset`](cave_core::Runtime::reset),
    /// [`stop`](Self::stop)): checkpoints do not survive a new process.
    pub async fn rollback(&self, checkpoint: &Checkpoint) -> Result<(), RuntimeError> {
        let inner = self.inner();
        let current = inner.current.lock().await;
        let process = current
            .as_ref()
            .filter(|p| p.alive())
            .filter(|p| {
                checkpoint
                    .process
                    .upgrade()
                    .is_some_and(|c| std::sync::Arc::ptr_eq(&c, p))
            })
            .cloned()
            .ok_or_else(|| {
                failed(
                    "rollback",
                    "this checkpoint belongs to a Python process that has ended (a crash, a reset or a stop); checkpoints do not survive a new process",
                )
            })?;
        if process.executing().is_some() {
            return Err(failed(
                "rollback",
                "a cell is running: roll back between cells",
            ));
        }
        process
            .rollback(checkpoint.id)
            .await
            .map_err(|e| failed("rollback", e.to_string()))?;
        *lock(&inner.registry) = checkpoint.registry.clone();
        *lock(&inner.owned) = checkpoint.owned.clone();
        *lock(&inner.files) = checkpoint.files.clone();
        *lock(&inner.handles) = checkpoint.handles.clone();
        // Calls registered since stay reachable: a proxy may still hold their handle.
        lock(&inner.callables).extend(checkpoint.callables.clone());
        Ok(())
    }
}

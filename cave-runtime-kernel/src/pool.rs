//! `KernelPool`: ready workers shared by many runtimes. A runtime takes a started, sandboxed,
//! limited worker in the time it takes to hand it over, and never gives it back (a used
//! interpreter serves no other session); the pool starts new ones in the background, at most
//! `max_starting` at a time, so that a burst of sessions queues instead of forking without
//! bound.

use crate::KernelError;
use crate::config::WorkerSettings;
use crate::link::Transport;
use crate::worker::{Callables, Worker};
use cave_core::lock;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How a pool keeps its workers.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Workers kept ready (and as many more as runtimes are waiting for).
    pub size: usize,
    /// Workers starting at once, at most: the bound a burst of sessions queues behind.
    pub max_starting: usize,
    /// With no worker taken for this long, the ready ones are let go, and the pool fills
    /// again at the next take; `None` keeps them.
    pub idle_timeout: Option<Duration>,
    /// After a start fails with no runtime waiting (a gateway overloaded or restarting), the
    /// pool tries again after this, doubled with each failure in a row up to 64 times it;
    /// `None`: only the next take tries again.
    pub retry: Option<Duration>,
    /// Code every worker has run before it is taken (`import pandas, numpy`): the pool runs it
    /// once, in a template worker, and fills itself with copies (forks) of it, so that a
    /// session starts with its imports and values in milliseconds. `None`: fresh workers.
    /// Local workers only (a kernel behind a Jupyter server cannot be copied).
    pub setup: Option<String>,
}

/// The most a failed start's retry delay is doubled.
const MAX_BACKOFF_DOUBLINGS: u32 = 6;

impl Default for PoolConfig {
    /// 4 ready, 2 starting at once, let go after 10 minutes without a take, a failed start
    /// tried again after 1 s (then 2 s, 4 s, … up to about a minute).
    fn default() -> Self {
        Self {
            size: 4,
            max_starting: 2,
            idle_timeout: Some(Duration::from_secs(600)),
            retry: Some(Duration::from_secs(1)),
            setup: None,
        }
    }
}

impl PoolConfig {
    /// `size` workers kept ready; the other settings as by default.
    pub fn new(size: usize) -> Self {
        Self {
            size,
            ..Self::default()
        }
    }

    /// At most `n` workers starting at once (at least 1).
    pub fn max_starting(mut self, n: usize) -> Self {
        self.max_starting = n.max(1);
        self
    }

    /// Lets the ready workers go after `timeout` without a take (`None`: never).
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Has every worker run `code` before it is taken: forks of a template that ran it once
    /// (see [`setup`](Self::setup)).
    pub fn setup(mut self, code: impl Into<String>) -> Self {
        self.setup = Some(code.into());
        self
    }

    /// Tries a failed start again after `delay`, doubled with each failure in a row (`None`:
    /// only when a runtime takes a worker).
    pub fn retry(mut self, delay: Option<Duration>) -> Self {
        self.retry = delay;
        self
    }
}

/// What a pool holds and has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Workers ready to be taken.
    pub ready: usize,
    /// Workers starting.
    pub starting: usize,
    /// Runtimes waiting for a worker.
    pub waiting: usize,
    /// The most workers that were ever starting at once.
    pub peak_starting: usize,
    /// Workers started since the pool was made.
    pub started: u64,
    /// Workers taken by runtimes.
    pub taken: u64,
    /// Starts that failed.
    pub failed: u64,
}

/// Ready workers for many runtimes: make runtimes with [`KernelRuntime::from_pool`](crate::KernelRuntime::from_pool).
/// Each runtime takes a fresh worker when it first needs one (and after a crash or a `reset`),
/// never one another runtime used; the pool refills in the background. Dropping the pool and
/// every runtime made from it ends the ready workers.
#[derive(Clone)]
pub struct KernelPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for KernelPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelPool")
            .field("config", &self.inner.config)
            .field("stats", &self.stats())
            .finish()
    }
}

pub(crate) struct PoolInner {
    /// Starts the workers: children under the pool's settings, each in a work directory of
    /// its own.
    pub(crate) transport: Arc<dyn Transport>,
    config: PoolConfig,
    /// Workers kept ready (`config.size` at first; [`KernelPool::resize`] changes it).
    size: std::sync::atomic::AtomicUsize,
    state: Mutex<PoolState>,
    /// Wakes takers when a worker is ready or a start failed.
    arrived: Notify,
    /// The idle reaper runs.
    reaping: AtomicBool,
}

struct PoolState {
    ready: VecDeque<Arc<Worker>>,
    starting: usize,
    waiting: usize,
    peak_starting: usize,
    started: u64,
    taken: u64,
    failed: u64,
    last_take: Instant,
    /// The last start's failure, for one waiting taker.
    failure: Option<String>,
    /// Starts that failed since the last that succeeded (the retry's backoff).
    failures_in_row: u32,
    /// A retry after a failure is scheduled.
    retrying: bool,
}

impl KernelPool {
    /// A pool of the workers `transport` starts.
    pub(crate) fn with_transport(transport: Arc<dyn Transport>, pool: PoolConfig) -> Self {
        Self {
            inner: Arc::new(PoolInner {
                transport,
                size: std::sync::atomic::AtomicUsize::new(pool.size),
                config: pool,
                state: Mutex::new(PoolState {
                    ready: VecDeque::new(),
                    starting: 0,
                    waiting: 0,
                    peak_starting: 0,
                    started: 0,
                    taken: 0,
                    failed: 0,
                    last_take: Instant::now(),
                    failure: None,
                    failures_in_row: 0,
                    retrying: false,
                }),
                arrived: Notify::new(),
                reaping: AtomicBool::new(false),
            }),
        }
    }

    /// Starts filling the pool to its size, in the background (needs a tokio runtime).
    pub fn fill(&self) {
        self.inner.start_reaper();
        self.inner.refill();
    }

    /// Waits until `n` workers are ready (filling the pool), or a start fails.
    pub async fn filled(&self, n: usize) -> Result<(), KernelError> {
        loop {
            let arrived = self.inner.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            {
                let mut state = lock(&self.inner.state);
                if state.ready.len() >= n {
                    return Ok(());
                }
                if let Some(message) = state.failure.take() {
                    return Err(KernelError::Start { message });
                }
            }
            self.inner.refill();
            arrived.await;
        }
    }

    /// Keeps `size` workers ready from now on: a larger pool starts more in the background; a
    /// smaller one lets its surplus go at once (runtimes waiting still get theirs).
    pub fn resize(&self, size: usize) {
        self.inner.size.store(size, Ordering::SeqCst);
        let surplus: Vec<Arc<Worker>> = {
            let mut state = lock(&self.inner.state);
            let keep = size.max(state.waiting);
            let extra = state.ready.len().saturating_sub(keep);
            state.ready.drain(..extra).collect()
        };
        // Dropped outside the lock: each ends its process.
        drop(surplus);
        self.inner.refill();
    }

    /// What it holds and has done.
    pub fn stats(&self) -> PoolStats {
        let state = lock(&self.inner.state);
        PoolStats {
            ready: state.ready.len(),
            starting: state.starting,
            waiting: state.waiting,
            peak_starting: state.peak_starting,
            started: state.started,
            taken: state.taken,
            failed: state.failed,
        }
    }

    pub(crate) fn inner(&self) -> &Arc<PoolInner> {
        &self.inner
    }
}

/// Counts a taker among the waiting while it waits, whatever way it stops waiting.
struct Waiting<'a>(&'a PoolInner);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(&self.0.state).waiting -= 1;
    }
}

impl PoolInner {
    /// The settings of the pool's workers.
    pub(crate) fn settings(&self) -> &WorkerSettings {
        self.transport.settings()
    }

    /// A ready worker, its host calls sent to `callables`: at once when one is ready, else
    /// when one has started (this taker counted, so that the pool starts one more).
    pub(crate) async fn take(
        self: &Arc<Self>,
        callables: &Callables,
    ) -> Result<Arc<Worker>, KernelError> {
        self.start_reaper();
        let mut waiting = None;
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            {
                let mut state = lock(&self.state);
                state.last_take = Instant::now();
                while let Some(worker) = state.ready.pop_front() {
                    if worker.alive() {
                        state.taken += 1;
                        drop(state);
                        drop(waiting);
                        worker.adopt(callables.clone());
                        self.refill();
                        return Ok(worker);
                    }
                }
                if waiting.is_some()
                    && let Some(message) = state.failure.take()
                {
                    drop(state);
                    return Err(KernelError::Start { message });
                }
                if waiting.is_none() {
                    state.waiting += 1;
                    waiting = Some(Waiting(self));
                }
            }
            self.refill();
            arrived.await;
        }
    }

    /// Starts workers until those ready and starting cover the size and the takers waiting,
    /// at most `max_starting` at once.
    fn refill(self: &Arc<Self>) {
        let mut state = lock(&self.state);
        let wanted = self.size.load(Ordering::SeqCst) + state.waiting;
        while state.ready.len() + state.starting < wanted
            && state.starting < self.config.max_starting.max(1)
        {
            state.starting += 1;
            state.peak_starting = state.peak_starting.max(state.starting);
            let pool = Arc::downgrade(self);
            let transport = self.transport.clone();
            let settings = *self.settings();
            tokio::spawn(async move {
                let started = match transport.start().await {
                    Ok(started) => {
                        Worker::handshake(started, &settings, Callables::default()).await
                    }
                    Err(e) => Err(e),
                };
                // A pool gone: the worker is dropped, which ends it.
                let Some(pool) = Weak::upgrade(&pool) else {
                    return;
                };
                let failed = {
                    let mut state = lock(&pool.state);
                    state.starting -= 1;
                    match started {
                        Ok(worker) => {
                            state.started += 1;
                            state.failures_in_row = 0;
                            state.failure = None;
                            // Unless the pool shrank meanwhile (then it is dropped below).
                            let wanted = pool.size.load(Ordering::SeqCst) + state.waiting;
                            if state.ready.len() < wanted {
                                state.ready.push_back(worker);
                            }
                            false
                        }
                        Err(error) => {
                            tracing::warn!(%error, "a pooled Python process did not start");
                            state.failed += 1;
                            state.failures_in_row += 1;
                            state.failure = Some(error.to_string());
                            true
                        }
                    }
                };
                pool.arrived.notify_waiters();
                // After a failure a waiting taker starts another at once; otherwise the retry
                // does, later (no tight loop of failures).
                if !failed || lock(&pool.state).waiting > 0 {
                    pool.refill();
                } else {
                    pool.retry_later();
                }
            });
        }
    }

    /// After a failed start with nobody waiting: one refill after the backoff.
    fn retry_later(self: &Arc<Self>) {
        let Some(delay) = self.config.retry else {
            return;
        };
        let failures = {
            let mut state = lock(&self.state);
            // An idle pool (its workers let go) waits for the next take.
            let idle = self
                .config
                .idle_timeout
                .is_some_and(|idle| state.last_take.elapsed() >= idle);
            if idle || std::mem::replace(&mut state.retrying, true) {
                return;
            }
            state.failures_in_row
        };
        let delay = delay * 2u32.pow(failures.saturating_sub(1).min(MAX_BACKOFF_DOUBLINGS));
        let pool = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(pool) = Weak::upgrade(&pool) {
                lock(&pool.state).retrying = false;
                pool.refill();
            }
        });
    }

    /// With an idle timeout, lets the ready workers go once nobody took one for that long.
    fn start_reaper(self: &Arc<Self>) {
        let Some(idle) = self.config.idle_timeout else {
            return;
        };
        if self.reaping.swap(true, Ordering::SeqCst) {
            return;
        }
        let pool = Arc::downgrade(self);
        tokio::spawn(async move {
            let tick = (idle / 4).max(Duration::from_millis(10));
            loop {
                tokio::time::sleep(tick).await;
                let Some(pool) = Weak::upgrade(&pool) else {
                    return;
                };
                let idle_workers = {
                    let mut state = lock(&pool.state);
                    if state.last_take.elapsed() >= idle && state.waiting == 0 {
                        std::mem::take(&mut state.ready)
                    } else {
                        VecDeque::new()
                    }
                };
                // Dropped outside the lock: each ends its process.
                drop(idle_workers);
            }
        });
    }
}

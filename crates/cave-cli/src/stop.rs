//! The signals that end `cave`: Ctrl-C (SIGINT) and SIGTERM, which `docker stop`, systemd,
//! Kubernetes and `timeout` send. SIGTERM ends a session the way Ctrl-C ends a turn (the cell
//! interrupted, the history repaired, the session saved, the runtime's children stopped, the
//! last events written) instead of the process dying in the middle of a write.

use cave_agent::CancellationToken;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Notify;

/// Resolves at Ctrl-C or SIGTERM: for commands that serve until they are stopped.
pub(crate) async fn stop_requested() -> io::Result<()> {
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted,
        _ = terminate.recv() => Ok(()),
    }
}

/// SIGTERM, listened for during a whole `run` or `chat` session (once listened for, the signal
/// no longer ends the process by itself, so the listening lasts as long as the session).
#[derive(Clone, Debug)]
pub(crate) struct Termination {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    received: AtomicBool,
    arrived: Notify,
    /// The running turn's cancellation, if a turn runs.
    turn: Mutex<Option<CancellationToken>>,
}

impl Termination {
    /// Listens from now on; call within the session's runtime.
    pub(crate) fn listen() -> io::Result<Self> {
        let mut terminate = signal(SignalKind::terminate())?;
        let termination = Self {
            inner: Arc::new(Inner::default()),
        };
        let inner = termination.inner.clone();
        tokio::spawn(async move {
            if terminate.recv().await.is_some() {
                {
                    let turn = inner.turn.lock().unwrap_or_else(|e| e.into_inner());
                    inner.received.store(true, Ordering::SeqCst);
                    if let Some(turn) = turn.as_ref() {
                        turn.cancel();
                    }
                }
                inner.arrived.notify_waiters();
            }
        });
        Ok(termination)
    }

    /// Whether SIGTERM arrived.
    pub(crate) fn received(&self) -> bool {
        self.inner.received.load(Ordering::SeqCst)
    }

    /// Cancels `turn` if SIGTERM arrives (or arrived) before the guard is dropped.
    pub(crate) fn guard(&self, turn: &CancellationToken) -> TurnGuard<'_> {
        let mut current = self.inner.turn.lock().unwrap_or_else(|e| e.into_inner());
        if self.received() {
            turn.cancel();
        }
        *current = Some(turn.clone());
        TurnGuard { termination: self }
    }

    /// Resolves when SIGTERM arrives (at once if it did).
    pub(crate) async fn arrived(&self) {
        let notified = self.inner.arrived.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.received() {
            return;
        }
        notified.await;
    }
}

/// While it lives, SIGTERM cancels its turn.
#[derive(Debug)]
pub(crate) struct TurnGuard<'a> {
    termination: &'a Termination,
}

impl Drop for TurnGuard<'_> {
    fn drop(&mut self) {
        *self
            .termination
            .inner
            .turn
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// The terminal's settings before `chat` read its first line: put back when SIGTERM ends it
/// while the line editor holds the terminal in raw mode (it cannot put them back itself).
#[derive(Debug)]
pub(crate) struct TerminalSettings(Option<libc::termios>);

impl TerminalSettings {
    /// Those of stdin, if it is a terminal.
    pub(crate) fn save() -> Self {
        let mut settings = std::mem::MaybeUninit::<libc::termios>::uninit();
        // SAFETY: `tcgetattr` fills `settings` when it returns 0, and only then is it read.
        let saved = unsafe { libc::tcgetattr(libc::STDIN_FILENO, settings.as_mut_ptr()) == 0 }
            .then(|| unsafe { settings.assume_init() });
        Self(saved)
    }

    /// Puts them back.
    pub(crate) fn restore(&self) {
        if let Some(settings) = &self.0 {
            // SAFETY: `settings` came from `tcgetattr` on the same descriptor.
            unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, settings) };
        }
    }
}

//! The signals that end `cave`: Ctrl-C (SIGINT), SIGTERM, which `docker stop`, systemd,
//! Kubernetes and `timeout` send, and SIGHUP, sent when the terminal or the SSH connection goes.
//! SIGTERM and SIGHUP end a session the way Ctrl-C ends a turn (the cell interrupted, the
//! history repaired, the session saved, the runtime's children stopped, the last events
//! written) instead of the process dying in the middle of a write.

use cave_agent::CancellationToken;
use std::io;
use std::sync::{Arc, Mutex, OnceLock};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::Notify;

/// Resolves at Ctrl-C, SIGTERM or SIGHUP: for commands that serve until they are stopped.
pub(crate) async fn stop_requested() -> io::Result<()> {
    let mut terminate = listen_unless_ignored(SignalKind::terminate())?;
    let mut hangup = listen_unless_ignored(SignalKind::hangup())?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted,
        Some(()) = arrival(&mut terminate) => Ok(()),
        Some(()) = arrival(&mut hangup) => Ok(()),
    }
}

/// A listener for `kind`, unless this process was started with it ignored: `nohup` ignores
/// SIGHUP so that what it starts outlives the terminal, and listening would undo that.
fn listen_unless_ignored(kind: SignalKind) -> io::Result<Option<Signal>> {
    let mut current = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: a query (no new action); `current` is written by the call when it returns 0.
    let queried = unsafe {
        libc::sigaction(kind.as_raw_value(), std::ptr::null(), current.as_mut_ptr()) == 0
    };
    // SAFETY: zeroed is a valid `sigaction`, and the call filled it in if it succeeded.
    if queried && unsafe { current.assume_init() }.sa_sigaction == libc::SIG_IGN {
        return Ok(None);
    }
    signal(kind).map(Some)
}

/// The next arrival of a signal listened for; never, for one that is not.
async fn arrival(listener: &mut Option<Signal>) -> Option<()> {
    match listener {
        Some(listener) => listener.recv().await,
        None => std::future::pending().await,
    }
}

/// SIGTERM and SIGHUP, listened for during a whole `run` or `chat` session (once listened for,
/// a signal no longer ends the process by itself, so the listening lasts as long as the
/// session).
#[derive(Clone, Debug)]
pub(crate) struct Termination {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The signal's name, once one arrived.
    received: OnceLock<&'static str>,
    arrived: Notify,
    /// The running turn's cancellation, if a turn runs.
    turn: Mutex<Option<CancellationToken>>,
}

impl Termination {
    /// Listens from now on; call within the session's runtime.
    pub(crate) fn listen() -> io::Result<Self> {
        let mut terminate = listen_unless_ignored(SignalKind::terminate())?;
        let mut hangup = listen_unless_ignored(SignalKind::hangup())?;
        let termination = Self {
            inner: Arc::new(Inner::default()),
        };
        let inner = termination.inner.clone();
        tokio::spawn(async move {
            let name = tokio::select! {
                Some(()) = arrival(&mut terminate) => "SIGTERM",
                Some(()) = arrival(&mut hangup) => "SIGHUP",
                else => return,
            };
            {
                let turn = inner.turn.lock().unwrap_or_else(|e| e.into_inner());
                let _ = inner.received.set(name);
                if let Some(turn) = turn.as_ref() {
                    turn.cancel();
                }
            }
            inner.arrived.notify_waiters();
        });
        Ok(termination)
    }

    /// The signal that arrived, if one did.
    pub(crate) fn signal(&self) -> Option<&'static str> {
        self.inner.received.get().copied()
    }

    /// Whether SIGTERM or SIGHUP arrived.
    pub(crate) fn received(&self) -> bool {
        self.signal().is_some()
    }

    /// Cancels `turn` if SIGTERM or SIGHUP arrives (or arrived) before the guard is dropped.
    pub(crate) fn guard(&self, turn: &CancellationToken) -> TurnGuard<'_> {
        let mut current = self.inner.turn.lock().unwrap_or_else(|e| e.into_inner());
        if self.received() {
            turn.cancel();
        }
        *current = Some(turn.clone());
        TurnGuard { termination: self }
    }

    /// Resolves when SIGTERM or SIGHUP arrives (at once if one did).
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

/// While it lives, SIGTERM or SIGHUP cancels its turn.
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

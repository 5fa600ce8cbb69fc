//! How a child ended: its status, its last words on stderr, the output it had not sent.

use crate::marshal;
use cave_core::lock;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::AsyncReadExt;

/// The shadow's size: the child sends its buffered output before it holds this much.
pub(super) const SHADOW_SIZE: usize = 1 << 20;
/// How much of the child's own stderr is kept for a crash report.
const LAST_WORDS: usize = 4096;

/// A memory file shared with the child: the output it has buffered and not sent yet, as
/// `[execution id: u64 LE][length: u64 LE][UTF-8 text]`. The child updates it with every
/// write and clears it once the text is sent, so a child killed between the two leaves its
/// last words here instead of losing them.
pub(super) struct Shadow {
    pub(super) fd: OwnedFd,
}

impl Shadow {
    pub(super) fn create() -> std::io::Result<Self> {
        // SAFETY: memfd_create with a valid C string; the descriptor is owned from here on.
        let raw = unsafe { libc::memfd_create(c"cave-kernel-output".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        // SAFETY: ftruncate on the descriptor just made.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), SHADOW_SIZE as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self { fd })
    }

    /// What a dead child left unsent: its execution id and text.
    pub(super) fn unsent(&self) -> Option<(u64, String)> {
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::from(self.fd.try_clone().ok()?);
        let mut header = [0u8; 16];
        file.read_exact_at(&mut header, 0).ok()?;
        let execution = u64::from_le_bytes(header[..8].try_into().ok()?);
        let length = u64::from_le_bytes(header[8..].try_into().ok()?) as usize;
        if length == 0 || length > SHADOW_SIZE - 16 {
            return None;
        }
        let mut text = vec![0u8; length];
        file.read_exact_at(&mut text, 16).ok()?;
        Some((execution, marshal::python_text(&text)))
    }
}

/// What a dying interpreter wrote (a fatal error, a faulthandler dump), as the model should see
/// it: the error and the frames of its own code and libraries, not the runtime's.
pub(super) fn last_words_for_the_model(words: &str) -> String {
    let kept: Vec<&str> = words
        .lines()
        .map(str::trim_end)
        .filter(|line| {
            let line = line.trim_start();
            line.starts_with("Fatal Python error")
                || (line.starts_with("File ")
                    && !line.contains("\"<cave-")
                    && !line.contains("\"<string>\""))
        })
        .collect();
    let start = kept.len().saturating_sub(6);
    kept[start..].join("\n")
}

/// The tail of what the child writes to its own stderr (a fatal error, a faulthandler dump,
/// the bootstrap's refusal).
#[derive(Debug, Default)]
pub(super) struct LastWords {
    words: Mutex<Vec<u8>>,
    /// The stderr reached its end (every process holding it exited).
    closed: AtomicBool,
    /// Wakes who waits for that.
    ended: tokio::sync::Notify,
}

impl LastWords {
    /// Keeps the tail of `stderr` (the read end of the child's stderr) until it ends.
    pub(super) fn keep(self: std::sync::Arc<Self>, fd: OwnedFd) {
        let Ok(mut pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
            return;
        };
        tokio::spawn(async move {
            let mut buffer = vec![0u8; 4096];
            while let Ok(n) = pipe.read(&mut buffer).await {
                if n == 0 {
                    break;
                }
                let mut words = lock(&self.words);
                words.extend_from_slice(&buffer[..n]);
                if words.len() > LAST_WORDS {
                    let cut = words.len() - LAST_WORDS;
                    words.drain(..cut);
                }
            }
            self.closed.store(true, Ordering::SeqCst);
            self.ended.notify_waiters();
        });
    }

    /// The last words once the child has exited: read to the end of its stderr, which the
    /// reader may not have reached when the exit is seen (a process that inherited the pipe
    /// can hold it open: given up after a short wait).
    pub(super) async fn to_the_end(&self) -> String {
        let _ = tokio::time::timeout(std::time::Duration::from_millis(500), async {
            loop {
                let ended = self.ended.notified();
                if self.closed.load(Ordering::SeqCst) {
                    return;
                }
                ended.await;
            }
        })
        .await;
        String::from_utf8_lossy(&lock(&self.words))
            .trim()
            .to_owned()
    }
}

/// How an exit status reads: "was killed by SIGSEGV (signal 11)", "exited with status 3".
pub(super) fn describe_status(status: Option<ExitStatus>) -> String {
    match status {
        Some(status) => match (status.code(), status.signal()) {
            (Some(code), _) => format!("exited with status {code}"),
            (None, Some(signal)) => {
                format!("was killed by {} (signal {signal})", signal_name(signal))
            }
            _ => "ended".to_owned(),
        },
        None => "ended".to_owned(),
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGKILL => "SIGKILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGXCPU => "SIGXCPU (its CPU time limit)",
        libc::SIGXFSZ => "SIGXFSZ (its file size limit)",
        libc::SIGPIPE => "SIGPIPE",
        _ => "a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_faulthandler_dump_reads_as_the_models_own_frames() {
        let dump = "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n  File \"/usr/lib/python3.11/ctypes/__init__.py\", line 519 in string_at\n  File \"<cell 4>\", line 3 in <module>\n  File \"<cave-executor>\", line 242 in run_cell\n  File \"<cave-kernel>\", line 400 in _execute\n  File \"<string>\", line 16 in <module>\n\nExtension modules: _cffi_backend (total: 1)\n";
        assert_eq!(
            last_words_for_the_model(dump),
            "Fatal Python error: Segmentation fault\n  File \"/usr/lib/python3.11/ctypes/__init__.py\", line 519 in string_at\n  File \"<cell 4>\", line 3 in <module>"
        );
    }
}

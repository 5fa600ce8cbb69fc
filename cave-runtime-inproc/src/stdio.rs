//! `StdioCapture`: the process's output descriptors, taken over so that what a cell writes to
//! them directly (`os.write(1, ...)`, a subprocess, a C extension's `printf`) is part of that
//! cell's output instead of landing wherever the host's stdout goes.
//!
//! Python-level output (`print`, `sys.stdout`) never needs this: the executor routes it per
//! cell. Descriptors are process-wide, so this is an explicit, process-wide choice of the
//! embedding program (the `cave` command makes it), never something a runtime does by itself.

use crate::InProcError;
use cave_core::lock;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// At most one capture exists at a time: the descriptors are the process's.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Bytes one drain reads at most, so a writer that never stops cannot hold a cell's end.
const DRAIN_LIMIT: usize = 4 << 20;

/// Receives captured text for the cell running now.
pub(crate) trait CellSink: Send + Sync {
    /// Appends captured text to the running cell's output.
    fn captured(&self, text: &str);
}

/// Which descriptors a [`StdioCapture`] takes over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CapturedStreams {
    /// Descriptor 1 only.
    Stdout,
    /// Descriptors 1 and 2 (for a program whose stderr must stay its own too).
    StdoutAndStderr,
}

/// The process's descriptor 1 (and optionally 2) redirected into a pipe that this capture
/// reads. Output written there while a cell of an attached runtime runs
/// ([`InProcRuntime::attach_stdio`](crate::InProcRuntime::attach_stdio)) becomes part of that
/// cell's output; output at any other time goes to the original stderr. Dropping the capture
/// puts the original descriptors back.
///
/// The host keeps its own channel: [`original_stdout`](Self::original_stdout) is a
/// duplicate of the descriptor 1 the process had before, for the host's own output (the `cave`
/// command writes its JSON Lines there, so nothing a cell does can reach that stream).
///
/// With several attached runtimes running cells at the same moment, output goes to the cell
/// that started first.
pub struct StdioCapture {
    shared: Arc<Shared>,
    reader: Option<JoinHandle<()>>,
}

pub(crate) struct Shared {
    /// The read end of the pipe that descriptors 1 (and 2) now write to.
    pipe: OwnedFd,
    /// Written to when the capture ends, to wake the reader.
    stop: OwnedFd,
    stop_reader: OwnedFd,
    original_stdout: OwnedFd,
    original_stderr: OwnedFd,
    streams: CapturedStreams,
    route: Mutex<Route>,
}

#[derive(Default)]
struct Route {
    /// The running cell's sink, with a token to tell which cell set it.
    cell: Option<(u64, Arc<dyn CellSink>)>,
    next_token: u64,
    /// An incomplete UTF-8 sequence at the end of the last read for the cell.
    partial: Vec<u8>,
}

fn os_error(what: &str) -> InProcError {
    InProcError::Setup {
        message: format!("{what}: {}", io::Error::last_os_error()),
    }
}

fn dup(fd: RawFd, what: &str) -> Result<OwnedFd, InProcError> {
    // SAFETY: `dup` has no memory-safety preconditions; a valid result is a new descriptor we own.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if new < 0 {
        return Err(os_error(what));
    }
    // SAFETY: `new` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

fn pipe(what: &str) -> Result<(OwnedFd, OwnedFd), InProcError> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors `pipe2` writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(os_error(what));
    }
    // SAFETY: both are fresh descriptors nobody else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn set_nonblocking(fd: &OwnedFd) -> Result<(), InProcError> {
    // SAFETY: plain flag manipulation on a descriptor we own.
    let ok = unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
    };
    if ok {
        Ok(())
    } else {
        Err(os_error("could not make the capture pipe non-blocking"))
    }
}

fn redirect(from: &OwnedFd, to: RawFd) -> Result<(), InProcError> {
    // SAFETY: `dup2` onto a standard descriptor; it replaces it atomically.
    if unsafe { libc::dup2(from.as_raw_fd(), to) } < 0 {
        return Err(os_error("could not redirect a standard descriptor"));
    }
    Ok(())
}

impl StdioCapture {
    /// Takes over `streams`. Fails if a capture already exists in this process.
    pub fn start(streams: CapturedStreams) -> Result<Self, InProcError> {
        if ACTIVE.swap(true, Ordering::SeqCst) {
            return Err(InProcError::Setup {
                message: "the standard descriptors are already captured in this process (one StdioCapture at a time)".to_owned(),
            });
        }
        match Self::take_over(streams) {
            Ok(capture) => Ok(capture),
            Err(e) => {
                ACTIVE.store(false, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    fn take_over(streams: CapturedStreams) -> Result<Self, InProcError> {
        // Whatever Rust or Python buffered for the old descriptors goes there first.
        let _ = io::stdout().flush();
        // SAFETY: flushing every C stdio stream has no preconditions.
        unsafe { libc::fflush(std::ptr::null_mut()) };
        let original_stdout = dup(1, "could not duplicate stdout")?;
        let original_stderr = dup(2, "could not duplicate stderr")?;
        let (pipe_read, pipe_write) = pipe("could not create the capture pipe")?;
        let (stop_reader, stop) = pipe("could not create the capture's stop pipe")?;
        set_nonblocking(&pipe_read)?;
        redirect(&pipe_write, 1)?;
        if streams == CapturedStreams::StdoutAndStderr
            && let Err(e) = redirect(&pipe_write, 2)
        {
            let _ = redirect(&original_stdout, 1);
            return Err(e);
        }
        drop(pipe_write);
        let shared = Arc::new(Shared {
            pipe: pipe_read,
            stop,
            stop_reader,
            original_stdout,
            original_stderr,
            streams,
            route: Mutex::new(Route::default()),
        });
        let reader = {
            let for_reader = shared.clone();
            std::thread::Builder::new()
                .name("cave-stdio".to_owned())
                .spawn(move || for_reader.read_until_stopped())
                .map_err(|e| {
                    // Nobody would read the pipe: give the process its descriptors back.
                    let _ = redirect(&shared.original_stdout, 1);
                    if streams == CapturedStreams::StdoutAndStderr {
                        let _ = redirect(&shared.original_stderr, 2);
                    }
                    InProcError::Setup {
                        message: format!("could not start the capture's reader thread: {e}"),
                    }
                })?
        };
        Ok(Self {
            shared,
            reader: Some(reader),
        })
    }

    /// A new handle on the descriptor 1 the process had before the capture: the host's own
    /// output channel.
    pub fn original_stdout(&self) -> io::Result<File> {
        Ok(File::from(self.shared.original_stdout.try_clone()?))
    }

    /// A new handle on the descriptor 2 the process had before the capture.
    pub fn original_stderr(&self) -> io::Result<File> {
        Ok(File::from(self.shared.original_stderr.try_clone()?))
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }
}

impl std::fmt::Debug for StdioCapture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdioCapture")
            .field("streams", &self.shared.streams)
            .finish_non_exhaustive()
    }
}

impl Drop for StdioCapture {
    fn drop(&mut self) {
        // SAFETY: flushing every C stdio stream has no preconditions.
        unsafe { libc::fflush(std::ptr::null_mut()) };
        let _ = redirect(&self.shared.original_stdout, 1);
        if self.shared.streams == CapturedStreams::StdoutAndStderr {
            let _ = redirect(&self.shared.original_stderr, 2);
        }
        // SAFETY: a one-byte write from a valid buffer to a descriptor we own.
        unsafe { libc::write(self.shared.stop.as_raw_fd(), [0u8].as_ptr().cast(), 1) };
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        ACTIVE.store(false, Ordering::SeqCst);
    }
}

impl Shared {
    /// Output from now on belongs to this cell (unless another cell already holds it).
    /// Returns the token that ends it.
    pub(crate) fn begin_cell(&self, sink: Arc<dyn CellSink>) -> Option<u64> {
        let mut route = lock(&self.route);
        if route.cell.is_some() {
            return None;
        }
        // What was written before the cell began is not the cell's.
        self.drain(&mut route);
        route.next_token += 1;
        let token = route.next_token;
        route.cell = Some((token, sink));
        Some(token)
    }

    /// The cell has finished: everything written until now is its output.
    pub(crate) fn end_cell(&self, token: u64) {
        // Before taking the route: flushing may block on a full pipe that the reader, which
        // needs the route, is about to empty.
        // SAFETY: flushing every C stdio stream has no preconditions.
        unsafe { libc::fflush(std::ptr::null_mut()) };
        let mut route = lock(&self.route);
        if route.cell.as_ref().is_some_and(|(t, _)| *t == token) {
            self.drain(&mut route);
            let partial = std::mem::take(&mut route.partial);
            if let Some((_, sink)) = route.cell.take()
                && !partial.is_empty()
            {
                sink.captured(&String::from_utf8_lossy(&partial));
            }
        }
    }

    fn read_until_stopped(&self) {
        let mut fds = [
            libc::pollfd {
                fd: self.pipe.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.stop_reader.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            // SAFETY: `fds` is a valid array of two pollfd structures.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if ready < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            if fds[0].revents != 0 {
                let mut route = lock(&self.route);
                self.drain(&mut route);
            }
            if fds[1].revents != 0 {
                // Stopping: whatever is left goes where it belongs, then the reader ends.
                let mut route = lock(&self.route);
                self.drain(&mut route);
                return;
            }
        }
    }

    /// Reads what the pipe holds now and routes it.
    fn drain(&self, route: &mut Route) {
        let mut buffer = [0u8; 16 * 1024];
        let mut total = 0;
        while total < DRAIN_LIMIT {
            // SAFETY: reading into a valid buffer of the given length from a descriptor we own.
            let n = unsafe {
                libc::read(
                    self.pipe.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                )
            };
            let Ok(n @ 1..) = usize::try_from(n) else {
                return; // Empty (EAGAIN), closed, or failed: nothing more now.
            };
            total += n;
            self.route(route, &buffer[..n]);
        }
    }

    fn route(&self, route: &mut Route, bytes: &[u8]) {
        let Some((_, sink)) = route.cell.clone() else {
            // Outside any cell: the original stderr, never the host's stdout.
            let mut stderr = std::mem::ManuallyDrop::new(
                // SAFETY: borrowed for this write only; ManuallyDrop keeps it open.
                unsafe { File::from_raw_fd(self.original_stderr.as_raw_fd()) },
            );
            let _ = stderr.write_all(bytes);
            return;
        };
        route.partial.extend_from_slice(bytes);
        let valid_up_to = match std::str::from_utf8(&route.partial) {
            Ok(_) => route.partial.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => route.partial.len(),
        };
        let complete: Vec<u8> = route.partial.drain(..valid_up_to).collect();
        if !complete.is_empty() {
            sink.captured(&String::from_utf8_lossy(&complete));
        }
    }
}

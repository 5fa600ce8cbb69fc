//! `cave view`: a session as a local web page. The prompt, reasoning, code (highlighted),
//! outputs, figures and tables, tokens and timings per step; live while the session runs.
//!
//! A [`Feed`] holds the session's events (from a running session, or from a file of `cave run
//! --json` output that [`follow`] reads as it grows); a [`Viewer`] serves it on a loopback
//! address. The page and its assets are in the binary; nothing is fetched from elsewhere.

mod feed;
mod prose;
mod server;

pub use feed::{Feed, base_of};

use std::io::{self, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why a viewer could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ViewError {
    /// The address is not this machine's alone.
    #[error(
        "{0} is not a loopback address: the viewer shows a session's code and data, so it serves this machine only (use 127.0.0.1 or [::1], with a port or :0 for any)"
    )]
    NotLoopback(SocketAddr),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// The file of events could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// The address a viewer listens on unless told otherwise: this machine, any free port.
pub const DEFAULT_ADDR: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    0,
));

/// A session served as a web page on a loopback address, until closed or dropped.
#[derive(Debug)]
pub struct Viewer {
    url: String,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Viewer {
    /// Serves `feed` on `addr` (a loopback address; port 0 picks a free one), with `title` at
    /// the top of the page. Must be called within a Tokio runtime.
    pub async fn serve(addr: SocketAddr, feed: Feed, title: &str) -> Result<Self, ViewError> {
        if !addr.ip().is_loopback() {
            return Err(ViewError::NotLoopback(addr));
        }
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ViewError::Bind { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| ViewError::Bind { addr, source })?;
        let app = server::router(feed, title, bound);
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stop.await;
                })
                .await;
            if let Err(e) = served {
                eprintln!("cave: the viewer stopped: {e}");
            }
        });
        let url = match bound {
            SocketAddr::V4(v4) => format!("http://{}:{}/", v4.ip(), v4.port()),
            SocketAddr::V6(v6) => format!("http://[{}]:{}/", v6.ip(), v6.port()),
        };
        Ok(Self {
            url,
            shutdown: Some(shutdown),
            task: Some(task),
        })
    }

    /// The page's address.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stops serving: pages that are open get the rest of the session (and, when the feed
    /// has ended, its end) for up to `grace`, then the connections close.
    pub async fn close(mut self, grace: Duration) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(task) = self.task.take() {
            // Connections that outlive the grace period are cut when the task is dropped.
            let abort = task.abort_handle();
            if tokio::time::timeout(grace, task).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl Drop for Viewer {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The longest line [`follow`] keeps; a longer one is shown as a note (a file of events has
/// nothing near this).
const MAX_LINE: usize = 64 << 20;

/// How often [`follow`] looks for more at the end of the file.
const POLL: Duration = Duration::from_millis(200);

/// Reads the events in `path` into `feed`, then keeps reading what is appended (a session
/// still being written) on a thread of its own until the process ends. The file must be
/// readable: otherwise the error says why, and nothing is started.
pub fn follow(path: &Path, feed: Feed) -> Result<(), ViewError> {
    let read_error = |source| ViewError::Read {
        path: path.to_owned(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(read_error)?;
    if file.metadata().map_err(read_error)?.is_dir() {
        return Err(read_error(io::Error::new(
            io::ErrorKind::IsADirectory,
            "it is a directory; give the file `cave run --json` wrote",
        )));
    }
    let shown = path.display().to_string();
    let mut lines = LineSplitter::default();
    // What is there now is in the feed before this returns: a page opened at once shows it.
    lines.read_available(&mut file, &feed).map_err(read_error)?;
    std::thread::Builder::new()
        .name("cave-view-follow".into())
        .spawn(move || {
            loop {
                if let Err(e) = lines.read_available(&mut file, &feed) {
                    let line = lines.number + 1;
                    feed.push_note(line, &format!("{shown} could not be read further: {e}"));
                    return;
                }
                std::thread::sleep(POLL);
            }
        })
        .map_err(read_error)?;
    Ok(())
}

/// Cuts bytes into lines, holding a partial last line until its end arrives.
#[derive(Debug, Default)]
struct LineSplitter {
    pending: Vec<u8>,
    /// Lines so far.
    number: usize,
    /// Inside a line too long to keep: its bytes are dropped up to its end.
    skipping: bool,
}

impl LineSplitter {
    /// Reads `file` to its current end into `feed`.
    fn read_available(&mut self, file: &mut impl Read, feed: &Feed) -> io::Result<()> {
        let mut buffer = [0u8; 16 * 1024];
        loop {
            match file.read(&mut buffer) {
                Ok(0) => return Ok(()),
                Ok(n) => self.feed(&buffer[..n], feed),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn feed(&mut self, mut bytes: &[u8], feed: &Feed) {
        while let Some(end) = bytes.iter().position(|b| *b == b'\n') {
            self.number += 1;
            if self.skipping {
                self.skipping = false;
            } else {
                self.pending.extend_from_slice(&bytes[..end]);
                feed.push_line(&String::from_utf8_lossy(&self.pending), self.number);
            }
            self.pending.clear();
            bytes = &bytes[end + 1..];
        }
        if self.skipping {
            return;
        }
        self.pending.extend_from_slice(bytes);
        if self.pending.len() > MAX_LINE {
            feed.push_note(
                self.number + 1,
                &format!("the line is longer than {MAX_LINE} bytes and is not shown"),
            );
            self.pending = Vec::new();
            self.skipping = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_cut_where_they_end_whatever_the_reads() {
        let feed = Feed::new(None);
        let mut lines = LineSplitter::default();
        lines.feed(br#"{"type":"text","con"#, &feed);
        assert!(feed.is_empty(), "half a line waits for its end");
        lines.feed(b"tent\":\"a\"}\n\n{\"type\":\"te", &feed);
        assert_eq!(feed.len(), 1);
        lines.feed(b"xt\",\"content\":\"b\"}\n", &feed);
        assert_eq!(feed.len(), 2);
        assert_eq!(lines.number, 3);
    }

    #[tokio::test]
    async fn only_loopback_addresses_are_served() {
        let addr: SocketAddr = "0.0.0.0:0".parse().unwrap();
        let error = Viewer::serve(addr, Feed::new(None), "t").await.unwrap_err();
        assert!(matches!(error, ViewError::NotLoopback(_)));
        assert!(error.to_string().contains("loopback"), "{error}");
        let viewer = Viewer::serve(DEFAULT_ADDR, Feed::new(None), "t")
            .await
            .unwrap();
        assert!(
            viewer.url().starts_with("http://127.0.0.1:"),
            "{}",
            viewer.url()
        );
        assert!(!viewer.url().ends_with(":0/"));
        viewer.close(Duration::from_secs(1)).await;
    }

    #[test]
    fn a_missing_file_or_a_directory_is_refused_before_anything_starts() {
        let missing = follow(Path::new("/nonexistent/run.jsonl"), Feed::new(None)).unwrap_err();
        assert!(missing.to_string().contains("/nonexistent/run.jsonl"));
        let dir = follow(&std::env::temp_dir(), Feed::new(None)).unwrap_err();
        assert!(dir.to_string().contains("directory"), "{dir}");
    }
}

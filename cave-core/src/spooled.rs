//! A cell's whole output kept in a file, as a runtime hands it back with the execution
//! ([`crate::Execution::spooled`]) for `_output_N`; written by cave-cell's `OutputSpool`.

use std::path::{Path, PathBuf};

/// A cell's whole output, kept in a file (up to the spool's limit): what a runtime binds to
/// `_output_N` ([`Runtime::bind_unique_spooled`](crate::Runtime::bind_unique_spooled)). The
/// file is removed when this is dropped.
#[derive(Debug)]
pub struct SpooledOutput {
    file: std::fs::File,
    /// `None` once unlinked.
    path: Option<PathBuf>,
    bytes: u64,
    chars: u64,
    cut: u64,
    limit: u64,
}

impl SpooledOutput {
    /// The output written to `file` (at `path`, `None` if unlinked): `bytes` and `chars`
    /// kept, `cut` bytes past `limit` counted. It owns the file: dropping it removes the path.
    pub fn new(
        file: std::fs::File,
        path: Option<PathBuf>,
        bytes: u64,
        chars: u64,
        cut: u64,
        limit: u64,
    ) -> Self {
        Self {
            file,
            path,
            bytes,
            chars,
            cut,
            limit,
        }
    }

    /// The file's path, while it has one (an unlinked file is read through [`file`](Self::file)).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The open file (read from its start: `(&file).seek(SeekFrom::Start(0))`, or open
    /// `/dev/fd/N` anew).
    pub fn file(&self) -> &std::fs::File {
        &self.file
    }

    /// Bytes kept in the file: the whole output when [`cut`](Self::cut) is 0.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Characters kept in the file.
    pub fn chars(&self) -> u64 {
        self.chars
    }

    /// Bytes the cell wrote past the limit, kept nowhere.
    pub fn cut(&self) -> u64 {
        self.cut
    }

    /// The limit it was kept within.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The kept text, read back whole by the host, as a runtime's error when it cannot be.
    pub fn text(&self) -> Result<String, crate::RuntimeError> {
        self.read_to_string()
            .map_err(|e| crate::RuntimeError::Backend {
                operation: "bind_unique_spooled",
                message: format!("the output's file could not be read: {e}"),
            })
    }

    /// The kept text, read back whole (for a runtime that cannot read the file where it runs).
    pub fn read_to_string(&self) -> std::io::Result<String> {
        use std::io::{Read as _, Seek as _};
        let mut file = &self.file;
        file.seek(std::io::SeekFrom::Start(0))?;
        let mut text = String::with_capacity(usize::try_from(self.bytes).unwrap_or(0));
        file.read_to_string(&mut text)?;
        Ok(text)
    }
}

impl PartialEq for SpooledOutput {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for SpooledOutput {}

impl Drop for SpooledOutput {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }
}

//! A directory a test works in, removed when the test is done with it.

use std::path::{Path, PathBuf};

/// A fresh, empty directory under the temporary directory, named for the test and this
/// process (`cave-{name}-{pid}`), and removed with everything in it when dropped, so that
/// test runs do not fill `/tmp`. Dereferences to its [`Path`].
#[derive(Debug)]
pub struct TestDir {
    path: PathBuf,
}

impl TestDir {
    /// Creates it, removing what an earlier run with the same pid left there.
    ///
    /// # Panics
    /// If it cannot be created (a test cannot go on without it).
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("cave-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("could not create {}: {e}", path.display()));
        Self { path }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl std::ops::Deref for TestDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TestDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<std::ffi::OsStr> for TestDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::TestDir;

    #[test]
    fn it_is_fresh_and_gone_once_dropped() {
        let dir = TestDir::new("testing-dir");
        let path = dir.to_path_buf();
        std::fs::write(dir.join("left.txt"), "x").unwrap();
        drop(dir);
        assert!(!path.exists());
        let again = TestDir::new("testing-dir");
        assert_eq!(std::fs::read_dir(&*again).unwrap().count(), 0);
    }
}

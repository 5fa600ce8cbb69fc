//! What hosts killed before they could clean up leave behind: work directories and control
//! groups, found by name and age, and removed by whoever starts next.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The entries of `parent` named `prefix` + something, last modified at least `after` ago:
/// their paths and the rest of their names. Whether each is really nobody's is the caller's
/// to decide (a lock nobody holds, a pid that no longer runs).
pub(crate) fn stale_entries<'p>(
    parent: &Path,
    prefix: &'p str,
    after: Duration,
) -> impl Iterator<Item = (PathBuf, String)> + 'p {
    std::fs::read_dir(parent)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(move |entry| {
            let rest = entry.file_name().to_str()?.strip_prefix(prefix)?.to_owned();
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= after);
            old.then(|| (entry.path(), rest))
        })
}

#[cfg(test)]
pub(crate) mod testing {
    use std::path::Path;

    /// Makes each of `dirs` look an hour old.
    pub(crate) fn backdate(dirs: &[&Path]) {
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        for dir in dirs {
            std::fs::File::open(dir)
                .unwrap()
                .set_modified(hour_ago)
                .unwrap();
        }
    }
}

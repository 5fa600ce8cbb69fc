//! How every process a session starts ends with it, whatever the cell did to escape: a
//! double-forked `setsid` daemon leaves the process group, so a group kill alone misses it.
//!
//! - The child's control group (`cgroup.rs`), made for every child where the host can, holds
//!   every process it starts; the host kills the group on every end it drives (`stop`, `Drop`,
//!   a reset, a crash, an unheeded interrupt). For the one end the host cannot drive, its own
//!   death by SIGKILL, the worker's first act is to fork a *keeper*: it holds the child's end of
//!   the socket, and when the host's end closes (the host stopped, dropped or lost the runtime,
//!   or died) it kills every process listed in the group and ends.
//! - The worker is a child subreaper: what its cells orphan stays its descendant, and the host
//!   kills that tree before the worker on every end it drives.
//! - Without a control group, the process the host starts is the worker's *guard*
//!   (`guard.rs`), a child subreaper outside the sandbox and the worker's parent: every orphan
//!   comes to it, and when the host's end of the socket closes or the serving process ends (a
//!   crash), it kills every process beneath it. What it cannot hold: a cell that kills the
//!   guard first (the same user; Landlock ABI 6 and later forbids the signal) orphans its
//!   processes to the system.

use std::collections::HashSet;
use std::sync::Mutex;

/// The first process (the keeper) of every live branch this host forked. A branch is forked
/// from a worker and may be adopted by another one's subreaper when its parent ends: the
/// trees of these are never walked into by [`kill_descendants`], whatever worker they hang
/// from, because a branch outlives the process it was forked from.
static BRANCHES: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// `keeper` leads a live branch: spared by every other worker's kill.
pub(crate) fn branch_started(keeper: i32) {
    cave_core::lock(&BRANCHES).push(keeper);
}

/// The branch `keeper` led has ended (its pid may be reused from now on).
pub(crate) fn branch_ended(keeper: i32) {
    cave_core::lock(&BRANCHES).retain(|&pid| pid != keeper);
}

/// How it reads in `enforcement()`, at start and in `cave doctor`.
pub(crate) fn describe(control_group: bool) -> String {
    if control_group {
        "processes end with the session: a control group, also when the host is killed".to_owned()
    } else {
        "processes end with the session: a guard process, the parent of the worker (no control group: a cell that kills the guard first leaves what it detached behind)".to_owned()
    }
}

/// How the processes a kernel child starts end with it on this machine: what `cave doctor`
/// prints.
pub fn support() -> String {
    describe(crate::cgroup::available())
}

/// In the child, between `fork` and `exec`: it becomes a child subreaper.
///
/// # Safety
/// Only in a forked child before `exec`: one system call.
pub(crate) unsafe fn apply() -> std::io::Result<()> {
    // SAFETY: one system call; the setting survives `exec`.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The children of `pid` (every thread's).
fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            found.extend(
                list.split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    found
}

/// The most processes one kill walks: more than any limit the runtime sets.
const MOST: usize = 1 << 16;

/// Kills every descendant of `root` (not `root` itself) but `keep`, whose own descendants go
/// too, and but the trees of live branches (see `BRANCHES`). Each is stopped before its
/// children are read, so none forks behind the walk; all are killed at the end.
pub(crate) fn kill_descendants(root: i32, keep: Option<i32>) {
    let spare = cave_core::lock(&BRANCHES).clone();
    let mut seen = HashSet::new();
    let mut queue = children(root);
    while let Some(pid) = queue.pop() {
        if spare.contains(&pid) || seen.len() >= MOST || !seen.insert(pid) {
            continue;
        }
        if Some(pid) != keep {
            // SAFETY: a signal to a descendant of our own child.
            unsafe {
                libc::kill(pid, libc::SIGSTOP);
            }
        }
        queue.extend(children(pid));
    }
    if let Some(keep) = keep {
        seen.remove(&keep);
    }
    for pid in seen {
        // SAFETY: as above.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

//! A control group per child, where the host may make one, whether or not a limit asks for it:
//! every process the child starts (a daemon that left its process group included) is in it,
//! and ends with it; a memory limit whose breach is a kill the runtime can name ("out of
//! memory"); and a process limit that holds for root too (the kernel does not apply
//! `RLIMIT_NPROC` to root).
//!
//! cgroup v2 is used when the host's own group delegates the controllers to its children;
//! otherwise the v1 hierarchies of `memory` and `pids` when they are mounted and writable.
//! Anything else means "unavailable", and the caller falls back to rlimits.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static GROUPS: AtomicU64 = AtomicU64::new(0);

/// How this crate's groups are named: `cave-kernel-<host pid>-…`.
const PREFIX: &str = "cave-kernel-";
/// How old a group of a host that no longer runs must be before it is removed (a host in
/// another pid namespace is not in our `/proc`; its group is only this long without members
/// between its making and its child joining).
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// What a child's group limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Wanted {
    pub(crate) memory: Option<u64>,
    pub(crate) processes: Option<u64>,
}

/// A child's control group(s): one directory under v2, one per controller under v1.
#[derive(Debug)]
pub(crate) struct ChildGroup {
    version: u8,
    /// `(controller, directory)`.
    dirs: Vec<(&'static str, PathBuf)>,
    /// The `cgroup.procs` files the child joins (written in the child before `exec`).
    procs: Vec<CString>,
    /// The files the ledger reads, opened at their first reading and read again from their
    /// start (a reading before each cell and after it: an open each time cost more than the
    /// read).
    cpu_file: std::sync::OnceLock<Option<std::fs::File>>,
    memory_file: std::sync::OnceLock<Option<std::fs::File>>,
}

/// A control file's contents, read from its start (the kernel writes it anew at offset 0).
fn read_from_start(file: &std::fs::File) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let mut buffer = [0u8; 1024];
    let n = file.read_at(&mut buffer, 0).ok()?;
    std::str::from_utf8(&buffer[..n]).ok().map(str::to_owned)
}

impl ChildGroup {
    /// Makes a group with these limits, or says why it cannot.
    pub(crate) fn create(wanted: Wanted) -> Result<Self, String> {
        let mounts = std::fs::read_to_string("/proc/self/mounts")
            .map_err(|e| format!("cannot read /proc/self/mounts: {e}"))?;
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
        // The pid first (how `sweep_stale` tells whose it is), then what keeps the name unique
        // when a later process gets the same pid while a killed host's group is still there.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!(
            "{PREFIX}{}-{}-{nanos:x}",
            std::process::id(),
            GROUPS.fetch_add(1, Ordering::Relaxed)
        );
        let v2: Vec<&'static str> = [
            ("memory", wanted.memory.is_some()),
            ("pids", wanted.processes.is_some()),
        ]
        .into_iter()
        .filter_map(|(c, on)| on.then_some(c))
        .collect();
        let group = match v2_parent(&mounts, &own, &v2) {
            Some(parent) => Self::make(2, &[("unified", parent)], &name)?,
            None => {
                // Under v1 the pids hierarchy holds every process even without a limit.
                let v1: Vec<&'static str> = [("memory", wanted.memory.is_some()), ("pids", true)]
                    .into_iter()
                    .filter_map(|(c, on)| on.then_some(c))
                    .collect();
                let mut parents = Vec::new();
                for controller in &v1 {
                    let parent = v1_parent(&mounts, &own, controller).ok_or_else(|| {
                        format!("no writable cgroup for the {controller} controller")
                    })?;
                    parents.push((*controller, parent));
                }
                let mut group = Self::make(1, &parents, &name)?;
                // For the ledger's processor time; a group without it still limits.
                if let Some(parent) = v1_parent(&mounts, &own, "cpuacct") {
                    group.add_optional("cpuacct", &parent, &name);
                }
                group
            }
        };
        group.limit(wanted)?;
        Ok(group)
    }

    fn make(version: u8, parents: &[(&'static str, PathBuf)], name: &str) -> Result<Self, String> {
        let mut group = Self {
            version,
            dirs: Vec::new(),
            procs: Vec::new(),
            cpu_file: std::sync::OnceLock::new(),
            memory_file: std::sync::OnceLock::new(),
        };
        for (controller, parent) in parents {
            sweep_stale_once(parent);
            let dir = parent.join(name);
            // Dropping `group` removes what was made if a later one fails.
            std::fs::create_dir(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_encoded_bytes())
                .map_err(|e| e.to_string())?;
            group.dirs.push((controller, dir));
            group.procs.push(procs);
        }
        Ok(group)
    }

    /// Adds the group of an optional v1 `controller` under `parent`, when it can be made.
    fn add_optional(&mut self, controller: &'static str, parent: &Path, name: &str) {
        sweep_stale_once(parent);
        let dir = parent.join(name);
        let Ok(procs) = CString::new(dir.join("cgroup.procs").as_os_str().as_encoded_bytes())
        else {
            return;
        };
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                self.dirs.push((controller, dir));
                self.procs.push(procs);
            }
            Err(e) => {
                tracing::debug!(error = %e, dir = %dir.display(), "no optional control group")
            }
        }
    }

    /// Processor time the group's processes have used, in seconds (v2's `cpu.stat`, which
    /// every group has; v1's `cpuacct` hierarchy, when it could be joined).
    pub(crate) fn cpu_seconds(&self) -> Option<f64> {
        let file = self.cpu_file.get_or_init(|| {
            let path = if self.version == 2 {
                self.dirs.first()?.1.join("cpu.stat")
            } else {
                let (_, dir) = self.dirs.iter().find(|(c, _)| *c == "cpuacct")?;
                dir.join("cpuacct.usage")
            };
            std::fs::File::open(path).ok()
        });
        let text = read_from_start(file.as_ref()?)?;
        if self.version == 2 {
            let usec: u64 = text
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok())?;
            return Some(usec as f64 / 1e6);
        }
        let nanos: u64 = text.trim().parse().ok()?;
        Some(nanos as f64 / 1e9)
    }

    /// The most memory the group has held, in bytes, where the memory controller is on for it.
    pub(crate) fn peak_memory(&self) -> Option<u64> {
        let file = self.memory_file.get_or_init(|| {
            let name = if self.version == 2 {
                "memory.peak"
            } else {
                "memory.max_usage_in_bytes"
            };
            std::fs::File::open(self.dir("memory")?.join(name)).ok()
        });
        read_from_start(file.as_ref()?)?.trim().parse().ok()
    }

    fn dir(&self, controller: &str) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(c, _)| self.version == 2 || *c == controller)
            .map(|(_, d)| d.as_path())
    }

    fn limit(&self, wanted: Wanted) -> Result<(), String> {
        let write = |dir: &Path, file: &str, value: String| {
            std::fs::write(dir.join(file), value)
                .map_err(|e| format!("cannot write {}: {e}", dir.join(file).display()))
        };
        if let (Some(bytes), Some(dir)) = (wanted.memory, self.dir("memory")) {
            if self.version == 2 {
                write(dir, "memory.max", bytes.to_string())?;
                // Swap would turn the limit into slowness instead of a kill.
                let _ = write(dir, "memory.swap.max", "0".to_owned());
            } else {
                write(dir, "memory.limit_in_bytes", bytes.to_string())?;
                let _ = write(dir, "memory.memsw.limit_in_bytes", bytes.to_string());
            }
        }
        if let (Some(processes), Some(dir)) = (wanted.processes, self.dir("pids")) {
            write(dir, "pids.max", processes.to_string())?;
        }
        Ok(())
    }

    /// The file that lists the group's processes (the pids hierarchy's under v1).
    pub(crate) fn members(&self) -> PathBuf {
        let dir = self.dir("pids").unwrap_or(&self.dirs[0].1);
        dir.join("cgroup.procs")
    }

    /// The `cgroup.procs` files the child writes `0` to, joining the group.
    pub(crate) fn procs(&self) -> Vec<CString> {
        self.procs.clone()
    }

    /// Moves process `pid` into the group (a branch's first process, which its worker is
    /// then forked from).
    pub(crate) fn join(&self, pid: i32) -> Result<(), String> {
        for (_, dir) in &self.dirs {
            let procs = dir.join("cgroup.procs");
            std::fs::write(&procs, pid.to_string())
                .map_err(|e| format!("cannot move process {pid} into {}: {e}", procs.display()))?;
        }
        Ok(())
    }

    /// How many times the kernel killed a process of the group for memory.
    pub(crate) fn oom_kills(&self) -> u64 {
        let Some(dir) = self.dir("memory") else {
            return 0;
        };
        let file = if self.version == 2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        std::fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// Kills every process left in the group (what a cell started and left behind).
    pub(crate) fn kill_all(&self) {
        if self.version == 2
            && let Some(dir) = self.dir("pids").or_else(|| self.dir("memory"))
            && std::fs::write(dir.join("cgroup.kill"), "1").is_ok()
        {
            return;
        }
        // v1 has no cgroup.kill: kill what is listed until nothing is (a process forking while
        // it is read is caught on a later round; the rounds are bounded).
        for _ in 0..20 {
            let mut any = false;
            for (_, dir) in &self.dirs {
                if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                    for pid in procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
                        any = true;
                        // SAFETY: signalling a process of our child's group.
                        unsafe {
                            libc::kill(pid, libc::SIGKILL);
                        }
                    }
                }
            }
            if !any {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

impl Drop for ChildGroup {
    fn drop(&mut self) {
        self.kill_all();
        // Closed before the directories are removed.
        drop((self.cpu_file.take(), self.memory_file.take()));
        for (_, dir) in &self.dirs {
            // Empty once its processes are reaped; a few tries cover the reaping.
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}

/// Sweeps `parent` once per process (see [`sweep_stale`]).
fn sweep_stale_once(parent: &Path) {
    static SWEPT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let mut swept = cave_core::lock(&SWEPT);
    if !swept.iter().any(|p| p == parent) {
        swept.push(parent.to_owned());
        sweep_stale(parent, STALE_AFTER);
    }
}

/// Removes the groups that hosts killed before they could remove their own left in `parent`:
/// those named for a pid that no longer runs, older than `after`. Their keeper ended their
/// processes when the host went, so they are empty (a group that is not stays: the kernel
/// refuses to remove it).
fn sweep_stale(parent: &Path, after: std::time::Duration) {
    for (path, rest) in crate::stale::stale_entries(parent, PREFIX, after) {
        let Some(pid) = rest
            .split('-')
            .next()
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let gone = pid != std::process::id() && !Path::new("/proc").join(pid.to_string()).exists();
        if gone {
            let _ = std::fs::remove_dir(path);
        }
    }
}

/// Whether a group could be made for a child here (what `cave doctor` says). Read once: it is
/// asked at each child's start.
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(probe)
}

fn probe() -> bool {
    let (Ok(mounts), Ok(own)) = (
        std::fs::read_to_string("/proc/self/mounts"),
        std::fs::read_to_string("/proc/self/cgroup"),
    ) else {
        return false;
    };
    v2_parent(&mounts, &own, &[]).is_some_and(|dir| writable(&dir))
        || v1_parent(&mounts, &own, "pids").is_some()
}

/// Whether this process may make groups in `dir` (a read-only mount, as in many containers,
/// says no).
fn writable(dir: &Path) -> bool {
    // SAFETY: access(2) on a valid C string.
    CString::new(dir.as_os_str().as_encoded_bytes())
        .is_ok_and(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0)
}

/// This process's group under v2, when it delegates `controllers` to children.
fn v2_parent(mounts: &str, own: &str, controllers: &[&str]) -> Option<PathBuf> {
    let dir = v2_group(mounts, own)?;
    let enabled = std::fs::read_to_string(dir.join("cgroup.subtree_control")).ok()?;
    let enabled: Vec<&str> = enabled.split_whitespace().collect();
    controllers
        .iter()
        .all(|c| enabled.contains(c))
        .then_some(dir)
}

/// This process's group in the v1 hierarchy of `controller`, when it is mounted and writable.
fn v1_parent(mounts: &str, own: &str, controller: &str) -> Option<PathBuf> {
    let dir = v1_group(mounts, own, controller)?;
    writable(&dir).then_some(dir)
}

/// This process's group directory under v2, if cgroup2 is mounted.
fn v2_group(mounts: &str, own: &str) -> Option<PathBuf> {
    let mount = mounts
        .lines()
        .find(|l| l.split(' ').nth(2) == Some("cgroup2"))?
        .split(' ')
        .nth(1)?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(Path::new(mount).join(path.trim_start_matches('/')))
}

/// This process's group directory in the v1 hierarchy of `controller`, if it is mounted.
fn v1_group(mounts: &str, own: &str, controller: &str) -> Option<PathBuf> {
    let mount = mounts.lines().find_map(|l| {
        let fields: Vec<&str> = l.split(' ').collect();
        (fields.get(2) == Some(&"cgroup")
            && fields
                .get(3)
                .is_some_and(|o| o.split(',').any(|o| o == controller)))
        .then(|| fields[1])
    })?;
    let path = own.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, list, path) = (parts.next()?, parts.next()?, parts.next()?);
        list.split(',').any(|c| c == controller).then_some(path)
    })?;
    Some(Path::new(mount).join(path.trim_start_matches('/')))
}

/// The memory this host may use: the machine's, or the limit of the host's own control group
/// when that is lower (a container, a CI job). Read once: the default limits ask at each
/// child's start.
pub(crate) fn host_memory() -> u64 {
    static MEMORY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MEMORY.get_or_init(read_host_memory)
}

fn read_host_memory() -> u64 {
    // SAFETY: sysconf reads constants.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let machine = u64::try_from(pages)
        .unwrap_or(0)
        .saturating_mul(u64::try_from(page).unwrap_or(0));
    let own = own_memory_limit().unwrap_or(u64::MAX);
    match machine.min(own) {
        // Unreadable: 4 GiB, a small machine's worth.
        0 => 4 << 30,
        bytes => bytes,
    }
}

/// The memory limit of the host's own control group, if it has one.
fn own_memory_limit() -> Option<u64> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |path: PathBuf| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let v2 = v2_group(&mounts, &own).and_then(|dir| read(dir.join("memory.max")));
    let v1 =
        v1_group(&mounts, &own, "memory").and_then(|dir| read(dir.join("memory.limit_in_bytes")));
    v2.into_iter().chain(v1).min()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A killed host's group is removed once old enough; a live host's, a recent one, and
    /// anything not named as ours stay.
    #[test]
    fn only_old_groups_of_hosts_that_are_gone_are_swept() {
        let parent = cave_testing::TestDir::new("sweep");
        // No process has pid 4194304 or above (the kernel's limit is 2^22).
        let gone = parent.join(format!("{PREFIX}4194305-0-1"));
        let gone_recent = parent.join(format!("{PREFIX}4194306-0-1"));
        let ours = parent.join(format!("{PREFIX}{}-0-1", std::process::id()));
        let foreign = parent.join("another-tool-4194305");
        for dir in [&gone, &gone_recent, &ours, &foreign] {
            std::fs::create_dir(dir).unwrap();
        }
        crate::stale::testing::backdate(&[&gone, &ours, &foreign]);
        sweep_stale(&parent, STALE_AFTER);
        assert!(!gone.exists(), "an old group of a host that is gone");
        assert!(gone_recent.exists(), "too recent to be sure");
        assert!(ours.exists() && foreign.exists());
    }
}

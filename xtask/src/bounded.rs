//! A command with a bound on its wall time: past it, the command and every process it started
//! are killed, after the log is told what was still running. A hung test would otherwise take
//! CI's whole budget and say nothing of where it hung.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `command` to its end, or kills it and its descendants once `bound` has passed.
pub fn run(mut command: Command, what: &str, bound: Duration) -> Result<(), String> {
    let mut child = command
        .spawn()
        .map_err(|e| format!("could not run {what}: {e}"))?;
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| format!("could not wait for {what}: {e}"))?
        {
            return if status.success() {
                Ok(())
            } else {
                Err(format!("{what} failed: {status}"))
            };
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    // Stopped before anything is killed, parents first, and looked for again until no new one
    // appears (one not yet stopped may have started another): none is left to start more.
    signal(child.id(), libc::SIGSTOP);
    let mut tree: Vec<(u32, String)> = Vec::new();
    loop {
        let new: Vec<(u32, String)> = descendants(child.id())
            .into_iter()
            .filter(|(pid, _)| !tree.iter().any(|(known, _)| known == pid))
            .collect();
        if new.is_empty() {
            break;
        }
        for (pid, _) in &new {
            signal(*pid, libc::SIGSTOP);
        }
        tree.extend(new);
    }
    println!(
        "xtask: {what} ran past {} s; what it was running:",
        bound.as_secs()
    );
    for (pid, line) in &tree {
        println!("  {pid} {line}");
    }
    for (pid, _) in &tree {
        signal(*pid, libc::SIGKILL);
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(format!(
        "{what} ran past {} s and was killed with what it started (a hang: see above)",
        bound.as_secs()
    ))
}

fn signal(pid: u32, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: a signal to a process this one started (or one of its descendants).
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// The processes below `root` (itself excluded), parents before children, each with its
/// command line: read from /proc (empty elsewhere).
fn descendants(root: u32) -> Vec<(u32, String)> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (name) state ppid ...`: the name may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut found = Vec::new();
    let mut pending = vec![root];
    while let Some(parent) = pending.pop() {
        for &pid in children.get(&parent).map(Vec::as_slice).unwrap_or_default() {
            let line = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|raw| {
                    let text = String::from_utf8_lossy(&raw).replace('\0', " ");
                    text.trim().chars().take(200).collect()
                })
                .unwrap_or_default();
            found.push((pid, line));
            pending.push(pid);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    /// A command that outlives its bound is killed with what it started, and the run fails.
    #[test]
    fn a_command_past_its_bound_is_killed_with_its_children() {
        // A duration no other process uses: how its sleepers are found afterwards.
        let marker = format!("600.{}", std::process::id());
        let mut command = Command::new("sh");
        // A child that would run for ten minutes, under a parent that waits for it.
        command.args(["-c", &format!("sleep {marker} & sleep {marker}; wait")]);
        // Not holding the harness's output open if they were left behind.
        command.stdout(Stdio::null()).stderr(Stdio::null());
        let started = Instant::now();
        let result = super::run(command, "the sleeper", Duration::from_secs(1));
        assert!(started.elapsed() < Duration::from_secs(30));
        let error = result.expect_err("killed");
        assert!(error.contains("ran past 1 s"), "{error}");
        let left: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
            .filter(|line| line.contains(&marker))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_command_within_its_bound_gives_its_status() {
        let ok = super::run(Command::new("true"), "true", Duration::from_secs(30));
        assert_eq!(ok, Ok(()));
        let failed = super::run(Command::new("false"), "false", Duration::from_secs(30));
        assert!(failed.expect_err("failed").contains("false failed"));
    }
}

//! Whether a process is still there: for the tests of what must never outlive its owner (a
//! kernel's child, an MCP server). Linux only (`/proc`).

use std::time::{Duration, Instant};

/// Returns true if and only if `pid` is a live process (a zombie waiting to be reaped is not).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits (generously: 10 seconds) for `pid` to end; returns true if and only if it did.
pub fn ends(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    !alive(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_alive_until_it_ends_and_is_reaped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert!(alive(child.id()));
        child.kill().unwrap();
        // Killed but not yet reaped: a zombie, which counts as gone.
        assert!(ends(child.id()));
        child.wait().unwrap();
        assert!(!alive(child.id()));
        assert!(alive(std::process::id()));
    }
}

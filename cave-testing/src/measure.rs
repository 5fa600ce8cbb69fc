//! What a test or a benchmark measures of processes: resident memory, descendants, open
//! descriptors, and percentiles of timings. Linux only (`/proc`).

use std::collections::HashMap;
use std::time::Duration;

/// `VmRSS` of process `pid`, in bytes; `None` once it is gone.
pub fn resident(pid: u32) -> Option<u64> {
    resident_of(&pid.to_string())
}

/// `VmRSS` of this process, in bytes (0 if `/proc` cannot be read).
pub fn resident_self() -> u64 {
    resident_of("self").unwrap_or(0)
}

fn resident_of(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The memory only process `pid` holds (its unique set: private pages, clean and dirty, from
/// `/proc/PID/smaps_rollup`), in bytes: what ending it would free. A fork's copy-on-write
/// pages it has not written are its parent's too, and not counted.
pub fn unique(pid: u32) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let kib: u64 = rollup
        .lines()
        .filter_map(|l| {
            let value = l
                .strip_prefix("Private_Clean:")
                .or_else(|| l.strip_prefix("Private_Dirty:"))?;
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .sum();
    Some(kib * 1024)
}

/// The processor time process `pid` has used so far, all its threads, user and system (at
/// the 100 Hz clock tick Linux reports it in); `None` once it is gone.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command (in parentheses, maybe with spaces): utime and stime are
    // the 14th and 15th of the line.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((user + system) * 10))
}

/// Every process `pid` is an ancestor of (children, and theirs), in no set order.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parents: HashMap<u32, u32> = HashMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
                continue;
            };
            // The command is in parentheses and may hold spaces: the fields follow the last ')'.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            if let Some(parent) = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
                parents.insert(child, parent);
            }
        }
    }
    let below = |mut p: u32| {
        while let Some(&parent) = parents.get(&p) {
            if parent == pid {
                return true;
            }
            if parent <= 1 {
                return false;
            }
            p = parent;
        }
        false
    };
    parents.keys().copied().filter(|p| below(*p)).collect()
}

/// The processes below `pid` that are not in `before` (its [`descendants`] taken earlier):
/// what the work since then started and left running. Unlike a difference of counts, one of
/// `before` that ended meanwhile does not hide one that was left, nor shows as minus one.
pub fn started_since(pid: u32, before: &[u32]) -> Vec<u32> {
    descendants(pid)
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect()
}

/// The resident memory of `pid` and all its descendants, in bytes.
pub fn resident_tree(pid: u32) -> u64 {
    std::iter::once(pid)
        .chain(descendants(pid))
        .filter_map(resident)
        .sum()
}

/// How many descriptors this process has open.
pub fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// The `p` quantile (0 to 1, nearest rank) of `values`, which it sorts; zero when empty.
pub fn percentile(values: &mut [Duration], p: f64) -> Duration {
    values.sort_unstable();
    if values.is_empty() {
        return Duration::ZERO;
    }
    let at = ((values.len() as f64 - 1.0) * p.clamp(0.0, 1.0)).round() as usize;
    values[at]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_counts_among_the_descendants_with_its_memory() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let me = std::process::id();
        assert!(descendants(me).contains(&child.id()));
        let alone = resident(child.id()).expect("the child's memory");
        assert!(alone > 0);
        assert!(resident_self() > 0);
        assert!(resident_tree(me) > alone);
        assert!(open_descriptors() > 2);
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(100) {
            std::hint::black_box(spin.elapsed());
        }
        assert!(cpu_time(me).expect("this process") >= Duration::from_millis(50));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(resident(child.id()), None);
        assert_eq!(cpu_time(child.id()), None);
        assert!(!descendants(me).contains(&child.id()));
    }

    #[test]
    fn what_started_since_is_told_apart_from_what_ended() {
        let sleep = || {
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap()
        };
        let me = std::process::id();
        let mut old = sleep();
        let before = descendants(me);
        let mut new = sleep();
        old.kill().unwrap();
        old.wait().unwrap();
        // One ended and one started: the counts are equal, the new one is still found. Other
        // tests of this binary start processes of their own meanwhile: only these two count.
        let started = started_since(me, &before);
        assert!(started.contains(&new.id()), "{started:?}");
        assert!(!started.contains(&old.id()), "{started:?}");
        new.kill().unwrap();
        new.wait().unwrap();
        assert!(!started_since(me, &before).contains(&new.id()));
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let mut ms: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(percentile(&mut ms, 0.5), Duration::from_millis(51));
        assert_eq!(percentile(&mut ms, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&mut ms, 1.0), Duration::from_millis(100));
        assert_eq!(percentile(&mut [], 0.5), Duration::ZERO);
    }
}

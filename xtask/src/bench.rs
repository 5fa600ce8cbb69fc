//! `cargo xtask bench [--quick] [--compare-python [PYTHON]]`: every crate's criterion
//! benchmarks and the memory measurement, then one Markdown report of their medians and 95%
//! intervals (`target/bench-report.md`, also printed); with `--compare-python`, the same
//! measurements taken through CaveAgent (`xtask/compare/caveagent.py`) beside them, with ratios.

use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One measured figure.
#[derive(Debug, PartialEq)]
pub(crate) struct Figure {
    pub(crate) id: String,
    /// Nanoseconds.
    pub(crate) median: f64,
    pub(crate) low: f64,
    pub(crate) high: f64,
}

/// The figures criterion left under `dir` (`target/criterion`), sorted by id.
pub(crate) fn figures(dir: &Path) -> Vec<Figure> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(at) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&at) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n == "new") {
                    if let Some(figure) = read(&path) {
                        found.push(figure);
                    }
                } else if path
                    .file_name()
                    .is_none_or(|n| n != "report" && n != "base")
                {
                    pending.push(path);
                }
            }
        }
    }
    found.sort_by(|a, b| a.id.cmp(&b.id));
    found
}

fn read(new: &Path) -> Option<Figure> {
    let load = |name: &str| -> Option<Json> {
        serde_json::from_str(&std::fs::read_to_string(new.join(name)).ok()?).ok()
    };
    let benchmark = load("benchmark.json")?;
    let estimates = load("estimates.json")?;
    let median = &estimates["median"];
    Some(Figure {
        id: benchmark["full_id"].as_str()?.to_owned(),
        median: median["point_estimate"].as_f64()?,
        low: median["confidence_interval"]["lower_bound"].as_f64()?,
        high: median["confidence_interval"]["upper_bound"].as_f64()?,
    })
}

/// A duration in the unit that reads best.
pub(crate) fn human(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// A size in MiB.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / 1_048_576.0)
}

/// How many times longer (or larger) the peer's figure is than ours.
fn ratio(ours: f64, peer: f64) -> String {
    let r = peer / ours;
    if r >= 10.0 {
        format!("{r:.0}×")
    } else if r >= 0.1 {
        format!("{r:.1}×")
    } else {
        // Two significant digits, however small.
        let decimals = (-r.log10()).ceil().max(0.0) as usize + 1;
        format!("{r:.decimals$}×")
    }
}

/// The figures of the peer (CaveAgent), taken by the comparison script.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Peer {
    /// `CaveAgent 0.8.0 (Python 3.12.1)`.
    pub(crate) name: String,
    /// Benchmark id → median nanoseconds.
    pub(crate) times: BTreeMap<String, f64>,
    /// Figure id → resident bytes.
    pub(crate) memory: BTreeMap<String, u64>,
    /// Benchmark id → what differs in the peer's measurement.
    pub(crate) notes: BTreeMap<String, String>,
}

impl Peer {
    /// Reads the script's JSON Lines.
    pub(crate) fn parse(out: &str) -> Result<Peer, String> {
        let mut peer = Peer::default();
        for line in out.lines().filter(|l| !l.trim().is_empty()) {
            let value: Json = serde_json::from_str(line).map_err(|e| {
                format!("the comparison script printed a line that is not JSON ({e}): {line}")
            })?;
            if let Some(name) = value["peer"].as_str() {
                peer.name = format!(
                    "{name} {} (Python {})",
                    value["version"].as_str().unwrap_or("?"),
                    value["python"].as_str().unwrap_or("?")
                );
                continue;
            }
            let id = value["id"]
                .as_str()
                .ok_or_else(|| format!("a comparison line without an id: {line}"))?
                .to_owned();
            if let Some(ns) = value["median_ns"].as_f64() {
                peer.times.insert(id.clone(), ns);
            } else if let Some(bytes) = value["bytes"].as_u64() {
                peer.memory.insert(id.clone(), bytes);
            }
            if let Some(note) = value["note"].as_str().filter(|n| !n.is_empty()) {
                peer.notes.insert(id, note.to_owned());
            }
        }
        if peer.name.is_empty() {
            return Err("the comparison script did not say which CaveAgent it measured".to_owned());
        }
        Ok(peer)
    }
}

/// The report's Markdown: the timings, then resident memory when measured.
pub(crate) fn table(
    figures: &[Figure],
    memory: &BTreeMap<String, u64>,
    peer: Option<&Peer>,
) -> String {
    let mut out = String::new();
    match peer {
        None => out.push_str("| benchmark | median | 95% interval |\n|---|---:|---|\n"),
        Some(p) => {
            let _ = write!(
                out,
                "| benchmark | median | 95% interval | {} | ratio |\n|---|---:|---|---:|---:|\n",
                p.name
            );
        }
    }
    let mut notes = Vec::new();
    for f in figures {
        let _ = write!(
            out,
            "| {} | {} | {} – {} |",
            f.id,
            human(f.median),
            human(f.low),
            human(f.high)
        );
        if let Some(p) = peer {
            match p.times.get(&f.id) {
                Some(&ns) => {
                    let mark = if let Some(note) = p.notes.get(&f.id) {
                        notes.push(note.as_str());
                        format!(" [{}]", notes.len())
                    } else {
                        String::new()
                    };
                    let _ = write!(out, " {}{mark} | {} |", human(ns), ratio(f.median, ns));
                }
                None => out.push_str(" | |"),
            }
        }
        out.push('\n');
    }
    if !memory.is_empty() {
        out.push_str("\n| resident memory | ours |");
        if let Some(p) = peer {
            let _ = write!(out, " {} | ratio |\n|---|---:|---:|---:|\n", p.name);
        } else {
            out.push_str("\n|---|---:|\n");
        }
        for (id, &bytes) in memory {
            let _ = write!(out, "| {id} | {} |", mib(bytes));
            if let Some(p) = peer {
                match p.memory.get(id) {
                    Some(&theirs) => {
                        let _ = write!(
                            out,
                            " {} | {} |",
                            mib(theirs),
                            ratio(bytes as f64, theirs as f64)
                        );
                    }
                    None => out.push_str(" | |"),
                }
            }
            out.push('\n');
        }
    }
    for (i, note) in notes.iter().enumerate() {
        let _ = writeln!(out, "\n[{}] {note}", i + 1);
    }
    out
}

/// Which Python to compare with.
#[derive(Debug, PartialEq)]
pub(crate) enum Compare {
    /// No comparison.
    No,
    /// `CAVE_COMPARE_PYTHON`, else the first of `python3.14` … `python3.12`, `python3` on the
    /// `PATH` that imports `cave_agent`.
    Find,
    /// This interpreter.
    With(PathBuf),
}

impl Compare {
    /// From the command line: `--compare-python [PYTHON]`.
    pub(crate) fn from_args(args: &[String]) -> Compare {
        match args.iter().position(|a| a == "--compare-python") {
            None => Compare::No,
            Some(i) => match args.get(i + 1).filter(|a| !a.starts_with("--")) {
                Some(path) => Compare::With(PathBuf::from(path)),
                None => Compare::Find,
            },
        }
    }
}

const HOW_TO_COMPARE: &str = "give a Python >= 3.12 with CaveAgent: `cargo xtask bench --compare-python /path/to/python` or CAVE_COMPARE_PYTHON=/path/to/python (for example: python3.12 -m venv /tmp/caveagent && /tmp/caveagent/bin/pip install 'cave-agent[ipykernel]==0.8.0')";

/// Returns true if and only if `python` is >= 3.12 and imports `cave_agent`.
fn has_caveagent(python: &Path) -> bool {
    Command::new(python)
        .args([
            "-c",
            "import sys, cave_agent; sys.exit(0 if sys.version_info >= (3, 12) else 1)",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The interpreter to compare with, or why there is none.
pub(crate) fn peer_python(compare: &Compare, env: Option<&str>) -> Result<PathBuf, String> {
    let explicit = match compare {
        Compare::No => return Err("no comparison asked".to_owned()),
        Compare::With(path) => Some(path.clone()),
        Compare::Find => env.filter(|e| !e.is_empty()).map(PathBuf::from),
    };
    if let Some(python) = explicit {
        return if has_caveagent(&python) {
            Ok(python)
        } else {
            Err(format!(
                "{} is not a Python >= 3.12 that can import cave_agent; {HOW_TO_COMPARE}",
                python.display()
            ))
        };
    }
    ["python3.14", "python3.13", "python3.12", "python3"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| has_caveagent(p))
        .ok_or_else(|| format!("no Python >= 3.12 with CaveAgent on the PATH; {HOW_TO_COMPARE}"))
}

/// Runs the comparison script with `python`.
fn peer_figures(root: &Path, python: &Path, quick: bool) -> Result<Peer, String> {
    let script = root.join("xtask").join("compare").join("caveagent.py");
    println!("xtask: measuring CaveAgent with {}", python.display());
    let mut command = Command::new(python);
    command.arg(&script);
    if quick {
        command.arg("--quick");
    }
    let out = command
        .output()
        .map_err(|e| format!("could not run {}: {e}", python.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
        return Err(format!(
            "the comparison script failed ({}):\n{}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    Peer::parse(&stdout)
}

/// The tables measurements write under `target/tmp` (cave-agent's `benches/load.rs` and
/// `benches/code_mode.rs`, cave-runtime-kernel's `benches/jupyter.rs` and `benches/fork.rs`),
/// with their titles in the report.
const LOAD_TABLES: [(&str, &str); 4] = [
    ("fork-table.md", "Branches of a live session (fork)"),
    (
        "code-mode-table.md",
        "Code mode at scale: an MCP server of 500 tools",
    ),
    (
        "load-table.md",
        "Load: concurrent agent sessions on the kernel runtime",
    ),
    (
        "jupyter-load-table.md",
        "Load: concurrent sessions through one Kernel Gateway",
    ),
];

/// Runs the benchmarks and writes the report.
pub(crate) fn run(root: &Path, quick: bool, compare: &Compare) -> Result<PathBuf, String> {
    // Decided first, so that a wrong path fails before the long run.
    let python = match compare {
        Compare::No => None,
        _ => match peer_python(
            compare,
            std::env::var("CAVE_COMPARE_PYTHON").ok().as_deref(),
        ) {
            Ok(python) => Some(python),
            Err(why) if matches!(compare, Compare::With(_)) => return Err(why),
            Err(why) => {
                println!("xtask: no comparison: {why}; our figures alone follow");
                None
            }
        },
    };
    // Bench targets only: library harnesses reject criterion's options.
    let mut args = vec![
        "bench",
        "--workspace",
        "--all-features",
        "--bench",
        "*",
        "--",
    ];
    if quick {
        args.push("--quick");
    }
    // The Jupyter transport's benchmark runs against a local Kernel Gateway (skipped without).
    let mut bench_env = crate::test_env::jupyter(root);
    // The code-mode benchmark's server of 500 tools runs on the MCP SDK.
    bench_env.extend(crate::test_env::mcp(root));
    // The fork benchmark's pandas rows need an interpreter with pandas.
    if let Some(python) = crate::test_env::pandas_python(root) {
        bench_env.push((
            "CAVE_BENCH_PANDAS_PYTHON".to_owned(),
            python.display().to_string(),
        ));
    }
    // The kernel's cold start also runs on the peer's interpreter, for a row like for like
    // (absolute, as benches run in their crate's directory; not resolved, so a virtualenv's
    // interpreter stays in its environment).
    if let Some(python) = &python {
        let python = std::path::absolute(python).unwrap_or_else(|_| python.clone());
        bench_env.push((
            "CAVE_BENCH_PEER_PYTHON".to_owned(),
            python.display().to_string(),
        ));
    }
    let env: Vec<(&str, &str)> = bench_env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    // A table left by an earlier run is not this run's (a bench skipped without its gateway).
    for stale in LOAD_TABLES.iter().map(|(file, _)| file) {
        let _ = std::fs::remove_file(root.join("target").join("tmp").join(stale));
    }
    crate::cargo(&args, &env)?;
    let figures = figures(&root.join("target").join("criterion"));
    if figures.is_empty() {
        return Err("criterion left no estimates under target/criterion".to_owned());
    }
    let memory: BTreeMap<String, u64> =
        std::fs::read_to_string(root.join("target").join("tmp").join("memory-figures.json"))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
    let peer = match python {
        Some(python) => Some(peer_figures(root, &python, quick)?),
        None => None,
    };
    let report = format!(
        "# Benchmarks\n\nMedians of `cargo xtask bench{}` on this machine ({} cores); see docs/PERFORMANCE.md.{}\n\n{}",
        if quick { " --quick" } else { "" },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if peer.is_some() {
            " Ratios are the peer's figure over ours (above 1×: we are faster or smaller)."
        } else {
            ""
        },
        table(&figures, &memory, peer.as_ref())
    );
    let load: String = LOAD_TABLES
        .iter()
        .filter_map(|(file, title)| {
            let table = std::fs::read_to_string(root.join("target").join("tmp").join(file)).ok()?;
            Some(format!("\n\n## {title}\n\n{table}"))
        })
        .collect();
    let current = Snapshot::of(&figures, &memory);
    let history = history_file(quick);
    let warnings = match history.as_deref().and_then(Snapshot::load) {
        Some(previous) => regressions(&previous, &current),
        None => Vec::new(),
    };
    for warning in &warnings {
        println!("warning: {warning}");
    }
    if let Some(history) = &history
        && let Err(e) = current.save(history)
    {
        println!("xtask: this run's figures were not kept for the next ({e})");
    }
    let warned: String = if warnings.is_empty() {
        String::new()
    } else {
        let lines: String = warnings.iter().map(|w| format!("- {w}\n")).collect();
        format!("\n\n## More than {REGRESSION_PERCENT} % worse than the last run here\n\n{lines}")
    };
    let report = format!("{report}{load}{warned}");
    let path = root.join("target").join("bench-report.md");
    std::fs::write(&path, &report)
        .map_err(|e| format!("could not write {}: {e}", path.display()))?;
    println!("{report}");
    Ok(path)
}

/// How much worse (in percent) a figure may get from one run to the next on the same machine
/// before the run says so.
const REGRESSION_PERCENT: u32 = 25;

/// The medians of one run, kept for the next run on the same machine to compare with.
#[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Snapshot {
    /// Benchmark id → median nanoseconds.
    times: BTreeMap<String, f64>,
    /// Figure id → resident bytes.
    memory: BTreeMap<String, u64>,
}

impl Snapshot {
    fn of(figures: &[Figure], memory: &BTreeMap<String, u64>) -> Self {
        Self {
            times: figures.iter().map(|f| (f.id.clone(), f.median)).collect(),
            memory: memory.clone(),
        }
    }

    fn load(path: &Path) -> Option<Self> {
        serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
    }

    fn save(&self, path: &Path) -> Result<(), String> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        // Whole or not at all: a run stopped while writing leaves the last good one.
        let partial = path.with_extension("json.partial");
        std::fs::write(&partial, text).map_err(|e| e.to_string())?;
        std::fs::rename(&partial, path).map_err(|e| e.to_string())
    }
}

/// Where this machine's last figures are kept: outside the repository, so that CI's fresh
/// clones on one machine see each other's (`CAVE_BENCH_HISTORY` names a directory instead of
/// `~/.cache/cave-agent`). One file per machine (processor and cores) and per kind of run
/// (`--quick` or full); `None` without a home.
fn history_file(quick: bool) -> Option<PathBuf> {
    let dir = match std::env::var_os("CAVE_BENCH_HISTORY") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?
            .join("cave-agent"),
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let machine: String = format!("{cpu}-{cores}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let kind = if quick { "quick" } else { "full" };
    Some(dir.join(format!("bench-last-{kind}-{machine}.json")))
}

/// The figures of `current` more than [`REGRESSION_PERCENT`] worse than in `previous`, one
/// line each (time and memory alike: larger is worse).
pub(crate) fn regressions(previous: &Snapshot, current: &Snapshot) -> Vec<String> {
    let limit = 1.0 + f64::from(REGRESSION_PERCENT) / 100.0;
    let mut lines = Vec::new();
    for (id, &now) in &current.times {
        if let Some(&before) = previous.times.get(id)
            && before > 0.0
            && now > before * limit
        {
            lines.push(format!(
                "{id}: {} → {} ({:+.0} %) since the last run on this machine",
                human(before),
                human(now),
                (now / before - 1.0) * 100.0
            ));
        }
    }
    for (id, &now) in &current.memory {
        if let Some(&before) = previous.memory.get(id)
            && before > 0
            && now as f64 > before as f64 * limit
        {
            lines.push(format!(
                "{id}: {} → {} ({:+.0} %) since the last run on this machine",
                mib(before),
                mib(now),
                (now as f64 / before as f64 - 1.0) * 100.0
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_more_than_a_quarter_worse_are_named() {
        let snapshot = |times: &[(&str, f64)], memory: &[(&str, u64)]| Snapshot {
            times: times.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            memory: memory.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        };
        let before = snapshot(
            &[("a", 1000.0), ("b", 1000.0), ("c", 1000.0), ("gone", 5.0)],
            &[("memory/host", 100 << 20)],
        );
        let after = snapshot(
            &[("a", 1250.0), ("b", 1300.0), ("c", 500.0), ("new", 9e9)],
            &[("memory/host", 130 << 20)],
        );
        let lines = regressions(&before, &after);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(
            lines[0],
            "b: 1.00 µs → 1.30 µs (+30 %) since the last run on this machine"
        );
        assert!(
            lines[1].starts_with("memory/host: 100.0 MiB → 130.0 MiB (+30 %)"),
            "{lines:?}"
        );
        // Kept and read back whole.
        let dir = std::env::temp_dir().join(format!("xtask-history-{}", std::process::id()));
        let path = dir.join("bench-last.json");
        after.save(&path).unwrap();
        assert_eq!(Snapshot::load(&path), Some(after));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn criterion_estimates_become_a_table() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-{}", std::process::id()));
        let new = dir.join("kernel/execute/new");
        std::fs::create_dir_all(&new).unwrap();
        std::fs::write(
            new.join("benchmark.json"),
            r#"{"full_id":"kernel/execute"}"#,
        )
        .unwrap();
        std::fs::write(
            new.join("estimates.json"),
            r#"{"median":{"point_estimate":283000.0,"confidence_interval":{"lower_bound":270000.0,"upper_bound":300000.0}}}"#,
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("kernel/execute/base")).unwrap();
        let figures = figures(&dir);
        assert_eq!(figures.len(), 1);
        assert_eq!(
            table(&figures, &BTreeMap::new(), None),
            "| benchmark | median | 95% interval |\n|---|---:|---|\n| kernel/execute | 283.00 µs | 270.00 µs – 300.00 µs |\n"
        );
        assert_eq!(human(2.5e9), "2.50 s");
        assert_eq!(human(750.0), "750 ns");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn peer_figures_stand_beside_ours_with_ratios_and_notes() {
        let peer = Peer::parse(concat!(
            "{\"peer\": \"CaveAgent\", \"version\": \"0.8.0\", \"python\": \"3.12.1\"}\n",
            "{\"id\": \"kernel/execute\", \"median_ns\": 6900000.0, \"samples\": 30, \"note\": \"\"}\n",
            "{\"id\": \"million\", \"median_ns\": 33000, \"samples\": 3, \"note\": \"no conversion\"}\n",
            "{\"id\": \"memory/host\", \"bytes\": 41943040}\n",
        ))
        .unwrap();
        assert_eq!(peer.name, "CaveAgent 0.8.0 (Python 3.12.1)");
        let ours = [
            Figure {
                id: "kernel/execute".into(),
                median: 300_000.0,
                low: 290_000.0,
                high: 310_000.0,
            },
            Figure {
                id: "million".into(),
                median: 100e6,
                low: 99e6,
                high: 101e6,
            },
            Figure {
                id: "only_ours".into(),
                median: 1000.0,
                low: 900.0,
                high: 1100.0,
            },
        ];
        let memory = BTreeMap::from([("memory/host".to_owned(), 6 * 1_048_576)]);
        let table = table(&ours, &memory, Some(&peer));
        assert!(
            table
                .contains("| kernel/execute | 300.00 µs | 290.00 µs – 310.00 µs | 6.90 ms | 23× |"),
            "{table}"
        );
        assert!(
            table.contains(
                "| million | 100.00 ms | 99.00 ms – 101.00 ms | 33.00 µs [1] | 0.00033× |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| only_ours | 1.00 µs | 900 ns – 1.10 µs | | |"),
            "{table}"
        );
        assert!(
            table.contains("| memory/host | 6.0 MiB | 40.0 MiB | 6.7× |"),
            "{table}"
        );
        assert!(table.contains("[1] no conversion"), "{table}");
        assert!(Peer::parse("{\"id\": \"x\", \"median_ns\": 1}").is_err());
        assert!(Peer::parse("not json").is_err());
    }

    #[test]
    fn the_comparison_is_asked_on_the_command_line() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            Compare::from_args(&args(&["bench", "--quick"])),
            Compare::No
        );
        assert_eq!(
            Compare::from_args(&args(&["bench", "--compare-python", "--quick"])),
            Compare::Find
        );
        assert_eq!(
            Compare::from_args(&args(&["bench", "--compare-python", "/opt/py/bin/python"])),
            Compare::With(PathBuf::from("/opt/py/bin/python"))
        );
        // A path that is no interpreter is refused with the way to give one.
        let missing = PathBuf::from("/nonexistent/python3.12");
        let err = peer_python(&Compare::With(missing), None).unwrap_err();
        assert!(
            err.contains("/nonexistent/python3.12") && err.contains("CAVE_COMPARE_PYTHON"),
            "{err}"
        );
        let err = peer_python(&Compare::Find, Some("/nonexistent/python")).unwrap_err();
        assert!(err.contains("pip install"), "{err}");
    }
}

//! `cargo xtask bench [--quick]`: every crate's criterion benchmarks, then one Markdown table
//! of their medians and 95% intervals (`target/bench-report.md`, also printed).

use serde_json::Value as Json;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

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

/// The report's Markdown.
pub(crate) fn table(figures: &[Figure]) -> String {
    let mut out = String::from("| benchmark | median | 95% interval |\n|---|---:|---|\n");
    for f in figures {
        let _ = writeln!(
            out,
            "| {} | {} | {} – {} |",
            f.id,
            human(f.median),
            human(f.low),
            human(f.high)
        );
    }
    out
}

/// Runs the benchmarks and writes the report.
pub(crate) fn run(root: &Path, quick: bool) -> Result<PathBuf, String> {
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
    crate::cargo(&args, &[])?;
    let figures = figures(&root.join("target").join("criterion"));
    if figures.is_empty() {
        return Err("criterion left no estimates under target/criterion".to_owned());
    }
    let report = format!(
        "# Benchmarks\n\nMedians of `cargo xtask bench{}` on this machine ({} cores); see docs/PERFORMANCE.md.\n\n{}",
        if quick { " --quick" } else { "" },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        table(&figures)
    );
    let path = root.join("target").join("bench-report.md");
    std::fs::write(&path, &report)
        .map_err(|e| format!("could not write {}: {e}", path.display()))?;
    println!("{report}");
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

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
            table(&figures),
            "| benchmark | median | 95% interval |\n|---|---:|---|\n| kernel/execute | 283.00 µs | 270.00 µs – 300.00 µs |\n"
        );
        assert_eq!(human(2.5e9), "2.50 s");
        assert_eq!(human(750.0), "750 ns");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

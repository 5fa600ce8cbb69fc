//! What `cargo xtask test` says before the tests run: what this machine lacks of what the
//! kernel runtime's isolation uses (the checks `cave doctor` makes, read from its "Missing
//! here" section) and which tests skip for it (found in the sources: each test that asks
//! `Need::…`), so that a run on a machine that gives less is not read as a pass of everything.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Prints the report, from the `cave` binary the test build made.
pub(crate) fn report(root: &Path, cave: &Path) {
    let doctor = match Command::new(cave).arg("doctor").output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
        Err(e) => {
            println!("xtask: could not run {} doctor: {e}", cave.display());
            return;
        }
    };
    let missing = missing(&doctor);
    if missing.is_empty() {
        println!(
            "== this machine has everything the tests need (cave doctor: missing here: nothing)"
        );
        return;
    }
    let names = need_names(root);
    let users = tests_by_need(root);
    println!("== this machine lacks what some tests need (cave doctor):");
    for line in missing {
        println!("  {line}");
        let variant = names
            .iter()
            .find(|(_, name)| line.starts_with(&format!("{name}:")))
            .map(|(variant, _)| variant.as_str());
        let tests = variant.and_then(|v| users.iter().find(|(n, _)| n == v));
        match tests {
            Some((_, tests)) => println!(
                "    tests that may skip for it{}: {}",
                if std::env::var_os("CI").is_some() {
                    " (under CI they fail instead)"
                } else {
                    ""
                },
                tests.join(", ")
            ),
            None => println!("    no test skips for it"),
        }
    }
}

/// The lines of doctor's "Missing here" section.
fn missing(doctor: &str) -> Vec<String> {
    doctor
        .lines()
        .skip_while(|l| !l.starts_with("Missing here"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.trim().to_owned())
        .collect()
}

/// `(variant, name)` of each `Need`, read from its source (`Need::X => "name",`).
fn need_names(root: &Path) -> Vec<(String, String)> {
    let source =
        std::fs::read_to_string(root.join("cave-runtime-kernel/src/need.rs")).unwrap_or_default();
    source
        .lines()
        .filter_map(|l| {
            let (variant, rest) = l.trim().strip_prefix("Need::")?.split_once(" => \"")?;
            Some((variant.to_owned(), rest.split_once('"')?.0.to_owned()))
        })
        .collect()
}

/// For each `Need` variant, the tests (`file::function`) whose body names it.
fn tests_by_need(root: &Path) -> Vec<(String, Vec<String>)> {
    let mut found: Vec<(String, Vec<String>)> = Vec::new();
    let mut add = |variant: &str, test: String| match found.iter_mut().find(|(v, _)| v == variant) {
        Some((_, tests)) if !tests.contains(&test) => tests.push(test),
        Some(_) => {}
        None => found.push((variant.to_owned(), vec![test])),
    };
    for file in test_files(root) {
        let Ok(source) = std::fs::read_to_string(&file) else {
            continue;
        };
        let stem = file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        // Each function of the file: whether it is a test, the needs it names, its lines (a
        // test that calls a helper naming a need may skip for it too).
        let mut functions: Vec<(String, bool, Vec<String>, Vec<&str>)> = Vec::new();
        let mut attributed = false;
        for line in source.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("#[test]") || trimmed.starts_with("#[tokio::test") {
                attributed = true;
            }
            if let Some(name) = function_name(line) {
                functions.push((
                    name,
                    std::mem::take(&mut attributed),
                    Vec::new(),
                    Vec::new(),
                ));
            }
            let Some((_, _, needs, lines)) = functions.last_mut() else {
                continue;
            };
            lines.push(line);
            let mut rest = line;
            while let Some(at) = rest.find("Need::") {
                rest = &rest[at + "Need::".len()..];
                let variant: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric())
                    .collect();
                // A variant (`Need::Namespaces`), not a constant or a method (`Need::ALL`,
                // `Need::lacking`).
                let variant_like = variant.starts_with(|c: char| c.is_ascii_uppercase())
                    && variant.chars().any(|c| c.is_ascii_lowercase());
                if variant_like && !needs.contains(&variant) {
                    needs.push(variant);
                }
            }
        }
        let helpers: Vec<(&String, &Vec<String>)> = functions
            .iter()
            .filter(|(_, test, needs, _)| !test && !needs.is_empty())
            .map(|(name, _, needs, _)| (name, needs))
            .collect();
        for (name, test, needs, lines) in &functions {
            if !test {
                continue;
            }
            let test = format!("{stem}::{name}");
            for variant in needs {
                add(variant, test.clone());
            }
            for (helper, needs) in &helpers {
                let call = format!("{helper}(");
                if lines.iter().any(|l| l.contains(&call)) {
                    for variant in needs.iter() {
                        add(variant, test.clone());
                    }
                }
            }
        }
    }
    found
}

/// The name of the function a line declares, if it declares one.
fn function_name(line: &str) -> Option<String> {
    let rest = line.trim_start();
    let rest = rest.strip_prefix("pub ").unwrap_or(rest);
    let rest = rest.strip_prefix("async ").unwrap_or(rest);
    let name: String = rest
        .strip_prefix("fn ")?
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// The integration tests of every crate (`*/tests/**/*.rs`), walked with a list.
fn test_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("tests"))
        .filter(|p| p.is_dir())
        .collect();
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_doctor_says_is_missing() {
        let doctor = "Python: /usr/bin/python3\nMissing here (the layers above say what holds without it):\n  control groups: none here\n  namespaces: refused\n";
        assert_eq!(
            missing(doctor),
            ["control groups: none here", "namespaces: refused"]
        );
        assert!(missing("Missing here: nothing\n").is_empty());
    }

    #[test]
    fn every_need_is_named_and_asked_for_by_some_test() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let names = need_names(root);
        assert!(names.len() >= 4, "{names:?}");
        let users = tests_by_need(root);
        let asks = |variant: &str, test: &str| {
            users
                .iter()
                .any(|(v, tests)| v == variant && tests.iter().any(|t| t == test))
        };
        assert!(
            asks(
                "ControlGroups",
                "faults::a_fork_bomb_stops_at_the_process_limit"
            ),
            "{users:?}"
        );
        // A test that asks through a helper is listed; the helper, not a test, is not.
        assert!(
            asks(
                "Namespaces",
                "egress::only_listed_hosts_are_reached_through_the_proxy"
            ) && !asks("Namespaces", "egress::lacking_every_route"),
            "{users:?}"
        );
        for (variant, _) in &users {
            assert!(
                names.iter().any(|(v, _)| v == variant),
                "Need::{variant} is asked for but not named in need.rs"
            );
        }
    }
}

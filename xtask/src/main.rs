//! Project chores: `cargo xtask test` (the workspace tests, with the Python packages they
//! need; `--pythons`: the kernel runtime's tests with every Python 3.9+ found; `--crates`:
//! each library crate alone, and packaged), `cargo xtask bench`, `cargo xtask test-live` (the live suite against a real model),
//! `cargo xtask local-llm start|stop|status` (a local one), `cargo xtask soak [N]` (N random inputs through the fence
//! parser, then N random model replies through the whole agent), `cargo xtask fuzz [N]` (N
//! mutated inputs through each decoder of bytes another party sends: the kernel child's frames,
//! a Jupyter server's messages, a model server's event stream). Tidy checks are its tests
//! (`cargo test -p xtask`), run by the workspace test command. The whole test run first says
//! what this machine lacks and which tests skip for it (`machine.rs`).

mod bench;
mod bounded;
mod crates;
mod live;
mod local_llm;
mod machine;
#[cfg(test)]
mod module_graph;
mod pythons;
mod test_env;

use std::process::{Command, ExitCode};
use std::time::Duration;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .to_owned();
    let result = match args.first().map(String::as_str) {
        // Each interpreter's run bounded: a hang there fails at once, saying what hung.
        Some("test") if args.iter().any(|a| a == "--pythons") => {
            pythons::run(cargo_within(Duration::from_secs(20 * 60)))
        }
        Some("test") if args.iter().any(|a| a == "--crates") => {
            test_env::prepare(&root).and_then(|mut env| {
                env.extend(test_env::mcp(&root));
                env.extend(test_env::mcp_npm(&root));
                let env: Vec<(&str, &str)> =
                    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                crates::run(&root, cargo, &env)
            })
        }
        Some("test") => test_env::prepare(&root).and_then(|mut env| {
            env.extend(test_env::litellm(&root));
            env.extend(test_env::jupyter(&root));
            env.extend(test_env::enterprise_gateway(&root));
            env.extend(test_env::phoenix(&root));
            env.extend(test_env::mcp(&root));
            env.extend(test_env::mcp_npm(&root));
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let narrowed = args[1..]
                .iter()
                .take_while(|a| *a != "--")
                .any(|a| ["-p", "--package", "--test", "--lib", "--doc"].contains(&a.as_str()));
            if !narrowed {
                // The whole run: built first, so that what this machine lacks, and which
                // tests skip for it, is said before any test runs.
                let mut build = test_command(&[]);
                build.push("--no-run");
                cargo(&build, &env)?;
                machine::report(&root, &target_dir(&root).join("debug/cave"));
            }
            cargo(&test_command(&args[1..]), &env)
        }),
        Some("bench") => {
            let quick = args.iter().any(|a| a == "--quick");
            bench::run(&root, quick, &bench::Compare::from_args(&args)).map(drop)
        }
        Some("test-live") if args.iter().any(|a| a == "--local") => live::run_local(&root),
        Some("test-live") => live::provider(&args).and_then(|provider| live::run(&root, provider)),
        Some("local-llm") => local_llm::run(&root, args.get(1).map(String::as_str)),
        Some("soak") => {
            let cases = args.get(1).cloned().unwrap_or_else(|| "1000000".to_owned());
            cargo(
                &[
                    "test",
                    "--release",
                    "-p",
                    "cave-core",
                    "--test",
                    "tests",
                    "soak_random_inputs",
                ],
                &[("CAVE_PARSER_SOAK", cases.as_str())],
            )
            .and_then(|()| {
                // The whole agent, as `cave` wires it, under random model output.
                cargo(
                    &[
                        "test",
                        "--release",
                        "-p",
                        "cave-cli",
                        "--test",
                        "tests",
                        "random_model_output_never_breaks_a_run",
                        "--",
                        "--nocapture",
                    ],
                    &[("CAVE_AGENT_SOAK", cases.as_str())],
                )
            })
        }
        Some("fuzz") => {
            let cases = args.get(1).cloned().unwrap_or_else(|| "1000000".to_owned());
            if cases.parse::<u64>().is_err() {
                Err(format!("fuzz takes a number of cases, not {cases:?}"))
            } else {
                // Each target is a test that calls `cave_testing::fuzz::soak`; the suite
                // runs them with the short default.
                cargo(
                    &[
                        "test",
                        "--release",
                        "-p",
                        "cave-runtime-kernel",
                        "-p",
                        "cave-models",
                        "--all-features",
                        "--lib",
                        "fuzz_",
                        "--",
                        "--nocapture",
                        "--test-threads",
                        "1",
                    ],
                    &[("CAVE_FUZZ_CASES", cases.as_str())],
                )
            }
        }
        _ => {
            eprintln!(
                "usage: cargo xtask test [CARGO TEST ARGS] | cargo xtask test --pythons | cargo xtask test --crates | cargo xtask bench [--quick] [--compare-python [PYTHON]] | cargo xtask test-live [--provider openai|litellm | --local] | cargo xtask local-llm start|stop|status | cargo xtask soak [CASES] | cargo xtask fuzz [CASES]"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo test` over the workspace with every feature, then the caller's arguments; a flag
/// the caller gives too is not repeated (cargo refuses `--all-features` twice), and `-p`
/// narrows the run to the packages named.
fn test_command(extra: &[String]) -> Vec<&str> {
    let given = |flag: &str| extra.iter().take_while(|a| *a != "--").any(|a| a == flag);
    let mut command = vec!["test"];
    if !given("--workspace") && !given("-p") && !given("--package") {
        command.push("--workspace");
    }
    if !given("--all-features") {
        command.push("--all-features");
    }
    command.extend(extra.iter().map(String::as_str));
    command
}

/// The workspace's crates, as the design card lays them out: the directories at the
/// repository's root named `cave-*` that hold a `Cargo.toml`, sorted.
#[cfg(test)]
fn crate_dirs(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .filter(|dir| {
            dir.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("cave-"))
                && dir.join("Cargo.toml").is_file()
        })
        .collect();
    dirs.sort();
    dirs
}

#[cfg(test)]
mod test_command_tests {
    use super::test_command;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_are_added_once() {
        assert_eq!(test_command(&[]), ["test", "--workspace", "--all-features"]);
        assert_eq!(
            test_command(&args(&["-p", "cave-agent", "--all-features", "--examples"])),
            ["test", "-p", "cave-agent", "--all-features", "--examples"]
        );
        // After `--`, arguments are the test binary's.
        assert_eq!(
            test_command(&args(&["--", "--all-features"])),
            [
                "test",
                "--workspace",
                "--all-features",
                "--",
                "--all-features"
            ]
        );
    }
}

/// Where cargo builds: `CARGO_TARGET_DIR` when set, else the workspace's `target/`.
fn target_dir(root: &std::path::Path) -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

fn cargo(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let status = cargo_command(args, env)
        .status()
        .map_err(|e| format!("could not run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cargo {} failed: {status}", args.join(" ")))
    }
}

/// `cargo` with its wall time bounded: past `bound`, it and what it started are killed.
fn cargo_within(bound: Duration) -> impl Fn(&[&str], &[(&str, &str)]) -> Result<(), String> {
    move |args, env| {
        let what = format!("cargo {}", args.join(" "));
        bounded::run(cargo_command(args, env), &what, bound)
    }
}

/// `cargo ARGS` (the cargo that runs xtask) with `env` added.
fn cargo_command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    command.args(args).envs(env.iter().copied());
    command
}

#[cfg(test)]
mod tidy {
    //! The architecture's invariants, checked from `cargo metadata` and the sources.

    use serde_json::Value;
    use std::path::{Path, PathBuf};

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_owned()
    }

    /// `(package name, [(dependency name, kind)])` for the workspace's own packages.
    fn packages() -> Vec<(String, Vec<(String, String)>)> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let out = std::process::Command::new(cargo)
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--offline",
            ])
            .current_dir(root())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
        meta["packages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let deps = p["dependencies"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| {
                        (
                            d["name"].as_str().unwrap().to_owned(),
                            d["kind"].as_str().unwrap_or("normal").to_owned(),
                        )
                    })
                    .collect();
                (p["name"].as_str().unwrap().to_owned(), deps)
            })
            .collect()
    }

    /// Crates allowed to see every implementation.
    const WIRING: &[&str] = &["cave-agent", "cave-cli", "xtask"];

    /// cave-core depends on no other cave crate; its own tests use the test kit and a cell's
    /// output as the runtimes collect it, which depend on it.
    #[test]
    fn core_depends_on_no_other_cave_crate() {
        let packages = packages();
        let (_, deps) = packages.iter().find(|(n, _)| n == "cave-core").unwrap();
        let cave: Vec<_> = deps
            .iter()
            .filter(|(d, kind)| {
                d.starts_with("cave-")
                    && !(["cave-testing", "cave-cell"].contains(&d.as_str()) && kind == "dev")
            })
            .collect();
        assert!(cave.is_empty(), "cave-core depends on {cave:?}");
    }

    #[test]
    fn implementations_depend_only_on_core() {
        for (name, deps) in packages() {
            if WIRING.contains(&name.as_str()) {
                continue;
            }
            for (dep, kind) in deps {
                // The core, and the support crates that depend on it alone (or on nothing of
                // ours): what every runtime does around a cell, Rust types as Python types,
                // the interpreter's data, the egress proxy.
                let allowed = !dep.starts_with("cave-")
                    || [
                        "cave-core",
                        "cave-cell",
                        "cave-pytype",
                        "cave-python",
                        "cave-egress",
                    ]
                    .contains(&dep.as_str())
                    || kind == "dev";
                assert!(
                    allowed,
                    "{name} depends on {dep} ({kind}): implementations meet only in the facade and the CLI"
                );
            }
        }
    }

    #[test]
    fn anyhow_only_in_binaries() {
        for (name, deps) in packages() {
            let uses_anyhow = deps.iter().any(|(d, kind)| d == "anyhow" && kind != "dev");
            assert!(
                !uses_anyhow || WIRING.contains(&name.as_str()),
                "{name} is a library and uses anyhow"
            );
        }
    }

    #[test]
    fn every_crate_readme_has_an_example_that_is_compiled() {
        for dir in crate::crate_dirs(&root()) {
            let readme = std::fs::read_to_string(dir.join("README.md"))
                .unwrap_or_else(|_| panic!("{} has no README.md", dir.display()));
            assert!(
                readme.contains("```rust"),
                "{}/README.md has no Rust example",
                dir.display()
            );
            let lib = std::fs::read_to_string(dir.join("src/lib.rs")).unwrap_or_default();
            assert!(
                lib.contains(r#"include_str!("../README.md")"#),
                "{}: the README is not compiled as a doctest",
                dir.display()
            );
        }
    }

    #[test]
    fn library_crates_document_everything() {
        for dir in crate::crate_dirs(&root()) {
            let lib = dir.join("src/lib.rs");
            let Ok(source) = std::fs::read_to_string(&lib) else {
                continue;
            };
            assert!(
                source.contains("#![deny(missing_docs)]"),
                "{} lacks #![deny(missing_docs)]",
                lib.display()
            );
            assert!(
                source.starts_with("//!") || source.starts_with("#![doc"),
                "{} has no crate doc",
                lib.display()
            );
        }
    }

    /// The files of `dir` (recursively) whose name ends with `suffix`.
    fn files(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                files(&path, suffix, out);
            } else if path.to_string_lossy().ends_with(suffix) {
                out.push(path);
            }
        }
    }

    /// ARCHITECTURE.md: the environment is read in exactly three places.
    #[test]
    fn the_environment_is_read_only_where_the_architecture_says() {
        const ALLOWED: &[&str] = &[
            "cave-cli/src/config.rs",
            "cave-testing/src/fuzz.rs",
            "cave-testing/src/phoenix.rs",
            "cave-testing/src/machine.rs",
            "cave-testing/src/contract/display.rs",
            "cave-models/src/config.rs",
            "cave-python/src/report.rs",
            "cave-python/src/interpreter.rs",
            "cave-runtime-kernel/src/environment.rs",
            "cave-otel/src/lib.rs",
        ];
        let mut sources = Vec::new();
        for dir in crate::crate_dirs(&root()) {
            files(&dir.join("src"), ".rs", &mut sources);
        }
        assert!(sources.len() > 20, "found the sources");
        for path in sources {
            let source = std::fs::read_to_string(&path).unwrap();
            let relative = path
                .strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .into_owned();
            // Code only: documentation may show a user reading a variable.
            let reads = source
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .any(|line| {
                    ["env::var(", "env::var_os(", "env::vars(", "env = \""]
                        .iter()
                        .any(|needle| line.contains(needle))
                });
            assert!(
                !reads || ALLOWED.contains(&relative.as_str()),
                "{relative} reads the environment; ARCHITECTURE.md allows it only in {ALLOWED:?}"
            );
        }
    }

    /// Every file or directory ARCHITECTURE.md names exists: a path in backticks that ends in
    /// a file extension or `/` is looked up from the root and, under a
    /// crate's heading, from the crate and its `src/`, `tests/`, `benches/`, `examples/` and
    /// `python/`; a bare file name (`turn.rs`) must be a file of the crate under whose heading
    /// it stands, or of any crate outside those headings.
    #[test]
    fn every_path_the_architecture_names_exists() {
        const EXTENSIONS: &[&str] = &[".rs", ".py", ".md", ".toml", ".json", ".jsonl", ".yaml"];
        let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
        let mut section: Option<PathBuf> = None;
        let mut missing = Vec::new();
        let mut checked = 0;
        for line in text.lines() {
            if let Some(heading) = line.strip_prefix("### `") {
                section = heading
                    .split('`')
                    .next()
                    .map(|dir| root().join(dir))
                    .filter(|dir| dir.is_dir());
            } else if line.starts_with("## ") {
                section = None;
            }
            for (i, token) in line.split('`').enumerate() {
                // Generated files (`target/`) and places outside the repository (`../`) are
                // not the repository's to hold.
                let is_path = i % 2 == 1
                    && !token.contains(' ')
                    && !token.starts_with('/')
                    && !token.starts_with("target/")
                    && !token.starts_with("../")
                    && (token.ends_with('/') || EXTENSIONS.iter().any(|e| token.ends_with(e)));
                if !is_path {
                    continue;
                }
                checked += 1;
                let mut bases = vec![root()];
                if let Some(dir) = &section {
                    bases.push(dir.clone());
                    for sub in ["src", "tests", "benches", "examples", "python"] {
                        bases.push(dir.join(sub));
                    }
                }
                let found = if token.contains('/') {
                    bases.iter().any(|base| base.join(token).exists())
                } else {
                    match &section {
                        Some(dir) => has_file_named(dir, token),
                        None => crate::crate_dirs(&root())
                            .iter()
                            .any(|dir| has_file_named(dir, token)),
                    }
                };
                if !found {
                    missing.push(format!("{token} (line: {})", line.trim()));
                }
            }
        }
        assert!(checked > 50, "found the paths ({checked})");
        assert!(
            missing.is_empty(),
            "ARCHITECTURE.md names paths that do not exist:\n{}",
            missing.join("\n")
        );
    }

    /// Whether a file called `name` is in `dir` or below (`target` aside).
    fn has_file_named(dir: &Path, name: &str) -> bool {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return false;
        };
        entries.flatten().any(|entry| {
            let path = entry.path();
            if path.is_dir() {
                path.file_name().is_some_and(|n| n != "target") && has_file_named(&path, name)
            } else {
                path.file_name().is_some_and(|n| n == name)
            }
        })
    }
}

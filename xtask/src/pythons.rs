//! `cargo xtask test --pythons`: the kernel runtime's tests of its child process (the runtime
//! contract, lifecycle, faults, sandbox, checkpoints, branches, pools, egress) with every Python this machine has (pyenv's versions,
//! `python3.N` on `PATH`), one line per interpreter, older ones checked to be refused; then
//! the in-process runtime built against a second libpython (the newest found that has a shared
//! library, when it is not the one the workspace builds against), in a target directory of its
//! own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The oldest Python the kernel runtime supports (its worker says so at start too).
const MINIMUM: (u32, u32) = cave_python::MIN_PYTHON;

/// The kernel runtime's tests of its child process, run on every Python: not the Jupyter
/// transport's (`jupyter*`, `enterprise_gateway*`), whose kernels are the gateway's interpreter
/// whichever this one is, and which take half the time; nor the doctests, the same everywhere.
const CHILD_TESTS: &[&str] = &[
    "checkpoint",
    "contract",
    "egress",
    "faults",
    "fork",
    "fork_contract",
    "host",
    "lifecycle",
    "output",
    "pool",
    "pool_contract",
    "sandbox",
];

/// Interpreters by version (`(3, 12)`): the full version and the executable.
type Found = BTreeMap<(u32, u32), (String, PathBuf)>;

/// Every interpreter found, by version (`(3, 12)`), one per minor version; and the
/// free-threaded builds found (`3.13.1t`), which the runtimes refuse.
fn interpreters() -> (Found, Vec<(String, PathBuf)>) {
    let mut candidates: Vec<PathBuf> = Vec::new();
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")));
    if let Some(versions) = pyenv.map(|p| p.join("versions"))
        && let Ok(entries) = std::fs::read_dir(versions)
    {
        candidates.extend(entries.flatten().map(|e| e.path().join("bin/python3")));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            for minor in 9..=20 {
                candidates.push(dir.join(format!("python3.{minor}")));
                candidates.push(dir.join(format!("python3.{minor}t")));
            }
        }
    }
    let mut found = BTreeMap::new();
    let mut free_threaded = Vec::new();
    for candidate in candidates.into_iter().filter(|c| c.is_file()) {
        let Ok(out) = Command::new(&candidate)
            .args(["-c", "import sys; print('%d %d %s%s' % (sys.version_info[0], sys.version_info[1], sys.version.split()[0], 't' if 't' in getattr(sys, 'abiflags', '') else ''))"])
            .output()
        else {
            continue;
        };
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut parts = text.split_whitespace();
        let (Some(Ok(major)), Some(Ok(minor)), Some(full)) = (
            parts.next().map(str::parse::<u32>),
            parts.next().map(str::parse::<u32>),
            parts.next(),
        ) else {
            continue;
        };
        if full.ends_with('t') {
            if !free_threaded.iter().any(|(f, _)| f == full) {
                free_threaded.push((full.to_owned(), candidate));
            }
            continue;
        }
        found
            .entry((major, minor))
            .or_insert((full.to_owned(), candidate));
    }
    (found, free_threaded)
}

/// The in-process runtime's tests (the contract and its own), built against the newest libpython
/// found besides the default one.
fn second_libpython(
    found: &Found,
    cargo: &impl Fn(&[&str], &[(&str, &str)]) -> Result<(), String>,
) -> Result<(), String> {
    let default = Command::new("python3")
        .args(["-c", "import sys; print(sys.version_info[1])"])
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<u32>()
                .ok()
        });
    let second = found.iter().rev().find(|((major, minor), (_, path))| {
        (*major, *minor) >= MINIMUM
            && Some(*minor) != default
            && path.parent().and_then(Path::parent).is_some_and(|prefix| {
                prefix
                    .join(format!("lib/libpython{major}.{minor}.so"))
                    .exists()
            })
    });
    let Some(((major, minor), (full, path))) = second else {
        println!(
            "in-process runtime: no second libpython here (a Python {}.{}+ other than python3's, with its shared library)",
            MINIMUM.0, MINIMUM.1
        );
        return Ok(());
    };
    let python = path.to_string_lossy().into_owned();
    let target = format!("target/py{major}{minor}");
    let result = cargo(
        &[
            "test",
            "-p",
            "cave-runtime-inproc",
            "--test",
            "contract",
            "--test",
            "tests",
            "--",
            // The tests that need pandas or matplotlib, which this interpreter need not have.
            "--skip",
            "pandas",
            "--skip",
            "matplotlib",
        ],
        &[
            ("PYO3_PYTHON", python.as_str()),
            ("CAVE_PYTHON", python.as_str()),
            ("CARGO_TARGET_DIR", target.as_str()),
            ("CAVE_TEST_NO_MATPLOTLIB", "1"),
        ],
    );
    match result {
        Ok(()) => {
            println!(
                "in-process runtime built against libpython {full} ({python}): its tests passed"
            );
            Ok(())
        }
        Err(e) => {
            println!("in-process runtime built against libpython {full}: FAILED ({e})");
            Err(format!("the in-process runtime on libpython {full}"))
        }
    }
}

/// Runs the kernel runtime's tests (the contract among them) with each interpreter from
/// [`MINIMUM`] up, checks that older ones are refused with the reason, and says which were
/// skipped.
pub fn run(cargo: impl Fn(&[&str], &[(&str, &str)]) -> Result<(), String>) -> Result<(), String> {
    let (found, free_threaded) = interpreters();
    for (full, path) in &free_threaded {
        println!(
            "python {full} ({}): skipped, {}",
            path.display(),
            cave_python::FREE_THREADED_REFUSAL
        );
    }
    let mut failed = Vec::new();
    let mut tested = 0;
    for ((major, minor), (full, path)) in &found {
        let python = path.to_string_lossy().into_owned();
        if (*major, *minor) < MINIMUM {
            // Not run, but refused at start with the reason: checked.
            let refused = cargo(
                &[
                    "test",
                    "-p",
                    "cave-runtime-kernel",
                    "--all-features",
                    "--test",
                    "lifecycle",
                    "--quiet",
                    "an_unsupported_interpreter_is_refused_with_the_reason",
                ],
                &[("CAVE_OLD_PYTHON", python.as_str())],
            );
            match refused {
                Ok(()) => println!(
                    "python {full} ({python}): older than {}.{}, refused at start with the reason",
                    MINIMUM.0, MINIMUM.1
                ),
                Err(e) => {
                    println!(
                        "python {full} ({python}): older than {}.{}, and not refused clearly: FAILED ({e})",
                        MINIMUM.0, MINIMUM.1
                    );
                    failed.push(full.clone());
                }
            }
            continue;
        }
        let mut args = vec![
            "test",
            "-p",
            "cave-runtime-kernel",
            "--all-features",
            "--quiet",
            "--lib",
        ];
        for test in CHILD_TESTS {
            args.extend(["--test", test]);
        }
        let result = cargo(
            &args,
            // These interpreters have no matplotlib (the test environment's has).
            &[
                ("CAVE_PYTHON", python.as_str()),
                ("CAVE_TEST_NO_MATPLOTLIB", "1"),
            ],
        );
        tested += 1;
        match result {
            Ok(()) => println!(
                "python {full} ({python}): the kernel runtime's tests passed (the contract, lifecycle, faults, sandbox, checkpoints, branches, pools, egress)"
            ),
            Err(e) => {
                println!("python {full} ({python}): FAILED ({e})");
                failed.push(full.clone());
            }
        }
    }
    if tested == 0 {
        return Err(format!(
            "no Python {}.{} or later found (pyenv's versions, python3.N on PATH)",
            MINIMUM.0, MINIMUM.1
        ));
    }
    if let Err(e) = second_libpython(&found, &cargo) {
        failed.push(e);
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the runtime's tests failed on Python {}",
            failed.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    /// Every test of the kernel runtime but the Jupyter transport's runs on every Python: a new
    /// test file is in `CHILD_TESTS` or named for the transport.
    #[test]
    fn every_child_test_runs_on_every_python() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../cave-runtime-kernel/tests");
        let mut missing = Vec::new();
        for entry in std::fs::read_dir(dir).expect("the kernel runtime's tests") {
            let name = entry.expect("an entry").file_name();
            let Some(test) = name.to_str().and_then(|n| n.strip_suffix(".rs")) else {
                continue;
            };
            let jupyter = test.starts_with("jupyter") || test.starts_with("enterprise_gateway");
            if !jupyter && !super::CHILD_TESTS.contains(&test) {
                missing.push(test.to_owned());
            }
        }
        assert!(missing.is_empty(), "not run on every Python: {missing:?}");
    }
}

//! `cargo xtask test --crates`: every library crate alone, as a user who picks one gets it:
//! its tests with its default features (no feature unification with the rest of the
//! workspace), a build with no features, and the package `cargo publish` would upload.

use std::process::Command;

/// The library crates, in dependency order.
const CRATES: &[&str] = &[
    "cave-egress",
    "cave-core",
    "cave-cell",
    "cave-pytype",
    "cave-testing",
    "cave-guards",
    "cave-python",
    "cave-security",
    "cave-compact",
    "cave-skills",
    "cave-session",
    "cave-otel",
    "cave-macros",
    "cave-models",
    "cave-runtime-inproc",
    "cave-runtime-kernel",
    "cave-mcp",
    "cave-agent",
];

/// Runs the checks; a line per crate, then `Err` naming the crates that failed.
pub(crate) fn run(
    root: &std::path::Path,
    cargo: impl Fn(&[&str], &[(&str, &str)]) -> Result<(), String>,
    env: &[(&str, &str)],
) -> Result<(), String> {
    let mut failed = Vec::new();
    for name in CRATES {
        let result = cargo(&["test", "-p", name, "--quiet"], env).and_then(|()| {
            cargo(
                &[
                    "check",
                    "-p",
                    name,
                    "--no-default-features",
                    "--lib",
                    "--quiet",
                ],
                env,
            )
        });
        match result {
            Ok(()) => {
                println!("{name}: its tests pass alone (default features); it builds with none")
            }
            Err(e) => {
                println!("{name}: FAILED ({e})");
                failed.push(*name);
            }
        }
    }
    // What a user downloads: every crate packaged, each resolved against the others as packaged.
    let mut package = vec![
        "package",
        "--workspace",
        "--exclude",
        "xtask",
        "--no-verify",
        "--quiet",
    ];
    if std::env::var_os("CI").is_none() {
        package.push("--allow-dirty");
    }
    let packaged = cargo(&package, env).and_then(|()| {
        CRATES.iter().try_for_each(|name| {
            let file = std::fs::read_dir(root.join("target").join("package"))
                .map_err(|e| e.to_string())?
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                        n.strip_prefix(name)
                            .and_then(|rest| rest.strip_prefix('-'))
                            .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()))
                            && n.ends_with(".crate")
                    })
                })
                .ok_or_else(|| format!("no package of {name}"))?;
            packaged_files_present(&file)
        })
    });
    match packaged {
        Ok(()) => println!(
            "cargo package: every crate packages, each with its README and both licences (target/package)"
        ),
        Err(e) => {
            println!("cargo package: FAILED ({e})");
            failed.push("cargo package");
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("alone, these failed: {}", failed.join(", ")))
    }
}

/// Whether a packaged crate carries what a user expects: a README and both licences.
fn packaged_files_present(crate_file: &std::path::Path) -> Result<(), String> {
    let out = Command::new("tar")
        .arg("tzf")
        .arg(crate_file)
        .output()
        .map_err(|e| e.to_string())?;
    let list = String::from_utf8_lossy(&out.stdout);
    for needed in ["README.md", "LICENSE-MIT", "LICENSE-APACHE", "Cargo.toml"] {
        if !list.lines().any(|l| l.ends_with(&format!("/{needed}"))) {
            return Err(format!("{} lacks {needed}", crate_file.display()));
        }
    }
    Ok(())
}

/// Every library crate of the workspace is checked alone (a new one is not forgotten).
#[test]
fn every_library_crate_is_listed() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap();
    let mut found: Vec<String> = crate::crate_dirs(root)
        .into_iter()
        .filter(|dir| dir.join("src/lib.rs").is_file())
        .filter_map(|dir| Some(dir.file_name()?.to_string_lossy().into_owned()))
        // The CLI is a program (its library is its own), checked with the workspace.
        .filter(|name| name != "cave-cli")
        .collect();
    found.sort();
    let mut listed: Vec<String> = CRATES.iter().map(|c| c.to_string()).collect();
    listed.sort();
    assert_eq!(listed, found);
}

//! Which Python environment the runtime sees.

use crate::execution::run;
use cave_runtime_inproc::{EnvironmentSource, InProcRuntime, python_environment};

#[tokio::test]
async fn the_selected_interpreter_provides_the_paths() {
    let env = python_environment().expect("an environment");
    let expected = if std::env::var_os("CAVE_PYTHON").is_some() {
        EnvironmentSource::CavePython
    } else if std::env::var_os("VIRTUAL_ENV").is_some() {
        EnvironmentSource::VirtualEnv
    } else {
        EnvironmentSource::Path
    };
    assert_eq!(env.source, expected);
    let executable = env
        .executable
        .as_ref()
        .expect("an interpreter was asked")
        .to_string_lossy()
        .into_owned();
    let rt = InProcRuntime::new().unwrap();
    let out = run(
        &rt,
        "import sys\nprint(sys.executable)\nprint(sys.version_info[:2])",
    )
    .await;
    let major_minor: Vec<&str> = env.embedded_version.split('.').take(2).collect();
    assert_eq!(
        out.output,
        format!("{executable}\n({}, {})\n", major_minor[0], major_minor[1])
    );
    // The interpreter's site-packages are importable (pandas is installed there by .ci/run).
    assert!(
        env.sys_path.iter().any(|p| p.ends_with("site-packages")),
        "{:?}",
        env.sys_path
    );
}

/// Run by `a_libpython_other_than_the_selected_interpreters_is_refused` in a process of its
/// own, whose loader is pointed at another libpython: prints what starting a runtime said.
#[test]
#[ignore = "run by a_libpython_other_than_the_selected_interpreters_is_refused"]
fn start_with_the_loader_pointed_elsewhere() {
    match InProcRuntime::new() {
        Ok(_) => println!("STARTED"),
        Err(e) => println!("REFUSED: {e}"),
    }
}

/// A program whose loader finds another libpython than the selected interpreter's (here: the
/// system's, put first by `LD_LIBRARY_PATH`) would run with one build's library and another's
/// `sys.path`: the runtime refuses to start, says which library it loaded, and what to add to
/// `build.rs`. Needs a system libpython of the same version in another directory.
#[test]
fn a_libpython_other_than_the_selected_interpreters_is_refused() {
    let env = python_environment().expect("an environment");
    let version: Vec<&str> = env.embedded_version.split('.').take(2).collect();
    let system_dir = "/usr/lib/x86_64-linux-gnu";
    let system = format!("{system_dir}/libpython{}.{}.so.1.0", version[0], version[1]);
    let selected_dir = env
        .executable
        .as_ref()
        .and_then(|e| cave_python::report::ask(e).ok())
        .map(|r| r.libdir)
        .unwrap_or_default();
    let same = |a: &str, b: &str| {
        std::fs::canonicalize(a).ok().is_some()
            && std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok()
    };
    if !std::path::Path::new(&system).exists() || same(system_dir, &selected_dir) {
        eprintln!("skipped: no libpython of this version outside {selected_dir} (needs {system})");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "environment::start_with_the_loader_pointed_elsewhere",
            "--ignored",
            "--nocapture",
        ])
        .env("LD_LIBRARY_PATH", system_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("REFUSED: this program loaded {system}"))
            && stdout.contains("pyo3_build_config::add_libpython_rpath_link_args()"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

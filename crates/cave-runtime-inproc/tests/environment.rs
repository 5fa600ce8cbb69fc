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

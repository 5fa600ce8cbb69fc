//! `cargo xtask test`: makes sure the Python packages the tests import are there, then runs the
//! workspace tests.
//!
//! The in-process runtime imports packages from the environment it selects (`CAVE_PYTHON`, an
//! active virtualenv, or `python3` on `PATH`). If that environment lacks what the tests need, a
//! project-local virtualenv (`target/test-venv`, made from the same interpreter) gets it, and
//! the tests run with that virtualenv active. Nothing outside the project is changed.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What the tests import.
const PACKAGES: &[&str] = &["pandas", "matplotlib"];

/// The LiteLLM proxy the CLI's proxy test runs (a version known to work).
const LITELLM: &str = "litellm[proxy]==1.108.7";

/// The Jupyter Kernel Gateway and the kernel its tests run (versions known to work).
const JUPYTER: &[&str] = &["jupyter-kernel-gateway==3.0.1", "ipykernel==7.4.0"];
/// Jupyter Enterprise Gateway, run in its local mode by the kernel runtime's tests, and the
/// kernel its local process proxy starts (versions known to work).
const ENTERPRISE_GATEWAY: &[&str] = &["jupyter_enterprise_gateway==3.3.0", "ipykernel==6.29.5"];
/// What the Jupyter kernels' cells import in the tests (installed into an existing
/// `jupyter-venv` too).
const JUPYTER_KERNEL_PACKAGES: &[&str] = &["matplotlib"];

/// The interpreter the runtime would select, as it selects it (`cave_python`'s discovery).
pub(crate) fn selected_python() -> PathBuf {
    cave_python::find_interpreter()
        .map(|i| i.executable)
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// An interpreter with pandas and numpy for the benchmarks that need them (the fork
/// benchmark's large namespace and template pool): the selected one, or the test virtualenv's
/// when `cargo xtask test` made it; `None` when neither has them (those rows are skipped).
pub(crate) fn pandas_python(root: &Path) -> Option<PathBuf> {
    let venv = root
        .join("target")
        .join("test-venv")
        .join("bin")
        .join("python");
    [selected_python(), venv]
        .into_iter()
        .find(|python| python.exists() && imports(python, &["pandas", "numpy"]))
}

fn imports(python: &Path, packages: &[&str]) -> bool {
    let code = packages
        .iter()
        .map(|p| format!("import {p}"))
        .collect::<Vec<_>>()
        .join("; ");
    Command::new(python)
        .args(["-c", &code])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `python -m pip install --quiet`, to which the packages are added.
pub(crate) fn pip_install(python: &Path) -> Command {
    let mut command = Command::new(python);
    command.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ]);
    command
}

pub(crate) fn run(command: &mut Command) -> Result<(), String> {
    let shown = format!("{command:?}");
    let status = command
        .status()
        .map_err(|e| format!("could not run {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed: {status}"))
    }
}

/// `CAVE_LITELLM` for the proxy test: the `litellm` of `target/litellm-venv`, installed there
/// if missing (about two minutes). If it cannot be installed, the test says it skipped.
pub(crate) fn litellm(root: &Path) -> Vec<(String, String)> {
    tool(
        root,
        "litellm-venv",
        &[LITELLM],
        "litellm",
        "CAVE_LITELLM",
        "the LiteLLM proxy",
    )
}

/// The MCP servers the MCP tests start: PyPI's `mcp-server-time` and `mcp-server-git`, and the
/// official Python SDK (`mcp`) that the tests' own edge-case server is written with.
/// `CAVE_MCP_TIME` names the first; the others are beside it.
const MCP: &[&str] = &[
    "mcp==2.3.0",
    "mcp-server-time==2026.10.19",
    "mcp-server-git==2026.10.19",
];

/// `CAVE_MCP_TIME` for the MCP tests, installed in `target/mcp-venv` if missing.
pub(crate) fn mcp(root: &Path) -> Vec<(String, String)> {
    tool(
        root,
        "mcp-venv",
        MCP,
        "mcp-server-time",
        "CAVE_MCP_TIME",
        "the MCP test servers",
    )
}

/// The npm MCP server the MCP tests start (the reference servers' "everything" server: text,
/// structured content, images, resource links, a long-running tool).
const MCP_NPM: &str = "@modelcontextprotocol/server-everything@2026.8.31";

/// `CAVE_MCP_EVERYTHING` for the MCP tests: the server's script, installed with npm in
/// `target/npm-mcp` if missing. Without npm (or the registry), its test skips, and says so.
pub(crate) fn mcp_npm(root: &Path) -> Vec<(String, String)> {
    let prefix = root.join("target/npm-mcp");
    let script = prefix.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if !script.is_file() {
        println!("xtask: installing {MCP_NPM} in {}", prefix.display());
        let installed = std::fs::create_dir_all(&prefix)
            .map_err(|e| format!("cannot create {}: {e}", prefix.display()))
            .and_then(|()| {
                run(Command::new("npm")
                    .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
                    .arg(&prefix)
                    .arg(MCP_NPM))
            });
        if let Err(e) = installed {
            println!("xtask: could not install it ({e}); its test will skip");
            return Vec::new();
        }
    }
    vec![(
        "CAVE_MCP_EVERYTHING".to_owned(),
        script.display().to_string(),
    )]
}

/// Arize Phoenix, the OTLP receiver the trace tests export to and read back from.
const PHOENIX: &[&str] = &["arize-phoenix==20.26.1"];

/// `CAVE_PHOENIX` for the trace tests: `phoenix` in `target/phoenix-venv`, installed there if
/// missing (under a minute). Without it, the tests say they skipped.
pub(crate) fn phoenix(root: &Path) -> Vec<(String, String)> {
    tool(
        root,
        "phoenix-venv",
        PHOENIX,
        "phoenix",
        "CAVE_PHOENIX",
        "Arize Phoenix",
    )
}

/// The Jupyter Kernel Gateway (with ipykernel for its kernels) the Jupyter transport's tests
/// start on 127.0.0.1.
pub(crate) fn jupyter(root: &Path) -> Vec<(String, String)> {
    let env = tool(
        root,
        "jupyter-venv",
        JUPYTER,
        "jupyter",
        "CAVE_JUPYTER",
        "the Jupyter Kernel Gateway",
    );
    with_kernel_packages(env, &root.join("target/jupyter-venv/bin/python"))
}

/// Jupyter Enterprise Gateway (and ipykernel for its kernels), for the tests that run it on
/// 127.0.0.1 in its local mode: `CAVE_JUPYTER_EG`.
pub(crate) fn enterprise_gateway(root: &Path) -> Vec<(String, String)> {
    let env = tool(
        root,
        "eg-venv",
        ENTERPRISE_GATEWAY,
        "jupyter",
        "CAVE_JUPYTER_EG",
        "Jupyter Enterprise Gateway",
    );
    with_kernel_packages(env, &root.join("target/eg-venv/bin/python"))
}

/// `env` once the kernels' `python` has what their cells import in the tests.
fn with_kernel_packages(env: Vec<(String, String)>, python: &Path) -> Vec<(String, String)> {
    if !env.is_empty() && !imports(python, JUPYTER_KERNEL_PACKAGES) {
        println!(
            "xtask: installing {} in {}",
            JUPYTER_KERNEL_PACKAGES.join(" "),
            python.display()
        );
        if let Err(e) = run(pip_install(python).args(JUPYTER_KERNEL_PACKAGES)) {
            println!("xtask: could not install them ({e}); the kernels' display checks will fail");
        }
    }
    env
}

/// A program from PyPI in a project-local virtualenv (`target/VENV`), installed once; the
/// variable that tells its tests where it is. Without it, its tests skip (and say so).
fn tool(
    root: &Path,
    venv: &str,
    packages: &[&str],
    program: &str,
    variable: &str,
    what: &str,
) -> Vec<(String, String)> {
    let venv = root.join("target").join(venv);
    let program = venv.join("bin").join(program);
    if !program.is_file() {
        println!(
            "xtask: installing {} in {}",
            packages.join(" "),
            venv.display()
        );
        let installed = run(Command::new(selected_python())
            .args(["-m", "venv"])
            .arg(&venv))
        .and_then(|()| run(pip_install(&venv.join("bin").join("python")).args(packages)));
        if let Err(e) = installed {
            println!("xtask: could not install {what} ({e}); its tests will skip");
            return Vec::new();
        }
    }
    vec![(variable.to_owned(), program.display().to_string())]
}

/// What the build and the tests need from the machine's Python, checked before anything is
/// built, with the package that provides what is missing (the README's list): the in-process
/// runtime links the libpython of `PYO3_PYTHON` (or `python3`), and the test environments are
/// virtualenvs.
pub(crate) fn check_prerequisites() -> Result<(), String> {
    let python = std::env::var_os("PYO3_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"));
    let probe = "import importlib.util, os, sys, sysconfig\n\
        v = '%d.%d' % sys.version_info[:2]\n\
        libdir = sysconfig.get_config_var('LIBDIR') or ''\n\
        shared = bool(sysconfig.get_config_var('Py_ENABLE_SHARED')) or os.path.exists(os.path.join(libdir, 'libpython%s.so.1.0' % v))\n\
        linkable = os.path.exists(os.path.join(libdir, 'libpython%s.so' % v))\n\
        venv = all(importlib.util.find_spec(m) is not None for m in ('venv', 'ensurepip'))\n\
        print(v, int(shared), int(linkable), int(venv))";
    let out = Command::new(&python).args(["-c", probe]).output().map_err(|e| {
        format!(
            "could not run {} ({e}): the build needs a Python 3 (Debian: apt-get install python3 python3-dev python3-venv)",
            python.display()
        )
    })?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let fields: Vec<&str> = text.split_whitespace().collect();
    let [version, shared, linkable, venv] = fields[..] else {
        return Err(format!(
            "{} could not be asked about its installation: {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    };
    let mut missing = Vec::new();
    if shared != "1" {
        missing.push(format!(
            "{} was built without a shared libpython, which the in-process runtime links: use a Python built with --enable-shared (pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared), or point PYO3_PYTHON at one",
            python.display()
        ));
    } else if linkable != "1" {
        missing.push(format!(
            "libpython{version}.so, which the in-process runtime links (Debian: apt-get install libpython{version}-dev)"
        ));
    }
    if venv != "1" {
        missing.push(format!(
            "the venv module with ensurepip, for the test environments (Debian: apt-get install python{version}-venv)"
        ));
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "this machine lacks what the build and the tests need:\n  - {}",
            missing.join("\n  - ")
        ))
    }
}

/// The environment variables the tests need: none when the selected environment has the
/// packages, else those that activate the project's test virtualenv (created and filled here).
pub(crate) fn prepare(root: &Path) -> Result<Vec<(String, String)>, String> {
    check_prerequisites()?;
    let python = selected_python();
    if imports(&python, PACKAGES) {
        println!("xtask: {} has {}", python.display(), PACKAGES.join(", "));
        return Ok(Vec::new());
    }
    let venv = root.join("target").join("test-venv");
    let venv_python = venv.join("bin").join("python");
    if !venv_python.exists() {
        println!(
            "xtask: {} lacks {}; creating {}",
            python.display(),
            PACKAGES.join(", "),
            venv.display()
        );
        run(Command::new(&python).args(["-m", "venv"]).arg(&venv))?;
    }
    if !imports(&venv_python, PACKAGES) {
        run(pip_install(&venv_python).args(PACKAGES))?;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![venv.join("bin")];
    dirs.extend(std::env::split_paths(&path));
    let path = std::env::join_paths(dirs).map_err(|e| e.to_string())?;
    Ok(vec![
        ("CAVE_PYTHON".to_owned(), venv_python.display().to_string()),
        ("VIRTUAL_ENV".to_owned(), venv.display().to_string()),
        ("PATH".to_owned(), path.to_string_lossy().into_owned()),
    ])
}

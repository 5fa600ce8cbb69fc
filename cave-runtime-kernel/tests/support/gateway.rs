//! A real Jupyter Kernel Gateway on 127.0.0.1, one per test binary, for the tests of the
//! kernel runtime's Jupyter transport (here and in cave-cli's). Plain std and libc: each test
//! builds its own runtime from [`Gateway::url`] and [`Gateway::token`].
//!
//! The `jupyter` executable comes from `CAVE_JUPYTER`, or `target/jupyter-venv` (made by
//! `cargo xtask test`); without one, [`gateway`] says so in one line and the test skips.

// Each test binary that includes this file uses a part of it.
#![allow(dead_code)]

use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where the gateway listens, and its token.
pub struct Gateway {
    pub url: String,
    pub token: String,
}

fn jupyter() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CAVE_JUPYTER") {
        return Some(PathBuf::from(path));
    }
    let venv = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/jupyter-venv/bin/jupyter"
    ));
    venv.exists().then_some(venv)
}

/// The test binary's gateway, started on first use; `None` (said once per test) without one.
/// Its IOPub rate limit is off: output is the runtime's to bound, not the gateway's.
pub fn gateway() -> Option<&'static Gateway> {
    static GATEWAY: OnceLock<Option<Gateway>> = OnceLock::new();
    said_if_none(
        GATEWAY
            .get_or_init(|| start(&["--ZMQChannelsWebsocketConnection.limit_rate=False"]))
            .as_ref(),
    )
}

/// A second gateway, started on first use, that keeps Jupyter Server's IOPub rate limit on
/// and low (100 kB/s over a one-second window), as a server configured by someone else might.
pub fn rate_limited_gateway() -> Option<&'static Gateway> {
    static GATEWAY: OnceLock<Option<Gateway>> = OnceLock::new();
    said_if_none(
        GATEWAY
            .get_or_init(|| {
                start(&[
                    "--ZMQChannelsWebsocketConnection.iopub_data_rate_limit=100000",
                    "--ZMQChannelsWebsocketConnection.rate_limit_window=1",
                ])
            })
            .as_ref(),
    )
}

fn said_if_none(gateway: Option<&'static Gateway>) -> Option<&'static Gateway> {
    if gateway.is_none() {
        eprintln!(
            "skipped: no Jupyter Kernel Gateway (set CAVE_JUPYTER or run `cargo xtask test`)"
        );
    }
    gateway
}

fn start(settings: &[&str]) -> Option<Gateway> {
    start_with("http", settings)
}

/// The test binary's Jupyter Enterprise Gateway (PyPI's `jupyter_enterprise_gateway`, from
/// `CAVE_JUPYTER_EG` or `target/eg-venv`, which `cargo xtask test` makes), in its local mode
/// (kernels started by its local process proxy), started on first use; `None` (said once per
/// test) without one. Kernels must be started with a `KERNEL_USERNAME` it accepts (not root).
pub fn enterprise_gateway() -> Option<&'static Gateway> {
    static GATEWAY: OnceLock<Option<Gateway>> = OnceLock::new();
    let gateway = GATEWAY
        .get_or_init(|| {
            let jupyter = match std::env::var_os("CAVE_JUPYTER_EG") {
                Some(path) => PathBuf::from(path),
                None => PathBuf::from(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../target/eg-venv/bin/jupyter"
                )),
            };
            if !jupyter.is_file() {
                return None;
            }
            let port = free_port();
            let token = format!("cave-test-eg-{}", std::process::id());
            let mut command = Command::new(&jupyter);
            command.args([
                "enterprisegateway",
                "--ip=127.0.0.1",
                &format!("--port={port}"),
                &format!("--EnterpriseGatewayApp.auth_token={token}"),
            ]);
            Some(launch(command, "http", port, token))
        })
        .as_ref();
    if gateway.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs Enterprise Gateway (cargo xtask test)"
        );
        eprintln!(
            "skipped: no Jupyter Enterprise Gateway (set CAVE_JUPYTER_EG or run `cargo xtask test`)"
        );
    }
    gateway
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Starts a gateway of its own, with `settings` on its command line, reached at `scheme`
/// (`https` when the settings give it a certificate); `None` without a `jupyter`.
pub fn start_with(scheme: &str, settings: &[&str]) -> Option<Gateway> {
    let jupyter = jupyter()?;
    let port = free_port();
    let token = format!("cave-test-{}", std::process::id());
    let mut command = Command::new(&jupyter);
    command
        .args([
            "kernelgateway",
            "--KernelGatewayApp.ip=127.0.0.1",
            &format!("--KernelGatewayApp.port={port}"),
            &format!("--IdentityProvider.token={token}"),
        ])
        .args(settings);
    Some(launch(command, scheme, port, token))
}

/// Runs a gateway's `command` until the test binary ends, and waits until it listens on `port`.
fn launch(mut command: Command, scheme: &str, port: u16, token: String) -> Gateway {
    // `CAVE_TEST_GATEWAY_LOG=FILE` keeps the gateway's log, for a failure to be read.
    let log = std::env::var_os("CAVE_TEST_GATEWAY_LOG").and_then(|path| {
        std::fs::File::options()
            .create(true)
            .append(true)
            .open(path)
            .ok()
    });
    command
        .stdout(Stdio::null())
        .stderr(log.map_or_else(Stdio::null, Stdio::from));
    // SAFETY: prctl is async-signal-safe. The gateway dies with the thread that started it:
    // a thread that lives as long as the test binary.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let (started, child) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = started.send(command.spawn().map(|_child| ()));
        loop {
            std::thread::park();
        }
    });
    child
        .recv()
        .expect("the starter thread")
        .expect("jupyter kernelgateway starts");
    let begun = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            begun.elapsed() < Duration::from_secs(90),
            "the gateway did not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Gateway {
        url: format!("{scheme}://127.0.0.1:{port}"),
        token,
    }
}

//! The network where the host allows it: a worker under the strict sandbox with an allowlist
//! reaches the listed hosts through the host's proxy and nothing else; without one it reaches
//! nothing (the default, unchanged). Servers on 127.0.0.x of this machine only.

use cave_core::{DiscardOutput, Execution, Runtime};
use cave_runtime_kernel::{Allowlist, KernelConfig, KernelRuntime, Need, Sandbox};
use std::io::{BufRead, BufReader, Write};

/// An HTTP server on `ip` answering every request with `name`; its port.
fn server(ip: &str, name: &'static str) -> u16 {
    let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let body = format!("hello from {name}");
                let _ = write!(
                    reader.get_mut(),
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

async fn run(rt: &KernelRuntime, code: &str) -> Execution {
    rt.execute(code, &DiscardOutput).await.expect("runs")
}

/// What a machine lacks for the allowlist to hold by either route (a network namespace of the
/// worker's own, or Landlock's TCP rules with seccomp).
fn lacking_every_route() -> Option<String> {
    let namespaces = Need::Namespaces.lacking()?;
    let tcp = Need::LandlockTcp
        .lacking()
        .or_else(|| Need::Seccomp.lacking())?;
    Some(format!("{namespaces}; {tcp}"))
}

/// The listed server is reached through the proxy, an unlisted one is refused with how to
/// allow it, and a socket the cell opens itself reaches nothing; returns the network layer's
/// description.
async fn reaches_only_what_is_listed() -> String {
    let allowed = server("127.0.0.2", "allowed");
    let refused = server("127.0.0.3", "refused");
    let list: Allowlist = format!("127.0.0.2:{allowed}").parse().unwrap();
    let rt = KernelRuntime::with_config(
        KernelConfig::new()
            .spare(false)
            .sandbox(Sandbox::strict().allow_net(list)),
    )
    .unwrap();
    let out = run(
        &rt,
        &format!("import urllib.request\nprint(urllib.request.urlopen('http://127.0.0.2:{allowed}/', timeout=10).read().decode())"),
    )
    .await;
    assert_eq!(out.output, "hello from allowed\n", "{out:?}");
    let reached = &out.connections.list;
    assert!(
        reached.len() == 1
            && reached[0].allowed
            && reached[0].host == "127.0.0.2"
            && reached[0].sent > 0
            && reached[0].received > "hello from allowed".len() as u64,
        "{reached:?}"
    );
    let out = run(
        &rt,
        &format!("urllib.request.urlopen('http://127.0.0.3:{refused}/', timeout=10)"),
    )
    .await;
    assert!(
        out.output.contains("403")
            && out
                .output
                .contains(&format!("--allow-net 127.0.0.3:{refused}")),
        "{out:?}"
    );
    // Each cell's account: the refusal here, the first cell's connection in its own.
    let refusal = &out.connections.list;
    assert!(
        refusal.len() == 1
            && !refusal[0].allowed
            && refusal[0].host == "127.0.0.3"
            && refusal[0].port == refused,
        "{refusal:?}"
    );
    // A cell that ignores the proxy finds no route: the namespace's loopback is its own, or
    // Landlock refuses every port but the proxy's.
    let out = run(
        &rt,
        &format!("import socket\nsocket.create_connection(('127.0.0.2', {allowed}), timeout=5)"),
    )
    .await;
    assert!(
        out.output.contains("ConnectionRefusedError") || out.output.contains("PermissionError"),
        "{out:?}"
    );
    let layers = rt.sandbox_layers().await.unwrap_or_default();
    let network = layers
        .iter()
        .find(|l| l.name == "network")
        .map(|l| l.to_string())
        .unwrap_or_default();
    assert!(
        network.contains("out only through the host's proxy"),
        "{layers:?}"
    );
    network
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_listed_hosts_are_reached_through_the_proxy() {
    if cave_testing::machine::skips(
        "only_listed_hosts_are_reached_through_the_proxy",
        lacking_every_route(),
    ) {
        return;
    }
    reaches_only_what_is_listed().await;
}

/// Set in the process that runs a test again without namespaces.
const WITHOUT_NAMESPACES: &str = "CAVE_KERNEL_TEST_WITHOUT_NAMESPACES";

/// Runs `test` of this binary again in a child process that may not make namespaces:
/// `unshare` refused by a seccomp filter, as Docker's default profile refuses it (a chroot and
/// Ubuntu's AppArmor policy refuse it too, each its own way). Panics unless the test passes
/// there.
fn again_without_namespaces(test: &str) {
    use std::os::unix::process::CommandExt;
    let filter = seccompiler::SeccompFilter::new(
        [(libc::SYS_unshare, Vec::new())].into_iter().collect(),
        seccompiler::SeccompAction::Allow,
        seccompiler::SeccompAction::Errno(libc::EPERM as u32),
        std::env::consts::ARCH
            .try_into()
            .expect("a seccomp architecture"),
    )
    .expect("a filter");
    let program: seccompiler::BpfProgram = filter.try_into().expect("compiles");
    let mut command = std::process::Command::new(std::env::current_exe().expect("this binary"));
    command
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(WITHOUT_NAMESPACES, "1");
    // SAFETY: prctl and the filter's installation, on a program built before the fork.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            seccompiler::apply_filter(&program).map_err(std::io::Error::other)
        });
    }
    let output = command.output().expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "without namespaces: {}\n{stdout}\n{stderr}",
        output.status
    );
}

/// Where the machine allows no namespaces, the proxy listens on the host's loopback: a cell
/// may open TCP sockets only, and connect to the proxy's port only (Landlock), so the listed
/// host is reached through it and nothing else is.
#[test]
fn the_allowlist_holds_without_namespaces() {
    let test = "the_allowlist_holds_without_namespaces";
    if std::env::var_os(WITHOUT_NAMESPACES).is_none() {
        let lacking = Need::LandlockTcp
            .lacking()
            .or_else(|| Need::Seccomp.lacking());
        if !cave_testing::machine::skips(test, lacking) {
            again_without_namespaces(test);
        }
        return;
    }
    assert!(
        Need::Namespaces.lacking().is_some(),
        "the filter left namespaces"
    );
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    runtime.block_on(async {
        let network = reaches_only_what_is_listed().await;
        assert!(network.contains("on its loopback"), "{network}");
        // Only TCP sockets: no UDP (no DNS of its own), no Unix-domain socket, no raw socket;
        // and no TCP server of its own.
        let rt = KernelRuntime::with_config(
            KernelConfig::new()
                .spare(false)
                .sandbox(Sandbox::strict().allow_net("example.org".parse().unwrap())),
        )
        .unwrap();
        let out = run(
            &rt,
            "import socket\nrefused = []\nfor family, kind in [(socket.AF_INET, socket.SOCK_DGRAM), (socket.AF_UNIX, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_RAW), (socket.AF_INET6, socket.SOCK_DGRAM)]:\n    try:\n        socket.socket(family, kind).close()\n    except PermissionError:\n        refused.append(kind.name)\nprint(refused)\ns = socket.socket()\ntry:\n    s.bind(('127.0.0.1', 0))\nexcept PermissionError:\n    print('no bind')",
        )
        .await;
        assert_eq!(
            out.output,
            "['SOCK_DGRAM', 'SOCK_STREAM', 'SOCK_RAW', 'SOCK_DGRAM']\nno bind\n",
            "{out:?}"
        );
        // What Landlock's TCP rules do not see: a connection made by a send with
        // MSG_FASTOPEN (the connect hook is not called) and a listen that binds a port itself.
        let elsewhere = server("127.0.0.2", "elsewhere");
        let out = run(
            &rt,
            &format!("t = socket.socket()\ntry:\n    t.sendto(b'GET / HTTP/1.0\\r\\n\\r\\n', socket.MSG_FASTOPEN, ('127.0.0.2', {elsewhere}))\n    print('fast open went out')\nexcept PermissionError:\n    print('no fast open')\nu = socket.socket()\ntry:\n    u.listen()\n    print('listening on', u.getsockname())\nexcept PermissionError:\n    print('no listen')"),
        )
        .await;
        assert_eq!(out.output, "no fast open\nno listen\n", "{out:?}");
    });
}

/// With no allowlist the strict sandbox is as before: no proxy named, no host reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_allowlist_nothing_is_reached() {
    let allowed = server("127.0.0.2", "allowed");
    let rt =
        KernelRuntime::with_config(KernelConfig::new().spare(false).sandbox(Sandbox::strict()))
            .unwrap();
    let out = run(
        &rt,
        &format!("import os, urllib.request\nprint(os.environ.get('HTTPS_PROXY'))\nurllib.request.urlopen('http://127.0.0.2:{allowed}/', timeout=5)"),
    )
    .await;
    assert!(out.output.starts_with("None\n"), "{out:?}");
    assert!(!out.success(), "{out:?}");
}

/// A wheel of the one-module package `name` (version 1.0) whose `VALUE` is `value`, made by
/// the host's Python.
fn wheel(name: &str, value: &str) -> Vec<u8> {
    const MAKE: &str = r#"
import base64, hashlib, sys, zipfile
name, value, path = sys.argv[1:4]
info = f"{name}-1.0.dist-info"
files = {
    f"{name}.py": f"VALUE = {value!r}\n",
    f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
    f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: cave-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
with zipfile.ZipFile(path, "w") as z:
    for member, text in files.items():
        data = text.encode()
        z.writestr(member, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{member},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
"#;
    let path = std::env::temp_dir().join(format!(
        "{name}-1.0-py3-none-any-{}.whl",
        std::process::id()
    ));
    let status = std::process::Command::new("python3")
        .args(["-c", MAKE, name, value])
        .arg(&path)
        .status()
        .expect("python3 runs");
    assert!(status.success());
    let bytes = std::fs::read(&path).expect("the wheel");
    let _ = std::fs::remove_file(&path);
    bytes
}

/// A package index (PEP 503's simple pages) on `ip` serving `wheel` as package `name`; its
/// port.
fn index(ip: &str, name: &'static str, wheel: Vec<u8>) -> u16 {
    let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let wheel = std::sync::Arc::new(wheel);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let wheel = wheel.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                let mut request = String::new();
                let _ = reader.read_line(&mut request);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let path = request.split(' ').nth(1).unwrap_or_default().to_owned();
                let file = format!("{name}-1.0-py3-none-any.whl");
                let (kind, body) = if path.starts_with(&format!("/simple/{name}")) {
                    let page = format!(
                        "<!DOCTYPE html><html><body><a href=\"/files/{file}\">{file}</a></body></html>"
                    );
                    ("text/html", page.into_bytes())
                } else if path == format!("/files/{file}") {
                    ("application/octet-stream", wheel.to_vec())
                } else {
                    let _ = write!(
                        reader.get_mut(),
                        "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    );
                    return;
                };
                let _ = write!(
                    reader.get_mut(),
                    "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = reader.get_mut().write_all(&body);
            });
        }
    });
    port
}

/// The cell that installs `package` with the interpreter's pip, and prints pip's status and the
/// end of what it said.
fn pip_install(package: &str) -> String {
    format!(
        "import subprocess, sys\nr = subprocess.run([sys.executable, '-m', 'pip', 'install', '{package}'], capture_output=True, text=True)\nprint(r.returncode)\nprint(r.stdout[-3000:], r.stderr[-3000:])"
    )
}

/// Whether `test` skips because the runtime's Python has no pip (`out`: what installing said),
/// as a distribution's Python without its pip package (`cargo xtask test`'s has one).
fn without_pip(test: &str, out: &Execution) -> bool {
    cave_testing::machine::skips(
        test,
        out.output
            .contains("No module named pip")
            .then(|| "pip in the runtime's Python".to_owned()),
    )
}

/// With the index's host allowed, `pip install` in a cell installs into the session's own
/// environment (the interpreter's is read-only in the sandbox), from the index the pip
/// settings name, and the package imports in the next cell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pip_installs_into_the_sessions_environment() {
    if cave_testing::machine::skips(
        "pip_installs_into_the_sessions_environment",
        lacking_every_route(),
    ) {
        return;
    }
    let port = index(
        "127.0.0.4",
        "cavewheel",
        wheel("cavewheel", "from the index"),
    );
    let list: Allowlist = format!("127.0.0.4:{port}").parse().unwrap();
    let rt = KernelRuntime::with_config(
        KernelConfig::new()
            .spare(false)
            .sandbox(Sandbox::strict().allow_net(list))
            .env("PIP_INDEX_URL", format!("http://127.0.0.4:{port}/simple/"))
            .env("PIP_TRUSTED_HOST", format!("127.0.0.4:{port}"))
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    )
    .unwrap();
    let out = run(&rt, &pip_install("cavewheel")).await;
    if without_pip("pip_installs_into_the_sessions_environment", &out) {
        return;
    }
    assert!(out.output.starts_with("0\n"), "{out:?}");
    let out = run(
        &rt,
        "import cavewheel\nprint(cavewheel.VALUE)\nprint('.cave-packages' in cavewheel.__file__)",
    )
    .await;
    assert_eq!(out.output, "from the index\nTrue\n", "{out:?}");
}

/// From the real package index, when this machine reaches it (says it skipped when not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pip_installs_from_the_real_index() {
    let test = "pip_installs_from_the_real_index";
    if cave_testing::machine::skips(test, lacking_every_route()) {
        return;
    }
    let reachable = std::net::ToSocketAddrs::to_socket_addrs(&("pypi.org", 443))
        .ok()
        .and_then(|mut addresses| addresses.next())
        .is_some_and(|address| {
            std::net::TcpStream::connect_timeout(&address, std::time::Duration::from_secs(5))
                .is_ok()
        });
    if !reachable {
        eprintln!("skipped: {test}: pypi.org is not reachable from this machine");
        return;
    }
    // The index's names, and the addresses they resolve to here: a machine whose resolver
    // sends them to a mirror on a private or reserved address must list it (as its user would).
    let mut entries = vec!["pypi.org".to_owned(), "files.pythonhosted.org".to_owned()];
    for host in ["pypi.org", "files.pythonhosted.org"] {
        for address in std::net::ToSocketAddrs::to_socket_addrs(&(host, 443))
            .into_iter()
            .flatten()
        {
            entries.push(match address.ip() {
                std::net::IpAddr::V4(ip) => ip.to_string(),
                std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            });
        }
    }
    let list: Allowlist = entries.join(",").parse().unwrap();
    let rt = KernelRuntime::with_config(
        KernelConfig::new()
            .spare(false)
            .sandbox(Sandbox::strict().allow_net(list))
            .env("PIP_INDEX_URL", "https://pypi.org/simple/")
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    )
    .unwrap();
    let out = run(&rt, &pip_install("inflection==0.5.1")).await;
    if without_pip(test, &out) {
        return;
    }
    assert!(out.output.starts_with("0\n"), "{out:?}");
    let out = run(
        &rt,
        "import inflection\nprint(inflection.camelize('cave_agent'))",
    )
    .await;
    assert_eq!(out.output, "CaveAgent\n", "{out:?}");
    assert!(
        out.connections.is_empty(),
        "nothing more went out: {:?}",
        out.connections
    );
}

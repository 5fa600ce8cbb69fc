//! The network where the host allows it: a worker under the strict sandbox with an allowlist
//! reaches the listed hosts through the host's proxy and nothing else; without one it reaches
//! nothing (the default, unchanged). Servers on 127.0.0.x of this machine only.

use cave_core::{DiscardOutput, Execution, Runtime};
use cave_runtime_kernel::{Allowlist, KernelConfig, KernelRuntime, Sandbox};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_listed_hosts_are_reached_through_the_proxy() {
    if cave_testing::machine::skips(
        "only_listed_hosts_are_reached_through_the_proxy",
        cave_runtime_kernel::Need::Namespaces.lacking(),
    ) {
        return;
    }
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
    // A cell that ignores the proxy finds no route: the namespace's loopback is its own.
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
    assert!(
        layers
            .iter()
            .any(|l| l.to_string().contains("out only through the host's proxy")),
        "{layers:?}"
    );
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

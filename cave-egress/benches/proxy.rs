//! The egress proxy's cost on loopback: a small request straight to a server and through the
//! proxy (the difference is what the proxy adds), and a 100 MB download through a `CONNECT`
//! tunnel (throughput).
//!
//! Run with `cargo xtask bench` (or `cargo bench -p cave-egress`).

use cave_egress::{Allowlist, EgressProxy};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Bytes of the large download.
const LARGE: usize = 100 << 20;

/// A server on 127.0.0.2 answering `GET /small` with 2 bytes and `GET /large` with 100 MB,
/// keeping connections alive; its address.
async fn server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.2:0").await.expect("binds");
    let address = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        let chunk = vec![b'x'; 1 << 20];
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let _ = stream.set_nodelay(true);
            let chunk = chunk.clone();
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 4096];
                let mut pending = Vec::new();
                loop {
                    let Ok(n) = stream.read(&mut buffer).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    pending.extend_from_slice(&buffer[..n]);
                    while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&pending[..end]).into_owned();
                        pending.drain(..end + 4);
                        let large = head.contains(" /large ");
                        let length = if large { LARGE } else { 2 };
                        let header = format!("HTTP/1.1 200 OK\r\ncontent-length: {length}\r\n\r\n");
                        if stream.write_all(header.as_bytes()).await.is_err() {
                            return;
                        }
                        if large {
                            for _ in 0..(LARGE / chunk.len()) {
                                if stream.write_all(&chunk).await.is_err() {
                                    return;
                                }
                            }
                        } else if stream.write_all(b"ok").await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    address
}

/// Reads one response (headers and a `content-length` body) from `stream`.
async fn response(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> usize {
    buffer.clear();
    let mut chunk = vec![0u8; 1 << 16];
    let (head_end, length) = loop {
        let n = stream.read(&mut chunk).await.expect("reads");
        assert!(n > 0, "the connection closed");
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("a content-length");
            break (end + 4, length);
        }
    };
    let mut have = buffer.len() - head_end;
    while have < length {
        let n = stream.read(&mut chunk).await.expect("reads");
        assert!(n > 0, "the connection closed");
        have += n;
    }
    have
}

fn proxy(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let (origin, proxy_at) = rt.block_on(async {
        let origin = server().await;
        let allowlist: Allowlist = format!("{}:{}", origin.ip(), origin.port())
            .parse()
            .expect("an allowlist");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let at = listener.local_addr().expect("an address");
        let proxy = EgressProxy::new(allowlist);
        tokio::spawn(async move { proxy.serve(listener).await });
        (origin, at)
    });
    let mut group = c.benchmark_group("egress");
    let small_direct = format!("GET /small HTTP/1.1\r\nHost: {origin}\r\n\r\n");
    let small_proxied = format!("GET http://{origin}/small HTTP/1.1\r\nHost: {origin}\r\n\r\n");
    let mut buffer = Vec::new();
    let mut direct = rt.block_on(TcpStream::connect(origin)).expect("connects");
    let _ = direct.set_nodelay(true);
    group.bench_function("request_direct", |b| {
        b.iter(|| {
            rt.block_on(async {
                direct
                    .write_all(small_direct.as_bytes())
                    .await
                    .expect("writes");
                response(&mut direct, &mut buffer).await
            })
        })
    });
    let mut proxied = rt.block_on(TcpStream::connect(proxy_at)).expect("connects");
    let _ = proxied.set_nodelay(true);
    group.bench_function("request_through_proxy", |b| {
        b.iter(|| {
            rt.block_on(async {
                proxied
                    .write_all(small_proxied.as_bytes())
                    .await
                    .expect("writes");
                response(&mut proxied, &mut buffer).await
            })
        })
    });
    group.sample_size(10);
    group.throughput(Throughput::Bytes(LARGE as u64));
    group.bench_function("download_100mb_through_connect", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut tunnel = TcpStream::connect(proxy_at).await.expect("connects");
                let connect = format!("CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\n\r\n");
                tunnel.write_all(connect.as_bytes()).await.expect("writes");
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    let mut byte = [0u8; 1];
                    tunnel.read_exact(&mut byte).await.expect("reads");
                    head.push(byte[0]);
                }
                let request = format!("GET /large HTTP/1.1\r\nHost: {origin}\r\n\r\n");
                tunnel.write_all(request.as_bytes()).await.expect("writes");
                response(&mut tunnel, &mut buffer).await
            })
        })
    });
    group.finish();
}

criterion_group!(benches, proxy);
criterion_main!(benches);

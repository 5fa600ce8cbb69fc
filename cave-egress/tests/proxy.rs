//! The proxy against servers on this machine only: an "allowed" HTTP server and a "refused"
//! one on 127.0.0.x, TLS through CONNECT with a test CA, names resolved by a resolver of the
//! test's own (what a hostile DNS answer would say), and a client that speaks raw HTTP.

use cave_egress::{Allowlist, EgressObserver, EgressProxy, EgressRecord, Resolver};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Names as the test's DNS answers them.
struct Answers(HashMap<&'static str, Vec<&'static str>>);

#[async_trait::async_trait]
impl Resolver for Answers {
    async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        let addresses = self.0.get(host).ok_or("no such name")?;
        Ok(addresses
            .iter()
            .map(|a| SocketAddr::new(a.parse().unwrap(), port))
            .collect())
    }
}

#[derive(Default)]
struct Records(Mutex<Vec<EgressRecord>>);

impl EgressObserver for Records {
    fn connection(&self, record: &EgressRecord) {
        self.0.lock().unwrap().push(record.clone());
    }
}

impl Records {
    /// Waits for `n` records (a tunnel is reported when it closes).
    async fn wait(&self, n: usize) -> Vec<EgressRecord> {
        for _ in 0..200 {
            if self.0.lock().unwrap().len() >= n {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        self.0.lock().unwrap().clone()
    }
}

/// An HTTP/1.1 server on `ip` that answers every request with `name`, the path and the Host
/// header it got, then `extra` bytes of `x`; returns its port.
async fn server(ip: &str, name: &'static str, extra: usize) -> u16 {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream);
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                    let mut host = String::new();
                    let mut close = false;
                    loop {
                        let mut header = String::new();
                        reader.read_line(&mut header).await.unwrap();
                        if header == "\r\n" {
                            break;
                        }
                        let lower = header.to_ascii_lowercase();
                        if let Some(h) = lower.strip_prefix("host:") {
                            host = h.trim().to_owned();
                        }
                        close |= lower.starts_with("connection:") && lower.contains("close");
                    }
                    let body = format!("{name} {path} {host}\n{}", "x".repeat(extra));
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if reader
                        .get_mut()
                        .write_all(response.as_bytes())
                        .await
                        .is_err()
                        || close
                    {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// The proxy serving on 127.0.0.1; its address.
async fn proxy(proxy: EgressProxy) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { proxy.serve(listener).await });
    address
}

/// Sends `request` to the proxy and reads the status line and the rest.
async fn ask(proxy: SocketAddr, request: &str) -> (String, String) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).await.unwrap();
    // Bytes read before the timeout stay in `rest` (a connection kept alive never ends).
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        reader.read_to_end(&mut rest),
    )
    .await;
    (
        status.trim_end().to_owned(),
        String::from_utf8_lossy(&rest).into_owned(),
    )
}

fn answers() -> Arc<Answers> {
    Arc::new(Answers(HashMap::from([
        ("allowed.test", vec!["127.0.0.2"]),
        ("metadata.test", vec!["169.254.169.254"]),
        ("loopback.test", vec!["127.0.0.1"]),
        ("mixed.test", vec!["151.101.0.223", "127.0.0.1"]),
    ])))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_goes_where_listed_and_nowhere_else() {
    let allowed = server("127.0.0.2", "allowed", 0).await;
    let other = server("127.0.0.3", "refused", 0).await;
    let records = Arc::new(Records::default());
    let list: Allowlist = format!("allowed.test:{allowed},127.0.0.2:{allowed}")
        .parse()
        .unwrap();
    let at = proxy(
        EgressProxy::new(list)
            .resolver(answers())
            .observer(records.clone()),
    )
    .await;
    let (status, body) = ask(
        at,
        &format!("GET http://allowed.test:{allowed}/a?b=1 HTTP/1.1\r\nHost: allowed.test:{allowed}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        body.ends_with(&format!("allowed /a?b=1 allowed.test:{allowed}\n")),
        "{body}"
    );
    // Not listed: refused, saying how to allow it.
    let (status, body) = ask(
        at,
        &format!("GET http://127.0.0.3:{other}/ HTTP/1.1\r\nHost: 127.0.0.3:{other}\r\n\r\n"),
    )
    .await;
    assert!(
        status.starts_with("HTTP/1.1 403 the host refused 127.0.0.3"),
        "{status:?} {body:?}"
    );
    assert!(
        body.contains(&format!("--allow-net 127.0.0.3:{other}")),
        "{body}"
    );
    // A Host header naming another server than the URL.
    let (status, _) = ask(
        at,
        &format!("GET http://allowed.test:{allowed}/ HTTP/1.1\r\nHost: 127.0.0.3:{other}\r\n\r\n"),
    )
    .await;
    assert!(status.contains("403"), "{status}");
    // A second request smuggled behind the first, to a host not listed: checked on its own.
    let (status, rest) = ask(
        at,
        &format!(
            "GET http://allowed.test:{allowed}/one HTTP/1.1\r\nHost: allowed.test:{allowed}\r\n\r\nGET http://127.0.0.3:{other}/two HTTP/1.1\r\nHost: 127.0.0.3:{other}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(rest.contains("HTTP/1.1 403"), "{rest}");
    assert!(
        !rest.contains("refused /two"),
        "the second request reached the other server: {rest}"
    );
    let seen = records.wait(5).await;
    assert!(
        seen.iter()
            .any(|r| r.allowed && r.host == "allowed.test" && r.received > 0),
        "{seen:?}"
    );
    assert!(seen.iter().filter(|r| !r.allowed).count() >= 3, "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_checks_names_ports_and_where_names_point() {
    let allowed = server("127.0.0.2", "allowed", 0).await;
    let list: Allowlist = format!(
        "allowed.test:{allowed},127.0.0.2:{allowed},metadata.test,loopback.test:{allowed},mixed.test"
    )
    .parse()
    .unwrap();
    let at = proxy(EgressProxy::new(list).resolver(answers())).await;
    // Through the tunnel: a request the proxy does not see.
    let mut stream = TcpStream::connect(at).await.unwrap();
    stream
        .write_all(
            format!(
                "CONNECT allowed.test:{allowed} HTTP/1.1\r\nHost: allowed.test:{allowed}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let mut blank = String::new();
    while blank != "\r\n" {
        blank.clear();
        reader.read_line(&mut blank).await.unwrap();
    }
    reader
        .get_mut()
        .write_all(b"GET /inside HTTP/1.1\r\nHost: anything\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut rest = String::new();
    reader.read_to_string(&mut rest).await.unwrap();
    assert!(rest.ends_with("allowed /inside anything\n"), "{rest}");
    // A listed name on an unlisted port; names pointing at the metadata service, at loopback
    // (listed on this port only by name), and at a public and a private address at once.
    for (target, said) in [
        (
            format!("allowed.test:{}", allowed.wrapping_add(1).max(1)),
            "is allowed on port".to_owned(),
        ),
        (
            "metadata.test:443".to_owned(),
            "resolves to 169.254.169.254".to_owned(),
        ),
        (
            format!("loopback.test:{allowed}"),
            "resolves to 127.0.0.1".to_owned(),
        ),
        (
            "mixed.test:443".to_owned(),
            "resolves to 127.0.0.1".to_owned(),
        ),
        (
            "unlisted.test:443".to_owned(),
            "not in the egress allowlist".to_owned(),
        ),
        (
            "[::1]:443".to_owned(),
            "an address, not a listed name".to_owned(),
        ),
    ] {
        let (status, _) = ask(
            at,
            &format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"),
        )
        .await;
        assert!(
            status.starts_with("HTTP/1.1 403") && status.contains(&said),
            "{target}: {status}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_passes_through_connect_untouched() {
    let names = vec!["allowed.test".to_owned()];
    let ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    let mut ca = ca;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(names)
        .unwrap()
        .signed_by(&leaf_key, &rcgen::Issuer::new(ca, &ca_key))
        .unwrap();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let server_config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config));
    let listener = TcpListener::bind("127.0.0.2:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let mut tls = acceptor.accept(stream).await.unwrap();
        let mut buffer = [0u8; 1024];
        let n = tls.read(&mut buffer).await.unwrap();
        assert!(buffer[..n].starts_with(b"GET /secret"));
        tls.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\nconnection: close\r\n\r\nsecret")
            .await
            .unwrap();
        tls.shutdown().await.unwrap();
    });
    let records = Arc::new(Records::default());
    let at = proxy(
        EgressProxy::new(format!("allowed.test:{port}").parse().unwrap())
            .resolver(Arc::new(Answers(HashMap::from([(
                "allowed.test",
                vec!["203.0.113.9"],
            )]))))
            .observer(records.clone()),
    )
    .await;
    // 203.0.113.9 is documentation space, refused unless listed: the name must be listed with
    // its address for the test's loopback server; instead the test lists the address here.
    let (status, _) = ask(at, &format!("CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n")).await;
    assert!(
        status.contains("403") && status.contains("203.0.113.9"),
        "{status}"
    );
    let at = proxy(
        EgressProxy::new(
            format!("allowed.test:{port},127.0.0.2:{port}")
                .parse()
                .unwrap(),
        )
        .resolver(answers())
        .observer(records.clone()),
    )
    .await;
    let mut stream = TcpStream::connect(at).await.unwrap();
    stream
        .write_all(
            format!("CONNECT allowed.test:{port} HTTP/1.1\r\nHost: allowed.test:{port}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca_cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let name = rustls::pki_types::ServerName::try_from("allowed.test").unwrap();
    let mut tls = connector.connect(name, stream).await.unwrap();
    tls.write_all(b"GET /secret HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    let _ = tls.read_to_string(&mut answer).await;
    assert!(answer.ends_with("secret"), "{answer}");
    drop(tls);
    let seen = records.wait(2).await;
    let tunnel = seen
        .iter()
        .find(|r| r.allowed)
        .expect("the tunnel is reported");
    assert!(tunnel.sent > 100 && tunnel.received > 100, "{tunnel:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_over_the_limit_is_cut_and_the_next_refused() {
    let big = server("127.0.0.2", "big", 200_000).await;
    let proxy_ =
        EgressProxy::new(format!("127.0.0.2:{big}").parse().unwrap()).max_download(Some(100_000));
    let counted = proxy_.clone();
    let at = proxy(proxy_).await;
    let (status, body) = ask(
        at,
        &format!("GET http://127.0.0.2:{big}/ HTTP/1.1\r\nHost: 127.0.0.2:{big}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body.len() < 150_000, "cut short: {} bytes", body.len());
    assert!(counted.downloaded() >= 100_000 && counted.downloaded() < 200_000);
    let (status, _) = ask(
        at,
        &format!("GET http://127.0.0.2:{big}/ HTTP/1.1\r\nHost: 127.0.0.2:{big}\r\n\r\n"),
    )
    .await;
    assert!(
        status.contains("403") && status.contains("--max-egress"),
        "{status}"
    );
}

/// A thousand connections at once: served a bounded number at a time, every one answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_connections_at_once_are_all_answered() {
    let at = proxy(EgressProxy::new(Allowlist::default())).await;
    let asks: Vec<_> = (0..1000)
        .map(|i| {
            tokio::spawn(async move {
                ask(at, &format!("CONNECT host{i}.test:443 HTTP/1.1\r\n\r\n"))
                    .await
                    .0
            })
        })
        .collect();
    let mut refused = 0;
    for ask in asks {
        let status = ask.await.unwrap();
        assert!(status.starts_with("HTTP/1.1 403"), "{status}");
        refused += 1;
    }
    assert_eq!(refused, 1000);
}

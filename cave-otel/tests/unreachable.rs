//! A receiver that is not there: the spans are counted as lost and `finish` says so, with the
//! endpoint; nothing panics or hangs. Its own binary: `install` takes the process's subscriber.

#[test]
fn spans_a_missing_receiver_did_not_take_are_reported() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let guard = cave_otel::install(cave_otel::OtlpConfig::new(&url)).expect("installs");
    for n in 0..3 {
        let span = tracing::info_span!(target: "cave_otel_test", "step", n);
        span.in_scope(|| {});
    }
    // Not ours: filtered out, never exported.
    tracing::info_span!(target: "other_crate", "noise").in_scope(|| {});
    match guard.finish() {
        Err(cave_otel::OtelError::NotSent {
            endpoint, spans, ..
        }) => {
            assert_eq!(endpoint, format!("{url}/v1/traces"));
            assert_eq!(spans, 3, "only cave's spans are exported");
        }
        other => panic!("expected the spans reported lost: {other:?}"),
    }
}

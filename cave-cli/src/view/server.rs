//! The viewer's HTTP side: the page and its assets, the session's events as server-sent
//! events, and the files cells showed. Only this machine is served (a loopback address, and a
//! `Host` naming it, so that another site cannot reach it through DNS rebinding), and nothing
//! a cell made can run script in the page.

use super::feed::{Feed, Progress, valid_mime};
use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::Stream;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

const PAGE: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/view.js");
const STYLE: &str = include_str!("assets/view.css");

/// The page's own policy: its script and style only, from here; images and frames from here;
/// never framed by another page.
const PAGE_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; frame-src 'self'; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// What a cell showed, served in a sandbox with no script at all (the iframe's `sandbox`
/// attribute says the same; either alone would do), opened directly or framed by the page.
/// `allow-same-origin` without `allow-scripts` keeps the page's origin, so that the page can
/// read the content's height and size its frame, and still runs no script of its own.
const DISPLAY_POLICY: &str = "sandbox allow-same-origin; default-src 'none'; \
     script-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'; font-src data:";

#[derive(Clone, Debug)]
struct Served {
    feed: Feed,
    title: Arc<str>,
}

/// The routes, for a server bound to `addr`.
pub(super) fn router(feed: Feed, title: &str, addr: SocketAddr) -> Router {
    let hosts: Arc<[String]> = allowed_hosts(addr).into();
    Router::new()
        .route("/", get(page))
        .route("/view.js", get(script))
        .route("/view.css", get(style))
        .route("/events", get(events))
        .route("/display/{index}/{kind}/{subtype}", get(display))
        .with_state(Served {
            feed,
            title: Arc::from(title),
        })
        .layer(middleware::from_fn_with_state(hosts, guard))
}

/// The `Host` values that name this server.
fn allowed_hosts(addr: SocketAddr) -> Vec<String> {
    let port = addr.port();
    let mut hosts = vec![format!("localhost:{port}")];
    hosts.push(match addr {
        SocketAddr::V4(v4) => format!("{}:{port}", v4.ip()),
        SocketAddr::V6(v6) => format!("[{}]:{port}", v6.ip()),
    });
    hosts
}

/// Refuses a request whose `Host` is not this server, and marks every answer as neither
/// sniffed, cached nor referred.
async fn guard(State(hosts): State<Arc<[String]>>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let mut response = if hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
        next.run(request).await
    } else {
        (
            StatusCode::FORBIDDEN,
            "this viewer answers only to the address it printed\n",
        )
            .into_response()
    };
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn page(State(served): State<Served>) -> Response {
    let page = PAGE.replace("{{title}}", &escape_html(&served.title));
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, PAGE_POLICY),
        ],
        page,
    )
        .into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

/// The session as server-sent events: every entry from the start (or after the one a
/// reconnecting page last had), then each new one as it comes; an `end` event when the run is
/// over, after which the stream closes.
async fn events(
    State(served): State<Served>,
    headers: HeaderMap,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let start = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(0, |last| last.saturating_add(1));
    let progress = served.feed.subscribe();
    let stream = futures_util::stream::unfold(
        (start, progress, served.feed, false),
        |(mut next, mut progress, feed, mut ended)| async move {
            loop {
                if ended {
                    return None;
                }
                if let Some(entry) = feed.entry(next) {
                    let event = SseEvent::default().id(next.to_string()).data(&*entry);
                    next += 1;
                    return Some((Ok(event), (next, progress, feed, ended)));
                }
                let Progress {
                    entries,
                    ended: over,
                } = *progress.borrow_and_update();
                if entries > next {
                    continue;
                }
                if over {
                    ended = true;
                    let event = SseEvent::default().event("end").data("the run ended");
                    return Some((Ok(event), (next, progress, feed, ended)));
                }
                if progress.changed().await.is_err() {
                    return None;
                }
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// A file a cell showed: only one that an entry of this session names, under the type it
/// was shown as, with no script.
async fn display(
    State(served): State<Served>,
    Path((index, kind, subtype)): Path<(usize, String, String)>,
) -> Response {
    let mime = format!("{kind}/{subtype}");
    let Some(path) = valid_mime(&mime)
        .then(|| served.feed.file(index, &mime))
        .flatten()
    else {
        return (StatusCode::NOT_FOUND, "this session showed no such file\n").into_response();
    };
    let read = tokio::task::spawn_blocking({
        let path = path.clone();
        move || std::fs::read(path)
    })
    .await;
    let bytes = match read {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            let message = format!("{} cannot be read: {e}\n", path.display());
            return (StatusCode::NOT_FOUND, message).into_response();
        }
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let content_type = if kind == "text" {
        format!("{mime}; charset=utf-8")
    } else {
        mime
    };
    let Ok(content_type) = HeaderValue::from_str(&content_type) else {
        return (StatusCode::NOT_FOUND, "this session showed no such file\n").into_response();
    };
    (
        [
            (header::CONTENT_TYPE, content_type),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(DISPLAY_POLICY),
            ),
        ],
        bytes,
    )
        .into_response()
}

/// `text` safe inside an HTML element or a quoted attribute.
fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_name_the_bound_address_only() {
        let v4: SocketAddr = "127.0.0.1:8123".parse().unwrap();
        assert_eq!(allowed_hosts(v4), ["localhost:8123", "127.0.0.1:8123"]);
        let v6: SocketAddr = "[::1]:9".parse().unwrap();
        assert_eq!(allowed_hosts(v6), ["localhost:9", "[::1]:9"]);
    }

    #[test]
    fn titles_are_escaped() {
        assert_eq!(
            escape_html("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }
}

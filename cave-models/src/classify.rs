//! Turning provider failures into the core's error kinds, and deciding what to retry.

use crate::wire::{ErrorBody, ErrorObject};
use cave_core::{ModelError, ModelErrorKind};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Status codes worth retrying.
const RETRYABLE: &[u16] = &[408, 429, 500, 502, 503, 504, 529];

/// Phrases of providers saying the prompt does not fit (checked before billing).
const PROMPT_TOO_LONG: &[&str] = &[
    "context length",
    "context window",
    "maximum number of tokens",
    "maximum allowed length",
    "max_model_len",
    "maximum model length",
    "prompt length",
    "n_ctx_slot",
    "slot context",
    "truncating input",
    "prompt is too long",
    "input is too long",
    "input token count",
    "number of input tokens",
    "上下文长度",
    "超过最大长度",
];

/// Phrases of providers saying the account cannot pay.
const BILLING: &[&str] = &[
    "insufficient_quota",
    "exceeded your current quota",
    "billing hard limit",
    "insufficient credits",
    "credits exhausted",
    "credits have been exhausted",
    "no usable credits",
    "top up your credits",
    "key limit exceeded",
    "spending limit",
    "credit balance",
    "out of extra usage",
    "insufficient balance",
    "insufficient_balance",
    "balance is not enough",
    "balance_depleted",
    "arrearage",
    "payment required",
    "out of funds",
    "run out of funds",
];

/// What a failed HTTP response says.
#[derive(Debug)]
pub(crate) struct HttpFailure<'a> {
    pub(crate) status: u16,
    pub(crate) body: &'a str,
    pub(crate) retry_after: Option<Duration>,
}

/// Classifies a failed HTTP response of an OpenAI-shaped API as the built-in adapters do:
/// the status, the error body's `code` and message (context length, billing, auth...), and
/// the `Retry-After` wait. For a custom [`Model`](cave_core::Model) over such an API; wrap it
/// in [`Retrying`](crate::Retrying) for the retries.
pub fn classify_http(status: u16, body: &str, retry_after: Option<Duration>) -> ModelError {
    classify_response(
        &HttpFailure {
            status,
            body,
            retry_after,
        },
        &str::to_owned,
    )
}

/// Reads a `Retry-After` header value: seconds, or an HTTP date.
pub fn retry_after(value: &str) -> Option<Duration> {
    parse_retry_after(value)
}

/// Classifies a failed response. `redact` removes secrets from the message.
pub(crate) fn classify_response(
    failure: &HttpFailure<'_>,
    redact: &dyn Fn(&str) -> String,
) -> ModelError {
    let parsed: ErrorBody = serde_json::from_str(failure.body).unwrap_or_default();
    let (message, code) = describe(&parsed, failure.body);
    let message = redact(&message);
    let kind = kind_of(
        Some(failure.status),
        code.as_deref(),
        &message,
        failure.retry_after,
    );
    ModelError::new(kind, format!("HTTP {}: {message}", failure.status))
}

/// Classifies an error object a provider put inside the stream.
pub(crate) fn classify_stream_error(
    error: &ErrorObject,
    redact: &dyn Fn(&str) -> String,
) -> ModelError {
    let message = redact(
        error
            .message
            .as_deref()
            .unwrap_or("the provider reported an error in the stream"),
    );
    let code = error.code.as_ref().map(json_text);
    let named = error.kind.as_ref().map(json_text);
    // Its status: given, a numeric code, or what the code or type names.
    let status = error
        .status
        .as_ref()
        .map(json_text)
        .and_then(|s| s.parse::<u16>().ok())
        .or_else(|| code.as_deref().and_then(|c| c.parse::<u16>().ok()))
        .or_else(|| {
            [&code, &named]
                .into_iter()
                .flatten()
                .find_map(|n| status_named(n))
        });
    let filtered = [&code, &named]
        .into_iter()
        .flatten()
        .any(|n| n.contains("content_filter") || n.contains("content_policy"));
    let kind = if filtered {
        ModelErrorKind::ContentFiltered
    } else {
        kind_of(status, code.as_deref(), &message, None)
    };
    ModelError::new(kind, format!("the provider failed mid-stream: {message}"))
}

/// The HTTP status an error's code or type stands for (`rate_limit_error`, `overloaded_error`,
/// `server_error`, `authentication_error`…), as providers name them in streamed errors.
fn status_named(name: &str) -> Option<u16> {
    let name = name.to_ascii_lowercase();
    let has = |parts: &[&str]| parts.iter().any(|p| name.contains(p));
    if has(&["rate_limit", "too_many_requests"]) {
        Some(429)
    } else if has(&["overloaded", "unavailable", "capacity"]) {
        Some(503)
    } else if has(&["server_error", "internal", "api_error", "timeout"]) {
        Some(500)
    } else if has(&["authentication", "invalid_api_key", "unauthorized"]) {
        Some(401)
    } else if has(&["permission"]) {
        Some(403)
    } else if has(&["invalid_request"]) {
        Some(400)
    } else {
        None
    }
}

/// Classifies a transport failure (no HTTP status).
pub(crate) fn classify_transport(
    error: &reqwest::Error,
    redact: &dyn Fn(&str) -> String,
) -> ModelError {
    let message = redact(&cave_core::error_chain(error));
    let kind = if error.is_timeout() || error.is_connect() || error.is_request() || error.is_body()
    {
        ModelErrorKind::Transient { retry_after: None }
    } else if error.is_decode() {
        ModelErrorKind::StreamInterrupted
    } else {
        ModelErrorKind::Other
    };
    ModelError::new(kind, format!("could not reach the model: {message}"))
}

/// The message and code of an error body (or the raw text when it is not JSON).
fn describe(body: &ErrorBody, raw: &str) -> (String, Option<String>) {
    if let Some(error) = &body.error {
        let message = error
            .message
            .clone()
            .unwrap_or_else(|| raw.trim().to_owned());
        let code = error
            .code
            .as_ref()
            .map(json_text)
            .or_else(|| error.kind.as_ref().map(json_text));
        return (message, code);
    }
    if let Some(message) = &body.message {
        return (message.clone(), None);
    }
    if let Some(detail) = &body.detail {
        return (json_text(detail), None);
    }
    let raw = raw.trim();
    let shown = cave_core::shorten(raw, 500).0.to_owned();
    (
        if shown.is_empty() {
            "no error details".to_owned()
        } else {
            shown
        },
        None,
    )
}

fn json_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The kind, from the most to the least specific evidence.
pub(crate) fn kind_of(
    status: Option<u16>,
    code: Option<&str>,
    message: &str,
    retry_after: Option<Duration>,
) -> ModelErrorKind {
    let lower = message.to_lowercase();
    let code_is = |c: &str| code.is_some_and(|code| code.eq_ignore_ascii_case(c));
    if status == Some(413)
        || code_is("context_length_exceeded")
        || PROMPT_TOO_LONG.iter().any(|p| lower.contains(p))
    {
        return ModelErrorKind::PromptTooLong;
    }
    if status == Some(402)
        || code_is("402")
        || code_is("insufficient_quota")
        || BILLING.iter().any(|p| lower.contains(p))
    {
        return ModelErrorKind::BillingExhausted;
    }
    match status {
        Some(401 | 403) => ModelErrorKind::Auth,
        Some(s) if RETRYABLE.contains(&s) => ModelErrorKind::Transient { retry_after },
        Some(400..=499) => ModelErrorKind::InvalidRequest,
        _ => ModelErrorKind::Other,
    }
}

/// Parses `Retry-After`: delay-seconds (fractions accepted) or an HTTP-date.
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds));
    }
    let at = parse_http_date(value)?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(at.saturating_sub(now)))
}

/// Seconds since the epoch of an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn parse_http_date(value: &str) -> Option<u64> {
    let mut parts = value.split_whitespace();
    let _weekday = parts.next()?;
    let day: u64 = parts.next()?.parse().ok()?;
    let month = match parts.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: i64 = parts.next()?.parse().ok()?;
    let mut clock = parts.next()?.split(':').map(|p| p.parse::<u64>().ok());
    let (h, m, s) = (clock.next()??, clock.next()??, clock.next()??);
    if parts.next()? != "GMT" || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, mo) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * mo as i64 + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days)
        .ok()
        .map(|d| d * 86_400 + h * 3600 + m * 60 + s)
}

/// Returns true if and only if a failure of this kind may succeed when tried again.
pub(crate) fn is_retryable(kind: &ModelErrorKind) -> bool {
    matches!(kind, ModelErrorKind::Transient { .. })
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn http_dates() {
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 UTC"), None);
        assert_eq!(parse_retry_after("1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon"), None);
    }

    #[test]
    fn kinds_follow_the_evidence() {
        let k =
            |status: Option<u16>, code: Option<&str>, msg: &str| kind_of(status, code, msg, None);
        assert_eq!(
            k(
                Some(400),
                None,
                "This model's maximum context length is 8192 tokens"
            ),
            ModelErrorKind::PromptTooLong
        );
        assert_eq!(
            k(Some(400), Some("context_length_exceeded"), "x"),
            ModelErrorKind::PromptTooLong
        );
        assert_eq!(
            k(Some(400), None, "请求超过最大长度"),
            ModelErrorKind::PromptTooLong
        );
        assert_eq!(
            k(Some(400), None, "max_tokens must be positive"),
            ModelErrorKind::InvalidRequest
        );
        assert_eq!(
            k(
                Some(429),
                Some("insufficient_quota"),
                "You exceeded your current quota"
            ),
            ModelErrorKind::BillingExhausted
        );
        assert_eq!(k(Some(402), None, "x"), ModelErrorKind::BillingExhausted);
        assert_eq!(k(Some(401), None, "bad key"), ModelErrorKind::Auth);
        assert_eq!(
            k(Some(529), None, "overloaded"),
            ModelErrorKind::Transient { retry_after: None }
        );
        assert_eq!(
            k(Some(400), None, "timeout while reading"),
            ModelErrorKind::InvalidRequest,
            "the status is authoritative"
        );
        assert_eq!(k(Some(501), None, "x"), ModelErrorKind::Other);
    }
}

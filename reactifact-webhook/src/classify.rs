//! Turning an HTTP outcome into a delivery outcome: delivered, retryable, permanent or held.

use std::time::{Duration, SystemTime};

use reactifact_core::DispatchError;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{Response, StatusCode};

use crate::error::WebhookError;

/// How many bytes of an error response's body are read for the message.
const SNIPPET_BYTES: usize = 512;
/// How many characters of it the message keeps.
const SNIPPET_CHARS: usize = 200;

/// What an answer's status means for the delivery. The dispatcher classifies every status with
/// [`Classification::default_for`] unless [`WebhookBuilder::classify`](crate::WebhookBuilder::classify)
/// says otherwise for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Classification {
    /// The receiver has the intent: the delivery is recorded as delivered.
    Delivered,
    /// Trying again may help: a retryable [`DispatchError`], retried after the retry policy's
    /// backoff and no earlier than the answer's `Retry-After`.
    Retryable,
    /// Trying again cannot help: a permanent [`DispatchError`]; the intent is dead at once
    /// (re-armable by hand).
    Permanent,
}

impl Classification {
    /// The default: 2xx is delivered; 408 (request timeout), 409 (conflict: a receiver that
    /// honours `Idempotency-Key` answers it while a request with the same key is still in
    /// progress, which a redelivery can cause), 429 (too many requests) and 5xx are
    /// retryable; every other status (1xx, 3xx, which is not followed, the other 4xx) is
    /// permanent.
    pub fn default_for(status: StatusCode) -> Self {
        if status.is_success() {
            Classification::Delivered
        } else if matches!(
            status,
            StatusCode::REQUEST_TIMEOUT | StatusCode::CONFLICT | StatusCode::TOO_MANY_REQUESTS
        ) || status.is_server_error()
        {
            Classification::Retryable
        } else {
            Classification::Permanent
        }
    }
}

/// The delay an answer's `Retry-After` header asks for: delta-seconds (`120`) or an HTTP-date
/// (`Wed, 21 Oct 2015 07:28:00 GMT`, measured from the system clock; a date in the past means
/// "now", [`Duration::ZERO`]). `None` when the header is missing or reads as neither.
///
/// The dispatcher uses it for every retryable answer; other HTTP clients of reactifact (the
/// model client) share it so that every client honours the header the same way.
///
/// ```
/// use std::time::Duration;
///
/// use reactifact_webhook::retry_after;
/// use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
///
/// let mut headers = HeaderMap::new();
/// headers.insert(RETRY_AFTER, HeaderValue::from_static("7"));
/// assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
/// assert_eq!(retry_after(&HeaderMap::new()), None);
/// ```
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO))
}

/// The error for a response not classified as delivered, with the start of its body and, if
/// it is retryable, its `Retry-After`.
pub(crate) async fn status_error(url: &str, mut response: Response, retryable: bool) -> WebhookError {
    let status = response.status();
    let retry_after = if retryable {
        retry_after(response.headers())
    } else {
        None
    };
    let mut bytes = Vec::new();
    while bytes.len() < SNIPPET_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    bytes.truncate(SNIPPET_BYTES);
    WebhookError::Status {
        url: url.to_owned(),
        status,
        body: snippet(&bytes),
        retry_after,
        retryable,
    }
}

/// The body as one short line: lossy UTF-8, whitespace collapsed, cut at a character boundary.
fn snippet(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::new();
    for (i, word) in text.split_whitespace().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(word);
    }
    if out.chars().count() > SNIPPET_CHARS {
        out = out.chars().take(SNIPPET_CHARS).collect();
        out.push('…');
    }
    out
}

/// The outcome of a request that got no response.
pub(crate) fn transport_error(url: &str, timeout: Duration, error: reqwest::Error) -> WebhookError {
    let url = url.to_owned();
    if error.is_timeout() {
        return WebhookError::Timeout { url, after: timeout };
    }
    let connect = error.is_connect();
    let reason = describe(&error.without_url());
    if connect {
        WebhookError::Connect { url, reason }
    } else {
        WebhookError::Request { url, reason }
    }
}

/// An error's causes on one line. reqwest's own outer message ("error sending request") is
/// left out when there is a cause, since the caller's message already says what failed.
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let Some(first) = error.source() else {
        return error.to_string();
    };
    let mut out = first.to_string();
    let mut source = first.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

impl WebhookError {
    /// The error as the outbox sees it: a kind without a URL is
    /// [`no_route`](DispatchError::no_route) (the intent is held, as a
    /// [`Router`](reactifact_core::Router) holds a kind it has no route for); otherwise
    /// permanent unless [`is_retryable`](Self::is_retryable), carrying the receiver's
    /// `Retry-After` as [`DispatchError::retry_after`].
    pub fn into_dispatch_error(self) -> DispatchError {
        if matches!(self, WebhookError::NoRoute { .. }) {
            return DispatchError::no_route(self);
        }
        if !self.is_retryable() {
            return DispatchError::permanent(self);
        }
        let hint = match &self {
            WebhookError::Status { retry_after, .. } => *retry_after,
            _ => None,
        };
        let dispatch = DispatchError::retryable(self);
        match hint {
            Some(delay) => dispatch.retry_after(delay),
            None => dispatch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(retry_after: &str) -> HeaderMap {
        let mut map = HeaderMap::new();
        map.insert(RETRY_AFTER, HeaderValue::from_str(retry_after).unwrap());
        map
    }

    #[test]
    fn retry_after_reads_delta_seconds() {
        assert_eq!(retry_after(&headers("7")), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(&headers(" 120 ")), Some(Duration::from_secs(120)));
    }

    #[test]
    fn retry_after_reads_an_http_date() {
        let later = SystemTime::now() + Duration::from_secs(3600);
        let delay = retry_after(&headers(&httpdate::fmt_http_date(later))).unwrap();
        assert!(delay > Duration::from_secs(3500) && delay <= Duration::from_secs(3600));
        assert_eq!(
            retry_after(&headers("Wed, 21 Oct 2015 07:28:00 GMT")),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn an_unreadable_retry_after_is_ignored() {
        assert_eq!(retry_after(&headers("soon")), None);
        assert_eq!(retry_after(&HeaderMap::new()), None);
    }

    #[test]
    fn the_snippet_is_one_short_line() {
        assert_eq!(snippet(b"  bad\n  request \t body "), "bad request body");
        let long = "é".repeat(300);
        let cut = snippet(long.as_bytes());
        assert_eq!(cut.chars().count(), SNIPPET_CHARS + 1);
        assert!(cut.ends_with('…'));
    }
}

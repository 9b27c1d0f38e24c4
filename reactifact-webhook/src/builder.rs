//! Configuring a [`WebhookDispatcher`].

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::{Client, StatusCode, Url};

use crate::classify::Classification;
use crate::dispatcher::{Inner, Target, ATTEMPT_HEADER, IDEMPOTENCY_KEY, KIND_HEADER, TRACEPARENT};
use crate::error::BuildError;
use crate::WebhookDispatcher;

/// The request timeout unless [`WebhookBuilder::timeout`] sets another.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Configures a [`WebhookDispatcher`]. Nothing is checked until [`build`](Self::build), which
/// reports the first invalid URL or header.
#[derive(Default)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct WebhookBuilder {
    default: Option<String>,
    routes: BTreeMap<String, String>,
    headers: Vec<(String, String)>,
    timeout: Option<Duration>,
    client: Option<Client>,
    classes: BTreeMap<u16, Classification>,
}

/// Shows the kinds routed and the header names only: URLs and header values may hold secrets.
impl fmt::Debug for WebhookBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookBuilder")
            .field("default", &self.default.is_some())
            .field("routes", &self.routes.keys().collect::<Vec<_>>())
            .field(
                "headers",
                &self.headers.iter().map(|(name, _)| name).collect::<Vec<_>>(),
            )
            .field("timeout", &self.timeout)
            .field("client", &self.client.is_some())
            .field("classify", &self.classes)
            .finish()
    }
}

impl WebhookBuilder {
    /// The URL for every kind that has no URL of its own.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.default = Some(url.into());
        self
    }

    /// The URL for intents of `kind`; replaces an earlier one for the same kind.
    pub fn route(mut self, kind: impl Into<String>, url: impl Into<String>) -> Self {
        self.routes.insert(kind.into(), url.into());
        self
    }

    /// An extra header sent with every request (an `Authorization` token, say). The headers the
    /// dispatcher sets itself — `Content-Type`, `Idempotency-Key`, `X-Reactifact-Kind`,
    /// `X-Reactifact-Attempt` — cannot be overridden.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The request timeout: connecting, sending and receiving the answer's head must fit in
    /// it. A request that times out is a retryable failure. Default: [`DEFAULT_TIMEOUT`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sends through this client instead of a new one (to share a connection pool, use a
    /// proxy, or TLS settings of your own). Whatever redirect policy it has applies; the
    /// dispatcher's own client follows no redirects.
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Classifies answers with `status` as `classification` instead of
    /// [`Classification::default_for`]; replaces an earlier one for the same status. For a
    /// receiver that answers 409 for a key it has already processed, say,
    /// `.classify(409, Classification::Delivered)`; for one whose 503 means "never", say,
    /// `.classify(503, Classification::Permanent)`. `build` refuses a status outside 100–999.
    pub fn classify(mut self, status: u16, classification: Classification) -> Self {
        self.classes.insert(status, classification);
        self
    }

    /// Checks the URLs, headers and classified statuses and builds the dispatcher.
    pub fn build(self) -> Result<WebhookDispatcher, BuildError> {
        let own_client = self.client.is_none();
        let default = self.default.map(|url| target(&url, own_client)).transpose()?;
        let routes = self
            .routes
            .into_iter()
            .map(|(kind, url)| Ok((kind, target(&url, own_client)?)))
            .collect::<Result<_, BuildError>>()?;
        let classes = self
            .classes
            .into_iter()
            .map(|(status, class)| match StatusCode::from_u16(status) {
                Ok(code) => Ok((code, class)),
                Err(_) => Err(BuildError::InvalidStatus { status }),
            })
            .collect::<Result<_, BuildError>>()?;
        let mut headers = HeaderMap::new();
        for (name, value) in self.headers {
            let invalid = |reason: String| BuildError::InvalidHeader {
                name: name.clone(),
                reason,
            };
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|e| invalid(e.to_string()))?;
            if header == CONTENT_TYPE
                || [IDEMPOTENCY_KEY, KIND_HEADER, ATTEMPT_HEADER, TRACEPARENT].contains(&header.as_str())
            {
                return Err(BuildError::ReservedHeader { name });
            }
            let mut value = HeaderValue::from_str(&value).map_err(|e| invalid(e.to_string()))?;
            value.set_sensitive(true);
            headers.append(header, value);
        }
        let client = match self.client {
            Some(client) => client,
            None => Client::builder()
                .user_agent(concat!("reactifact-webhook/", env!("CARGO_PKG_VERSION")))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| BuildError::Client { reason: e.to_string() })?,
        };
        Ok(WebhookDispatcher::from_inner(Inner {
            client,
            default,
            routes,
            headers,
            timeout: self.timeout.unwrap_or(DEFAULT_TIMEOUT),
            classes,
        }))
    }
}

fn target(url: &str, own_client: bool) -> Result<Target, BuildError> {
    let parsed = Url::parse(url).map_err(|e| BuildError::InvalidUrl {
        url: url.to_owned(),
        reason: e.to_string(),
    })?;
    let shown = shown(&parsed);
    let refuse = |reason| {
        Err(BuildError::UnsupportedScheme {
            url: shown.clone(),
            reason,
        })
    };
    match parsed.scheme() {
        "http" => {}
        "https" if cfg!(feature = "rustls") || !own_client => {}
        "https" => {
            return refuse(
                "https needs TLS: enable the `rustls` feature of reactifact-webhook, or pass a client with TLS",
            )
        }
        _ => return refuse("only http and https URLs can be posted to"),
    }
    Ok(Target { url: parsed, shown })
}

/// The URL as messages show it: any password and the query string are hidden, since either
/// may hold a secret.
fn shown(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    shown.set_fragment(None);
    let had_query = shown.query().is_some();
    shown.set_query(None);
    let mut text = String::from(shown);
    if had_query {
        text.push_str("?…");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_a_url_are_hidden() {
        let url = Url::parse("http://user:hunter2@example.invalid:8080/hook?token=abc#x").unwrap();
        assert_eq!(shown(&url), "http://user:***@example.invalid:8080/hook?…");
    }

    #[test]
    fn debug_output_shows_no_secret() {
        let builder = WebhookDispatcher::builder()
            .url("http://user:hunter2@127.0.0.1:9/hook?token=abc")
            .header("Authorization", "Bearer s3cret");
        let dispatcher_debug = format!("{:?}", builder);
        assert!(!dispatcher_debug.contains("hunter2") && !dispatcher_debug.contains("s3cret"));
        let dispatcher = builder.build().unwrap();
        let debug = format!("{dispatcher:?}");
        assert!(debug.contains("authorization"), "{debug}");
        for secret in ["hunter2", "abc", "s3cret"] {
            assert!(!debug.contains(secret), "{debug}");
        }
    }

    #[test]
    fn routes_fall_back_to_the_default() {
        let dispatcher = WebhookDispatcher::builder()
            .url("http://127.0.0.1:9/all")
            .route("email", "http://127.0.0.1:9/email")
            .build()
            .unwrap();
        assert_eq!(dispatcher.url_for("email").unwrap().path(), "/email");
        assert_eq!(dispatcher.url_for("sms").unwrap().path(), "/all");
        let no_default = WebhookDispatcher::builder()
            .route("email", "http://127.0.0.1:9/email")
            .build()
            .unwrap();
        assert!(no_default.url_for("sms").is_none());
    }

    #[test]
    fn bad_settings_are_refused_at_build() {
        let error = WebhookDispatcher::new("not a url").unwrap_err();
        assert!(matches!(error, BuildError::InvalidUrl { .. }), "{error}");
        let error = WebhookDispatcher::new("ftp://example.invalid/x").unwrap_err();
        assert!(matches!(error, BuildError::UnsupportedScheme { .. }), "{error}");
        let error = WebhookDispatcher::builder()
            .url("http://127.0.0.1:9/")
            .header("Idempotency-Key", "mine")
            .build()
            .unwrap_err();
        assert!(matches!(error, BuildError::ReservedHeader { .. }), "{error}");
        let error = WebhookDispatcher::builder()
            .url("http://127.0.0.1:9/")
            .header("bad header", "x")
            .build()
            .unwrap_err();
        assert!(matches!(error, BuildError::InvalidHeader { .. }), "{error}");
    }

    #[test]
    #[cfg(not(feature = "rustls"))]
    fn https_without_tls_names_the_feature() {
        let error = WebhookDispatcher::new("https://example.invalid/hook").unwrap_err();
        assert!(error.to_string().contains("`rustls` feature"), "{error}");
    }
}

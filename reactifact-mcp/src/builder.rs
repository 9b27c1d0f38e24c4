//! Configuring an [`McpDispatcher`].

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{Client, Url};

use crate::classify::Classification;
use crate::dispatcher::{Inner, Server};
use crate::error::BuildError;
use crate::session::Sessions;
use crate::McpDispatcher;

/// The timeout of a tool call (and of opening a session) unless [`McpBuilder::timeout`] sets
/// another.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Headers the MCP transport sets itself: an extra header cannot replace them.
const RESERVED_HEADERS: [&str; 6] = [
    "accept",
    "content-type",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
    "authorization",
];

/// Configures an [`McpDispatcher`]. Nothing is checked until [`build`](Self::build), which
/// reports the first invalid URL or header.
#[must_use = "a builder does nothing until `build` is called"]
pub struct McpBuilder {
    url: String,
    routes: BTreeMap<String, String>,
    routes_only: bool,
    headers: Vec<(String, String)>,
    bearer: Option<String>,
    timeout: Option<Duration>,
    client: Option<Client>,
    tool_error: Classification,
    codes: BTreeMap<i32, Classification>,
}

/// Shows the kinds routed and the header names only: the URL, header values and the token may
/// hold secrets.
impl fmt::Debug for McpBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpBuilder")
            .field("routes", &self.routes)
            .field("routes_only", &self.routes_only)
            .field(
                "headers",
                &self.headers.iter().map(|(name, _)| name).collect::<Vec<_>>(),
            )
            .field("bearer_token", &self.bearer.is_some())
            .field("timeout", &self.timeout)
            .field("client", &self.client.is_some())
            .field("on_tool_error", &self.tool_error)
            .field("classify_code", &self.codes)
            .finish_non_exhaustive()
    }
}

impl McpBuilder {
    pub(crate) fn new(url: String) -> Self {
        McpBuilder {
            url,
            routes: BTreeMap::new(),
            routes_only: false,
            headers: Vec::new(),
            bearer: None,
            timeout: None,
            client: None,
            tool_error: Classification::Permanent,
            codes: BTreeMap::new(),
        }
    }

    /// Intents of `kind` call the tool `tool`; replaces an earlier route for the same kind.
    /// A kind without a route calls the tool named like the kind, unless
    /// [`routes_only`](Self::routes_only) is set.
    pub fn route(mut self, kind: impl Into<String>, tool: impl Into<String>) -> Self {
        self.routes.insert(kind.into(), tool.into());
        self
    }

    /// Calls tools for routed kinds only: an intent of a kind without a [`route`](Self::route)
    /// is **held** in the ledger (neither failed nor dead) rather than sent to a tool of its
    /// kind's name. For a server whose tools are not all meant to be reached by intents.
    pub fn routes_only(mut self) -> Self {
        self.routes_only = true;
        self
    }

    /// An extra HTTP header sent with every request (an API key, say). The headers the
    /// transport sets itself — `Accept`, `Content-Type`, `Mcp-Session-Id`,
    /// `Mcp-Protocol-Version`, `Last-Event-Id`, `Authorization` — cannot be set here.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sends `Authorization: Bearer {token}` with every request.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.bearer = Some(token.into());
        self
    }

    /// The timeout of one tool call, and separately of opening a session (the `initialize`
    /// handshake). A call that times out is retryable, and the session is dropped: the next
    /// call opens a new one. Default: [`DEFAULT_TIMEOUT`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Connects through this HTTP client instead of rmcp's default one (for a proxy, TLS
    /// settings of your own, or a redirect policy of your own).
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// What a result with `isError: true` means for the delivery. Default:
    /// [`Classification::Permanent`] — the tool ran and refused (the intent goes to the dead
    /// letter, with the result's text as its error). `Retryable` for tools that report
    /// transient trouble this way; `Delivered` for tools whose errors are answers
    /// ("already sent").
    pub fn on_tool_error(mut self, classification: Classification) -> Self {
        self.tool_error = classification;
        self
    }

    /// Classifies a JSON-RPC error `code` as `classification` instead of
    /// [`Classification::default_for_code`]; replaces an earlier one for the same code.
    pub fn classify_code(mut self, code: i32, classification: Classification) -> Self {
        self.codes.insert(code, classification);
        self
    }

    /// Checks the URL and headers and builds the dispatcher. Nothing connects until the first
    /// call.
    pub fn build(self) -> Result<McpDispatcher, BuildError> {
        let server = server(&self.url, self.client.is_none())?;
        let mut headers = HashMap::new();
        for (name, value) in self.headers {
            let invalid = |reason: String| BuildError::InvalidHeader {
                name: name.clone(),
                reason,
            };
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|e| invalid(e.to_string()))?;
            if RESERVED_HEADERS.contains(&header.as_str()) {
                return Err(BuildError::ReservedHeader { name });
            }
            let mut value = HeaderValue::from_str(&value).map_err(|e| invalid(e.to_string()))?;
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        if let Some(token) = &self.bearer {
            HeaderValue::from_str(&format!("Bearer {token}")).map_err(|e| BuildError::InvalidHeader {
                name: "authorization".to_owned(),
                reason: e.to_string(),
            })?;
        }
        Ok(McpDispatcher::from_inner(Inner {
            server,
            routes: self.routes,
            routes_only: self.routes_only,
            headers,
            bearer: self.bearer,
            timeout: self.timeout.unwrap_or(DEFAULT_TIMEOUT),
            client: self.client,
            tool_error: self.tool_error,
            codes: self.codes,
            sessions: Sessions::default(),
        }))
    }
}

fn server(url: &str, own_client: bool) -> Result<Server, BuildError> {
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
            return refuse("https needs TLS: enable the `rustls` feature of reactifact-mcp, or pass a client with TLS")
        }
        _ => return refuse("only http and https URLs serve MCP's streamable HTTP transport"),
    }
    Ok(Server { url: parsed, shown })
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
        let url = Url::parse("http://user:hunter2@example.invalid:8080/mcp?token=abc#x").unwrap();
        assert_eq!(shown(&url), "http://user:***@example.invalid:8080/mcp?…");
    }

    #[test]
    fn debug_output_shows_no_secret() {
        let builder = McpDispatcher::builder("http://user:hunter2@127.0.0.1:9/mcp?token=abc")
            .header("X-Api-Key", "s3cret")
            .bearer_token("t0ken");
        let debug = format!("{builder:?}");
        for secret in ["hunter2", "abc", "s3cret", "t0ken"] {
            assert!(!debug.contains(secret), "{debug}");
        }
        let dispatcher = builder.build().unwrap();
        let debug = format!("{dispatcher:?}");
        assert!(debug.contains("x-api-key"), "{debug}");
        for secret in ["hunter2", "abc", "s3cret", "t0ken"] {
            assert!(!debug.contains(secret), "{debug}");
        }
    }

    #[test]
    fn kinds_call_their_route_or_their_own_name() {
        let dispatcher = McpDispatcher::builder("http://127.0.0.1:9/mcp")
            .route("email", "send_email")
            .build()
            .unwrap();
        assert_eq!(dispatcher.tool_for("email"), Some("send_email"));
        assert_eq!(dispatcher.tool_for("sms"), Some("sms"));
        let strict = McpDispatcher::builder("http://127.0.0.1:9/mcp")
            .route("email", "send_email")
            .routes_only()
            .build()
            .unwrap();
        assert_eq!(strict.tool_for("email"), Some("send_email"));
        assert_eq!(strict.tool_for("sms"), None);
    }

    #[test]
    fn bad_settings_are_refused_at_build() {
        let error = McpDispatcher::new("not a url").unwrap_err();
        assert!(matches!(error, BuildError::InvalidUrl { .. }), "{error}");
        let error = McpDispatcher::new("ws://example.invalid/mcp").unwrap_err();
        assert!(matches!(error, BuildError::UnsupportedScheme { .. }), "{error}");
        for reserved in ["Mcp-Session-Id", "authorization", "Accept"] {
            let error = McpDispatcher::builder("http://127.0.0.1:9/")
                .header(reserved, "mine")
                .build()
                .unwrap_err();
            assert!(matches!(error, BuildError::ReservedHeader { .. }), "{error}");
        }
        let error = McpDispatcher::builder("http://127.0.0.1:9/")
            .header("bad header", "x")
            .build()
            .unwrap_err();
        assert!(matches!(error, BuildError::InvalidHeader { .. }), "{error}");
        let error = McpDispatcher::builder("http://127.0.0.1:9/")
            .bearer_token("a\nb")
            .build()
            .unwrap_err();
        assert!(matches!(error, BuildError::InvalidHeader { .. }), "{error}");
    }

    #[test]
    #[cfg(not(feature = "rustls"))]
    fn https_without_tls_names_the_feature() {
        let error = McpDispatcher::new("https://example.invalid/mcp").unwrap_err();
        assert!(error.to_string().contains("`rustls` feature"), "{error}");
    }
}

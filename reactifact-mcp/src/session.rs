//! The session with the server: opened on first use, shared by concurrent calls, opened again
//! after it broke.

use std::sync::Arc;

use rmcp::model::{ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};

use crate::dispatcher::Inner;
use crate::error::McpError;

/// One open MCP session (an initialized client over streamable HTTP). Dropping the last
/// handle closes it.
pub(crate) struct Session {
    service: RunningService<RoleClient, ClientConfig>,
}

impl Session {
    /// The client side of the session, to send requests on.
    pub(crate) fn peer(&self) -> &rmcp::Peer<RoleClient> {
        self.service.peer()
    }

    /// Whether the session can no longer carry a request (its transport ended).
    fn is_closed(&self) -> bool {
        self.service.is_closed() || self.service.peer().is_transport_closed()
    }
}

/// The dispatcher's session, if one is open.
#[derive(Default)]
pub(crate) struct Sessions {
    /// Held while a session is opened, so that concurrent calls wait for the one handshake.
    current: tokio::sync::Mutex<Option<Arc<Session>>>,
}

impl Inner {
    /// The open session, or a new one (the `initialize` handshake, within the timeout).
    pub(crate) async fn session(&self) -> Result<Arc<Session>, McpError> {
        let mut current = self.sessions.current.lock().await;
        if let Some(session) = current.as_ref().filter(|session| !session.is_closed()) {
            return Ok(session.clone());
        }
        *current = None;
        let connect = |reason: String| McpError::Connect {
            url: self.server.shown.clone(),
            reason: self.scrub(&reason),
        };
        let mut config = StreamableHttpClientTransportConfig::with_uri(self.server.url.as_str())
            .custom_headers(self.headers.clone());
        if let Some(token) = &self.bearer {
            config = config.auth_header(token.clone());
        }
        let transport = match &self.client {
            Some(client) => StreamableHttpClientTransport::with_client(client.clone(), config),
            None => StreamableHttpClientTransport::from_config(config),
        };
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("reactifact-mcp", env!("CARGO_PKG_VERSION")),
        );
        let service = tokio::time::timeout(self.timeout, info.serve(transport))
            .await
            .map_err(|_| connect(format!("no answer to `initialize` within {:?}", self.timeout)))?
            .map_err(|error| {
                if error.is_authorization_required() {
                    McpError::Unauthorized {
                        url: self.server.shown.clone(),
                        reason: self.scrub(&error.to_string()),
                    }
                } else {
                    connect(error.to_string())
                }
            })?;
        tracing::debug!(url = %self.server.shown, "mcp session opened");
        let session = Arc::new(Session { service });
        *current = Some(session.clone());
        Ok(session)
    }

    /// Drops `session` if it is still the current one: the next call opens a new session.
    pub(crate) async fn forget(&self, session: &Arc<Session>) {
        let mut current = self.sessions.current.lock().await;
        if current.as_ref().is_some_and(|open| Arc::ptr_eq(open, session)) {
            *current = None;
            tracing::debug!(url = %self.server.shown, "mcp session dropped");
        }
    }
}

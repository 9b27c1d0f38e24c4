//! [`ToolServer`]: the support agent's MCP server, a stand-in for the service that sends
//! replies and issues refunds. rmcp's server side over streamable HTTP on 127.0.0.1, served
//! by hyper; the agent's outbox reaches it through reactifact-mcp's `McpDispatcher`.
//!
//! Its two tools, `send_reply` and `issue_refund`, deduplicate on the idempotency key the
//! dispatcher puts in the request's `_meta` (`io.reactifact/idempotency-key`), as a real
//! service should: the first call with a key applies the effect, a later one with the same key
//! is answered as done and applies nothing. The server counts both per key, so a program can
//! check that each key was received — and applied — once.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use reactifact_mcp::IDEMPOTENCY_KEY;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// The tools the server has: the acting tools of the support agent.
pub const TOOLS: [&str; 2] = ["send_reply", "issue_refund"];

/// What the server received for one idempotency key.
#[derive(Clone, Debug, PartialEq)]
pub struct Received {
    /// The tool called.
    pub tool: String,
    /// How many calls carried the key (more than one when a delivery was retried).
    pub calls: u32,
    /// The arguments of the first call, the one that applied the effect.
    pub arguments: Value,
}

#[derive(Default)]
struct State {
    by_key: Mutex<BTreeMap<String, Received>>,
    without_key: Mutex<u32>,
}

#[derive(Clone)]
struct Tools {
    state: Arc<State>,
    delay: Duration,
}

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tool = request.name.to_string();
        if !TOOLS.contains(&tool.as_str()) {
            return Err(ErrorData::invalid_params(format!("tool `{tool}` not found"), None));
        }
        let mut meta = context.meta.0 .0.clone();
        if let Some(own) = request.meta {
            meta.extend(own.0 .0);
        }
        let Some(key) = meta.get(IDEMPOTENCY_KEY).and_then(Value::as_str).map(str::to_owned) else {
            *self.state.without_key.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            return Ok(CallToolResult::error(vec![ContentBlock::text("an idempotency key is required")]).into());
        };
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let mut by_key = self.state.by_key.lock().unwrap_or_else(|e| e.into_inner());
        let first = !by_key.contains_key(&key);
        by_key
            .entry(key)
            .and_modify(|received| received.calls += 1)
            .or_insert(Received {
                tool,
                calls: 1,
                arguments,
            });
        let text = if first { "done" } else { "done already" };
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
    }
}

/// The MCP server: listening until it is dropped.
pub struct ToolServer {
    addr: SocketAddr,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

impl ToolServer {
    /// A server on a free port of 127.0.0.1 answering each call at once.
    ///
    /// # Errors
    /// When the port cannot be bound.
    pub async fn start() -> std::io::Result<ToolServer> {
        ToolServer::start_with_delay(Duration::ZERO).await
    }

    /// A server on a free port of 127.0.0.1 answering each call after `delay` (a slow
    /// service, so that a process killed at random is sometimes killed mid-delivery).
    ///
    /// # Errors
    /// When the port cannot be bound.
    pub async fn start_with_delay(delay: Duration) -> std::io::Result<ToolServer> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State::default());
        let accept = serve(
            listener,
            Tools {
                state: state.clone(),
                delay,
            },
        );
        Ok(ToolServer { addr, state, accept })
    }

    /// The URL of its MCP endpoint, `http://127.0.0.1:<port>/mcp`.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// What it received, by idempotency key.
    pub fn received(&self) -> BTreeMap<String, Received> {
        self.state.by_key.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How many calls it received in all (with a key).
    pub fn calls(&self) -> u32 {
        self.received().values().map(|r| r.calls).sum()
    }

    /// How many calls came without an idempotency key in `_meta` (refused).
    pub fn calls_without_key(&self) -> u32 {
        *self.state.without_key.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for ToolServer {
    fn drop(&mut self) {
        // The accept loop owns the connections' tasks: aborting it aborts them.
        self.accept.abort();
    }
}

fn serve(listener: TcpListener, tools: Tools) -> JoinHandle<()> {
    let service: StreamableHttpService<Tools, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(tools.clone()),
        Default::default(),
        StreamableHttpServerConfig::default().with_sse_keep_alive(None),
    );
    tokio::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let service = service.clone();
            connections.spawn(async move {
                let handler = service_fn(move |request| {
                    let service = service.clone();
                    async move { Ok::<_, Infallible>(service.handle(request).await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), handler)
                    .await;
            });
            // Reap the connections that ended.
            while connections.try_join_next().is_some() {}
        }
    })
}

//! A local MCP server for the tests: rmcp's server side over streamable HTTP on 127.0.0.1,
//! served by hyper. It has a side-effecting tool, `send_email`, that records every call (its
//! arguments and the `_meta` it received) and answers from a script, and a read-only tool,
//! `stock`, that counts its calls. Any other tool is unknown (-32602, as rmcp's tool router
//! answers). The server can be stopped — every connection cut at once — and started again on
//! the same address, with none of its sessions.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorCode, ErrorData, JsonObject,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

/// What `send_email` does with a call.
#[derive(Clone, Debug)]
pub enum Step {
    /// Answers a result.
    Ok,
    /// Answers a result with `isError: true` and this text.
    ToolError(&'static str),
    /// Answers a JSON-RPC error with this code.
    Rpc(i32),
    /// Never answers (and says so through [`Server::hanging`]).
    Hang,
}

/// One call of `send_email`, as the server received it.
#[derive(Clone, Debug)]
pub struct Received {
    pub arguments: Value,
    /// The request's `_meta`.
    pub meta: JsonObject,
}

impl Received {
    pub fn meta_str(&self, name: &str) -> Option<&str> {
        self.meta.get(name).and_then(Value::as_str)
    }
}

#[derive(Default)]
pub struct State {
    script: Mutex<VecDeque<Step>>,
    received: Mutex<Vec<Received>>,
    reads: AtomicUsize,
    hanging: Notify,
}

#[derive(Clone)]
struct Tools(Arc<State>);

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let state = &self.0;
        match &*request.name {
            "send_email" => {
                let mut meta = context.meta.0 .0.clone();
                if let Some(own) = request.meta {
                    meta.extend(own.0 .0);
                }
                let arguments = Value::Object(request.arguments.unwrap_or_default());
                state.received.lock().unwrap().push(Received { arguments, meta });
                let step = state.script.lock().unwrap().pop_front().unwrap_or(Step::Ok);
                match step {
                    Step::Ok => Ok(CallToolResult::success(vec![ContentBlock::text("sent")]).into()),
                    Step::ToolError(text) => Ok(CallToolResult::error(vec![ContentBlock::text(text)]).into()),
                    Step::Rpc(code) => Err(ErrorData::new(ErrorCode(code), "scripted failure", None)),
                    Step::Hang => {
                        state.hanging.notify_one();
                        std::future::pending().await
                    }
                }
            }
            "stock" => {
                state.reads.fetch_add(1, Ordering::SeqCst);
                let sku = request
                    .arguments
                    .and_then(|arguments| arguments.get("sku").cloned())
                    .unwrap_or(Value::Null);
                Ok(CallToolResult::structured(json!({ "sku": sku, "stock": 3 })).into())
            }
            other => Err(ErrorData::invalid_params(format!("tool `{other}` not found"), None)),
        }
    }
}

pub struct Server {
    addr: SocketAddr,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    /// A server on a free port of 127.0.0.1; `send_email` follows `script`, then answers `Ok`.
    pub async fn start(script: Vec<Step>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let state = Arc::new(State::default());
        *state.script.lock().unwrap() = script.into();
        let addr = listener.local_addr().unwrap();
        let accept = Some(serve(listener, state.clone()));
        Server { addr, state, accept }
    }

    /// The URL of its MCP endpoint.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Cuts every connection and stops listening: the server is gone, and so are its sessions.
    pub fn stop(&mut self) {
        // The accept loop owns the connections' tasks: aborting it aborts them.
        if let Some(accept) = self.accept.take() {
            accept.abort();
        }
    }

    /// Listens again on the same address, a new server with no sessions (the same tools and
    /// records).
    pub async fn start_again(&mut self) {
        self.stop();
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.accept = Some(serve(listener, self.state.clone()));
    }

    /// The calls of `send_email` received so far.
    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    /// How many times `stock` was called.
    pub fn reads(&self) -> usize {
        self.state.reads.load(Ordering::SeqCst)
    }

    /// Waits until a call of `send_email` hangs ([`Step::Hang`]).
    pub async fn hanging(&self) {
        self.state.hanging.notified().await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve(listener: TcpListener, state: Arc<State>) -> JoinHandle<()> {
    let service: StreamableHttpService<Tools, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(Tools(state.clone())),
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

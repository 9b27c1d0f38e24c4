//! A read-only MCP tool as a recorded call: a retried generation gets the answer back without
//! calling the server again.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use reactifact_core::{Agent, Artifact, CallError, Context, Produce, ProduceCall, ProduceError, Runtime};
use reactifact_mcp::{McpDispatcher, McpError, ToolAnswer};
use serde::{Deserialize, Serialize};
use support::Server;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Ticket {
    sku: String,
}

impl Artifact for Ticket {
    const KIND: &'static str = "ticket";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Availability {
    stock: u32,
    text: Vec<String>,
}

impl Artifact for Availability {
    const KIND: &'static str = "availability";
}

#[derive(Serialize)]
struct StockQuery<'a> {
    sku: &'a str,
}

#[derive(Deserialize)]
struct Stock {
    sku: String,
    stock: u32,
}

/// Asks the read-only `stock` tool about the ticket's SKU and writes what it answered.
fn check_stock(mcp: McpDispatcher) -> Produce {
    Produce::new("check_stock", move |call: ProduceCall<Ticket>| {
        let mcp = mcp.clone();
        async move {
            let sku = call.trigger.data.sku.clone();
            let answer = mcp.call_read_only(&call, "stock", StockQuery { sku: &sku }).await?;
            let stock: Stock = answer.decode().map_err(ProduceError::msg)?;
            assert_eq!(stock.sku, sku);
            call.effects.upsert(
                format!("availability:{sku}"),
                Availability {
                    stock: stock.stock,
                    text: answer.text,
                },
            );
            Ok::<(), ProduceError>(())
        }
    })
    .creates::<Availability>()
}

/// A sibling that fails its first run, failing the generation (nothing is committed).
fn flaky_once() -> Agent {
    let failed = Arc::new(AtomicBool::new(false));
    Agent::new("other").produce(Produce::new("flaky", move |_call: ProduceCall<Ticket>| {
        let first = !failed.swap(true, Ordering::SeqCst);
        async move {
            match first {
                true => Err(ProduceError::msg("a transient failure")),
                false => Ok(()),
            }
        }
    }))
}

#[tokio::test]
async fn a_retried_generation_does_not_call_the_read_only_tool_again() {
    let server = Server::start(vec![]).await;
    let mcp = McpDispatcher::new(server.url()).unwrap();
    let mut ctx = Context::new("t");
    ctx.create("ticket:1", Ticket { sku: "A-1".into() }).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(check_stock(mcp)))
        .agent(flaky_once())
        .build()
        .unwrap();
    rt.run().await.unwrap_err();
    assert_eq!(server.reads(), 1, "the first run called the tool");
    rt.run().await.unwrap();
    assert_eq!(server.reads(), 1, "the retry got the recorded answer back");
    let availability = rt
        .context()
        .get::<Availability>("availability:A-1")
        .unwrap()
        .expect("the answer was written");
    assert_eq!(availability.data.stock, 3);
    assert_eq!(
        availability.data.text,
        [r#"{"sku":"A-1","stock":3}"#],
        "the text content is kept too"
    );
    assert!(server.received().is_empty(), "no intent, no side-effecting call");
}

#[tokio::test]
async fn a_failed_read_is_not_recorded_and_names_the_tool() {
    let server = Server::start(vec![]).await;
    let mcp = McpDispatcher::new(server.url()).unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let produce = Produce::new("ask", move |call: ProduceCall<Ticket>| {
        let (mcp, log) = (mcp.clone(), log.clone());
        async move {
            let missing = mcp
                .call_read_only(&call, "no_such_tool", StockQuery { sku: "A-1" })
                .await;
            let not_an_object = mcp.call_read_only(&call, "stock", [1, 2]).await;
            for outcome in [missing, not_an_object] {
                let error: Result<ToolAnswer, CallError> = outcome;
                log.lock().unwrap().push(error.unwrap_err());
            }
            Ok::<(), ProduceError>(())
        }
    });
    let mut ctx = Context::new("t");
    ctx.create("ticket:1", Ticket { sku: "A-1".into() }).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(produce))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let errors = seen.lock().unwrap();
    let CallError::Failed { call, source } = &errors[0] else {
        panic!("{:?}", errors[0]);
    };
    assert_eq!(call, "mcp:no_such_tool");
    let error = source.downcast_ref::<McpError>().expect("an McpError");
    assert_eq!(error.code(), Some(-32602), "{error}");
    let CallError::Failed { source, .. } = &errors[1] else {
        panic!("{:?}", errors[1]);
    };
    assert!(
        matches!(source.downcast_ref::<McpError>(), Some(McpError::Arguments { .. })),
        "{source}"
    );
    assert_eq!(server.reads(), 0, "arguments that are not an object are never sent");
}

/// Every public future is `Send`: a produce that awaits a read-only call can run on a
/// multi-threaded runtime.
#[test]
fn the_read_only_call_is_send() {
    fn send<F: std::future::Future + Send>(_: F) {}
    fn check(mcp: &McpDispatcher, call: &ProduceCall<Ticket>) {
        send(mcp.call_read_only(call, "stock", StockQuery { sku: "A-1" }));
        send(mcp.call_tool("stock", Default::default()));
        send(mcp.send(reactifact_mcp::Outgoing {
            kind: "notify",
            key: "k",
            attempt: 1,
            payload: &[],
            traceparent: None,
        }));
    }
    let _ = check;
}

//! A store to drive the CLI against, written by the library as an application would: an order
//! flow on session `orders` whose dispatcher delivers some kinds and fails the others, so
//! that the ledger holds an entry in every status, and a branch `what-if` forked from it.
//! Shared by the CLI's tests and by `examples/demo_store.rs` (which the docs' examples ran).

#![allow(dead_code)] // each test file uses part of it

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reactifact_core::store::{ClaimPolicy, ClaimRequest, OutboxStore, SqliteOutbox};
use reactifact_core::{
    produce, Agent, Artifact, Context, DeliveryOptions, DispatchError, Intent, PendingAction, Produce, ProduceCall,
    ProduceError, RetryPolicy, Runtime, Scope,
};
use serde::{Deserialize, Serialize};

/// What a customer ordered, and how to tell them.
#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
#[artifact(kind = "order")]
pub struct Order {
    pub customer: String,
    pub total_cents: u64,
    /// The action kind of the notification: `email` is delivered, `sms` fails permanently
    /// (dead), `push` fails under a manual retry policy (failed), `fax` has no route (held).
    pub channel: String,
}

/// What `process_order` writes for each order.
#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
#[artifact(kind = "receipt")]
pub struct Receipt {
    pub order: String,
    pub total_cents: u64,
}

/// The payload of a notification.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Notify {
    pub customer: String,
    pub order: String,
}

/// Upserts a receipt and records the order's notification, keyed by the order id. It reads
/// the order's previous receipt (absent the first time), so the run records a read.
#[produce(Receipt, also_creates = [PendingAction])]
async fn process_order(call: ProduceCall<Order>) {
    let order = &call.trigger;
    let _previous = call.snapshot.get::<Receipt>(&format!("receipt:{}", order.id));
    call.effects.upsert(
        format!("receipt:{}", order.id),
        Receipt {
            order: order.id.to_string(),
            total_cents: order.data.total_cents,
        },
    );
    call.effects.act(
        &order.data.channel,
        format!("{}:{}", order.data.channel, order.id),
        &Notify {
            customer: order.data.customer.clone(),
            order: order.id.to_string(),
        },
    );
}

fn dispatch(intent: Intent) -> Result<(), DispatchError> {
    match intent.kind() {
        "email" => Ok(()),
        "sms" => Err(DispatchError::permanent("the sms gateway refused the number")),
        "push" => Err(DispatchError::retryable("the push service answered 503")),
        _ => Err(DispatchError::no_route(format!(
            "no route for kind `{}`",
            intent.kind()
        ))),
    }
}

fn runtime(ctx: Context) -> Runtime {
    Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order))
        .dispatcher(|intent: Intent| async move { dispatch(intent) })
        .delivery(DeliveryOptions::new().retry_policy_for("push", RetryPolicy::manual()))
        .build()
        .expect("the runtime builds")
}

fn order(customer: &str, total_cents: u64, channel: &str) -> Order {
    Order {
        customer: customer.into(),
        total_cents,
        channel: channel.into(),
    }
}

/// The keys the store's ledger holds, by the status [`build`] leaves them in.
pub const DELIVERED: &str = "email:order:1";
pub const DELIVERED_2: &str = "email:order:2";
pub const DEAD: &str = "sms:order:3";
pub const FAILED: &str = "push:order:4";
pub const HELD: &str = "fax:order:5";
pub const PENDING: &str = "later:order:6";
pub const IN_FLIGHT: &str = "later:order:7";
/// Registered by the branch `what-if`, delivered.
pub const BRANCH: &str = "email:order:8";

/// Writes the store at `path` (which must not exist): [`write`] on session `orders` of a
/// new SQLite file, then [`settle`] on its outbox.
pub fn build(path: &Path) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ctx = write(Context::open(path, "orders").unwrap()).await;
        let outbox = SqliteOutbox::open(path).unwrap();
        settle(&*outbox).await;
        outbox.close().await;
        drop(ctx);
    });
}

/// Writes the order flow on `ctx` (session `orders` of an empty store, of any kind):
///
/// - session `orders`: orders 1–7 in one commit, one generation of `billing/process_order`
///   recording seven intents, then order 1 updated (its receipt re-derived, no new intent);
/// - the ledger: `email` delivered, `sms` dead, `push` failed, `fax` held; the two `later`
///   held (no route) until [`settle`];
/// - session `what-if`, forked from `orders` at its head: order 8 and its delivered email.
///
/// Returns the context of `orders`.
pub async fn write(mut ctx: Context) -> Context {
    {
        let mut tx = ctx.transaction();
        tx.create("order:1", order("ada@example.com", 1200, "email"));
        tx.create("order:2", order("bob@example.com", 800, "email"));
        tx.create("order:3", order("cy@example.com", 500, "sms"));
        tx.create("order:4", order("di@example.com", 700, "push"));
        tx.create("order:5", order("ed@example.com", 300, "fax"));
        tx.create("order:6", order("fay@example.com", 900, "later"));
        tx.create("order:7", order("gus@example.com", 100, "later"));
        tx.commit().unwrap();
    }
    let mut rt_orders = runtime(ctx);
    rt_orders.run().await.unwrap();
    rt_orders
        .context_mut()
        .update("order:1", order("ada@example.org", 1500, "email"))
        .unwrap();
    rt_orders.run().await.unwrap();
    let ctx = rt_orders.into_context();

    let branch = ctx.fork("what-if").unwrap();
    let mut rt_branch = runtime(branch);
    rt_branch
        .context_mut()
        .create("order:8", order("hal@example.com", 2500, "email"))
        .unwrap();
    rt_branch.run().await.unwrap();
    drop(rt_branch);
    ctx
}

/// An operator re-armed one held intent (pending), and a drain claimed the other and died
/// (in flight under a lease that has an hour to run).
pub async fn settle(outbox: &dyn OutboxStore) {
    outbox.retry(PENDING, SystemTime::now()).await.unwrap();
    outbox.retry(IN_FLIGHT, SystemTime::now()).await.unwrap();
    let owner: Arc<str> = Arc::from("a drain that died");
    let scope = Scope::all().kinds(["later"]);
    let mut claimed = Vec::new();
    // Claims take pending intents in registration order: the first is order 6's; release
    // it, so that order 7's stays claimed.
    for _ in 0..2 {
        let got = outbox
            .claim(ClaimRequest {
                scope: &scope,
                limit: 1,
                owner: &owner,
                lease: Duration::from_secs(3600),
                now: SystemTime::now(),
                policy: ClaimPolicy::none(),
            })
            .await
            .unwrap();
        claimed.extend(got.claims);
    }
    assert_eq!(claimed.len(), 2, "both later intents claimed");
    let first = &claimed[0];
    assert_eq!(first.key().as_str(), PENDING);
    outbox
        .record(
            &[reactifact_core::store::Recording {
                key: first.key().clone(),
                token: first.lease().unwrap().token,
                outcome: reactifact_core::store::Outcome::Released,
            }],
            SystemTime::now(),
        )
        .await
        .unwrap();
}

/// The error every run of [`park`]'s produce fails with.
pub const PARKED_ERROR: &str = "the model said 503";

/// The id of the event [`park`] parks for `order`: `parked:billing/process_order/{order}`.
pub fn parked_id(order: &str) -> String {
    format!("parked:billing/process_order/{order}")
}

/// Serves `ctx`, whose queued events are the creation of the orders `orders`, as a service
/// does (`Runtime::serve`), with a `billing/process_order` that fails on every order under
/// `RetryPolicy::manual()`, which parks an event at its first failure; stops it through its
/// handle once each order's run failed, and returns the context, where every order is
/// parked.
pub async fn park(ctx: Context, orders: &[&str]) -> Context {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let failing = Produce::new("process_order", move |call: ProduceCall<Order>| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(call.trigger.id.to_string());
            Err::<(), _>(ProduceError::msg(PARKED_ERROR))
        }
    })
    .creates::<Receipt>();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(failing))
        .produce_retry_policy(RetryPolicy::manual())
        .build()
        .expect("the runtime builds");
    // A stop that arrives before the failed runs' generation committed leaves their events
    // queued: the next serve runs them again.
    for _ in 0..4 {
        let parked = rt.context().parked().count();
        if parked == orders.len() {
            break;
        }
        let handle = rt.handle();
        let serving = tokio::spawn(async move {
            let report = rt.serve(Duration::from_secs(3600)).await;
            (rt, report)
        });
        for _ in parked..orders.len() {
            rx.recv().await.expect("the produce runs");
        }
        handle.stop();
        let (served, report) = serving.await.expect("serve does not panic");
        report.expect("a produce's failure never ends serve");
        rt = served;
    }
    let mut parked: Vec<String> = rt.context().parked().map(|p| p.unwrap().id.to_string()).collect();
    parked.sort();
    let mut expected: Vec<String> = orders.iter().map(|o| parked_id(o)).collect();
    expected.sort();
    assert_eq!(parked, expected, "every order's event is parked");
    rt.into_context()
}

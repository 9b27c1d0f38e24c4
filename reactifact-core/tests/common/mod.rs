//! Types and helpers shared by the runtime tests.
#![allow(dead_code)]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reactifact_core::{
    Agent, Artifact, Context, DispatchError, Intent, PendingAction, Produce, ProduceCall, ProduceError, Runtime,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Order {
    pub customer: String,
    pub total_cents: u64,
}

impl Artifact for Order {
    const KIND: &'static str = "order";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Receipt {
    pub order: String,
    pub total_cents: u64,
}

impl Artifact for Receipt {
    const KIND: &'static str = "receipt";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Invoice {
    pub order: String,
}

impl Artifact for Invoice {
    const KIND: &'static str = "invoice";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Notify {
    pub customer: String,
    pub order: String,
}

/// What the call and budget tests react to.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Ticket {
    pub text: String,
}

impl Artifact for Ticket {
    const KIND: &'static str = "ticket";
}

/// A second trigger type of the call and budget tests.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Note {
    pub text: String,
}

impl Artifact for Note {
    const KIND: &'static str = "note";
}

/// What the call and budget tests' produces write.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Out {
    pub text: String,
}

impl Artifact for Out {
    const KIND: &'static str = "out";
}

/// A context holding `ticket:1` … `ticket:{n}` (texts `t1` …), one commit each.
pub fn tickets(n: usize) -> Context {
    let mut ctx = Context::new("tickets");
    for i in 1..=n {
        ctx.create(format!("ticket:{i}"), Ticket { text: format!("t{i}") })
            .unwrap();
    }
    ctx
}

/// A context whose seed orders were committed in one generation.
pub fn seeded(orders: impl IntoIterator<Item = (String, Order)>) -> Context {
    let mut ctx = Context::new("t");
    let mut tx = ctx.transaction();
    for (id, order) in orders {
        tx.create(id, order);
    }
    tx.commit().unwrap();
    ctx
}

pub fn order(customer: &str, total_cents: u64) -> Order {
    Order {
        customer: customer.to_owned(),
        total_cents,
    }
}

/// The order flow: a receipt per order and a `notify` intent keyed by the order id.
pub fn process_order() -> Produce {
    order_flow(|| ())
}

/// [`process_order`], calling `on_run` as each run starts (before its future is polled).
pub fn order_flow(on_run: impl Fn() + Send + Sync + 'static) -> Produce {
    Produce::new("process_order", move |call: ProduceCall<Order>| {
        on_run();
        let id = call.trigger.id.to_string();
        async move {
            call.effects.upsert(
                format!("receipt:{id}"),
                Receipt {
                    order: id.clone(),
                    total_cents: call.trigger.data.total_cents,
                },
            );
            call.effects.act(
                "notify",
                format!("notify:{id}"),
                &Notify {
                    customer: call.trigger.data.customer.clone(),
                    order: id,
                },
            );
            Ok::<(), ProduceError>(())
        }
    })
    .creates::<Receipt>()
    .creates::<PendingAction>()
}

/// A dispatcher that records every key it is handed, in order.
#[derive(Clone, Default)]
pub struct Recorder {
    pub sent: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    pub fn sent(&self) -> Vec<String> {
        self.sent.lock().unwrap().clone()
    }

    pub fn dispatcher(
        &self,
    ) -> impl Fn(Intent) -> std::future::Ready<Result<(), DispatchError>> + Send + Sync + 'static {
        let sent = self.sent.clone();
        move |intent: Intent| {
            sent.lock().unwrap().push(intent.key().to_string());
            std::future::ready(Ok(()))
        }
    }
}

/// Runs a turn until its dispatches are under way, then "kills the process": the turn's
/// future is leaked, not dropped, so no destructor records anything — the file keeps the
/// batch in flight under its lease, as after a SIGKILL.
pub async fn crash_mid_turn(rt: &mut Runtime) {
    let mut turn = Box::pin(rt.run());
    assert!(tokio::time::timeout(Duration::from_millis(200), &mut turn)
        .await
        .is_err());
    std::mem::forget(turn);
}

/// Commits `orders` of `session` in the SQLite file at `path`, then the `notify:order:{i}`
/// intents their produce acts, in one turn (no dispatcher: they stay pending).
pub async fn commit_orders(path: &Path, session: &str, orders: impl IntoIterator<Item = u64>) {
    let mut ctx = Context::open(path, session).unwrap();
    let mut tx = ctx.transaction();
    for i in orders {
        tx.create(format!("order:{i}"), order("ada", i));
    }
    tx.commit().unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
}

/// Serves `rt` in a task of its own, polling every `poll`, until a stop; yields the runtime
/// and the serve's report (a serve that fails fails the task).
pub fn serving(
    mut rt: Runtime,
    poll: Duration,
) -> tokio::task::JoinHandle<(Runtime, reactifact_core::runtime::ServeReport)> {
    tokio::spawn(async move {
        let report = rt.serve(poll).await.unwrap();
        (rt, report)
    })
}

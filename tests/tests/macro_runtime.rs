//! End to end: produces built by `#[produce]` run in the runtime, with their declarations.

use std::sync::{Arc, Mutex};

use reactifact_core::error::{RunError, RunFailure};
use reactifact_core::runtime::{IntoProduce, Kind, TurnOutcome};
use reactifact_core::{
    produce, Agent, Artifact, Context, DispatchError, Intent, PendingAction, Produce, ProduceCall, ProduceError,
    Record, Runtime, Snapshot,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
struct Order {
    customer: String,
    total_cents: u64,
}

#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
struct Receipt {
    order: String,
    total_cents: u64,
}

#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
#[artifact(kind = "risk.review")]
struct Review {
    order: String,
}

/// A receipt per order, and an email intent keyed by the order id.
#[produce(Receipt, also_creates = [PendingAction])]
async fn process_order(call: ProduceCall<Order>) -> Result<(), ProduceError> {
    let id = call.trigger.id.to_string();
    call.effects.upsert(
        format!("receipt:{id}"),
        Receipt {
            order: id.clone(),
            total_cents: call.trigger.data.total_cents,
        },
    );
    call.effects
        .act("email_receipt", format!("email:{id}"), &call.trigger.data.customer);
    Ok(())
}

fn is_large(_: &Snapshot, order: &Record<Order>) -> bool {
    order.data.total_cents >= 1_000
}

#[produce(Review, name = "review_large_orders", when = is_large)]
async fn review(call: ProduceCall<Order>) {
    let order = call.trigger.id.to_string();
    call.effects.create(format!("review:{order}"), Review { order });
}

fn seeded() -> Context {
    let mut ctx = Context::new("macro");
    let mut tx = ctx.transaction();
    tx.create(
        "order:1",
        Order {
            customer: "ada".into(),
            total_cents: 250,
        },
    );
    tx.create(
        "order:2",
        Order {
            customer: "grace".into(),
            total_cents: 5_000,
        },
    );
    tx.commit().unwrap();
    ctx
}

/// The keys a dispatcher was handed, in order.
type Sent = Arc<Mutex<Vec<String>>>;

fn recorder() -> (
    Sent,
    impl Fn(Intent) -> std::future::Ready<Result<(), DispatchError>> + Send + Sync + 'static,
) {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let log = sent.clone();
    let dispatcher = move |intent: Intent| {
        log.lock().unwrap().push(intent.key().to_string());
        std::future::ready(Ok(()))
    };
    (sent, dispatcher)
}

#[test]
fn the_registration_carries_name_trigger_and_declared_outputs() {
    let produce = process_order.into_produce();
    assert_eq!(produce.name(), "process_order");
    assert_eq!(produce.trigger(), Kind::of::<Order>());
    assert_eq!(produce.outputs(), [Kind::of::<Receipt>(), Kind::of::<PendingAction>()]);

    // `review` names the produce in this module, like a unit struct: pick another binding.
    let registered = review.into_produce();
    assert_eq!(registered.name(), "review_large_orders");
    assert_eq!(registered.outputs(), [Kind::intern("risk.review")]);
}

#[test]
fn derived_kinds_are_snake_case_unless_given() {
    assert_eq!(Order::KIND, "order");
    assert_eq!(Review::KIND, "risk.review");
}

#[tokio::test]
async fn a_macro_built_produce_runs_commits_and_delivers_its_intents() {
    let (sent, dispatcher) = recorder();
    let mut rt = Runtime::builder(seeded())
        .agent(Agent::new("billing").produce(process_order))
        .dispatcher(dispatcher)
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.runs, 2);
    assert_eq!(report.deliveries.delivered, 2);

    let receipt = rt.context().get::<Receipt>("receipt:order:2").unwrap().unwrap();
    assert_eq!(receipt.data.total_cents, 5_000);
    let action = rt
        .context()
        .get::<PendingAction>("action:email:order:1")
        .unwrap()
        .unwrap();
    assert_eq!(action.data.kind, "email_receipt");
    assert_eq!(*sent.lock().unwrap(), ["email:order:1", "email:order:2"]);

    let run = rt.context().log().unwrap().last().unwrap().runs.first().unwrap();
    assert_eq!(run.produce.as_deref(), Some("process_order"));
    assert_eq!(run.agent.as_deref(), Some("billing"));
}

#[tokio::test]
async fn the_condition_and_the_name_option_reach_the_runtime() {
    let mut rt = Runtime::builder(seeded())
        .agent(Agent::new("risk").produce(review))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    assert!(rt.context().get::<Review>("review:order:1").unwrap().is_none());
    assert!(rt.context().get::<Review>("review:order:2").unwrap().is_some());
    let run = rt.context().log().unwrap().last().unwrap().runs.first().unwrap();
    assert_eq!(run.produce.as_deref(), Some("review_large_orders"));
}

#[tokio::test]
async fn the_runtime_still_rejects_undeclared_outputs_of_hand_built_produces() {
    // The macro makes this a compile error (see tests/ui); a produce built by hand is checked
    // when its generation is validated, and nothing is applied.
    let unchecked = Produce::new("unchecked", |call: ProduceCall<Order>| async move {
        call.effects
            .create(format!("review:{}", call.trigger.id), Review { order: String::new() });
    })
    .creates::<Receipt>();
    let mut rt = Runtime::builder(seeded())
        .agent(Agent::new("billing").produce(process_order).produce(unchecked))
        .build()
        .unwrap();
    let before = rt.context().state_hash();
    let error = rt.run().await.unwrap_err();
    let RunError::Produce { first: failure, .. } = &error else {
        panic!("expected a produce failure, got {error}");
    };
    assert_eq!(failure.produce, "unchecked");
    assert!(
        matches!(failure.failure, RunFailure::UndeclaredOutput { .. }),
        "{error}"
    );
    assert_eq!(rt.context().state_hash(), before);
}

/// Two types named alike in two modules: their derived kinds are both `invoice`.
mod billing {
    use super::*;

    #[derive(Serialize, Deserialize, Artifact)]
    pub struct Invoice {
        pub cents: u64,
    }
}

mod tax {
    use super::*;

    #[derive(Serialize, Deserialize, Artifact)]
    pub struct Invoice {
        pub rate: u32,
    }

    #[derive(Serialize, Deserialize, Artifact)]
    #[artifact(kind = "tax.invoice")]
    pub struct TaxInvoice {
        pub rate: u32,
    }
}

#[produce(billing::Invoice)]
async fn bill(call: ProduceCall<Order>) {
    call.effects
        .create(format!("invoice:{}", call.trigger.id), billing::Invoice { cents: 1 });
}

#[produce]
async fn assess(call: ProduceCall<tax::Invoice>) {
    let _ = call;
}

#[produce]
async fn assess_own_kind(call: ProduceCall<tax::TaxInvoice>) {
    let _ = call;
}

#[test]
fn a_declared_output_and_a_trigger_of_one_derived_kind_are_refused_at_build() {
    let error = Runtime::builder(Context::new("kinds"))
        .agent(Agent::new("billing").produce(bill))
        .agent(Agent::new("tax").produce(assess))
        .build()
        .unwrap_err();
    let message = error.to_string();
    assert!(message.contains("`invoice`"), "{message}");
    assert!(
        message.contains("billing::Invoice") && message.contains("tax::Invoice"),
        "{message}"
    );
    assert!(message.contains("#[artifact(kind = \"...\")]"), "{message}");
}

#[test]
fn a_kind_of_its_own_resolves_the_collision() {
    let built = Runtime::builder(Context::new("kinds"))
        .agent(Agent::new("billing").produce(bill))
        .agent(Agent::new("tax").produce(assess_own_kind))
        .build();
    assert!(built.is_ok(), "{:?}", built.err());
}

/// A tombstone per deleted order, written from the order's last version.
#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
struct Tombstone {
    customer: String,
    total_cents: u64,
    event: String,
}

#[produce(Tombstone, on = [deleted], when = reactifact_core::when::field_equals("customer", "grace"))]
async fn bury(call: ProduceCall<Order>) {
    assert!(
        !call.snapshot.contains(call.trigger.id.as_str()),
        "the snapshot is before the deletion"
    );
    call.effects.create(
        format!("tombstone:{}", call.trigger.id),
        Tombstone {
            customer: call.trigger.data.customer.clone(),
            total_cents: call.trigger.data.total_cents,
            event: call.event.to_string(),
        },
    );
}

#[tokio::test]
async fn on_deleted_and_a_condition_helper_reach_the_runtime_through_the_macro() {
    let mut rt = Runtime::builder(seeded())
        .agent(Agent::new("graves").produce(bury))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(rt.context().generation().0, 1, "creations run nothing");
    let mut tx = rt.context_mut().transaction();
    tx.delete("order:1").delete("order:2");
    tx.commit().unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 1, "only grace's order holds the condition");
    let grave = rt.context().get::<Tombstone>("tombstone:order:2").unwrap().unwrap();
    assert_eq!(
        grave.data,
        Tombstone {
            customer: "grace".into(),
            total_cents: 5_000,
            event: "deleted".into(),
        }
    );
    assert!(rt.context().get::<Tombstone>("tombstone:order:1").unwrap().is_none());
    rt.replay().await.unwrap();
}

/// Counts its runs, debounced.
static DEBOUNCED_RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[produce(Tombstone, on = [deleted], debounce)]
async fn bury_once(call: ProduceCall<Order>) {
    DEBOUNCED_RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    call.effects.upsert(
        format!("tombstone:{}", call.trigger.id),
        Tombstone {
            customer: call.trigger.data.customer.clone(),
            total_cents: call.trigger.data.total_cents,
            event: call.event.to_string(),
        },
    );
}

#[tokio::test]
async fn debounce_reaches_the_runtime_through_the_macro() {
    let mut ctx = seeded();
    ctx.delete("order:1").unwrap();
    ctx.create(
        "order:1",
        Order {
            customer: "ada".into(),
            total_cents: 1,
        },
    )
    .unwrap();
    ctx.delete("order:1").unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("graves").produce(bury_once))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!((report.generations, report.runs), (1, 1));
    assert_eq!(DEBOUNCED_RUNS.load(std::sync::atomic::Ordering::SeqCst), 1);
    let grave = rt.context().get::<Tombstone>("tombstone:order:1").unwrap().unwrap();
    assert_eq!(grave.data.total_cents, 1, "the newest deletion's last version");
}

/// The total of a customer's orders, derived by a watching produce.
#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
struct Spend {
    total_cents: u64,
}

#[produce(Spend, stale)]
async fn spend(call: ProduceCall<Order>) {
    // Reads the other order of the same customer through the snapshot.
    let other = if call.trigger.id.as_str() == "order:1" {
        "order:2"
    } else {
        "order:1"
    };
    let theirs = call
        .snapshot
        .get::<Order>(other)
        .unwrap()
        .map_or(0, |o| o.data.total_cents);
    call.effects.upsert(
        format!("spend:{}", call.trigger.id),
        Spend {
            total_cents: call.trigger.data.total_cents + theirs,
        },
    );
}

#[tokio::test]
async fn stale_reaches_the_runtime_through_the_macro() {
    let mut rt = Runtime::builder(seeded())
        .agent(Agent::new("books").produce(spend))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(
        rt.context()
            .get::<Spend>("spend:order:1")
            .unwrap()
            .unwrap()
            .data
            .total_cents,
        5_250
    );
    rt.context_mut()
        .update(
            "order:2",
            Order {
                customer: "grace".into(),
                total_cents: 50,
            },
        )
        .unwrap();
    let report = rt.run().await.unwrap();
    // order:2 runs on its update; order:1's run read order:2, so it is recomputed.
    assert_eq!((report.generations, report.runs), (1, 2));
    assert_eq!(
        rt.context()
            .get::<Spend>("spend:order:1")
            .unwrap()
            .unwrap()
            .data
            .total_cents,
        300
    );
    assert_eq!(
        rt.context()
            .get::<Spend>("spend:order:2")
            .unwrap()
            .unwrap()
            .data
            .total_cents,
        300
    );
    let kinds: Vec<_> = rt
        .context()
        .log()
        .unwrap()
        .last()
        .unwrap()
        .runs
        .iter()
        .map(|r| r.trigger.as_ref().unwrap().event)
        .collect();
    assert_eq!(
        kinds,
        [
            reactifact_core::audit::EventKind::Updated,
            reactifact_core::audit::EventKind::Stale
        ]
    );
}

/// What a payment pays, for the join below.
#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
struct Paid {
    order: String,
    cents: u64,
}

/// What a cancelled order is, for the absent form below.
#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
struct Cancelled {
    order: String,
}

/// A receipt per order once it is paid and not cancelled.
#[produce(
    Receipt,
    key = |o| o.id.to_string(),
    join(Paid, key = |p| p.data.order.clone()),
    absent(Cancelled, key = |c| c.data.order.clone())
)]
async fn receipt_when_paid(call: ProduceCall<Order>) {
    let paid = call.joined::<Paid>().unwrap().unwrap();
    call.effects.upsert(
        format!("receipt:{}", call.trigger.id),
        Receipt {
            order: call.trigger.id.to_string(),
            total_cents: paid.data.cents,
        },
    );
}

#[tokio::test]
async fn a_join_and_its_absent_part_reach_the_runtime_through_the_macro() {
    let mut rt = Runtime::builder(Context::new("main"))
        .agent(Agent::new("billing").produce(receipt_when_paid))
        .build()
        .unwrap();
    let order = |total_cents| Order {
        customer: "ada".into(),
        total_cents,
    };
    rt.context_mut().create("order:1", order(10)).unwrap();
    rt.context_mut().create("order:2", order(20)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(rt.context().get::<Receipt>("receipt:order:1").unwrap(), None);
    let mut tx = rt.context_mut().transaction();
    tx.create(
        "paid:1",
        Paid {
            order: "order:1".into(),
            cents: 10,
        },
    )
    .create(
        "paid:2",
        Paid {
            order: "order:2".into(),
            cents: 20,
        },
    )
    .create(
        "cancelled:2",
        Cancelled {
            order: "order:2".into(),
        },
    );
    tx.commit().unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 1);
    assert_eq!(
        rt.context()
            .get::<Receipt>("receipt:order:1")
            .unwrap()
            .unwrap()
            .data
            .total_cents,
        10
    );
    assert_eq!(
        rt.context().get::<Receipt>("receipt:order:2").unwrap(),
        None,
        "order 2 was cancelled"
    );
    reactifact_core::testing::assert_replays(rt.context(), &[Agent::new("billing").produce(receipt_when_paid)]).await;
}

//! Joins by key: a produce that runs when an order and its payment (keyed by order id) are
//! both present, in either arrival order, exactly once per complete set and again when a part
//! changes; and its absent form, which runs for an order without a payment and is cancelled
//! when the payment arrives first or in the same generation. The index survives a reopen of the
//! SQLite store (from the log and from a checkpoint); replay and verify reproduce join runs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use reactifact_core::audit::{Difference, EventKind, ReplayError};
use reactifact_core::error::BuildError;
use reactifact_core::store::Synchronous;
use reactifact_core::{Agent, Artifact, Context, OpenOptions, Produce, ProduceCall, Record, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Order {
    id: u64,
    item: String,
}

impl Artifact for Order {
    const KIND: &'static str = "order";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Payment {
    order_id: u64,
    cents: u64,
}

impl Artifact for Payment {
    const KIND: &'static str = "payment";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Shipment {
    item: String,
    cents: u64,
}

impl Artifact for Shipment {
    const KIND: &'static str = "shipment";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Reminder {
    order: String,
}

impl Artifact for Reminder {
    const KIND: &'static str = "reminder";
}

/// (event kind, trigger id, payment ids joined) of every run.
type Runs = Arc<Mutex<Vec<(EventKind, String, Vec<String>)>>>;

fn order(id: u64) -> Order {
    Order {
        id,
        item: format!("item {id}"),
    }
}

fn payment(order_id: u64, cents: u64) -> Payment {
    Payment { order_id, cents }
}

/// On an order and its payment: writes `shipment:{order id}` with the item and the amount.
fn ship(runs: &Runs) -> Produce {
    let runs = runs.clone();
    Produce::new("ship", move |call: ProduceCall<Order>| {
        let runs = runs.clone();
        async move {
            let payments = call.joined_all::<Payment>().unwrap();
            runs.lock().unwrap().push((
                call.event,
                call.trigger.id.to_string(),
                payments.iter().map(|p| p.id.to_string()).collect(),
            ));
            let payment = call.joined::<Payment>().unwrap().expect("a join run has its payment");
            call.effects.upsert(
                format!("shipment:{}", call.trigger.data.id),
                Shipment {
                    item: call.trigger.data.item.clone(),
                    cents: payment.data.cents,
                },
            );
        }
    })
    .creates::<Shipment>()
    .key(|o: &Record<Order>| o.data.id)
    .join(|p: &Record<Payment>| p.data.order_id)
}

/// On an order without a payment: writes `reminder:{order id}`.
fn remind(runs: &Runs) -> Produce {
    let runs = runs.clone();
    Produce::new("remind", move |call: ProduceCall<Order>| {
        let runs = runs.clone();
        async move {
            assert!(call.joined::<Payment>().unwrap().is_none());
            runs.lock()
                .unwrap()
                .push((call.event, call.trigger.id.to_string(), Vec::new()));
            call.effects.upsert(
                format!("reminder:{}", call.trigger.data.id),
                Reminder {
                    order: call.trigger.id.to_string(),
                },
            );
        }
    })
    .creates::<Reminder>()
    .key(|o: &Record<Order>| o.data.id)
    .absent(|p: &Record<Payment>| p.data.order_id)
}

fn runtime(ctx: Context, produce: Produce) -> Runtime {
    Runtime::builder(ctx)
        .agent(Agent::new("shop").produce(produce))
        .build()
        .unwrap()
}

fn taken(runs: &Runs) -> Vec<(EventKind, String, Vec<String>)> {
    std::mem::take(&mut *runs.lock().unwrap())
}

fn run_of(event: EventKind, trigger: &str, payments: &[&str]) -> (EventKind, String, Vec<String>) {
    (
        event,
        trigger.to_owned(),
        payments.iter().map(|p| (*p).to_owned()).collect(),
    )
}

fn shipment(ctx: &Context, order_id: u64) -> Option<Shipment> {
    ctx.get::<Shipment>(&format!("shipment:{order_id}"))
        .unwrap()
        .map(|r| r.data)
}

#[tokio::test]
async fn order_then_payment_runs_once_when_the_payment_arrives() {
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), ship(&runs));
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [], "no run while only the order exists");
    assert_eq!(shipment(rt.context(), 1), None);

    rt.context_mut().create("payment:a", payment(1, 500)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:1", &["payment:a"])]);
    assert_eq!(shipment(rt.context(), 1).unwrap().cents, 500);

    // Quiescent: nothing runs again without a change.
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), []);
    rt.context().verify().unwrap();
    reactifact_core::testing::assert_replays(rt.context(), &[Agent::new("shop").produce(ship(&Runs::default()))]).await;
}

#[tokio::test]
async fn payment_then_order_runs_once_when_the_order_arrives() {
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), ship(&runs));
    rt.context_mut().create("payment:a", payment(7, 900)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [], "no run while only the payment exists");

    rt.context_mut().create("order:7", order(7)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:7", &["payment:a"])]);
    assert_eq!(shipment(rt.context(), 7).unwrap().cents, 900);
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), []);
}

#[tokio::test]
async fn both_parts_in_one_generation_run_once() {
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), ship(&runs));
    let mut tx = rt.context_mut().transaction();
    tx.create("payment:a", payment(3, 300)).create("order:3", order(3));
    tx.commit().unwrap();
    // Both events are queued; both match the same set: one run.
    assert_eq!(rt.context().queued_events(), 2);
    let report = rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:3", &["payment:a"])]);
    assert_eq!(report.runs, 1);
    let join_runs = rt
        .context()
        .log()
        .unwrap()
        .iter()
        .flat_map(|c| &c.runs)
        .filter(|r| r.produce.is_some())
        .count();
    assert_eq!(join_runs, 1, "one run recorded in the log");
}

#[tokio::test]
async fn a_change_of_either_part_runs_again_and_an_equal_write_does_not() {
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), ship(&runs));
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.context_mut().create("payment:a", payment(1, 500)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs).len(), 1);

    rt.context_mut().update("payment:a", payment(1, 650)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Updated, "order:1", &["payment:a"])]);
    assert_eq!(shipment(rt.context(), 1).unwrap().cents, 650);

    rt.context_mut()
        .update(
            "order:1",
            Order {
                id: 1,
                item: "gift-wrapped".into(),
            },
        )
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Updated, "order:1", &["payment:a"])]);
    assert_eq!(shipment(rt.context(), 1).unwrap().item, "gift-wrapped");

    // Equal content is no version and no event: no run.
    rt.context_mut().update("payment:a", payment(1, 650)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), []);
    rt.context().verify().unwrap();
    reactifact_core::testing::assert_replays(rt.context(), &[Agent::new("shop").produce(ship(&Runs::default()))]).await;
}

#[tokio::test]
async fn parts_with_another_key_never_complete_a_set() {
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), ship(&runs));
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.context_mut().create("payment:a", payment(2, 500)).unwrap();
    rt.context_mut().create("order:3", order(3)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), []);

    // The payment is re-keyed to order 1: the set of order 1 is complete.
    rt.context_mut().update("payment:a", payment(1, 500)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Updated, "order:1", &["payment:a"])]);

    // The payment leaves order 1 for order 3: order 3 runs; a change of order 1 no longer does.
    rt.context_mut().update("payment:a", payment(3, 500)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Updated, "order:3", &["payment:a"])]);
    rt.context_mut()
        .update(
            "order:1",
            Order {
                id: 1,
                item: "other".into(),
            },
        )
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [], "order 1 lost its payment");
}

#[tokio::test]
async fn a_deleted_part_breaks_the_set_and_its_deletion_runs_nothing() {
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), ship(&runs));
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.context_mut().create("payment:a", payment(1, 500)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs).len(), 1);

    rt.context_mut().delete("payment:a").unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), []);
    rt.context_mut()
        .update(
            "order:1",
            Order {
                id: 1,
                item: "changed".into(),
            },
        )
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [], "no payment any more");
    // A new payment completes it again.
    rt.context_mut().create("payment:b", payment(1, 10)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:1", &["payment:b"])]);
}

#[tokio::test]
async fn several_parts_and_several_triggers_of_one_key() {
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), ship(&runs));
    let mut tx = rt.context_mut().transaction();
    tx.create("payment:b", payment(5, 2))
        .create("payment:a", payment(5, 1))
        .create("order:5", order(5));
    tx.commit().unwrap();
    rt.run().await.unwrap();
    // One run with both payments, in id order; `joined` is the first by id.
    assert_eq!(
        taken(&runs),
        [run_of(EventKind::Created, "order:5", &["payment:a", "payment:b"])]
    );
    assert_eq!(shipment(rt.context(), 5).unwrap().cents, 1);

    // A second order with the same key: a payment's change runs both orders, in id order.
    rt.context_mut().create("order:5bis", order(5)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(
        taken(&runs),
        [run_of(EventKind::Created, "order:5bis", &["payment:a", "payment:b"])]
    );
    rt.context_mut().update("payment:b", payment(5, 3)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(
        taken(&runs),
        [
            run_of(EventKind::Updated, "order:5", &["payment:a", "payment:b"]),
            run_of(EventKind::Updated, "order:5bis", &["payment:a", "payment:b"]),
        ]
    );
}

#[tokio::test]
async fn a_join_run_records_its_parts_as_reads() {
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), ship(&runs));
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.context_mut().create("payment:a", payment(1, 500)).unwrap();
    rt.context_mut().update("payment:a", payment(1, 501)).unwrap();
    rt.run().await.unwrap();
    let log = rt.context().log().unwrap();
    let run = log.iter().flat_map(|c| &c.runs).find(|r| r.produce.is_some()).unwrap();
    assert_eq!(run.trigger.as_ref().unwrap().id, "order:1");
    let read = run
        .reads
        .iter()
        .find(|r| r.id == "payment:a")
        .expect("the payment is read");
    assert_eq!(read.version, Some(reactifact_core::runtime::Version(2)));
}

#[tokio::test]
async fn the_absent_form_runs_for_an_order_without_payment() {
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), remind(&runs));
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:1", &[])]);
    assert!(rt.context().get::<Reminder>("reminder:1").unwrap().is_some());

    // The payment's own event runs nothing; once it is there, a change of the order does not
    // run the absent form either.
    rt.context_mut().create("payment:a", payment(1, 5)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), []);
    rt.context_mut()
        .update(
            "order:1",
            Order {
                id: 1,
                item: "x".into(),
            },
        )
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), []);
    rt.context().verify().unwrap();
    reactifact_core::testing::assert_replays(rt.context(), &[Agent::new("shop").produce(remind(&Runs::default()))])
        .await;
}

#[tokio::test]
async fn the_absent_form_is_cancelled_by_a_payment_in_the_same_generation() {
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), remind(&runs));
    let mut tx = rt.context_mut().transaction();
    tx.create("order:1", order(1)).create("payment:a", payment(1, 5));
    tx.commit().unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(taken(&runs), []);
    assert_eq!(report.runs, 0);
    assert!(rt.context().get::<Reminder>("reminder:1").unwrap().is_none());
    assert_eq!(rt.context().queued_events(), 0, "the events were consumed");
}

#[tokio::test]
async fn the_absent_form_never_runs_for_an_order_whose_payment_came_first() {
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), remind(&runs));
    rt.context_mut().create("payment:a", payment(1, 5)).unwrap();
    rt.run().await.unwrap();
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.context_mut().create("order:2", order(2)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(
        taken(&runs),
        [run_of(EventKind::Created, "order:2", &[])],
        "only the order without a payment"
    );
}

#[tokio::test]
async fn a_join_and_its_absent_form_side_by_side() {
    let (shipped, reminded) = (Runs::default(), Runs::default());
    let mut rt = Runtime::builder(Context::new("main"))
        .agent(Agent::new("shop").produce(ship(&shipped)).produce(remind(&reminded)))
        .build()
        .unwrap();
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.run().await.unwrap();
    assert_eq!((taken(&shipped).len(), taken(&reminded).len()), (0, 1));
    rt.context_mut().create("payment:a", payment(1, 5)).unwrap();
    rt.run().await.unwrap();
    assert_eq!((taken(&shipped).len(), taken(&reminded).len()), (1, 0));
}

fn options() -> OpenOptions {
    OpenOptions::new().synchronous(Synchronous::Normal)
}

#[tokio::test]
async fn a_reopen_of_the_sqlite_store_between_the_halves_still_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let runs = Runs::default();
    let mut rt = runtime(Context::open_with(&path, "main", options()).unwrap(), ship(&runs));
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.context_mut().create("order:2", order(2)).unwrap();
    rt.run().await.unwrap();
    drop(rt);

    let mut ctx = Context::open_with(&path, "main", options()).unwrap();
    ctx.create("payment:a", payment(1, 500)).unwrap();
    let mut rt = runtime(ctx, ship(&runs));
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:1", &["payment:a"])]);
    drop(rt);

    // The payment's event is committed but not taken before the reopen: it runs once after it.
    let mut ctx = Context::open_with(&path, "main", options()).unwrap();
    ctx.create("payment:b", payment(2, 700)).unwrap();
    drop(ctx);
    let mut rt = runtime(Context::open_with(&path, "main", options()).unwrap(), ship(&runs));
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:2", &["payment:b"])]);
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), []);
    drop(rt);

    let ctx = Context::open_with(&path, "main", options()).unwrap();
    ctx.verify().unwrap();
    reactifact_core::testing::assert_replays(&ctx, &[Agent::new("shop").produce(ship(&Runs::default()))]).await;
}

#[tokio::test]
async fn a_context_opened_from_a_checkpoint_has_the_whole_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let runs = Runs::default();
    let opts = || options().checkpoint_every(2);
    let mut rt = runtime(Context::open_with(&path, "main", opts()).unwrap(), remind(&runs));
    for n in 1..=5 {
        rt.context_mut().create(format!("order:{n}"), order(n)).unwrap();
    }
    rt.context_mut().create("payment:x", payment(9, 1)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs).len(), 5);
    rt.context().checkpoint().await.unwrap();
    drop(rt);

    let mut ctx = Context::open_with(&path, "main", opts()).unwrap();
    ctx.create("order:9", order(9)).unwrap();
    ctx.create("order:10", order(10)).unwrap();
    let mut rt = runtime(ctx, remind(&runs));
    rt.run().await.unwrap();
    assert_eq!(
        taken(&runs),
        [run_of(EventKind::Created, "order:10", &[])],
        "order 9 has the payment stored before the checkpoint"
    );
    rt.context().verify().unwrap();
    reactifact_core::testing::assert_replays(rt.context(), &[Agent::new("shop").produce(remind(&Runs::default()))])
        .await;
}

#[tokio::test]
async fn replay_diverges_when_the_key_no_longer_completes_the_set() {
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), ship(&runs));
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.context_mut().create("payment:a", payment(1, 500)).unwrap();
    rt.run().await.unwrap();
    let rekeyed = Produce::new("ship", |call: ProduceCall<Order>| async move { drop(call) })
        .creates::<Shipment>()
        .key(|o: &Record<Order>| o.data.id + 1)
        .join(|p: &Record<Payment>| p.data.order_id);
    let err = rt
        .context()
        .replay(&[Agent::new("shop").produce(rekeyed)])
        .await
        .unwrap_err();
    match err {
        ReplayError::Diverged(d) => {
            assert_eq!(d.difference, Difference::JoinIncomplete);
            assert_eq!(d.trigger, "order:1");
        }
        other => panic!("expected a divergence, got {other}"),
    }
}

/// Counts the calls of the key functions.
fn counted_ship(calls: &Arc<AtomicUsize>) -> Produce {
    let (a, b) = (calls.clone(), calls.clone());
    Produce::new("ship", |call: ProduceCall<Order>| async move {
        let payment = call.joined::<Payment>().unwrap().unwrap();
        call.effects.upsert(
            format!("shipment:{}", call.trigger.data.id),
            Shipment {
                item: call.trigger.data.item.clone(),
                cents: payment.data.cents,
            },
        );
    })
    .creates::<Shipment>()
    .key(move |o: &Record<Order>| {
        a.fetch_add(1, Ordering::Relaxed);
        o.data.id
    })
    .join(move |p: &Record<Payment>| {
        b.fetch_add(1, Ordering::Relaxed);
        p.data.order_id
    })
}

#[tokio::test]
async fn matching_a_part_looks_up_its_key_and_never_scans_the_standing_state() {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut rt = runtime(Context::new("main"), counted_ship(&calls));
    let mut tx = rt.context_mut().transaction();
    for n in 0..2_000 {
        tx.create(format!("order:{n}"), order(n));
    }
    for n in 0..500 {
        tx.create(format!("payment:{n}"), payment(n + 10_000, 1));
    }
    tx.commit().unwrap();
    rt.run().await.unwrap();
    // The first generation builds the index from the state: one key per standing part.
    assert_eq!(calls.swap(0, Ordering::Relaxed), 2_500);

    for round in 0..3u64 {
        rt.context_mut()
            .create(format!("payment:new{round}"), payment(round, 2))
            .unwrap();
        rt.run().await.unwrap();
        assert_eq!(
            calls.swap(0, Ordering::Relaxed),
            1,
            "one key computed for the new payment, none for the 2,500 standing artifacts"
        );
        assert!(shipment(rt.context(), round).is_some());
    }
}

#[tokio::test]
async fn a_key_function_that_panics_leaves_its_artifact_out() {
    let runs = Runs::default();
    let shipped = runs.clone();
    let produce = Produce::new("ship", move |call: ProduceCall<Order>| {
        let runs = shipped.clone();
        async move {
            runs.lock()
                .unwrap()
                .push((call.event, call.trigger.id.to_string(), Vec::new()));
        }
    })
    .key(|o: &Record<Order>| o.data.id)
    .join(|p: &Record<Payment>| {
        assert!(p.data.cents > 0, "no free payments");
        p.data.order_id
    });
    let mut rt = runtime(Context::new("main"), produce);
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.context_mut().create("payment:free", payment(1, 0)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), []);
    rt.context_mut().create("payment:paid", payment(1, 3)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:1", &[])]);
}

#[test]
fn a_join_without_a_key_or_a_key_without_a_join_is_refused() {
    let no_key = Produce::new("ship", |call: ProduceCall<Order>| async move { drop(call) })
        .join(|p: &Record<Payment>| p.data.order_id);
    let err = Runtime::builder(Context::new("main"))
        .agent(Agent::new("shop").produce(no_key))
        .build()
        .err()
        .unwrap();
    assert!(matches!(&err, BuildError::Join { produce, .. } if produce == "ship"));
    assert!(err.to_string().contains("no key"), "{err}");

    let no_part =
        Produce::new("ship", |call: ProduceCall<Order>| async move { drop(call) }).key(|o: &Record<Order>| o.data.id);
    let err = Runtime::builder(Context::new("main"))
        .agent(Agent::new("shop").produce(no_part))
        .build()
        .err()
        .unwrap();
    assert!(matches!(err, BuildError::Join { .. }));
}

#[test]
#[should_panic(expected = "cannot react to deletions")]
fn a_join_refuses_deletions() {
    let _ = Produce::new("ship", |call: ProduceCall<Order>| async move { drop(call) })
        .key(|o: &Record<Order>| o.data.id)
        .join(|p: &Record<Payment>| p.data.order_id)
        .on([EventKind::Deleted]);
}

#[test]
#[should_panic(expected = "with itself")]
fn a_join_refuses_its_own_trigger_type() {
    let _ = Produce::new("ship", |call: ProduceCall<Order>| async move { drop(call) })
        .key(|o: &Record<Order>| o.data.id)
        .join(|o: &Record<Order>| o.data.id);
}

#[tokio::test]
async fn a_direct_write_between_turns_keeps_the_index_in_step() {
    // Writes through the context between turns are commits the index applies, not rebuilds:
    // a re-keyed and a deleted payment are seen.
    let calls = Arc::new(AtomicUsize::new(0));
    let mut rt = runtime(Context::new("main"), counted_ship(&calls));
    rt.context_mut().create("payment:a", payment(1, 1)).unwrap();
    rt.run().await.unwrap();
    rt.context_mut().update("payment:a", payment(2, 1)).unwrap();
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.run().await.unwrap();
    assert!(shipment(rt.context(), 1).is_none(), "the payment moved to order 2");
    rt.context_mut().delete("payment:a").unwrap();
    rt.context_mut().create("order:2", order(2)).unwrap();
    rt.run().await.unwrap();
    assert!(shipment(rt.context(), 2).is_none(), "the payment was deleted");
}

#[tokio::test]
async fn a_run_budget_that_splits_the_events_of_a_set_still_runs_it_once() {
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), ship(&runs));
    let mut tx = rt.context_mut().transaction();
    tx.create("order:1", order(1))
        .create("order:2", order(2))
        .create("payment:a", payment(1, 1))
        .create("payment:b", payment(2, 2));
    tx.commit().unwrap();
    // One run per turn: order 1's event runs its set; the batch stops before order 2's.
    let report = rt
        .run_with(reactifact_core::runtime::Budget::default().max_runs(1))
        .await
        .unwrap();
    assert_eq!(report.outcome, reactifact_core::runtime::TurnOutcome::RunsExhausted);
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:1", &["payment:a"])]);
    // Payment a's event, taken later, finds the set order 1 already ran on: no second run.
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:2", &["payment:b"])]);
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), []);
    let join_runs = rt
        .context()
        .log()
        .unwrap()
        .iter()
        .flat_map(|c| &c.runs)
        .filter(|r| r.produce.is_some())
        .count();
    assert_eq!(join_runs, 2);
    // A change still runs again.
    rt.context_mut().update("payment:a", payment(1, 9)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Updated, "order:1", &["payment:a"])]);
}

#[tokio::test]
async fn a_failed_generation_is_retried_and_runs_the_set_once() {
    let runs = Runs::default();
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (recorded, failing) = (runs.clone(), fail.clone());
    let produce = Produce::new("ship", move |call: ProduceCall<Order>| {
        let (runs, fail) = (recorded.clone(), failing.clone());
        async move {
            if fail.swap(false, Ordering::SeqCst) {
                return Err(reactifact_core::ProduceError::msg("the carrier is down"));
            }
            runs.lock()
                .unwrap()
                .push((call.event, call.trigger.id.to_string(), Vec::new()));
            call.effects.upsert(
                format!("shipment:{}", call.trigger.data.id),
                Shipment {
                    item: call.trigger.data.item.clone(),
                    cents: call.joined::<Payment>().unwrap().unwrap().data.cents,
                },
            );
            Ok(())
        }
    })
    .creates::<Shipment>()
    .key(|o: &Record<Order>| o.data.id)
    .join(|p: &Record<Payment>| p.data.order_id);
    let mut rt = runtime(Context::new("main"), produce);
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.run().await.unwrap();
    rt.context_mut().create("payment:a", payment(1, 4)).unwrap();
    rt.run().await.unwrap_err();
    assert_eq!(rt.context().queued_events(), 1, "the payment's event stays queued");
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:1", &[])]);
    assert_eq!(shipment(rt.context(), 1).unwrap().cents, 4);
}

#[tokio::test]
async fn a_part_committed_by_another_writer_reaches_the_index_by_catch_up() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let runs = Runs::default();
    let mut rt = runtime(Context::open_with(&path, "main", options()).unwrap(), ship(&runs));
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.run().await.unwrap();

    let mut other = Context::open_with(&path, "main", options()).unwrap();
    other.create("payment:a", payment(1, 8)).unwrap();
    drop(other);

    assert_eq!(rt.context_mut().catch_up().await.unwrap(), 1);
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:1", &["payment:a"])]);
    assert_eq!(shipment(rt.context(), 1).unwrap().cents, 8);
}

#[tokio::test]
async fn a_watching_join_reruns_on_what_else_it_read_while_its_set_is_complete() {
    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    struct Rate {
        percent: u64,
    }
    impl Artifact for Rate {
        const KIND: &'static str = "rate";
    }
    let runs = Runs::default();
    let recorded = runs.clone();
    let produce = Produce::new("ship", move |call: ProduceCall<Order>| {
        let runs = recorded.clone();
        async move {
            runs.lock()
                .unwrap()
                .push((call.event, call.trigger.id.to_string(), Vec::new()));
            let rate = call.snapshot.get::<Rate>("rate").unwrap().map_or(0, |r| r.data.percent);
            let cents = call.joined::<Payment>().unwrap().unwrap().data.cents;
            call.effects.upsert(
                format!("shipment:{}", call.trigger.data.id),
                Shipment {
                    item: call.trigger.data.item.clone(),
                    cents: cents * rate / 100,
                },
            );
        }
    })
    .creates::<Shipment>()
    .key(|o: &Record<Order>| o.data.id)
    .join(|p: &Record<Payment>| p.data.order_id)
    .stale();
    let mut rt = runtime(Context::new("main"), produce);
    let mut tx = rt.context_mut().transaction();
    tx.create("rate", Rate { percent: 50 })
        .create("order:1", order(1))
        .create("payment:a", payment(1, 200));
    tx.commit().unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:1", &[])]);
    assert_eq!(shipment(rt.context(), 1).unwrap().cents, 100);

    rt.context_mut().update("rate", Rate { percent: 10 }).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Stale, "order:1", &[])]);
    assert_eq!(shipment(rt.context(), 1).unwrap().cents, 20);

    // The payment goes: the set is incomplete, so a change of the rate reruns nothing.
    rt.context_mut().delete("payment:a").unwrap();
    rt.run().await.unwrap();
    rt.context_mut().update("rate", Rate { percent: 20 }).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), []);
}

#[tokio::test]
async fn a_set_split_by_a_run_budget_runs_once_across_a_reopen_of_the_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let runs = Runs::default();
    let mut rt = runtime(Context::open_with(&path, "main", options()).unwrap(), ship(&runs));
    let mut tx = rt.context_mut().transaction();
    tx.create("order:1", order(1))
        .create("order:2", order(2))
        .create("payment:a", payment(1, 1))
        .create("payment:b", payment(2, 2));
    tx.commit().unwrap();
    rt.run_with(reactifact_core::runtime::Budget::default().max_runs(1))
        .await
        .unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:1", &["payment:a"])]);
    drop(rt);

    // Reopened: payment a's event is still queued; the log says order 1's set already ran.
    let ctx = Context::open_with(&path, "main", options()).unwrap();
    // Order 2's, both payments' and the shipment's (consumed when the queue reaches it).
    assert_eq!(ctx.queued_events(), 4);
    let mut rt = runtime(ctx, ship(&runs));
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:2", &["payment:b"])]);
    drop(rt);
    let ctx = Context::open_with(&path, "main", options()).unwrap();
    ctx.verify().unwrap();
    reactifact_core::testing::assert_replays(&ctx, &[Agent::new("shop").produce(ship(&Runs::default()))]).await;
}

#[tokio::test]
async fn a_part_deleted_and_created_again_with_equal_content_runs_the_set_again() {
    // Same id, same version number and content as the part the last run joined, but written
    // after that run: a new arrival, so the set runs again.
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), ship(&runs));
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.context_mut().create("payment:a", payment(1, 5)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs).len(), 1);
    rt.context_mut().delete("payment:a").unwrap();
    rt.context_mut().create("payment:a", payment(1, 5)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:1", &["payment:a"])]);
}

#[tokio::test]
async fn the_event_kinds_of_a_join_apply_to_every_part() {
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), ship(&runs).on([EventKind::Created]));
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.context_mut().create("payment:a", payment(1, 5)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:1", &["payment:a"])]);
    // Updates of either part run nothing; a new part does.
    rt.context_mut().update("payment:a", payment(1, 6)).unwrap();
    rt.context_mut()
        .update(
            "order:1",
            Order {
                id: 1,
                item: "y".into(),
            },
        )
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), []);
    rt.context_mut().create("payment:b", payment(1, 7)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(
        taken(&runs),
        [run_of(EventKind::Created, "order:1", &["payment:a", "payment:b"])]
    );
}

#[tokio::test]
async fn a_condition_on_the_trigger_holds_for_runs_a_part_calls_for() {
    let runs = Runs::default();
    let produce = ship(&runs).when(|_, o: &Record<Order>| o.data.id % 2 == 0);
    let mut rt = runtime(Context::new("main"), produce);
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.context_mut().create("order:2", order(2)).unwrap();
    let mut tx = rt.context_mut().transaction();
    tx.create("payment:a", payment(1, 1)).create("payment:b", payment(2, 2));
    tx.commit().unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:2", &["payment:b"])]);
}

#[test]
#[should_panic(expected = "must take its trigger type")]
fn a_join_key_of_another_type_than_the_trigger_is_refused() {
    let _ = Produce::new("ship", |call: ProduceCall<Order>| async move { drop(call) })
        .key(|p: &Record<Payment>| p.data.order_id);
}

#[tokio::test]
async fn a_part_merged_from_a_branch_completes_the_set_once() {
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), ship(&runs));
    rt.context_mut().create("order:1", order(1)).unwrap();
    rt.run().await.unwrap();
    let mut branch = rt.context().fork("pay").unwrap();
    branch.create("payment:a", payment(1, 40)).unwrap();
    rt.context_mut().create("order:2", order(2)).unwrap();
    rt.run().await.unwrap();
    rt.context_mut().merge(&branch).unwrap();
    rt.run().await.unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:1", &["payment:a"])]);
    assert_eq!(shipment(rt.context(), 1).unwrap().cents, 40);
    rt.context().verify().unwrap();
    reactifact_core::testing::assert_replays(rt.context(), &[Agent::new("shop").produce(ship(&Runs::default()))]).await;
}

#[tokio::test]
async fn a_set_split_by_a_run_budget_runs_once_while_the_record_of_runs_is_pruned() {
    // Order 5000's set runs first (budget 1); 1,100 other sets run before its payment's event
    // is taken (budget 1,100, which stops before order 9999's), so the runtime's record of join
    // runs passes the size at which it forgets the runs no queued event can have been answered
    // by: order 5000's run must survive that, and its payment must not run it again.
    let runs = Runs::default();
    let mut rt = runtime(Context::new("main"), ship(&runs));
    let mut tx = rt.context_mut().transaction();
    tx.create("order:5000", order(5_000));
    for i in 1..=1_100 {
        tx.create(format!("order:{i}"), order(i));
        tx.create(format!("payment:{i}"), payment(i, i));
    }
    tx.create("order:9999", order(9_999))
        .create("payment:9999", payment(9_999, 1))
        .create("payment:x", payment(5_000, 1));
    tx.commit().unwrap();
    let budget = |runs| reactifact_core::runtime::Budget::default().max_runs(runs);
    rt.run_with(budget(1)).await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Created, "order:5000", &["payment:x"])]);
    rt.run_with(budget(1_100)).await.unwrap();
    assert_eq!(taken(&runs).len(), 1_100);
    rt.run().await.unwrap();
    assert_eq!(
        taken(&runs),
        [run_of(EventKind::Created, "order:9999", &["payment:9999"])],
        "payment x's event finds the set order 5000 already ran on"
    );
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), []);
    // A change still runs a set again.
    rt.context_mut().update("payment:7", payment(7, 70)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [run_of(EventKind::Updated, "order:7", &["payment:7"])]);
}

//! Conditions: `Produce::when` and the helpers of `reactifact_core::when`, evaluated on the
//! trigger when its event is matched; a trigger deleted meanwhile does not match; a missing
//! field does not hold; a condition that panics fails its run instead of the runtime.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use reactifact_core::audit::EventKind;
use reactifact_core::error::{RunError, RunFailure};
use reactifact_core::runtime::ProduceErrors;
use reactifact_core::when::{field_equals, status_is};
use reactifact_core::{Agent, Artifact, Context, Produce, ProduceCall, Record, Runtime, Snapshot};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
enum Status {
    Open,
    Paid,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Address {
    country: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Invoice {
    status: Status,
    total_cents: u64,
    address: Address,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

impl Artifact for Invoice {
    const KIND: &'static str = "invoice";
}

fn invoice(status: Status, total_cents: u64, country: &str) -> Invoice {
    Invoice {
        status,
        total_cents,
        address: Address {
            country: country.into(),
        },
        note: None,
    }
}

type Ran = Arc<Mutex<Vec<String>>>;

/// A produce on invoices that records the ids it ran on.
fn recorder(ran: &Ran) -> Produce {
    let ran = ran.clone();
    Produce::new("record", move |call: ProduceCall<Invoice>| {
        let ran = ran.clone();
        async move {
            ran.lock().unwrap().push(call.trigger.id.to_string());
        }
    })
}

/// Runs one turn of `produce` on `ctx`; returns the ids `ran` recorded.
async fn ran_on(ctx: Context, produce: Produce, ran: &Ran) -> Vec<String> {
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(produce))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(rt.context().queued_events(), 0, "every event was consumed");
    let out = ran.lock().unwrap().clone();
    out
}

fn seeded() -> Context {
    let mut ctx = Context::new("t");
    let mut tx = ctx.transaction();
    tx.create("invoice:1", invoice(Status::Paid, 5, "fr"));
    tx.create("invoice:2", invoice(Status::Open, 5, "de"));
    tx.create("invoice:3", invoice(Status::Paid, 7, "de"));
    tx.commit().unwrap();
    ctx
}

#[tokio::test]
async fn field_equals_and_status_is_run_only_the_matching_triggers() {
    let ran = Ran::default();
    let paid = ran_on(
        seeded(),
        recorder(&ran).when::<Invoice, _>(status_is(Status::Paid)),
        &ran,
    )
    .await;
    assert_eq!(paid, ["invoice:1", "invoice:3"]);

    // A unit variant serializes as its name: the string is the same condition.
    let ran = Ran::default();
    let by_name = ran_on(seeded(), recorder(&ran).when::<Invoice, _>(status_is("Paid")), &ran).await;
    assert_eq!(by_name, paid);

    // Numbers compare by value across integer types.
    let ran = Ran::default();
    let five = ran_on(
        seeded(),
        recorder(&ran).when::<Invoice, _>(field_equals("total_cents", 5u8)),
        &ran,
    )
    .await;
    assert_eq!(five, ["invoice:1", "invoice:2"]);

    // A dotted path names a nested field.
    let ran = Ran::default();
    let german = ran_on(
        seeded(),
        recorder(&ran).when::<Invoice, _>(field_equals("address.country", "de")),
        &ran,
    )
    .await;
    assert_eq!(german, ["invoice:2", "invoice:3"]);

    // An integer never equals a float; a string never equals a number.
    let ran = Ran::default();
    assert!(ran_on(
        seeded(),
        recorder(&ran).when::<Invoice, _>(field_equals("total_cents", 5.0)),
        &ran
    )
    .await
    .is_empty());
    let ran = Ran::default();
    assert!(ran_on(
        seeded(),
        recorder(&ran).when::<Invoice, _>(field_equals("total_cents", "5")),
        &ran
    )
    .await
    .is_empty());
}

#[tokio::test]
async fn a_missing_field_does_not_hold_and_panics_nowhere() {
    for field in ["stauts", "note", "address.city", "status.inner", ""] {
        let ran = Ran::default();
        let none = ran_on(
            seeded(),
            recorder(&ran).when::<Invoice, _>(field_equals(field, "Paid")),
            &ran,
        )
        .await;
        assert!(none.is_empty(), "field `{field}` ran {none:?}");
    }
    // A present optional field is found.
    let mut ctx = Context::new("t");
    let mut noted = invoice(Status::Open, 1, "fr");
    noted.note = Some("rush".into());
    ctx.create("invoice:noted", noted).unwrap();
    ctx.create("invoice:plain", invoice(Status::Open, 1, "fr")).unwrap();
    let ran = Ran::default();
    let rush = ran_on(
        ctx,
        recorder(&ran).when::<Invoice, _>(field_equals("note", "rush")),
        &ran,
    )
    .await;
    assert_eq!(rush, ["invoice:noted"]);
}

#[tokio::test]
async fn the_condition_is_evaluated_when_the_event_is_matched_on_the_current_version() {
    let ran = Ran::default();
    let mut ctx = Context::new("t");
    ctx.create("invoice:1", invoice(Status::Open, 5, "fr")).unwrap();
    let produce = recorder(&ran).when::<Invoice, _>(status_is(Status::Paid));
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(produce))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    assert!(ran.lock().unwrap().is_empty(), "open: no run");
    rt.context_mut()
        .update("invoice:1", invoice(Status::Paid, 5, "fr"))
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(*ran.lock().unwrap(), ["invoice:1"], "paid since: the update runs it");
}

#[tokio::test]
async fn a_trigger_deleted_meanwhile_does_not_match() {
    let evaluated = Arc::new(AtomicUsize::new(0));
    let counting = {
        let evaluated = evaluated.clone();
        move |_: &Snapshot, _: &Record<Invoice>| {
            evaluated.fetch_add(1, Ordering::SeqCst);
            true
        }
    };
    let ran = Ran::default();
    let mut ctx = Context::new("t");
    ctx.create("invoice:1", invoice(Status::Paid, 5, "fr")).unwrap();
    ctx.update("invoice:1", invoice(Status::Paid, 6, "fr")).unwrap();
    ctx.delete("invoice:1").unwrap();
    ctx.create("invoice:2", invoice(Status::Paid, 5, "fr")).unwrap();
    let none = ran_on(ctx, recorder(&ran).when(counting), &ran).await;
    assert_eq!(
        none,
        ["invoice:2"],
        "the created and updated events of a deleted trigger run nothing"
    );
    assert_eq!(
        evaluated.load(Ordering::SeqCst),
        1,
        "nor is the condition evaluated on them"
    );

    // A produce that also reacts to deletions runs once, on the deletion.
    let ran = Ran::default();
    let mut ctx = Context::new("t");
    ctx.create("invoice:1", invoice(Status::Paid, 5, "fr")).unwrap();
    ctx.delete("invoice:1").unwrap();
    let deleted = recorder(&ran)
        .on([EventKind::Created, EventKind::Deleted])
        .when::<Invoice, _>(status_is(Status::Paid));
    assert_eq!(ran_on(ctx, deleted, &ran).await, ["invoice:1"]);
}

#[tokio::test]
async fn a_condition_that_panics_fails_its_run_and_leaves_the_events_queued() {
    let panicking = |_: &Snapshot, invoice: &Record<Invoice>| {
        assert!(invoice.data.total_cents != 7, "seven is unlucky");
        true
    };
    let ran = Ran::default();
    let mut rt = Runtime::builder(seeded())
        .agent(Agent::new("a").produce(recorder(&ran).when(panicking)))
        .build()
        .unwrap();
    let err = rt.run().await.unwrap_err();
    let RunError::Produce { first, others } = err else {
        panic!("not a produce failure: {err}");
    };
    assert_eq!((first.trigger.as_str(), others), ("invoice:3", 0));
    assert!(
        matches!(&first.failure, RunFailure::Panicked(m) if m.contains("its condition panicked") && m.contains("seven is unlucky")),
        "{}",
        first.failure
    );
    assert_eq!(rt.context().queued_events(), 3, "nothing was committed");
    assert_eq!(rt.context().generation().0, 1);

    // In isolation, only that run is dropped.
    let ran = Ran::default();
    let mut rt = Runtime::builder(seeded())
        .agent(Agent::new("a").produce(recorder(&ran).when(panicking)))
        .produce_errors(ProduceErrors::Isolate)
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.failed_runs.len(), 1);
    assert_eq!(*ran.lock().unwrap(), ["invoice:1", "invoice:2"]);
    assert_eq!(rt.context().queued_events(), 0);
}

//! The produce test harness: one run, no runtime, store or dispatcher.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reactifact_core::audit::EventKind;
use reactifact_core::error::{CallError, MissKind, RunFailure};
use reactifact_core::runtime::Usage;
use reactifact_core::testing::ProduceTest;
use reactifact_core::{Artifact, PendingAction, Produce, ProduceCall, ProduceError};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Ticket {
    customer: String,
    text: String,
}

impl Artifact for Ticket {
    const KIND: &'static str = "ticket";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Customer {
    tier: String,
}

impl Artifact for Customer {
    const KIND: &'static str = "customer";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Reply {
    text: String,
    at_secs: u64,
    roll: u64,
}

impl Artifact for Reply {
    const KIND: &'static str = "reply";
}

struct Tone(&'static str);

/// Reads the customer from the snapshot, a resource, two model calls, the clock and the rng.
fn draft(calls: Arc<AtomicU64>) -> Produce {
    Produce::new("draft", move |call: ProduceCall<Ticket>| {
        let calls = calls.clone();
        async move {
            let tier = match call.snapshot.get::<Customer>(&call.trigger.data.customer)? {
                Some(customer) => customer.data.tier,
                None => "unknown".to_owned(),
            };
            let tone = call.resource::<Tone>().0;
            let prompt = format!("{tone} reply to a {tier} customer: {}", call.trigger.data.text);
            let category: String = call
                .record("classify", &call.trigger.data.text, || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>("live".to_owned())
                })
                .await?;
            let text: String = call
                .record_metered("llm", &prompt, || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(("live draft".to_owned(), Usage::tokens(5, 5)))
                })
                .await?;
            let at_secs = call.now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
            let roll = call.rng().u64(1..=6);
            let id = call.trigger.id.to_string();
            call.effects
                .upsert(format!("reply:{id}"), Reply { text, at_secs, roll });
            call.effects.act("email", format!("email:{id}"), &category);
            Ok::<(), ProduceError>(())
        }
    })
    .creates::<Reply>()
    .creates::<PendingAction>()
    .uses::<Tone>()
}

fn ticket() -> Ticket {
    Ticket {
        customer: "customer:ada".into(),
        text: "my invoice is wrong".into(),
    }
}

fn test(calls: &Arc<AtomicU64>) -> ProduceTest {
    ProduceTest::new(draft(calls.clone()))
        .with("customer:ada", Customer { tier: "gold".into() })
        .trigger("ticket:1", ticket())
        .resource(Tone("warm"))
}

#[tokio::test]
async fn a_run_gets_its_scripted_answers_and_returns_its_effects() {
    let calls = Arc::new(AtomicU64::new(0));
    let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let effects = test(&calls)
        .answer("classify", "billing")
        .answer_metered("llm", "We are fixing it.", Usage::tokens(40, 12).with_cost(2))
        .now(at)
        .seed(7)
        .run()
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 0, "scripted answers call nothing");
    let reply = effects.get::<Reply>("reply:ticket:1").unwrap();
    assert_eq!(
        (reply.text.as_str(), reply.at_secs),
        ("We are fixing it.", 1_700_000_000)
    );
    let intent = effects.intent("email:ticket:1").unwrap();
    assert_eq!(
        (intent.kind.as_str(), intent.payload::<String>().unwrap()),
        ("email", "billing".into())
    );
    assert_eq!(effects.intents().len(), 1);
    assert_eq!(effects.written::<Reply>().len(), 1);
    // The request shows what the produce sent: the snapshot and the resource went into it.
    assert_eq!(
        effects.requests::<String>("llm"),
        ["warm reply to a gold customer: my invoice is wrong"]
    );
    assert_eq!(effects.usage(), Usage::tokens(40, 12).with_cost(2));
    let names: Vec<&str> = effects.calls().iter().map(|c| &*c.name).collect();
    assert_eq!(names, ["classify", "llm", "reactifact.now", "reactifact.rng"]);
    assert!(effects.reads().iter().any(|r| r.id.as_str() == "customer:ada"));

    // The same seed draws the same numbers.
    let again = test(&calls)
        .answer("classify", "billing")
        .answer("llm", "We are fixing it.")
        .now(at)
        .seed(7)
        .run()
        .await
        .unwrap();
    assert_eq!(again.get::<Reply>("reply:ticket:1").unwrap().roll, reply.roll);
}

#[tokio::test]
async fn a_call_without_a_scripted_answer_is_a_miss_unless_calls_go_through() {
    let calls = Arc::new(AtomicU64::new(0));
    let err = test(&calls).answer("classify", "billing").run().await.unwrap_err();
    let RunFailure::Returned(error) = &err else {
        panic!("expected the produce's error, got {err:?}");
    };
    let miss = error.as_error().downcast_ref::<CallError>().expect("a call error");
    match miss {
        CallError::Miss(miss) => {
            assert_eq!((miss.call.as_str(), miss.index), ("llm", 0));
            assert_eq!(miss.kind, MissKind::NotScripted);
        }
        other => panic!("expected a miss, got {other}"),
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    let effects = test(&calls).call_through().run().await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(effects.get::<Reply>("reply:ticket:1").unwrap().text, "live draft");
    assert_eq!(effects.usage(), Usage::tokens(5, 5));
    // Without a time set, `now` reads the runtime's clock.
    let at = effects.get::<Reply>("reply:ticket:1").unwrap().at_secs;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    assert!(at > 0 && at <= now);
}

#[tokio::test]
async fn an_undeclared_output_fails_the_run_as_the_runtime_would() {
    let produce = Produce::new("sloppy", |call: ProduceCall<Ticket>| async move {
        call.effects.upsert("customer:new", Customer { tier: "free".into() });
    });
    let err = ProduceTest::new(produce)
        .trigger("ticket:1", ticket())
        .run()
        .await
        .unwrap_err();
    assert!(matches!(err, RunFailure::UndeclaredOutput { .. }), "{err:?}");
}

#[tokio::test]
async fn a_deletion_runs_on_the_last_version_against_a_snapshot_without_it() {
    let produce = Produce::new("forget", |call: ProduceCall<Ticket>| async move {
        assert_eq!(call.event, EventKind::Deleted);
        assert_eq!(call.trigger.data.text, "my invoice is wrong");
        assert!(call.snapshot.get::<Ticket>("ticket:1").unwrap().is_none());
        call.effects.delete("reply:ticket:1");
    })
    .on([EventKind::Deleted]);
    let effects = ProduceTest::new(produce)
        .trigger("ticket:1", ticket())
        .with(
            "reply:ticket:1",
            Reply {
                text: "x".into(),
                at_secs: 0,
                roll: 1,
            },
        )
        .event(EventKind::Deleted)
        .run()
        .await
        .unwrap();
    assert_eq!(effects.deleted().len(), 1);
}

#[tokio::test]
#[should_panic(expected = "uses resource")]
async fn a_resource_the_test_does_not_provide_is_a_mistake_in_the_test() {
    let calls = Arc::new(AtomicU64::new(0));
    let _ = ProduceTest::new(draft(calls)).trigger("ticket:1", ticket()).run().await;
}

//! The replay oracle: recorded runs re-executed against the snapshots they saw.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use common::*;
use reactifact_core::audit::{Difference, ReplayError};
use reactifact_core::runtime::Generation;
use reactifact_core::{Agent, Artifact, Context, PendingAction, Produce, ProduceCall, ProduceError, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Stamp {
    order: String,
    at_nanos: u128,
}

impl Artifact for Stamp {
    const KIND: &'static str = "stamp";
}

async fn run(ctx: Context, agents: Vec<Agent>, recorder: &Recorder) -> Runtime {
    let mut builder = Runtime::builder(ctx).dispatcher(recorder.dispatcher());
    for agent in agents {
        builder = builder.agent(agent);
    }
    let mut rt = builder.build().unwrap();
    rt.run().await.unwrap();
    rt
}

fn orders() -> Context {
    seeded([
        ("order:1".to_owned(), order("ada", 1200)),
        ("order:2".to_owned(), order("bob", 300)),
    ])
}

#[tokio::test]
async fn a_deterministic_flow_replays_without_dispatching_or_writing() {
    let recorder = Recorder::default();
    let agents = vec![Agent::new("billing").produce(process_order())];
    let mut rt = run(orders(), agents.clone(), &recorder).await;
    // A later version of order:1: its second run must see version 2, the first run version 1.
    rt.context_mut().update("order:1", order("ada", 1500)).unwrap();
    rt.run().await.unwrap();
    let (head, sent) = (rt.context().head(), recorder.sent());

    let report = rt.replay().await.unwrap();
    assert_eq!((report.commits, report.runs), (2, 3));
    reactifact_core::testing::assert_replays(rt.context(), &agents).await;

    assert_eq!(rt.context().head(), head, "replay writes nothing");
    assert_eq!(recorder.sent(), sent, "replay dispatches nothing");
}

#[tokio::test]
async fn a_produce_reading_the_clock_is_pinpointed_to_the_field() {
    let stamp = || {
        Produce::new("stamp", |call: ProduceCall<Order>| async move {
            let at_nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
            call.effects.upsert(
                format!("stamp:{}", call.trigger.id),
                Stamp {
                    order: call.trigger.id.to_string(),
                    at_nanos,
                },
            );
            Ok::<(), ProduceError>(())
        })
        .creates::<Stamp>()
    };
    let recorder = Recorder::default();
    let agents = vec![Agent::new("billing").produce(process_order()).produce(stamp())];
    let rt = run(orders(), agents, &recorder).await;
    // The clock has moved on (by nanoseconds at least) by the time of the replay.

    let err = rt.replay().await.unwrap_err();
    let ReplayError::Diverged(divergence) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(divergence.generation, Generation(2));
    assert_eq!(
        (divergence.agent.as_str(), divergence.produce.as_str()),
        ("billing", "stamp")
    );
    assert_eq!(divergence.trigger.as_str(), "order:1");
    assert_eq!(divergence.id.as_ref().map(|id| id.as_str()), Some("stamp:order:1"));
    let Difference::Content { fields } = &divergence.difference else {
        panic!("{divergence:?}");
    };
    assert_eq!(fields.len(), 1, "{fields:?}");
    assert_eq!(fields[0].path, ".at_nanos");
    assert!(
        err.to_string()
            .starts_with("replay diverged at generation 2, run 1 (billing/stamp on `order:1`), artifact `stamp:order:1`: .at_nanos was "),
        "{err}"
    );
}

#[derive(Serialize, Deserialize)]
struct Ping {
    order: String,
    seq: u64,
}

#[tokio::test]
async fn a_produce_using_a_counter_in_an_intent_payload_is_pinpointed() {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let ping = Produce::new("ping", |call: ProduceCall<Order>| async move {
        let seq = COUNTER.fetch_add(1, Ordering::Relaxed);
        let order = call.trigger.id.to_string();
        call.effects.act("ping", format!("ping:{order}"), &Ping { order, seq });
        Ok::<(), ProduceError>(())
    })
    .creates::<PendingAction>();
    let recorder = Recorder::default();
    let agents = vec![Agent::new("pinger").produce(ping)];
    let rt = run(orders(), agents, &recorder).await;

    let err = rt.replay().await.unwrap_err();
    let ReplayError::Diverged(divergence) = &err else {
        panic!("{err:?}");
    };
    assert_eq!((divergence.generation, divergence.run), (Generation(2), 0));
    assert_eq!(
        divergence.id.as_ref().map(|id| id.as_str()),
        Some("action:ping:order:1")
    );
    let Difference::Content { fields } = &divergence.difference else {
        panic!("{divergence:?}");
    };
    assert_eq!(fields.len(), 1, "{fields:?}");
    assert_eq!(
        (fields[0].path.as_str(), fields[0].recorded.as_str()),
        ("payload.seq", "0")
    );
}

#[tokio::test]
async fn a_changed_produce_is_reported_with_the_operation_it_no_longer_writes() {
    let recorder = Recorder::default();
    let rt = run(
        orders(),
        vec![Agent::new("billing").produce(process_order())],
        &recorder,
    )
    .await;
    let without_intent = Produce::new("process_order", |call: ProduceCall<Order>| async move {
        let id = call.trigger.id.to_string();
        call.effects.upsert(
            format!("receipt:{id}"),
            Receipt {
                order: id.clone(),
                total_cents: call.trigger.data.total_cents,
            },
        );
        Ok::<(), ProduceError>(())
    })
    .creates::<Receipt>();
    let err = rt
        .context()
        .replay(&[Agent::new("billing").produce(without_intent)])
        .await
        .unwrap_err();
    let ReplayError::Diverged(divergence) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(
        divergence.difference,
        Difference::Operation {
            recorded: "act notify `notify:order:1`".to_owned(),
            replayed: "nothing".to_owned()
        }
    );

    let err = rt.context().replay(&[]).await.unwrap_err();
    assert!(
        matches!(&err, ReplayError::Diverged(d) if d.difference == Difference::UnknownProduce),
        "{err:?}"
    );
}

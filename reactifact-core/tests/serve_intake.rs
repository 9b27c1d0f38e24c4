//! A serving runtime's intake runs beside its generations: a handle write is committed and
//! acknowledged while a generation's produces wait (on a model, say), and a generation whose
//! snapshot such writes overtook runs again on them — with the answers its recorded calls got —
//! so nothing it decided rests on a state that is gone.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{order, Order};
use reactifact_core::{Agent, Artifact, Context, Produce, ProduceCall, ProduceError, Runtime};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Tally {
    n: u64,
}

impl Artifact for Tally {
    const KIND: &'static str = "tally";
}

/// A produce that asks a "model" (a recorded call counted in `calls`, which waits for `gate`
/// when given one, or `wait` of tokio time) for a number and adds it to `tally:1`, which it
/// reads from its snapshot.
fn add_the_answer(calls: Arc<AtomicU32>, gate: Option<Arc<Notify>>, wait: Duration) -> Produce {
    Produce::new("add_the_answer", move |call: ProduceCall<Order>| {
        let (calls, gate) = (calls.clone(), gate.clone());
        async move {
            let answer: u64 = call
                .record("model", &call.trigger.id.to_string(), || async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    match gate {
                        Some(gate) => gate.notified().await,
                        None => tokio::time::sleep(wait).await,
                    }
                    Ok::<u64, std::convert::Infallible>(1)
                })
                .await?;
            let tally = call.snapshot.get::<Tally>("tally:1")?.map_or(0, |t| t.data.n);
            call.effects.update("tally:1", Tally { n: tally + answer });
            Ok::<(), ProduceError>(())
        }
    })
}

fn tally(rt: &Runtime) -> u64 {
    rt.context().get::<Tally>("tally:1").unwrap().unwrap().data.n
}

/// A write acknowledged while a generation that read the same artifact waits on its model: the
/// generation runs again on the write (no lost update), and the model is asked once.
#[tokio::test(start_paused = true)]
async fn a_write_that_overtakes_a_generation_which_read_it_is_not_lost() {
    let calls = Arc::new(AtomicU32::new(0));
    let gate = Arc::new(Notify::new());
    let mut ctx = Context::new("orders");
    ctx.create("tally:1", Tally { n: 0 }).unwrap();
    let rt = Runtime::builder(ctx)
        .agent(Agent::new("tally").produce(add_the_answer(calls.clone(), Some(gate.clone()), Duration::ZERO)))
        .build()
        .unwrap();
    let handle = rt.handle();
    let serving = common::serving(rt, Duration::from_secs(3600));
    handle.create("order:1", order("ada", 1)).await.unwrap();
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    // The generation waits on its model: this write is committed and acknowledged meanwhile.
    handle.update("tally:1", Tally { n: 100 }).await.unwrap();
    gate.notify_one();
    // The generation runs again on the write, with the model's answer.
    tokio::time::sleep(Duration::from_millis(10)).await;
    handle.stop();
    let (rt, report) = serving.await.unwrap();
    assert_eq!(tally(&rt), 101, "the write is not lost under the generation's");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the model is asked once");
    assert_eq!(report.overtaken, 1);
    assert_eq!(report.writes, 2);
    assert_eq!(report.generations, 1);
    assert_eq!(rt.context().queued_events(), 0);
}

/// Writes are acknowledged while a produce's model call takes an hour (tokio time): none of
/// them waits for it.
#[tokio::test(start_paused = true)]
async fn intake_never_waits_for_a_produce() {
    let calls = Arc::new(AtomicU32::new(0));
    let mut ctx = Context::new("orders");
    ctx.create("tally:1", Tally { n: 0 }).unwrap();
    let rt = Runtime::builder(ctx)
        .agent(Agent::new("tally").produce(add_the_answer(calls.clone(), None, Duration::from_secs(3600))))
        .build()
        .unwrap();
    let handle = rt.handle();
    let serving = common::serving(rt, Duration::from_secs(24 * 3600));
    handle.create("order:1", order("ada", 1)).await.unwrap();
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let started = tokio::time::Instant::now();
    for i in 0..10 {
        handle.create(format!("note:{i}"), Tally { n: i }).await.unwrap();
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the writes waited for the model: {:?}",
        started.elapsed()
    );
    // The model answers after its hour; the generation commits on the ten writes.
    tokio::time::sleep(Duration::from_secs(3601)).await;
    handle.stop();
    let (rt, report) = serving.await.unwrap();
    assert_eq!(tally(&rt), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(report.writes, 11);
    assert_eq!(report.overtaken, 1);
    assert_eq!(rt.context().list::<Tally>().count(), 11);
}

/// A stop while a model call hangs ends `serve` at once: the generation is cancelled and its
/// event stays queued for the next serve, which runs it.
#[tokio::test(start_paused = true)]
async fn a_stop_while_a_model_call_hangs_returns_at_once_and_loses_nothing() {
    let calls = Arc::new(AtomicU32::new(0));
    let mut ctx = Context::new("orders");
    ctx.create("tally:1", Tally { n: 0 }).unwrap();
    let gate = Arc::new(Notify::new());
    let rt = Runtime::builder(ctx)
        .agent(Agent::new("tally").produce(add_the_answer(calls.clone(), Some(gate.clone()), Duration::ZERO)))
        .build()
        .unwrap();
    let handle = rt.handle();
    let serving = common::serving(rt, Duration::from_secs(3600));
    handle.create("order:1", order("ada", 1)).await.unwrap();
    while calls.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let started = tokio::time::Instant::now();
    handle.stop();
    let (rt, report) = serving.await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(report.generations, 0);
    assert_eq!(report.queued_events, 2, "the report says what it left queued");
    // The tally's creation and the order stay queued.
    assert_eq!(rt.context().queued_events(), 2, "the events stay queued");
    // Served again, the run asks again (its call never answered) and commits.
    gate.notify_one();
    let handle = rt.handle();
    let serving = common::serving(rt, Duration::from_secs(3600));
    while calls.load(Ordering::SeqCst) < 2 {
        tokio::task::yield_now().await;
    }
    gate.notify_one();
    tokio::time::sleep(Duration::from_millis(10)).await;
    handle.stop();
    let (rt, report) = serving.await.unwrap();
    assert_eq!(tally(&rt), 1);
    assert_eq!(report.generations, 1, "the report counts over the runtime's life");
    assert_eq!(rt.context().queued_events(), 0);
}

//! Budgets and the call cache, from a third adversarial review: a run that never started in a
//! cancelled generation, a panic after an answered call, a stop while a run waits on its
//! answer, and how far the batch's head exemption lets a turn overshoot its budget.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{tickets, Note, Out, Ticket};
use reactifact_core::audit::EventKind;
use reactifact_core::runtime::{Budget, TurnOutcome, Usage};
use reactifact_core::{Agent, Context, Produce, ProduceCall, ProduceError, Runtime};

/// Switches a test flips between turns.
#[derive(Default)]
struct Flags {
    /// `ticket:1`'s run sleeps 100 s before writing.
    slow_first: AtomicBool,
    /// `ticket:2`'s run sleeps 100 s after its call answered.
    hang_second: AtomicBool,
    /// The run panics after its call answered.
    panic: AtomicBool,
}

/// `ticket:1` writes (slowly when told); `ticket:2` makes one paid call (counted in `made`),
/// then hangs when told, then writes.
fn two_tickets(flags: Arc<Flags>, made: Arc<AtomicU64>) -> Produce {
    Produce::new("answer", move |call: ProduceCall<Ticket>| {
        let (flags, made) = (flags.clone(), made.clone());
        async move {
            if call.trigger.id.as_str() == "ticket:1" {
                if flags.slow_first.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_secs(100)).await;
                }
            } else {
                let _: String = call
                    .record_metered("llm", call.trigger.id.as_str(), || async {
                        made.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(("a".to_owned(), Usage::tokens(80, 20)))
                    })
                    .await?;
                if flags.hang_second.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_secs(100)).await;
                }
                if flags.panic.load(Ordering::SeqCst) {
                    panic!("the produce panicked after its call answered");
                }
            }
            call.effects
                .upsert(format!("out:{}", call.trigger.id), Out { text: "done".into() });
            Ok::<(), ProduceError>(())
        }
    })
    .creates::<Out>()
}

/// A run's answers from an earlier, uncommitted attempt are taken out of the call cache when
/// its generation starts (`Tracker::new`) and handed back only by the runs that started. A run
/// waiting on its agent's concurrency limit when the deadline cancels the generation never
/// starts, so its earlier answer is dropped and the next attempt pays for the call again.
#[tokio::test(start_paused = true)]
async fn a_run_waiting_on_its_agents_limit_keeps_its_earlier_answer_through_a_cancelled_generation() {
    let flags = Arc::new(Flags::default());
    let made = Arc::new(AtomicU64::new(0));
    let mut rt = Runtime::builder(tickets(2))
        .agent(
            Agent::new("a")
                .concurrency(1)
                .produce(two_tickets(flags.clone(), made.clone())),
        )
        .build()
        .unwrap();
    // Turn 1: ticket:1 finishes, ticket:2's call answers, then it hangs past the deadline.
    flags.hang_second.store(true, Ordering::SeqCst);
    let report = rt
        .run_with(Budget::default().deadline(Duration::from_secs(50)))
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::DeadlineExceeded);
    assert_eq!(made.load(Ordering::SeqCst), 1);
    // Turn 2: ticket:1 is slow, so ticket:2 waits on the agent's limit until the deadline.
    flags.hang_second.store(false, Ordering::SeqCst);
    flags.slow_first.store(true, Ordering::SeqCst);
    let report = rt
        .run_with(Budget::default().deadline(Duration::from_secs(50)))
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::DeadlineExceeded);
    assert_eq!(made.load(Ordering::SeqCst), 1, "ticket:2 never started in turn 2");
    // Turn 3: everything runs.
    flags.slow_first.store(false, Ordering::SeqCst);
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(
        made.load(Ordering::SeqCst),
        1,
        "ticket:2's answer from turn 1 was dropped by turn 2, in which it never started, and paid again"
    );
}

/// The same through the global limit: with one run at a time, the run not reached when the
/// turn is stopped loses its earlier answer too.
#[tokio::test(start_paused = true)]
async fn a_run_not_reached_by_the_global_limit_keeps_its_earlier_answer_through_a_stop() {
    let flags = Arc::new(Flags::default());
    let made = Arc::new(AtomicU64::new(0));
    let mut rt = Runtime::builder(tickets(2))
        .agent(Agent::new("a").produce(two_tickets(flags.clone(), made.clone())))
        .max_concurrency(1)
        .build()
        .unwrap();
    flags.hang_second.store(true, Ordering::SeqCst);
    let stop = rt.stop_handle();
    let stopper = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(50)).await;
        stop.stop();
    });
    let report = rt.run().await.unwrap();
    stopper.await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Stopped);
    assert_eq!(made.load(Ordering::SeqCst), 1);

    // Turn 2 (same runtime, so the same call cache): ticket:1 is slow, ticket:2 is never
    // reached before the deadline.
    flags.hang_second.store(false, Ordering::SeqCst);
    flags.slow_first.store(true, Ordering::SeqCst);
    let report = rt
        .run_with(Budget::default().deadline(Duration::from_secs(50)))
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, TurnOutcome::DeadlineExceeded | TurnOutcome::Stopped),
        "{:?}",
        report.outcome
    );
    flags.slow_first.store(false, Ordering::SeqCst);
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(
        made.load(Ordering::SeqCst),
        1,
        "ticket:2's answer was dropped by the turn in which it was never reached, and paid again"
    );
}

/// A stop while a run waits after its call answered keeps that answer for the retry.
#[tokio::test(start_paused = true)]
async fn a_stop_while_a_run_runs_keeps_its_answer() {
    let flags = Arc::new(Flags::default());
    let made = Arc::new(AtomicU64::new(0));
    let mut rt = Runtime::builder(tickets(2))
        .agent(Agent::new("a").produce(two_tickets(flags.clone(), made.clone())))
        .build()
        .unwrap();
    flags.hang_second.store(true, Ordering::SeqCst);
    let stop = rt.stop_handle();
    let stopper = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(50)).await;
        stop.stop();
    });
    let report = rt.run().await.unwrap();
    stopper.await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Stopped);
    assert_eq!(rt.context().queued_events(), 2, "nothing committed");
    flags.hang_second.store(false, Ordering::SeqCst);
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(
        made.load(Ordering::SeqCst),
        1,
        "the answer got before the stop is reused"
    );
}

/// A produce that panics after its call answered fails the turn; the retry reuses the answer.
#[tokio::test]
async fn a_panic_after_an_answered_call_is_not_paid_again_on_retry() {
    let flags = Arc::new(Flags::default());
    let made = Arc::new(AtomicU64::new(0));
    let mut rt = Runtime::builder(tickets(2))
        .agent(Agent::new("a").produce(two_tickets(flags.clone(), made.clone())))
        .build()
        .unwrap();
    flags.panic.store(true, Ordering::SeqCst);
    assert!(rt.run().await.is_err(), "the panic fails the turn");
    assert_eq!(made.load(Ordering::SeqCst), 1);
    flags.panic.store(false, Ordering::SeqCst);
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(
        made.load(Ordering::SeqCst),
        1,
        "the answer got before the panic is reused"
    );
}

/// The head exemption (runs of the first event, with every event a run starting there
/// covers, are never refused) has no bound: a debounced produce on deletions of one id, deleted
/// at the batch's first and last events, ties the whole batch into the head, so no run of it
/// is refused and a turn budgeted at 100 tokens spends 2,000 in one generation.
#[tokio::test]
async fn a_debounced_run_spanning_the_batch_does_not_exempt_every_run_from_the_budget() {
    let made = Arc::new(AtomicU64::new(0));
    let mut ctx = Context::new("head");
    ctx.create("ticket:x", Ticket { text: "x".into() }).unwrap();
    let debounced = Produce::new("gone", |call: ProduceCall<Ticket>| async move {
        call.effects
            .upsert(format!("out:{}", call.trigger.id), Out { text: "gone".into() });
        Ok::<(), ProduceError>(())
    })
    .creates::<Out>()
    .on([EventKind::Deleted])
    .debounce();
    let made_in = made.clone();
    let paid = Produce::new("paid", move |call: ProduceCall<Note>| {
        let made = made_in.clone();
        async move {
            let _: String = call
                .record_metered("llm", call.trigger.id.as_str(), || async {
                    made.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(("a".to_owned(), Usage::tokens(80, 20)))
                })
                .await?;
            call.effects
                .upsert(format!("out:{}", call.trigger.id), Out { text: "p".into() });
            Ok::<(), ProduceError>(())
        }
    })
    .creates::<Out>();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(debounced).produce(paid))
        .max_concurrency(1)
        .build()
        .unwrap();
    rt.run().await.unwrap(); // the creation matches nothing
    let ctx = rt.context_mut();
    ctx.delete("ticket:x").unwrap(); // event 0
    for i in 0..20 {
        ctx.create(format!("note:{i}"), Note { text: format!("n{i}") }).unwrap();
        // events 1..=20
    }
    ctx.create("ticket:x", Ticket { text: "x".into() }).unwrap(); // event 21
    ctx.delete("ticket:x").unwrap(); // event 22
    let report = rt.run_with(Budget::default().max_tokens(100)).await.unwrap();
    assert!(
        report.total_usage().total_tokens() <= 200,
        "a turn budgeted at 100 tokens spent {} ({} calls, {} runs, outcome {:?}): the debounced run made the whole batch its head",
        report.total_usage().total_tokens(),
        made.load(Ordering::SeqCst),
        report.runs,
        report.outcome
    );
}

/// A batch whose first event matches no produce: the runs of the next event are refusable,
/// so a spent budget's cut falls at 1 and only the unmatched event is consumed; one turn per
/// process still ends with everything committed (each turn commits at least one event).
#[tokio::test]
async fn an_unmatched_first_event_does_not_starve_one_turn_per_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("unmatched.db");
    {
        let mut ctx = Context::open(&path, "s").unwrap();
        ctx.create(
            "out:first",
            Out {
                text: "no produce".into(),
            },
        )
        .unwrap(); // event 0
        for i in 1..=3 {
            ctx.create(format!("note:{i}"), Note { text: format!("n{i}") }).unwrap();
        }
    }
    let made = Arc::new(AtomicU64::new(0));
    let mut outcomes = Vec::new();
    for _process in 0..10 {
        let made = made.clone();
        let paid = Produce::new("paid", move |call: ProduceCall<Note>| {
            let made = made.clone();
            async move {
                let _: String = call
                    .record_metered("llm", call.trigger.id.as_str(), || async {
                        made.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(("a".to_owned(), Usage::tokens(80, 20)))
                    })
                    .await?;
                call.effects
                    .upsert(format!("out:{}", call.trigger.id), Out { text: "p".into() });
                Ok::<(), ProduceError>(())
            }
        })
        .creates::<Out>();
        let ctx = Context::open(&path, "s").unwrap();
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("a").produce(paid))
            .build()
            .unwrap();
        // A spent budget from the start: only head runs' calls are made.
        let report = rt.run_with(Budget::default().max_tokens(0)).await.unwrap();
        outcomes.push((report.outcome, report.generations, rt.context().queued_events()));
        if rt.context().queued_events() == 0 {
            break;
        }
    }
    let ctx = Context::open(&path, "s").unwrap();
    assert_eq!(ctx.queued_events(), 0, "ten one-turn processes: {outcomes:?}");
    assert!(ctx.get::<Out>("out:note:3").unwrap().is_some());
    assert_eq!(
        made.load(Ordering::SeqCst),
        3,
        "each note's call made once: {outcomes:?}"
    );
}

/// Two writers on one SQLite session: the runtime's generation on `ticket:1` is fenced out
/// by another writer's direct write; it catches up and runs the generation again, with
/// `ticket:1` still queued at the same version. The answer its first attempt got is reused.
#[tokio::test]
async fn a_generation_run_again_after_a_conflict_reuses_its_answers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conflict.db");
    Context::open(&path, "s")
        .unwrap()
        .create("ticket:2", Ticket { text: "t".into() })
        .unwrap();
    let flags = Arc::new(Flags::default());
    let made = Arc::new(AtomicU64::new(0));
    let mut other = Context::open(&path, "s").unwrap();
    let mut rt = Runtime::builder(Context::open(&path, "s").unwrap())
        .agent(Agent::new("a").produce(two_tickets(flags, made.clone())))
        .build()
        .unwrap();
    // The other writer commits first: the runtime's generation is fenced out.
    other.create("note:x", Note { text: "n".into() }).unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.conflicts, 1, "the generation was run again");
    assert!(rt.context().get::<Out>("out:ticket:2").unwrap().is_some());
    assert_eq!(
        made.load(Ordering::SeqCst),
        1,
        "the run again on the same ticket version paid for its call again"
    );
}

/// An attempt that fails before it asks for a call it answered in an earlier attempt (a
/// transient error on the way) drops that answer: the cache hands a run its earlier answers
/// once, and keeps back only the calls that attempt asked for. The third attempt pays again.
#[tokio::test]
async fn an_attempt_that_fails_before_its_call_keeps_the_earlier_answer() {
    let early = Arc::new(AtomicBool::new(false));
    let late = Arc::new(AtomicBool::new(true));
    let made = Arc::new(AtomicU64::new(0));
    let (e, l, m) = (early.clone(), late.clone(), made.clone());
    let produce = Produce::new("flaky", move |call: ProduceCall<Ticket>| {
        let (early, late, made) = (e.clone(), l.clone(), m.clone());
        async move {
            if early.load(Ordering::SeqCst) {
                return Err(ProduceError::msg("a transient error before the call"));
            }
            let _: String = call
                .record_metered("llm", call.trigger.id.as_str(), || async {
                    made.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(("a".to_owned(), Usage::tokens(80, 20)))
                })
                .await?;
            if late.load(Ordering::SeqCst) {
                return Err(ProduceError::msg("a transient error after the call"));
            }
            call.effects
                .upsert(format!("out:{}", call.trigger.id), Out { text: "done".into() });
            Ok::<(), ProduceError>(())
        }
    })
    .creates::<Out>();
    let mut rt = Runtime::builder(tickets(1))
        .agent(Agent::new("a").produce(produce))
        .build()
        .unwrap();
    assert!(rt.run().await.is_err(), "attempt 1 fails after its call");
    assert_eq!(made.load(Ordering::SeqCst), 1);
    early.store(true, Ordering::SeqCst);
    assert!(rt.run().await.is_err(), "attempt 2 fails before its call");
    early.store(false, Ordering::SeqCst);
    late.store(false, Ordering::SeqCst);
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(
        made.load(Ordering::SeqCst),
        1,
        "attempt 2 dropped the answer attempt 1 got, and attempt 3 paid for it again"
    );
}

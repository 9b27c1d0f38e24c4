//! Recorded calls at their edges, from an adversarial review: concurrent calls in one produce,
//! failed and abandoned calls, answers that do not round-trip, extreme usage and budgets, every
//! shape of run record through SQLite, a writer fenced out, budgets smaller than a generation,
//! staleness after an isolated failure, the harness's matching, `Send` futures, replay without
//! resources, `serve` on a spent budget.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;

use common::{tickets, Note, Ticket};
use reactifact_core::audit::{Difference, ReplayError};
use reactifact_core::error::CallError;
use reactifact_core::runtime::{Budget, TurnOutcome, Usage};
use reactifact_core::{Agent, Context, Produce, ProduceCall, ProduceError, Runtime};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A sibling that fails its first run only: the generation is not committed (fail-loud), so
/// the next turn retries every run of it.
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

fn runtime(ctx: Context, produce: Produce, sibling: Option<Agent>) -> Runtime {
    let mut builder = Runtime::builder(ctx).agent(Agent::new("a").produce(produce));
    if let Some(agent) = sibling {
        builder = builder.agent(agent);
    }
    builder.build().unwrap()
}

/// Two branches of one produce, joined: the second `llm` call of each branch is asked for
/// after a first call whose answer time differs (10 s against 1 s, tokio time). Live, the ask
/// order of the `llm` calls is q1, q4, q3; answered from a record (no waiting) it is q1, q3, q4.
fn fan_out(made: Arc<AtomicU64>) -> Produce {
    Produce::new("fan", move |call: ProduceCall<Ticket>| {
        let made = made.clone();
        async move {
            let slow = async {
                let a: String = call
                    .record("llm", "q1", || async {
                        made.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_secs(10)).await;
                        Ok::<_, std::io::Error>("a1".to_owned())
                    })
                    .await?;
                let b: String = call
                    .record("llm", "q3", || async {
                        made.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>("a3".to_owned())
                    })
                    .await?;
                Ok::<String, CallError>(a + &b)
            };
            let fast = async {
                let x: String = call
                    .record("tool", "t", || async {
                        made.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        Ok::<_, std::io::Error>("t".to_owned())
                    })
                    .await?;
                let y: String = call
                    .record("llm", "q4", || async {
                        made.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>("a4".to_owned())
                    })
                    .await?;
                Ok::<String, CallError>(x + &y)
            };
            let (s, f) = tokio::join!(slow, fast);
            let text = s? + &f?;
            call.effects.upsert(format!("note:{}", call.trigger.id), Note { text });
            Ok::<(), ProduceError>(())
        }
    })
    .creates::<Note>()
}

#[tokio::test(start_paused = true)]
async fn concurrent_calls_in_one_produce_replay_whatever_their_answer_times() {
    let made = Arc::new(AtomicU64::new(0));
    let mut rt = runtime(tickets(1), fan_out(made.clone()), None);
    rt.run().await.unwrap();
    assert_eq!(made.load(Ordering::SeqCst), 4);
    // Same produce, same requests, same answers: nothing diverges.
    if let Err(e) = rt.replay().await {
        panic!("a faithful replay diverged: {e}");
    }
}

#[tokio::test(start_paused = true)]
async fn concurrent_calls_in_one_produce_are_reused_by_a_retried_generation() {
    let made = Arc::new(AtomicU64::new(0));
    let mut rt = runtime(tickets(1), fan_out(made.clone()), Some(flaky_once()));
    rt.run().await.unwrap_err();
    assert_eq!(made.load(Ordering::SeqCst), 4);
    rt.run().await.unwrap();
    assert_eq!(
        made.load(Ordering::SeqCst),
        4,
        "the retry reuses the four answers instead of calling again"
    );
}

#[tokio::test]
async fn a_failed_call_before_an_answered_one_does_not_lose_the_answer_on_retry() {
    let primary = Arc::new(AtomicU64::new(0));
    let fallback = Arc::new(AtomicU64::new(0));
    let (p, f) = (primary.clone(), fallback.clone());
    let produce = Produce::new("fallback", move |call: ProduceCall<Ticket>| {
        let (p, f) = (p.clone(), f.clone());
        async move {
            let first: Result<String, CallError> = call
                .record("llm", "big-model", || async {
                    p.fetch_add(1, Ordering::SeqCst);
                    Err::<String, _>(std::io::Error::other("overloaded"))
                })
                .await;
            let text = match first {
                Ok(text) => text,
                Err(_) => {
                    call.record("llm", "small-model", || async {
                        f.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>("small".to_owned())
                    })
                    .await?
                }
            };
            call.effects.upsert(format!("note:{}", call.trigger.id), Note { text });
            Ok::<(), ProduceError>(())
        }
    })
    .creates::<Note>();
    let mut rt = runtime(tickets(1), produce, Some(flaky_once()));
    rt.run().await.unwrap_err();
    rt.run().await.unwrap();
    assert_eq!(
        primary.load(Ordering::SeqCst),
        2,
        "a failure is not reused: called again"
    );
    assert_eq!(
        fallback.load(Ordering::SeqCst),
        1,
        "the fallback's answer was recorded by the first attempt and must be reused"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_abandoned_by_a_timeout_replays_as_abandoned() {
    let produce = Produce::new("patient", |call: ProduceCall<Ticket>| async move {
        let asked = call.record("llm", "q", || async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, std::io::Error>("late".to_owned())
        });
        let text = match tokio::time::timeout(Duration::from_secs(1), asked).await {
            Err(_elapsed) => "timed out".to_owned(),
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => format!("failed: {e}"),
        };
        call.effects.upsert(format!("note:{}", call.trigger.id), Note { text });
    })
    .creates::<Note>();
    let mut rt = runtime(tickets(1), produce, None);
    rt.run().await.unwrap();
    let note: Note = rt.context().get::<Note>("note:ticket:1").unwrap().unwrap().data;
    assert_eq!(note.text, "timed out");
    if let Err(e) = rt.replay().await {
        panic!("the replay of a timed-out call diverged: {e}");
    }
}

/// An answer that encodes as a free string and decodes only as one of a few known labels (a
/// serde enum): it does not round-trip, and serde's error quotes the unknown variant it found.
#[derive(Debug, Clone)]
struct Lopsided(String);

impl Serialize for Lopsided {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Lopsided {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        enum Known {
            Billing,
        }
        Known::deserialize(d).map(|Known::Billing| Lopsided("Billing".into()))
    }
}

const SECRET: &str = "customer-ssn-078-05-1120";

#[tokio::test]
async fn an_answer_that_does_not_round_trip_is_not_written_into_errors_or_the_log() {
    let seen = Arc::new(Mutex::new(String::new()));
    let seen_in = seen.clone();
    let produce = Produce::new("lopsided", move |call: ProduceCall<Ticket>| {
        let seen = seen_in.clone();
        async move {
            let answer: Result<Lopsided, CallError> = call
                .record("crm", "lookup", || async {
                    Ok::<_, std::io::Error>(Lopsided(SECRET.to_owned()))
                })
                .await;
            *seen.lock().unwrap() = format!("{}", answer.unwrap_err());
            call.effects.upsert(
                format!("note:{}", call.trigger.id),
                Note {
                    text: "fallback".into(),
                },
            );
        }
    })
    .creates::<Note>();
    let mut rt = runtime(tickets(1), produce, None);
    rt.run().await.unwrap();
    let shown = seen.lock().unwrap().clone();
    let mut export = Vec::new();
    rt.context().export_audit(&mut export).await.unwrap();
    let export = String::from_utf8(export).unwrap();
    let debug = format!("{:?}", rt.context().log().unwrap());
    let leaks: Vec<&str> = [
        (shown.contains(SECRET), "the CallError's Display"),
        (export.contains(SECRET), "the audit export"),
        (debug.contains(SECRET), "the log's Debug (RecordedCall)"),
    ]
    .into_iter()
    .filter_map(|(leaked, place)| leaked.then_some(place))
    .collect();
    assert!(leaks.is_empty(), "the answer shows in {leaks:?}: {shown}");
}

#[tokio::test]
async fn a_replay_miss_of_an_undecodable_answer_does_not_show_the_answer() {
    let live = Produce::new("ask", |call: ProduceCall<Ticket>| async move {
        let _: String = call
            .record("crm", "lookup", || async { Ok::<_, std::io::Error>(SECRET.to_owned()) })
            .await?;
        Ok::<(), ProduceError>(())
    });
    let mut rt = runtime(tickets(1), live, None);
    rt.run().await.unwrap();
    // The answer type changed to an enum of known labels: the replay diverges, naming the
    // call — but the recorded answer must not appear in the divergence.
    #[derive(Serialize, Deserialize)]
    enum Label {
        Billing,
    }
    let changed = Produce::new("ask", |call: ProduceCall<Ticket>| async move {
        let _: Label = call
            .record("crm", "lookup", || async { Ok::<_, std::io::Error>(Label::Billing) })
            .await?;
        Ok::<(), ProduceError>(())
    });
    let err = rt
        .context()
        .replay(&[Agent::new("a").produce(changed)])
        .await
        .unwrap_err();
    assert!(matches!(&err, ReplayError::Diverged(d) if matches!(d.difference, Difference::Call(_))));
    let shown = err.to_string();
    assert!(!shown.contains(SECRET), "the divergence shows the answer: {shown}");
}

#[tokio::test]
async fn a_produce_gets_the_same_call_error_live_and_in_replay() {
    let produce = Produce::new("kind", |call: ProduceCall<Ticket>| async move {
        let answer: Result<Lopsided, CallError> = call
            .record("crm", "lookup", || async {
                Ok::<_, std::io::Error>(Lopsided("x".into()))
            })
            .await;
        let text = match answer {
            Ok(_) => "ok",
            Err(CallError::Answer { .. }) => "unrecordable answer",
            Err(CallError::Failed { .. }) => "call failed",
            Err(_) => "other",
        };
        call.effects
            .upsert(format!("note:{}", call.trigger.id), Note { text: text.into() });
    })
    .creates::<Note>();
    let mut rt = runtime(tickets(1), produce, None);
    rt.run().await.unwrap();
    if let Err(e) = rt.replay().await {
        panic!("live and replay return different CallError variants: {e}");
    }
}

#[tokio::test]
async fn extreme_usage_and_budgets_do_not_panic() {
    let produce = Produce::new("greedy", |call: ProduceCall<Ticket>| async move {
        for i in 0..3u32 {
            let _: u32 = call
                .record_metered("llm", &i, || async {
                    Ok::<_, std::io::Error>((1u32, Usage::tokens(u64::MAX, u64::MAX).with_cost(u64::MAX)))
                })
                .await?;
        }
        Ok::<(), ProduceError>(())
    });
    for budget in [
        Budget::default(),
        Budget::default().max_tokens(u64::MAX).max_cost(u64::MAX),
        Budget::default().max_tokens(0),
        Budget::default().max_cost(0),
    ] {
        let mut rt = runtime(tickets(2), produce.clone(), None);
        let report = rt.run_with(budget).await.unwrap();
        assert!(
            matches!(
                report.outcome,
                TurnOutcome::Completed | TurnOutcome::TokensExhausted | TurnOutcome::CostExhausted
            ),
            "{:?}",
            report.outcome
        );
        let _ = report.total_usage();
    }
}

/// Runs on one trigger that cover the codec's positional cases: no reads and no calls, reads
/// only, calls only (an answered one, a failed one, a unit answer), both, and a watching run.
fn codec_agents() -> Agent {
    let note = |name: &'static str, read: bool, calls: bool, stale: bool| {
        let produce = Produce::new(name, move |call: ProduceCall<Ticket>| async move {
            if read {
                let _ = call.snapshot.get::<Ticket>("ticket:absent");
                let _ = call.snapshot.get::<Ticket>(call.trigger.id.as_str());
            }
            if calls {
                let _: String = call
                    .record("llm", "q", || async { Ok::<_, std::io::Error>("a".to_owned()) })
                    .await?;
                let _ = call
                    .record("llm", "q2", || async {
                        Err::<String, _>(std::io::Error::other("down"))
                    })
                    .await;
                let () = call
                    .record_metered("unit", &(), || async {
                        Ok::<_, std::io::Error>(((), Usage::tokens(u64::MAX, 1).with_cost(u64::MAX)))
                    })
                    .await?;
                let _ = call.now();
                let _ = call.rng().u64(..);
            }
            call.effects
                .upsert(format!("note:{name}:{}", call.trigger.id), Note { text: name.into() });
            Ok::<(), ProduceError>(())
        })
        .creates::<Note>();
        match stale {
            true => produce.stale(),
            false => produce,
        }
    };
    Agent::new("codec")
        .produce(note("plain", false, false, false))
        .produce(note("reads", true, false, false))
        .produce(note("calls", false, true, false))
        .produce(note("both", true, true, false))
        .produce(note("watching", true, true, true))
        .produce(note("watching_calls_only", false, true, true))
}

#[tokio::test]
async fn every_shape_of_run_survives_a_sqlite_reopen_with_its_hash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("codec.db");
    let (head, log) = {
        let mut ctx = Context::open(&path, "codec").unwrap();
        ctx.create("ticket:1", Ticket { text: "x".into() }).unwrap();
        let mut rt = Runtime::builder(ctx).agent(codec_agents()).build().unwrap();
        rt.run().await.unwrap();
        (rt.context().head(), format!("{:?}", rt.context().log().unwrap()))
    };
    let ctx = Context::open(&path, "codec").unwrap();
    assert_eq!(ctx.head(), head);
    ctx.verify().unwrap();
    assert_eq!(format!("{:?}", ctx.log().unwrap()), log);
    let calls: usize = ctx
        .log()
        .unwrap()
        .iter()
        .flat_map(|c| &c.runs)
        .map(|r| r.calls.len())
        .sum();
    assert_eq!(calls, 4 * 5, "four runs with five calls each");
    ctx.replay(&[codec_agents()]).await.unwrap();
}

#[tokio::test]
async fn a_generation_fenced_out_by_another_writer_reuses_its_answers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.db");
    Context::open(&path, "race")
        .unwrap()
        .create("ticket:1", Ticket { text: "x".into() })
        .unwrap();
    let made = Arc::new(AtomicU64::new(0));
    let counted = made.clone();
    let produce = Produce::new("ask", move |call: ProduceCall<Ticket>| {
        let made = counted.clone();
        async move {
            let text: String = call
                .record("llm", &call.trigger.data.text, || async {
                    made.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>("a".to_owned())
                })
                .await?;
            call.effects.upsert(format!("note:{}", call.trigger.id), Note { text });
            Ok::<(), ProduceError>(())
        }
    })
    .creates::<Note>();
    let mut other = Context::open(&path, "race").unwrap();
    let mut rt = runtime(Context::open(&path, "race").unwrap(), produce, None);
    // Another writer commits first (a write no produce reacts to): the runtime's generation is
    // fenced out, it reads the other's commit and runs the generation again.
    other.create("note:unrelated", Note { text: "n".into() }).unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.conflicts, 1);
    assert_eq!(made.load(Ordering::SeqCst), 1, "the rerun reused the answer");
    rt.replay().await.unwrap();
}

/// A metered produce: one call of 100 tokens per run.
fn metered(made: Arc<AtomicU64>) -> Produce {
    Produce::new("metered", move |call: ProduceCall<Ticket>| {
        let made = made.clone();
        async move {
            let _: String = call
                .record_metered("llm", &call.trigger.data.text, || async {
                    made.fetch_add(1, Ordering::SeqCst);
                    // The model answers over the network: the call is pending a while.
                    tokio::task::yield_now().await;
                    Ok::<_, std::io::Error>(("a".to_owned(), Usage::tokens(80, 20)))
                })
                .await?;
            Ok::<(), ProduceError>(())
        }
    })
}

#[tokio::test]
async fn a_turn_that_spends_past_its_token_budget_does_not_report_completed() {
    let made = Arc::new(AtomicU64::new(0));
    // The default concurrency: the five runs of one generation call at once.
    let mut rt = runtime(tickets(5), metered(made.clone()), None);
    let report = rt.run_with(Budget::default().max_tokens(250)).await.unwrap();
    let spent = report.total_usage().total_tokens();
    eprintln!(
        "outcome {:?}, spent {spent}, calls {}",
        report.outcome,
        made.load(Ordering::SeqCst)
    );
    assert!(
        spent <= 250 || report.outcome == TurnOutcome::TokensExhausted,
        "the turn spent {spent} tokens of a 250 budget and ended {:?}",
        report.outcome
    );
}

#[tokio::test]
async fn the_harness_runs_a_produce_only_when_the_runtime_would() {
    let produce = Produce::new("never", |call: ProduceCall<Ticket>| async move {
        call.effects
            .upsert(format!("note:{}", call.trigger.id), Note { text: "ran".into() });
    })
    .creates::<Note>()
    .when(|_snapshot, _ticket: &reactifact_core::Record<Ticket>| false);
    // The runtime does not run it: its condition does not hold.
    let mut rt = runtime(tickets(1), produce.clone(), None);
    rt.run().await.unwrap();
    assert!(rt.context().get::<Note>("note:ticket:1").unwrap().is_none());
    // The harness, on the same trigger, should not either (or should say it would not).
    let effects = reactifact_core::testing::ProduceTest::new(produce)
        .trigger("ticket:1", Ticket { text: "t1".into() })
        .run()
        .await
        .unwrap();
    assert!(
        effects.ops().is_empty(),
        "the harness ran a produce whose condition does not hold: {:?}",
        effects.ops()
    );
}

#[tokio::test(start_paused = true)]
async fn deletion_and_staleness_runs_that_record_calls_replay() {
    // On a ticket's deletion: asks the model, reads the clock and the dice.
    let farewell = Produce::new("farewell", |call: ProduceCall<Ticket>| async move {
        let text: String = call
            .record("llm", &call.trigger.data.text, || async {
                Ok::<_, std::io::Error>("bye".to_owned())
            })
            .await?;
        let at = call.now();
        let dice = call.rng().u8(1..=6);
        call.effects.upsert(
            format!("farewell:{}", call.trigger.id),
            Note {
                text: format!("{text} {at:?} {dice}"),
            },
        );
        Ok::<(), ProduceError>(())
    })
    .creates::<Note>()
    .on([reactifact_core::audit::EventKind::Deleted]);
    // On a ticket, and again when the note it read changes (staleness): the same.
    let watcher = Produce::new("watcher", |call: ProduceCall<Ticket>| async move {
        let config = call
            .snapshot
            .get::<Note>("config")
            .ok()
            .flatten()
            .map(|n| n.data.text)
            .unwrap_or_default();
        let text: String = call
            .record("llm", &config, || async {
                Ok::<_, std::io::Error>(format!("seen {config}"))
            })
            .await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let at = call.now();
        call.effects.upsert(
            format!("watch:{}", call.trigger.id),
            Note {
                text: format!("{text} {at:?} {}", call.rng().u64(..)),
            },
        );
        Ok::<(), ProduceError>(())
    })
    .creates::<Note>()
    .stale();
    let agents = || vec![Agent::new("a").produce(farewell.clone()).produce(watcher.clone())];
    let mut ctx = tickets(1);
    ctx.create("config", Note { text: "v1".into() }).unwrap();
    let mut builder = Runtime::builder(ctx);
    for agent in agents() {
        builder = builder.agent(agent);
    }
    let mut rt = builder.build().unwrap();
    rt.run().await.unwrap();
    rt.context_mut().update("config", Note { text: "v2".into() }).unwrap();
    rt.run().await.unwrap();
    rt.context_mut().delete("ticket:1").unwrap();
    rt.run().await.unwrap();
    let log = rt.context().log().unwrap();
    let runs: Vec<(String, usize)> = log
        .iter()
        .flat_map(|c| &c.runs)
        .filter_map(|r| r.produce.as_ref().map(|p| (p.to_string(), r.calls.len())))
        .collect();
    assert_eq!(
        runs,
        [
            ("watcher".to_owned(), 3),
            ("watcher".to_owned(), 3),
            ("farewell".to_owned(), 3)
        ],
        "the first run, the stale rerun, the deletion"
    );
    if let Err(e) = rt.context().replay(&agents()).await {
        panic!("{e}");
    }
}

/// Seconds between the first and the last write of a watching produce: it runs on `config`
/// "good", then on `middle` (which fails, isolated, when it is "bad"), then an hour later on
/// "fixed" — each a staleness run on the same trigger version.
async fn staleness_clock(middle: &'static str) -> u64 {
    // Reads `config`; fails when it says "bad"; writes the time it read.
    let watcher = Produce::new("watcher", |call: ProduceCall<Ticket>| async move {
        let config = call
            .snapshot
            .get::<Note>("config")
            .ok()
            .flatten()
            .map(|n| n.data.text)
            .unwrap_or_default();
        let at = call.now();
        if config == "bad" {
            return Err(ProduceError::msg("bad config"));
        }
        let secs = at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        call.effects
            .upsert(format!("watch:{}", call.trigger.id), Note { text: secs.to_string() });
        Ok(())
    })
    .creates::<Note>()
    .stale();
    let mut ctx = tickets(1);
    ctx.create("config", Note { text: "good".into() }).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(watcher))
        .produce_errors(reactifact_core::runtime::ProduceErrors::Isolate)
        .build()
        .unwrap();
    rt.run().await.unwrap();
    rt.context_mut().update("config", Note { text: middle.into() }).unwrap();
    rt.run().await.unwrap();
    tokio::time::advance(Duration::from_secs(3600)).await;
    rt.context_mut()
        .update("config", Note { text: "fixed".into() })
        .unwrap();
    rt.run().await.unwrap();
    let secs: Vec<u64> = rt
        .context()
        .log()
        .unwrap()
        .iter()
        .flat_map(|c| &c.runs)
        .filter(|r| r.produce.is_some())
        .flat_map(|r| &r.ops)
        .filter_map(|op| match op {
            reactifact_core::audit::Op::Put { bytes, .. } => rmp_serde::from_slice::<Note>(bytes).ok(),
            _ => None,
        })
        .map(|note| note.text.parse().unwrap())
        .collect();
    secs[secs.len() - 1] - secs[0]
}

#[tokio::test(start_paused = true)]
async fn a_later_staleness_run_does_not_get_the_clock_of_an_isolated_failed_one() {
    assert!(staleness_clock("fine").await >= 3600, "control: the clock moves");
    let apart = staleness_clock("bad").await;
    assert!(
        apart >= 3600,
        "the run an hour later read the clock of the isolated failed run: {apart} s apart"
    );
}

#[tokio::test]
async fn a_budget_smaller_than_a_generation_makes_progress_across_process_restarts() {
    // A job that runs one budgeted turn per process start (a cron job, a CLI invocation) on a
    // SQLite file: five tickets of 100 tokens each, 250 tokens a turn.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("budget.db");
    {
        let mut ctx = Context::open(&path, "budget").unwrap();
        for i in 1..=5 {
            ctx.create(format!("ticket:{i}"), Ticket { text: format!("t{i}") })
                .unwrap();
        }
    }
    let made = Arc::new(AtomicU64::new(0));
    let mut outcomes = Vec::new();
    for _process in 0..4 {
        let ctx = Context::open(&path, "budget").unwrap();
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("a").produce(metered(made.clone())))
            .max_concurrency(1)
            .build()
            .unwrap();
        let report = rt.run_with(Budget::default().max_tokens(250)).await.unwrap();
        outcomes.push(report.outcome);
        if report.outcome == TurnOutcome::Completed {
            break;
        }
    }
    let ctx = Context::open(&path, "budget").unwrap();
    assert_eq!(
        ctx.queued_events(),
        0,
        "after {} turns ({outcomes:?}) and {} paid calls for 5 tickets, nothing was committed",
        outcomes.len(),
        made.load(Ordering::SeqCst)
    );
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::test]
async fn the_new_public_futures_are_send() {
    let produce = Produce::new("p", |call: ProduceCall<Ticket>| async move {
        let asked = call.record("x", "q", || async { Ok::<_, std::io::Error>(1u8) });
        assert_send(&asked);
        let metered = call.record_metered("y", "q", || async { Ok::<_, std::io::Error>((1u8, Usage::ZERO)) });
        assert_send(&metered);
        let _ = (asked.await, metered.await);
    });
    let test = reactifact_core::testing::ProduceTest::new(produce.clone())
        .trigger("ticket:1", Ticket { text: "t".into() })
        .run();
    assert_send(&test);
    test.await.unwrap();
    let ctx = tickets(1);
    let agents = [Agent::new("a").produce(produce)];
    let resources = reactifact_core::runtime::Resources::new();
    let replay = ctx.replay_with(&agents, &resources);
    assert_send(&replay);
    replay.await.unwrap();
    let asserted = reactifact_core::testing::assert_replays_with(&ctx, &agents, &resources);
    assert_send(&asserted);
    asserted.await;
}

struct ModelClient;

#[tokio::test]
async fn a_replay_without_the_resources_a_produce_declares_is_refused_naming_them() {
    let produce = Produce::new("uses", |call: ProduceCall<Ticket>| async move {
        let _client: &ModelClient = call.resource::<ModelClient>();
        let _: u8 = call.record("x", "q", || async { Ok::<_, std::io::Error>(1u8) }).await?;
        Ok::<(), ProduceError>(())
    })
    .uses::<ModelClient>();
    let agents = || [Agent::new("a").produce(produce.clone())];
    let mut rt = Runtime::builder(tickets(1))
        .resource(ModelClient)
        .agent(agents()[0].clone())
        .build()
        .unwrap();
    rt.run().await.unwrap();
    // `Context::replay` gives no resources: the produce's declared `uses` is known up front.
    let err = rt.context().replay(&agents()).await.unwrap_err();
    // It shows as "the run recorded this call and the replay did not ask for it": the
    // NotAsked miss hides the run's failure (a panic naming the resource).
    let shown = err.to_string();
    assert!(
        shown.contains("ModelClient"),
        "the divergence does not name the missing resource: {shown}"
    );
}

#[tokio::test(start_paused = true)]
async fn serve_with_a_spent_budget_neither_spins_nor_forgets_its_work() {
    let made = Arc::new(AtomicU64::new(0));
    let mut rt = Runtime::builder(tickets(3))
        .agent(Agent::new("a").produce(metered(made.clone())))
        .max_concurrency(1)
        .budget(Budget::default().max_tokens(150))
        .build()
        .unwrap();
    let stop = rt.stop_handle();
    let serving = tokio::spawn(async move {
        let report = rt.serve(Duration::from_secs(1)).await.unwrap();
        (rt, report)
    });
    tokio::time::sleep(Duration::from_secs(60)).await;
    stop.stop();
    let (rt, report) = serving.await.unwrap();
    assert!(report.turns <= 62, "serve spun: {} turns in 60 s", report.turns);
    assert_eq!(
        rt.context().queued_events(),
        0,
        "the budgeted work got done, a turn at a time"
    );
    assert_eq!(made.load(Ordering::SeqCst), 3, "each answer paid once");
}

/// A request that is `Send` but not `Sync` is only hashed before the call's await, so the
/// produce's future stays `Send` (this fails to compile otherwise).
#[test]
fn a_request_that_is_not_sync_keeps_the_produce_future_send() {
    let _ = Produce::new("p", |call: ProduceCall<Ticket>| async move {
        let request = std::cell::RefCell::new(vec![1u8]);
        let _: u8 = call
            .record("x", &request, || async { Ok::<_, std::io::Error>(1u8) })
            .await?;
        Ok::<(), ProduceError>(())
    });
}

/// What a produce asks a model: owned, and not `Copy`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Ask {
    prompt: String,
}

/// The natural `move` closure: the request is handed to it once recorded (it could not borrow
/// a request it also moves). The closure gets exactly the request that was recorded, a retried
/// generation reuses the answer without calling again, and the metered form takes it too.
#[tokio::test]
async fn a_move_closure_is_handed_the_request_it_owns() {
    let made = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(Mutex::new(Vec::<Ask>::new()));
    let (m, s) = (made.clone(), seen.clone());
    let produce = Produce::new("ask", move |call: ProduceCall<Ticket>| {
        let (m, s) = (m.clone(), s.clone());
        async move {
            let request = Ask {
                prompt: call.trigger.data.text.clone(),
            };
            let text: String = call
                .record("llm", request, move |request: Ask| async move {
                    m.fetch_add(1, Ordering::SeqCst);
                    let answer = format!("re: {}", request.prompt);
                    s.lock().unwrap().push(request);
                    Ok::<_, std::io::Error>(answer)
                })
                .await?;
            let metered = Ask { prompt: text.clone() };
            let _: u32 = call
                .record_metered("count", metered, move |request: Ask| async move {
                    Ok::<_, std::io::Error>((request.prompt.len() as u32, Usage::tokens(1, 1)))
                })
                .await?;
            call.effects.upsert(format!("note:{}", call.trigger.id), Note { text });
            Ok::<(), ProduceError>(())
        }
    })
    .creates::<Note>();
    let mut rt = runtime(tickets(1), produce, Some(flaky_once()));
    rt.run().await.unwrap_err();
    rt.run().await.unwrap();
    assert_eq!(made.load(Ordering::SeqCst), 1, "the retry reused the recorded answer");
    assert_eq!(
        *seen.lock().unwrap(),
        [Ask { prompt: "t1".into() }],
        "the closure was handed the request it recorded"
    );
    let note = rt
        .context()
        .get::<Note>("note:ticket:1")
        .unwrap()
        .expect("the note was written");
    assert_eq!(note.data.text, "re: t1");
}

//! Budgets and the call cache at their edges, from a second adversarial review: one turn per
//! process makes progress behind priorities and straddling runs, a budgeted workload ends as an
//! unbudgeted one, an id created again does not get an earlier run's answers, unrecordable and
//! abandoned outcomes are stored, unmetered calls run on a spent budget, a retried request is
//! not paid again, the harness skips an incomplete join, two runs sharing a key keep both.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

mod common;

use common::{Note, Out, Ticket};
use reactifact_core::runtime::{Budget, ProduceErrors, TurnOutcome, Usage};
use reactifact_core::{Agent, Artifact, Context, Produce, ProduceCall, ProduceError, Runtime};
use serde::{Deserialize, Serialize};

/// One metered call of 100 tokens, then `out:{name}:{trigger}` written.
fn metered<T: Artifact + Send + Sync + 'static>(name: &'static str, made: Arc<AtomicU64>) -> Produce {
    Produce::new(name, move |call: ProduceCall<T>| {
        let made = made.clone();
        async move {
            let answer: String = call
                .record_metered("llm", call.trigger.id.as_str(), || async {
                    made.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    Ok::<_, std::io::Error>(("a".to_owned(), Usage::tokens(80, 20)))
                })
                .await?;
            call.effects
                .upsert(format!("out:{name}:{}", call.trigger.id), Out { text: answer });
            Ok::<(), ProduceError>(())
        }
    })
    .creates::<Out>()
}

/// docs/agents.md (Usage budgets): "So every turn makes progress, even one per process".
/// A higher-priority agent's run on a later event is executed first and spends the budget;
/// the lower-priority run on the first event is refused, so the cut is 0 and nothing
/// commits. A fresh process (no call cache) does the same again: no turn ever progresses.
#[tokio::test]
async fn a_higher_priority_run_on_a_later_event_does_not_starve_one_turn_per_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("prio.db");
    {
        let mut ctx = Context::open(&path, "prio").unwrap();
        ctx.create("ticket:1", Ticket { text: "t".into() }).unwrap(); // event 0: low priority
        ctx.create("note:1", Note { text: "n".into() }).unwrap(); // event 1: high priority
    }
    let made = Arc::new(AtomicU64::new(0));
    let mut outcomes = Vec::new();
    for _process in 0..4 {
        let ctx = Context::open(&path, "prio").unwrap();
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("low").produce(metered::<Ticket>("low", made.clone())))
            .agent(
                Agent::new("high")
                    .priority(10)
                    .produce(metered::<Note>("high", made.clone())),
            )
            .max_concurrency(1)
            .build()
            .unwrap();
        // Two runs of 100 tokens each; 100 a turn: one paid call per turn.
        let report = rt.run_with(Budget::default().max_tokens(100)).await.unwrap();
        outcomes.push((report.outcome, report.generations));
        if report.outcome == TurnOutcome::Completed {
            break;
        }
    }
    let ctx = Context::open(&path, "prio").unwrap();
    assert_eq!(
        ctx.queued_events(),
        0,
        "four one-turn processes ({outcomes:?}) paid {} calls for two runs and committed nothing",
        made.load(Ordering::SeqCst)
    );
}

/// The same starvation without priorities: a watching run scheduled on event 0 (a staleness
/// rerun) is replaced by its trigger's update at event 2, so it covers events 0..=2; the
/// plain run of event 1 is refused, the cut falls back to 0 and nothing commits, every
/// process.
#[tokio::test]
async fn a_watching_run_that_straddles_the_refused_event_does_not_starve_one_turn_per_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("straddle.db");
    let made = Arc::new(AtomicU64::new(0));
    let watcher = |made: Arc<AtomicU64>| {
        Produce::new("watch", move |call: ProduceCall<Ticket>| {
            let made = made.clone();
            async move {
                let config = call.snapshot.get::<Note>("note:config").ok().flatten();
                let _: String = call
                    .record_metered("llm", &config.map(|c| c.data.text), || async {
                        made.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(("a".to_owned(), Usage::tokens(80, 20)))
                    })
                    .await?;
                call.effects
                    .upsert(format!("out:watch:{}", call.trigger.id), Out { text: "w".into() });
                Ok::<(), ProduceError>(())
            }
        })
        .creates::<Out>()
        .stale()
    };
    let agents = |made: &Arc<AtomicU64>| {
        Agent::new("a")
            .produce(watcher(made.clone()))
            .produce(metered::<Note>("plain", made.clone()))
    };
    {
        let mut ctx = Context::open(&path, "straddle").unwrap();
        ctx.create("ticket:1", Ticket { text: "t".into() }).unwrap();
        ctx.create("note:config", Note { text: "v1".into() }).unwrap();
        // Settle: the watcher runs once and reads the config; `plain` runs on note:config.
        let mut rt = Runtime::builder(ctx).agent(agents(&made)).build().unwrap();
        assert_eq!(rt.run().await.unwrap().outcome, TurnOutcome::Completed);
        let ctx = rt.context_mut();
        ctx.update("note:config", Note { text: "v2".into() }).unwrap(); // event 0: stale + plain
        ctx.create("note:2", Note { text: "n".into() }).unwrap(); // event 1: plain
        ctx.update("ticket:1", Ticket { text: "t2".into() }).unwrap(); // event 2: watcher
    }
    made.store(0, Ordering::SeqCst);
    let mut outcomes = Vec::new();
    for _process in 0..6 {
        let ctx = Context::open(&path, "straddle").unwrap();
        let mut rt = Runtime::builder(ctx)
            .agent(agents(&made))
            .max_concurrency(1)
            .build()
            .unwrap();
        let report = rt.run_with(Budget::default().max_tokens(200)).await.unwrap();
        outcomes.push((report.outcome, report.generations));
        if report.outcome == TurnOutcome::Completed {
            break;
        }
    }
    let ctx = Context::open(&path, "straddle").unwrap();
    assert_eq!(
        ctx.queued_events(),
        0,
        "six one-turn processes ({outcomes:?}) paid {} calls and left work queued",
        made.load(Ordering::SeqCst)
    );
}

/// The state a workload ends in, and the calls it paid: with a token budget per turn (run
/// until a turn completes) or without one.
async fn workload(budget: Option<u64>, isolate: bool, max_runs: Option<u64>) -> (BTreeMap<String, String>, u64) {
    let made = Arc::new(AtomicU64::new(0));
    let failing = Produce::new("failing", |call: ProduceCall<Ticket>| async move {
        let _: String = call
            .record_metered("llm", call.trigger.id.as_str(), || async {
                Ok::<_, std::io::Error>(("a".to_owned(), Usage::tokens(10, 0)))
            })
            .await?;
        if call.trigger.data.text == "bad" {
            return Err(ProduceError::msg("bad ticket"));
        }
        Ok(())
    });
    let mut ctx = Context::new("w");
    for i in 0..6 {
        let text = if i == 3 { "bad" } else { "ok" };
        ctx.create(format!("ticket:{i}"), Ticket { text: text.into() }).unwrap();
        ctx.create(format!("note:{i}"), Note { text: "n".into() }).unwrap();
    }
    let mut builder = Runtime::builder(ctx)
        .agent(Agent::new("low").produce(metered::<Ticket>("low", made.clone())))
        .agent(
            Agent::new("high")
                .priority(5)
                .produce(metered::<Note>("high", made.clone())),
        );
    if isolate {
        builder = builder
            .agent(Agent::new("fails").produce(failing))
            .produce_errors(ProduceErrors::Isolate);
    }
    let mut rt = builder.max_concurrency(1).build().unwrap();
    let mut outcomes = Vec::new();
    for _turn in 0..100 {
        let mut limits = Budget::default();
        if let Some(tokens) = budget {
            limits = limits.max_tokens(tokens);
        }
        if let Some(runs) = max_runs {
            limits = limits.max_runs(runs);
        }
        let report = rt.run_with(limits).await.unwrap();
        outcomes.push((report.outcome, report.generations, report.runs));
        if report.outcome == TurnOutcome::Completed {
            break;
        }
    }
    outcomes.truncate(8);
    assert_eq!(
        rt.context().queued_events(),
        0,
        "tokens {budget:?}, max_runs {max_runs:?}, isolate {isolate}: {outcomes:?}"
    );
    let state = rt
        .context()
        .list::<Out>()
        .map(|r| r.unwrap())
        .map(|r| (r.id.to_string(), r.data.text.clone()))
        .collect();
    (state, made.load(Ordering::SeqCst))
}

/// Control for the cut: the same workload with and without a budget ends in the same state,
/// each call paid once (in one process, where the call cache lives).
#[tokio::test]
async fn a_budgeted_workload_ends_as_the_unbudgeted_one() {
    for isolate in [false, true] {
        let free = workload(None, isolate, None).await;
        for tokens in [1, 100, 150, 250] {
            for runs in [None, Some(2), Some(3)] {
                let budgeted = workload(Some(tokens), isolate, runs).await;
                assert_eq!(budgeted, free, "budget {tokens}, max_runs {runs:?}, isolate {isolate}");
            }
        }
    }
}

/// The call cache's key is (produce, trigger id, version, content hash, event kind): a run
/// refused by the budget on `ticket:1` keeps its clock reading; the ticket is deleted and
/// created again with the same content (version 1 again) an hour later, and the run on the
/// new ticket — another event, another run — reads the first ticket's clock.
#[tokio::test(start_paused = true)]
async fn a_recreated_trigger_does_not_get_the_clock_of_an_earlier_refused_run() {
    let stamp = Produce::new("stamp", |call: ProduceCall<Ticket>| async move {
        let at = call.now();
        let _: String = call
            .record_metered("llm", "q", || async {
                Ok::<_, std::io::Error>(("a".to_owned(), Usage::tokens(1, 0)))
            })
            .await?;
        let secs = at.duration_since(UNIX_EPOCH).unwrap().as_secs();
        call.effects
            .upsert(format!("out:{}", call.trigger.id), Out { text: secs.to_string() });
        Ok::<(), ProduceError>(())
    })
    .creates::<Out>();
    let mut ctx = Context::new("clock");
    ctx.create("ticket:1", Ticket { text: "same".into() }).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(stamp))
        .build()
        .unwrap();
    let report = rt.run_with(Budget::default().max_tokens(0)).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::TokensExhausted);
    let first = std::time::SystemTime::now();
    tokio::time::advance(Duration::from_secs(3600)).await;
    rt.context_mut().delete("ticket:1").unwrap();
    rt.context_mut()
        .create("ticket:1", Ticket { text: "same".into() })
        .unwrap();
    rt.run().await.unwrap();
    let written: u64 = rt
        .context()
        .get::<Out>("out:ticket:1")
        .unwrap()
        .unwrap()
        .data
        .text
        .parse()
        .unwrap();
    let first = first.duration_since(UNIX_EPOCH).unwrap().as_secs();
    assert!(
        written + 5 >= first + 3600,
        "the run on the re-created ticket stamped {written}, the refused run's clock ({first}), not its own"
    );
}

/// An answer that encodes as a string and decodes only as a known label: unrecordable.
#[derive(Debug, Clone)]
struct Lopsided;

impl Serialize for Lopsided {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("free text")
    }
}

impl<'de> Deserialize<'de> for Lopsided {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        enum Known {
            Billing,
        }
        Known::deserialize(d).map(|Known::Billing| Lopsided)
    }
}

fn odd_calls() -> Agent {
    Agent::new("a").produce(
        Produce::new("odd", |call: ProduceCall<Ticket>| async move {
            let unrecordable = call
                .record("crm", "lookup", || async { Ok::<_, std::io::Error>(Lopsided) })
                .await
                .is_err();
            let asked = call.record("llm", "q", || async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok::<_, std::io::Error>("late".to_owned())
            });
            let abandoned = tokio::time::timeout(Duration::from_secs(1), asked).await.is_err();
            call.effects.upsert(
                "out:1",
                Out {
                    text: format!("{unrecordable} {abandoned}"),
                },
            );
        })
        .creates::<Out>(),
    )
}

/// Unrecordable and abandoned outcomes through SQLite: same head, same log, verify and replay.
#[tokio::test(start_paused = true)]
async fn unrecordable_and_abandoned_calls_survive_a_sqlite_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.db");
    let (head, log) = {
        let mut ctx = Context::open(&path, "odd").unwrap();
        ctx.create("ticket:1", Ticket { text: "t".into() }).unwrap();
        let mut rt = Runtime::builder(ctx).agent(odd_calls()).build().unwrap();
        rt.run().await.unwrap();
        assert_eq!(
            rt.context().get::<Out>("out:1").unwrap().unwrap().data.text,
            "true true"
        );
        (rt.context().head(), format!("{:?}", rt.context().log().unwrap()))
    };
    let ctx = Context::open(&path, "odd").unwrap();
    assert_eq!(ctx.head(), head);
    ctx.verify().unwrap();
    let reopened = format!("{:?}", ctx.log().unwrap());
    assert_eq!(reopened, log);
    assert!(
        reopened.contains("Unrecordable") && reopened.contains("Abandoned"),
        "{reopened}"
    );
    ctx.replay(&[odd_calls()]).await.unwrap();
}

/// docs/agents.md (Usage budgets): "A metered call is made only while the turn has spent
/// less than the limit ... A limit of 0 allows no metered call." A plain `record` (reference
/// data over HTTP, reporting no usage) is not metered, yet a spent budget refuses it too.
#[tokio::test]
async fn a_spent_token_budget_does_not_refuse_an_unmetered_call() {
    let lookup = Produce::new("lookup", |call: ProduceCall<Ticket>| async move {
        let text: String = call
            .record("crm", "customer", || async {
                Ok::<_, std::io::Error>("vip".to_owned())
            })
            .await?;
        call.effects.upsert("out:1", Out { text });
        Ok::<(), ProduceError>(())
    })
    .creates::<Out>();
    let mut ctx = Context::new("unmetered");
    ctx.create("ticket:1", Ticket { text: "t".into() }).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(lookup))
        .build()
        .unwrap();
    let report = rt.run_with(Budget::default().max_tokens(0)).await.unwrap();
    assert!(
        rt.context().get::<Out>("out:1").unwrap().is_some(),
        "an unmetered call was refused by the token budget (turn ended {:?})",
        report.outcome
    );
}

/// A produce that retries a failed call with the same request (the usual retry loop) got
/// [Failed, Answered]; its generation fails for another run's sake. The rerun matches its
/// first ask with the failed call, which is not reused, so it calls — and pays — again,
/// though the answer it needs is in the cache (and is then dropped).
#[tokio::test]
async fn a_retried_request_that_failed_then_answered_is_not_paid_again_by_the_rerun() {
    let made = Arc::new(AtomicU64::new(0));
    let counted = made.clone();
    let retrying = Produce::new("retrying", move |call: ProduceCall<Ticket>| {
        let made = counted.clone();
        async move {
            let mut last = None;
            for _attempt in 0..3 {
                let made = made.clone();
                match call
                    .record("llm", "q", || async move {
                        match made.fetch_add(1, Ordering::SeqCst) {
                            0 => Err(std::io::Error::other("503")),
                            _ => Ok::<_, std::io::Error>("a".to_owned()),
                        }
                    })
                    .await
                {
                    Ok(text) => {
                        call.effects.upsert("out:1", Out { text });
                        return Ok(());
                    }
                    Err(e) => last = Some(e),
                }
            }
            Err(ProduceError::msg(last.unwrap()))
        }
    })
    .creates::<Out>();
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flaky = Produce::new("flaky", move |_call: ProduceCall<Ticket>| {
        let first = !failed.swap(true, Ordering::SeqCst);
        async move {
            match first {
                true => Err(ProduceError::msg("a transient failure")),
                false => Ok(()),
            }
        }
    });
    let mut ctx = Context::new("retry");
    ctx.create("ticket:1", Ticket { text: "t".into() }).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(retrying))
        .agent(Agent::new("b").produce(flaky))
        .build()
        .unwrap();
    rt.run().await.unwrap_err();
    assert_eq!(made.load(Ordering::SeqCst), 2, "a failure, then the answer");
    rt.run().await.unwrap();
    assert_eq!(
        made.load(Ordering::SeqCst),
        2,
        "the rerun called again for an answer its first attempt already had"
    );
}

/// The harness runs a produce "if its condition holds for the trigger, as the runtime would
/// (otherwise nothing runs: `RunEffects::ran` is false)". A join whose part is missing does
/// not run in the runtime; the harness runs it, without parts.
#[tokio::test]
async fn the_harness_does_not_run_a_join_whose_set_is_incomplete() {
    let join = || {
        Produce::new("ship", |call: ProduceCall<Ticket>| async move {
            let part = call.joined::<Note>().ok().flatten();
            call.effects.upsert(
                "out:1",
                Out {
                    text: format!("{:?}", part.map(|p| p.data.text)),
                },
            );
        })
        .creates::<Out>()
        .key(|t: &reactifact_core::Record<Ticket>| t.data.text.clone())
        .join(|n: &reactifact_core::Record<Note>| n.data.text.clone())
    };
    // The runtime: no note shares the ticket's key, so the join does not run.
    let mut ctx = Context::new("join");
    ctx.create("ticket:1", Ticket { text: "k".into() }).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(join()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    assert!(rt.context().get::<Out>("out:1").unwrap().is_none(), "control");
    let effects = reactifact_core::testing::ProduceTest::new(join())
        .trigger("ticket:1", Ticket { text: "k".into() })
        .run()
        .await
        .unwrap();
    assert!(
        !effects.ran() && effects.ops().is_empty(),
        "the harness ran a join the runtime would not run: ran {}, {:?}",
        effects.ran(),
        effects.ops()
    );
}

/// Two deletions of one id in a batch (deleted, created again with the same content, deleted
/// again) are two runs of a plain deletion produce with one cache key (same id, version 1,
/// hash and event kind). Their generation fails for a sibling's sake: the cache keeps one
/// run's answers (the second overwrites the first), the rerun's first run takes them and the
/// second calls — and pays — again.
#[tokio::test]
async fn two_runs_with_one_cache_key_in_a_batch_do_not_pay_again_on_retry() {
    use reactifact_core::audit::EventKind;
    let made = Arc::new(AtomicU64::new(0));
    let counted = made.clone();
    let farewell = Produce::new("farewell", move |call: ProduceCall<Ticket>| {
        let made = counted.clone();
        async move {
            let _: String = call
                .record("llm", call.trigger.id.as_str(), || async move {
                    made.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>("bye".to_owned())
                })
                .await?;
            Ok::<(), ProduceError>(())
        }
    })
    .on([EventKind::Deleted]);
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flaky = Produce::new("flaky", move |_call: ProduceCall<Ticket>| {
        let first = !failed.swap(true, Ordering::SeqCst);
        async move {
            match first {
                true => Err(ProduceError::msg("a transient failure")),
                false => Ok(()),
            }
        }
    })
    .on([EventKind::Deleted]);
    let mut ctx = Context::new("twice");
    ctx.create("ticket:1", Ticket { text: "t".into() }).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(farewell))
        .agent(Agent::new("b").produce(flaky))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let ctx = rt.context_mut();
    ctx.delete("ticket:1").unwrap();
    ctx.create("ticket:1", Ticket { text: "t".into() }).unwrap();
    ctx.delete("ticket:1").unwrap();
    rt.run().await.unwrap_err();
    assert_eq!(made.load(Ordering::SeqCst), 2, "two deletion runs, one call each");
    rt.run().await.unwrap();
    assert_eq!(
        made.load(Ordering::SeqCst),
        2,
        "the rerun paid again for an answer the failed generation got"
    );
}

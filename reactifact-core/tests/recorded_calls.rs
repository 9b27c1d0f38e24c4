//! Recorded calls and resources: a produce that asks a model gets the answer once; a retry, a
//! reopen and a replay get it back from the record without calling again; a replay that asks
//! for another call diverges naming it; a token budget stops the turn at the run whose call
//! finds it spent.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::Ticket;
use reactifact_core::audit::{Difference, ReplayError};
use reactifact_core::error::{BuildError, CallError, MissKind};
use reactifact_core::runtime::{Budget, TurnOutcome, Usage};
use reactifact_core::{Agent, Artifact, Context, PendingAction, Produce, ProduceCall, ProduceError, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Label {
    category: String,
    at_secs: u64,
    lucky: u64,
}

impl Artifact for Label {
    const KIND: &'static str = "label";
}

/// A stand-in model: classifies by keyword, reports 100 tokens a call, counts its calls, and
/// takes `delay` (tokio time) to answer.
#[derive(Default)]
struct Model {
    calls: AtomicU64,
    delay: Duration,
    /// The next call fails.
    fail_next: AtomicBool,
}

impl Model {
    async fn classify(&self, text: &str) -> Result<(String, Usage), std::io::Error> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if self.fail_next.swap(false, Ordering::SeqCst) {
            return Err(std::io::Error::other("the model is overloaded"));
        }
        let category = if text.contains("refund") { "billing" } else { "general" };
        Ok((category.to_owned(), Usage::tokens(80, 20).with_cost(3)))
    }
}

/// A handle on the model the test keeps, as the runtime holds the resource.
#[derive(Clone, Default)]
struct Shared(Arc<Model>);

/// Triage: asks the model (a metered call), reads the clock and the random source, writes a
/// label and acts an email. `shout` changes the request (a changed prompt).
fn triage(shout: bool) -> Produce {
    Produce::new("triage", move |call: ProduceCall<Ticket>| async move {
        let model = call.resource::<Shared>().0.clone();
        let mut prompt = call.trigger.data.text.clone();
        if shout {
            prompt = prompt.to_uppercase();
        }
        let category: String = call
            .record_metered("llm", &prompt, || async { model.classify(&prompt).await })
            .await?;
        let at_secs = call
            .now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let lucky = call.rng().u64(..);
        let id = call.trigger.id.to_string();
        call.effects.upsert(
            format!("label:{id}"),
            Label {
                category: category.clone(),
                at_secs,
                lucky,
            },
        );
        call.effects.act("email", format!("email:{id}"), &category);
        Ok::<(), ProduceError>(())
    })
    .creates::<Label>()
    .creates::<PendingAction>()
    .uses::<Shared>()
}

fn agents(shout: bool) -> Vec<Agent> {
    vec![Agent::new("support").produce(triage(shout))]
}

fn tickets(n: usize) -> Context {
    let mut ctx = Context::new("support");
    for i in 1..=n {
        let text = if i % 2 == 0 { "please refund me" } else { "hello" };
        ctx.create(format!("ticket:{i}"), Ticket { text: text.into() }).unwrap();
    }
    ctx
}

fn runtime(ctx: Context, model: &Shared, extra: Option<Agent>) -> Runtime {
    let mut builder = Runtime::builder(ctx).resource(model.clone());
    for agent in agents(false) {
        builder = builder.agent(agent);
    }
    if let Some(agent) = extra {
        builder = builder.agent(agent);
    }
    builder.build().unwrap()
}

fn calls(model: &Shared) -> u64 {
    model.0.calls.load(Ordering::SeqCst)
}

#[tokio::test]
async fn a_produce_whose_resource_is_not_registered_is_refused_at_build() {
    let err = Runtime::builder(Context::new("s"))
        .agent(Agent::new("support").produce(triage(false)))
        .build()
        .unwrap_err();
    match &err {
        BuildError::MissingResource {
            agent,
            produce,
            resource,
        } => {
            assert_eq!((agent.as_str(), produce.as_str()), ("support", "triage"));
            assert!(resource.ends_with("Shared"), "{resource}");
        }
        other => panic!("expected MissingResource, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains("triage") && message.contains("Shared"), "{message}");
}

#[tokio::test]
async fn the_answer_is_recorded_in_the_run_and_the_replay_calls_nothing() {
    let model = Shared::default();
    let mut rt = runtime(tickets(2), &model, None);
    let report = rt.run().await.unwrap();
    assert_eq!(calls(&model), 2);
    assert_eq!(report.usage.len(), 1);
    let usage = &report.usage[0];
    assert_eq!((usage.agent.as_str(), usage.produce.as_str()), ("support", "triage"));
    assert_eq!((usage.calls, usage.reused), (2, 0));
    assert_eq!(usage.usage, Usage::tokens(160, 40).with_cost(6));
    assert_eq!(report.total_usage().total_tokens(), 200);

    // The record holds the model's answer, the clock reading and the seed, in asked order.
    let log = rt.context().log().unwrap();
    let run = log.iter().flat_map(|c| &c.runs).find(|r| r.produce.is_some()).unwrap();
    let names: Vec<&str> = run.calls.iter().map(|c| &*c.name).collect();
    assert_eq!(names, ["llm", "reactifact.now", "reactifact.rng"]);
    assert_eq!(run.calls[0].answer::<String>().unwrap().unwrap(), "general");
    assert_eq!(run.calls[0].usage, Usage::tokens(80, 20).with_cost(3));
    // Its Debug leaves the answer out.
    assert!(!format!("{:?}", run.calls[0]).contains("general"));

    let replay = rt.replay().await.unwrap();
    assert_eq!(replay.runs, 2);
    assert_eq!(calls(&model), 2, "the replay answers from the log");
    rt.context().verify().unwrap();
}

#[tokio::test]
async fn a_retried_generation_calls_the_model_once_in_all() {
    // A sibling produce fails the first time: the generation is not committed (fail-loud).
    let failed = Arc::new(AtomicBool::new(false));
    let flag = failed.clone();
    let flaky = Produce::new("flaky", move |_call: ProduceCall<Ticket>| {
        let first = !flag.swap(true, Ordering::SeqCst);
        async move {
            if first {
                Err(ProduceError::msg("a transient failure"))
            } else {
                Ok(())
            }
        }
    });
    let model = Shared::default();
    let mut rt = runtime(tickets(3), &model, Some(Agent::new("other").produce(flaky)));
    rt.run().await.unwrap_err();
    assert_eq!(calls(&model), 3, "each triage run asked once");
    assert_eq!(
        rt.context().generation().0,
        3,
        "the failed generation was not committed"
    );

    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(calls(&model), 3, "the rerun reused every answer");
    let triage = report.usage.iter().find(|u| u.produce == "triage").unwrap();
    assert_eq!((triage.calls, triage.reused), (0, 3));
    assert!(triage.usage.is_zero(), "reused answers cost nothing");
    // The committed record keeps the usage the answers cost when they were made.
    let log = rt.context().log().unwrap();
    let recorded: u64 = log
        .iter()
        .flat_map(|c| &c.runs)
        .flat_map(|r| &r.calls)
        .map(|c| c.usage.total_tokens())
        .sum();
    assert_eq!(recorded, 300);
    assert_eq!(rt.context().snapshot().len(), 3 + 3 + 3, "tickets, labels and intents");
    rt.replay().await.unwrap();
    assert_eq!(calls(&model), 3);
}

#[tokio::test]
async fn a_failed_call_is_not_reused_by_the_retry() {
    let model = Shared::default();
    model.0.fail_next.store(true, Ordering::SeqCst);
    let mut rt = runtime(tickets(1), &model, None);
    let err = rt.run().await.unwrap_err();
    assert!(err.to_string().contains("overloaded"), "{err}");
    rt.run().await.unwrap();
    assert_eq!(calls(&model), 2, "the retry called again");
    rt.replay().await.unwrap();
    assert_eq!(calls(&model), 2);
}

#[tokio::test(start_paused = true)]
async fn a_generation_cut_by_the_deadline_keeps_the_answers_it_got() {
    let model = Shared(Arc::new(Model {
        delay: Duration::from_secs(10),
        ..Model::default()
    }));
    // One run at a time: the first answers at 10 s, the second is cut at 15 s.
    let mut rt = Runtime::builder(tickets(2))
        .resource(model.clone())
        .agent(Agent::new("support").produce(triage(false)))
        .max_concurrency(1)
        .build()
        .unwrap();
    let report = rt
        .run_with(Budget::default().deadline(Duration::from_secs(15)))
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::DeadlineExceeded);
    assert_eq!(calls(&model), 2, "the second call started and was cut");
    assert_eq!(
        report.total_usage().total_tokens(),
        100,
        "the first call's usage is spent"
    );

    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(calls(&model), 3, "the first answer was reused, the cut one made again");
    assert_eq!(report.usage[0].reused, 1);
}

#[tokio::test]
async fn the_token_budget_stops_the_turn_at_the_run_whose_call_finds_it_spent() {
    let model = Shared::default();
    let mut rt = Runtime::builder(tickets(5))
        .resource(model.clone())
        .agent(Agent::new("support").produce(triage(false)))
        .max_concurrency(1)
        .build()
        .unwrap();
    // 100 tokens a call: the first three calls find 0, 100 and 200 spent; the fourth 300.
    let budget = Budget::default().max_tokens(250);
    let report = rt.run_with(budget).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::TokensExhausted);
    assert_eq!(calls(&model), 3, "the fourth run's call was not made");
    assert_eq!((report.generations, report.runs), (1, 3), "the runs before it commit");
    assert_eq!(report.total_usage().total_tokens(), 300);
    let queued_tickets = rt
        .context()
        .events()
        .filter(|e| e.id.as_str().starts_with("ticket:"))
        .count();
    assert_eq!(queued_tickets, 2, "the events of the other two stay queued");
    assert!(rt
        .context()
        .snapshot()
        .get::<Label>("label:ticket:3")
        .unwrap()
        .is_some());
    assert!(rt
        .context()
        .snapshot()
        .get::<Label>("label:ticket:4")
        .unwrap()
        .is_none());

    // The next turn runs the last two.
    let report = rt.run_with(budget).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(calls(&model), 5);
    assert_eq!((report.usage[0].calls, report.usage[0].reused), (2, 0));
    assert_eq!(report.runs, 2);

    // The cost budget ends a turn the same way, with its own outcome.
    let model = Shared::default();
    let mut rt = Runtime::builder(tickets(3))
        .resource(model.clone())
        .agent(Agent::new("support").produce(triage(false)))
        .max_concurrency(1)
        .build()
        .unwrap();
    let report = rt.run_with(Budget::default().max_cost(3)).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::CostExhausted);
    assert_eq!(calls(&model), 1);
}

#[tokio::test(start_paused = true)]
async fn calls_running_at_once_overshoot_the_budget_together_and_the_turn_ends_on_it() {
    // Each call takes a second: the five runs' calls all start before any answers.
    let model = Shared(Arc::new(Model {
        delay: Duration::from_secs(1),
        ..Model::default()
    }));
    let mut rt = Runtime::builder(tickets(5))
        .resource(model.clone())
        .agent(Agent::new("support").produce(triage(false)))
        .build()
        .unwrap();
    let report = rt.run_with(Budget::default().max_tokens(250)).await.unwrap();
    assert_eq!((report.outcome, report.runs), (TurnOutcome::TokensExhausted, 5));
    assert_eq!(report.total_usage().total_tokens(), 500);
    assert_eq!(calls(&model), 5);
}

#[tokio::test]
async fn a_changed_request_under_the_same_name_is_a_replay_miss_naming_the_call() {
    let model = Shared::default();
    let mut rt = runtime(tickets(1), &model, None);
    rt.run().await.unwrap();
    let err = rt
        .context()
        .replay_with(
            &agents(true),
            &reactifact_core::runtime::Resources::new().with(model.clone()),
        )
        .await
        .unwrap_err();
    let ReplayError::Diverged(divergence) = &err else {
        panic!("expected a divergence, got {err}");
    };
    assert_eq!(divergence.produce, "triage");
    match &divergence.difference {
        Difference::Call(miss) => {
            assert_eq!(
                (miss.produce.as_str(), miss.call.as_str(), miss.index),
                ("triage", "llm", 0)
            );
            assert!(matches!(miss.kind, MissKind::RequestDiffers { .. }), "{:?}", miss.kind);
        }
        other => panic!("expected a call difference, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("`llm`") && message.contains("request differs"),
        "{message}"
    );
    assert_eq!(calls(&model), 1, "the replay made no call");
}

#[tokio::test]
async fn a_replay_that_asks_for_more_or_fewer_calls_diverges() {
    let model = Shared::default();
    let mut rt = runtime(tickets(1), &model, None);
    rt.run().await.unwrap();
    let resources = reactifact_core::runtime::Resources::new().with(model.clone());

    // Twice the model: the second call has no record.
    let twice = Produce::new("triage", |call: ProduceCall<Ticket>| async move {
        let model = call.resource::<Shared>().0.clone();
        let prompt = call.trigger.data.text.clone();
        for _ in 0..2 {
            let _: String = call
                .record_metered("llm", &prompt, || async { model.classify(&prompt).await })
                .await?;
        }
        Ok::<(), ProduceError>(())
    })
    .uses::<Shared>();
    let err = rt
        .context()
        .replay_with(&[Agent::new("support").produce(twice)], &resources)
        .await
        .unwrap_err();
    let ReplayError::Diverged(d) = err else { panic!() };
    assert!(
        matches!(&d.difference, Difference::Call(m) if m.index == 1 && m.kind == MissKind::NotRecorded),
        "{d}"
    );

    // No call at all: the recorded one was not asked for.
    let none = Produce::new("triage", |_call: ProduceCall<Ticket>| async move {});
    let err = rt
        .context()
        .replay_with(&[Agent::new("support").produce(none)], &resources)
        .await
        .unwrap_err();
    let ReplayError::Diverged(d) = err else { panic!() };
    assert!(
        matches!(&d.difference, Difference::Call(m) if m.call == "llm" && m.kind == MissKind::NotAsked),
        "{d}"
    );
    assert_eq!(calls(&model), 1);
}

#[tokio::test]
async fn the_recorded_answers_survive_a_reopen_of_the_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("support.db");
    let model = Shared::default();
    let head = {
        let mut ctx = Context::open(&path, "support").unwrap();
        for i in 1..=3 {
            ctx.create(format!("ticket:{i}"), Ticket { text: "refund".into() })
                .unwrap();
        }
        let mut rt = runtime(ctx, &model, None);
        rt.run().await.unwrap();
        rt.context().head()
    };
    assert_eq!(calls(&model), 3);

    let ctx = Context::open(&path, "support").unwrap();
    assert_eq!(ctx.head(), head);
    ctx.verify().unwrap();
    let log = ctx.log().unwrap();
    let answers: Vec<String> = log
        .iter()
        .flat_map(|c| &c.runs)
        .flat_map(|r| &r.calls)
        .filter(|c| &*c.name == "llm")
        .map(|c| c.answer::<String>().unwrap().unwrap())
        .collect();
    assert_eq!(answers, ["billing", "billing", "billing"]);
    let mut rt = runtime(ctx, &model, None);
    rt.replay().await.unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 0, "nothing to do after the reopen");
    assert_eq!(calls(&model), 3, "neither the reopen nor the replay called the model");
}

#[tokio::test]
async fn reserved_names_and_calls_after_the_run_are_refused() {
    let produce = Produce::new("sneaky", |call: ProduceCall<Ticket>| async move {
        let err = call
            .record("reactifact.now", &(), || async { Ok::<u64, std::io::Error>(1) })
            .await
            .unwrap_err();
        assert!(matches!(err, CallError::ReservedName { .. }), "{err}");
        Ok::<(), ProduceError>(())
    });
    let mut rt = Runtime::builder(tickets(1))
        .agent(Agent::new("a").produce(produce))
        .build()
        .unwrap();
    rt.run().await.unwrap();
}

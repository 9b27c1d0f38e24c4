//! `complete_recorded` in the runtime: the answer is recorded with its usage, a retried
//! generation and a replay get it back without asking the server again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use reactifact_core::error::CallError;
use reactifact_core::runtime::{Budget, TurnOutcome, Usage};
use reactifact_core::{Agent, Artifact, Context, Produce, ProduceCall, ProduceError, Runtime};
use reactifact_model::stand_in::{Reply, StandIn};
use reactifact_model::{ChatClient, ChatRequest, ModelError, RetryPolicy};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Ticket {
    text: String,
}

impl Artifact for Ticket {
    const KIND: &'static str = "ticket";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Draft {
    text: String,
}

impl Artifact for Draft {
    const KIND: &'static str = "draft";
}

fn request(ticket: &Ticket) -> ChatRequest {
    ChatRequest::new("small")
        .system("Draft a reply.")
        .user(ticket.text.clone())
}

/// A produce that asks the model for a draft, writes it, and then fails its first run (after
/// the call was made), so the first turn is not committed.
fn drafter(fail_first: bool) -> Produce {
    let failed = Arc::new(AtomicBool::new(!fail_first));
    Produce::new("draft", move |call: ProduceCall<Ticket>| {
        let failed = failed.clone();
        async move {
            let model = call.resource::<ChatClient>();
            let answer = model
                .complete_recorded(&call, "draft", &request(&call.trigger.data))
                .await?;
            if !failed.swap(true, Ordering::SeqCst) {
                return Err(ProduceError::msg("a transient failure after the model answered"));
            }
            call.effects.upsert(
                format!("draft:{}", call.trigger.id),
                Draft {
                    text: answer.text().to_owned(),
                },
            );
            Ok(())
        }
    })
    .creates::<Draft>()
    .uses::<ChatClient>()
}

fn tickets_ticket() -> Ticket {
    Ticket {
        text: "refund me".into(),
    }
}

fn tickets() -> Context {
    let mut ctx = Context::new("support");
    ctx.create(
        "ticket:1",
        Ticket {
            text: "refund me".into(),
        },
    )
    .unwrap();
    ctx
}

#[tokio::test]
async fn a_retried_generation_gets_the_recorded_answer_without_calling_the_model() {
    let server = StandIn::start(|_, request| Reply::text(format!("re: {}", request.messages.len()), 12, 3))
        .await
        .unwrap();
    let client = ChatClient::new(server.base_url(), None).unwrap();
    let agents = [Agent::new("support").produce(drafter(true))];
    let mut rt = Runtime::builder(tickets())
        .resource(client.clone())
        .agent(agents[0].clone())
        .build()
        .unwrap();

    let failed = rt.run().await.unwrap_err();
    assert!(failed.to_string().contains("a transient failure"), "{failed}");
    assert_eq!(server.requests(), 1);
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(server.requests(), 1, "the retry reused the recorded answer");
    assert_eq!(report.usage.iter().map(|u| u.reused).sum::<u64>(), 1);
    let draft = rt.context().get::<Draft>("draft:ticket:1").unwrap().unwrap();
    assert_eq!(draft.data.text, "re: 2");
    // The run's record keeps the call with the model asked and the tokens it used.
    let log = rt.context().log().unwrap();
    let call = &log.last().unwrap().runs[0].calls[0];
    assert_eq!(
        (&*call.name, call.model.as_deref(), call.usage),
        (
            "draft",
            Some(request(&tickets_ticket()).model.as_str()),
            Usage::tokens(12, 3)
        )
    );

    // The replay oracle re-executes the run from the log: no request either.
    let replay = rt.replay().await.unwrap();
    assert_eq!(replay.runs, 1);
    assert_eq!(server.requests(), 1);
}

#[tokio::test]
async fn the_answer_s_usage_is_metered_and_counted_against_the_budget() {
    let server = StandIn::start(|_, _| Reply::text("ok", 40, 2)).await.unwrap();
    let client = ChatClient::new(server.base_url(), None).unwrap();
    let mut ctx = tickets();
    ctx.create("ticket:2", Ticket { text: "and me".into() }).unwrap();
    let mut rt = Runtime::builder(ctx)
        .resource(client)
        .agent(Agent::new("support").produce(drafter(false)))
        .max_concurrency(1)
        .build()
        .unwrap();
    let report = rt.run_with(Budget::default().max_tokens(10)).await.unwrap();
    assert_eq!(report.total_usage(), Usage::tokens(40, 2));
    assert_eq!(report.outcome, TurnOutcome::TokensExhausted);
    assert_eq!(server.requests(), 1, "the second ticket's call found the budget spent");
}

#[tokio::test]
async fn a_failed_model_call_fails_the_run_with_the_model_error_inside() {
    let server = StandIn::start(|_, _| Reply::status(400, "unknown model"))
        .await
        .unwrap();
    let client = ChatClient::new(server.base_url(), None)
        .unwrap()
        .with_retry(RetryPolicy::none());
    let produce = Produce::new("draft", move |call: ProduceCall<Ticket>| async move {
        let model = call.resource::<ChatClient>();
        let error = model
            .complete_recorded(&call, "draft", &request(&call.trigger.data))
            .await
            .unwrap_err();
        let CallError::Failed { source, .. } = &error else {
            panic!("a failed call, got {error}");
        };
        let model_error = source.downcast_ref::<ModelError>().expect("the model's error");
        assert!(
            matches!(model_error, ModelError::Status { status: 400, .. }),
            "{model_error}"
        );
        Err::<(), _>(ProduceError::from(error))
    })
    .uses::<ChatClient>();
    let mut rt = Runtime::builder(tickets())
        .resource(client)
        .agent(Agent::new("support").produce(produce))
        .build()
        .unwrap();
    let error = rt.run().await.unwrap_err();
    assert!(error.to_string().contains("unknown model"), "{error}");
}

#[test]
fn complete_recorded_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let _ = |client: ChatClient, call: ProduceCall<Ticket>, request: ChatRequest| async move {
        let future = client.complete_recorded(&call, "draft", &request);
        assert_send(&future);
        future.await
    };
}

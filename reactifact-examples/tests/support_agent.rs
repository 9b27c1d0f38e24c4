//! The support agent: every case of the `support-agent` program holds, in-process, with the
//! stand-in and with reactifact-model's `ChatClient` (against its stand-in server); a model that
//! fails every call makes a case fail; and `triage` itself, run by the produce test harness
//! with scripted answers.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use reactifact_core::error::{CallError, MissKind, RunFailure};
use reactifact_core::runtime::Usage;
use reactifact_core::testing::ProduceTest;
use reactifact_examples::support::agent::{triage, Email, ModelClient, ModelSettings, Ticket, Triage};
use reactifact_examples::support::cases::{Case, CaseReport, Cases, Entry, ModelChoice};
use reactifact_examples::support::{
    Category, ChatClient, Completion, CompletionFuture, CompletionRequest, Model, ModelError, StandIn, DRAFT_SYSTEM,
    TRIAGE_SYSTEM,
};
use reactifact_model::stand_in::{Reply, StandIn as StandInServer};

/// Runs `case` in a new directory.
async fn run(case: Case, model: ModelChoice) -> CaseReport {
    let dir = tempfile::tempdir().unwrap();
    Cases::new(dir.path(), model).run(case).await
}

/// Asserts the case passed, showing its report if not.
fn assert_passed(report: &CaseReport) {
    assert!(report.passed(), "case failed:\n{report}");
}

#[tokio::test]
async fn the_first_run_triages_five_tickets_with_ten_calls_and_sends_five_emails() {
    let report = run(Case::FirstRun, ModelChoice::StandIn).await;
    assert_passed(&report);
    let printed = report.to_string();
    assert!(printed.contains("PASS 10 model calls"), "{printed}");
    assert!(
        printed.contains("usage: support/triage made 10 calls (0 reused)"),
        "{printed}"
    );
}

#[tokio::test]
async fn a_failed_model_call_fails_the_turn_and_the_rerun_asks_only_again_what_failed() {
    let report = run(Case::Retry, ModelChoice::StandIn).await;
    assert_passed(&report);
    let printed = report.to_string();
    assert!(printed.contains("PASS model calls in all: 11"), "{printed}");
    assert!(printed.contains("503"), "{printed}");
}

#[tokio::test]
async fn a_reopened_store_sends_the_pending_emails_without_asking_the_model() {
    assert_passed(&run(Case::CrashResume, ModelChoice::StandIn).await);
}

#[tokio::test]
async fn the_replay_calls_nothing_and_a_changed_prompt_is_a_miss_naming_the_call() {
    let report = run(Case::Replay, ModelChoice::StandIn).await;
    assert_passed(&report);
    let notes: Vec<&str> = report
        .entries
        .iter()
        .filter_map(|e| match e {
            Entry::Note(note) => Some(note.as_str()),
            Entry::Claim(_) => None,
        })
        .collect();
    assert_eq!(notes.len(), 2, "{report}");
    assert!(
        notes[0].contains("recorded call `draft` (#0 of that name)"),
        "{}",
        notes[0]
    );
    assert!(
        notes[1].contains("recorded call `classify` (#0 of that name)"),
        "{}",
        notes[1]
    );
    assert!(notes.iter().all(|n| n.contains("request differs")), "{notes:?}");
}

#[tokio::test]
async fn a_token_budget_stops_the_turn_partway_and_nothing_is_paid_twice() {
    let report = run(Case::TokenBudget, ModelChoice::StandIn).await;
    assert_passed(&report);
    assert!(
        report.to_string().contains("PASS it stopped partway: 5 of 10"),
        "{report}"
    );
}

#[tokio::test]
async fn every_case_holds_in_one_directory() {
    let dir = tempfile::tempdir().unwrap();
    assert!(Cases::new(dir.path(), ModelChoice::StandIn).run_all().await);
    for n in 1..=5 {
        assert!(dir.path().join(format!("case-{n}.db")).exists(), "case-{n}.db");
    }
    // The stores are new ones: a second run in the same directory refuses to reuse them.
    let report = Cases::new(dir.path(), ModelChoice::StandIn).run(Case::FirstRun).await;
    assert!(!report.passed());
    assert!(
        report.error.as_deref().unwrap_or_default().contains("exists"),
        "{report}"
    );
}

fn assert_send<T: Send>(_: &T) {}

#[test]
fn the_cases_futures_are_send() {
    let dir = tempfile::tempdir().unwrap();
    let cases = Cases::new(dir.path(), ModelChoice::StandIn);
    assert_send(&cases.run(Case::FirstRun));
    assert_send(&cases.run_all());
}

/// A model that fails every call.
struct Down;

impl Model for Down {
    fn complete<'a>(&'a self, _request: &'a CompletionRequest) -> CompletionFuture<'a> {
        Box::pin(async { Err(ModelError::Transport("connection refused".into())) })
    }
}

#[tokio::test]
async fn a_model_that_is_down_fails_the_cases() {
    let down = ModelChoice::Other {
        client: Arc::new(Down),
        name: "down".into(),
        describe: "nowhere".into(),
    };
    for case in Case::ALL {
        let report = run(case, down.clone()).await;
        assert!(!report.passed(), "{report}");
        assert!(report.to_string().contains("FAIL"), "{report}");
    }
}

#[tokio::test]
async fn every_case_holds_with_the_openai_client_on_counts_and_deliveries() {
    // The server answers every request with "billing": a category for `classify`, and the
    // reply `draft` sends.
    let server = StandInServer::start(|_, _| Reply::text("billing", 50, 10))
        .await
        .unwrap();
    let client = ChatClient::new(server.base_url(), Some("sk-test".into())).unwrap();
    let choice = ModelChoice::Other {
        describe: client.endpoint().to_owned(),
        client: Arc::new(client),
        name: "gpt-test".into(),
    };
    let dir = tempfile::tempdir().unwrap();
    let cases = Cases::new(dir.path(), choice);
    let mut asked = 0;
    for case in Case::ALL {
        let report = cases.run(case).await;
        assert_passed(&report);
        // The answer-dependent claims are left out for a model other than the stand-in.
        assert!(!report.to_string().contains("the model's answer to"), "{report}");
        asked += match case {
            Case::Retry => 11,
            _ => 10,
        };
    }
    let received = server.received();
    assert_eq!(received.len(), asked, "requests that reached the server");
    let first = &received[0].body;
    assert_eq!(first["model"], "gpt-test");
    assert_eq!(first["messages"][0]["content"], TRIAGE_SYSTEM);
    assert!(
        received
            .iter()
            .any(|r| r.body["messages"][0]["content"] == DRAFT_SYSTEM),
        "a draft request reached the server"
    );
}

// ---------------------------------------------------------------------------------------------
// `triage` in the produce test harness
// ---------------------------------------------------------------------------------------------

fn ticket() -> Ticket {
    Ticket {
        customer: "ada@example.com".into(),
        subject: "Charged twice".into(),
        body: "Please refund the second payment.".into(),
    }
}

fn completion(text: &str, tokens_in: u64, tokens_out: u64) -> Completion {
    Completion {
        text: text.into(),
        tokens_in,
        tokens_out,
    }
}

/// `triage` on `ticket:1`, with a stand-in the scripted answers leave uncalled.
fn triage_test(model: &Arc<StandIn>) -> ProduceTest {
    ProduceTest::new(triage)
        .trigger("ticket:1", ticket())
        .resource(ModelClient(model.clone()))
        .resource(ModelSettings { model: "small".into() })
        .now(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
}

#[tokio::test]
async fn triage_writes_the_category_and_reply_and_acts_the_email() {
    let model = Arc::new(StandIn::new());
    let reply = "Hello Ada, we will refund the second payment.";
    let effects = triage_test(&model)
        .answer_metered("classify", &completion("Billing.", 40, 1), Usage::tokens(40, 1))
        .answer_metered("draft", &completion(reply, 60, 9), Usage::tokens(60, 9))
        .run()
        .await
        .unwrap();

    assert_eq!(
        effects.get::<Triage>("triage:ticket:1"),
        Some(Triage {
            category: Category::Billing,
            reply: reply.into(),
            triaged_at_secs: 1_700_000_000,
        })
    );
    let intents = effects.intents();
    assert_eq!(intents.len(), 1);
    let email = effects.intent("email:ticket:1").expect("the email intent");
    assert_eq!(email.kind, "email");
    assert_eq!(
        email.payload::<Email>().unwrap(),
        Email {
            to: "ada@example.com".into(),
            subject: "Re: Charged twice".into(),
            body: reply.into(),
        }
    );
    assert_eq!(effects.usage(), Usage::tokens(100, 10));
    assert_eq!(model.calls(), 0, "scripted answers call no model");
}

#[tokio::test]
async fn triage_asks_the_configured_model_and_drafts_for_the_category_it_got() {
    let model = Arc::new(StandIn::new());
    let effects = triage_test(&model)
        .answer("classify", &completion("billing", 40, 1))
        .answer("draft", &completion("We are on it.", 60, 4))
        .run()
        .await
        .unwrap();

    let classify = effects.requests::<CompletionRequest>("classify");
    assert_eq!(classify.len(), 1);
    assert_eq!(classify[0].model, "small");
    assert_eq!(classify[0].system, TRIAGE_SYSTEM);
    assert_eq!(classify[0].prompt, "Charged twice\n\nPlease refund the second payment.");
    let draft = effects.requests::<CompletionRequest>("draft");
    assert_eq!(draft.len(), 1);
    assert_eq!(draft[0].model, "small");
    assert_eq!(draft[0].system, DRAFT_SYSTEM);
    assert_eq!(
        draft[0].prompt,
        "Category: billing\n\nCharged twice\n\nPlease refund the second payment."
    );
    let names: Vec<&str> = effects.calls().iter().map(|c| &*c.name).collect();
    assert_eq!(names, ["classify", "draft", "reactifact.now"]);
}

#[tokio::test]
async fn an_answer_that_is_no_category_is_general_and_a_missing_draft_writes_nothing() {
    let model = Arc::new(StandIn::new());
    let effects = triage_test(&model)
        .answer("classify", &completion("I am not sure, maybe shipping?", 40, 6))
        .answer("draft", &completion("Thanks, we will look.", 60, 4))
        .run()
        .await
        .unwrap();
    let triage = effects.get::<Triage>("triage:ticket:1").unwrap();
    assert_eq!(triage.category, Category::General);
    assert!(effects.requests::<CompletionRequest>("draft")[0]
        .prompt
        .starts_with("Category: general\n"));

    // No answer for `draft`: the run fails on the miss, having written nothing.
    let failure = triage_test(&model)
        .answer("classify", &completion("bug", 40, 1))
        .run()
        .await
        .unwrap_err();
    let RunFailure::Returned(error) = &failure else {
        panic!("expected the produce's error, got {failure}");
    };
    match error.as_error().downcast_ref::<CallError>() {
        Some(CallError::Miss(miss)) => {
            assert_eq!((miss.call.as_str(), miss.index), ("draft", 0));
            assert_eq!(miss.kind, MissKind::NotScripted);
        }
        other => panic!("expected a miss of `draft`, got {other:?}"),
    }
    assert_eq!(model.calls(), 0);
}

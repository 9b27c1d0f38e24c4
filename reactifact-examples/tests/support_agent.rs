//! The support-agent program's cases: each one holds with the stand-in model, and a model
//! server that is down fails them loudly.

use reactifact_examples::support::cases::{Case, CaseReport, Cases, ModelChoice};
use reactifact_model::ChatClient;

async fn run(case: Case, model: ModelChoice) -> CaseReport {
    let dir = tempfile::tempdir().unwrap();
    Cases::new(dir.path(), model).run(case).await
}

fn assert_passed(report: &CaseReport) {
    assert!(report.passed(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_holds_with_the_stand_in() {
    for case in Case::ALL {
        let report = run(case, ModelChoice::StandIn).await;
        assert_passed(&report);
        assert!(report.claims().count() >= 3, "{report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_server_that_is_down_fails_the_cases_that_run() {
    // A port nobody listens on: bind one, then let it go.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let client = ChatClient::new(format!("http://{addr}/v1"), None)
        .unwrap()
        .with_retry(reactifact_model::RetryPolicy::none());
    let model = ModelChoice::Other {
        client: Box::new(client),
        name: "down".into(),
    };
    let dir = tempfile::tempdir().unwrap();
    let cases = Cases::new(dir.path(), model.clone());
    assert_eq!(cases.cases(), [Case::FirstRun, Case::Replay]);
    for case in cases.cases() {
        let report = run(case, model.clone()).await;
        assert!(!report.passed(), "{report}");
        assert!(
            report.error.as_deref().is_some_and(|e| e.contains("could not")) || report.claims().any(|c| !c.holds),
            "{report}"
        );
    }
}

fn assert_send<T: Send>(_: &T) {}

#[test]
fn the_cases_futures_are_send() {
    let cases = Cases::new(std::env::temp_dir(), ModelChoice::StandIn);
    assert_send(&cases.run(Case::FirstRun));
    assert_send(&cases.run_all());
}

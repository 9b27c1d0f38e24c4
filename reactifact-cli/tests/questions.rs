//! `question list` and `question answer` through the real binary, on a store of its own whose
//! produce asked a question per order: the answer is one committed write of the session (read
//! back with the library, verified), the refusals exit 2 and change nothing, and a runtime's
//! next turn runs the produce triggered by the answered question.

mod binary;
mod support;

use std::path::{Path, PathBuf};

use binary::reactifact;
use reactifact_core::runtime::Question;
use reactifact_core::{Agent, Context, PendingAction, Produce, ProduceCall, ProduceError, Runtime};
use support::Order;
use tempfile::TempDir;

/// Asks, per order, whether to refund it.
fn ask() -> Produce {
    Produce::new("ask", |call: ProduceCall<Order>| async move {
        call.effects
            .ask(format!("question:refund:{}", call.trigger.id), "refund this order?");
    })
    .creates::<Question>()
}

/// Acts a refund for each question answered `yes`.
fn refund() -> Produce {
    Produce::new("refund", |call: ProduceCall<Question>| async move {
        if call.trigger.data.answer.as_deref() == Some("yes") {
            call.effects
                .act("refund", format!("refund:{}", call.trigger.id), &"refund");
        }
        Ok::<(), ProduceError>(())
    })
    .creates::<PendingAction>()
}

fn agents() -> Vec<Agent> {
    vec![Agent::new("support").produce(ask()).produce(refund())]
}

fn runtime(ctx: Context) -> Runtime {
    let mut builder = Runtime::builder(ctx);
    for agent in agents() {
        builder = builder.agent(agent);
    }
    builder.build().unwrap()
}

/// A store whose session `refunds` asked about `order:1` and `order:2`.
fn question_store() -> (TempDir, PathBuf) {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("questions.db");
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tokio.block_on(async {
        let mut ctx = Context::open(&path, "refunds").unwrap();
        for (i, customer) in ["ada", "bob"].iter().enumerate() {
            ctx.create(
                format!("order:{}", i + 1),
                Order {
                    customer: (*customer).into(),
                    total_cents: 1_000,
                    channel: "email".into(),
                },
            )
            .unwrap();
        }
        runtime(ctx).run().await.unwrap();
    });
    (dir, path)
}

fn run(path: &Path, args: &[&str]) -> binary::Run {
    let mut all: Vec<&std::ffi::OsStr> = vec!["--store".as_ref(), path.as_os_str()];
    all.extend(args.iter().map(std::ffi::OsStr::new));
    reactifact(&all)
}

fn json(path: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend(args);
    run(path, &all).ok().json()
}

fn question(path: &Path, id: &str) -> Question {
    let ctx = Context::open_with(path, "refunds", reactifact_core::OpenOptions::new().read_only(true)).unwrap();
    ctx.get::<Question>(id).unwrap().unwrap().data
}

#[test]
fn a_question_is_answered_once_with_a_committed_write_that_the_next_turn_reacts_to() {
    let (_dir, path) = question_store();
    let listed = json(&path, &["question", "list", "--pending"]);
    let ids: Vec<&str> = listed["questions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["question:refund:order:1", "question:refund:order:2"], "{listed}");
    assert_eq!(listed["questions"][0]["text"], "refund this order?");
    assert_eq!(listed["questions"][0]["answer"], serde_json::Value::Null);

    let out = run(
        &path,
        &[
            "question",
            "answer",
            "question:refund:order:1",
            "--answer",
            "yes",
            "--by",
            "ada@ops",
        ],
    )
    .ok();
    assert!(
        out.stdout
            .starts_with("answered question:refund:order:1 (by ada@ops) in session refunds"),
        "{out:?}"
    );
    let answered = question(&path, "question:refund:order:1");
    assert_eq!(
        (answered.answer.as_deref(), answered.answered_by.as_deref()),
        (Some("yes"), Some("ada@ops"))
    );
    let doc = json(
        &path,
        &[
            "question",
            "answer",
            "question:refund:order:2",
            "--answer",
            "no",
            "--by",
            "bob@ops",
        ],
    );
    assert_eq!(doc["answered"]["answer"], "no", "{doc}");
    assert_eq!(doc["answered"]["answered_by"], "bob@ops", "{doc}");
    assert!(json(&path, &["question", "list", "--pending"])["questions"]
        .as_array()
        .unwrap()
        .is_empty());
    let table = run(&path, &["question", "list"]).ok().stdout;
    assert!(
        table.contains("answered") && table.contains("ada@ops") && table.contains("yes"),
        "{table}"
    );
    run(&path, &["verify"]).ok();

    // Refusals: exit 2, nothing written.
    let before = Context::open_with(&path, "refunds", reactifact_core::OpenOptions::new().read_only(true))
        .unwrap()
        .generation();
    run(
        &path,
        &[
            "question",
            "answer",
            "question:refund:order:1",
            "--answer",
            "no",
            "--by",
            "cy@ops",
        ],
    )
    .fails(2, "already answered by ada@ops; the first answer stands");
    run(
        &path,
        &[
            "question",
            "answer",
            "question:nope",
            "--answer",
            "no",
            "--by",
            "cy@ops",
        ],
    )
    .fails(2, "no question `question:nope` in session refunds");
    run(
        &path,
        &["question", "answer", "order:1", "--answer", "no", "--by", "cy@ops"],
    )
    .fails(2, "`order:1` in session refunds is not a question");
    run(
        &path,
        &[
            "question",
            "answer",
            "question:refund:order:1",
            "--answer",
            "no",
            "--by",
            "",
        ],
    )
    .fails(2, "--by must name who answers");
    run(
        &path,
        &["question", "answer", "question:refund:order:1", "--by", "cy@ops"],
    )
    .fails(2, "--answer");
    let after = Context::open_with(&path, "refunds", reactifact_core::OpenOptions::new().read_only(true))
        .unwrap()
        .generation();
    assert_eq!(before, after, "a refused answer writes nothing");

    // The answers are updates of the questions: the next turn runs `refund` on them, and only
    // the `yes` acts.
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tokio.block_on(async {
        let mut rt = runtime(Context::open(&path, "refunds").unwrap());
        let report = rt.run().await.unwrap();
        assert_eq!(report.runs, 2, "refund ran on both answered questions");
        let acted: Vec<String> = rt
            .context()
            .list::<PendingAction>()
            .map(|a| a.unwrap().data.key)
            .collect();
        assert_eq!(acted, ["refund:question:refund:order:1"]);
    });
}

//! The context: reads, direct writes, relations, snapshots and the hash chain.

mod common;

use common::*;
use reactifact_core::error::{CommitError, ReadError, WriteError};
use reactifact_core::runtime::Relation;
use reactifact_core::{Agent, ArtifactId, Context, Runtime};

#[test]
fn typed_reads_name_the_id_and_type_on_mismatch() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1)).unwrap();
    let err = ctx.get::<Receipt>("order:1").unwrap_err();
    assert!(matches!(&err, ReadError::WrongKind { id, .. } if id == "order:1"));
    assert_eq!(
        err.to_string(),
        format!(
            "artifact `order:1` is a `order`, not a `receipt` (read as {})",
            std::any::type_name::<Receipt>()
        )
    );
    assert!(ctx.get::<Order>("order:404").unwrap().is_none());
}

#[test]
fn stored_bytes_that_do_not_decode_name_the_id_kind_and_type() {
    #[derive(serde::Serialize, serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct OrderV2 {
        customer: String,
        total_cents: u64,
        currency: String,
    }
    impl reactifact_core::Artifact for OrderV2 {
        const KIND: &'static str = "order";
    }
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1)).unwrap();
    let err = ctx.get::<OrderV2>("order:1").unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, ReadError::Decode { .. }));
    assert!(
        message.starts_with("artifact `order:1` of kind `order` does not decode as"),
        "{message}"
    );
    assert!(message.contains("OrderV2"), "{message}");
}

#[test]
fn list_returns_one_type_in_creation_order() {
    let mut ctx = Context::new("t");
    for id in ["order:b", "order:a", "order:c"] {
        ctx.create(id, order("ada", 1)).unwrap();
    }
    ctx.create(
        "receipt:1",
        Receipt {
            order: "x".into(),
            total_cents: 0,
        },
    )
    .unwrap();
    // Updating keeps the position; deleting and re-creating moves it to the end.
    ctx.update("order:b", order("bob", 2)).unwrap();
    ctx.delete("order:a").unwrap();
    ctx.create("order:a", order("ada", 3)).unwrap();
    let ids: Vec<_> = ctx.list::<Order>().map(|r| r.unwrap().id.to_string()).collect();
    assert_eq!(ids, ["order:b", "order:c", "order:a"]);
    assert_eq!(ctx.snapshot().count::<Receipt>(), 1);
    assert_eq!(ctx.len(), 4);
}

#[test]
fn writes_are_refused_without_changing_anything() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1)).unwrap();
    let hash = ctx.state_hash();
    let commits = ctx.log().unwrap().len();

    let err = ctx.update("order:2", order("ada", 1)).unwrap_err();
    assert!(matches!(err, WriteError::Commit(CommitError::UnknownId { .. })));
    assert_eq!(err.to_string(), "update of unknown artifact `order:2` (kind `order`)");

    let err = ctx
        .create(
            "order:1",
            Receipt {
                order: "x".into(),
                total_cents: 0,
            },
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "artifact `order:1` is a `order`; writing a `receipt` under the same id is refused"
    );

    // A transaction whose last write fails applies none of its writes.
    let mut tx = ctx.transaction();
    tx.create("order:2", order("bob", 2))
        .update("order:404", order("eve", 3));
    assert!(tx.commit().is_err());
    assert!(ctx.get::<Order>("order:2").unwrap().is_none());
    assert_eq!(ctx.state_hash(), hash);
    assert_eq!(ctx.log().unwrap().len(), commits);
    assert_eq!(ctx.queued_events(), 1);
}

#[test]
fn relations_link_existing_artifacts_and_go_with_a_deletion() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1)).unwrap();
    ctx.create(
        "receipt:1",
        Receipt {
            order: "order:1".into(),
            total_cents: 1,
        },
    )
    .unwrap();
    let err = ctx.link("order:1", "billed_by", "receipt:404").unwrap_err();
    assert!(
        err.to_string().contains("artifact `receipt:404` does not exist"),
        "{err}"
    );

    let before = ctx.state_hash();
    ctx.link("order:1", "billed_by", "receipt:1").unwrap();
    assert_ne!(ctx.state_hash(), before);
    let order_id = ArtifactId::from("order:1");
    let related: Vec<_> = ctx.related(&order_id, "billed_by").cloned().collect();
    assert_eq!(related, [ArtifactId::from("receipt:1")]);
    assert!(ctx
        .snapshot()
        .has_relation(&Relation::new("order:1", "billed_by", "receipt:1")));

    ctx.unlink("order:1", "billed_by", "receipt:1").unwrap();
    assert_eq!(ctx.state_hash(), before);

    ctx.link("order:1", "billed_by", "receipt:1").unwrap();
    ctx.delete("receipt:1").unwrap();
    assert_eq!(ctx.related(&order_id, "billed_by").count(), 0);
    assert_eq!(ctx.snapshot().relations().count(), 0);
}

#[test]
fn a_snapshot_does_not_see_later_writes() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1)).unwrap();
    let snapshot = ctx.snapshot();
    let hash = snapshot.state_hash();
    ctx.update("order:1", order("ada", 2)).unwrap();
    ctx.create("order:2", order("bob", 3)).unwrap();
    assert_eq!(snapshot.get::<Order>("order:1").unwrap().unwrap().data.total_cents, 1);
    assert!(!snapshot.contains("order:2"));
    assert_eq!(snapshot.state_hash(), hash);
    assert_eq!(ctx.get::<Order>("order:1").unwrap().unwrap().data.total_cents, 2);
}

#[test]
fn the_state_hash_depends_on_content_not_on_history() {
    let mut a = Context::new("a");
    a.create("order:1", order("ada", 1)).unwrap();
    a.create("order:2", order("bob", 2)).unwrap();
    let mut b = Context::new("b");
    b.create("order:2", order("bob", 0)).unwrap();
    b.create("order:1", order("ada", 1)).unwrap();
    assert_ne!(a.state_hash(), b.state_hash());
    b.update("order:2", order("bob", 2)).unwrap();
    assert_eq!(a.state_hash(), b.state_hash());
    b.delete("order:2").unwrap();
    assert_ne!(a.state_hash(), b.state_hash());
}

async fn run_flow() -> Context {
    let mut ctx = Context::new("orders");
    ctx.create("order:1", order("ada", 1200)).unwrap();
    ctx.create("order:2", order("bob", 300)).unwrap();
    let recorder = Recorder::default();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    rt.run().await.unwrap();
    rt.context_mut().update("order:1", order("ada", 1500)).unwrap();
    rt.run().await.unwrap();
    rt.into_context()
}

#[tokio::test]
async fn the_same_seeded_inputs_give_the_same_commit_hashes() {
    let first = run_flow().await;
    let second = run_flow().await;
    let hashes = |ctx: &Context| {
        ctx.log()
            .unwrap()
            .iter()
            .map(|c| (c.hash, c.state_hash))
            .collect::<Vec<_>>()
    };
    assert_eq!(first.log().unwrap().len(), 5);
    assert_eq!(hashes(&first), hashes(&second));
    // The chain links each commit to its parent.
    let log = first.log().unwrap();
    assert_eq!(log[0].parent, None);
    for pair in log.windows(2) {
        assert_eq!(pair[1].parent, Some(pair[0].hash));
        assert_eq!(pair[1].generation.0, pair[0].generation.0 + 1);
    }
    assert_eq!(first.head(), Some(log[4].hash));
    assert_eq!(first.state_hash(), log[4].state_hash);
}

#[tokio::test]
async fn different_inputs_give_different_commit_hashes() {
    let mut a = Context::new("t");
    a.create("order:1", order("ada", 1)).unwrap();
    let mut b = Context::new("t");
    b.create("order:1", order("ada", 2)).unwrap();
    assert_ne!(a.head(), b.head());
}

//! The operator's writes — `outbox retry`, `cancel` and `purge` — through the real binary:
//! each changes the ledger exactly as the store's operation defines (read back with the
//! library), refuses what the store refuses with exit 2, and leaves everything else alone.

mod binary;
mod support;

use std::time::SystemTime;

use binary::store;
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::store::{OutboxStore, SqliteOutbox};
use serde_json::json;

/// The ledger entry of `key`, read with the library.
fn entry(path: &std::path::Path, key: &str) -> Option<reactifact_core::ledger::Delivery> {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let outbox = SqliteOutbox::open_read_only(path).unwrap();
        outbox.get(key).await.unwrap()
    })
}

fn status(path: &std::path::Path, key: &str) -> Option<DeliveryStatus> {
    entry(path, key).map(|d| d.status())
}

#[test]
fn retry_rearms_a_dead_failed_or_held_intent_and_refuses_the_others() {
    let store = store();
    let dead = entry(&store.path, support::DEAD).unwrap();
    let run = store.run(&["outbox", "retry", support::DEAD]).ok();
    assert_eq!(run.stdout, "retried sms:order:3: now pending\n");
    let after = entry(&store.path, support::DEAD).unwrap();
    assert_eq!(after.status(), DeliveryStatus::Pending);
    // Re-armed, not reset: the attempts and the token are the store's, kept.
    assert_eq!((after.attempts(), after.token()), (dead.attempts(), dead.token()));
    assert_eq!(after.last_error(), dead.last_error());

    let doc = store.json(&["outbox", "retry", support::HELD]);
    assert_eq!(doc["retried"][0]["key"], support::HELD);
    assert_eq!(doc["retried"][0]["status"], "pending");
    assert_eq!(status(&store.path, support::HELD), Some(DeliveryStatus::Pending));
    store.run(&["outbox", "retry", support::FAILED]).ok();
    assert_eq!(status(&store.path, support::FAILED), Some(DeliveryStatus::Pending));

    let before = std::fs::read(&store.path).unwrap();
    store.run(&["outbox", "retry", support::DELIVERED]).fails(
        2,
        "intent `email:order:1` is delivered; only failed, dead and held intents can be retried",
    );
    store.run(&["outbox", "retry", support::IN_FLIGHT]).fails(
        2,
        "intent `later:order:7` is in-flight; only failed, dead and held intents can be retried",
    );
    store
        .run(&["outbox", "retry", "nope:1"])
        .fails(2, "no intent with key `nope:1` in the delivery ledger");
    assert_eq!(status(&store.path, support::DELIVERED), Some(DeliveryStatus::Delivered));
    assert_eq!(status(&store.path, support::IN_FLIGHT), Some(DeliveryStatus::InFlight));
    assert_eq!(
        std::fs::read(&store.path).unwrap(),
        before,
        "a refused operation changed nothing"
    );

    store
        .run(&["outbox", "retry"])
        .fails(2, "the following required arguments were not provided");
    store
        .run(&["outbox", "retry", support::DEAD, "--all-dead"])
        .fails(2, "cannot be used with");
    store
        .run(&["outbox", "retry", support::DEAD, "--kind", "sms"])
        .fails(2, "cannot be used with");
}

#[test]
fn retry_all_dead_rearms_every_dead_intent_of_a_kind() {
    let store = store();
    let none = store.run(&["outbox", "retry", "--all-dead", "--kind", "email"]).ok();
    assert_eq!(none.stdout, "nothing to do: no intent matched\n");
    let doc = store.json(&["outbox", "retry", "--all-dead", "--kind", "sms"]);
    let keys: Vec<&str> = doc["retried"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, [support::DEAD]);
    assert_eq!(status(&store.path, support::DEAD), Some(DeliveryStatus::Pending));
    // Nothing else moved: the failed and held ones are not dead.
    assert_eq!(status(&store.path, support::FAILED), Some(DeliveryStatus::Failed));
    assert_eq!(status(&store.path, support::HELD), Some(DeliveryStatus::Held));
    let again = store.json(&["outbox", "retry", "--all-dead"]);
    assert_eq!(again["retried"], serde_json::json!([]));
}

#[test]
fn cancel_cancels_for_good_with_the_reason_and_refuses_delivered_and_in_flight() {
    let store = store();
    let run = store
        .run(&["outbox", "cancel", support::HELD, "--reason", "the customer has no fax"])
        .ok();
    assert_eq!(run.stdout, "cancelled fax:order:5: now cancelled\n");
    let cancelled = entry(&store.path, support::HELD).unwrap();
    assert_eq!(cancelled.status(), DeliveryStatus::Cancelled);
    assert_eq!(cancelled.cancel_reason(), Some("the customer has no fax"));
    let doc = store.json(&["outbox", "cancel", support::PENDING]);
    assert_eq!(
        doc["cancelled"][0]["cancel_reason"],
        "cancelled with the reactifact CLI"
    );
    // A cancelled intent cannot be retried.
    store.run(&["outbox", "retry", support::HELD]).fails(
        2,
        "intent `fax:order:5` is cancelled; only failed, dead and held intents can be retried",
    );

    store
        .run(&["outbox", "cancel", support::IN_FLIGHT])
        .fails(2, "intent `later:order:7` is in-flight and cannot be cancelled");
    store
        .run(&["outbox", "cancel", support::DELIVERED])
        .fails(2, "intent `email:order:1` is delivered and cannot be cancelled");
    store
        .run(&["outbox", "cancel", "nope:1"])
        .fails(2, "no intent with key `nope:1`");
    assert_eq!(status(&store.path, support::IN_FLIGHT), Some(DeliveryStatus::InFlight));
    assert_eq!(status(&store.path, support::DELIVERED), Some(DeliveryStatus::Delivered));
}

#[test]
fn purge_deletes_final_entries_older_than_the_duration_and_remembers_their_keys() {
    let store = store();
    store.run(&["outbox", "cancel", support::HELD]).ok();
    let doc = store.json(&["outbox", "purge", "--delivered", "--older-than", "1h"]);
    assert_eq!(doc["purged"], 0);
    assert_eq!(status(&store.path, support::DELIVERED), Some(DeliveryStatus::Delivered));

    // Delivered only: the cancelled one stays.
    let run = store
        .run(&["outbox", "purge", "--delivered", "--older-than", "0s"])
        .ok();
    assert!(run.stdout.starts_with("purged  3 final entries (delivered)"), "{run:?}");
    for key in [support::DELIVERED, support::DELIVERED_2, support::BRANCH] {
        assert_eq!(status(&store.path, key), None, "{key} purged");
    }
    assert_eq!(status(&store.path, support::HELD), Some(DeliveryStatus::Cancelled));
    // Then the cancelled one, with both flags.
    let doc = store.json(&["outbox", "purge", "--cancelled", "--delivered", "--older-than", "0s"]);
    assert_eq!(doc["purged"], 1);
    assert_eq!(doc["statuses"], json!(["delivered", "cancelled"]));
    assert_eq!(status(&store.path, support::HELD), None, "the cancelled one purged");
    for key in [support::DEAD, support::FAILED, support::PENDING, support::IN_FLIGHT] {
        assert!(status(&store.path, key).is_some(), "{key} kept");
    }
    store
        .run(&["outbox", "show", support::DELIVERED])
        .fails(2, "no intent with key `email:order:1`");
    // The store remembers purged keys: the log's acts still verify.
    store.run(&["verify"]).ok();
    let stats = store.json(&["outbox", "stats"]);
    assert_eq!(stats["counts"]["total"], 4);

    store
        .run(&["outbox", "purge", "--delivered", "--older-than", "soon"])
        .fails(2, "`soon` is not a duration");
    store
        .run(&["outbox", "purge", "--older-than", "1d"])
        .fails(2, "--delivered");
    store.run(&["outbox", "purge", "--cancelled"]).fails(2, "--older-than");
    store.run(&["outbox", "purge", "--delivered"]).fails(2, "--older-than");
}

#[test]
fn operator_writes_are_fenced_against_a_drain_holding_the_intent() {
    // The in-flight intent is held by a (dead) drain's claim: the CLI cannot cancel or retry
    // it, and once its holder records an outcome, the store's fencing still applies.
    let store = store();
    let held = entry(&store.path, support::IN_FLIGHT).unwrap();
    let token = held.lease().unwrap().token;
    store
        .run(&["outbox", "cancel", support::IN_FLIGHT])
        .fails(2, "cannot be cancelled");
    // The holder's late outcome is still accepted: nothing the CLI did took its claim.
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let recorded = rt.block_on(async {
        let outbox = SqliteOutbox::open(&store.path).unwrap();
        outbox
            .record(
                &[reactifact_core::store::Recording {
                    key: held.key().clone(),
                    token,
                    outcome: reactifact_core::store::Outcome::Delivered,
                }],
                SystemTime::now(),
            )
            .await
            .unwrap()
    });
    assert_eq!(
        recorded,
        [reactifact_core::store::Recorded::Accepted(DeliveryStatus::Delivered)]
    );
    store
        .run(&["outbox", "retry", support::IN_FLIGHT])
        .fails(2, "is delivered; only failed, dead and held intents can be retried");
}

#[test]
fn the_read_only_outbox_the_reading_commands_use_refuses_every_write() {
    let store = store();
    let before = std::fs::read(&store.path).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let outbox = SqliteOutbox::open_read_only(&store.path).unwrap();
        let retry = outbox.retry(support::DEAD, SystemTime::now()).await;
        assert!(
            matches!(
                retry,
                Err(reactifact_core::error::RetryError::Store(
                    reactifact_core::error::StoreError::ReadOnly { .. }
                ))
            ),
            "{retry:?}"
        );
        let cancel = outbox.cancel(support::HELD, "no", SystemTime::now()).await;
        assert!(
            matches!(cancel, Err(reactifact_core::error::CancelError::Store(_))),
            "{cancel:?}"
        );
        assert!(outbox
            .purge(reactifact_core::ledger::PurgeFilter::Final, SystemTime::now(), 100)
            .await
            .is_err());
        assert_eq!(
            outbox.get(support::DEAD).await.unwrap().unwrap().status(),
            DeliveryStatus::Dead
        );
    });
    assert_eq!(std::fs::read(&store.path).unwrap(), before);
    assert_eq!(status(&store.path, support::HELD), Some(DeliveryStatus::Held));
}

#[test]
fn the_cli_works_while_another_process_has_the_store_open_for_writing() {
    let store = store();
    // An application's context and outbox hold the file open (its -wal and -shm exist).
    let ctx = reactifact_core::Context::open(&store.path, "orders").unwrap();
    let outbox = SqliteOutbox::open(&store.path).unwrap();
    assert!(
        store.dir.path().join("store.db-wal").exists(),
        "the file is open in WAL mode"
    );
    assert_eq!(store.json(&["outbox", "stats"])["counts"]["dead"], 1);
    assert_eq!(store.json(&["log", "--session", "orders"])["generation"], 4);
    store.run(&["verify"]).ok();
    store.run(&["outbox", "retry", support::DEAD]).ok();
    // The application sees the operator's retry at once: the ledger is the file's.
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let seen = rt.block_on(outbox.get(support::DEAD)).unwrap().unwrap();
    assert_eq!(seen.status(), DeliveryStatus::Pending);
    assert_eq!(
        rt.block_on(ctx.ledger().counts()).unwrap().dead,
        0,
        "the context's ledger reads the same table"
    );
}

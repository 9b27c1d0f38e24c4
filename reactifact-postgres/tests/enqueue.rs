//! The transactional outbox on PostgreSQL: an application writes its own row and an intent in
//! one tokio-postgres transaction of its own (`PostgresOutbox::register`); a drainer of the
//! store delivers what committed, once, and nothing of what rolled back. Runs when
//! `REACTIFACT_TEST_POSTGRES_URL` is set (see `common`).

mod common;

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::store::{Enqueue, OutboxStore, ENQUEUED_SESSION};
use reactifact_core::{DispatchError, Drainer, Intent, Ledger, Scope};

use common::Schemas;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_written_in_the_applications_transaction_is_delivered_once_and_a_rolled_back_one_never() {
    let Some(url) = common::url("an_intent_written_in_the_applications_transaction_is_delivered_once") else {
        return;
    };
    let schemas = Schemas::new(&url, "enqueue");
    let outbox = schemas.open().await;
    let app_schema = schemas.name();
    let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "CREATE SCHEMA \"{app_schema}\"; CREATE TABLE \"{app_schema}\".accounts (id bigint PRIMARY KEY, email text)"
        ))
        .await
        .unwrap();
    for (id, commit) in [(1i64, true), (2, false)] {
        let tx = client.transaction().await.unwrap();
        let email = format!("user{id}@example.com");
        tx.execute(
            &format!("INSERT INTO \"{app_schema}\".accounts (id, email) VALUES ($1, $2)"),
            &[&id, &email],
        )
        .await
        .unwrap();
        let intents = [
            Enqueue::new("email", format!("welcome:{id}"), &email)
                .group(format!("user:{id}"))
                .build()
                .unwrap(),
            Enqueue::new("email", format!("survey:{id}"), &email)
                .group(format!("user:{id}"))
                .build()
                .unwrap(),
        ];
        outbox.register(&tx, &intents, SystemTime::now()).await.unwrap();
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
    }
    let ledger = Ledger::new(outbox.clone());
    let survey = ledger.get("survey:1").await.unwrap().unwrap();
    assert_eq!(
        (survey.status(), survey.origin().session()),
        (DeliveryStatus::Blocked, ENQUEUED_SESSION)
    );
    assert!(ledger.get("welcome:2").await.unwrap().is_none(), "rolled back: nothing");

    let (drainer, sent) = recording_drainer(outbox.clone(), None);
    assert_eq!(drainer.settle().await.unwrap().delivered, 2);
    assert_eq!(*sent.lock().unwrap(), ["welcome:1", "survey:1"]);
    let counts = outbox.counts(&Scope::all()).await.unwrap();
    assert_eq!((counts.delivered, counts.total()), (2, 2));
}

/// A serving drainer that polls once an hour still delivers an intent enqueued in a
/// transaction that commits after it polled: the registration's notification goes out with
/// the commit and wakes it. (The wait below is bounded; the test fails if it never comes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_after_the_drainer_polled_wakes_it() {
    let Some(url) = common::url("a_commit_after_the_drainer_polled_wakes_it") else {
        return;
    };
    let schemas = Schemas::new(&url, "enqueue_wake");
    let outbox = schemas.open().await;
    let (drainer, sent) = recording_drainer(outbox.clone(), Some(std::time::Duration::from_secs(3600)));
    let stop = drainer.stop_handle();
    let early = Enqueue::new("email", "early:1", &"x").build().unwrap();
    outbox.register_alone(&[early], SystemTime::now()).await.unwrap();
    let serving = tokio::spawn(async move { drainer.serve(stop).await });
    // Bounded waits for what the drainer sends.
    let sends = |n: usize| {
        let sent = sent.clone();
        async move {
            for _ in 0..3000 {
                if sent.lock().unwrap().len() >= n {
                    return sent.lock().unwrap().clone();
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            panic!("the drainer never sent {n}: {:?}", sent.lock().unwrap());
        }
    };
    // It has delivered what there was, so it has looked, and now sleeps for an hour.
    assert_eq!(sends(1).await, ["early:1"]);
    let mut client = outbox.pool().get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let intent = Enqueue::new("email", "late:1", &"x").build().unwrap();
    outbox.register(&*tx, &[intent], SystemTime::now()).await.unwrap();
    let ledger = Ledger::new(outbox.clone());
    assert!(
        ledger.get("late:1").await.unwrap().is_none(),
        "not visible before the commit"
    );
    tx.commit().await.unwrap();
    assert_eq!(
        sends(2).await,
        ["early:1", "late:1"],
        "woken by the commit's notification"
    );
    serving.abort();
}

/// A drainer of `outbox` (polling every `poll`, if given) whose dispatcher records the keys it
/// is handed, in order.
fn recording_drainer(
    outbox: Arc<reactifact_postgres::PostgresOutbox>,
    poll: Option<std::time::Duration>,
) -> (Drainer, Arc<Mutex<Vec<String>>>) {
    let sent: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = sent.clone();
    let mut builder = Drainer::builder(outbox, move |intent: Intent| {
        record.lock().unwrap().push(intent.key().to_string());
        async { Ok::<(), DispatchError>(()) }
    });
    if let Some(poll) = poll {
        builder = builder.poll_interval(poll);
    }
    (builder.build().unwrap(), sent)
}

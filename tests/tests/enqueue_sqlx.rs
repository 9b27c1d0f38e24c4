//! The transactional outbox through sqlx (`reactifact-postgres`'s feature `sqlx`): an
//! application's sqlx transaction writes its row and an intent; a drainer delivers what
//! committed, once, and nothing of what rolled back. Runs when `REACTIFACT_TEST_POSTGRES_URL`
//! is set.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use reactifact_core::store::Enqueue;
use reactifact_core::{DispatchError, Drainer, Intent, Ledger};
use reactifact_postgres::{PostgresOptions, PostgresOutbox};
use sqlx::Connection as _;

/// The registration's future is `Send`: it can be awaited in a spawned task or a handler.
#[allow(dead_code)]
fn the_registration_future_is_send(outbox: &PostgresOutbox, conn: &mut sqlx::PgConnection) {
    fn send<T: Send>(_: T) {}
    send(outbox.register_sqlx(conn, &[], SystemTime::now()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_written_in_an_sqlx_transaction_is_delivered_once_and_a_rolled_back_one_never() {
    let Ok(url) = std::env::var("REACTIFACT_TEST_POSTGRES_URL") else {
        eprintln!("skipped: REACTIFACT_TEST_POSTGRES_URL is not set");
        return;
    };
    let schema = format!("rft_sqlx_{}", std::process::id());
    let outbox = PostgresOutbox::open(PostgresOptions::new(&url).schema(&schema))
        .await
        .expect("the store opens");
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("an sqlx connection");
    sqlx::query(&format!(
        "CREATE TABLE \"{schema}\".app_accounts (id bigint PRIMARY KEY)"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    for (id, commit) in [(1i64, true), (2, false)] {
        let mut tx = conn.begin().await.unwrap();
        sqlx::query(&format!("INSERT INTO \"{schema}\".app_accounts (id) VALUES ($1)"))
            .bind(id)
            .execute(&mut *tx)
            .await
            .unwrap();
        let intents = [
            Enqueue::new("email", format!("welcome:{id}"), &id)
                .group(format!("user:{id}"))
                .build()
                .unwrap(),
            Enqueue::new("email", format!("survey:{id}"), &id)
                .group(format!("user:{id}"))
                .build()
                .unwrap(),
        ];
        outbox
            .register_sqlx(&mut tx, &intents, SystemTime::now())
            .await
            .unwrap();
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
    }
    let ledger = Ledger::new(outbox.clone());
    assert!(ledger.get("welcome:2").await.unwrap().is_none(), "rolled back: nothing");
    let sent: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = sent.clone();
    let drainer = Drainer::builder(outbox.clone(), move |intent: Intent| {
        record.lock().unwrap().push(intent.key().to_string());
        async { Ok::<(), DispatchError>(()) }
    })
    .build()
    .unwrap();
    let delivered = drainer.settle().await.unwrap().delivered;
    sqlx::query(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(delivered, 2);
    assert_eq!(*sent.lock().unwrap(), ["welcome:1", "survey:1"]);
}

//! The transactional outbox on SQLite: an application writes its own row and an intent in one
//! transaction of its own connection to the store's file (`register_in`); the store's drainers
//! deliver what committed, once, with the same rules as a committed intent (here an ordering
//! group), and nothing of what rolled back. `verify` takes the file as it is.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::store::rusqlite::{Connection, TransactionBehavior};
use reactifact_core::store::OutboxStore;
use reactifact_core::store::{register_in, Enqueue, SqliteOutbox, ENQUEUED_SESSION};
use reactifact_core::{Context, DispatchError, Drainer, Intent, Ledger, Scope};

/// Opens the application's own connection to the store's file.
fn app_connection(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute_batch("CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, email TEXT NOT NULL)")
        .unwrap();
    conn
}

/// Signs up `id` in one transaction of the application: its row and its welcome email, then
/// commits or rolls back.
fn sign_up(conn: &mut Connection, id: i64, commit: bool) {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let email = format!("user{id}@example.com");
    tx.execute("INSERT INTO accounts (id, email) VALUES (?1, ?2)", (id, &email))
        .unwrap();
    let welcome = Enqueue::new("email", format!("welcome:{id}"), &email).build().unwrap();
    let onboarding = Enqueue::new("email", format!("tips:{id}"), &email)
        .group(format!("user:{id}"))
        .build()
        .unwrap();
    let follow_up = Enqueue::new("email", format!("survey:{id}"), &email)
        .group(format!("user:{id}"))
        .build()
        .unwrap();
    register_in(&tx, &[welcome, onboarding, follow_up], SystemTime::now()).unwrap();
    if commit {
        tx.commit().unwrap();
    } else {
        tx.rollback().unwrap();
    }
}

#[tokio::test]
async fn an_intent_written_in_the_applications_transaction_is_delivered_once_and_a_rolled_back_one_never() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    drop(Context::open(&path, "orders").unwrap()); // the store's file, at this build's schema
    let mut conn = app_connection(&path);
    sign_up(&mut conn, 1, true);
    sign_up(&mut conn, 2, false);
    let accounts: i64 = conn
        .query_row("SELECT count(*) FROM accounts", [], |r| r.get(0))
        .unwrap();
    assert_eq!(accounts, 1, "the rolled-back row is gone");

    let outbox = SqliteOutbox::open(&path).unwrap();
    let ledger = Ledger::new(outbox.clone());
    let survey = ledger.get("survey:1").await.unwrap().unwrap();
    assert_eq!(
        (survey.status(), survey.origin().session(), survey.generation().0),
        (DeliveryStatus::Blocked, ENQUEUED_SESSION, 0),
        "behind tips:1 in its group; no commit made it"
    );
    let (drainer, sent) = recording_drainer(outbox.clone(), None);
    let report = drainer.settle().await.unwrap();
    assert_eq!(report.delivered, 3);
    let sent = sent.lock().unwrap().clone();
    let position = |key: &str| sent.iter().position(|k| k == key).unwrap();
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert!(position("tips:1") < position("survey:1"), "{sent:?}");
    assert!(ledger.get("welcome:2").await.unwrap().is_none(), "rolled back: nothing");

    // The same key again (a retried request): not registered twice.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let again = Enqueue::new("email", "welcome:1", &"again").build().unwrap();
    register_in(&tx, &[again], SystemTime::now()).unwrap();
    tx.commit().unwrap();
    assert_eq!(drainer.settle().await.unwrap().delivered, 0);
    let counts = outbox.counts(&Scope::all()).await.unwrap();
    assert_eq!((counts.delivered, counts.total()), (3, 3));

    // The store's own checks take the enqueued rows as they are: outside the log.
    Context::open(&path, "orders").unwrap().verify().unwrap();
}

#[test]
fn a_file_that_is_not_a_store_of_this_schema_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain.db");
    let mut conn = app_connection(&path);
    let tx = conn.transaction().unwrap();
    let intent = Enqueue::new("email", "k", &1).build().unwrap();
    let e = register_in(&tx, &[intent], SystemTime::now()).unwrap_err();
    assert!(e.to_string().contains("open it once with `Context::open`"), "{e}");
    drop(tx);
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master WHERE name = 'outbox'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(tables, 0);
}

#[test]
fn an_empty_group_is_refused() {
    let e = Enqueue::new("email", "k", &1).group("").build().unwrap_err();
    assert!(
        matches!(e, reactifact_core::error::EffectError::EmptyGroup { .. }),
        "{e}"
    );
}

/// An enqueued intent whose payload was changed in the table afterwards is never sent: a
/// claim holds it, and `verify` names it.
#[tokio::test]
async fn an_enqueued_payload_flipped_in_the_table_is_held_and_named_by_verify() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    drop(Context::open(&path, "orders").unwrap());
    let mut conn = app_connection(&path);
    sign_up(&mut conn, 1, true);
    // One byte of welcome:1's payload, changed (the last byte of the row's bytes).
    conn.execute(
        "UPDATE outbox SET bytes = substr(bytes, 1, length(bytes) - 1) || x'21' WHERE key = 'welcome:1'",
        [],
    )
    .unwrap();
    let err = Context::open(&path, "orders").unwrap().verify().unwrap_err();
    assert!(err.to_string().contains("welcome:1"), "{err}");

    let outbox = SqliteOutbox::open(&path).unwrap();
    let (drainer, sent) = recording_drainer(outbox.clone(), None);
    drainer.settle().await.unwrap();
    let sent = sent.lock().unwrap().clone();
    assert!(!sent.contains(&"welcome:1".to_owned()), "{sent:?}");
    let held = Ledger::new(outbox.clone()).get("welcome:1").await;
    assert!(
        matches!(&held, Ok(Some(d)) if d.status() == DeliveryStatus::Held) || held.is_err(),
        "{held:?}"
    );
}

/// A drainer of `outbox` (polling every `poll`, if given) whose dispatcher records the keys it
/// is handed, in order.
fn recording_drainer(
    outbox: Arc<SqliteOutbox>,
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

/// Times from outside at the edges: before the Unix epoch is the epoch (due at once); past the
/// year 9999 is then (registered, never due in practice), never an overflow.
#[tokio::test]
async fn not_before_at_the_edges_of_time_is_clamped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    drop(Context::open(&path, "orders").unwrap());
    let mut conn = app_connection(&path);
    let far = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::MAX / 4);
    let early = SystemTime::UNIX_EPOCH - Duration::from_secs(3600);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let intents = [
        Enqueue::new("email", "far", &1).not_before(far).build().unwrap(),
        Enqueue::new("email", "early", &1).not_before(early).build().unwrap(),
    ];
    register_in(&tx, &intents, SystemTime::now()).unwrap();
    tx.commit().unwrap();
    let outbox = SqliteOutbox::open(&path).unwrap();
    let ledger = Ledger::new(outbox.clone());
    let far_entry = ledger.get("far").await.unwrap().unwrap();
    assert_eq!(
        far_entry.not_before(),
        Some(SystemTime::UNIX_EPOCH + reactifact_core::FAR_FUTURE)
    );
    assert_eq!(
        ledger.get("early").await.unwrap().unwrap().not_before(),
        Some(SystemTime::UNIX_EPOCH)
    );
    let (drainer, sent) = recording_drainer(outbox.clone(), None);
    drainer.flush().await.unwrap();
    assert_eq!(*sent.lock().unwrap(), ["early"], "the far one is not due");
}

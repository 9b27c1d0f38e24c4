//! The SQLite store keeps each intent's trace context beside it (schema 6, the `trace_parent`
//! column): written when the commit registers the intent, handed over by every claim and
//! read back by every ledger read, also after a reopen and from another connection. It is
//! advisory and outside the row digest: a damaged value reads as no trace context (or as
//! another valid one), and the row is still delivered, never held. A version-5 file reads as
//! it is and migrates it (to the current version) without rewriting a row.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::*;
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::TraceParent;
use reactifact_core::store::{ClaimPolicy, ClaimRequest, OutboxStore, SqliteOutbox};
use reactifact_core::{Agent, Context, DispatchError, Intent, OpenOptions, Runtime, Scope};

/// Commits orders `1..=count` of session `main` and the `notify:order:{i}` intents their
/// produce acts in one turn (no dispatcher: they stay pending).
async fn store_with(dir: &Path, count: u64) -> PathBuf {
    let path = dir.join("state.db");
    commit_orders(&path, "main", 1..=count).await;
    path
}

/// The trace context the ledger keeps for `key`.
async fn kept(outbox: &dyn OutboxStore, key: &str) -> Option<TraceParent> {
    outbox
        .get(key)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no entry for {key}"))
        .intent()
        .trace_parent()
        .copied()
}

/// Runs `sql` on the file directly, as something outside reactifact would.
fn tamper(path: &Path, sql: &str) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(sql).unwrap();
}

fn user_version(path: &Path) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

/// Every row's key and digest, in key order.
fn digests(path: &Path) -> Vec<(String, Vec<u8>)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut stmt = conn.prepare("SELECT key, digest FROM outbox ORDER BY key").unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows
}

/// A moment after every registration of the test.
fn later() -> SystemTime {
    SystemTime::now() + Duration::from_secs(1)
}

/// Claims up to `limit` intents of the whole outbox as `who`.
async fn claim(outbox: &dyn OutboxStore, limit: usize) -> reactifact_core::store::Claimed {
    let owner: Arc<str> = Arc::from("drainer");
    outbox
        .claim(ClaimRequest {
            scope: &Scope::all(),
            limit,
            owner: &owner,
            lease: Duration::from_secs(30),
            now: later(),
            policy: ClaimPolicy::none(),
        })
        .await
        .unwrap()
}

/// A key and the trace context its intent was handed to the dispatcher with.
type Sent = (String, Option<TraceParent>);

/// A dispatcher that records the key and the trace context each intent is handed with.
#[derive(Clone, Default)]
struct TraceRecorder {
    sent: Arc<Mutex<Vec<Sent>>>,
}

impl TraceRecorder {
    fn dispatcher(&self) -> impl Fn(Intent) -> std::future::Ready<Result<(), DispatchError>> + Send + Sync + 'static {
        let sent = self.sent.clone();
        move |intent: Intent| {
            sent.lock()
                .unwrap()
                .push((intent.key().to_string(), intent.trace_parent().copied()));
            std::future::ready(Ok(()))
        }
    }

    fn sent(&self) -> Vec<Sent> {
        let mut sent = self.sent.lock().unwrap().clone();
        sent.sort_by(|a, b| a.0.cmp(&b.0));
        sent
    }
}

#[tokio::test]
async fn a_committed_intent_keeps_its_trace_context_in_the_file_and_another_process_delivers_in_its_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_with(dir.path(), 2).await;
    assert_eq!(user_version(&path), 9);
    // Kept as the 25 bytes of its encoding.
    let stored: Vec<Vec<u8>> = {
        let conn = rusqlite::Connection::open(&path).unwrap();
        let mut stmt = conn.prepare("SELECT trace_parent FROM outbox ORDER BY key").unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
        rows
    };
    assert_eq!(stored.len(), 2);
    assert!(stored.iter().all(|b| b.len() == TraceParent::ENCODED_LEN), "{stored:?}");

    // Another connection (a standalone drainer's) reads the same trace context; both runs of
    // the turn share its trace id, each with a span of its own.
    let outbox = SqliteOutbox::open(&path).unwrap();
    let one = kept(&*outbox, "notify:order:1").await.expect("a trace context");
    let two = kept(&*outbox, "notify:order:2").await.expect("a trace context");
    assert_eq!(one.trace_id(), two.trace_id(), "one turn, one trace");
    assert_ne!(one.parent_id(), two.parent_id(), "each run is a span of its own");
    assert_eq!(TraceParent::from_bytes(&stored[0]), Some(one));

    // A read-only context reads it too, and the log (which does not hash it) verifies.
    let audit = Context::open_with(&path, "main", OpenOptions::new().read_only(true)).unwrap();
    assert_eq!(kept(&**audit.ledger().outbox(), "notify:order:1").await, Some(one));
    audit.verify().expect("the trace context is not part of the log");
    drop(audit);

    // A claim hands it over as stored.
    let taken = claim(&*outbox, 10).await;
    assert!(taken.integrity.is_empty(), "{:?}", taken.integrity);
    let handed: Vec<Option<TraceParent>> = taken
        .claims
        .iter()
        .map(|d| d.intent().trace_parent().copied())
        .collect();
    assert_eq!(handed, [Some(one), Some(two)]);
    let recordings = taken
        .claims
        .iter()
        .map(|d| reactifact_core::store::Recording {
            key: d.key().clone(),
            token: d.token(),
            outcome: reactifact_core::store::Outcome::Released,
        })
        .collect::<Vec<_>>();
    outbox.record(&recordings, later()).await.unwrap();
    outbox.close().await;
    drop(outbox);

    // A runtime of another process (a new open of the file) delivers each intent in the trace
    // of the run that committed it: the same trace id, the delivery span as the parent.
    let recorder = TraceRecorder::default();
    let ctx = Context::open(&path, "main").unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    rt.settle().await.unwrap();
    let sent = recorder.sent();
    assert_eq!(sent.len(), 2, "{sent:?}");
    for ((key, trace), stored) in sent.iter().zip([one, two]) {
        let trace = trace.unwrap_or_else(|| panic!("{key} was handed no trace context"));
        assert_eq!(trace.trace_id(), stored.trace_id(), "{key}: the producing run's trace");
        assert_ne!(trace.parent_id(), stored.parent_id(), "{key}: the delivery's own span");
    }
    // Delivered, the ledger still reads the producing run's context.
    assert_eq!(
        kept(&**rt.context().ledger().outbox(), "notify:order:1").await,
        Some(one)
    );
}

#[tokio::test]
async fn a_damaged_trace_context_reads_as_none_or_another_and_the_row_is_still_delivered_never_held() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_with(dir.path(), 5).await;
    let before = digests(&path);
    let original = {
        let outbox = SqliteOutbox::open(&path).unwrap();
        kept(&*outbox, "notify:order:4").await.expect("a trace context")
    };
    tamper(
        &path,
        "UPDATE outbox SET trace_parent = x'00' WHERE key = 'notify:order:1';
         UPDATE outbox SET trace_parent = zeroblob(25) WHERE key = 'notify:order:2';
         UPDATE outbox SET trace_parent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
             WHERE key = 'notify:order:3';
         UPDATE outbox SET trace_parent = 42 WHERE key = 'notify:order:5';",
    );
    // A flipped byte of the trace id: another valid context.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        let mut bytes: Vec<u8> = conn
            .query_row(
                "SELECT trace_parent FROM outbox WHERE key = 'notify:order:4'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        bytes[0] ^= 0xff;
        conn.execute(
            "UPDATE outbox SET trace_parent = ?1 WHERE key = 'notify:order:4'",
            [&bytes],
        )
        .unwrap();
    }
    assert_eq!(digests(&path), before, "the trace context is outside the digest");
    let outbox = SqliteOutbox::open(&path).unwrap();
    for key in ["notify:order:1", "notify:order:2", "notify:order:3", "notify:order:5"] {
        assert_eq!(
            kept(&*outbox, key).await,
            None,
            "{key}: a value that does not decode is none"
        );
    }
    let flipped = kept(&*outbox, "notify:order:4").await.expect("still a valid context");
    assert_ne!(flipped, original);
    assert_eq!(flipped.parent_id(), original.parent_id());

    let taken = claim(&*outbox, 10).await;
    assert!(
        taken.integrity.is_empty(),
        "a damaged trace context holds nothing: {:?}",
        taken.integrity
    );
    let handed: Vec<(String, Option<TraceParent>)> = taken
        .claims
        .iter()
        .map(|d| (d.key().to_string(), d.intent().trace_parent().copied()))
        .collect();
    assert_eq!(
        handed,
        [
            ("notify:order:1".to_owned(), None),
            ("notify:order:2".to_owned(), None),
            ("notify:order:3".to_owned(), None),
            ("notify:order:4".to_owned(), Some(flipped)),
            ("notify:order:5".to_owned(), None),
        ]
    );
    let recordings = taken
        .claims
        .iter()
        .map(|d| reactifact_core::store::Recording {
            key: d.key().clone(),
            token: d.token(),
            outcome: reactifact_core::store::Outcome::Delivered,
        })
        .collect::<Vec<_>>();
    outbox.record(&recordings, later()).await.unwrap();
    let page = outbox.list(&Default::default()).await.unwrap();
    assert_eq!(page.entries.len(), 5);
    assert!(page.entries.iter().all(|d| d.status() == DeliveryStatus::Delivered));
    outbox.close().await;
    let ctx = Context::open(&path, "main").unwrap();
    ctx.verify().expect("a damaged trace context is not a damaged row");
}

#[tokio::test]
async fn a_schema_5_file_reads_as_it_is_and_migrates_to_schema_6_keeping_every_digest() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_with(dir.path(), 2).await;
    // The file as a build of schema 5 left it: no trace context (and no group of schema 7).
    tamper(
        &path,
        "DROP TABLE call_answers; DROP INDEX commits_hash; ALTER TABLE outbox DROP COLUMN decided_digest;
         DROP TABLE outbox_rates; DROP INDEX outbox_kind_due; DROP INDEX outbox_group_open; ALTER TABLE outbox DROP COLUMN grp;
         ALTER TABLE outbox DROP COLUMN trace_parent; PRAGMA user_version = 5;",
    );
    let before = digests(&path);

    // Read-only: read as it is (no trace context), the file unchanged.
    {
        let ctx = Context::open_with(&path, "main", OpenOptions::new().read_only(true)).unwrap();
        let d = ctx.ledger().get("notify:order:1").await.unwrap().unwrap();
        assert_eq!((d.status(), d.intent().trace_parent()), (DeliveryStatus::Pending, None));
        assert_eq!(ctx.ledger().entries().await.unwrap().len(), 2);
        ctx.verify().expect("a version-5 file verifies as it is");
    }
    {
        let outbox = SqliteOutbox::open_read_only(&path).unwrap();
        assert_eq!(kept(&*outbox, "notify:order:2").await, None);
    }
    assert_eq!(user_version(&path), 5, "a read-only open migrates nothing");

    // Writable: migrated; no row rewritten; the old rows read without trace context and are
    // delivered; a new intent keeps its own.
    let recorder = TraceRecorder::default();
    let mut ctx = Context::open(&path, "main").unwrap();
    assert_eq!(user_version(&path), 9);
    assert_eq!(digests(&path), before, "the migration rewrites no row");
    ctx.verify().expect("the log verifies after the migration");
    assert_eq!(kept(&**ctx.ledger().outbox(), "notify:order:1").await, None);
    ctx.create("order:3", order("bob", 3)).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    rt.run().await.unwrap();
    rt.settle().await.unwrap();
    let sent = recorder.sent();
    let keys: Vec<&str> = sent.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["notify:order:1", "notify:order:2", "notify:order:3"]);
    let new = kept(&**rt.context().ledger().outbox(), "notify:order:3")
        .await
        .expect("a new intent keeps its trace context");
    assert_eq!(sent[2].1.map(|t| t.trace_id()), Some(new.trace_id()));
}

//! A SQLite file in schema version 2, kept in `tests/fixtures/v2/`, migrates to schema 3 (the
//! checkpoints table) at its first writable open and then reopens from a checkpoint with the
//! state, queued events, log and ledger it held. A read-only open reads it as it is, writing
//! nothing (version 3 only adds a table, so a version-2 file needs no migration to be read).
//!
//! The file was written by `regenerate_v2_fixtures` (ignored) with the code of schema
//! version 2 (main at 7d2e359); it can no longer be regenerated — that is its point.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use reactifact_core::{Agent, Context, Runtime};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/v2")
        .join(name)
}

/// Writes the fixture into `tests/fixtures/v2/`. Run only with the code of schema version 2:
/// `cargo test -p reactifact-core --test v2_fixtures -- --ignored regenerate`.
#[tokio::test]
#[ignore = "writes the checked-in fixture; only meaningful with the code of schema version 2"]
async fn regenerate_v2_fixtures() {
    let out = fixture("");
    std::fs::create_dir_all(&out).unwrap();
    let path = out.join("orders.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    {
        let recorder = Recorder::default();
        let mut main = Runtime::builder(Context::open(&path, "main").unwrap())
            .agent(Agent::new("billing").produce(process_order()))
            .dispatcher(recorder.dispatcher())
            .build()
            .unwrap();
        // 30 orders, one commit each, then a turn: receipts and delivered intents.
        for i in 1..=30 {
            main.context_mut()
                .create(format!("order:{i}"), order("ada", i))
                .unwrap();
        }
        main.run().await.unwrap();
        let branch = main.context().fork("what-if").unwrap();
        let mut branch = Runtime::builder(branch)
            .agent(Agent::new("billing").produce(process_order()))
            .build()
            .unwrap();
        branch.context_mut().create("order:40", order("bob", 40)).unwrap();
        branch.run().await.unwrap();
        main.context_mut().create("order:31", order("eve", 31)).unwrap();
        main.context_mut().merge(branch.context()).unwrap();
        main.context_mut().update("order:1", order("ada", 1001)).unwrap();
        main.context_mut().link("order:1", "next", "order:2").unwrap();
        // Left queued: the merge's, order:31's and the update's events.
    }
    // Fold the WAL into the file, so the fixture is one file.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "journal_mode", "DELETE").unwrap();
}

/// A writable copy of the fixture.
fn copy_of(name: &str, dir: &Path) -> PathBuf {
    let to = dir.join(name);
    std::fs::copy(fixture(name), &to).unwrap();
    to
}

fn user_version(path: &Path) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap()
}

fn has_table(path: &Path, table: &str) -> bool {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
            [table],
            |row| row.get(0),
        )
        .unwrap()
}

/// What a session of the fixture reads as.
fn summary(
    ctx: &Context,
) -> (
    reactifact_core::audit::StateHash,
    Vec<reactifact_core::audit::Event>,
    Vec<reactifact_core::audit::CommitHash>,
) {
    (
        ctx.state_hash(),
        ctx.events().cloned().collect(),
        ctx.log().unwrap().iter().map(|c| c.hash).collect(),
    )
}

#[tokio::test]
async fn a_version_2_file_reads_as_it_is_and_migrates_to_checkpoints_at_its_first_writable_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of("orders.db", dir.path());
    let read_only = reactifact_core::OpenOptions::new().read_only(true);

    // Read-only: the file is read without a migration, and left as it was.
    let before = std::fs::read(&path).unwrap();
    let main = Context::open_with(&path, "main", read_only.clone()).unwrap();
    main.verify().unwrap();
    let expected = summary(&main);
    assert_eq!(main.generation().0, 35);
    // order:31's, the merge's three (order:40, its receipt and its intent) and the update's.
    assert_eq!(main.queued_events(), 5);
    assert!(
        main.get::<Order>("order:40").unwrap().is_some(),
        "the branch's order came in"
    );
    assert!(matches!(
        main.checkpoint().await,
        Err(reactifact_core::error::StoreError::ReadOnly { .. })
    ));
    // The attempt history of a file without one: no attempt ended, none in flight.
    let ledger = main.ledger();
    let page = ledger
        .outbox()
        .list(&reactifact_core::ledger::LedgerQuery::default())
        .await
        .unwrap();
    assert!(!page.entries.is_empty());
    for entry in &page.entries {
        assert_eq!(ledger.attempts(entry.key().as_str()).await.unwrap(), Some(Vec::new()));
    }
    assert_eq!(ledger.attempts("no-such-key").await.unwrap(), None);
    drop((main, ledger));
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(user_version(&path), 2);

    // The first writable open migrates: the current version, an empty checkpoints table and attempt
    // history.
    let main = Context::open(&path, "main").unwrap();
    assert_eq!(user_version(&path), 9);
    assert!(has_table(&path, "checkpoints"));
    assert!(has_table(&path, "outbox_attempts"));
    assert_eq!(summary(&main), expected);
    main.verify().unwrap();
    assert_eq!(
        main.checkpoint().await.unwrap(),
        Some(reactifact_core::runtime::Generation(35))
    );
    let branch = Context::open(&path, "what-if").unwrap();
    assert_eq!(
        branch.checkpoint().await.unwrap(),
        Some(reactifact_core::runtime::Generation(33))
    );
    drop((main, branch));

    // Reopened from that checkpoint (the first commit's runs no longer decode: it is not read).
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("UPDATE commits SET runs = x'c1' WHERE session = 'main' AND generation = 1;")
        .unwrap();
    drop(conn);
    let main = Context::open(&path, "main").unwrap();
    assert_eq!(
        (main.state_hash(), main.events().cloned().collect::<Vec<_>>()),
        (expected.0, expected.1)
    );
    assert!(main.verify().is_err(), "verify reads the damaged commit");
    let branch = Context::open_with(&path, "what-if", read_only).unwrap();
    assert!(branch.get::<Order>("order:40").unwrap().is_some());
}

#[test]
fn the_sessions_of_a_version_2_file_are_listed_without_changing_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of("orders.db", dir.path());
    let before = std::fs::read(&path).unwrap();
    let sessions = reactifact_core::store::list_sessions(&path).unwrap();
    let main = sessions
        .iter()
        .find(|s| s.name == "main")
        .expect("the fixture's main session");
    assert_eq!(main.generation.0, 35);
    assert!(sessions.len() >= 2, "main and its branch: {sessions:?}");
    assert_eq!(std::fs::read(&path).unwrap(), before, "listing wrote to the file");
    assert_eq!(user_version(&path), 2);
}

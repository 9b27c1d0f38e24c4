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
            main.context_mut().create(format!("order:{i}"), order("ada", i)).unwrap();
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

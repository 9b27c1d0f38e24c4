//! Opening a SQLite store never changes what it refuses, and every bad file gets a clear error.
//! Each case compares the directory's files, byte for byte, before and after.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use reactifact_core::error::OpenError;
use reactifact_core::store::SqliteOutbox;
use reactifact_core::{Context, OpenOptions};

/// Every file of `dir`, with its length and a digest of its bytes (so a failed comparison
/// prints something readable).
fn files(dir: &Path) -> BTreeMap<PathBuf, (usize, u64)> {
    use std::hash::{Hash, Hasher};
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            bytes.hash(&mut hasher);
            (path, (bytes.len(), hasher.finish()))
        })
        .collect()
}

/// A store with one session and a few commits, closed (its WAL folded into the file).
fn stored(dir: &Path) -> PathBuf {
    let path = dir.join("state.db");
    let mut ctx = Context::open(&path, "orders").unwrap();
    for i in 0..20 {
        ctx.create(format!("order:{i}"), order("ada", i)).unwrap();
    }
    drop(ctx);
    path
}

#[test]
fn a_foreign_sqlite_file_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine');")
            .unwrap();
    }
    let before = files(dir.path());
    for options in [OpenOptions::new(), OpenOptions::new().read_only(true)] {
        let err = Context::open_with(&path, "orders", options).unwrap_err();
        assert!(matches!(err, OpenError::Foreign { .. }), "{err:?}");
        assert!(err.to_string().contains("another program"), "{err}");
    }
    assert_eq!(files(dir.path()), before, "not switched to WAL, no table added");
}

#[test]
fn a_foreign_file_claiming_our_schema_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE notes (body TEXT); PRAGMA user_version = 1;")
            .unwrap();
    }
    let before = files(dir.path());
    let err = Context::open(&path, "orders").unwrap_err();
    assert!(matches!(err, OpenError::Foreign { .. }), "{err:?}");
    assert_eq!(files(dir.path()), before);
}

/// A current file whose schema version was lowered outside reactifact still has the tables
/// and columns of the versions above it: migrating it would stop at SQLite's own "table
/// checkpoints already exists". Every open — writable, read-only, a standalone outbox —
/// refuses it as corrupt, naming the version it claims and the first thing ahead of it, and
/// leaves the file as it was.
#[test]
fn a_file_whose_schema_version_was_lowered_is_corrupt_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = stored(dir.path());
    let user_version = || -> i64 {
        rusqlite::Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .unwrap()
    };
    let set_version = |version: i64| {
        rusqlite::Connection::open(&path)
            .unwrap()
            .pragma_update(None, "user_version", version)
            .unwrap();
    };
    let current = user_version();
    let ahead = [
        (1, "table `outbox`, which schema version 2 added"),
        (2, "table `checkpoints`, which schema version 3 added"),
        (3, "table `outbox_attempts`, which schema version 4 added"),
        (4, "column `outbox.decision`, which schema version 5 added"),
        (5, "column `outbox.trace_parent`, which schema version 6 added"),
        (6, "column `outbox.grp`, which schema version 7 added"),
        (7, "table `outbox_rates`, which schema version 8 added"),
        (8, "column `outbox.decided_digest`, which schema version 9 added"),
    ];
    for (lowered, named) in ahead {
        set_version(lowered);
        let before = files(dir.path());
        let opens = [
            ("writable", Context::open(&path, "orders").map(drop)),
            (
                "read-only",
                Context::open_with(&path, "orders", OpenOptions::new().read_only(true)).map(drop),
            ),
            ("standalone outbox", SqliteOutbox::open(&path).map(drop)),
        ];
        for (open, opened) in opens {
            let err = opened.expect_err(&format!("version {lowered}, {open}: the file opened"));
            assert!(
                matches!(err, OpenError::Corrupt { source: None, .. }),
                "version {lowered}, {open}: {err:?}"
            );
            let message = err.to_string();
            assert!(
                message.contains(&format!("its schema version is {lowered}, but it has {named}")),
                "version {lowered}, {open}: {message}"
            );
        }
        assert_eq!(files(dir.path()), before, "version {lowered}: the file was changed");
        assert_eq!(user_version(), lowered);
    }
    // Its version set back, the file opens and verifies: nothing else was touched.
    set_version(current);
    let ctx = Context::open(&path, "orders").unwrap();
    assert_eq!(ctx.len(), 20);
    ctx.verify().unwrap();
}

#[test]
fn without_create_a_missing_file_is_an_error_and_nothing_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.db");
    for options in [OpenOptions::new().create(false), OpenOptions::new().read_only(true)] {
        let err = Context::open_with(&path, "orders", options).unwrap_err();
        assert!(matches!(err, OpenError::NoSuchFile { .. }), "{err:?}");
        assert!(err.to_string().contains("does not exist"), "{err}");
    }
    assert!(files(dir.path()).is_empty(), "{:?}", files(dir.path()).keys());
}

#[test]
fn an_empty_file_is_a_new_store_only_with_create() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.db");
    std::fs::write(&path, b"").unwrap();
    let before = files(dir.path());
    for options in [OpenOptions::new().create(false), OpenOptions::new().read_only(true)] {
        let err = Context::open_with(&path, "orders", options).unwrap_err();
        assert!(matches!(err, OpenError::NoSuchSession { .. }), "{err:?}");
    }
    assert_eq!(files(dir.path()), before, "the empty file stays empty");

    let mut ctx = Context::open(&path, "orders").unwrap();
    ctx.create("order:1", order("ada", 1)).unwrap();
    drop(ctx);
    assert_eq!(Context::open(&path, "orders").unwrap().len(), 1);
}

#[test]
fn a_truncated_file_is_corrupt_at_every_length_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = stored(dir.path());
    let whole = std::fs::read(&path).unwrap();
    assert!(whole.len() > 4096, "the store spans several pages");
    let copy = dir.path().join("truncated.db");
    // Cut inside the header, at page boundaries and inside pages.
    let mut cuts: Vec<usize> = vec![1, 50, 99, 100, 101, 512, 1000];
    cuts.extend((1..whole.len() / 4096).flat_map(|page| [page * 4096 - 1, page * 4096, page * 4096 + 7]));
    for cut in cuts {
        std::fs::write(&copy, &whole[..cut]).unwrap();
        let before = std::fs::read(&copy).unwrap();
        let err = match Context::open(&copy, "orders") {
            Ok(ctx) => panic!("a file cut at {cut} of {} bytes opened: {ctx:?}", whole.len()),
            Err(err) => err,
        };
        assert!(
            matches!(err, OpenError::Corrupt { .. } | OpenError::NotADatabase { .. }),
            "cut at {cut}: {err:?}"
        );
        assert_eq!(
            std::fs::read(&copy).unwrap(),
            before,
            "cut at {cut}: the file was changed"
        );
        for leftover in ["truncated.db-wal", "truncated.db-shm"] {
            let _ = std::fs::remove_file(dir.path().join(leftover));
        }
    }
}

#[test]
fn a_read_only_open_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = stored(dir.path());
    let before = files(dir.path());
    let ctx = Context::open_with(&path, "orders", OpenOptions::new().read_only(true)).unwrap();
    assert_eq!(ctx.len(), 20);
    drop(ctx);
    assert_eq!(files(dir.path()), before, "no -wal or -shm file, no byte changed");
}

#[test]
fn concurrent_first_opens_of_a_new_file_all_succeed() {
    for round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.db");
        let barrier = std::sync::Barrier::new(8);
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let (path, barrier) = (&path, &barrier);
                    scope.spawn(move || {
                        barrier.wait();
                        // Half of them open the same session, half sessions of their own.
                        let session = if i % 2 == 0 {
                            "shared".to_owned()
                        } else {
                            format!("own-{i}")
                        };
                        Context::open(path, session).map(|_| ()).map_err(|e| e.to_string())
                    })
                })
                .collect();
            for (i, handle) in handles.into_iter().enumerate() {
                let result = handle.join().unwrap();
                assert!(result.is_ok(), "round {round}, opener {i}: {}", result.unwrap_err());
            }
        });
        let ctx = Context::open_with(&path, "shared", OpenOptions::new().read_only(true)).unwrap();
        assert_eq!(ctx.len(), 0);
    }
}

/// Makes a file immutable (`chattr +i`, which holds even for root) for as long as it lives.
struct Immutable<'a>(&'a Path);

impl<'a> Immutable<'a> {
    fn new(path: &'a Path) -> Option<Self> {
        let status = std::process::Command::new("chattr").arg("+i").arg(path).status().ok()?;
        status.success().then_some(Immutable(path))
    }
}

impl Drop for Immutable<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr").arg("-i").arg(self.0).status();
    }
}

#[test]
fn a_file_that_cannot_be_written_is_refused_at_open_and_reads_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = stored(dir.path());
    let Some(_immutable) = Immutable::new(&path) else {
        // chattr needs root (CAP_LINUX_IMMUTABLE) and a file system that keeps the flag.
        eprintln!("skipped: `chattr +i` is not available here");
        return;
    };
    let before = files(dir.path());
    let err = Context::open(&path, "orders").unwrap_err();
    assert!(matches!(err, OpenError::ReadOnlyFile { .. }), "{err:?}");
    assert!(err.to_string().contains("read_only"), "{err}");
    let ctx = Context::open_with(&path, "orders", OpenOptions::new().read_only(true)).unwrap();
    assert_eq!(ctx.len(), 20);
    drop(ctx);
    assert_eq!(files(dir.path()), before);

    // Read-only media: not even a `-shm` file can be created beside it.
    let _directory = Immutable::new(dir.path()).expect("chattr worked on the file");
    let err = Context::open(&path, "orders").unwrap_err();
    assert!(matches!(err, OpenError::ReadOnlyFile { .. }), "{err:?}");
    let ctx = Context::open_with(&path, "orders", OpenOptions::new().read_only(true)).unwrap();
    assert_eq!(ctx.len(), 20);
    drop(ctx);
    assert_eq!(files(dir.path()), before);
}

#[tokio::test]
async fn a_flipped_byte_anywhere_in_the_file_is_an_error_or_a_verified_open_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        // A log with intents, deliveries, a fork and a merge: every table has rows.
        let recorder = Recorder::default();
        let mut rt = reactifact_core::Runtime::builder(Context::open(&path, "orders").unwrap())
            .agent(reactifact_core::Agent::new("billing").produce(process_order()))
            .dispatcher(recorder.dispatcher())
            .build()
            .unwrap();
        for i in 0..5 {
            rt.context_mut().create(format!("order:{i}"), order("ada", i)).unwrap();
        }
        rt.run().await.unwrap();
        let mut branch = rt.context().fork("what-if").unwrap();
        branch.create("order:9", order("bob", 9)).unwrap();
        rt.context_mut().merge(&branch).unwrap();
    }
    let whole = std::fs::read(&path).unwrap();
    let copy = dir.path().join("flipped.db");
    let mut opened = 0;
    let mut refused = 0;
    // Every 13th byte: all pages, headers and cells, without thousands of opens.
    for at in (0..whole.len()).step_by(13) {
        let mut bytes = whole.clone();
        bytes[at] ^= 0x5a;
        std::fs::write(&copy, &bytes).unwrap();
        for leftover in ["flipped.db-wal", "flipped.db-shm"] {
            let _ = std::fs::remove_file(dir.path().join(leftover));
        }
        for options in [OpenOptions::new().read_only(true), OpenOptions::new()] {
            let result = std::panic::catch_unwind(|| {
                Context::open_with(&copy, "orders", options)
                    .map(|ctx| ctx.verify().is_ok())
                    .map_err(|e| e.to_string())
            });
            match result {
                Err(_) => panic!("a byte flipped at offset {at} made the open panic"),
                Ok(Ok(_)) => opened += 1,
                Ok(Err(_)) => refused += 1,
            }
        }
    }
    assert!(
        refused > 0 && opened + refused > 2000,
        "opened {opened}, refused {refused}"
    );
}

#[test]
fn a_session_whose_row_was_changed_is_corrupt_not_a_new_empty_session() {
    let dir = tempfile::tempdir().unwrap();
    let path = stored(dir.path());
    {
        // One flipped byte in the session's name: its commits stay, its row now names another.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute("UPDATE sessions SET name = 'order)' WHERE name = 'orders'", [])
            .unwrap();
        conn.pragma_update(None, "journal_mode", "DELETE").unwrap();
    }
    let before = files(dir.path());
    for options in [OpenOptions::new(), OpenOptions::new().read_only(true)] {
        let err = Context::open_with(&path, "orders", options).unwrap_err();
        assert!(matches!(err, OpenError::Corrupt { .. }), "{err:?}");
        assert!(err.to_string().contains("commits of session `orders`"), "{err}");
    }
    assert_eq!(files(dir.path()), before, "no empty session was created");
}

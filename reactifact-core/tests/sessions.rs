//! The sessions of a SQLite file as `store::list_sessions` reads them: a root session, a branch
//! forked at a past commit, a branch without commits of its own and a session without commits,
//! each with what the store keeps (generation, head, fork point, consumed event position, its
//! own commits); a listing that writes nothing, also while a writer has the file open; and a
//! row changed outside reactifact, refused as corrupt.

mod common;

use std::path::Path;

use common::{order, process_order};
use reactifact_core::error::OpenError;
use reactifact_core::runtime::Generation;
use reactifact_core::store::{list_sessions, SessionInfo};
use reactifact_core::{Agent, Context, OpenOptions, Runtime};

/// Runs the order flow on `ctx` until it is idle (no dispatcher: intents stay pending).
async fn run(ctx: Context) -> Context {
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    rt.into_context()
}

/// Writes into `path`: `orders` (two orders, the flow run on them, then a third order left
/// unprocessed), `what-if` forked from it at commit 1 with an order of its own processed,
/// `idle` forked at its head with nothing of its own, and `empty`, opened and never written.
async fn write(path: &Path) {
    let mut orders = Context::open(path, "orders").unwrap();
    let mut tx = orders.transaction();
    tx.create("order:1", order("ada", 100));
    tx.create("order:2", order("bob", 200));
    tx.commit().unwrap();
    let mut orders = run(orders).await;
    orders.create("order:3", order("cy", 300)).unwrap();
    assert_eq!(orders.queued_events(), 1, "order 3 is left unprocessed");

    let mut branch = orders.fork_at("what-if", Generation(1)).unwrap();
    branch.create("order:9", order("dee", 900)).unwrap();
    let branch = run(branch).await;
    drop(orders.fork("idle").unwrap());
    drop(Context::open(path, "empty").unwrap());
    drop((orders, branch));
}

/// The session's `consumed_seq` as the file keeps it, read with SQLite itself.
fn consumed_in_file(path: &Path, session: &str) -> u64 {
    let conn = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    conn.query_row("SELECT consumed_seq FROM sessions WHERE name = ?1", [session], |row| {
        row.get(0)
    })
    .unwrap()
}

fn find<'a>(sessions: &'a [SessionInfo], name: &str) -> &'a SessionInfo {
    sessions
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no session `{name}` in {sessions:?}"))
}

#[tokio::test]
async fn a_root_a_branch_and_an_empty_session_are_listed_as_the_store_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    write(&path).await;
    let sessions = list_sessions(&path).unwrap();
    let names: Vec<&str> = sessions.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["empty", "idle", "orders", "what-if"], "by name");

    let read_only = OpenOptions::new().read_only(true);
    for s in &sessions {
        let ctx = Context::open_with(&path, &s.name, read_only.clone()).unwrap();
        assert_eq!(s.generation, ctx.generation(), "{}", s.name);
        assert_eq!(s.head, ctx.head(), "{}", s.name);
        assert_eq!(s.consumed_seq, consumed_in_file(&path, &s.name), "{}", s.name);
        // A branch's own commits are those after its fork point; a root's are its whole log.
        let fork = s.forked_from.as_ref().map_or(0, |(_, at)| at.0);
        assert_eq!(s.commits, s.generation.0 - fork, "{}", s.name);
    }

    let orders = find(&sessions, "orders");
    assert_eq!(
        (orders.generation, orders.commits, orders.forked_from.clone()),
        (Generation(3), 3, None)
    );
    assert!(
        orders.consumed_seq > 0,
        "the flow consumed the first orders' events: {orders:?}"
    );
    // Reopened, the session queues only the events at or after its consumed position: order 3's.
    let reopened = Context::open_with(&path, "orders", read_only.clone()).unwrap();
    assert_eq!(reopened.queued_events(), 1);

    let branch = find(&sessions, "what-if");
    assert_eq!(branch.forked_from, Some(("orders".to_owned(), Generation(1))));
    assert!(
        branch.generation.0 > 2,
        "its order and the flow's run on it: {branch:?}"
    );
    assert_eq!(branch.commits, branch.generation.0 - 1, "only the branch's own commits");
    assert!(
        branch.consumed_seq > 0 && branch.consumed_seq != orders.consumed_seq,
        "the branch consumed events of its own: {branch:?}"
    );

    let idle = find(&sessions, "idle");
    assert_eq!(idle.forked_from, Some(("orders".to_owned(), Generation(3))));
    assert_eq!(
        (idle.generation, idle.head, idle.commits),
        (Generation(3), orders.head, 0)
    );

    let empty = find(&sessions, "empty");
    let mut expected = SessionInfo::new("empty", empty.created_at);
    assert_eq!(*empty, expected, "a session without commits");
    expected.commits = 1;
    assert_ne!(*empty, expected, "every field is compared");
}

/// The file's bytes and the names in its folder.
fn snapshot(path: &Path) -> (Vec<u8>, Vec<String>) {
    let mut names: Vec<String> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    (std::fs::read(path).unwrap(), names)
}

#[tokio::test]
async fn listing_writes_nothing_and_creates_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    write(&path).await;
    let before = snapshot(&path);
    assert_eq!(before.1, ["state.db"], "no -wal or -shm left once every writer closed");
    let first = list_sessions(&path).unwrap();
    assert_eq!(list_sessions(&path).unwrap(), first, "a listing is repeatable");
    assert_eq!(snapshot(&path), before, "listing changed the file or its folder");

    let missing = dir.path().join("missing.db");
    assert!(matches!(list_sessions(&missing), Err(OpenError::NoSuchFile { .. })));
    assert!(!missing.exists(), "listing created the file");
}

#[tokio::test]
async fn a_listing_while_a_writer_holds_the_file_sees_its_commits_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    write(&path).await;
    let mut writer = Context::open(&path, "orders").unwrap();
    writer.create("order:4", order("eve", 400)).unwrap();
    // The commit may sit in the writer's WAL: the listing reads it there.
    let db_before = std::fs::read(&path).unwrap();
    let orders = find(&list_sessions(&path).unwrap(), "orders").clone();
    assert_eq!((orders.generation, orders.commits), (Generation(4), 4));
    assert_eq!(orders.head, writer.head());
    assert_eq!(std::fs::read(&path).unwrap(), db_before, "listing wrote to the file");
    writer.create("order:5", order("flo", 500)).unwrap();
    let again = find(&list_sessions(&path).unwrap(), "orders").clone();
    assert_eq!((again.generation, again.commits), (Generation(5), 5), "no stale read");
}

#[tokio::test]
async fn a_session_row_changed_outside_reactifact_is_refused_as_corrupt() {
    for (column, value) in [
        ("consumed_seq", "-1"),
        ("generation", "-3"),
        ("fork_generation", "-1"),
        ("head", "x'00'"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        write(&path).await;
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute(
            &format!("UPDATE sessions SET {column} = {value} WHERE name = 'what-if'"),
            [],
        )
        .unwrap();
        drop(conn);
        match list_sessions(&path) {
            Err(OpenError::Corrupt { detail, .. }) => {
                assert!(detail.contains("session `what-if`"), "{column}: {detail}")
            }
            other => panic!("{column} = {value}: {other:?}"),
        }
    }
}

#[test]
fn the_largest_position_a_row_can_hold_reads_back_as_it_is() {
    // SQLite keeps integers as i64: the largest position a row can hold reads back as it is.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    drop(Context::open(&path, "main").unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("UPDATE sessions SET consumed_seq = 9223372036854775807", [])
        .unwrap();
    drop(conn);
    let main = find(&list_sessions(&path).unwrap(), "main").clone();
    assert_eq!(main.consumed_seq, i64::MAX as u64);
    assert_eq!(main.commits, 0);
}

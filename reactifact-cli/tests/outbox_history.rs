//! `outbox show` on outside values in the undigested attempt history: a time past year 9999,
//! a value of the wrong type, an unknown outcome.

mod binary;
mod support;

use binary::store;

/// A claim time past year 9999 in `outbox_attempts` (undigested, so nothing flags it):
/// `outbox show` must not panic (exit 101).
#[test]
fn outbox_show_survives_a_huge_time_in_the_history() {
    let store = store();
    let conn = rusqlite::Connection::open(&store.path).unwrap();
    let n = conn
        .execute(
            "UPDATE outbox_attempts SET claimed_at = 9000000000000000 WHERE key = ?1",
            [support::FAILED],
        )
        .unwrap();
    assert_eq!(n, 1);
    drop(conn);
    let text = store.run(&["outbox", "show", support::FAILED]).ok().stdout;
    assert!(text.contains("9999-12-31T23:59:59"), "{text}");
    let doc = store.json(&["outbox", "show", support::FAILED]);
    assert_eq!(
        doc["attempt_history"][0]["claimed_at"], "9999-12-31T23:59:59.000Z",
        "{doc}"
    );
}

/// One history row of the wrong type is skipped: `outbox show` still shows the intact entry.
#[test]
fn outbox_show_skips_a_damaged_history_row() {
    let store = store();
    let conn = rusqlite::Connection::open(&store.path).unwrap();
    conn.execute(
        "UPDATE outbox_attempts SET owner = X'00ff' WHERE key = ?1",
        [support::FAILED],
    )
    .unwrap();
    drop(conn);
    let doc = store.json(&["outbox", "show", support::FAILED]);
    assert_eq!(doc["status"], "failed");
    assert_eq!(doc["attempt_history"], serde_json::json!([]), "{doc}");
}

/// An unknown outcome code in a history row is skipped.
#[test]
fn outbox_show_skips_an_unknown_outcome() {
    let store = store();
    let conn = rusqlite::Connection::open(&store.path).unwrap();
    conn.execute(
        "UPDATE outbox_attempts SET outcome = -1 WHERE key = ?1",
        [support::FAILED],
    )
    .unwrap();
    drop(conn);
    let doc = store.json(&["outbox", "show", support::FAILED]);
    assert_eq!(doc["attempt_history"], serde_json::json!([]), "{doc}");
}

//! Opening a session of a SQLite file while another context commits to it.
//!
//! `SqliteStore::open` reads the session's generation, then its log up to that generation; it
//! read the log to its end, and a commit that landed between the two reads made the open fail
//! with `OpenError::Corrupt` ("session `s` is at generation N but its log holds N + 1
//! commits") — a fatal error, for a file that is fine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use reactifact_core::{Artifact, Context};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Note {
    text: String,
}

impl Artifact for Note {
    const KIND: &'static str = "note";
}

/// Commits the writer makes while the reader opens the session again and again.
const COMMITS: usize = 2_000;

#[test]
fn a_session_opens_while_another_context_commits_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.db");
    let mut writer = Context::open(&path, "s").expect("a new store");
    writer.create("note:0", Note { text: "0".into() }).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let opener = {
        let (path, done) = (path.clone(), done.clone());
        std::thread::spawn(move || {
            let (mut opened, mut failed) = (0, Vec::new());
            while !done.load(Ordering::SeqCst) {
                match Context::open(&path, "s") {
                    Ok(_) => opened += 1,
                    Err(e) => failed.push(e.to_string()),
                }
            }
            (opened, failed)
        })
    };
    for i in 1..COMMITS {
        writer
            .create(format!("note:{i}"), Note { text: i.to_string() })
            .expect("the writer commits");
    }
    done.store(true, Ordering::SeqCst);
    let (opened, failed) = opener.join().unwrap();
    assert!(
        failed.is_empty(),
        "{} of {} opens failed while the writer committed; the first: {}",
        failed.len(),
        opened + failed.len(),
        failed[0]
    );
}

//! Real OS processes on one SQLite file: two runtimes on two sessions and two standalone
//! drainers, all delivering at once.
//!
//! The parent creates one file with two sessions, `orders` and `billing`, and seeds 5,000
//! orders in each (10,000 in all; `REACTIFACT_MP_PER_SESSION` overrides the count). Each
//! order's produce acts one `notify` intent keyed `notify:order:<session>:<i>`. Then four
//! child processes (this test binary re-executed, the mode chosen by environment variables,
//! as in `crash_resume.rs`) run at once:
//!
//! - two runtime processes, one per session: each opens its session, runs the generation
//!   that commits its 5,000 intents, and drains with its own dispatcher;
//! - two standalone drainer processes: `Drainer::builder(outbox of the file, dispatcher)`
//!   `.serve(stop)`, stopping once the file's counts say all 10,000 intents are delivered.
//!
//! Every dispatcher appends `key who pid` (who = the session of a runtime process, or
//! `drainer-1`/`drainer-2`) to one shared log file, opened with `O_APPEND`, one `write` per
//! line. The parent then asserts:
//!
//! - every key was delivered exactly once: each expected key is on exactly one line, and no
//!   line names any other key;
//! - every key's ledger entry is delivered, after one attempt and no expired lease;
//! - each runtime process's lines carry only its own session's keys (a runtime's drain is
//!   handed only its session's intents), and each line's pid is the process that `who` says.
//!
//! Why it fails when the guarantee breaks: before issue 13, each process kept its own copy
//! of the ledger, so two drainers of one file would each send every key (every key on two
//! lines or more: the exactly-once check fails), and a runtime's drain handed out every
//! intent of its copy whatever its session (a runtime's line with the other session's key
//! fails the ownership check). A claim that is not atomic across processes, or a record
//! that is not fenced, puts some key on two lines.
//!
//! The split of deliveries between the four processes is a race: it is printed (run with
//! `--nocapture`), never asserted. Timings under a debug build are printed too.

mod procs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use procs::{
    all_entries, assert_success, block_on, counts, env, intent_key, key_session, open_outbox, order_runtime,
    read_lines, scratch_dir, seed_orders, spawn_child, wait_for, LineLog,
};
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::{Budget, StopHandle, TurnOutcome};
use reactifact_core::{Context, DispatchError, Drainer, Intent};

const SESSIONS: [&str; 2] = ["orders", "billing"];
const DRAINERS: [&str; 2] = ["drainer-1", "drainer-2"];
const CHILD: &str = "multi_process_child";
/// A child that has not exited by then has hung: the test fails (and kills it).
const CHILD_LIMIT: Duration = Duration::from_secs(180);

fn per_session() -> usize {
    env("REACTIFACT_MP_PER_SESSION").map_or(5_000, |v| v.parse().expect("REACTIFACT_MP_PER_SESSION"))
}

/// A dispatcher that appends `key who pid` for every intent it is handed.
fn logging_dispatcher(log: LineLog, who: String) -> impl reactifact_core::Dispatcher {
    let pid = std::process::id();
    move |intent: Intent| {
        let line = format!("{} {who} {pid}", intent.key());
        let log = log.clone();
        async move {
            log.line(&line)?;
            Ok::<(), DispatchError>(())
        }
    }
}

/// The child's entry point; a no-op unless the parent set the environment.
#[test]
fn multi_process_child() {
    let (Some(who), Some(db), Some(log), Some(total)) = (
        env("REACTIFACT_MP_WHO"),
        env("REACTIFACT_MP_DB"),
        env("REACTIFACT_MP_LOG"),
        env("REACTIFACT_MP_TOTAL"),
    ) else {
        return;
    };
    let db = PathBuf::from(db);
    let total: u64 = total.parse().unwrap();
    let log = LineLog::open(log.as_ref()).unwrap();
    let dispatcher = logging_dispatcher(log, who.clone());
    block_on(async {
        if SESSIONS.contains(&who.as_str()) {
            // A runtime process: commit this session's intents, drain what its drain is handed.
            let ctx = Context::open(&db, who.as_str()).unwrap();
            let mut rt = order_runtime(ctx, Some(dispatcher));
            let report = rt.run_with(Budget::UNLIMITED).await.unwrap();
            assert_eq!(report.outcome, TurnOutcome::Completed);
            eprintln!("{who}: {} delivered by its own drain", report.deliveries.delivered);
        } else {
            // A standalone drainer: serve the whole file until every intent is delivered.
            let outbox = open_outbox(&db);
            let drainer = Drainer::builder(outbox.clone(), dispatcher)
                .poll_interval(Duration::from_millis(20))
                .build()
                .expect("valid delivery options");
            let stop = StopHandle::default();
            let watcher = {
                let stop = stop.clone();
                let outbox = outbox.clone();
                async move {
                    // Polls the file, the drainer's stop condition: all delivered.
                    while counts(&*outbox).await.delivered < total {
                        tokio::time::sleep(Duration::from_millis(25)).await;
                    }
                    stop.stop();
                }
            };
            let (report, ()) = tokio::join!(drainer.serve(stop), watcher);
            let report = report.unwrap();
            eprintln!("{who}: {} delivered", report.delivered);
            assert_eq!(report.stale, 0, "{who}: stale outcomes without any crash or stall");
        }
    });
}

#[test]
fn two_runtimes_and_two_drainers_on_one_file_deliver_each_key_once() {
    let n = per_session();
    let total = n * SESSIONS.len();
    let dir = scratch_dir("multi-process");
    let db = dir.join("store.db");
    let log = dir.join("deliveries.log");

    let started = Instant::now();
    for session in SESSIONS {
        let mut ctx = Context::open(&db, session).unwrap();
        seed_orders(&mut ctx, session, n);
    }
    let seeded = started.elapsed();

    let started = Instant::now();
    let mut children = Vec::new();
    for who in SESSIONS.iter().chain(&DRAINERS) {
        let stderr = dir.join(format!("{who}.stderr"));
        let env = [
            ("REACTIFACT_MP_WHO", who.to_string()),
            ("REACTIFACT_MP_DB", db.display().to_string()),
            ("REACTIFACT_MP_LOG", log.display().to_string()),
            ("REACTIFACT_MP_TOTAL", total.to_string()),
        ];
        children.push((*who, spawn_child(CHILD, &env, &stderr), stderr));
    }
    let mut pids = BTreeMap::new();
    for (who, mut child, stderr) in children {
        pids.insert(child.id().to_string(), who);
        let status = wait_for(&mut child, CHILD_LIMIT, who, &stderr);
        assert_success(status, who, &stderr);
    }
    let ran = started.elapsed();

    // Each key on exactly one line; each line from the process it names.
    let lines = read_lines(&log);
    let mut seen: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for line in &lines {
        let mut parts = line.split(' ');
        let (Some(key), Some(who), Some(pid), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            panic!("malformed line {line:?}");
        };
        assert_eq!(
            pids.get(pid),
            Some(&who),
            "line {line:?}: pid {pid} is not {who}'s process"
        );
        seen.entry(key.to_owned())
            .or_default()
            .push((who.to_owned(), pid.to_owned()));
    }
    let expected: BTreeSet<String> = SESSIONS
        .iter()
        .flat_map(|s| (0..n).map(move |i| intent_key(s, i)))
        .collect();
    let twice: Vec<_> = seen.iter().filter(|(_, by)| by.len() > 1).take(5).collect();
    assert!(twice.is_empty(), "keys delivered more than once (first few): {twice:?}");
    let missing: Vec<_> = expected.iter().filter(|k| !seen.contains_key(*k)).take(5).collect();
    assert!(missing.is_empty(), "keys never delivered (first few): {missing:?}");
    let unknown: Vec<_> = seen.keys().filter(|k| !expected.contains(*k)).take(5).collect();
    assert!(unknown.is_empty(), "deliveries of unknown keys: {unknown:?}");
    assert_eq!(lines.len(), total);

    // A runtime's drain is handed only its session's intents.
    for (key, by) in &seen {
        for (who, _) in by {
            if SESSIONS.contains(&who.as_str()) {
                assert_eq!(
                    key_session(key),
                    who,
                    "runtime `{who}` delivered {key}, another session's intent"
                );
            }
        }
    }

    // The ledger agrees: every key delivered, once.
    let entries = block_on(async {
        let outbox = open_outbox(&db);
        all_entries(&*outbox).await
    });
    assert_eq!(entries.len(), total, "the outbox holds {} entries", entries.len());
    for entry in &entries {
        let key = entry.key().as_str();
        assert!(expected.contains(key), "the outbox holds an unknown key {key}");
        assert_eq!(
            entry.status(),
            DeliveryStatus::Delivered,
            "{key}: {:?}",
            entry.last_error()
        );
        assert_eq!(entry.attempts(), 1, "{key}: attempts");
        assert_eq!(entry.expired_leases(), 0, "{key}: expired leases");
        assert_eq!(
            entry.origin().session(),
            key_session(key),
            "{key}: registered by another session"
        );
    }

    let mut split: BTreeMap<&str, usize> = BTreeMap::new();
    for by in seen.values() {
        *split.entry(pids[&by[0].1]).or_default() += 1;
    }
    eprintln!(
        "multi_process: {total} intents ({n} per session); seeding {seeded:.2?}, the four processes {ran:.2?}; \
         delivered by: {split:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

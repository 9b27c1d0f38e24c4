//! Leases across real processes: a holder paused past its lease is fenced off, and a holder
//! that renews is not.
//!
//! - **Stale holder.** Drainer process A claims the one intent of a file and starts its
//!   dispatch, which waits for a release file. The parent freezes A (SIGSTOP), so A stops
//!   renewing. Drainer process B serves the file: once A's 1 s lease has expired B reclaims
//!   the intent and delivers it (attempt 2, token 2). Then the parent releases A's dispatch
//!   and resumes A (SIGCONT): A's success comes late and is rejected as stale — A's report
//!   counts it in `stale`, not in `delivered` — and the ledger entry is exactly as B left it
//!   (status, token, attempts, expired leases, delivery time).
//! - **Renewal.** Drainer process A dispatches the intent for 7 s under a 2 s lease (renewed
//!   every third of it) while drainer process B serves the same file the whole time: B never
//!   sends it, and the entry is delivered after one attempt with no expired lease.
//!
//! Each drainer appends `S key pid attempt` before and `E key pid attempt` after its dispatch,
//! and `R pid delivered stale` with its report at the end, to one log (`O_APPEND`, one `write`
//! per line). The parent synchronises only by polling the log and waiting on processes.
//!
//! The renewal case assumes that the holder's executor is not starved for more than two thirds
//! of its lease (1.3 s) while its dispatch runs: that is what renewal promises and all it can.

mod procs;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use procs::{
    all_entries, assert_success, block_on, commit_intents, counts, env, intent_key, open_outbox, read_lines,
    scratch_dir, seed_orders, spawn_child, wait_for, LineLog,
};
use reactifact_core::ledger::{Delivery, DeliveryStatus};
use reactifact_core::runtime::StopHandle;
use reactifact_core::{Context, DeliveryOptions, DispatchError, Drainer, Intent};

const SESSION: &str = "orders";
const CHILD: &str = "stale_holder_child";
const CHILD_LIMIT: Duration = Duration::from_secs(120);

/// The dispatcher: `S`, then waits for the release file (if any) or sleeps `hold`, then `E`.
fn dispatcher(log: LineLog, release: Option<PathBuf>, hold: Duration) -> impl reactifact_core::Dispatcher {
    let pid = std::process::id();
    move |intent: Intent| {
        let log = log.clone();
        let release = release.clone();
        async move {
            let (key, attempt) = (intent.key().to_string(), intent.attempt());
            log.line(&format!("S {key} {pid} {attempt}"))?;
            match release {
                Some(release) => {
                    while !release.exists() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                None => tokio::time::sleep(hold).await,
            }
            log.line(&format!("E {key} {pid} {attempt}"))?;
            Ok::<(), DispatchError>(())
        }
    }
}

/// The child's entry point; a no-op unless the parent set the environment.
///
/// Modes: `holder` flushes once (lease `REACTIFACT_SH_LEASE_MS`; its dispatch waits for
/// `REACTIFACT_SH_RELEASE` or sleeps `REACTIFACT_SH_HOLD_MS`); `rescuer` serves with a 20 ms
/// poll until the file says everything is delivered.
#[test]
fn stale_holder_child() {
    let (Some(mode), Some(db), Some(log), Some(lease)) = (
        env("REACTIFACT_SH_MODE"),
        env("REACTIFACT_SH_DB"),
        env("REACTIFACT_SH_LOG"),
        env("REACTIFACT_SH_LEASE_MS"),
    ) else {
        return;
    };
    let db = PathBuf::from(db);
    let lease = Duration::from_millis(lease.parse().unwrap());
    let release = env("REACTIFACT_SH_RELEASE").map(PathBuf::from);
    let hold = Duration::from_millis(env("REACTIFACT_SH_HOLD_MS").map_or(0, |v| v.parse().unwrap()));
    let log = LineLog::open(log.as_ref()).unwrap();
    let pid = std::process::id();
    block_on(async {
        let outbox = open_outbox(&db);
        let drainer = Drainer::builder(outbox.clone(), dispatcher(log.clone(), release, hold))
            .delivery(DeliveryOptions::new().concurrency(1).lease(lease))
            .poll_interval(Duration::from_millis(20))
            .build()
            .expect("valid delivery options");
        let report = if mode == "holder" {
            drainer.flush().await.unwrap()
        } else {
            let stop = StopHandle::default();
            let watcher = {
                let stop = stop.clone();
                async move {
                    while counts(&*outbox).await.delivered < 1 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    stop.stop();
                }
            };
            let (report, ()) = tokio::join!(drainer.serve(stop), watcher);
            report.unwrap()
        };
        log.line(&format!("R {pid} {} {}", report.delivered, report.stale))
            .unwrap();
    });
}

struct Files {
    db: PathBuf,
    log: PathBuf,
    dir: PathBuf,
}

/// A file holding one pending intent.
fn one_intent(name: &str) -> Files {
    let dir = scratch_dir(name);
    let db = dir.join("store.db");
    let mut ctx = Context::open(&db, SESSION).unwrap();
    seed_orders(&mut ctx, SESSION, 1);
    commit_intents(ctx);
    Files {
        log: dir.join("log"),
        db,
        dir,
    }
}

fn spawn(files: &Files, mode: &str, lease_ms: u64, extra: &[(&str, String)]) -> (std::process::Child, PathBuf) {
    let stderr = files.dir.join(format!("{mode}.stderr"));
    let mut env = vec![
        ("REACTIFACT_SH_MODE", mode.to_owned()),
        ("REACTIFACT_SH_DB", files.db.display().to_string()),
        ("REACTIFACT_SH_LOG", files.log.display().to_string()),
        ("REACTIFACT_SH_LEASE_MS", lease_ms.to_string()),
    ];
    env.extend(extra.iter().cloned());
    (spawn_child(CHILD, &env, &stderr), stderr)
}

/// Polls the log until a line starting with `prefix` from `pid` appears.
fn wait_line(log: &Path, prefix: &str, pid: u32) -> Vec<String> {
    let started = Instant::now();
    loop {
        let lines = read_lines(log);
        if lines
            .iter()
            .any(|l| l.starts_with(prefix) && l.split(' ').nth(2) == Some(&pid.to_string()))
        {
            return lines;
        }
        assert!(started.elapsed() < CHILD_LIMIT, "no `{prefix}` line from {pid}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// The `R` line of `pid`: (delivered, stale).
fn report_of(lines: &[String], pid: u32) -> (u64, u64) {
    let line = lines
        .iter()
        .find(|l| l.starts_with("R ") && l.split(' ').nth(1) == Some(&pid.to_string()))
        .unwrap_or_else(|| panic!("no report from {pid}: {lines:?}"));
    let parts: Vec<&str> = line.split(' ').collect();
    (parts[2].parse().unwrap(), parts[3].parse().unwrap())
}

/// The `S` lines: (pid, attempt).
fn sends(lines: &[String]) -> Vec<(u32, u32)> {
    lines
        .iter()
        .filter(|l| l.starts_with("S "))
        .map(|l| {
            let parts: Vec<&str> = l.split(' ').collect();
            (parts[2].parse().unwrap(), parts[3].parse().unwrap())
        })
        .collect()
}

fn entry(db: &Path) -> Delivery {
    let entries = block_on(async { all_entries(&*open_outbox(db)).await });
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].key().as_str(), intent_key(SESSION, 0));
    entries.into_iter().next().unwrap()
}

/// The fields a late, stale outcome must not change.
fn fingerprint(d: &Delivery) -> String {
    format!(
        "{:?} token={:?} attempts={} expired={} delivered_at={:?} updated_at={:?} error={:?} lease={:?}",
        d.status(),
        d.token(),
        d.attempts(),
        d.expired_leases(),
        d.delivered_at(),
        d.updated_at(),
        d.last_error(),
        d.lease()
    )
}

#[test]
fn a_holder_paused_past_its_lease_reports_late_and_is_rejected() {
    let files = one_intent("stale-holder");
    let release = files.dir.join("release");
    let (mut a, a_err) = spawn(
        &files,
        "holder",
        1_000,
        &[("REACTIFACT_SH_RELEASE", release.display().to_string())],
    );
    let a_pid = a.id();
    wait_line(&files.log, "S ", a_pid);
    // A is inside its dispatch (waiting for the release file): freeze it there.
    signal(a_pid, "-STOP");

    let (mut b, b_err) = spawn(&files, "rescuer", 1_000, &[]);
    let b_pid = b.id();
    let status = wait_for(&mut b, CHILD_LIMIT, "the rescuer", &b_err);
    assert_success(status, "the rescuer", &b_err);
    let rescued = entry(&files.db);
    assert_eq!(rescued.status(), DeliveryStatus::Delivered);
    assert_eq!(rescued.attempts(), 2, "A's attempt and B's");
    assert_eq!(rescued.expired_leases(), 1, "A's lease expired and was reclaimed");

    // A's dispatch now succeeds, late.
    std::fs::write(&release, b"go").unwrap();
    signal(a_pid, "-CONT");
    let status = wait_for(&mut a, CHILD_LIMIT, "the holder", &a_err);
    assert_success(status, "the holder", &a_err);

    let lines = read_lines(&files.log);
    assert_eq!(
        sends(&lines),
        vec![(a_pid, 1), (b_pid, 2)],
        "one send each, B's with the next attempt"
    );
    assert_eq!(report_of(&lines, b_pid), (1, 0), "B delivered it");
    assert_eq!(
        report_of(&lines, a_pid),
        (0, 1),
        "A's late success is counted stale, not delivered"
    );
    let after = entry(&files.db);
    assert_eq!(
        fingerprint(&after),
        fingerprint(&rescued),
        "A's late outcome changed the entry"
    );
    let _ = std::fs::remove_dir_all(&files.dir);
}

#[test]
fn a_long_dispatch_that_renews_its_lease_is_not_reclaimed() {
    let files = one_intent("renewing-holder");
    let (mut a, a_err) = spawn(&files, "holder", 2_000, &[("REACTIFACT_SH_HOLD_MS", "7000".to_owned())]);
    let a_pid = a.id();
    wait_line(&files.log, "S ", a_pid);
    // B serves the file for as long as A's dispatch runs: 3.5 leases.
    let (mut b, b_err) = spawn(&files, "rescuer", 2_000, &[]);
    let b_pid = b.id();
    let status = wait_for(&mut a, CHILD_LIMIT, "the holder", &a_err);
    assert_success(status, "the holder", &a_err);
    let status = wait_for(&mut b, CHILD_LIMIT, "the rescuer", &b_err);
    assert_success(status, "the rescuer", &b_err);

    let lines = read_lines(&files.log);
    assert_eq!(sends(&lines), vec![(a_pid, 1)], "only A sent it");
    assert_eq!(report_of(&lines, a_pid), (1, 0));
    assert_eq!(report_of(&lines, b_pid), (0, 0));
    let d = entry(&files.db);
    assert_eq!(d.status(), DeliveryStatus::Delivered);
    assert_eq!(d.attempts(), 1);
    assert_eq!(d.expired_leases(), 0, "the renewed lease expired: {:?}", d.last_error());
    let _ = std::fs::remove_dir_all(&files.dir);
}

//! A drainer process SIGKILLed mid-dispatch, while a live drainer process keeps serving the
//! same SQLite file: the live one reclaims the dead one's leases once they expire, without
//! any restart, and delivers those intents again with the same key.
//!
//! Per trial (50 by default; `REACTIFACT_CRASH_TRIALS` and `REACTIFACT_CRASH_SEED` override
//! the count and the seed, `REACTIFACT_CRASH_PARALLEL` how many trials run at once, 4):
//!
//! 1. the parent commits M = 300 intents to a fresh file (a runtime without a dispatcher, so
//!    they stay pending);
//! 2. it starts two drainer processes (this test binary re-executed, the mode chosen by
//!    environment variables, as in `crash_resume.rs`), both `Drainer::serve` over the whole
//!    file with a 2 s lease, 8 deliveries at once and a 20 ms poll; each dispatch sleeps
//!    1–5 ms (chosen per key and attempt) and appends `S key pid attempt order` before and
//!    `E key pid attempt` after it to one shared log (`O_APPEND`, one `write` per line);
//! 3. once the victim has started a dispatch (its first `S` line), the parent waits a random
//!    0–`KILL_WINDOW` ms (seeded splitmix64: fault injection, not synchronisation) and
//!    SIGKILLs it;
//! 4. the live drainer stops itself when the file's counts say nothing waits and all M are
//!    delivered; the parent waits for it (a limit turns a hang into a failure).
//!
//! Then, per trial, from the log and the file's ledger:
//!
//! - nothing is lost: every key is delivered in the ledger, and has an `S` and an `E` line;
//! - every key was sent at least once, and each `S` line's payload names its key's order
//!   (every send, repeated or not, carried the committed intent under its own key);
//! - the reclaimed keys (`expired_leases` ≥ 1: in flight under the victim's lease at the kill,
//!   with no durable record) are at most the victim's delivery concurrency, 8;
//! - the extra sends (sends beyond the first per key) are exactly the reclaimed keys the
//!   victim had started (`S` line), so at most 8: a key is sent twice only if the victim
//!   began sending it and died before its outcome was durable, and then the second send is
//!   the live drainer's, with a later attempt number and the same key;
//! - every reclaimed key was then sent by the live drainer, which was never restarted.
//!
//! A per-trial table (trial, kill instant, victim sends, reclaimed, extras) and a summary
//! are printed to stderr (run with `--nocapture`). The suite also requires that at least one
//! trial's kill left leases to reclaim, or it would have tested nothing.
//!
//! No assertion depends on timing: the 2 s lease only sets how long a trial waits for the
//! reclaim; each trial takes about that long, and trials run four at a time.

mod procs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use procs::{
    all_entries, assert_success, block_on, commit_intents, counts, env, hash_str, intent_key, killed_by_sigkill, mix,
    open_outbox, read_lines, scratch_dir, seed_orders, spawn_child, wait_for, LineLog, Notify, Rng,
};
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::StopHandle;
use reactifact_core::{Context, DeliveryOptions, DispatchError, Drainer, Intent};

const SESSION: &str = "orders";
/// Intents per trial.
const M: usize = 300;
/// Each drainer's delivery concurrency: the bound on what a kill can leave in flight.
const CONCURRENCY: usize = 8;
const LEASE: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(20);
/// The kill lands this many milliseconds (at most) after the victim's first dispatch.
const KILL_WINDOW_MS: u64 = 60;
const CHILD: &str = "crash_drainer_child";
const CHILD_LIMIT: Duration = Duration::from_secs(120);

/// The dispatcher of both drainers: `S` line, a 1–5 ms "I/O", `E` line.
fn sleepy_dispatcher(log: LineLog, seed: u64) -> impl reactifact_core::Dispatcher {
    let pid = std::process::id();
    move |intent: Intent| {
        let log = log.clone();
        async move {
            let key = intent.key().to_string();
            let attempt = intent.attempt();
            let payload: Notify = intent.payload().map_err(DispatchError::permanent)?;
            let millis = 1 + mix(hash_str(&key) ^ seed ^ u64::from(attempt)) % 5;
            log.line(&format!("S {key} {pid} {attempt} {}", payload.order))?;
            tokio::time::sleep(Duration::from_millis(millis)).await;
            log.line(&format!("E {key} {pid} {attempt}"))?;
            Ok::<(), DispatchError>(())
        }
    }
}

/// The child's entry point; a no-op unless the parent set the environment.
#[test]
fn crash_drainer_child() {
    let (Some(mode), Some(db), Some(log), Some(seed)) = (
        env("REACTIFACT_XD_MODE"),
        env("REACTIFACT_XD_DB"),
        env("REACTIFACT_XD_LOG"),
        env("REACTIFACT_XD_SEED"),
    ) else {
        return;
    };
    let db = PathBuf::from(db);
    let seed: u64 = seed.parse().unwrap();
    let log = LineLog::open(log.as_ref()).unwrap();
    block_on(async {
        let outbox = open_outbox(&db);
        let drainer = Drainer::builder(outbox.clone(), sleepy_dispatcher(log, seed))
            .delivery(DeliveryOptions::new().concurrency(CONCURRENCY).lease(LEASE))
            .poll_interval(POLL)
            .build()
            .expect("valid delivery options");
        let stop = StopHandle::default();
        let live = mode == "live";
        let watcher = {
            let stop = stop.clone();
            let outbox = outbox.clone();
            async move {
                if live {
                    // The live drainer's stop: the file says nothing waits, all delivered.
                    loop {
                        let c = counts(&*outbox).await;
                        if c.waiting() == 0 && c.delivered == M as u64 {
                            break;
                        }
                        tokio::time::sleep(POLL).await;
                    }
                } else {
                    // The victim serves until it is killed; this only ends an orphan.
                    tokio::time::sleep(CHILD_LIMIT).await;
                }
                stop.stop();
            }
        };
        let (report, ()) = tokio::join!(drainer.serve(stop), watcher);
        let report = report.unwrap();
        eprintln!("{mode}: {} delivered, {} stale", report.delivered, report.stale);
        if live {
            assert_eq!(report.stale, 0, "the live drainer's outcomes were rejected as stale");
        }
    });
}

/// One trial's figures.
#[derive(Debug, Clone)]
struct Row {
    trial: usize,
    /// When the kill was sent, from the victim's spawn.
    kill_ms: u128,
    /// From the victim's first `S` line to the kill.
    delay_ms: u64,
    /// `S` lines of the victim.
    victim_sends: usize,
    /// `S` lines of the live drainer.
    live_sends: usize,
    /// Keys reclaimed from the victim (in flight under its lease at the kill).
    reclaimed: usize,
    /// Sends beyond the first per key.
    extras: usize,
    elapsed: Duration,
}

struct Line<'a> {
    start: bool,
    key: &'a str,
    pid: u32,
    attempt: u32,
}

fn parse(line: &str) -> Line<'_> {
    let parts: Vec<&str> = line.split(' ').collect();
    let ok = match parts.first() {
        Some(&"S") => parts.len() == 5,
        Some(&"E") => parts.len() == 4,
        _ => false,
    };
    assert!(ok, "malformed line {line:?}");
    if parts[0] == "S" {
        // The payload handed to the dispatcher is the committed one of this key.
        assert_eq!(
            parts[1],
            format!("notify:{}", parts[4]),
            "line {line:?}: payload of another key"
        );
    }
    Line {
        start: parts[0] == "S",
        key: parts[1],
        pid: parts[2].parse().expect("a pid"),
        attempt: parts[3].parse().expect("an attempt"),
    }
}

fn trial(dir: &Path, trial: usize, rng: &mut Rng) -> Row {
    let started = Instant::now();
    let name = format!("trial-{trial}");
    let db = dir.join(format!("{name}.db"));
    let log = dir.join(format!("{name}.log"));
    let mut ctx = Context::open(&db, SESSION).unwrap();
    seed_orders(&mut ctx, SESSION, M);
    commit_intents(ctx);

    let spawn = |mode: &str| {
        let stderr = dir.join(format!("{name}-{mode}.stderr"));
        let env = [
            ("REACTIFACT_XD_MODE", mode.to_owned()),
            ("REACTIFACT_XD_DB", db.display().to_string()),
            ("REACTIFACT_XD_LOG", log.display().to_string()),
            ("REACTIFACT_XD_SEED", rng.clone().next_u64().to_string()),
        ];
        (spawn_child(CHILD, &env, &stderr), stderr)
    };
    let (mut victim, victim_err) = spawn("victim");
    let spawned = Instant::now();
    let (mut live, live_err) = spawn("live");
    let victim_pid = victim.id();
    let live_pid = live.id();

    // Poll for the victim's first dispatch (or the live drainer finishing everything first).
    let victim_tag = format!(" {victim_pid} ");
    let waited = Instant::now();
    loop {
        if read_lines(&log)
            .iter()
            .any(|l| l.starts_with('S') && l.contains(&victim_tag))
        {
            break;
        }
        if live.try_wait().unwrap().is_some() {
            break;
        }
        if let Some(status) = victim.try_wait().unwrap() {
            panic!(
                "{name}: the victim exited by itself ({status}):\n{}",
                std::fs::read_to_string(&victim_err).unwrap_or_default()
            );
        }
        assert!(waited.elapsed() < CHILD_LIMIT, "{name}: the victim never dispatched");
        std::thread::sleep(Duration::from_millis(1));
    }
    let delay_ms = rng.range(0, KILL_WINDOW_MS);
    // Fault injection, not synchronisation: the kill lands wherever the victim is.
    std::thread::sleep(Duration::from_millis(delay_ms));
    victim.kill().unwrap();
    let kill_ms = spawned.elapsed().as_millis();
    let status = victim.wait().unwrap();
    assert!(
        killed_by_sigkill(status),
        "{name}: the victim was not killed by SIGKILL ({status})"
    );

    let status = wait_for(&mut live, CHILD_LIMIT, &format!("{name}: the live drainer"), &live_err);
    assert_success(status, &format!("{name}: the live drainer"), &live_err);

    let entries = block_on(async { all_entries(&*open_outbox(&db)).await });
    let lines = read_lines(&log);
    let lines: Vec<Line<'_>> = lines.iter().map(|l| parse(l)).collect();

    // Nothing lost: every key delivered.
    let expected: BTreeSet<String> = (0..M).map(|i| intent_key(SESSION, i)).collect();
    assert_eq!(entries.len(), M, "{name}: the outbox holds {} entries", entries.len());
    let mut reclaimed = BTreeSet::new();
    for entry in &entries {
        let key = entry.key().as_str();
        assert!(expected.contains(key), "{name}: unknown key {key}");
        assert_eq!(
            entry.status(),
            DeliveryStatus::Delivered,
            "{name}: {key} is not delivered: {:?}",
            entry.last_error()
        );
        assert!(
            entry.expired_leases() <= 1,
            "{name}: {key} reclaimed {} times",
            entry.expired_leases()
        );
        if entry.expired_leases() == 1 {
            reclaimed.insert(key.to_owned());
        }
    }

    let mut sends: BTreeMap<&str, Vec<(u32, u32)>> = BTreeMap::new();
    let mut ends: BTreeMap<&str, usize> = BTreeMap::new();
    for line in &lines {
        assert!(
            line.pid == victim_pid || line.pid == live_pid,
            "{name}: a line from pid {}, neither drainer",
            line.pid
        );
        assert!(
            expected.contains(line.key),
            "{name}: a send of unknown key {}",
            line.key
        );
        if line.start {
            sends.entry(line.key).or_default().push((line.pid, line.attempt));
        } else {
            *ends.entry(line.key).or_default() += 1;
        }
    }
    for key in &expected {
        assert!(sends.contains_key(key.as_str()), "{name}: {key} was never sent");
        assert!(ends.contains_key(key.as_str()), "{name}: no send of {key} completed");
    }

    // The bound: what the kill left in flight, and what was sent twice.
    assert!(
        reclaimed.len() <= CONCURRENCY,
        "{name}: {} keys were in flight under the victim's lease, above its concurrency {CONCURRENCY}: {reclaimed:?}",
        reclaimed.len()
    );
    let victim_started: BTreeSet<&str> = sends
        .iter()
        .filter(|(_, by)| by.iter().any(|&(pid, _)| pid == victim_pid))
        .map(|(k, _)| *k)
        .collect();
    let mut extras = 0;
    for (key, by) in &sends {
        if by.len() > 1 {
            extras += by.len() - 1;
            assert!(
                reclaimed.contains(*key) && victim_started.contains(key),
                "{name}: {key} was sent {} times ({by:?}) without the victim having started it and died before its record",
                by.len()
            );
            assert_eq!(by.len(), 2, "{name}: {key} sent {by:?}: one kill repeats a send once");
            assert_eq!(
                by[0].0, victim_pid,
                "{name}: {key}: the first send {by:?} is not the victim's"
            );
            assert_eq!(
                by[1].0, live_pid,
                "{name}: {key}: the repeat {by:?} is not the live drainer's"
            );
            assert!(by[0].1 < by[1].1, "{name}: {key}: attempts {by:?} not increasing");
        }
    }
    let started_unrecorded = reclaimed.iter().filter(|k| victim_started.contains(k.as_str())).count();
    assert_eq!(
        extras, started_unrecorded,
        "{name}: extra sends differ from the victim's started sends with no durable record"
    );
    assert!(
        extras <= CONCURRENCY,
        "{name}: {extras} extra sends, above {CONCURRENCY}"
    );
    for key in &reclaimed {
        let by = &sends[key.as_str()];
        assert!(
            by.iter().any(|&(pid, _)| pid == live_pid),
            "{name}: reclaimed {key} was not sent by the live drainer: {by:?}"
        );
    }

    let victim_sends = lines.iter().filter(|l| l.start && l.pid == victim_pid).count();
    let live_sends = lines.iter().filter(|l| l.start && l.pid == live_pid).count();
    let _ = std::fs::remove_file(&db);
    Row {
        trial,
        kill_ms,
        delay_ms,
        victim_sends,
        live_sends,
        reclaimed: reclaimed.len(),
        extras,
        elapsed: started.elapsed(),
    }
}

fn suite(trials: usize) {
    let seed = env("REACTIFACT_CRASH_SEED").map_or(0x5eed_d2a1, |s| s.parse().expect("REACTIFACT_CRASH_SEED"));
    let parallel = env("REACTIFACT_CRASH_PARALLEL").map_or(4, |s| s.parse().expect("REACTIFACT_CRASH_PARALLEL"));
    let dir = scratch_dir(&format!("crash-drainer-{trials}"));
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let rows = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..parallel.max(1) {
            scope.spawn(|| loop {
                let t = next.fetch_add(1, Ordering::SeqCst);
                if t >= trials {
                    return;
                }
                let mut rng = Rng::new(mix(seed ^ mix(t as u64 + 1)));
                let row = trial(&dir, t, &mut rng);
                eprintln!("crash_drainer: {row:?}");
                rows.lock().unwrap().push(row);
            });
        }
    });
    let mut rows = rows.into_inner().unwrap();
    rows.sort_by_key(|r| r.trial);

    eprintln!("\ncrash_drainer: {trials} trials, seed {seed:#x}, {M} intents each, lease {LEASE:?}, concurrency {CONCURRENCY}");
    eprintln!("trial  kill_ms  delay_ms  victim_sends  live_sends  reclaimed  extras  trial_s");
    for r in &rows {
        eprintln!(
            "{:>5}  {:>7}  {:>8}  {:>12}  {:>10}  {:>9}  {:>6}  {:>7.2}",
            r.trial,
            r.kill_ms,
            r.delay_ms,
            r.victim_sends,
            r.live_sends,
            r.reclaimed,
            r.extras,
            r.elapsed.as_secs_f64()
        );
    }
    let with_reclaim = rows.iter().filter(|r| r.reclaimed > 0).count();
    let extras: usize = rows.iter().map(|r| r.extras).sum();
    let max_extras = rows.iter().map(|r| r.extras).max().unwrap_or(0);
    let reclaimed: usize = rows.iter().map(|r| r.reclaimed).sum();
    eprintln!(
        "summary: {trials} trials in {:.1?}; {with_reclaim} left leases to reclaim ({reclaimed} keys); \
         {extras} extra sends in all, at most {max_extras} in one trial (bound {CONCURRENCY})",
        started.elapsed()
    );
    assert!(
        with_reclaim > 0,
        "no kill left anything in flight: the suite tested no reclaim"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn trials(default: usize) -> usize {
    env("REACTIFACT_CRASH_TRIALS").map_or(default, |s| s.parse().expect("REACTIFACT_CRASH_TRIALS"))
}

#[test]
fn a_drainer_sigkilled_mid_dispatch_is_reclaimed_by_a_live_one_with_bounded_resends() {
    suite(trials(50));
}

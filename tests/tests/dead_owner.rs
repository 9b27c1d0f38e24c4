//! A drainer process SIGKILLed mid-delivery, under leases of an hour: a drainer started after
//! it on the same host proves it dead (its pid is gone) and takes its claims over at once,
//! instead of waiting out the hour, while the claims of a drainer process that is still alive
//! on the same file stay its own.
//!
//! 1. The parent commits M = 40 intents to a fresh SQLite file (no dispatcher: they stay
//!    pending).
//! 2. It starts two drainer processes, one after the other (this test binary re-executed, the
//!    mode chosen by environment variables, as in `crash_drainer.rs`): the *victim*, then the
//!    *holder*, each `Drainer::serve` with 8 deliveries at once, a 1-hour lease and no
//!    delivery timeout; each dispatch appends `S key pid attempt` to a shared log and then
//!    never returns. The parent polls the log until each has started its 8 dispatches.
//! 3. It SIGKILLs the victim and reaps it.
//! 4. It serves a drainer of its own on the file until the file says every intent but the
//!    holder's 8 is delivered (a limit of minutes turns a hang into a failure).
//! 5. It SIGKILLs the holder, reaps it, and serves a second drainer until every intent is
//!    delivered.
//!
//! Checked, from the file's ledger, the log, the parent's dispatcher and the parent's log
//! events: after step 4 the victim's 8 keys are delivered, each with one expired lease and a
//! second attempt (the parent's, with the same key and the committed payload), delivered
//! before the victim's lease would have expired; the holder's 8 are still in flight under its
//! lease, token 1; every other key was delivered once; the take-over was logged with the
//! victim's owner and 8 keys, and nothing of the holder's was taken. After step 5 the holder's
//! keys are taken over the same way, and every key is delivered: none lost, and none sent more
//! than once by the parent.
//!
//! No assertion depends on timing: the only times compared are the ledger's (delivered before
//! the lease's expiry, an hour after the claim).

mod procs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use procs::{
    all_entries, assert_success, block_on, commit_intents, counts, env, intent_key, killed_by_sigkill, open_outbox,
    read_lines, scratch_dir, seed_orders, spawn_child, LineLog, Notify,
};
use reactifact_core::ledger::{AttemptOutcome, Delivery, DeliveryStatus, FenceToken, StatusCounts};
use reactifact_core::runtime::StopHandle;
use reactifact_core::store::OutboxStore;
use reactifact_core::{Context, DeliveryOptions, DispatchError, Drainer, Intent};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};
use tracing_subscriber::Layer;

const SESSION: &str = "orders";
/// Intents.
const M: usize = 40;
/// Each child's delivery concurrency: what it holds in flight.
const CONCURRENCY: usize = 8;
const LEASE: Duration = Duration::from_secs(60 * 60);
const POLL: Duration = Duration::from_millis(20);
const CHILD: &str = "dead_owner_child";
/// Turns a hang into a failure; far below the lease.
const LIMIT: Duration = Duration::from_secs(120);

/// The child's entry point: a drainer whose every dispatch hangs; a no-op unless the parent
/// set the environment.
#[test]
fn dead_owner_child() {
    let (Some(db), Some(log)) = (env("REACTIFACT_DO_DB"), env("REACTIFACT_DO_LOG")) else {
        return;
    };
    let log = LineLog::open(log.as_ref()).unwrap();
    let pid = std::process::id();
    block_on(async {
        let outbox = open_outbox(db.as_ref());
        let dispatcher = move |intent: Intent| {
            let log = log.clone();
            async move {
                log.line(&format!("S {} {pid} {}", intent.key(), intent.attempt()))?;
                std::future::pending::<()>().await;
                Ok::<(), DispatchError>(())
            }
        };
        let drainer = Drainer::builder(outbox, dispatcher)
            .delivery(
                DeliveryOptions::new()
                    .concurrency(CONCURRENCY)
                    .lease(LEASE)
                    .timeout(None),
            )
            .poll_interval(POLL)
            .build()
            .expect("valid delivery options");
        let stop = StopHandle::default();
        // Killed long before this; it only ends an orphan.
        let orphan = async {
            tokio::time::sleep(LIMIT * 2).await;
            stop.stop();
        };
        let (served, ()) = tokio::join!(drainer.serve(stop.clone()), orphan);
        served.unwrap();
    });
}

/// A child process, SIGKILLed and reaped when dropped if it still runs.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts a hanging drainer child, and waits (polling the log) until it has started
/// `CONCURRENCY` dispatches; returns it and the keys it holds.
fn start_holder(dir: &Path, name: &str, db: &Path, log: &Path) -> (Process, BTreeSet<String>) {
    let stderr = dir.join(format!("{name}.stderr"));
    let env = [
        ("REACTIFACT_DO_DB", db.display().to_string()),
        ("REACTIFACT_DO_LOG", log.display().to_string()),
    ];
    let mut child = Process(spawn_child(CHILD, &env, &stderr));
    let tag = format!(" {} ", child.0.id());
    let started = Instant::now();
    loop {
        let keys: BTreeSet<String> = read_lines(log)
            .iter()
            .filter(|l| l.starts_with("S ") && l.contains(&tag))
            .map(|l| l.split(' ').nth(1).expect("a key").to_owned())
            .collect();
        if keys.len() == CONCURRENCY {
            return (child, keys);
        }
        assert!(
            keys.len() < CONCURRENCY,
            "{name} started {} dispatches: {keys:?}",
            keys.len()
        );
        if let Some(status) = child.0.try_wait().unwrap() {
            assert_success(status, &format!("{name} exited by itself"), &stderr);
            panic!("{name} exited by itself");
        }
        assert!(started.elapsed() < LIMIT, "{name} never started its dispatches");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// SIGKILLs and reaps a child.
fn kill(mut child: Process, name: &str) {
    child.0.kill().unwrap();
    let status = child.0.wait().unwrap();
    assert!(killed_by_sigkill(status), "{name} was not killed by SIGKILL ({status})");
}

/// What the parent's drainers were handed: (key, attempt) in order.
type Sent = Arc<Mutex<Vec<(String, u32)>>>;

/// Serves a drainer of the parent on `db` until `done` holds for the file's counts.
async fn serve_until(db: &Path, sent: &Sent, done: impl Fn(&StatusCounts) -> bool) -> u64 {
    let outbox = open_outbox(db);
    let record = sent.clone();
    let dispatcher = move |intent: Intent| {
        let record = record.clone();
        async move {
            let payload: Notify = intent.payload().map_err(DispatchError::permanent)?;
            assert_eq!(
                intent.key().as_str(),
                format!("notify:{}", payload.order),
                "a payload of another key"
            );
            record
                .lock()
                .unwrap()
                .push((intent.key().to_string(), intent.attempt()));
            Ok::<(), DispatchError>(())
        }
    };
    let drainer = Drainer::builder(outbox.clone(), dispatcher)
        .delivery(DeliveryOptions::new().concurrency(CONCURRENCY))
        .poll_interval(POLL)
        .build()
        .expect("valid delivery options");
    let stop = StopHandle::default();
    let watcher = async {
        loop {
            if done(&counts(&*outbox).await) {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        stop.stop();
    };
    let served = tokio::time::timeout(LIMIT, async { tokio::join!(drainer.serve(stop.clone()), watcher) }).await;
    let (report, ()) = served.unwrap_or_else(|_| {
        panic!("the parent's drainer did not finish within {LIMIT:?}: the dead owner's claims were not taken over")
    });
    let report = report.expect("the parent's drainer");
    assert_eq!(report.stale, 0, "the parent's outcomes were rejected as stale");
    report.delivered
}

/// The warn events of the take-over, as (owner, count, keys).
#[derive(Clone, Default)]
struct TakeOvers(Arc<Mutex<Vec<BTreeMap<String, String>>>>);

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> Layer<S> for TakeOvers {
    fn on_event(&self, event: &tracing::Event<'_>, _: LayerContext<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields
            .0
            .get("message")
            .is_some_and(|m| m.contains("took over the claims of a dead lease owner"))
        {
            self.0.lock().unwrap().push(fields.0);
        }
    }
}

impl TakeOvers {
    fn take(&self) -> Vec<BTreeMap<String, String>> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

fn by_key(entries: Vec<Delivery>) -> BTreeMap<String, Delivery> {
    entries.into_iter().map(|d| (d.key().to_string(), d)).collect()
}

/// Checks a key taken over from `holder` (pid): delivered by the parent at attempt 2, after
/// one expired lease, before the holder's lease would have expired.
async fn assert_taken_over(outbox: &dyn OutboxStore, d: &Delivery, holder: u32) -> String {
    let key = d.key().as_str();
    assert_eq!(d.status(), DeliveryStatus::Delivered, "{key}: {:?}", d.last_error());
    assert_eq!(
        (d.attempts(), d.expired_leases(), d.failed_attempts(), d.token()),
        (2, 1, 0, FenceToken(2)),
        "{key}: taken over once, then delivered"
    );
    let history = outbox.attempts(key).await.unwrap().expect("the key's history");
    assert_eq!(history.len(), 2, "{key}: {history:?}");
    let (dead, parent) = (&history[0], &history[1]);
    assert_eq!(dead.outcome, AttemptOutcome::Expired, "{key}: {history:?}");
    assert!(
        dead.owner.starts_with(&format!("pid {holder} started ")) && dead.owner.contains(" on "),
        "{key}: the first attempt's owner {}",
        dead.owner
    );
    assert_eq!(parent.outcome, AttemptOutcome::Delivered, "{key}: {history:?}");
    assert!(
        parent
            .owner
            .starts_with(&format!("pid {} started ", std::process::id())),
        "{key}: the delivery's owner {}",
        parent.owner
    );
    let delivered = d.delivered_at().expect("delivered");
    assert_eq!(
        dead.lease_expires_at,
        dead.claimed_at + LEASE,
        "{key}: the dead holder's lease"
    );
    assert!(
        dead.ended_at.expect("ended") < dead.lease_expires_at && delivered < dead.lease_expires_at,
        "{key}: taken over and delivered only once the dead holder's lease expired: {history:?}"
    );
    dead.owner.to_string()
}

#[test]
fn a_drainer_started_after_a_killed_one_takes_its_claims_over_at_once_and_never_a_live_ones() {
    if !Path::new("/proc/self/stat").exists() {
        eprintln!("skipped: no /proc, so no owner can be proved dead");
        return;
    }
    let dir = scratch_dir("dead-owner");
    let db = dir.join("outbox.db");
    let log = dir.join("sends.log");
    let mut ctx = Context::open(&db, SESSION).unwrap();
    seed_orders(&mut ctx, SESSION, M);
    commit_intents(ctx);

    let (victim, victim_keys) = start_holder(&dir, "victim", &db, &log);
    let (holder, holder_keys) = start_holder(&dir, "holder", &db, &log);
    let (victim_pid, holder_pid) = (victim.0.id(), holder.0.id());
    assert!(victim_keys.is_disjoint(&holder_keys));
    let before = block_on(async { counts(&*open_outbox(&db)).await });
    assert_eq!(
        (before.in_flight, before.pending),
        (2 * CONCURRENCY as u64, (M - 2 * CONCURRENCY) as u64)
    );
    kill(victim, "the victim");

    let take_overs = TakeOvers::default();
    let subscriber = tracing_subscriber::registry().with(take_overs.clone());
    let _default = tracing::subscriber::set_default(subscriber);
    let sent: Sent = Arc::default();
    let outbox = open_outbox(&db);

    // Step 4: every intent but the live holder's, at once.
    let rest = (M - CONCURRENCY) as u64;
    let delivered = block_on(serve_until(&db, &sent, |c| {
        c.delivered == rest && c.pending == 0 && c.in_flight == CONCURRENCY as u64
    }));
    assert_eq!(delivered, rest, "the first drainer's deliveries");
    let entries = by_key(block_on(all_entries(&*outbox)));
    assert_eq!(entries.len(), M, "an intent was lost");
    let mut victim_owner = None;
    for key in &victim_keys {
        let owner = block_on(assert_taken_over(&*outbox, &entries[key], victim_pid));
        match &victim_owner {
            None => victim_owner = Some(owner),
            Some(first) => assert_eq!(first, &owner, "{key}: the victim's owners differ"),
        }
    }
    for key in &holder_keys {
        let d = &entries[key];
        assert_eq!(
            d.status(),
            DeliveryStatus::InFlight,
            "{key}: a live holder's claim was taken"
        );
        let lease = d.lease().expect("the holder's lease");
        assert!(
            lease.owner.starts_with(&format!("pid {holder_pid} started ")),
            "{key}: {lease:?}"
        );
        assert_eq!(
            (d.token(), d.attempts(), d.expired_leases()),
            (FenceToken(1), 1, 0),
            "{key}"
        );
    }
    for (key, d) in &entries {
        if !victim_keys.contains(key) && !holder_keys.contains(key) {
            assert_eq!(d.status(), DeliveryStatus::Delivered, "{key}");
            assert_eq!((d.attempts(), d.expired_leases()), (1, 0), "{key}");
        }
    }
    let logged = take_overs.take();
    assert_eq!(logged.len(), 1, "one owner taken over: {logged:?}");
    assert_eq!(logged[0].get("owner"), victim_owner.as_ref(), "{logged:?}");
    assert_eq!(logged[0].get("count").map(String::as_str), Some("8"), "{logged:?}");
    for key in &victim_keys {
        assert!(logged[0]["keys"].contains(key.as_str()), "{key} not in {logged:?}");
    }

    // Step 5: the holder dies too; the next drainer takes its claims over.
    kill(holder, "the holder");
    let delivered = block_on(serve_until(&db, &sent, |c| c.delivered == M as u64));
    assert_eq!(delivered, CONCURRENCY as u64, "the second drainer's deliveries");
    let entries = by_key(block_on(all_entries(&*outbox)));
    assert_eq!(entries.len(), M, "an intent was lost");
    for key in &holder_keys {
        block_on(assert_taken_over(&*outbox, &entries[key], holder_pid));
    }
    let logged = take_overs.take();
    assert_eq!(logged.len(), 1, "one owner taken over: {logged:?}");
    assert!(
        logged[0]["owner"].starts_with(&format!("pid {holder_pid} started ")),
        "{logged:?}"
    );

    // Every key delivered; the parent sent each once: the taken-over ones at attempt 2 (after
    // the dead holders' attempt 1, in the log), the others at attempt 1.
    assert!(entries.values().all(|d| d.status() == DeliveryStatus::Delivered));
    let sent = sent.lock().unwrap().clone();
    let mut seen = BTreeMap::new();
    for (key, attempt) in &sent {
        assert!(
            seen.insert(key.clone(), *attempt).is_none(),
            "{key} sent twice by the parent"
        );
    }
    let expected: BTreeSet<String> = (0..M).map(|i| intent_key(SESSION, i)).collect();
    assert_eq!(
        seen.keys().cloned().collect::<BTreeSet<_>>(),
        expected,
        "keys sent by the parent"
    );
    let children: BTreeMap<String, u32> = read_lines(&log)
        .iter()
        .map(|l| {
            let parts: Vec<&str> = l.split(' ').collect();
            (parts[1].to_owned(), parts[3].parse().unwrap())
        })
        .collect();
    for (key, attempt) in &seen {
        let taken = victim_keys.contains(key) || holder_keys.contains(key);
        assert_eq!(*attempt, if taken { 2 } else { 1 }, "{key}: the parent's attempt");
        assert_eq!(children.get(key), taken.then_some(&1), "{key}: the children's sends");
    }
    drop(outbox);
    let _ = std::fs::remove_dir_all(&dir);
}

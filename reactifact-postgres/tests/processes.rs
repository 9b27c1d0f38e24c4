//! Drainers in real OS processes on one PostgreSQL outbox: tasks and processes sharing 10,000
//! intents, a drainer SIGKILLed mid-delivery, a holder frozen (SIGSTOP) past its lease, and 20
//! SIGKILL trials of a worker. Runs when `REACTIFACT_TEST_POSTGRES_URL` is set (see
//! `common`); each test in a schema of its own.
//!
//! A child is this test binary re-executed to run `child_drainer` with `--exact`; the child test
//! does nothing unless `RFT_PG_CHILD` is set, so a plain `cargo test` runs it as an empty test.
//! A child runs a `Drainer` over `PostgresOutbox::open` of the test's schema; its dispatcher
//! appends `key attempt pid` to the child's log (one `write` per line on an `O_APPEND` file, so
//! a SIGKILL never leaves half a line) before it returns, or hangs, or waits for a gate file;
//! once it returns, it appends `end KEY` (not a send: `read_sends` skips it).

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use reactifact_core::ledger::{DeliveryStatus, LedgerQuery};
use reactifact_core::store::OutboxStore;
use reactifact_core::{DeliveryOptions, DispatchError, Drainer, Intent, Scope};
use reactifact_postgres::{PostgresOptions, PostgresOutbox};
use reactifact_store_contract::{grouped_intents, new_intents};

use common::Schemas;

const CHILD: &str = "child_drainer";

// ---------------------------------------------------------------------------------------------
// The child.

/// The child process's entry: a drainer of `RFT_PG_SCHEMA` that settles the store, then writes
/// its report (`delivered stale`) to `RFT_PG_REPORT`.
#[test]
fn child_drainer() {
    if std::env::var("RFT_PG_CHILD").is_err() {
        return;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set for a child"));
    let url = var("RFT_PG_URL");
    let schema = var("RFT_PG_SCHEMA");
    let log = LineLog::open(Path::new(&var("RFT_PG_LOG")));
    let concurrency: usize = var("RFT_PG_CONCURRENCY").parse().unwrap();
    let lease = Duration::from_millis(var("RFT_PG_LEASE_MS").parse().unwrap());
    let dispatch = Dispatch::parse(&var("RFT_PG_DISPATCH"));
    let report_path = var("RFT_PG_REPORT");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let outbox = PostgresOutbox::open(PostgresOptions::new(&url).schema(&schema).pool_size(4))
            .await
            .expect("the child opens the store");
        let drainer = drainer(outbox, log, dispatch, concurrency, lease);
        let report = drainer.settle().await.expect("the child's drain");
        std::fs::write(&report_path, format!("{} {}\n", report.delivered, report.stale)).unwrap();
    });
}

/// What a dispatcher does after it logged its send.
#[derive(Clone, Debug)]
enum Dispatch {
    /// Returns at once.
    Done,
    /// Sleeps this long, then returns.
    Sleep(Duration),
    /// Never returns (the process is killed).
    Hang,
    /// Waits until this file exists, then returns.
    Gate(PathBuf),
}

impl Dispatch {
    fn parse(s: &str) -> Dispatch {
        match s.split_once(':') {
            None if s == "done" => Dispatch::Done,
            None if s == "hang" => Dispatch::Hang,
            Some(("sleep", ms)) => Dispatch::Sleep(Duration::from_millis(ms.parse().unwrap())),
            Some(("gate", path)) => Dispatch::Gate(PathBuf::from(path)),
            _ => panic!("an unknown dispatch `{s}`"),
        }
    }

    fn arg(&self) -> String {
        match self {
            Dispatch::Done => "done".into(),
            Dispatch::Hang => "hang".into(),
            Dispatch::Sleep(d) => format!("sleep:{}", d.as_millis()),
            Dispatch::Gate(path) => format!("gate:{}", path.display()),
        }
    }
}

/// A drainer of `outbox` whose dispatcher logs each send to `log`, then does as `dispatch` says.
fn drainer(
    outbox: Arc<PostgresOutbox>,
    log: LineLog,
    dispatch: Dispatch,
    concurrency: usize,
    lease: Duration,
) -> Drainer {
    let pid = std::process::id();
    Drainer::builder(outbox, move |intent: Intent| {
        let (log, dispatch) = (log.clone(), dispatch.clone());
        async move {
            log.line(&format!("{} {} {pid}", intent.key(), intent.attempt()));
            match dispatch {
                Dispatch::Done => {}
                Dispatch::Sleep(d) => tokio::time::sleep(d).await,
                Dispatch::Hang => std::future::pending::<()>().await,
                Dispatch::Gate(path) => {
                    while !path.exists() {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            log.line(&format!("end {}", intent.key()));
            Ok::<(), DispatchError>(())
        }
    })
    .delivery(DeliveryOptions::new().concurrency(concurrency).lease(lease))
    .poll_interval(Duration::from_millis(50))
    .build()
    .expect("valid delivery options")
}

/// An append-only log shared by processes: each line one `write` on an `O_APPEND` file.
#[derive(Clone)]
struct LineLog(Arc<std::fs::File>);

impl LineLog {
    fn open(path: &Path) -> LineLog {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        LineLog(Arc::new(file))
    }

    fn line(&self, line: &str) {
        let bytes = format!("{line}\n").into_bytes();
        let written = (&*self.0).write(&bytes).expect("append a line");
        assert_eq!(written, bytes.len(), "a short append");
    }
}

// ---------------------------------------------------------------------------------------------
// The parent's side.

/// One logged send: key, attempt, pid.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Send {
    key: String,
    attempt: u32,
    pid: u32,
}

fn read_sends(path: &Path) -> Vec<Send> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|line| !line.starts_with("end "))
        .map(|line| {
            let mut parts = line.split(' ');
            let (key, attempt, pid) = (parts.next(), parts.next(), parts.next());
            Send {
                key: key.expect("a key").to_owned(),
                attempt: attempt.expect("an attempt").parse().expect("a number"),
                pid: pid.expect("a pid").parse().expect("a number"),
            }
        })
        .collect()
}

/// The files of one test.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("rft-pg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Dir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child drainer: its process, log, report and stderr files.
struct ChildDrainer {
    child: Child,
    log: PathBuf,
    report: PathBuf,
    stderr: PathBuf,
}

struct ChildSpec<'a> {
    url: &'a str,
    schema: &'a str,
    concurrency: usize,
    lease: Duration,
    dispatch: Dispatch,
    /// A log the child shares with others (one `write` per line on an `O_APPEND` file: the
    /// file's order is the order of the sends and ends of every child), instead of its own.
    shared_log: Option<PathBuf>,
}

fn spawn(dir: &Dir, name: &str, spec: &ChildSpec<'_>) -> ChildDrainer {
    let (log, report, stderr) = (
        dir.path(&format!("{name}.log")),
        dir.path(&format!("{name}.report")),
        dir.path(&format!("{name}.stderr")),
    );
    let log = spec.shared_log.clone().unwrap_or(log);
    let child = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", CHILD, "--test-threads=1", "--quiet", "--nocapture"])
        .env("RFT_PG_CHILD", "1")
        .env("RFT_PG_URL", spec.url)
        .env("RFT_PG_SCHEMA", spec.schema)
        .env("RFT_PG_LOG", &log)
        .env("RFT_PG_REPORT", &report)
        .env("RFT_PG_CONCURRENCY", spec.concurrency.to_string())
        .env("RFT_PG_LEASE_MS", spec.lease.as_millis().to_string())
        .env("RFT_PG_DISPATCH", spec.dispatch.arg())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).expect("the child's stderr file"))
        .spawn()
        .expect("spawn a child drainer");
    ChildDrainer {
        child,
        log,
        report,
        stderr,
    }
}

impl ChildDrainer {
    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits (a bounded poll of its log) until the child has logged `n` sends.
    fn wait_for_sends(&mut self, n: usize, limit: Duration) {
        let started = Instant::now();
        while read_sends(&self.log).len() < n {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "the child exited ({status}) before {n} sends; its stderr:\n{}",
                    self.stderr()
                );
            }
            assert!(
                started.elapsed() < limit,
                "the child logged no {n} sends within {limit:?}; its stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Waits for the child to exit (a bounded poll); kills it and fails if it does not.
    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if started.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "the child did not exit within {limit:?}; its stderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn kill(&mut self) {
        self.signal("-KILL");
        let status = self.wait(Duration::from_secs(30));
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "{status}"
        );
    }

    /// The child's report: (delivered, stale).
    fn report(&self) -> (u64, u64) {
        let text = std::fs::read_to_string(&self.report)
            .unwrap_or_else(|e| panic!("the child's report: {e}; its stderr:\n{}", self.stderr()));
        let mut parts = text.split_whitespace().map(|n| n.parse::<u64>().unwrap());
        (parts.next().unwrap(), parts.next().unwrap())
    }
}

impl Drop for ChildDrainer {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill")
                .args(["-CONT", &self.child.id().to_string()])
                .status();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Registers `n` intents `{prefix}:{i}` of session `s`, 1,000 per transaction.
async fn register(outbox: &PostgresOutbox, prefix: &str, n: usize) -> Vec<String> {
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}:{i}")).collect();
    for (g, chunk) in names.chunks(1000).enumerate() {
        let pairs: Vec<(&str, &str)> = chunk.iter().map(|k| (k.as_str(), "email")).collect();
        outbox
            .register_alone(&new_intents("s", g as u64 + 1, &pairs), SystemTime::now())
            .await
            .expect("register");
    }
    names
}

/// Registers `per_group` intents `g{g}:{round}` in each of `groups` ordering groups
/// `order:{g}`, interleaved across groups (round by round), one transaction each.
async fn register_groups(outbox: &PostgresOutbox, groups: usize, per_group: usize) {
    for round in 0..per_group {
        for g in 0..groups {
            let key = format!("g{g}:{round}");
            let generation = (round * groups + g + 1) as u64;
            let intents = grouped_intents("s", generation, &[(&key, "webhook")], &format!("order:{g}"), false);
            outbox
                .register_alone(&intents, SystemTime::now())
                .await
                .expect("register");
        }
    }
}

/// Every entry of the store.
async fn entries(outbox: &PostgresOutbox) -> Vec<reactifact_core::ledger::Delivery> {
    let mut all = Vec::new();
    let mut query = LedgerQuery {
        limit: 1000,
        ..LedgerQuery::default()
    };
    loop {
        let page = outbox.list(&query).await.expect("list the outbox");
        all.extend(page.entries);
        match page.next {
            Some(next) => query.after = Some(next),
            None => return all,
        }
    }
}

/// Every send of `sends`, grouped by key.
fn by_key(sends: &[Send]) -> BTreeMap<&str, Vec<&Send>> {
    let mut map: BTreeMap<&str, Vec<&Send>> = BTreeMap::new();
    for send in sends {
        map.entry(send.key.as_str()).or_default().push(send);
    }
    map
}

async fn open(schemas: &Schemas, pool: usize) -> (Arc<PostgresOutbox>, String) {
    let schema = schemas.name();
    let outbox = PostgresOutbox::open(
        PostgresOptions::new(std::env::var(common::URL_VAR).unwrap())
            .schema(&schema)
            .pool_size(pool),
    )
    .await
    .expect("open the store");
    (outbox, schema)
}

// ---------------------------------------------------------------------------------------------
// The tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_drainer_tasks_and_two_drainer_processes_deliver_each_of_10000_keys_once() {
    let Some(url) = common::url("four_drainer_tasks_and_two_drainer_processes_deliver_each_of_10000_keys_once") else {
        return;
    };
    let schemas = Schemas::new(&url, "procs_once");
    let (outbox, schema) = open(&schemas, 8).await;
    let dir = Dir::new("once");
    let keys = register(&outbox, "once", 10_000).await;

    let spec = ChildSpec {
        url: &url,
        schema: &schema,
        concurrency: 32,
        lease: Duration::from_secs(30),
        dispatch: Dispatch::Done,
        shared_log: None,
    };
    let mut children = [spawn(&dir, "a", &spec), spawn(&dir, "b", &spec)];
    let parent_log = dir.path("parent.log");
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let drainer = drainer(
                outbox.clone(),
                LineLog::open(&parent_log),
                Dispatch::Done,
                32,
                Duration::from_secs(30),
            );
            tokio::spawn(async move { drainer.settle().await.expect("a task's drain").delivered })
        })
        .collect();
    let mut delivered = 0;
    for task in tasks {
        delivered += task.await.unwrap();
    }
    for child in &mut children {
        let status = tokio::task::block_in_place(|| child.wait(Duration::from_secs(60)));
        assert!(status.success(), "{status}; its stderr:\n{}", child.stderr());
        delivered += child.report().0;
    }

    let mut sends = read_sends(&parent_log);
    let mut per_process = Vec::new();
    for child in &children {
        let theirs = read_sends(&child.log);
        per_process.push(theirs.len());
        sends.extend(theirs);
    }
    let grouped = by_key(&sends);
    let twice: Vec<_> = grouped.iter().filter(|(_, s)| s.len() > 1).take(5).collect();
    assert!(twice.is_empty(), "keys sent more than once: {twice:?}");
    let sent: HashSet<&str> = grouped.keys().copied().collect();
    let expected: HashSet<&str> = keys.iter().map(String::as_str).collect();
    assert_eq!(sent, expected, "every key sent");
    assert_eq!(delivered, 10_000, "the drains' reports");
    assert!(
        per_process.iter().all(|&n| n > 0),
        "each drainer process delivered some: {per_process:?} of {}",
        sends.len()
    );
    for entry in entries(&outbox).await {
        assert_eq!(entry.status(), DeliveryStatus::Delivered, "{}", entry.key());
        assert_eq!(entry.attempts(), 1, "{}", entry.key());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drainer_killed_mid_delivery_has_its_keys_delivered_again_with_the_same_key() {
    let Some(url) = common::url("a_drainer_killed_mid_delivery_has_its_keys_delivered_again_with_the_same_key") else {
        return;
    };
    let schemas = Schemas::new(&url, "procs_kill");
    let (outbox, schema) = open(&schemas, 4).await;
    let dir = Dir::new("kill");
    let keys = register(&outbox, "kill", 200).await;
    let concurrency = 16;
    let mut child = spawn(
        &dir,
        "victim",
        &ChildSpec {
            url: &url,
            schema: &schema,
            concurrency,
            lease: Duration::from_secs(2),
            dispatch: Dispatch::Hang,
            shared_log: None,
        },
    );
    // Every slot holds a delivery that was handed out and will never be recorded.
    tokio::task::block_in_place(|| {
        child.wait_for_sends(concurrency, Duration::from_secs(30));
        child.kill();
    });
    let victim: Vec<Send> = read_sends(&child.log);
    assert_eq!(victim.len(), concurrency, "{victim:?}");
    let counts = outbox.counts(&Scope::all()).await.unwrap();
    assert_eq!(counts.in_flight, concurrency as u64, "{counts:?}");
    for send in &victim {
        let entry = outbox.get(&send.key).await.unwrap().expect("the entry");
        assert_eq!(entry.status(), DeliveryStatus::InFlight, "{}", send.key);
    }

    // A live drainer waits for the dead holder's leases to expire, then delivers them again.
    let log = dir.path("rescuer.log");
    let rescuer = drainer(
        outbox.clone(),
        LineLog::open(&log),
        Dispatch::Done,
        16,
        Duration::from_secs(30),
    );
    let report = rescuer.settle().await.expect("the rescuer's drain");
    assert_eq!(report.delivered, 200);
    let rescued = read_sends(&log);
    let grouped = by_key(&rescued);
    assert_eq!(grouped.len(), 200, "every key once by the rescuer");
    assert!(grouped.values().all(|s| s.len() == 1));
    let victim_keys: HashSet<&str> = victim.iter().map(|s| s.key.as_str()).collect();
    for key in &keys {
        let send = grouped[key.as_str()][0];
        let entry = outbox.get(key).await.unwrap().expect("the entry");
        assert_eq!(entry.status(), DeliveryStatus::Delivered, "{key}");
        if victim_keys.contains(key.as_str()) {
            // The same key, the next attempt; the dead holder's lease counted as expired.
            assert_eq!(send.attempt, 2, "{key}");
            assert_eq!(entry.attempts(), 2, "{key}");
            assert_eq!(entry.expired_leases(), 1, "{key}");
        } else {
            assert_eq!(send.attempt, 1, "{key}");
            assert_eq!(entry.attempts(), 1, "{key}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_frozen_past_its_lease_has_its_late_success_rejected() {
    let Some(url) = common::url("a_holder_frozen_past_its_lease_has_its_late_success_rejected") else {
        return;
    };
    let schemas = Schemas::new(&url, "procs_stale");
    let (outbox, schema) = open(&schemas, 4).await;
    let dir = Dir::new("stale");
    register(&outbox, "stale", 1).await;
    let gate = dir.path("gate");
    let mut child = spawn(
        &dir,
        "frozen",
        &ChildSpec {
            url: &url,
            schema: &schema,
            concurrency: 1,
            lease: Duration::from_secs(2),
            dispatch: Dispatch::Gate(gate.clone()),
            shared_log: None,
        },
    );
    // The holder has handed the key out; freeze it there (no renewal, no record).
    tokio::task::block_in_place(|| {
        child.wait_for_sends(1, Duration::from_secs(30));
        child.signal("-STOP");
    });
    let held = outbox.get("stale:0").await.unwrap().unwrap();
    assert_eq!(held.status(), DeliveryStatus::InFlight);
    let old_token = held.token();

    // Another drainer reclaims it when the lease expires and delivers it.
    let log = dir.path("rescuer.log");
    let rescuer = drainer(
        outbox.clone(),
        LineLog::open(&log),
        Dispatch::Done,
        4,
        Duration::from_secs(30),
    );
    let report = rescuer.settle().await.expect("the rescuer's drain");
    assert_eq!(report.delivered, 1);
    assert_eq!(read_sends(&log)[0].attempt, 2);
    let delivered = outbox.get("stale:0").await.unwrap().unwrap();
    assert_eq!(delivered.status(), DeliveryStatus::Delivered);
    assert!(delivered.token() > old_token);

    // The frozen holder wakes, its dispatcher returns success: the store rejects it as stale.
    std::fs::write(&gate, b"go").unwrap();
    child.signal("-CONT");
    let status = tokio::task::block_in_place(|| child.wait(Duration::from_secs(60)));
    assert!(status.success(), "{status}; its stderr:\n{}", child.stderr());
    assert_eq!(
        child.report(),
        (0, 1),
        "the holder delivered nothing and had one stale outcome"
    );
    let after = outbox.get("stale:0").await.unwrap().unwrap();
    assert_eq!(format!("{after:?}"), format!("{delivered:?}"), "the entry is unchanged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_sigkilled_workers_lose_nothing_and_resend_only_what_was_in_flight() {
    let Some(url) = common::url("twenty_sigkilled_workers_lose_nothing_and_resend_only_what_was_in_flight") else {
        return;
    };
    let schemas = Schemas::new(&url, "procs_trials");
    let (outbox, schema) = open(&schemas, 4).await;
    let dir = Dir::new("trials");
    let n = 1500;
    let keys = register(&outbox, "trial", n).await;
    let concurrency = 8;
    let spec = ChildSpec {
        url: &url,
        schema: &schema,
        concurrency,
        lease: Duration::from_secs(1),
        dispatch: Dispatch::Sleep(Duration::from_millis(2)),
        shared_log: None,
    };
    let mut killed = Vec::new();
    for trial in 0..20u32 {
        let mut child = spawn(&dir, &format!("worker-{trial}"), &spec);
        // Kill points spread over the first sends of each worker (1 to 40).
        let sends = 1 + (trial as usize * 13) % 40;
        tokio::task::block_in_place(|| {
            child.wait_for_sends(sends, Duration::from_secs(30));
            child.kill();
        });
        killed.push(read_sends(&child.log));
    }

    // The survivor: delivers the rest, and what the dead held once their leases expired.
    let log = dir.path("survivor.log");
    let survivor = drainer(
        outbox.clone(),
        LineLog::open(&log),
        Dispatch::Done,
        16,
        Duration::from_secs(30),
    );
    survivor.settle().await.expect("the survivor's drain");
    let survived = read_sends(&log);

    let mut all: Vec<Send> = killed.iter().flatten().cloned().collect();
    all.extend(survived.iter().cloned());
    let grouped = by_key(&all);
    let expected: HashSet<&str> = keys.iter().map(String::as_str).collect();
    assert_eq!(
        grouped.keys().copied().collect::<HashSet<_>>(),
        expected,
        "nothing lost"
    );
    // Each worker's sends that went out again elsewhere were in flight when it was killed:
    // at most its concurrency.
    let mut later_by: HashMap<&str, usize> = HashMap::new();
    for (index, sends) in killed.iter().enumerate() {
        let resent: Vec<&str> = sends
            .iter()
            .filter(|s| grouped[s.key.as_str()].len() > 1)
            .map(|s| s.key.as_str())
            .collect();
        assert!(
            resent.len() <= concurrency,
            "worker {index} had {} of its sends sent again (concurrency {concurrency}): {resent:?}",
            resent.len()
        );
        for key in resent {
            *later_by.entry(key).or_default() += 1;
        }
    }
    let extra: usize = grouped.values().map(|s| s.len() - 1).sum();
    assert!(extra <= 20 * concurrency, "{extra} extra sends");
    for (key, sends) in &grouped {
        // Every send of a key is another attempt of it; the survivor sent each key at most once.
        let attempts: HashSet<u32> = sends.iter().map(|s| s.attempt).collect();
        assert_eq!(attempts.len(), sends.len(), "{key}: {sends:?}");
        assert!(survived.iter().filter(|s| s.key == *key).count() <= 1, "{key}");
    }
    for entry in entries(&outbox).await {
        assert_eq!(entry.status(), DeliveryStatus::Delivered, "{}", entry.key());
        let sends = grouped[entry.key().as_str()].len() as u32;
        // A claim taken and not handed out before the kill is an attempt without a send.
        assert!(
            entry.attempts() >= sends,
            "{}: {} attempts, {sends} sends",
            entry.key(),
            entry.attempts()
        );
    }
    println!(
        "{} sends for {n} keys: {extra} extra, over {} keys",
        all.len(),
        later_by.len()
    );
}

/// 30 ordering groups of 20 intents each, registered interleaved across groups, drained by
/// three processes at once (16 deliveries at a time each, each dispatch taking 2 ms): in every
/// group the sends follow registration order, each starting only after the one before it
/// ended (the processes append to one log, whose order is the order of their writes); every
/// key is sent once, and the groups run side by side (more than one process sends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordering_groups_hold_across_three_drainer_processes() {
    let Some(url) = common::url("ordering_groups_hold_across_three_drainer_processes") else {
        return;
    };
    let schemas = Schemas::new(&url, "procs_groups");
    let (outbox, schema) = open(&schemas, 4).await;
    let dir = Dir::new("groups");
    let (groups, per_group) = (30, 20);
    register_groups(&outbox, groups, per_group).await;
    let log = dir.path("shared.log");
    let spec = ChildSpec {
        url: &url,
        schema: &schema,
        concurrency: 16,
        lease: Duration::from_secs(30),
        dispatch: Dispatch::Sleep(Duration::from_millis(2)),
        shared_log: Some(log.clone()),
    };
    let mut children = [
        spawn(&dir, "a", &spec),
        spawn(&dir, "b", &spec),
        spawn(&dir, "c", &spec),
    ];
    for child in &mut children {
        let status = tokio::task::block_in_place(|| child.wait(Duration::from_secs(120)));
        assert!(status.success(), "{status}; its stderr:\n{}", child.stderr());
    }
    // Per group: the events in log order, each a send (start) or an end.
    let text = std::fs::read_to_string(&log).expect("the shared log");
    let mut events: HashMap<String, Vec<(bool, usize)>> = HashMap::new();
    let mut senders = HashSet::new();
    for line in text.lines() {
        let (end, key) = match line.strip_prefix("end ") {
            Some(key) => (true, key),
            None => {
                let mut parts = line.split(' ');
                let key = parts.next().expect("a key");
                senders.insert(parts.nth(1).expect("a pid").to_owned());
                (false, key)
            }
        };
        let (group, round) = key.split_once(':').expect("g:round");
        events
            .entry(group.to_owned())
            .or_default()
            .push((end, round.parse().expect("a round")));
    }
    assert_eq!(events.len(), groups, "every group was sent");
    for (group, events) in &events {
        let expected: Vec<(bool, usize)> = (0..per_group).flat_map(|r| [(false, r), (true, r)]).collect();
        assert_eq!(events, &expected, "group {group}: one at a time, in registration order");
    }
    assert!(
        senders.len() > 1,
        "the groups were spread over the processes: {senders:?}"
    );
    let counts = outbox.counts(&Scope::all()).await.unwrap();
    assert_eq!(
        (counts.delivered, counts.blocked, counts.total()),
        ((groups * per_group) as u64, 0, (groups * per_group) as u64)
    );
}

/// A holder SIGKILLed in the middle of its groups: 8 groups of 5, a drainer process that
/// hangs in every send, killed once it holds each group's head. Its heads stay in flight
/// until their leases expire, their successors blocked; then a live drainer sends each head
/// again first (same key, attempt 2) and the rest of each group after it, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_mid_group_has_its_group_resume_in_order_with_the_head_first() {
    let Some(url) = common::url("a_holder_killed_mid_group_has_its_group_resume_in_order_with_the_head_first") else {
        return;
    };
    let schemas = Schemas::new(&url, "procs_group_kill");
    let (outbox, schema) = open(&schemas, 4).await;
    let dir = Dir::new("group-kill");
    let (groups, per_group) = (8, 5);
    register_groups(&outbox, groups, per_group).await;
    let mut child = spawn(
        &dir,
        "victim",
        &ChildSpec {
            url: &url,
            schema: &schema,
            concurrency: 16,
            lease: Duration::from_secs(2),
            dispatch: Dispatch::Hang,
            shared_log: None,
        },
    );
    tokio::task::block_in_place(|| {
        child.wait_for_sends(groups, Duration::from_secs(30));
        child.kill();
    });
    let victim = read_sends(&child.log);
    let heads: HashSet<String> = (0..groups).map(|g| format!("g{g}:0")).collect();
    assert_eq!(
        victim.iter().map(|s| s.key.clone()).collect::<HashSet<_>>(),
        heads,
        "only the heads were handed out"
    );
    let counts = outbox.counts(&Scope::all()).await.unwrap();
    assert_eq!(
        (counts.in_flight, counts.blocked),
        (groups as u64, (groups * (per_group - 1)) as u64)
    );

    let log = dir.path("rescuer.log");
    let rescuer = drainer(
        outbox.clone(),
        LineLog::open(&log),
        Dispatch::Done,
        16,
        Duration::from_secs(30),
    );
    let report = rescuer.settle().await.expect("the rescuer's drain");
    assert_eq!(report.delivered, (groups * per_group) as u64);
    let mut by_group: BTreeMap<String, Vec<(usize, u32)>> = BTreeMap::new();
    for send in read_sends(&log) {
        let (group, round) = send.key.split_once(':').expect("g:round");
        by_group
            .entry(group.to_owned())
            .or_default()
            .push((round.parse().unwrap(), send.attempt));
    }
    for (group, sends) in &by_group {
        let expected: Vec<(usize, u32)> = (0..per_group).map(|r| (r, if r == 0 { 2 } else { 1 })).collect();
        assert_eq!(
            sends, &expected,
            "group {group}: the head again (attempt 2), then the rest in order"
        );
    }
    assert_eq!(by_group.len(), groups);
}

//! Shared by the real-OS-process suites (`multi_process.rs`, `crash_drainer.rs`,
//! `serve_process.rs`, `serve_kill.rs`, …): the order flow whose produce turns each seeded
//! order into one `notify` intent, child processes that re-execute the test binary in a mode
//! chosen by environment variables, append-only line logs written by the children's
//! dispatchers, read-only queries of a file's outbox, a plain HTTP/1.1 request, SIGTERM, and
//! (in `shop`) the stores the shop's serving children run on.
//!
//! A child is the test binary itself run with `--exact <child test> --test-threads=1`: the
//! child test is a no-op unless its environment variables are set, so a plain `cargo test`
//! runs it as an empty test.
#![allow(dead_code)]

pub mod shop;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reactifact_core::ledger::{Delivery, LedgerQuery, StatusCounts};
use reactifact_core::runtime::{Budget, TurnOutcome};
use reactifact_core::store::{OutboxStore, SqliteOutbox};
use reactifact_core::{Agent, Artifact, Context, PendingAction, Produce, ProduceCall, Runtime, Scope};
use serde::{Deserialize, Serialize};

/// A seeded order: its produce acts one `notify` intent keyed `notify:<order id>`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Order {
    pub customer: String,
    pub total_cents: u64,
}

impl Artifact for Order {
    const KIND: &'static str = "order";
}

/// The intent's payload: the order it is for, so a dispatcher can check that the payload it
/// was handed belongs to the key it was handed.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Notify {
    pub order: String,
    pub customer: String,
}

/// The id of order `i` of `session`.
pub fn order_id(session: &str, i: usize) -> String {
    format!("order:{session}:{i}")
}

/// The idempotency key of the intent for order `i` of `session`.
pub fn intent_key(session: &str, i: usize) -> String {
    format!("notify:{}", order_id(session, i))
}

/// The session an intent key belongs to (`notify:order:<session>:<i>`).
pub fn key_session(key: &str) -> &str {
    key.split(':')
        .nth(2)
        .expect("a key of the form notify:order:<session>:<i>")
}

/// One intent per order: `notify:<order id>`, its payload naming the order.
pub fn notify_per_order() -> Produce {
    Produce::new("notify_per_order", |call: ProduceCall<Order>| async move {
        let id = call.trigger.id.to_string();
        call.effects.act(
            "notify",
            format!("notify:{id}"),
            &Notify {
                order: id,
                customer: call.trigger.data.customer.clone(),
            },
        );
    })
    .creates::<PendingAction>()
}

/// Commits `count` orders of `session` in one transaction (no generation runs).
pub fn seed_orders(ctx: &mut Context, session: &str, count: usize) {
    let mut tx = ctx.transaction();
    for i in 0..count {
        tx.create(
            order_id(session, i),
            Order {
                customer: format!("customer-{i}"),
                total_cents: 100 + i as u64,
            },
        );
    }
    tx.commit().expect("seed the orders");
}

/// The order flow's runtime over `ctx`, without a dispatcher unless one is given.
pub fn order_runtime(ctx: Context, dispatcher: Option<impl reactifact_core::Dispatcher>) -> Runtime {
    let mut builder = Runtime::builder(ctx).agent(Agent::new("notifier").produce(notify_per_order()));
    if let Some(dispatcher) = dispatcher {
        builder = builder.dispatcher(dispatcher);
    }
    builder.build().expect("build the runtime")
}

/// Runs the turn that turns every queued order into its intent, without delivering (no
/// dispatcher): the intents stay pending in the file's outbox.
pub fn commit_intents(ctx: Context) {
    block_on(async {
        let mut rt = order_runtime(
            ctx,
            None::<fn(reactifact_core::Intent) -> std::future::Ready<Result<(), reactifact_core::DispatchError>>>,
        );
        let report = rt.run_with(Budget::UNLIMITED).await.expect("the intents' generation");
        assert_eq!(report.outcome, TurnOutcome::Completed);
    });
}

/// A current-thread tokio runtime with timers, blocking on `future`.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(future)
}

/// The outbox of the SQLite file at `db`, as a standalone drainer opens it.
pub fn open_outbox(db: &Path) -> Arc<dyn OutboxStore> {
    SqliteOutbox::open(db).unwrap_or_else(|e| panic!("open the outbox of {}: {e}", db.display()))
}

/// Every entry of the outbox, in registration order.
pub async fn all_entries(outbox: &dyn OutboxStore) -> Vec<Delivery> {
    let mut entries = Vec::new();
    let mut query = LedgerQuery {
        limit: 1000,
        ..LedgerQuery::default()
    };
    loop {
        let page = outbox.list(&query).await.expect("list the outbox");
        entries.extend(page.entries);
        match page.next {
            Some(next) => query.after = Some(next),
            None => return entries,
        }
    }
}

/// The counts over the whole store.
pub async fn counts(outbox: &dyn OutboxStore) -> StatusCounts {
    outbox.counts(&Scope::all()).await.expect("count the outbox")
}

/// An append-only log shared by processes: opened with `O_APPEND`, each line written with one
/// `write` call, so lines of concurrent writers never interleave. A writer killed by SIGKILL
/// in the middle of its `write` can still leave part of a line (the kernel may stop copying at
/// a fatal signal: seen once in about 10,000 lines of `crash_drainer`), so each line is
/// written as `\n{line} .\n`: the leading newline keeps a torn line off the next one, and
/// [`read_lines`] keeps only the lines that end with the marker.
#[derive(Clone)]
pub struct LineLog {
    file: Arc<std::fs::File>,
}

/// Ends every whole line of a [`LineLog`].
const LINE_END: &str = " .";

impl LineLog {
    pub fn open(path: &Path) -> std::io::Result<LineLog> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(LineLog { file: Arc::new(file) })
    }

    /// Appends `line` in one `write`, between newlines and with the end marker.
    pub fn line(&self, line: &str) -> std::io::Result<()> {
        let bytes = format!("\n{line}{LINE_END}\n").into_bytes();
        let written = (&*self.file).write(&bytes)?;
        if written != bytes.len() {
            return Err(std::io::Error::other(format!(
                "short append: {written} of {} bytes",
                bytes.len()
            )));
        }
        Ok(())
    }
}

/// The whole lines of a [`LineLog`], without their end marker (empty if it does not exist
/// yet); a line torn by a writer's SIGKILL is left out, as if it had been killed before it.
pub fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.strip_suffix(LINE_END))
        .map(str::to_owned)
        .collect()
}

/// A child process: this test binary running the test `entry` with `env`. Its stderr goes to
/// `stderr` (read back when a check fails), its stdout nowhere.
pub fn spawn_child(entry: &str, env: &[(&str, String)], stderr: &Path) -> Child {
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command
        .args(["--exact", entry, "--test-threads=1", "--quiet", "--nocapture"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(stderr).expect("the child's stderr file"));
    for (name, value) in env {
        command.env(name, value);
    }
    command.spawn().expect("spawn a child process")
}

/// Waits for `child` to exit, polling, for at most `limit`; kills it (and says so) if it does
/// not. Waiting on a real process is the synchronisation; the limit only turns a hang into a
/// failure.
pub fn wait_for(child: &mut Child, limit: Duration, what: &str, stderr: &Path) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("poll a child") {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} (pid {}) did not exit within {limit:?}; its stderr:\n{}",
                child.id(),
                std::fs::read_to_string(stderr).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Panics with the child's stderr unless it exited successfully.
pub fn assert_success(status: ExitStatus, what: &str, stderr: &Path) {
    assert!(
        status.success(),
        "{what} failed ({status}); its stderr:\n{}",
        std::fs::read_to_string(stderr).unwrap_or_default()
    );
}

/// Whether the process was killed by SIGKILL.
pub fn killed_by_sigkill(status: ExitStatus) -> bool {
    std::os::unix::process::ExitStatusExt::signal(&status) == Some(9)
}

/// A fresh directory for a test's files.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("reactifact-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// A small deterministic generator (splitmix64 steps), std only.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform in `lo..hi` (`hi > lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }
}

/// The splitmix64 finaliser: a stateless hash of `z`.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A stable hash of a string (FNV-1a), for per-key pseudo-random choices in children.
pub fn hash_str(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Reads an environment variable the parent set for a child.
pub fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Counts how often each value occurs.
pub fn tally<'a>(values: impl IntoIterator<Item = &'a str>) -> BTreeMap<&'a str, usize> {
    let mut counts = BTreeMap::new();
    for v in values {
        *counts.entry(v).or_insert(0) += 1;
    }
    counts
}

/// Sends `SIGTERM` to `child` (with `kill`, as an operator or a service manager would).
pub fn terminate(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -TERM {} failed: {status}", child.id());
}

/// Panics with the child's stderr if `child` has exited: it was to stay up.
pub fn assert_running(child: &mut Child, what: &str, stderr: &Path) {
    if let Some(status) = child.try_wait().expect("poll a child") {
        panic!(
            "{what} (pid {}) exited ({status}) while it was to serve; its stderr:\n{}",
            child.id(),
            std::fs::read_to_string(stderr).unwrap_or_default()
        );
    }
}

/// One HTTP/1.1 request with `connection: close` and a JSON body (if any): the answer's status
/// and body. Blocking, std only.
pub fn http(addr: &str, method: &str, path: &str, json: Option<&str>) -> std::io::Result<(u16, String)> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let body = json.unwrap_or("");
    let content_type = if json.is_some() {
        "content-type: application/json\r\n"
    } else {
        ""
    };
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\n{content_type}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes())?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("an answer without a head: {raw:?}")))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line in {head:?}")))?;
    Ok((status, body.to_owned()))
}

/// Polls `done` until it answers `Some`, for at most `limit`, checking `alive` (which panics if
/// a process that was to stay up has exited) every round. The limit only turns a hang into a
/// failure.
pub fn poll_until<T>(limit: Duration, what: &str, mut alive: impl FnMut(), mut done: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = done() {
            return value;
        }
        alive();
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

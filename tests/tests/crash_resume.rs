//! Crash tests: a child process runs the order flow on a SQLite file and dies by SIGKILL at
//! chosen and at random points; the parent reopens the file and finishes the run.
//!
//! For every trial: the state right after the crash is one of the states the flow commits,
//! no intent is lost, every key ends delivered, and a key delivered more than once was in
//! flight (leased) at the moment of the crash, and carried the same idempotency key each time.
//!
//! Outcomes are recorded per drain batch, so a crash mid-batch repeats the batch's
//! deliveries that had already happened: all of them were leased, in flight, at the crash.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reactifact_core::audit::StateHash;
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::{Budget, TurnOutcome};
use reactifact_core::{
    Agent, Artifact, Context, DispatchError, Intent, OpenOptions, PendingAction, Produce, ProduceCall, Runtime,
};
use serde::{Deserialize, Serialize};

const ORDERS: u64 = 12;
const BATCH: u64 = 3;
/// Checkpoints in one full run: one per produce run, two per delivery (before and after the I/O).
const CHECKPOINTS: u64 = ORDERS * 3;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Order {
    customer: String,
    total_cents: u64,
}

impl Artifact for Order {
    const KIND: &'static str = "order";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Receipt {
    order: String,
    total_cents: u64,
}

impl Artifact for Receipt {
    const KIND: &'static str = "receipt";
}

static CHECKPOINT: AtomicU64 = AtomicU64::new(0);

/// In the child: dies by SIGKILL when the configured checkpoint is reached.
fn checkpoint() {
    let n = CHECKPOINT.fetch_add(1, Ordering::SeqCst);
    let kill_at = std::env::var("REACTIFACT_CRASH_KILL_AT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    if kill_at == Some(n) {
        let _ = Command::new("kill")
            .args(["-KILL", &std::process::id().to_string()])
            .status();
        loop {
            std::thread::park();
        }
    }
}

fn process_order() -> Produce {
    Produce::new("process_order", |call: ProduceCall<Order>| async move {
        checkpoint();
        let id = call.trigger.id.to_string();
        call.effects.upsert(
            format!("receipt:{id}"),
            Receipt {
                order: id.clone(),
                total_cents: call.trigger.data.total_cents,
            },
        );
        call.effects
            .act("notify", format!("notify:{id}"), &call.trigger.data.customer);
    })
    .creates::<Receipt>()
    .creates::<PendingAction>()
}

/// Appends `key attempt` to the deliveries file: deliveries counted outside the store.
fn appending_dispatcher(log: PathBuf) -> impl reactifact_core::Dispatcher {
    move |intent: Intent| {
        let log = log.clone();
        async move {
            checkpoint();
            let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
            // One write call per line: a kill never leaves half a line for the next append.
            file.write_all(format!("{} {}\n", intent.key(), intent.attempt()).as_bytes())?;
            drop(file);
            checkpoint();
            Ok::<(), DispatchError>(())
        }
    }
}

fn batch(b: u64) -> impl Iterator<Item = (String, Order)> {
    (b * BATCH..(b + 1) * BATCH).map(|i| {
        (
            format!("order:{i}"),
            Order {
                customer: format!("customer-{i}"),
                total_cents: 100 + i,
            },
        )
    })
}

/// The order flow: the orders arrive in batches, each followed by a turn. Seeding is
/// idempotent (equal content commits nothing), so the finisher can replay it from the start.
async fn order_flow(ctx: Context, log: Option<PathBuf>) -> Context {
    let mut builder = Runtime::builder(ctx).agent(Agent::new("billing").produce(process_order()));
    let has_dispatcher = log.is_some();
    if let Some(log) = log {
        builder = builder.dispatcher(appending_dispatcher(log));
    }
    let mut rt = builder.build().unwrap();
    // Intents or events a crashed process left are finished first.
    rt.run_with(Budget::UNLIMITED).await.unwrap();
    for b in 0..ORDERS / BATCH {
        let mut tx = rt.context_mut().transaction();
        for (id, order) in batch(b) {
            tx.create(id, order);
        }
        tx.commit().unwrap();
        let report = rt.run_with(Budget::UNLIMITED).await.unwrap();
        assert_eq!(report.outcome, TurnOutcome::Completed);
    }
    // What a dead process left in flight goes out once its lease expired.
    if has_dispatcher {
        rt.settle().await.unwrap();
    }
    rt.into_context()
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

fn options() -> OpenOptions {
    // The shortest lease: whatever a dead child left in flight is reclaimed a tenth of a
    // second after it died.
    OpenOptions::new().lease(reactifact_core::store::MIN_LEASE)
}

/// The child's entry point; a no-op unless the parent set the environment.
#[test]
fn crash_child() {
    let (Ok(db), Ok(log)) = (
        std::env::var("REACTIFACT_CRASH_DB"),
        std::env::var("REACTIFACT_CRASH_LOG"),
    ) else {
        return;
    };
    block_on(async {
        let ctx = Context::open_with(&db, "orders", options()).unwrap();
        order_flow(ctx, Some(PathBuf::from(log))).await;
    });
}

enum Kill {
    /// The child kills itself at this checkpoint.
    AtCheckpoint(u64),
    /// The parent kills the child after this long.
    After(Duration),
}

/// Runs the child; returns whether it died by SIGKILL.
fn run_child(db: &Path, log: &Path, kill: &Kill) -> bool {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "crash_child", "--test-threads=1", "--quiet"])
        .env("REACTIFACT_CRASH_DB", db)
        .env("REACTIFACT_CRASH_LOG", log)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Kill::AtCheckpoint(n) = kill {
        command.env("REACTIFACT_CRASH_KILL_AT", n.to_string());
    }
    let mut child = command.spawn().unwrap();
    if let Kill::After(delay) = kill {
        // Fault injection, not synchronisation: the kill lands wherever the child is.
        std::thread::sleep(*delay);
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    std::os::unix::process::ExitStatusExt::signal(&status) == Some(9)
}

/// The states the flow commits, in order, from an uncrashed run in memory.
fn reference_states() -> (BTreeSet<StateHash>, StateHash) {
    let ctx = block_on(order_flow(Context::new("orders"), None));
    let states = ctx.log().unwrap().iter().map(|c| c.state_hash).collect();
    (states, ctx.state_hash())
}

fn deliveries(log: &Path) -> BTreeMap<String, Vec<u32>> {
    let mut seen: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let (key, attempt) = line.rsplit_once(' ').expect("key attempt");
        seen.entry(key.to_owned()).or_default().push(attempt.parse().unwrap());
    }
    seen
}

/// A small deterministic generator for the random kill points.
fn splitmix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What one trial saw.
struct Seen {
    killed: bool,
    redelivered: usize,
}

fn trial(dir: &Path, name: &str, kill: Kill, states: &BTreeSet<StateHash>, final_state: StateHash) -> Seen {
    let db = dir.join(format!("{name}.db"));
    let log = dir.join(format!("{name}.log"));
    let killed = run_child(&db, &log, &kill);

    // The moment of the crash, as the file tells it.
    let (crashed_state, in_flight) = match Context::open_with(&db, "orders", OpenOptions::new().read_only(true)) {
        Ok(ctx) => {
            let in_flight: BTreeSet<String> = block_on(ctx.ledger().entries())
                .unwrap()
                .iter()
                .filter(|d| d.status() == DeliveryStatus::InFlight)
                .map(|d| d.key().to_string())
                .collect();
            (Some(ctx.state_hash()), in_flight)
        }
        // Killed before the schema or the session was committed: nothing to check yet.
        Err(_) => (None, BTreeSet::new()),
    };
    if let Some(state) = crashed_state {
        let empty = Context::new("orders").state_hash();
        assert!(
            state == empty || states.contains(&state),
            "{name}: the state after the crash is not one the flow commits"
        );
    }

    // Finish the run in this process, appending to the same deliveries file.
    let ctx = block_on(async {
        let ctx = Context::open_with(&db, "orders", options()).unwrap();
        order_flow(ctx, Some(log.clone())).await
    });
    assert_eq!(ctx.state_hash(), final_state, "{name}: the finished state differs");
    let sent = deliveries(&log);
    for i in 0..ORDERS {
        let key = format!("notify:order:{i}");
        let entry = block_on(ctx.ledger().get(&key))
            .unwrap()
            .unwrap_or_else(|| panic!("{name}: intent {key} lost"));
        assert_eq!(entry.status(), DeliveryStatus::Delivered, "{name}: {key}");
        let attempts = sent.get(&key).unwrap_or_else(|| {
            panic!(
                "{name}: {key} never reached the receiver (ledger: {:?}, {} attempts, {} expired leases, {:?})",
                entry.status(),
                entry.attempts(),
                entry.expired_leases(),
                entry.last_error()
            )
        });
        if attempts.len() > 1 {
            assert!(
                in_flight.contains(&key),
                "{name}: {key} was delivered {} times without being in flight at the crash",
                attempts.len()
            );
            assert!(
                entry.expired_leases() >= 1,
                "{name}: {key}: the ambiguous attempt is not counted"
            );
            assert!(
                attempts.windows(2).all(|w| w[0] < w[1]),
                "{name}: {key}: attempts {attempts:?} not increasing"
            );
        }
    }
    assert_eq!(
        sent.len() as u64,
        ORDERS,
        "{name}: deliveries of unknown keys: {sent:?}"
    );
    Seen {
        killed,
        redelivered: sent.values().filter(|attempts| attempts.len() > 1).count(),
    }
}

#[test]
fn sigkill_at_any_point_loses_no_intent_and_resends_only_what_was_in_flight() {
    let dir = std::env::temp_dir().join(format!("reactifact-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (states, final_state) = reference_states();

    // Every checkpoint: mid-generation (in a produce), after the commit and the in-flight
    // record but before the I/O, and after the I/O but before its outcome is recorded.
    for n in 0..CHECKPOINTS {
        let seen = trial(
            &dir,
            &format!("checkpoint-{n}"),
            Kill::AtCheckpoint(n),
            &states,
            final_state,
        );
        assert!(seen.killed, "checkpoint {n} was never reached");
        // Each batch of orders passes 3 produce checkpoints, then (before, after) the I/O of
        // each of its 3 deliveries. A kill after an I/O must lead to a second delivery.
        let after_io = matches!(n % (BATCH * 3), 4 | 6 | 8);
        if after_io {
            assert!(
                seen.redelivered >= 1,
                "checkpoint {n}: the ambiguous delivery was not repeated"
            );
        }
    }

    // Random instants over a whole run, including inside SQLite transactions.
    let started = Instant::now();
    assert!(!run_child(
        &dir.join("timing.db"),
        &dir.join("timing.log"),
        &Kill::AtCheckpoint(u64::MAX)
    ));
    let full_run = started.elapsed().max(Duration::from_millis(5));
    let mut killed = 0;
    for seed in 0..24u64 {
        let delay = full_run.mul_f64((splitmix(seed) % 1000) as f64 / 1000.0);
        killed += trial(
            &dir,
            &format!("random-{seed}"),
            Kill::After(delay),
            &states,
            final_state,
        )
        .killed as usize;
    }
    assert!(killed > 0, "no random kill landed before the child finished");
    let _ = std::fs::remove_dir_all(&dir);
}

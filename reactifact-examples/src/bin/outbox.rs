//! The outbox walkthrough: an order flow whose notification is sent once, whatever happens.
//!
//! ```sh
//! cargo run -p reactifact-examples --bin outbox            # SQLite file in a temporary directory
//! cargo run -p reactifact-examples --bin outbox -- my.db   # SQLite file at my.db (must not exist)
//! ```
//!
//! An `Order` triggers `process_order`, which upserts a `Receipt` and records a `notify` intent
//! keyed by the order id. The produce performs no I/O: the runtime commits its writes and its
//! intent together, and only then hands the intent to a dispatcher — here a stand-in mail
//! service that counts what it is asked to send.
//!
//! The walkthrough runs seven cases twice, once in memory and once on the embedded SQLite
//! store. Each case checks what it claims and prints one line; the program exits non-zero if
//! any check fails. See `docs/walkthrough.md` for the cases in prose.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reactifact_core::{
    produce, Agent, Artifact, ArtifactId, Context, DeliveryStatus, DispatchError, Intent, PendingAction, ProduceCall,
    Record, RetryPolicy, Runtime,
};
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------------------------
// The order flow
// ---------------------------------------------------------------------------------------------

/// What a customer ordered: the trigger of the flow.
#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
#[artifact(kind = "order")]
struct Order {
    customer: String,
    total_cents: u64,
}

/// What `process_order` writes for each order.
#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
#[artifact(kind = "receipt")]
struct Receipt {
    order: String,
    total_cents: u64,
}

/// The payload of a `notify` intent: what the mail service needs.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Notify {
    customer: String,
    order: String,
}

/// The idempotency key of an order's notification. Derived from the order id alone, so every
/// run that reaches the decision — a retry, an edit, another agent, another branch — derives
/// the same key.
fn notify_key(order: &ArtifactId) -> String {
    format!("notify:{order}")
}

fn notify(order: &Record<Order>) -> Notify {
    Notify {
        customer: order.data.customer.clone(),
        order: order.id.to_string(),
    }
}

/// Writes a receipt and records the intent to notify the customer. No I/O happens here.
#[produce(Receipt, also_creates = [PendingAction])]
async fn process_order(call: ProduceCall<Order>) {
    let order = &call.trigger;
    call.effects.upsert(
        format!("receipt:{}", order.id),
        Receipt {
            order: order.id.to_string(),
            total_cents: order.data.total_cents,
        },
    );
    call.effects.act("notify", notify_key(&order.id), &notify(order));
}

/// A second team's rule (case 3): every order is confirmed to the customer. It reaches the
/// same decision as `process_order`, with the same key.
#[produce(also_creates = [PendingAction])]
async fn confirm_order(call: ProduceCall<Order>) {
    call.effects
        .act("notify", notify_key(&call.trigger.id), &notify(&call.trigger));
}

fn order(customer: &str, total_cents: u64) -> Order {
    Order {
        customer: customer.into(),
        total_cents,
    }
}

// ---------------------------------------------------------------------------------------------
// A mail service stand-in
// ---------------------------------------------------------------------------------------------

/// Counts every call the outbox makes to it, per key, and fails on request.
#[derive(Clone, Default)]
struct Mailer {
    state: Arc<Mutex<MailerState>>,
}

#[derive(Default)]
struct MailerState {
    /// Every call, in order: (key, attempt, generation that committed the intent).
    calls: Vec<(String, u32, u64)>,
    /// Keys sent successfully.
    sent: Vec<String>,
    /// Errors to answer the next calls with, one per call.
    failures: VecDeque<DispatchError>,
}

impl Mailer {
    /// The dispatcher to give a runtime. Every runtime of a walkthrough shares one mailer,
    /// so its counts are the truth about what went out.
    fn dispatcher(&self) -> impl Fn(Intent) -> std::future::Ready<Result<(), DispatchError>> + Send + Sync + 'static {
        let state = self.state.clone();
        move |intent: Intent| {
            let mut state = state.lock().unwrap();
            let key = intent.key().to_string();
            state.calls.push((key.clone(), intent.attempt(), intent.generation().0));
            let result = match state.failures.pop_front() {
                Some(error) => Err(error),
                None => match intent.payload::<Notify>() {
                    Ok(_mail) => {
                        state.sent.push(key);
                        Ok(())
                    }
                    Err(e) => Err(DispatchError::permanent(e)),
                },
            };
            std::future::ready(result)
        }
    }

    /// Answers the next calls with these errors, in order.
    fn fail_next(&self, errors: impl IntoIterator<Item = DispatchError>) {
        self.state.lock().unwrap().failures.extend(errors);
    }

    /// How many times the outbox called the mailer for `key` (successful or not).
    fn calls(&self, key: &str) -> usize {
        self.state.lock().unwrap().calls.iter().filter(|c| c.0 == key).count()
    }

    /// How many times `key` was sent successfully.
    fn sent(&self, key: &str) -> usize {
        self.state.lock().unwrap().sent.iter().filter(|k| *k == key).count()
    }

    /// Calls for any key so far.
    fn total_calls(&self) -> usize {
        self.state.lock().unwrap().calls.len()
    }

    /// The generation that committed the intent `key`, as the mailer was told when sending it.
    fn committed_in(&self, key: &str) -> Option<u64> {
        let state = self.state.lock().unwrap();
        state.calls.iter().find(|c| c.0 == key).map(|c| c.2)
    }
}

// ---------------------------------------------------------------------------------------------
// The walkthrough
// ---------------------------------------------------------------------------------------------

type Outcome<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Fails the walkthrough with `claim` unless it holds.
fn check(holds: bool, claim: &str) -> Outcome {
    if holds {
        Ok(())
    } else {
        Err(format!("check failed: {claim}").into())
    }
}

/// Fails the walkthrough unless `actual == expected`.
fn check_eq<T: PartialEq + std::fmt::Debug>(actual: T, expected: T, what: &str) -> Outcome {
    if actual == expected {
        Ok(())
    } else {
        Err(format!("check failed: {what}: expected {expected:?}, got {actual:?}").into())
    }
}

/// Where a walkthrough keeps its state.
enum Store {
    Memory,
    Sqlite(PathBuf),
}

impl Store {
    fn open(&self, session: &str) -> Outcome<Context> {
        Ok(match self {
            Store::Memory => Context::new(session),
            Store::Sqlite(path) => Context::open(path, session)?,
        })
    }
}

struct Walkthrough {
    store: Store,
    mailer: Mailer,
}

impl Walkthrough {
    /// A runtime over `context` with the given agents, the shared mailer, and a retry policy
    /// short enough for a demo: 50 ms after the first failure, doubling, at most 5 attempts.
    fn runtime(&self, context: Context, agents: impl IntoIterator<Item = Agent>) -> Runtime {
        let builder = agents
            .into_iter()
            .fold(Runtime::builder(context), |b, agent| b.agent(agent));
        builder
            .dispatcher(self.mailer.dispatcher())
            .retry_policy(RetryPolicy::exponential(Duration::from_millis(50), Duration::from_secs(1)).max_attempts(5))
            .build()
    }

    fn shop(&self, context: Context) -> Runtime {
        self.runtime(context, [Agent::new("billing").produce(process_order)])
    }

    async fn run(&self) -> Outcome {
        let mut rt = self.shop(self.store.open("shop")?);
        let mailer = &self.mailer;

        // 1. commit → dispatch
        rt.context_mut().create("order:1", order("ada", 1200))?;
        rt.run().await?;
        let key = "notify:order:1";
        let delivery = rt
            .context()
            .ledger()
            .get(key)
            .ok_or("case 1: no intent in the ledger")?;
        check_eq(mailer.sent(key), 1, "case 1: sends of notify:order:1")?;
        check_eq(delivery.status(), DeliveryStatus::Delivered, "case 1: ledger status")?;
        let receipt = rt
            .context()
            .get::<Receipt>("receipt:order:1")?
            .ok_or("case 1: no receipt")?;
        check_eq(
            delivery.generation(),
            receipt.generation,
            "case 1: the intent was committed with the receipt",
        )?;
        check_eq(
            mailer.committed_in(key),
            Some(delivery.generation().0),
            "case 1: the mailer was handed the committed intent",
        )?;
        println!(
            "  1. commit → dispatch: process_order did no I/O; commit {} holds the receipt and the intent; then 1 send; ledger: {}",
            delivery.generation(),
            delivery.status()
        );

        // 2. re-derivation
        rt.context_mut().update("order:1", order("ada", 1500))?;
        let report = rt.run().await?;
        let receipt = rt
            .context()
            .get::<Receipt>("receipt:order:1")?
            .ok_or("case 2: no receipt")?;
        check_eq(report.runs, 1, "case 2: produce runs after the edit")?;
        check_eq(receipt.data.total_cents, 1500, "case 2: the receipt follows the edit")?;
        check_eq(mailer.calls(key), 1, "case 2: calls for notify:order:1")?;
        println!("  2. re-derivation: editing order:1 re-ran process_order (receipt now 15.00); same key, 0 new sends");

        // 3. same generation, two agents
        let mut two = self.runtime(
            self.store.open("two-agents")?,
            [
                Agent::new("billing").produce(process_order),
                Agent::new("support").produce(confirm_order),
            ],
        );
        two.context_mut().create("order:3", order("bob", 300))?;
        let report = two.run().await?;
        let key = "notify:order:3";
        let intents = two.context().list::<PendingAction>().filter(|a| a.is_ok()).count();
        check_eq(report.generations, 1, "case 3: generations")?;
        check_eq(report.runs, 2, "case 3: produce runs")?;
        check_eq(intents, 1, "case 3: intents in the state")?;
        check_eq(mailer.calls(key), 1, "case 3: calls for notify:order:3")?;
        println!(
            "  3. same generation: billing and support both acted on order:3 in one generation; one intent, one send"
        );
        drop(two);

        // 4. two branches
        println!("  4. two branches: pending — branches and merge (issue 7) have not landed yet");

        // 5. replay
        let calls_before = mailer.total_calls();
        let replay = rt.replay().await?;
        let verified = rt.context().verify()?;
        let rebuilt = rt.context().state_at(rt.context().generation())?;
        check_eq(mailer.total_calls(), calls_before, "case 5: mailer calls during replay")?;
        check_eq(
            verified.state_hash,
            rt.context().state_hash(),
            "case 5: verified state hash",
        )?;
        check_eq(
            rebuilt.state_hash(),
            rt.context().state_hash(),
            "case 5: rebuilt state hash",
        )?;
        println!(
            "  5. replay: {} produce runs re-executed from the log: same patches, 0 sends; rebuilt state hash {} = live",
            replay.runs,
            rebuilt.state_hash().short()
        );

        // 6. failure → retry
        let key = "notify:order:6";
        mailer.fail_next([DispatchError::permanent("550 mailbox unavailable")]);
        rt.context_mut().create("order:6", order("eve", 990))?;
        let report = rt.run().await?;
        let delivery = rt.context().ledger().get(key).ok_or("case 6: no intent")?;
        check_eq(report.deliveries.dead.len(), 1, "case 6: dead letters reported")?;
        check_eq(
            delivery.status(),
            DeliveryStatus::Dead,
            "case 6: ledger status after the failure",
        )?;
        check_eq(delivery.attempts(), 1, "case 6: attempts after the failure")?;
        let error = delivery.last_error().unwrap_or_default().to_owned();
        check(error.contains("550"), "case 6: the ledger keeps the error")?;
        rt.retry(key)?;
        let flushed = rt.flush().await?;
        let delivery = rt.context().ledger().get(key).ok_or("case 6: no intent")?;
        check_eq(flushed.delivered, 1, "case 6: delivered by the flush")?;
        check_eq(
            delivery.status(),
            DeliveryStatus::Delivered,
            "case 6: ledger status after retry",
        )?;
        check_eq(mailer.sent(key), 1, "case 6: sends of notify:order:6")?;
        println!("  6. failure → retry: attempt 1 failed (\"{error}\"), ledger: dead; retry + flush delivered it once");

        // 7. transient outage
        let key = "notify:order:7";
        mailer.fail_next([
            DispatchError::retryable("503 service unavailable"),
            DispatchError::retryable("503 service unavailable"),
        ]);
        let started = Instant::now();
        rt.context_mut().create("order:7", order("fay", 4200))?;
        let report = rt.run().await?;
        check_eq(report.deliveries.failed.len(), 1, "case 7: failed attempts in the turn")?;
        let settled = rt.settle().await?;
        let waited = started.elapsed();
        let delivery = rt.context().ledger().get(key).ok_or("case 7: no intent")?;
        check_eq(settled.delivered, 1, "case 7: delivered by settle")?;
        check_eq(delivery.status(), DeliveryStatus::Delivered, "case 7: ledger status")?;
        check_eq(delivery.attempts(), 3, "case 7: attempts in the ledger")?;
        check_eq(mailer.calls(key), 3, "case 7: calls for notify:order:7")?;
        check_eq(mailer.sent(key), 1, "case 7: sends of notify:order:7")?;
        println!(
            "  7. transient outage: two 503s ridden out by the retry policy in {} ms; ledger: {} after {} attempts",
            waited.as_millis(),
            delivery.status(),
            delivery.attempts()
        );

        if let Store::Sqlite(path) = &self.store {
            let (hash, commits) = (rt.context().state_hash(), rt.context().log().len());
            drop(rt);
            let reopened = Context::open(path, "shop")?;
            let delivery = reopened
                .ledger()
                .get(key)
                .ok_or("reopen: the ledger lost notify:order:7")?;
            check_eq(reopened.state_hash(), hash, "reopen: state hash")?;
            check_eq(reopened.log().len(), commits, "reopen: commits")?;
            check_eq(delivery.status(), DeliveryStatus::Delivered, "reopen: ledger status")?;
            reopened.verify()?;
            println!(
                "  reopened {}: {} commits verified, state hash {} matches; ledger: notify:order:7 {} after {} attempts",
                path.display(),
                commits,
                hash.short(),
                delivery.status(),
                delivery.attempts()
            );
        }
        Ok(())
    }
}

/// The SQLite file: the first argument, or a new file in a new temporary directory.
fn sqlite_path() -> Outcome<PathBuf> {
    if let Some(path) = std::env::args_os().nth(1) {
        let path = PathBuf::from(path);
        if path.exists() {
            return Err(format!("{} exists; pass a path to a new file", path.display()).into());
        }
        return Ok(path);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("reactifact-outbox-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir.join("shop.db"))
}

async fn walk(store: Store) -> bool {
    let place = match &store {
        Store::Memory => "in memory".to_owned(),
        Store::Sqlite(path) => format!("on SQLite, in {}", path.display()),
    };
    println!("The outbox walkthrough, {place}:");
    let walkthrough = Walkthrough {
        store,
        mailer: Mailer::default(),
    };
    match walkthrough.run().await {
        Ok(()) => true,
        Err(e) => {
            eprintln!("walkthrough {place} failed: {e}");
            false
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut ok = walk(Store::Memory).await;
    println!();
    match sqlite_path() {
        Ok(path) => ok &= walk(Store::Sqlite(path)).await,
        Err(e) => {
            eprintln!("walkthrough on SQLite: {e}");
            ok = false;
        }
    }
    if ok {
        println!("\nEvery case held, in memory and on SQLite.");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

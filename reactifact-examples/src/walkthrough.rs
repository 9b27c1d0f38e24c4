//! The outbox walkthrough (the `outbox` program): an order flow whose notification is sent once, whatever happens.
//!
//! ```sh
//! cargo run -p reactifact-examples --bin outbox            # SQLite file in a temporary directory
//! cargo run -p reactifact-examples --bin outbox -- my.db   # SQLite file at my.db (must not exist)
//! cargo run -p reactifact-examples --bin outbox -- --postgres postgres://postgres@127.0.0.1:5432/test
//! ```
//!
//! An `Order` triggers `process_order`, which upserts a `Receipt` and records a `notify` intent
//! keyed by the order id. The produce performs no I/O: the runtime commits its writes and its
//! intent together, and only then hands the intent to a dispatcher — here a stand-in mail
//! service that counts what it is asked to send.
//!
//! The walkthrough runs eight cases twice, once in memory and once on the embedded SQLite
//! store — and a third time on PostgreSQL when given `--postgres URL`, in a new schema of its
//! own (`walkthrough_<pid>_<time>`, left in place so that the `reactifact` tool can inspect it). Each case checks what it claims and prints one line; the program exits non-zero if
//! any check fails. See `docs/walkthrough.md` for the cases in prose.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reactifact_core::audit::StateHash;
use reactifact_core::ledger::{Delivery, DeliveryStatus};
use reactifact_core::runtime::Generation;
use reactifact_core::store::LogStore;
use reactifact_core::{
    produce, Agent, Artifact, ArtifactId, Context, DeliveryOptions, DispatchError, Dispatcher, Intent, PendingAction,
    ProduceCall, Record, RetryPolicy, Runtime,
};
use reactifact_postgres::{PostgresOptions, PostgresStore};
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
    // Under `--json-logs` this line carries the produce span's fields (agent, produce,
    // artifact id, generation). Never log the payload: it names the customer.
    tracing::info!(
        total_cents = order.data.total_cents,
        "receipt upserted, notification decided"
    );
}

/// A second team's rule (case 3): every order is confirmed to the customer. It reaches the
/// same decision as `process_order`, with the same key.
#[produce(also_creates = [PendingAction])]
async fn confirm_order(call: ProduceCall<Order>) {
    call.effects
        .act("notify", notify_key(&call.trigger.id), &notify(&call.trigger));
}

/// Case 8's rule: a refund of a large order needs a human's approval before the customer is
/// told. The intent is committed like any other, but the outbox holds it until an operator
/// approves it (or never sends it, once rejected).
#[produce(also_creates = [PendingAction])]
async fn refund_large_order(call: ProduceCall<Order>) {
    let order = &call.trigger;
    if order.data.total_cents >= 10_000 {
        call.effects
            .act_with_approval("notify", notify_key(&order.id), &notify(order));
    }
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

/// Records every call the outbox makes to it, and fails on request.
#[derive(Clone, Default)]
struct Mailer {
    state: Arc<Mutex<MailerState>>,
}

#[derive(Default)]
struct MailerState {
    /// Every call, in order.
    calls: Vec<Call>,
    /// Keys sent successfully.
    sent: Vec<String>,
    /// Errors to answer the next calls with, one per call.
    failures: VecDeque<DispatchError>,
}

struct Call {
    key: String,
    /// The generation whose commit recorded the intent.
    generation: Generation,
}

impl Mailer {
    /// The dispatcher to give a runtime. Every runtime of a walkthrough shares one mailer,
    /// so its records are the truth about what went out.
    fn dispatcher(&self) -> impl Dispatcher {
        let mailer = self.clone();
        move |intent: Intent| {
            let result = mailer.receive(&intent);
            async move { result }
        }
    }

    /// One call: record it, then fail if told to, or send.
    fn receive(&self, intent: &Intent) -> Result<(), DispatchError> {
        let mut state = self.state.lock().unwrap();
        let key = intent.key().to_string();
        state.calls.push(Call {
            key: key.clone(),
            generation: intent.generation(),
        });
        if let Some(error) = state.failures.pop_front() {
            // Inside the runtime's `delivery` span: the line carries its action key and attempt.
            tracing::info!(kind = intent.kind(), error = %error, "mail service failed the call");
            return Err(error);
        }
        // A real mail service would send this, passing `key` on as the idempotency key.
        let _mail: Notify = intent.payload()?;
        state.sent.push(key);
        tracing::info!(kind = intent.kind(), "mail service sent the notification");
        Ok(())
    }

    /// Answers the next calls with these errors, in order.
    fn fail_next(&self, errors: impl IntoIterator<Item = DispatchError>) {
        self.state.lock().unwrap().failures.extend(errors);
    }

    /// How many times the outbox called the mailer for `key` (successful or not).
    fn calls(&self, key: &str) -> usize {
        self.state.lock().unwrap().calls.iter().filter(|c| c.key == key).count()
    }

    /// How many times `key` was sent successfully.
    fn sent(&self, key: &str) -> usize {
        self.state.lock().unwrap().sent.iter().filter(|k| *k == key).count()
    }

    /// Calls for any key so far.
    fn total_calls(&self) -> usize {
        self.state.lock().unwrap().calls.len()
    }

    /// The generation of the intent `key`, as the mailer was told on the first call.
    fn committed_in(&self, key: &str) -> Option<Generation> {
        let state = self.state.lock().unwrap();
        state.calls.iter().find(|c| c.key == key).map(|c| c.generation)
    }
}

// ---------------------------------------------------------------------------------------------
// The walkthrough
// ---------------------------------------------------------------------------------------------

/// What the walkthrough's steps return.
pub type Outcome<T = ()> = Result<T, Box<dyn std::error::Error>>;

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
pub enum Store {
    /// In memory: nothing survives the process.
    Memory,
    /// The SQLite file at this path (a new one).
    Sqlite(PathBuf),
    /// A PostgreSQL store, and how to name it (no password).
    Postgres(Arc<PostgresStore>, String),
}

impl Store {
    async fn open(&self, session: &str) -> Outcome<Context> {
        Ok(match self {
            Store::Memory => Context::new(session),
            Store::Sqlite(path) => Context::open(path, session)?,
            Store::Postgres(store, _) => Context::open_store(store.clone(), session).await?,
        })
    }
}

/// One pass of the walkthrough over one store.
struct Walkthrough {
    store: Store,
    mailer: Mailer,
    narration: Narration,
}

/// Where a walkthrough prints its lines (a failure is always reported on stderr).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Narration {
    /// One line per case on stdout: the `outbox` program.
    Stdout,
    /// The same lines on stderr, for a program whose stdout carries something else.
    Stderr,
    /// No lines: a workload run over and over.
    Silent,
}

impl Narration {
    fn line(self, line: std::fmt::Arguments<'_>) {
        match self {
            Narration::Stdout => println!("{line}"),
            Narration::Stderr => eprintln!("{line}"),
            Narration::Silent => {}
        }
    }
}

/// Prints a case's line, or names the case that failed.
fn say(narration: Narration, case: u32, title: &str, outcome: Outcome<String>) -> Outcome {
    match outcome {
        Ok(line) => {
            narration.line(format_args!("  {case}. {title}: {line}"));
            Ok(())
        }
        Err(e) => Err(format!("case {case} ({title}): {e}").into()),
    }
}

/// The ledger's entry for `key`.
async fn delivery(rt: &Runtime, key: &str) -> Outcome<Delivery> {
    match rt.context().ledger().get(key).await? {
        Some(delivery) => Ok(delivery),
        None => Err(format!("no intent `{key}` in the ledger").into()),
    }
}

impl Walkthrough {
    async fn run(&self) -> Outcome {
        let n = self.narration;
        let mut shop = self.shop(self.store.open("shop").await?)?;
        say(n, 1, "commit → dispatch", self.commit_then_dispatch(&mut shop).await)?;
        say(n, 2, "re-derivation", self.re_derivation(&mut shop).await)?;
        say(n, 3, "same generation", self.same_generation().await)?;
        say(n, 4, "two branches", self.two_branches(&mut shop).await)?;
        say(n, 5, "replay", self.replay(&shop).await)?;
        say(n, 6, "failure → retry", self.failure_then_retry(&mut shop).await)?;
        say(n, 7, "transient outage", self.transient_outage(&mut shop).await)?;
        say(n, 8, "human approval", self.human_approval().await)?;
        if !matches!(self.store, Store::Memory) {
            let (hash, commits) = (shop.context().state_hash(), shop.context().log()?.len());
            drop(shop);
            n.line(format_args!("  {}", reopen(&self.store, hash, commits).await?));
        }
        Ok(())
    }

    /// A runtime over `context` with the given agents, the shared mailer, and a retry policy
    /// short enough for a demo: 50 ms after the first failure, doubling, at most 5 attempts.
    fn runtime(&self, context: Context, agents: impl IntoIterator<Item = Agent>) -> Outcome<Runtime> {
        let builder = agents
            .into_iter()
            .fold(Runtime::builder(context), |b, agent| b.agent(agent));
        builder
            .dispatcher(self.mailer.dispatcher())
            .delivery(DeliveryOptions::new().retry_policy(
                RetryPolicy::exponential(Duration::from_millis(50), Duration::from_secs(1)).max_attempts(5),
            ))
            .build()
            .map_err(Into::into)
    }

    /// The shop: one agent, `billing`, running `process_order`.
    fn shop(&self, context: Context) -> Outcome<Runtime> {
        self.runtime(context, [Agent::new("billing").produce(process_order)])
    }

    /// Case 1: the produce only decides; the send happens after the commit that recorded it.
    async fn commit_then_dispatch(&self, shop: &mut Runtime) -> Outcome<String> {
        let key = "notify:order:1";
        shop.context_mut().create("order:1", order("ada", 1200))?;
        shop.run().await?;

        let delivery = delivery(shop, key).await?;
        let receipt = shop.context().get::<Receipt>("receipt:order:1")?.ok_or("no receipt")?;
        check_eq(self.mailer.sent(key), 1, "sends of notify:order:1")?;
        check_eq(delivery.status(), DeliveryStatus::Delivered, "ledger status")?;
        check_eq(
            delivery.generation(),
            receipt.generation,
            "the commit that recorded the intent also wrote the receipt",
        )?;
        check_eq(
            self.mailer.committed_in(key),
            Some(delivery.generation()),
            "the generation of the intent the mailer was handed",
        )?;
        Ok(format!(
            "process_order did no I/O; commit {} holds the receipt and the intent; then 1 send; ledger: {}",
            delivery.generation(),
            delivery.status()
        ))
    }

    /// Case 2: editing the order re-runs the produce, which derives the same key: nothing is re-sent.
    async fn re_derivation(&self, shop: &mut Runtime) -> Outcome<String> {
        shop.context_mut().update("order:1", order("ada", 1500))?;
        let report = shop.run().await?;

        let receipt = shop.context().get::<Receipt>("receipt:order:1")?.ok_or("no receipt")?;
        check_eq(report.runs, 1, "produce runs after the edit")?;
        check_eq(receipt.data.total_cents, 1500, "the receipt's total after the edit")?;
        check_eq(self.mailer.calls("notify:order:1"), 1, "calls for notify:order:1")?;
        Ok("editing order:1 re-ran process_order (receipt now 15.00); same key, 0 new sends".into())
    }

    /// Case 3: two agents react to the same event in one generation and reach the same decision.
    async fn same_generation(&self) -> Outcome<String> {
        let agents = [
            Agent::new("billing").produce(process_order),
            Agent::new("support").produce(confirm_order),
        ];
        let mut rt = self.runtime(self.store.open("two-agents").await?, agents)?;
        rt.context_mut().create("order:3", order("bob", 300))?;
        let report = rt.run().await?;

        let intents = rt.context().list::<PendingAction>().count();
        check_eq(report.generations, 1, "generations")?;
        check_eq(report.runs, 2, "produce runs")?;
        check_eq(intents, 1, "intents in the state")?;
        check_eq(self.mailer.calls("notify:order:3"), 1, "calls for notify:order:3")?;
        Ok("billing and support both acted on order:3 in one generation; one intent, one send".into())
    }

    /// Case 4: two branches reach the same intent: a fork tries out the `support` agent next to
    /// `billing`. The branches share the delivery ledger, so the key goes out once in all, and
    /// the merge keeps one intent.
    async fn two_branches(&self, shop: &mut Runtime) -> Outcome<String> {
        let key = "notify:order:4";
        let agents = [
            Agent::new("billing").produce(process_order),
            Agent::new("support").produce(confirm_order),
        ];
        let mut fork = self.runtime(shop.context().fork("shop-with-support")?, agents)?;
        for rt in [&mut *shop, &mut fork] {
            rt.context_mut().create("order:4", order("cy", 800))?;
            rt.run().await?;
            let intent = rt.context().get::<PendingAction>(&format!("action:{key}"))?;
            check(intent.is_some(), "each branch recorded the intent")?;
        }
        let merge = shop.context_mut().merge(fork.context())?;
        shop.run().await?;

        let merged = merge.generation.ok_or("the merge made no commit")?;
        let intents = shop
            .context()
            .list::<PendingAction>()
            .filter(|a| matches!(a, Ok(a) if a.data.key == key));
        check_eq(intents.count(), 1, "intents for notify:order:4 after the merge")?;
        check_eq(
            self.mailer.calls(key),
            1,
            "calls for notify:order:4, both branches together",
        )?;
        check_eq(
            delivery(shop, key).await?.status(),
            DeliveryStatus::Delivered,
            "ledger status",
        )?;
        Ok(format!(
            "order:4 run on `shop` and on a fork with a second agent; merge commit {merged}: one intent, 1 send in all"
        ))
    }

    /// Case 5: replay re-executes every recorded run and rebuilds the state; it never dispatches.
    async fn replay(&self, shop: &Runtime) -> Outcome<String> {
        let calls_before = self.mailer.total_calls();
        let replay = shop.replay().await?;
        let verified = shop.context().verify()?;
        let rebuilt = shop.context().state_at(shop.context().generation())?;

        let live = shop.context().state_hash();
        check_eq(
            self.mailer.total_calls(),
            calls_before,
            "mailer calls during the replay",
        )?;
        check_eq(verified.state_hash, live, "verified state hash")?;
        check_eq(rebuilt.state_hash(), live, "rebuilt state hash")?;
        Ok(format!(
            "{} produce runs re-executed from the log: same patches, 0 sends; rebuilt state hash {} = live",
            replay.runs,
            live.short()
        ))
    }

    /// Case 6: a failed delivery is state: recorded with its error, re-armed by `retry`.
    async fn failure_then_retry(&self, shop: &mut Runtime) -> Outcome<String> {
        let key = "notify:order:6";
        self.mailer
            .fail_next([DispatchError::permanent("550 mailbox unavailable")]);
        shop.context_mut().create("order:6", order("eve", 990))?;
        let report = shop.run().await?;

        let failed = delivery(shop, key).await?;
        let error = failed.last_error().unwrap_or_default().to_owned();
        check_eq(report.deliveries.dead.len(), 1, "dead letters in the turn's report")?;
        check_eq(failed.status(), DeliveryStatus::Dead, "ledger status after the failure")?;
        check_eq(failed.attempts(), 1, "attempts after the failure")?;
        check(error.contains("550"), "the ledger keeps the error")?;

        shop.retry(key).await?;
        let flushed = shop.flush().await?;
        check_eq(flushed.delivered, 1, "delivered by the flush")?;
        check_eq(
            delivery(shop, key).await?.status(),
            DeliveryStatus::Delivered,
            "ledger status after the retry",
        )?;
        check_eq(self.mailer.sent(key), 1, "sends of notify:order:6")?;
        Ok(format!(
            "attempt 1 failed (\"{error}\"), ledger: dead; retry + flush delivered it once"
        ))
    }

    /// Case 8: a decision that needs a human: committed, held until approved, never sent once
    /// rejected; who decided and when is kept in the ledger (and survives a reopen).
    async fn human_approval(&self) -> Outcome<String> {
        let (approved, rejected) = ("notify:order:8", "notify:order:9");
        let agents = || [Agent::new("refunds").produce(refund_large_order)];
        let mut rt = self.runtime(self.store.open("approvals").await?, agents())?;
        rt.context_mut().create("order:8", order("gus", 25_000))?;
        rt.context_mut().create("order:9", order("hal", 30_000))?;
        rt.run().await?;
        rt.settle().await?;
        for key in [approved, rejected] {
            check_eq(
                delivery(&rt, key).await?.status(),
                DeliveryStatus::AwaitingApproval,
                "ledger status before a decision",
            )?;
            check_eq(self.mailer.calls(key), 0, "calls before a decision")?;
        }
        rt.approve(approved, "ops:carol").await?;
        rt.reject(rejected, "ops:dan", "the refund was already paid by hand")
            .await?;
        let flushed = rt.flush().await?;
        check_eq(flushed.delivered, 1, "delivered by the flush")?;
        check_eq(self.mailer.sent(approved), 1, "sends of the approved intent")?;
        check_eq(self.mailer.calls(rejected), 0, "calls for the rejected intent")?;
        // The decisions are the store's: a new runtime (on a durable store, over the session
        // opened again, as after a restart) sees them, and sends nothing more.
        let context = match self.store {
            Store::Memory => rt.into_context(),
            _ => {
                drop(rt);
                self.store.open("approvals").await?
            }
        };
        let mut rt = self.runtime(context, agents())?;
        rt.settle().await?;
        let yes = delivery(&rt, approved).await?;
        let no = delivery(&rt, rejected).await?;
        let by = |d: &Delivery| d.decision().map(|d| d.by.clone()).unwrap_or_default();
        check_eq(yes.status(), DeliveryStatus::Delivered, "approved: ledger status")?;
        check_eq(no.status(), DeliveryStatus::Rejected, "rejected: ledger status")?;
        check_eq(by(&yes).as_str(), "ops:carol", "who approved")?;
        check_eq(by(&no).as_str(), "ops:dan", "who rejected")?;
        check_eq(
            self.mailer.calls(rejected),
            0,
            "calls for the rejected intent after a reopen",
        )?;
        check_eq(
            self.mailer.sent(approved),
            1,
            "sends of the approved intent after a reopen",
        )?;
        Ok(format!(
            "2 refunds awaited approval (0 sends); approved by {} → 1 send; rejected by {} → never sent; both decisions kept",
            by(&yes),
            by(&no)
        ))
    }

    /// Case 7: a retry policy rides out a short outage; the ledger counts the attempts.
    async fn transient_outage(&self, shop: &mut Runtime) -> Outcome<String> {
        let key = "notify:order:7";
        let outage = || DispatchError::retryable("503 service unavailable");
        self.mailer.fail_next([outage(), outage()]);
        let started = Instant::now();
        shop.context_mut().create("order:7", order("fay", 4200))?;
        let report = shop.run().await?;
        let settled = shop.settle().await?;
        let waited = started.elapsed();

        let delivered = delivery(shop, key).await?;
        check_eq(report.deliveries.failed.len(), 1, "failed attempts in the turn")?;
        check_eq(settled.delivered, 1, "delivered by settle")?;
        check_eq(delivered.status(), DeliveryStatus::Delivered, "ledger status")?;
        check_eq(delivered.attempts(), 3, "attempts in the ledger")?;
        check_eq(self.mailer.calls(key), 3, "calls for notify:order:7")?;
        check_eq(self.mailer.sent(key), 1, "sends of notify:order:7")?;
        Ok(format!(
            "two 503s ridden out by the retry policy in {} ms; ledger: {} after {} attempts",
            waited.as_millis(),
            delivered.status(),
            delivered.attempts()
        ))
    }
}

/// Reopens the durable store and checks the state survived the process's runtime.
async fn reopen(store: &Store, hash: StateHash, commits: usize) -> Outcome<String> {
    let (reopened, place) = match store {
        Store::Sqlite(path) => (Context::open(path, "shop")?, path.display().to_string()),
        Store::Postgres(store, name) => (Context::open_store(store.clone(), "shop").await?, name.clone()),
        Store::Memory => return Err("nothing to reopen in memory".into()),
    };
    reopened.verify()?;
    let delivery = reopened
        .ledger()
        .get("notify:order:7")
        .await?
        .ok_or("reopened: no intent notify:order:7")?;
    check_eq(reopened.state_hash(), hash, "reopened: state hash")?;
    check_eq(reopened.log()?.len(), commits, "reopened: commits")?;
    check_eq(delivery.status(), DeliveryStatus::Delivered, "reopened: ledger status")?;
    Ok(format!(
        "reopened {place}: {commits} commits verified, state hash {} matches; ledger: notify:order:7 {} after {} attempts",
        hash.short(),
        delivery.status(),
        delivery.attempts()
    ))
}

/// A PostgreSQL store in a new schema of its own on the server at `url`.
pub async fn postgres_store(url: &str) -> Outcome<Store> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let schema = format!("walkthrough_{}_{nanos}", std::process::id());
    let store = PostgresStore::open(PostgresOptions::new(url).schema(&schema)).await?;
    let name = store.describe();
    Ok(Store::Postgres(store, name))
}

/// The SQLite file: `path`, or a new file in a new temporary directory.
pub fn sqlite_path(path: Option<PathBuf>) -> Outcome<PathBuf> {
    if let Some(path) = path {
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

/// Runs the eight cases on `store`, printing one line per case; whether every case held.
/// A durable store keeps what the walkthrough wrote (the `reactifact` tool can inspect it).
pub async fn walk(store: Store) -> bool {
    walk_narrated(store, Narration::Stdout).await
}

/// [`walk`], printing its lines where `narration` says.
pub async fn walk_narrated(store: Store, narration: Narration) -> bool {
    let place = match &store {
        Store::Memory => "in memory".to_owned(),
        Store::Sqlite(path) => format!("on SQLite, in {}", path.display()),
        Store::Postgres(_, name) => format!("on PostgreSQL, in {name}"),
    };
    narration.line(format_args!("The outbox walkthrough, {place}:"));
    let walkthrough = Walkthrough {
        store,
        mailer: Mailer::default(),
        narration,
    };
    match walkthrough.run().await {
        Ok(()) => true,
        Err(e) => {
            eprintln!("walkthrough {place} failed: {e}");
            false
        }
    }
}

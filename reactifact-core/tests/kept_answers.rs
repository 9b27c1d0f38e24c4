//! The answers of recorded calls are kept in the store as they arrive, before the generation
//! commits: a process that stops before the commit (its runtime dropped, as a crash drops
//! everything in memory) and starts again gets them back without calling; an answer whose
//! trigger changed since is not used; the answers are dropped once their run commits.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use reactifact_core::store::{LogStore, MemoryStore};
use reactifact_core::{Agent, Artifact, Context, Produce, ProduceCall, ProduceError, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Ticket {
    text: String,
}

impl Artifact for Ticket {
    const KIND: &'static str = "ticket";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Reply {
    text: String,
}

impl Artifact for Reply {
    const KIND: &'static str = "reply";
}

/// What the stand-in model was asked, and whether the produce fails after its calls (as a
/// process killed before its commit would never commit).
#[derive(Default)]
struct Model {
    asked: AtomicU64,
}

/// Two model calls, then a failure while `fail` holds (the generation does not commit).
fn agent(model: Arc<Model>, fail: bool) -> Agent {
    Agent::new("support").produce(
        Produce::new("reply", move |call: ProduceCall<Ticket>| {
            let model = model.clone();
            async move {
                let text = call.trigger.data.text.clone();
                let (m1, m2) = (model.clone(), model.clone());
                let category: String = call
                    .record("classify", text.clone(), move |text: String| async move {
                        m1.asked.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(format!("billing: {text}"))
                    })
                    .await?;
                let reply: String = call
                    .record("draft", category, move |category: String| async move {
                        m2.asked.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(format!("draft for {category}"))
                    })
                    .await?;
                if fail {
                    return Err(ProduceError::msg("the process is killed before the commit"));
                }
                call.effects
                    .upsert(format!("reply:{}", call.trigger.id), Reply { text: reply });
                Ok(())
            }
        })
        .creates::<Reply>(),
    )
}

/// One process's life: open the session, run one turn, stop (dropping the runtime and all it
/// held in memory). Returns whether the turn committed.
async fn process(ctx: Context, model: &Arc<Model>, fail: bool) -> bool {
    let mut rt = Runtime::builder(ctx).agent(agent(model.clone(), fail)).build().unwrap();
    rt.run().await.is_ok()
}

async fn survives_a_stop_before_the_commit(open: impl Fn() -> Context, store: impl Fn() -> Arc<dyn LogStore>) {
    let model = Arc::new(Model::default());
    let mut ctx = open();
    ctx.create("ticket:1", Ticket { text: "refund".into() }).unwrap();
    drop(ctx);
    assert!(!process(open(), &model, true).await);
    assert_eq!(model.asked.load(Ordering::SeqCst), 2, "two calls made");
    assert_eq!(store().answers("main").await.unwrap().len(), 2, "both answers kept");

    // Started again: the same run gets both answers back without calling.
    assert!(!process(open(), &model, true).await);
    assert_eq!(model.asked.load(Ordering::SeqCst), 2, "no call after a restart");
    assert!(process(open(), &model, false).await);
    assert_eq!(model.asked.load(Ordering::SeqCst), 2);
    let ctx = open();
    assert_eq!(
        ctx.get::<Reply>("reply:ticket:1").unwrap().unwrap().data.text,
        "draft for billing: refund"
    );
    assert!(
        store().answers("main").await.unwrap().is_empty(),
        "dropped once the run committed"
    );
}

async fn a_changed_trigger_calls_again(open: impl Fn() -> Context) {
    let model = Arc::new(Model::default());
    let mut ctx = open();
    ctx.create("ticket:1", Ticket { text: "refund".into() }).unwrap();
    drop(ctx);
    assert!(!process(open(), &model, true).await);
    assert_eq!(model.asked.load(Ordering::SeqCst), 2);
    // The ticket changes before the restart: its runs are new runs, and ask again.
    let mut ctx = open();
    ctx.update(
        "ticket:1",
        Ticket {
            text: "refund twice".into(),
        },
    )
    .unwrap();
    assert!(process(ctx, &model, false).await);
    assert!(
        model.asked.load(Ordering::SeqCst) >= 4,
        "the new version was asked about"
    );
    let ctx = open();
    assert_eq!(
        ctx.get::<Reply>("reply:ticket:1").unwrap().unwrap().data.text,
        "draft for billing: refund twice"
    );
}

fn sqlite(path: &Path) -> impl Fn() -> Context + '_ {
    move || Context::open(path, "main").unwrap()
}

fn memory(store: &Arc<MemoryStore>) -> impl Fn() -> Context + '_ {
    move || {
        let store: Arc<dyn LogStore> = store.clone();
        futures_lite_block_on(Context::open_store(store, "main")).unwrap()
    }
}

/// Opens run outside the test's runtime: a memory store's futures complete at once.
fn futures_lite_block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(future))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_kept_in_a_memory_store_survive_a_stop_before_the_commit() {
    let store = MemoryStore::new();
    survives_a_stop_before_the_commit(memory(&store), || store.clone() as Arc<dyn LogStore>).await;
    let other = MemoryStore::new();
    a_changed_trigger_calls_again(memory(&other)).await;
}

#[tokio::test]
async fn answers_kept_in_a_sqlite_file_survive_a_stop_before_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.db");
    let store = || -> Arc<dyn LogStore> { reactifact_core::store::SqliteStore::open(&path).unwrap() };
    survives_a_stop_before_the_commit(sqlite(&path), store).await;
    let other = dir.path().join("other.db");
    a_changed_trigger_calls_again(sqlite(&other)).await;
}

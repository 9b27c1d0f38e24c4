//! A delivery in another process carries the trace of the produce run that decided it.
//!
//! Two real OS processes on one SQLite file (this test binary re-executed, as in
//! `multi_process.rs`): the first commits three orders' intents (no dispatcher), the second
//! delivers them with a standalone drainer. Each installs a `tracing` layer that writes the
//! fields of every closed `produce` and `delivery` span to a line log, and the drainer's
//! dispatcher logs the `traceparent` it is handed. The parent then checks, for every key:
//!
//! - the ledger kept the producing run's context: the trace id and span id its `produce` span
//!   recorded;
//! - the `delivery` span, in the other process, is in that trace (`trace_id`), with the run's
//!   span as its parent (`parent_span_id`);
//! - the dispatcher was handed that trace with the delivery span as parent: what a webhook
//!   sends as its `traceparent` header.
//!
//! Why it fails when the guarantee breaks: a store that drops the trace context (or a drain
//! that does not continue it) mints a fresh trace in the drainer, so the trace ids differ.

mod procs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use procs::{block_on, commit_intents, open_outbox, read_lines, seed_orders, spawn_child, wait_for, LineLog};
use reactifact_core::runtime::TraceParent;
use reactifact_core::{Context, DispatchError, Drainer, Intent};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

const ROLE: &str = "REACTIFACT_TRACE_ROLE";
const DB: &str = "REACTIFACT_TRACE_DB";
const LOG: &str = "REACTIFACT_TRACE_LOG";

/// The fields of one span, as recorded so far.
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

/// Writes `name field=value ...` for every closed `produce` and `delivery` span.
struct SpanLog(LineLog);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for SpanLog {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: LayerContext<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        ctx.span(id)
            .expect("a new span")
            .extensions_mut()
            .insert(Mutex::new(fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: LayerContext<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions().get::<Mutex<Fields>>() {
                values.record(&mut *fields.lock().unwrap());
            }
        }
    }

    fn on_close(&self, id: Id, ctx: LayerContext<'_, S>) {
        let span = ctx.span(&id).expect("a closed span");
        if !matches!(span.name(), "produce" | "delivery") {
            return;
        }
        let extensions = span.extensions();
        let fields = extensions.get::<Mutex<Fields>>().expect("fields").lock().unwrap();
        let shown: Vec<String> = fields.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        self.0
            .line(&format!("{} {}", span.name(), shown.join(" ")))
            .expect("log a span");
    }
}

fn install(log: &LineLog) {
    let subscriber = tracing_subscriber::registry().with(SpanLog(log.clone()));
    tracing::subscriber::set_global_default(subscriber).expect("the child's only subscriber");
}

/// The child: commits (role `commit`) or delivers (role `drain`), logging its spans.
#[test]
fn trace_child() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let db = PathBuf::from(std::env::var(DB).expect("the file"));
    let log = LineLog::open(Path::new(&std::env::var(LOG).expect("the log"))).expect("open the log");
    install(&log);
    match role.as_str() {
        "commit" => {
            let mut ctx = Context::open(&db, "orders").expect("open the session");
            seed_orders(&mut ctx, "orders", 3);
            commit_intents(ctx);
        }
        "drain" => block_on(async {
            let dispatched = log.clone();
            let drainer = Drainer::builder(open_outbox(&db), move |intent: Intent| {
                let trace = intent.trace_parent().map_or("none".to_owned(), ToString::to_string);
                dispatched
                    .line(&format!("dispatch key={} traceparent={trace}", intent.key()))
                    .expect("log");
                async { Ok::<(), DispatchError>(()) }
            })
            .build()
            .expect("valid delivery options");
            assert_eq!(drainer.flush().await.expect("deliver").delivered, 3);
        }),
        other => panic!("unknown role {other}"),
    }
}

/// `name k=v k=v ...` lines of `kind`, as maps.
fn lines_of(lines: &[String], kind: &str) -> Vec<BTreeMap<String, String>> {
    lines
        .iter()
        .filter_map(|line| line.strip_prefix(kind)?.strip_prefix(' '))
        .map(|rest| {
            rest.split(' ')
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .collect()
}

fn run(role: &str, db: &Path, log: &Path, dir: &Path) {
    let stderr = dir.join(format!("{role}.stderr"));
    let env = [
        (ROLE, role.to_owned()),
        (DB, db.display().to_string()),
        (LOG, log.display().to_string()),
    ];
    let mut child = spawn_child("trace_child", &env, &stderr);
    let status = wait_for(&mut child, Duration::from_secs(120), role, &stderr);
    assert!(
        status.success(),
        "the {role} process failed: {}",
        std::fs::read_to_string(&stderr).unwrap_or_default()
    );
}

#[test]
fn a_delivery_in_another_process_carries_the_produce_runs_trace() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("orders.db");
    Context::open(&db, "orders").expect("create the file");
    let (commit_log, drain_log) = (dir.path().join("commit.log"), dir.path().join("drain.log"));
    run("commit", &db, &commit_log, dir.path());
    run("drain", &db, &drain_log, dir.path());

    let committed = read_lines(&commit_log);
    let delivered = read_lines(&drain_log);
    let produces = lines_of(&committed, "produce");
    let deliveries = lines_of(&delivered, "delivery");
    let dispatches = lines_of(&delivered, "dispatch");
    assert_eq!(
        (produces.len(), deliveries.len(), dispatches.len()),
        (3, 3, 3),
        "{committed:?}\n{delivered:?}"
    );
    let entries = block_on(procs::all_entries(&*open_outbox(&db)));
    for i in 0..3 {
        let order = procs::order_id("orders", i);
        let key = procs::intent_key("orders", i);
        let run = produces
            .iter()
            .find(|p| p["artifact_id"] == order)
            .expect("the order's run");
        let delivery = deliveries
            .iter()
            .find(|d| d["action_key"] == key)
            .expect("the key's delivery");
        let dispatch = dispatches.iter().find(|d| d["key"] == key).expect("the key's dispatch");
        let stored = entries
            .iter()
            .find(|e| e.key().as_str() == key)
            .and_then(|e| e.intent().trace_parent())
            .expect("the ledger keeps the run's trace context");
        assert_eq!(
            stored.trace_id_hex(),
            run["trace_id"],
            "{key}: the ledger has the run's trace"
        );
        assert_eq!(stored.parent_id_hex(), run["span_id"], "{key}: ... and the run's span");
        assert_eq!(
            delivery["trace_id"], run["trace_id"],
            "{key}: the delivery continues the run's trace"
        );
        assert_eq!(
            delivery["parent_span_id"], run["span_id"],
            "{key}: ... as a child of the run's span"
        );
        let handed: TraceParent = dispatch["traceparent"].parse().expect("a valid traceparent");
        assert_eq!(
            handed.trace_id_hex(),
            run["trace_id"],
            "{key}: the dispatcher gets the trace"
        );
        assert_eq!(
            handed.parent_id_hex(),
            delivery["span_id"],
            "{key}: ... with the delivery span as parent"
        );
    }
}

//! Shared by the trace-propagation suites (`opentelemetry.rs`, `otel_info_filter.rs`,
//! `propagation_panic.rs`; one per binary, since the subscriber and the propagation are
//! process-wide): the OpenTelemetry adapter `docs/observability.md` shows, and one order
//! decided and delivered in memory.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use reactifact_core::runtime::{set_trace_propagation, TraceParent, TracePropagation};
use reactifact_core::{Agent, Artifact, Context, DispatchError, Intent, PendingAction, Produce, ProduceCall, Runtime};
use serde::{Deserialize, Serialize};
use tracing::level_filters::LevelFilter;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer as _;

/// The adapter of `docs/observability.md`.
pub struct Otel;

impl TracePropagation for Otel {
    fn context_of(&self, span: &tracing::Span) -> Option<TraceParent> {
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        if !sc.is_valid() {
            return None;
        }
        TraceParent::new(
            sc.trace_id().to_bytes(),
            sc.span_id().to_bytes(),
            sc.trace_flags().to_u8(),
        )
    }

    fn continue_from(&self, span: &tracing::Span, parent: &TraceParent) {
        let remote = SpanContext::new(
            TraceId::from_bytes(parent.trace_id()),
            SpanId::from_bytes(parent.parent_id()),
            TraceFlags::new(parent.flags()),
            true,
            TraceState::default(),
        );
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }
}

#[derive(Serialize, Deserialize, Debug, Clone)]
struct Order {
    customer: String,
}

impl Artifact for Order {
    const KIND: &'static str = "order";
}

/// One order, decided (a `notify` intent) and delivered in one turn on a memory context; the
/// dispatcher's trace contexts go to `handed`. Returns the producing run's context as the
/// ledger kept it.
pub fn deliver_one_order(handed: Arc<Mutex<Vec<TraceParent>>>) -> TraceParent {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let mut ctx = Context::new("shop");
            ctx.create("order:1", Order { customer: "ada".into() }).unwrap();
            let notify = Produce::new("notify", |call: ProduceCall<Order>| async move {
                call.effects.act(
                    "notify",
                    format!("notify:{}", call.trigger.id),
                    &call.trigger.data.customer,
                );
            })
            .creates::<PendingAction>();
            let mut rt = Runtime::builder(ctx)
                .agent(Agent::new("mailer").produce(notify))
                .dispatcher(move |intent: Intent| {
                    handed.lock().unwrap().extend(intent.trace_parent().copied());
                    async { Ok::<(), DispatchError>(()) }
                })
                .build()
                .unwrap();
            assert_eq!(rt.run().await.unwrap().deliveries.delivered, 1);
            let entry = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
            *entry
                .intent()
                .trace_parent()
                .expect("the ledger keeps the run's context")
        })
}

/// What [`traced_order`] saw: the run's context as the ledger kept it, the contexts the
/// dispatcher was handed, and every span the OpenTelemetry layer exported.
pub struct Traced {
    pub stored: TraceParent,
    pub handed: Vec<TraceParent>,
    pub spans: Vec<SpanData>,
}

impl Traced {
    /// The exported span named `name`.
    pub fn span(&self, name: &str) -> &SpanData {
        self.spans.iter().find(|s| s.name == name).unwrap_or_else(|| {
            panic!(
                "no {name} span among {:?}",
                self.spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            )
        })
    }
}

/// Installs tracing-opentelemetry (an in-memory exporter, the layer filtered at `level`) as the
/// process's subscriber and [`Otel`] as its propagation, then [`deliver_one_order`]s.
pub fn traced_order(level: LevelFilter) -> Traced {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("test"))
        .with_filter(level);
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    assert!(set_trace_propagation(Otel).is_ok());
    assert!(set_trace_propagation(Otel).is_err(), "installed once");
    let handed: Arc<Mutex<Vec<TraceParent>>> = Arc::default();
    let stored = deliver_one_order(handed.clone());
    provider.force_flush().unwrap();
    let handed = handed.lock().unwrap().clone();
    Traced {
        stored,
        handed,
        spans: exporter.get_finished_spans().unwrap(),
    }
}

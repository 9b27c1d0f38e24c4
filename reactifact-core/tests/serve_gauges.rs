//! A serving runtime sets its session's outbox gauges every metrics interval, without anyone
//! calling `Ledger::record_metrics`.

mod common;

use std::time::Duration;

use common::{order, process_order, Recorder};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use reactifact_core::{Agent, Context, Runtime};

#[test]
fn a_serving_runtime_sets_the_outbox_gauges_every_interval() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let gauge = |name: &str, status: &str| {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .find_map(|(key, _, _, value)| {
                let key = key.key();
                let matches = key.name() == name && key.labels().any(|l| l.key() == "status" && l.value() == status);
                match value {
                    DebugValue::Gauge(v) if matches => Some(v.0),
                    _ => None,
                }
            })
    };
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(async {
                let sent = Recorder::default();
                let mut rt = Runtime::builder(Context::new("orders"))
                    .agent(Agent::new("orders").produce(process_order()))
                    .dispatcher(sent.dispatcher())
                    .metrics_interval(Duration::from_secs(5))
                    .build()
                    .unwrap();
                let handle = rt.handle();
                let serving = tokio::spawn(async move { rt.serve(Duration::from_secs(3600)).await });
                for i in 0..3 {
                    handle.create(format!("order:{i}"), order("ada", i)).await.unwrap();
                }
                tokio::time::sleep(Duration::from_secs(6)).await;
                handle.stop();
                serving.await.unwrap().unwrap();
            })
    });
    assert_eq!(gauge("reactifact_outbox_intents", "delivered"), Some(3.0));
    assert_eq!(gauge("reactifact_outbox_intents", "pending"), Some(0.0));
}

//! A serving runtime on PostgreSQL whose connections the server terminates mid-serve: the
//! serving goes on (a dropped connection is a retryable store error, ridden out), the writes
//! acknowledged before and after are all committed, and every intent is delivered once. Runs
//! when `REACTIFACT_TEST_POSTGRES_URL` is set (see `common`).

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reactifact_core::error::{SubmitError, WriteError};
use reactifact_core::{Agent, DispatchError, Intent, Runtime};

use common::flow::{order, process_order, Order, Receipt};
use common::Schemas;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serving_runtime_rides_out_connections_the_server_terminated() {
    let Some(url) = common::url("a_serving_runtime_rides_out_connections_the_server_terminated") else {
        return;
    };
    let schemas = Schemas::new(&url, "serve_reconnect");
    let schema = schemas.name();
    // Connections of this test only, so that terminating them leaves other tests alone.
    let app = format!("rft_serve_reconnect_{}", std::process::id());
    let separator = if url.contains('?') { '&' } else { '?' };
    let store_url = format!("{url}{separator}application_name={app}&schema={schema}");
    let ctx = reactifact_postgres::connect(&store_url, "orders")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let sent: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let seen = sent.clone();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("orders").produce(process_order()))
        .dispatcher(move |intent: Intent| {
            *seen.lock().unwrap().entry(intent.key().to_string()).or_default() += 1;
            std::future::ready(Ok::<(), DispatchError>(()))
        })
        .build()
        .unwrap();
    let handle = rt.handle();
    let serving = tokio::spawn(async move {
        let report = rt.serve(Duration::from_millis(50)).await;
        (rt, report)
    });
    // A write the store refused with a retryable error wrote nothing: it is sent again. A
    // write left unanswered (a runtime that stopped serving) fails the test, not hangs it.
    let write = |i: u64| {
        let handle = handle.clone();
        let written = async move {
            for _ in 0..20 {
                match handle.create(format!("order:{i}"), order(i)).await {
                    Ok(()) => return,
                    Err(SubmitError::Write(WriteError::Store(e))) if e.is_retryable() => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => panic!("order:{i}: {e}"),
                }
            }
            panic!("order:{i} was refused 20 times");
        };
        async move {
            tokio::time::timeout(Duration::from_secs(30), written)
                .await
                .unwrap_or_else(|_| panic!("order:{i} was not answered within 30 s"));
        }
    };
    for i in 0..10 {
        write(i).await;
    }
    for _ in 0..3 {
        schemas
            .execute(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{app}'"
            ))
            .await;
        for i in 10..20 {
            write(i).await;
        }
    }
    // Every intent goes out, once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while sent.lock().unwrap().len() < 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "delivered: {:?}",
            sent.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    handle.stop();
    let (rt, report) = serving.await.unwrap();
    let report = report.unwrap_or_else(|e| panic!("serve ended with {e}"));
    assert!(
        sent.lock().unwrap().values().all(|&n| n == 1),
        "{:?}",
        sent.lock().unwrap()
    );
    for i in 0..20 {
        let id = format!("order:{i}");
        assert!(rt.context().get::<Order>(&id).unwrap().is_some(), "{id} lost");
        assert!(rt.context().get::<Receipt>(&format!("receipt:{id}")).unwrap().is_some());
    }
    // The ledger, the truth, has each delivered. (The report may count an outcome whose write
    // the server committed just before it cut the connection as stale when it is written
    // again: a known miscount, not a lost or repeated delivery.)
    assert!(report.delivered <= 20, "{report:?}");
    let counts = rt.context().ledger().counts().await.unwrap();
    assert_eq!(counts.delivered, 20, "{counts:?}");
}

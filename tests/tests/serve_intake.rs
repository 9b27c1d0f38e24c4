//! A serving runtime's turns while writers keep its inbox busy: writers that each send their
//! next write as soon as the last is acknowledged (closed loop) never let the inbox empty.
//!
//! `serve` commits at most what the inbox held when it looked (`Runtime::apply_submitted`)
//! before each turn; before it drained the inbox until empty, and closed-loop writers kept the
//! turns from ever running (88,000 orders acknowledged in 120 s on SQLite, no email sent).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reactifact_examples::shop::{self, Mailer, Order, Settings};

/// Writer tasks.
const WRITERS: u64 = 8;
/// The writers stop after this many orders in all, or once the first email is sent.
const CAP: u64 = 3_000;

#[tokio::test]
async fn turns_run_while_closed_loop_writers_keep_the_inbox_busy() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("shop.db").display());
    let context = reactifact_postgres::connect(&url, shop::SESSION)
        .await
        .expect("the store opens");
    let mailer = Mailer::new(Duration::ZERO, 0);
    let mut runtime = shop::runtime(context, &Settings::default(), &mailer).expect("the runtime builds");
    let handle = runtime.handle();
    let serving = tokio::spawn(async move { runtime.serve(shop::POLL).await });

    let written = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..WRITERS)
        .map(|_| {
            let (handle, written, mailer) = (handle.clone(), written.clone(), mailer.clone());
            tokio::spawn(async move {
                while mailer.delivered() == 0 {
                    let i = written.fetch_add(1, Ordering::SeqCst);
                    if i >= CAP {
                        return;
                    }
                    let order = Order {
                        customer: format!("customer {i}"),
                        email: format!("c{i}@example.com"),
                        total_cents: 100,
                    };
                    handle
                        .create_once(shop::order_id(&i.to_string()), order)
                        .await
                        .expect("the runtime commits the order");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let written = written.load(Ordering::SeqCst).min(CAP);
    handle.stop();
    serving.await.unwrap().expect("the runtime serves");
    assert!(
        written < CAP,
        "{written} orders were acknowledged before the first email went out: no turn ran while the writers wrote"
    );
}

//! Priorities of kinds through a drain: an intent of a higher-priority kind, committed behind
//! a backlog of a lower one, goes out with the next claim, not after the backlog.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use reactifact_core::store::{Enqueue, MemoryOutbox};
use reactifact_core::{DeliveryOptions, DispatchError, Drainer, Intent};

#[tokio::test(start_paused = true)]
async fn a_higher_priority_kind_overtakes_a_backlog() {
    let outbox = MemoryOutbox::new();
    let mut intents: Vec<_> = (0..200)
        .map(|i| {
            Enqueue::new("newsletter", format!("newsletter:{i}"), &i)
                .build()
                .unwrap()
        })
        .collect();
    intents.push(Enqueue::new("password_reset", "reset:1", &"ada").build().unwrap());
    // A moment back: due for the drain's clock, which reads the same system time.
    outbox.register_intents(intents, SystemTime::now() - Duration::from_secs(1));
    let sent: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = sent.clone();
    let send = move |intent: Intent| {
        log.lock().unwrap().push(intent.key().to_string());
        async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok::<(), DispatchError>(())
        }
    };
    let drainer = Drainer::builder(outbox.clone(), send)
        .delivery(DeliveryOptions::new().concurrency(4).priority("password_reset", 10))
        .build()
        .unwrap();
    assert_eq!(drainer.settle().await.unwrap().delivered, 201);
    let position = sent.lock().unwrap().iter().position(|k| k == "reset:1").unwrap();
    assert!(position < 4, "the reset went out at {position}, behind the backlog");
}

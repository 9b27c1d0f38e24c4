//! A drain's claim policy beyond rate limits (`rate_limits.rs`): an intent of a
//! higher-priority kind, committed behind a backlog of a lower one, goes out with the next
//! claim; with turns, so does a session's intent committed behind another session's backlog.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use reactifact_core::audit::{CommitHash, ContentHash};
use reactifact_core::runtime::{Generation, Origin};
use reactifact_core::store::{Enqueue, MemoryOutbox, NewIntent};
use reactifact_core::{ActionKey, DeliveryOptions, DispatchError, Drainer, Intent, PendingAction};

/// An intent of `session`, as its commit would register it.
fn intent_of(session: &str, key: &str) -> NewIntent {
    let payload = rmp_serde::to_vec(&key).unwrap();
    let action = PendingAction {
        kind: "notify".to_owned(),
        key: key.to_owned(),
        payload: payload.clone(),
        requires_approval: false,
        not_before: None,
        group: None,
    };
    let bytes = rmp_serde::to_vec_named(&action).unwrap();
    let origin = Origin::new(Arc::from(session), CommitHash([1; 32]), Generation(1), 0);
    NewIntent {
        intent: Intent::new(ActionKey::from(key), "notify", payload, origin, 0),
        action_hash: ContentHash::of(&bytes),
        bytes: Arc::from(bytes),
    }
}

/// Drains `outbox` with `options`, concurrency 4: the keys in the order they were sent.
async fn drain(outbox: Arc<MemoryOutbox>, options: DeliveryOptions) -> Vec<String> {
    let sent: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = sent.clone();
    let send = move |intent: Intent| {
        log.lock().unwrap().push(intent.key().to_string());
        async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok::<(), DispatchError>(())
        }
    };
    let drainer = Drainer::builder(outbox, send)
        .delivery(options.concurrency(4))
        .build()
        .unwrap();
    drainer.settle().await.unwrap();
    let sent = sent.lock().unwrap().clone();
    sent
}

#[tokio::test(start_paused = true)]
async fn with_turns_a_sessions_intent_overtakes_another_sessions_backlog() {
    for turns in [false, true] {
        let outbox = MemoryOutbox::new();
        let mut intents: Vec<NewIntent> = (0..200).map(|i| intent_of("tenant-a", &format!("a:{i}"))).collect();
        intents.push(intent_of("tenant-b", "b:1"));
        outbox.register_intents(intents, SystemTime::now() - Duration::from_secs(1));
        let sent = drain(outbox, DeliveryOptions::new().take_turns(turns)).await;
        assert_eq!(sent.len(), 201);
        let position = sent.iter().position(|k| k == "b:1").unwrap();
        match turns {
            true => assert!(position < 4, "with turns, b:1 went out at {position}"),
            false => assert_eq!(position, 200, "without turns, due order"),
        }
    }
}

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
    let sent = drain(outbox, DeliveryOptions::new().priority("password_reset", 10)).await;
    assert_eq!(sent.len(), 201);
    let position = sent.iter().position(|k| k == "reset:1").unwrap();
    assert!(position < 4, "the reset went out at {position}, behind the backlog");
}

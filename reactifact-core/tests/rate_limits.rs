//! Rate limits through a drain, on tokio's paused clock: a limited kind goes out no faster
//! than its limit (in any window, at most the burst plus the rate), other kinds at full
//! speed; a receiver's `Retry-After` pauses the whole kind, not only its key; the builders
//! refuse limits that cannot deliver.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use reactifact_core::error::BuildError;
use reactifact_core::store::{Enqueue, MemoryOutbox, OutboxStore};
use reactifact_core::{DeliveryOptions, DispatchError, Drainer, Intent, RateLimit};
use tokio::time::Instant;

/// Registers `n` intents of `kind`, keys `{kind}:{i}`, due now.
fn register(outbox: &MemoryOutbox, kind: &str, n: usize) {
    let intents = (0..n)
        .map(|i| Enqueue::new(kind, format!("{kind}:{i}"), &i).build().unwrap())
        .collect();
    // A moment back: due for the drain's clock, which reads the same system time.
    outbox.register_intents(intents, SystemTime::now() - Duration::from_secs(1));
}

type Log = Arc<Mutex<Vec<(String, Duration)>>>;

/// Sends into a log of (key, time since the start); `answer` decides each attempt.
fn logging(
    started: Instant,
    answer: impl Fn(&Intent) -> Result<(), DispatchError> + Send + Sync + 'static,
) -> (impl reactifact_core::Dispatcher, Log) {
    let log: Log = Arc::default();
    let sent = log.clone();
    let answer = Arc::new(answer);
    let dispatcher = move |intent: Intent| {
        let sent = sent.clone();
        let answer = answer.clone();
        async move {
            sent.lock().unwrap().push((intent.key().to_string(), started.elapsed()));
            tokio::time::sleep(Duration::from_millis(2)).await;
            answer(&intent)
        }
    };
    (dispatcher, log)
}

/// The most sends of `kind` in any window of `window` (from each send on).
fn most_in_window(log: &[(String, Duration)], kind: &str, window: Duration) -> usize {
    let times: Vec<Duration> = log
        .iter()
        .filter(|(key, _)| key.starts_with(&format!("{kind}:")))
        .map(|(_, t)| *t)
        .collect();
    times
        .iter()
        .map(|&from| times.iter().filter(|&&t| t >= from && t < from + window).count())
        .max()
        .unwrap_or(0)
}

#[tokio::test(start_paused = true)]
async fn a_limited_kind_goes_out_at_its_rate_and_others_at_full_speed() {
    let outbox = MemoryOutbox::new();
    register(&outbox, "mail", 60);
    register(&outbox, "sms", 60);
    let started = Instant::now();
    let (dispatcher, log) = logging(started, |_| Ok(()));
    let drainer = Drainer::builder(outbox.clone(), dispatcher)
        .delivery(DeliveryOptions::new().rate_limit("mail", RateLimit::per_second(20).burst(5)))
        .build()
        .unwrap();
    let report = drainer.settle().await.unwrap();
    assert_eq!(report.delivered, 120);
    let log = log.lock().unwrap().clone();
    let most = most_in_window(&log, "mail", Duration::from_secs(1));
    assert!(
        most <= 25,
        "{most} mails in one second with 20 per second and a burst of 5"
    );
    let last_mail = log
        .iter()
        .filter(|(k, _)| k.starts_with("mail:"))
        .map(|(_, t)| *t)
        .max()
        .unwrap();
    let last_sms = log
        .iter()
        .filter(|(k, _)| k.starts_with("sms:"))
        .map(|(_, t)| *t)
        .max()
        .unwrap();
    // 60 at 20 per second after a burst of 5: 55 × 50 ms.
    assert!(
        last_mail >= Duration::from_millis(2_700) && last_mail < Duration::from_millis(3_500),
        "the last mail at {last_mail:?}"
    );
    assert!(
        last_sms < Duration::from_millis(100),
        "sms held back behind mail: {last_sms:?}"
    );
    // In claim order, within the kind.
    let mails: Vec<&str> = log
        .iter()
        .filter(|(k, _)| k.starts_with("mail:"))
        .map(|(k, _)| k.as_str())
        .collect();
    let expected: Vec<String> = (0..60).map(|i| format!("mail:{i}")).collect();
    assert_eq!(mails, expected);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_pauses_the_whole_kind_not_only_its_key() {
    let outbox = MemoryOutbox::new();
    register(&outbox, "mail", 10);
    register(&outbox, "sms", 10);
    let started = Instant::now();
    // The receiver of mail answers the first attempt of mail:0 with "429, retry after 5 s".
    let (dispatcher, log) = logging(started, |intent| {
        if intent.key().as_str() == "mail:0" && intent.attempt() == 1 {
            Err(DispatchError::retryable("429 Too Many Requests").retry_after(Duration::from_secs(5)))
        } else {
            Ok(())
        }
    });
    let options = DeliveryOptions::new()
        .concurrency(1)
        .rate_limit("mail", RateLimit::per_second(1000).burst(100));
    let drainer = Drainer::builder(outbox.clone(), dispatcher)
        .delivery(options.clone())
        .build()
        .unwrap();
    let report = drainer.settle().await.unwrap();
    assert_eq!(report.delivered, 20);
    let log = log.lock().unwrap().clone();
    let mails: Vec<Duration> = log
        .iter()
        .filter(|(k, _)| k.starts_with("mail:"))
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(mails.len(), 11, "mail:0 twice, every other once: {log:?}");
    assert!(
        mails[1..].iter().all(|&t| t >= Duration::from_secs(5)),
        "no mail before the pause ended: {log:?}"
    );
    let sms_last = log
        .iter()
        .filter(|(k, _)| k.starts_with("sms:"))
        .map(|(_, t)| *t)
        .max()
        .unwrap();
    assert!(sms_last < Duration::from_secs(1), "sms was not paused: {log:?}");
}

#[tokio::test(start_paused = true)]
async fn a_drain_honours_a_pause_written_by_another() {
    // Another drain (here: the store directly) paused mail for 30 s.
    let outbox = MemoryOutbox::new();
    register(&outbox, "mail", 3);
    register(&outbox, "sms", 3);
    outbox
        .pause("mail", SystemTime::now() + Duration::from_secs(30))
        .await
        .unwrap();
    let started = Instant::now();
    let (dispatcher, log) = logging(started, |_| Ok(()));
    let drainer = Drainer::builder(outbox.clone(), dispatcher)
        .delivery(DeliveryOptions::new().rate_limit("mail", RateLimit::per_second(100).burst(10)))
        .build()
        .unwrap();
    assert_eq!(drainer.settle().await.unwrap().delivered, 6);
    let log = log.lock().unwrap().clone();
    for (key, t) in &log {
        match key.starts_with("mail:") {
            true => assert!(*t >= Duration::from_secs(29), "{key} at {t:?}, during the pause"),
            false => assert!(*t < Duration::from_secs(1), "{key} at {t:?}, held back"),
        }
    }
}

#[tokio::test]
async fn the_builders_refuse_limits_that_cannot_deliver() {
    let outbox = MemoryOutbox::new();
    let refused = |options: DeliveryOptions| match Drainer::builder(outbox.clone(), |_: Intent| async {
        Ok::<(), DispatchError>(())
    })
    .delivery(options)
    .build()
    {
        Err(BuildError::Delivery { problem, .. }) => problem,
        other => panic!("accepted: {:?}", other.map(|_| ())),
    };
    let zero = refused(DeliveryOptions::new().rate_limit("mail", RateLimit::per_second(0)));
    assert!(zero.contains("`mail`") && zero.contains("zero"), "{zero}");
    let instant = refused(DeliveryOptions::new().rate_limit("mail", RateLimit::new(5, Duration::ZERO)));
    assert!(instant.contains("interval of zero"), "{instant}");
    let twice = refused(
        DeliveryOptions::new()
            .rate_limit("mail", RateLimit::per_second(5))
            .rate_limit_shared("provider", ["sms", "mail"], RateLimit::per_second(5)),
    );
    assert!(twice.contains("`mail`") && twice.contains("two rate limits"), "{twice}");
    let none = refused(DeliveryOptions::new().rate_limit_shared("provider", [] as [&str; 0], RateLimit::per_second(5)));
    assert!(none.contains("names no action kind"), "{none}");
    // Stating a bucket again replaces it.
    assert!(
        Drainer::builder(outbox.clone(), |_: Intent| async { Ok::<(), DispatchError>(()) })
            .delivery(
                DeliveryOptions::new()
                    .rate_limit("mail", RateLimit::per_second(0))
                    .rate_limit("mail", RateLimit::per_second(5))
            )
            .build()
            .is_ok()
    );
}

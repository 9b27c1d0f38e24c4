//! Timers: a produce schedules a wake-up with `effects.wake_at`, the runtime fires it when its
//! clock (tokio's, paused here) reaches the time, and produces triggered by `Timer` react to
//! the fire. Every test tries to make a timer fire early, late, twice or never.

use std::time::{Duration, SystemTime};

use reactifact_core::error::RunError;
use reactifact_core::runtime::{Budget, TurnOutcome};
use reactifact_core::{produce, Agent, Artifact, Context, OpenOptions, ProduceCall, Runtime, Timer};
use serde::{Deserialize, Serialize};

/// Something to be reminded of at `remind_at`.
#[derive(Serialize, Deserialize, Artifact, Clone, Debug, PartialEq)]
struct Booking {
    remind_at: SystemTime,
}

/// What the reminder produce writes, once per fire it sees.
#[derive(Serialize, Deserialize, Artifact, Clone, Debug, PartialEq)]
struct Reminder {
    booking: String,
    /// The fired timer's version the run saw, so a second run on a second fire changes it.
    timer_version: u64,
}

/// Schedules a reminder for each booking, at the time its data says.
#[produce(Timer)]
async fn schedule(call: ProduceCall<Booking>) {
    let booking = call.trigger.id.to_string();
    call.effects
        .wake_at(call.trigger.data.remind_at, format!("remind:{booking}"), &booking);
}

/// Reacts to the fire.
#[produce(Reminder)]
async fn remind(call: ProduceCall<Timer>) {
    assert!(
        call.trigger.data.fired,
        "a produce triggered by Timer runs on fires only"
    );
    let booking: String = call.trigger.data.payload().unwrap();
    call.effects.upsert(
        format!("reminder:{booking}"),
        Reminder {
            booking,
            timer_version: call.trigger.version.0,
        },
    );
}

fn agents() -> Vec<Agent> {
    vec![Agent::new("reminders").produce(schedule).produce(remind)]
}

fn runtime(ctx: Context) -> Runtime {
    let mut builder = Runtime::builder(ctx);
    for agent in agents() {
        builder = builder.agent(agent);
    }
    builder.build().unwrap()
}

/// How many runs of the produce named `name` the log records.
fn runs_of(ctx: &Context, name: &str) -> usize {
    ctx.log()
        .unwrap()
        .iter()
        .flat_map(|c| &c.runs)
        .filter(|r| r.produce.as_deref() == Some(name))
        .count()
}

fn timer(ctx: &Context, booking: &str) -> Timer {
    ctx.get::<Timer>(&format!("timer:remind:{booking}"))
        .unwrap()
        .expect("the timer is stored")
        .data
}

#[tokio::test(start_paused = true)]
async fn a_timer_fires_once_at_its_time_and_not_before() {
    let mut rt = runtime(Context::new("t"));
    let at = rt.now() + Duration::from_secs(60);
    rt.context_mut().create("booking:1", Booking { remind_at: at }).unwrap();

    let report = rt.run().await.unwrap();
    assert_eq!(
        report.outcome,
        TurnOutcome::Completed,
        "a timer not yet due holds no turn"
    );
    assert_eq!(report.timers_fired, 0);
    assert_eq!(report.next_wake_at, Some(at));
    assert_eq!(rt.next_wake_at(), Some(at));
    assert_eq!(rt.context().pending_timers(), 1);
    assert!(!timer(rt.context(), "booking:1").fired);

    // A moment before: nothing.
    tokio::time::advance(Duration::from_secs(60) - Duration::from_millis(1)).await;
    let report = rt.run().await.unwrap();
    assert_eq!((report.timers_fired, report.runs), (0, 0));
    assert_eq!(runs_of(rt.context(), "remind"), 0);
    assert!(rt.context().get::<Reminder>("reminder:booking:1").unwrap().is_none());

    // At the time: one fire, one run.
    tokio::time::advance(Duration::from_millis(1)).await;
    let report = rt.run().await.unwrap();
    assert_eq!(report.timers_fired, 1);
    assert_eq!(report.runs, 1);
    assert_eq!(report.next_wake_at, None);
    assert_eq!(runs_of(rt.context(), "remind"), 1);
    assert!(timer(rt.context(), "booking:1").fired);
    assert_eq!(rt.context().pending_timers(), 0);
    assert!(rt.context().get::<Reminder>("reminder:booking:1").unwrap().is_some());

    // Later turns never fire it again.
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(3600)).await;
        let report = rt.run().await.unwrap();
        assert_eq!((report.timers_fired, report.runs, report.generations), (0, 0, 0));
    }
    assert_eq!(runs_of(rt.context(), "remind"), 1);
    assert_eq!(rt.context().queued_events(), 0);
}

#[tokio::test(start_paused = true)]
async fn timers_due_together_fire_in_one_commit_earliest_first() {
    let mut rt = runtime(Context::new("t"));
    let now = rt.now();
    {
        let mut tx = rt.context_mut().transaction();
        for (i, secs) in [(1, 30), (2, 10), (3, 20), (4, 500)] {
            tx.create(
                format!("booking:{i}"),
                Booking {
                    remind_at: now + Duration::from_secs(secs),
                },
            );
        }
        tx.commit().unwrap();
    }
    rt.run().await.unwrap();
    let before = rt.context().generation();
    tokio::time::advance(Duration::from_secs(40)).await;
    let report = rt.run().await.unwrap();
    assert_eq!(report.timers_fired, 3);
    assert_eq!(report.runs, 3);
    assert_eq!(report.next_wake_at, Some(now + Duration::from_secs(500)));
    let log = rt.context().log().unwrap();
    let fire = &log[before.0 as usize];
    assert!(fire.runs[0].produce.is_none(), "the fire is a direct write");
    let fired: Vec<&str> = fire.runs[0].ops.iter().map(|op| op.id().as_str()).collect();
    assert_eq!(
        fired,
        [
            "timer:remind:booking:2",
            "timer:remind:booking:3",
            "timer:remind:booking:1"
        ],
        "one commit, earliest first"
    );
    assert_eq!(
        log.len(),
        before.0 as usize + 2,
        "the fire, then the generation reacting to it"
    );
}

#[tokio::test(start_paused = true)]
async fn a_rescheduled_timer_fires_once_at_the_new_time() {
    let mut rt = runtime(Context::new("t"));
    let now = rt.now();
    rt.context_mut()
        .create(
            "booking:1",
            Booking {
                remind_at: now + Duration::from_secs(10),
            },
        )
        .unwrap();
    rt.run().await.unwrap();
    // The booking moves: the produce runs again and schedules the same key later.
    rt.context_mut()
        .update(
            "booking:1",
            Booking {
                remind_at: now + Duration::from_secs(100),
            },
        )
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(rt.context().pending_timers(), 1, "the same key is one timer");
    assert_eq!(rt.next_wake_at(), Some(now + Duration::from_secs(100)));

    tokio::time::advance(Duration::from_secs(50)).await;
    let report = rt.run().await.unwrap();
    assert_eq!(report.timers_fired, 0, "the old time no longer fires");
    tokio::time::advance(Duration::from_secs(50)).await;
    let report = rt.run().await.unwrap();
    assert_eq!((report.timers_fired, report.runs), (1, 1));
    tokio::time::advance(Duration::from_secs(1000)).await;
    assert_eq!(rt.run().await.unwrap().timers_fired, 0);
    assert_eq!(runs_of(rt.context(), "remind"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_produce_running_again_does_not_rearm_a_fired_timer() {
    let mut rt = runtime(Context::new("t"));
    let at = rt.now() + Duration::from_secs(5);
    rt.context_mut().create("booking:1", Booking { remind_at: at }).unwrap();
    rt.run().await.unwrap();
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(rt.run().await.unwrap().timers_fired, 1);
    let fired = rt.context().get::<Timer>("timer:remind:booking:1").unwrap().unwrap();

    // A refresh of the booking with the same time makes the schedule produce run again: it
    // asks for the same timer, which has fired, and records nothing.
    rt.context_mut().delete("booking:1").unwrap();
    rt.context_mut().create("booking:1", Booking { remind_at: at }).unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(runs_of(rt.context(), "schedule"), 2);
    assert_eq!(report.timers_fired, 0);
    let after = rt.context().get::<Timer>("timer:remind:booking:1").unwrap().unwrap();
    assert_eq!((after.version, after.data.fired), (fired.version, true), "untouched");
    assert_eq!(runs_of(rt.context(), "remind"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_timer_never_fires_and_its_removal_triggers_nothing() {
    #[produce]
    async fn cancel(call: ProduceCall<Booking>) {
        let booking = call.trigger.id.to_string();
        call.effects.cancel_wake(format!("remind:{booking}"));
    }
    let mut rt = runtime(Context::new("t"));
    let at = rt.now() + Duration::from_secs(5);
    rt.context_mut().create("booking:1", Booking { remind_at: at }).unwrap();
    rt.run().await.unwrap();
    let ctx = rt.into_context();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("cancel").produce(cancel).produce(remind))
        .build()
        .unwrap();
    rt.context_mut()
        .update(
            "booking:1",
            Booking {
                remind_at: at + Duration::from_secs(1),
            },
        )
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(rt.context().pending_timers(), 0);
    assert_eq!(rt.next_wake_at(), None);
    tokio::time::advance(Duration::from_secs(60)).await;
    let report = rt.run().await.unwrap();
    assert_eq!((report.timers_fired, report.runs), (0, 0));
    assert_eq!(runs_of(rt.context(), "remind"), 0);
}

#[tokio::test(start_paused = true)]
async fn far_future_and_past_times_neither_overflow_nor_panic() {
    let mut rt = runtime(Context::new("t"));
    let far = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::MAX / 2);
    {
        let mut tx = rt.context_mut().transaction();
        tx.create("booking:far", Booking { remind_at: far });
        tx.create(
            "booking:past",
            Booking {
                remind_at: SystemTime::UNIX_EPOCH,
            },
        );
        tx.commit().unwrap();
    }
    let report = rt.run().await.unwrap();
    assert_eq!(report.timers_fired, 1, "a time in the past is due at once");
    assert_eq!(runs_of(rt.context(), "remind"), 1);
    // The far one is clamped to the latest time kept, the end of the year 9999.
    let kept = timer(rt.context(), "booking:far").at;
    assert_eq!(
        kept,
        SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799),
        "clamped"
    );
    assert_eq!(report.next_wake_at, Some(kept));
    // A deadline of Duration::MAX and a huge advance change nothing.
    let report = rt.run_with(Budget::UNLIMITED.deadline(Duration::MAX)).await.unwrap();
    assert_eq!((report.outcome, report.timers_fired), (TurnOutcome::Completed, 0));
    tokio::time::advance(Duration::from_secs(10 * 365 * 24 * 3600)).await;
    assert_eq!(rt.run().await.unwrap().timers_fired, 0);

    // A Timer's `after` saturates as well.
    assert_eq!(timer(rt.context(), "booking:past").after(Duration::MAX), kept);
}

#[tokio::test(start_paused = true)]
async fn a_fire_is_in_the_log_and_verify_and_replay_reproduce_it() {
    let mut rt = runtime(Context::new("t"));
    let at = rt.now() + Duration::from_secs(30);
    rt.context_mut().create("booking:1", Booking { remind_at: at }).unwrap();
    rt.run().await.unwrap();
    tokio::time::advance(Duration::from_secs(30)).await;
    rt.run().await.unwrap();
    let ctx = rt.context();
    let fires = ctx
        .log()
        .unwrap()
        .iter()
        .filter(|c| {
            c.runs
                .iter()
                .any(|r| r.produce.is_none() && r.ops.iter().any(|op| op.id().as_str() == "timer:remind:booking:1"))
        })
        .count();
    assert_eq!(fires, 1, "one fire commit");
    let verified = ctx.verify().unwrap();
    assert_eq!(verified.state_hash, ctx.state_hash());
    rt.replay().await.unwrap();
    reactifact_core::testing::assert_replays(rt.context(), &agents()).await;

    // A fork made after the fire carries the fired timer; one made before it, the pending one.
    let fork = rt.context().fork("after").unwrap();
    assert_eq!(fork.pending_timers(), 0);
    let fire = rt
        .context()
        .log()
        .unwrap()
        .iter()
        .find(|c| {
            c.runs
                .iter()
                .any(|r| r.produce.is_none() && r.ops.iter().any(|op| op.id().as_str().starts_with("timer:")))
        })
        .unwrap()
        .generation;
    let before = rt
        .context()
        .fork_at("before", reactifact_core::runtime::Generation(fire.0 - 1))
        .unwrap();
    assert_eq!(before.pending_timers(), 1);
    assert_eq!(before.next_timer(), Some(at));
}

#[tokio::test(start_paused = true)]
async fn a_fork_fires_its_own_copy_of_a_pending_timer() {
    let mut rt = runtime(Context::new("main"));
    let at = rt.now() + Duration::from_secs(30);
    rt.context_mut().create("booking:1", Booking { remind_at: at }).unwrap();
    rt.run().await.unwrap();
    let mut branch = runtime(rt.context().fork("branch").unwrap());
    assert_eq!(branch.next_wake_at(), Some(at));
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(branch.run().await.unwrap().timers_fired, 1);
    assert_eq!(rt.run().await.unwrap().timers_fired, 1);
    // Both fired the same timer to the same content (and reacted alike): the merge is clean.
    rt.context_mut().merge(branch.context()).unwrap();
    assert_eq!(rt.context().pending_timers(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_timer_due_while_no_process_ran_fires_once_after_the_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timers.db");
    let at;
    {
        let mut rt = runtime(Context::open(&path, "t").unwrap());
        at = rt.now() + Duration::from_secs(3600);
        rt.context_mut().create("booking:1", Booking { remind_at: at }).unwrap();
        let report = rt.run().await.unwrap();
        assert_eq!(report.next_wake_at, Some(at));
    }
    // The process is down while the timer falls due.
    tokio::time::advance(Duration::from_secs(7200)).await;
    let mut rt = runtime(Context::open(&path, "t").unwrap());
    assert_eq!(rt.context().pending_timers(), 1, "rebuilt on open");
    assert_eq!(rt.next_wake_at(), Some(at));
    let report = rt.run().await.unwrap();
    assert_eq!((report.timers_fired, report.runs), (1, 1));
    drop(rt);

    // Reopened again: it fired, durably, and never fires again.
    let mut rt = runtime(Context::open(&path, "t").unwrap());
    assert_eq!(rt.context().pending_timers(), 0);
    assert!(timer(rt.context(), "booking:1").fired);
    let report = rt.run().await.unwrap();
    assert_eq!((report.timers_fired, report.runs, report.generations), (0, 0, 0));
    assert_eq!(runs_of(rt.context(), "remind"), 1);
    rt.context().verify().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_fire_committed_before_a_crash_is_reacted_to_after_it_and_not_fired_again() {
    /// Fails while the flag is up: the generation after the fire fails and is not committed.
    #[produce(Reminder)]
    async fn failing(call: ProduceCall<Timer>) -> Result<(), reactifact_core::ProduceError> {
        let _ = call;
        Err(reactifact_core::ProduceError::msg("down"))
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timers.db");
    let at;
    {
        let mut rt = Runtime::builder(Context::open(&path, "t").unwrap())
            .agent(Agent::new("reminders").produce(schedule).produce(failing))
            .build()
            .unwrap();
        at = rt.now() + Duration::from_secs(10);
        rt.context_mut().create("booking:1", Booking { remind_at: at }).unwrap();
        rt.run().await.unwrap();
        tokio::time::advance(Duration::from_secs(10)).await;
        // The fire commits; the reaction fails: the process "dies" with the fire's event queued.
        let failed = rt.run().await;
        assert!(matches!(failed, Err(RunError::Produce { .. })), "{failed:?}");
        assert!(timer(rt.context(), "booking:1").fired);
        assert_eq!(rt.context().queued_events(), 1);
    }
    let mut rt = runtime(Context::open(&path, "t").unwrap());
    assert_eq!(rt.context().pending_timers(), 0, "the fire is durable");
    assert_eq!(rt.context().queued_events(), 1, "and so is its event");
    let report = rt.run().await.unwrap();
    assert_eq!(
        (report.timers_fired, report.runs),
        (0, 1),
        "reacted to once, not fired again"
    );
    assert_eq!(runs_of(rt.context(), "remind"), 1);
}

#[tokio::test(start_paused = true)]
async fn timers_survive_a_reopen_from_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timers.db");
    let options = || OpenOptions::default().checkpoint_every(1);
    let now;
    {
        let mut rt = runtime(Context::open_with(&path, "t", options()).unwrap());
        now = rt.now();
        let mut tx = rt.context_mut().transaction();
        for i in 0..3 {
            tx.create(
                format!("booking:{i}"),
                Booking {
                    remind_at: now + Duration::from_secs(10 * (i + 1)),
                },
            );
        }
        tx.commit().unwrap();
        rt.run().await.unwrap();
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(rt.run().await.unwrap().timers_fired, 1);
        rt.context().checkpoint().await.unwrap();
    }
    let mut rt = runtime(Context::open_with(&path, "t", options()).unwrap());
    assert_eq!(rt.context().pending_timers(), 2);
    assert_eq!(rt.next_wake_at(), Some(now + Duration::from_secs(20)));
    tokio::time::advance(Duration::from_secs(20)).await;
    assert_eq!(rt.run().await.unwrap().timers_fired, 2);
    assert_eq!(runs_of(rt.context(), "remind"), 3);
    rt.context().verify().unwrap();
}

#[tokio::test(start_paused = true)]
async fn serve_wakes_for_a_timer_without_any_write() {
    let mut rt = runtime(Context::new("t"));
    let at = rt.now() + Duration::from_secs(90);
    rt.context_mut().create("booking:1", Booking { remind_at: at }).unwrap();
    let handle = rt.handle();
    let serving = tokio::spawn(async move {
        // A poll far longer than the timer: only the timer can wake it in time.
        let report = rt.serve(Duration::from_secs(24 * 3600)).await.unwrap();
        (rt, report)
    });
    // The paused clock runs to the earliest sleeper: the serving runtime's wake-up for the
    // timer, if it has one, then this test's sleep a second after the timer's time.
    tokio::time::sleep(Duration::from_secs(91)).await;
    handle.stop();
    let (rt, report) = serving.await.unwrap();
    assert!(rt.context().get::<Reminder>("reminder:booking:1").unwrap().is_some());
    assert_eq!(runs_of(rt.context(), "remind"), 1);
    assert!(report.runs >= 2, "{report:?}");
}

#[test]
fn a_timer_kind_of_the_users_own_is_refused_at_build() {
    #[derive(Serialize, Deserialize)]
    struct MyTimer;
    impl Artifact for MyTimer {
        const KIND: &'static str = "timer";
    }
    #[produce(MyTimer)]
    async fn mine(call: ProduceCall<Booking>) {
        let _ = call;
    }
    let built = Runtime::builder(Context::new("t"))
        .agent(Agent::new("a").produce(mine))
        .build();
    let error = built.expect_err("refused").to_string();
    assert!(error.contains("kind `timer`"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn two_writers_on_one_session_fire_a_timer_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timers.db");
    let at;
    {
        let mut rt = runtime(Context::open(&path, "t").unwrap());
        at = rt.now() + Duration::from_secs(10);
        rt.context_mut().create("booking:1", Booking { remind_at: at }).unwrap();
        rt.run().await.unwrap();
    }
    // Both load the session with the timer pending.
    let mut first = runtime(Context::open(&path, "t").unwrap());
    let mut second = runtime(Context::open(&path, "t").unwrap());
    assert_eq!((first.next_wake_at(), second.next_wake_at()), (Some(at), Some(at)));
    tokio::time::advance(Duration::from_secs(10)).await;
    let report = first.run().await.unwrap();
    assert_eq!((report.timers_fired, report.runs), (1, 1));
    // The second's fire is fenced out; it reads the first's commits and finds nothing due.
    let report = second.run().await.unwrap();
    assert_eq!(
        (report.outcome, report.timers_fired, report.runs),
        (TurnOutcome::Completed, 0, 0)
    );
    assert_eq!(second.context().head(), first.context().head());
    drop((first, second));
    let reopened = Context::open(&path, "t").unwrap();
    assert_eq!(runs_of(&reopened, "remind"), 1);
    let fires = reopened
        .log()
        .unwrap()
        .iter()
        .filter(|c| {
            c.runs
                .iter()
                .any(|r| r.produce.is_none() && r.ops.iter().any(|op| op.id().as_str().starts_with("timer:")))
        })
        .count();
    assert_eq!(fires, 1);
    reopened.verify().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_timer_of_a_generation_that_fails_at_commit_is_not_scheduled() {
    /// A patch that does not apply: the generation's commit rolls back, the timer with it.
    #[produce]
    async fn broken(call: ProduceCall<Booking>) {
        call.effects.update("booking:missing", call.trigger.data.clone());
    }
    let mut ctx = Context::new("t");
    let at = {
        let probe = runtime(Context::new("probe"));
        probe.now() + Duration::from_secs(5)
    };
    ctx.create("booking:1", Booking { remind_at: at }).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(
            Agent::new("reminders")
                .produce(schedule)
                .produce(broken)
                .produce(remind),
        )
        .build()
        .unwrap();
    let failed = rt.run().await;
    assert!(matches!(failed, Err(RunError::Produce { .. })), "{failed:?}");
    assert_eq!(rt.context().pending_timers(), 0, "rolled back with its generation");
    assert_eq!(rt.next_wake_at(), None);
    assert!(rt.context().get::<Timer>("timer:remind:booking:1").unwrap().is_none());
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(rt.run().await.is_err(), "the generation fails again, and nothing fires");
    assert_eq!(runs_of(rt.context(), "remind"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_runtime_without_produces_leaves_timers_to_one_that_has_them() {
    let mut rt = runtime(Context::new("t"));
    let at = rt.now() + Duration::from_secs(5);
    rt.context_mut().create("booking:1", Booking { remind_at: at }).unwrap();
    rt.run().await.unwrap();
    let mut drainer = Runtime::builder(rt.into_context()).build().unwrap();
    tokio::time::advance(Duration::from_secs(5)).await;
    let report = drainer.run().await.unwrap();
    assert_eq!((report.timers_fired, report.next_wake_at), (0, None));
    assert_eq!(drainer.context().pending_timers(), 1);
    let mut rt = runtime(drainer.into_context());
    assert_eq!(rt.run().await.unwrap().timers_fired, 1);
    assert_eq!(runs_of(rt.context(), "remind"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_reaction_leaves_the_fire_committed_and_runs_again_on_retry() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static PANIC: AtomicBool = AtomicBool::new(true);
    #[produce(Reminder)]
    async fn flaky(call: ProduceCall<Timer>) {
        if PANIC.load(Ordering::SeqCst) {
            panic!("boom");
        }
        let booking: String = call.trigger.data.payload().unwrap();
        call.effects.upsert(
            format!("reminder:{booking}"),
            Reminder {
                booking,
                timer_version: call.trigger.version.0,
            },
        );
    }
    let mut rt = Runtime::builder(Context::new("t"))
        .agent(Agent::new("reminders").produce(schedule).produce(flaky))
        .build()
        .unwrap();
    let at = rt.now() + Duration::from_secs(5);
    rt.context_mut().create("booking:1", Booking { remind_at: at }).unwrap();
    rt.run().await.unwrap();
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(rt.run().await.is_err());
    assert_eq!(rt.context().pending_timers(), 0, "the fire is committed");
    PANIC.store(false, Ordering::SeqCst);
    let report = rt.run().await.unwrap();
    assert_eq!((report.timers_fired, report.runs), (0, 1));
    assert!(rt.context().get::<Reminder>("reminder:booking:1").unwrap().is_some());
}

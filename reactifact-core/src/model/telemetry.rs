//! Metrics through the [`metrics`](::metrics) facade: the runtime, the commits and the drains
//! record into whatever recorder the program installed (none: they cost next to nothing), with
//! names and labels after the Prometheus conventions. No payload, key, id or session is ever a
//! label: only agent and produce names, action kinds, outcomes and statuses, which a program
//! defines in its code.
//!
//! Handles are looked up once per turn (runs), per commit, and per drain call and action kind
//! (deliveries), never per intent, so a recorder installed at any time before a turn or a drain
//! starts receives it. The usage of metered calls is recorded per run that made one, by call
//! name (a model call costs far more than the lookup).

use std::sync::Arc;
use std::time::Duration;

use ::metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter, Histogram, Unit,
};

use crate::model::call::Usage;
use crate::model::delivery::DeliveryStatus;

/// The names of the metrics reactifact records (see `docs/observability.md`).
pub mod metric {
    /// Counter: generations a runtime committed.
    pub const GENERATIONS_COMMITTED: &str = "reactifact_generations_committed_total";
    /// Counter, labels `agent`, `produce`: produce runs committed (a run isolated on failure,
    /// or whose generation did not commit, is not counted).
    pub const RUNS_COMMITTED: &str = "reactifact_runs_committed_total";
    /// Histogram (seconds), labels `agent`, `produce`: how long each produce run took, from its
    /// start to its end, whether it succeeded or failed (on the runtime's clock: tokio's, paused
    /// in tests); the runs of a generation cut off by a stop or a deadline are not recorded.
    pub const RUN_DURATION: &str = "reactifact_run_duration_seconds";
    /// Histogram (seconds): how long each commit of a context took, its store write included.
    pub const COMMIT_DURATION: &str = "reactifact_commit_duration_seconds";
    /// Counter, label `kind`: intents acted by commits and handed to the outbox. A key the
    /// ledger holds already (a re-derivation acting it again) is counted again, though the
    /// ledger registers it once.
    pub const INTENTS_COMMITTED: &str = "reactifact_intents_committed_total";
    /// Counter, labels `kind`, `outcome` (`delivered`, `failed`, `dead`, `held`,
    /// `interrupted`): delivery outcomes recorded in the ledger. `failed` will be retried,
    /// `dead` will not; `held` found no route; `interrupted` was cut off by a stop or deadline.
    pub const DELIVERIES: &str = "reactifact_deliveries_total";
    /// Counter, label `kind`: attempts handed to a dispatcher whose outcome was recorded, as the
    /// ledger counts them ([`Delivery::attempts`](crate::Delivery::attempts)): one that found
    /// no route (held) is not an attempt.
    pub const DELIVERY_ATTEMPTS: &str = "reactifact_delivery_attempts_total";
    /// Histogram (seconds), label `kind`: from the commit that registered an intent to the
    /// recording of its successful delivery (retries and waits included).
    pub const DELIVERY_LATENCY: &str = "reactifact_delivery_latency_seconds";
    /// Gauge, label `status` (`pending`, `in_flight`, `delivered`, `failed`, `retrying`,
    /// `dead`, `held`, `cancelled`, `awaiting_approval`, `rejected`): intents in the outbox by
    /// status (`retrying` is the part of `failed` with a retry scheduled), as last counted by
    /// [`Ledger::record_metrics`](crate::Ledger::record_metrics) or a serving
    /// [`Drainer`](crate::Drainer).
    pub const OUTBOX_INTENTS: &str = "reactifact_outbox_intents";
    /// Gauge (seconds): how long the oldest pending intent has waited since its commit (0 when
    /// none is pending), as last counted.
    pub const OUTBOX_OLDEST_PENDING_AGE: &str = "reactifact_outbox_oldest_pending_age_seconds";
    /// Counter: in-flight intents whose lease expired (their holder died or stalled), put back
    /// to pending by a claim of this process.
    pub const LEASES_RECLAIMED: &str = "reactifact_leases_reclaimed_total";
    /// Counter: late outcomes the store rejected because another drain had reclaimed the
    /// intent (the fencing token was stale).
    pub const STALE_OUTCOMES_REJECTED: &str = "reactifact_stale_outcomes_rejected_total";
    /// Counter: commits refused because another writer had advanced the session, and retried.
    pub const COMMIT_CONFLICTS: &str = "reactifact_commit_conflicts_total";
    /// Counter, labels `agent`, `produce`, `model`: tokens sent by the metered calls
    /// ([`ProduceCall::record_metered`](crate::ProduceCall::record_metered)) that produce runs
    /// made, as their [`Usage::tokens_in`](crate::Usage::tokens_in) reported; an answer reused
    /// from an earlier attempt or from the record is not a call made, and counts nothing.
    /// `model` is the call's name (the first argument of `record_metered`): nothing else names
    /// the model.
    pub const CALL_TOKENS_IN: &str = "reactifact_call_tokens_in_total";
    /// Counter, labels `agent`, `produce`, `model`: tokens received by the metered calls made
    /// ([`Usage::tokens_out`](crate::Usage::tokens_out)), counted as
    /// [`CALL_TOKENS_IN`] counts.
    pub const CALL_TOKENS_OUT: &str = "reactifact_call_tokens_out_total";
    /// Counter, labels `agent`, `produce`, `model`: the cost the metered calls made reported
    /// ([`Usage::cost`](crate::Usage::cost)), in the program's own unit, counted as
    /// [`CALL_TOKENS_IN`] counts.
    pub const CALL_COST: &str = "reactifact_call_cost_total";
}

/// Describes every metric to the installed recorder (units and help texts). Cheap; called
/// when a runtime or a drainer is built.
pub(crate) fn describe() {
    use metric::*;
    describe_counter!(GENERATIONS_COMMITTED, "Generations a runtime committed.");
    describe_counter!(RUNS_COMMITTED, "Produce runs committed, by agent and produce.");
    describe_histogram!(RUN_DURATION, Unit::Seconds, "How long each produce run took.");
    describe_histogram!(
        COMMIT_DURATION,
        Unit::Seconds,
        "How long each commit took, its store write included."
    );
    describe_counter!(INTENTS_COMMITTED, "Intents acted by commits, by kind.");
    describe_counter!(DELIVERIES, "Delivery outcomes recorded, by kind and outcome.");
    describe_counter!(DELIVERY_ATTEMPTS, "Delivery attempts handed to a dispatcher, by kind.");
    describe_histogram!(
        DELIVERY_LATENCY,
        Unit::Seconds,
        "From an intent's commit to its recorded delivery."
    );
    describe_gauge!(OUTBOX_INTENTS, "Intents in the outbox, by status, as last counted.");
    describe_gauge!(
        OUTBOX_OLDEST_PENDING_AGE,
        Unit::Seconds,
        "Age of the oldest pending intent, as last counted."
    );
    describe_counter!(
        LEASES_RECLAIMED,
        "Expired leases of dead or stalled holders, reclaimed."
    );
    describe_counter!(
        STALE_OUTCOMES_REJECTED,
        "Late outcomes rejected by their stale fencing token."
    );
    describe_counter!(
        COMMIT_CONFLICTS,
        "Commits refused by another writer's progress, and retried."
    );
    describe_counter!(
        CALL_TOKENS_IN,
        "Tokens sent by the metered calls produce runs made, by agent, produce and model (the call's name)."
    );
    describe_counter!(
        CALL_TOKENS_OUT,
        "Tokens received by the metered calls produce runs made, by agent, produce and model (the call's name)."
    );
    describe_counter!(
        CALL_COST,
        "Cost the metered calls produce runs made reported, in the program's unit, by agent, produce and model (the call's name)."
    );
}

/// The handles of one produce's runs.
pub(crate) struct ProduceMetrics {
    pub(crate) committed: Counter,
    pub(crate) duration: Histogram,
}

/// The run metrics of a runtime: handles per produce (by its agent's and its own position),
/// looked up again each turn ([`clear`](RunMetrics::clear)).
#[derive(Default)]
pub(crate) struct RunMetrics {
    produces: foldhash::HashMap<(usize, usize), ProduceMetrics>,
}

impl RunMetrics {
    /// Forgets every handle, so that the next turn looks them up in the recorder installed
    /// then.
    pub(crate) fn clear(&mut self) {
        self.produces.clear();
    }

    /// The handles of the produce at `slot` (agent, produce), named `names`.
    pub(crate) fn of(&mut self, slot: (usize, usize), names: impl FnOnce() -> (Arc<str>, Arc<str>)) -> &ProduceMetrics {
        self.produces.entry(slot).or_insert_with(|| {
            let (agent, produce) = names();
            let labels = [("agent", agent), ("produce", produce)];
            ProduceMetrics {
                committed: counter!(metric::RUNS_COMMITTED, &labels),
                duration: histogram!(metric::RUN_DURATION, &labels),
            }
        })
    }
}

/// Counts one generation committed.
pub(crate) fn record_generation() {
    counter!(metric::GENERATIONS_COMMITTED).increment(1);
}

/// Records one commit: its duration, and its intents by kind (consecutive intents of a kind
/// counted together).
pub(crate) fn record_commit<'a>(took: Duration, kinds: impl Iterator<Item = &'a Arc<str>>) {
    let mut tally = CommitTally::new(took);
    kinds.for_each(|kind| tally.intent(kind));
    tally.record();
}

/// [`record_commit`] for intents counted one by one as something else walks them (the
/// in-memory ledger registering them): no walk of its own.
pub(crate) struct CommitTally {
    took: Duration,
    /// The kind of the intents counted last, and how many in a row.
    run: Option<(Arc<str>, u64)>,
}

impl CommitTally {
    /// A commit that took `took`, before its intents are counted.
    pub(crate) fn new(took: Duration) -> Self {
        CommitTally { took, run: None }
    }

    /// Counts an intent of `kind`.
    pub(crate) fn intent(&mut self, kind: &Arc<str>) {
        match &mut self.run {
            Some((last, n)) if Arc::ptr_eq(last, kind) || last[..] == kind[..] => *n += 1,
            _ => {
                if let Some((last, n)) = self.run.replace((kind.clone(), 1)) {
                    counter!(metric::INTENTS_COMMITTED, "kind" => last).increment(n);
                }
            }
        }
    }

    /// Records the duration and the counts.
    pub(crate) fn record(self) {
        histogram!(metric::COMMIT_DURATION).record(self.took.as_secs_f64());
        if let Some((last, n)) = self.run {
            counter!(metric::INTENTS_COMMITTED, "kind" => last).increment(n);
        }
    }
}

/// Counts what the metered calls named `model` that one run of `agent`/`produce` made used.
pub(crate) fn record_call_usage(agent: &Arc<str>, produce: &Arc<str>, model: &Arc<str>, usage: Usage) {
    let labels = [
        ("agent", agent.clone()),
        ("produce", produce.clone()),
        ("model", model.clone()),
    ];
    counter!(metric::CALL_TOKENS_IN, &labels).increment(usage.tokens_in);
    counter!(metric::CALL_TOKENS_OUT, &labels).increment(usage.tokens_out);
    counter!(metric::CALL_COST, &labels).increment(usage.cost);
}

/// Counts one commit refused by another writer, and retried.
pub(crate) fn record_conflict() {
    counter!(metric::COMMIT_CONFLICTS).increment(1);
}

/// How a recorded delivery outcome is counted.
#[derive(Clone, Copy)]
pub(crate) enum Counted {
    Delivered,
    Failed,
    Dead,
    Held,
    Interrupted,
}

/// The handles of one action kind, for one drain call.
struct KindMetrics {
    kind: Arc<str>,
    attempts: Counter,
    outcomes: [Counter; 5],
    latency: Histogram,
}

/// The delivery metrics of one drain call: handles per action kind, looked up at the kind's
/// first delivery.
#[derive(Default)]
pub(crate) struct DeliveryMetrics {
    kinds: Vec<KindMetrics>,
}

impl DeliveryMetrics {
    fn of(&mut self, kind: &Arc<str>) -> &KindMetrics {
        let at = match self
            .kinds
            .iter()
            .position(|k| Arc::ptr_eq(&k.kind, kind) || *k.kind == **kind)
        {
            Some(at) => at,
            None => {
                let outcome =
                    |name: &'static str| counter!(metric::DELIVERIES, "kind" => kind.clone(), "outcome" => name);
                self.kinds.push(KindMetrics {
                    kind: kind.clone(),
                    attempts: counter!(metric::DELIVERY_ATTEMPTS, "kind" => kind.clone()),
                    outcomes: [
                        outcome("delivered"),
                        outcome("failed"),
                        outcome("dead"),
                        outcome("held"),
                        outcome("interrupted"),
                    ],
                    latency: histogram!(metric::DELIVERY_LATENCY, "kind" => kind.clone()),
                });
                self.kinds.len() - 1
            }
        };
        &self.kinds[at]
    }

    /// An attempt of `kind` handed to the dispatcher.
    pub(crate) fn attempt(&mut self, kind: &Arc<str>) {
        self.of(kind).attempts.increment(1);
    }

    /// An outcome of `kind` recorded; for a delivery, `latency` since its commit.
    pub(crate) fn outcome(&mut self, kind: &Arc<str>, outcome: Counted, latency: Option<Duration>) {
        let handles = self.of(kind);
        handles.outcomes[outcome as usize].increment(1);
        if let Some(latency) = latency {
            handles.latency.record(latency.as_secs_f64());
        }
    }

    /// Leases reclaimed by a claim.
    pub(crate) fn reclaimed(n: usize) {
        if n > 0 {
            counter!(metric::LEASES_RECLAIMED).increment(n as u64);
        }
    }

    /// Late outcomes rejected.
    pub(crate) fn stale(n: u64) {
        if n > 0 {
            counter!(metric::STALE_OUTCOMES_REJECTED).increment(n);
        }
    }
}

/// Sets the outbox gauges: the counts by status (and of the failed, those `retrying`), and the
/// age of the oldest pending intent.
pub(crate) fn record_outbox(
    by_status: impl IntoIterator<Item = (DeliveryStatus, u64)>,
    retrying: u64,
    oldest_pending_age: Option<Duration>,
) {
    for (status, n) in by_status {
        gauge!(metric::OUTBOX_INTENTS, "status" => status_label(status)).set(n as f64);
    }
    gauge!(metric::OUTBOX_INTENTS, "status" => "retrying").set(retrying as f64);
    gauge!(metric::OUTBOX_OLDEST_PENDING_AGE).set(oldest_pending_age.map_or(0.0, |d| d.as_secs_f64()));
}

/// A status as a label value: snake case.
fn status_label(status: DeliveryStatus) -> &'static str {
    match status {
        DeliveryStatus::Pending => "pending",
        DeliveryStatus::InFlight => "in_flight",
        DeliveryStatus::Delivered => "delivered",
        DeliveryStatus::Failed => "failed",
        DeliveryStatus::Dead => "dead",
        DeliveryStatus::Held => "held",
        DeliveryStatus::Cancelled => "cancelled",
        DeliveryStatus::AwaitingApproval => "awaiting_approval",
        DeliveryStatus::Rejected => "rejected",
        DeliveryStatus::Blocked => "blocked",
    }
}

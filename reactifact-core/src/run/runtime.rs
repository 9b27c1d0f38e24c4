//! The runtime: agents, the generation loop, budgets and the outbox drain.

use std::sync::Arc;
use std::time::Duration;

use foldhash::{HashMap, HashMapExt};
use tokio::time::Instant;
use tracing::Instrument;

use crate::model::action::PendingAction;
use crate::model::artifact::{ArtifactType, Kind};
use crate::model::build_error::BuildError;
use crate::model::call::Usage;
use crate::model::delivery::Delivery;
use crate::model::stop::StopHandle;
use crate::model::telemetry::RunMetrics;
use crate::model::timer::Timer;
use crate::model::trace::TraceParent;
use crate::outbox::dispatcher::{Dispatcher, ErasedDispatcher};
use crate::outbox::drain::{Clock, DeliveryFailure, Drain, DrainError, Interrupted, Preclaimed, RetryPolicy};
use crate::outbox::drainer::FlushError;
use crate::outbox::options::{DeliveryErrors, DeliveryOptions};
use crate::outbox::report::DrainReport;
use crate::run::calls::{CallCache, Meter};
use crate::run::generation::{self, Intake, Slot};
use crate::run::handle::{Inbox, DEFAULT_INBOX_CAPACITY};
use crate::run::join::Joins;
use crate::run::produce::{Agent, ProduceFailure};
use crate::run::resources::Resources;
use crate::session::context::{Context, WriteError};
use crate::store::outbox::{ApprovalError, CancelError, RetryError, Scope};
use crate::store::StoreError;

/// A turn ([`Runtime::run`](crate::Runtime::run)) failed. The failure is already recorded: a
/// failed generation left its events queued, a failed delivery is in the ledger.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A produce run failed (fail-loud mode); the generation was not committed and its events
    /// stay queued. `others` counts further failed runs of the same generation.
    #[error("{first}{}", others_suffix(*others))]
    Produce {
        /// The first failed run in work order.
        first: Box<ProduceFailure>,
        /// How many other runs of the generation failed.
        others: usize,
    },
    /// A delivery failed (fail-loud delivery); the failure is recorded in the ledger and the
    /// intent can be re-armed with `retry`.
    #[error(transparent)]
    Delivery(#[from] DeliveryFailure),
    /// The durable store failed; what it was writing did not take effect (a generation stays
    /// uncommitted with its events queued; a delivery outcome is re-derived from its lease).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The commit that fires the due timers was refused (the error names the timer); nothing
    /// of it was written and the timers stay due.
    #[error("firing the due timers failed: {0}")]
    Timers(#[source] WriteError),
}

fn others_suffix(others: usize) -> String {
    match others {
        0 => String::new(),
        1 => " (and 1 other run of the generation)".to_owned(),
        n => format!(" (and {n} other runs of the generation)"),
    }
}

/// What a produce error does to its generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProduceErrors {
    /// The generation is not committed: its siblings finish, then the turn fails with the
    /// first error in work order and the events stay queued, so a retry re-runs them.
    #[default]
    FailLoud,
    /// Only the failing run's patch is dropped; the rest of the generation commits and the
    /// failure is reported in [`TurnReport::failed_runs`].
    Isolate,
}

/// Limits of one turn. Hitting one is an [outcome](TurnOutcome), not an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// At most this many produce runs per turn.
    pub max_runs: Option<u64>,
    /// At most this many generations per turn.
    pub max_generations: Option<u64>,
    /// A hard wall-clock limit per turn (tokio time, so a paused clock drives it). A
    /// generation still running when it passes is cancelled: nothing of it is committed and
    /// its events stay queued for the next turn. A delivery already handed to the
    /// dispatcher finishes and is recorded; no further one starts. A deadline too far away
    /// to represent (such as `Duration::MAX`) is no deadline.
    pub deadline: Option<Duration>,
    /// At most this many tokens (in and out) spent by the turn's recorded calls
    /// ([`ProduceCall::record_metered`](crate::ProduceCall::record_metered)); see
    /// [`Budget::max_tokens`].
    pub max_tokens: Option<u64>,
    /// At most this much cost spent by the turn's recorded calls, in the unit of
    /// [`Usage::cost`](crate::Usage::cost); see [`Budget::max_cost`].
    pub max_cost: Option<u64>,
}

impl Budget {
    /// No limit at all. A produce cycle then runs until it stops changing anything.
    pub const UNLIMITED: Budget = Budget {
        max_runs: None,
        max_generations: None,
        deadline: None,
        max_tokens: None,
        max_cost: None,
    };

    /// Sets the run limit.
    pub fn max_runs(mut self, runs: u64) -> Self {
        self.max_runs = Some(runs);
        self
    }

    /// Sets the generation limit.
    pub fn max_generations(mut self, generations: u64) -> Self {
        self.max_generations = Some(generations);
        self
    }

    /// Sets the wall-clock deadline, measured from the start of the turn.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sets the token limit: a recorded call is made only while the turn's calls have spent
    /// fewer than `tokens` tokens (in and out, as they report them with
    /// [`Usage`](crate::Usage)), and the turn ends, with [`TurnOutcome::TokensExhausted`],
    /// after the generation in which they reach it.
    ///
    /// A call that finds the limit reached is not made; the runs of its generation on the
    /// events before that call's event commit, and the rest of the generation — that event and
    /// the later ones — stays queued for the next turn, with the answers its runs already got
    /// kept in memory for their next attempt. A call's usage is known only when it answers, so
    /// calls running at once when the limit is crossed all finish (the turn overshoots by
    /// them); with runs executing one at a time ([`RuntimeBuilder::max_concurrency`] of 1) the
    /// turn stops at the first run whose call finds the limit reached. The calls of the runs on
    /// the generation's first event are never refused, so every turn commits at least that
    /// work (a budgeted turn's generation takes no event that would fold into a run of its
    /// first event, such as a debounced produce's later event). Only metered calls
    /// ([`ProduceCall::record_metered`](crate::ProduceCall::record_metered)) are refused.
    /// Answers reused from the record cost nothing.
    pub fn max_tokens(mut self, tokens: u64) -> Self {
        self.max_tokens = Some(tokens);
        self
    }

    /// Sets the cost limit, in the unit of [`Usage::cost`](crate::Usage::cost): as
    /// [`max_tokens`](Budget::max_tokens), ending the turn with
    /// [`TurnOutcome::CostExhausted`].
    pub fn max_cost(mut self, cost: u64) -> Self {
        self.max_cost = Some(cost);
        self
    }
}

impl Default for Budget {
    /// At most 10,000 generations per turn, as a guard against produce cycles; no other limit.
    fn default() -> Self {
        Budget::UNLIMITED.max_generations(10_000)
    }
}

/// How a turn ended. Every outcome leaves the context consistent: committed generations stay
/// committed, the rest stays queued or pending for the next turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TurnOutcome {
    /// No events are queued, nothing is deliverable and no timer is due (a timer due later
    /// does not hold the turn: see [`TurnReport::next_wake_at`]). A runtime that registers no produce
    /// (a drainer: a dispatcher and no agent) completes with its events still queued: it
    /// leaves them for a runtime that has produces.
    Completed,
    /// The next generation would exceed [`Budget::max_runs`].
    RunsExhausted,
    /// [`Budget::max_generations`] generations ran and events are still queued.
    GenerationsExhausted,
    /// [`Budget::deadline`] passed.
    DeadlineExceeded,
    /// A [`StopHandle`] asked the turn to stop.
    Stopped,
    /// The turn's recorded calls reached [`Budget::max_tokens`]: the turn ended after the
    /// generation that reached it; a call that found it reached was not made, and its event and
    /// the later ones of its generation stay queued for the next turn.
    TokensExhausted,
    /// A recorded call found [`Budget::max_cost`] reached: as
    /// [`TokensExhausted`](TurnOutcome::TokensExhausted).
    CostExhausted,
}

/// What a turn did.
#[derive(Debug)]
#[non_exhaustive]
pub struct TurnReport {
    /// How the turn ended.
    pub outcome: TurnOutcome,
    /// The turn's number on this runtime, starting at 1 (also the `turn` field of its span).
    pub turn: u64,
    /// Generations committed.
    pub generations: u64,
    /// Produce runs executed in committed generations.
    pub runs: u64,
    /// What the turn's drains delivered, and what failed, died or was held. In a runtime
    /// without a dispatcher, [`DrainReport::waiting`] counts every pending intent.
    pub deliveries: DrainReport,
    /// Runs whose patch was dropped ([`ProduceErrors::Isolate`]).
    pub failed_runs: Vec<ProduceFailure>,
    /// Generations run again because another writer (another process on the same session of
    /// the store) committed first: each time, the runtime read the other's commits, applied
    /// them, paused briefly (1 ms, doubling with each conflict in a row up to 64 ms, jittered)
    /// and ran its generation again on the new head, so nothing of either is lost and no
    /// intent is acted twice. Each such conflict means the other writer made progress, so they
    /// are retried for as long as it does (the turn's budget and stop still apply); see
    /// [`MAX_CONFLICT_RETRIES`].
    pub conflicts: u64,
    /// Generations of a serving runtime run again because writes sent through its handles
    /// were committed while their runs executed: each ran again on the new head, with the
    /// answers its recorded calls got (see [`Runtime::serve`]).
    pub overtaken: u64,
    /// Runs of a serving runtime parked: they failed on the last attempt their produce's retry
    /// policy allowed (see [`Parked`](crate::Parked)). Every failed run is in
    /// [`failed_runs`](TurnReport::failed_runs).
    pub parked: u64,
    /// Timers the turn fired: each committed as fired (one direct write for the timers due
    /// at once, not counted in [`generations`](TurnReport::generations)) before the
    /// generation that reacts to them.
    pub timers_fired: u64,
    /// When the next timer falls due, as the turn ended ([`Runtime::next_wake_at`]): a turn
    /// does not wait for a timer that is not yet due; run another turn then (`serve` does).
    pub next_wake_at: Option<std::time::SystemTime>,
    /// What the turn's recorded calls used, per agent and produce, in the order they first
    /// made or reused a call: the calls made in this turn — in committed generations or not,
    /// since what a call spent is spent — and the answers reused from an earlier attempt.
    /// Empty when no produce recorded a call.
    pub usage: Vec<ProduceUsage>,
}

impl TurnReport {
    /// What all the turn's recorded calls used.
    pub fn total_usage(&self) -> Usage {
        self.usage.iter().fold(Usage::ZERO, |sum, u| sum + u.usage)
    }

    pub(crate) fn count_usage(&mut self, agent: &str, produce: &str, spent: Usage, made: u64, reused: u64) {
        let at = match self.usage.iter().position(|u| u.agent == agent && u.produce == produce) {
            Some(at) => at,
            None => {
                self.usage.push(ProduceUsage {
                    agent: agent.to_owned(),
                    produce: produce.to_owned(),
                    usage: Usage::ZERO,
                    calls: 0,
                    reused: 0,
                });
                self.usage.len() - 1
            }
        };
        let entry = &mut self.usage[at];
        entry.usage += spent;
        entry.calls = entry.calls.saturating_add(made);
        entry.reused = entry.reused.saturating_add(reused);
    }
}

/// What one produce's recorded calls used in a turn ([`TurnReport::usage`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProduceUsage {
    /// The agent.
    pub agent: String,
    /// The produce.
    pub produce: String,
    /// What the calls it made reported (reused answers cost nothing).
    pub usage: Usage,
    /// Calls made: closures called ([`ProduceCall::now`](crate::ProduceCall::now) and
    /// [`ProduceCall::rng`](crate::ProduceCall::rng) not counted).
    pub calls: u64,
    /// Calls answered from an earlier attempt of the same run (a generation that did not
    /// commit), without calling (the clock and the seed not counted).
    pub reused: u64,
}

/// How many conflicts in a row a turn retries when the other writer's commits change nothing
/// this runtime sees (its head and queue stay as they were, which no working writer does);
/// past it, the turn fails with the [`StoreError::Conflict`](crate::StoreError::Conflict).
/// Conflicts that bring the other writer's progress are retried without this bound (see
/// [`TurnReport::conflicts`]).
pub const MAX_CONFLICT_RETRIES: u64 = 16;

/// The pause before a generation runs again after the `n`-th conflict in a row: 1 ms doubling
/// to 64 ms, less up to half of it (jitter from the process and `n`, so two processes do not
/// pause in step).
fn conflict_pause(n: u64) -> Duration {
    let full = 1u64 << n.saturating_sub(1).min(6);
    let spread =
        u64::from(std::process::id()).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let micros = full * 1000;
    Duration::from_micros(micros - (spread >> 33) % (micros / 2 + 1))
}

/// Builds a [`Runtime`]: agents, a dispatcher, error modes, limits.
pub struct RuntimeBuilder {
    context: Context,
    agents: Vec<Agent>,
    dispatcher: Option<Arc<dyn ErasedDispatcher>>,
    produce_errors: ProduceErrors,
    delivery: DeliveryOptions,
    max_concurrency: usize,
    budget: Budget,
    resources: Resources,
    inbox_capacity: usize,
    produce_retry: ProduceRetries,
    metrics_every: Duration,
}

/// How often a serving runtime sets its outbox gauges by default.
const DEFAULT_METRICS_INTERVAL: Duration = Duration::from_secs(10);

/// The retry policies of produces: the default, and those of single produces by (agent,
/// produce) name.
type ProduceRetries = (RetryPolicy, HashMap<(String, String), RetryPolicy>);

impl RuntimeBuilder {
    /// Registers a resource: a typed, shared, read-only value — a model client, its
    /// configuration — that the produces declaring it (`#[produce(.., uses = [R])]`,
    /// [`Produce::uses`](crate::Produce::uses)) reach with
    /// [`ProduceCall::resource`](crate::ProduceCall::resource). One value per type; registering
    /// a type again replaces the value.
    pub fn resource<R: Send + Sync + 'static>(mut self, resource: R) -> Self {
        self.resources.insert(resource);
        self
    }

    /// Registers every resource of `resources` (replacing values of the same types).
    pub fn resources(mut self, resources: &Resources) -> Self {
        self.resources.extend(resources);
        self
    }

    /// Registers an agent. Agents keep registration order among equal priorities.
    pub fn agent(mut self, agent: Agent) -> Self {
        self.agents.push(agent);
        self
    }

    /// Sets the dispatcher that delivers intents. Without one, intents stay pending: each turn
    /// counts them in [`DrainReport::waiting`] and logs a warning.
    pub fn dispatcher(mut self, dispatcher: impl Dispatcher) -> Self {
        self.dispatcher = Some(Arc::new(dispatcher));
        self
    }

    /// Sets what a produce error does (default: [`ProduceErrors::FailLoud`]).
    pub fn produce_errors(mut self, mode: ProduceErrors) -> Self {
        self.produce_errors = mode;
        self
    }

    /// Sets how the runtime delivers: retry policies, limits, the attempt timeout, the grace
    /// period after a stop or a turn's deadline, what a failure does, the lease of each claim
    /// (default: [`DeliveryOptions::default`], with the lease the context was opened with).
    /// The same value configures a [`Drainer`](crate::Drainer).
    pub fn delivery(mut self, options: DeliveryOptions) -> Self {
        self.delivery = options;
        self
    }

    /// Sets what a failed delivery does to the drain.
    #[deprecated(note = "use `.delivery(DeliveryOptions::new().errors(mode))`")]
    pub fn delivery_errors(mut self, mode: DeliveryErrors) -> Self {
        self.delivery = self.delivery.errors(mode);
        self
    }

    /// Sets the retry policy for every action kind without one of its own.
    #[deprecated(note = "use `.delivery(DeliveryOptions::new().retry_policy(policy))`")]
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.delivery = self.delivery.retry_policy(policy);
        self
    }

    /// Sets the retry policy for one action kind.
    #[deprecated(note = "use `.delivery(DeliveryOptions::new().retry_policy_for(kind, policy))`")]
    pub fn retry_policy_for(mut self, kind: &str, policy: RetryPolicy) -> Self {
        self.delivery = self.delivery.retry_policy_for(kind, policy);
        self
    }

    /// Limits how many deliveries run at once.
    #[deprecated(note = "use `.delivery(DeliveryOptions::new().concurrency(limit))`")]
    pub fn delivery_concurrency(mut self, limit: usize) -> Self {
        self.delivery = self.delivery.concurrency(limit);
        self
    }

    /// Limits how many deliveries of one action kind run at once.
    #[deprecated(note = "use `.delivery(DeliveryOptions::new().concurrency_for(kind, limit))`")]
    pub fn delivery_concurrency_for(mut self, kind: &str, limit: usize) -> Self {
        self.delivery = self.delivery.concurrency_for(kind, limit);
        self
    }

    /// Bounds each delivery attempt.
    #[deprecated(note = "use `.delivery(DeliveryOptions::new().timeout(timeout))`")]
    pub fn delivery_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.delivery = self.delivery.timeout(timeout);
        self
    }

    /// How long deliveries already running may finish after a stop or the turn's deadline.
    #[deprecated(note = "use `.delivery(DeliveryOptions::new().grace(grace))`")]
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.delivery = self.delivery.grace(grace);
        self
    }

    /// Limits how many produce runs of a generation execute at once (default 1,024; at
    /// least 1). Runs execute concurrently on the task that drives the turn.
    pub fn max_concurrency(mut self, limit: usize) -> Self {
        self.max_concurrency = limit.max(1);
        self
    }

    /// Sets the retry policy of every produce without one of its own (default:
    /// [`RetryPolicy::default`], 8 attempts from 1 s apart, doubling, at most 5 minutes apart).
    /// It applies while the runtime [serves](Runtime::serve): a run that fails (returns an
    /// error, panics, or writes a patch that does not apply) is retried alone, on its trigger
    /// as it then is, after the backoff, while the rest of its generation commits; after the
    /// last attempt its event is parked (see [`Parked`](crate::Parked)). With
    /// [`RetryPolicy::manual`], a failed run is parked at once. A turn run directly
    /// ([`Runtime::run`]) keeps [`ProduceErrors`]'s rule instead.
    pub fn produce_retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.produce_retry.0 = policy;
        self
    }

    /// Sets the retry policy of one produce, by its agent's name and its own (see
    /// [`produce_retry_policy`](RuntimeBuilder::produce_retry_policy)).
    pub fn produce_retry_policy_for(mut self, agent: &str, produce: &str, policy: RetryPolicy) -> Self {
        self.produce_retry
            .1
            .insert((agent.to_owned(), produce.to_owned()), policy);
        self
    }

    /// Sets how often a serving runtime sets the outbox gauges of its session from a count of
    /// its ledger ([`Ledger::record_metrics`](crate::Ledger::record_metrics)): default 10 s;
    /// zero never does.
    pub fn metrics_interval(mut self, every: Duration) -> Self {
        self.metrics_every = every;
        self
    }

    /// Sets how many writes sent through [`RuntimeHandle`](crate::RuntimeHandle)s the
    /// runtime's inbox holds before a writer waits for room (default
    /// [`DEFAULT_INBOX_CAPACITY`](crate::DEFAULT_INBOX_CAPACITY), 1,024; at least 1). Under
    /// overload, writers wait (or [`try_write`](crate::RuntimeHandle::try_write) answers
    /// [`Full`](crate::SubmitError::Full)) instead of the memory growing.
    pub fn inbox_capacity(mut self, writes: usize) -> Self {
        self.inbox_capacity = writes.max(1);
        self
    }

    /// Sets the budget [`Runtime::run`] uses (default: [`Budget::default`]).
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// Builds the runtime, after checking that its registrations are unambiguous.
    ///
    /// # Errors
    /// [`BuildError::KindCollision`] when two distinct Rust types among the produces' triggers
    /// and declared outputs (and the runtime's own [`PendingAction`], [`Timer`] and [`Question`](crate::Question)) claim one kind;
    /// [`BuildError::DuplicateAgent`] when two agents share a name;
    /// [`BuildError::DuplicateProduce`] when an agent registers two produces under one name;
    /// [`BuildError::Join`] when a produce declares join parts without a key, or a key without
    /// parts; [`BuildError::MissingResource`] when a produce uses a resource that is not
    /// registered; [`BuildError::Delivery`] when the [delivery options](RuntimeBuilder::delivery)
    /// cannot deliver as given.
    pub fn build(self) -> Result<Runtime, BuildError> {
        crate::model::telemetry::describe();
        self.delivery.check()?;
        check_registrations(&self.agents)?;
        check_resources(&self.agents, &self.resources)?;
        let mut agents = self.agents;
        // Work order is (priority, event order, registration order): a stable sort by
        // descending priority keeps registration order among equals.
        let mut order: Vec<usize> = (0..agents.len()).collect();
        order.sort_by_key(|&a| std::cmp::Reverse(agents[a].priority));
        let mut ranked = Vec::with_capacity(agents.len());
        let mut taken: Vec<Option<Agent>> = agents.drain(..).map(Some).collect();
        for a in order {
            ranked.push(taken[a].take().expect("each agent taken once"));
        }
        let mut triggers: HashMap<Kind, Vec<Slot>> = HashMap::new();
        for (agent, a) in ranked.iter().enumerate() {
            for (produce, p) in a.produces.iter().enumerate() {
                triggers.entry(p.trigger()).or_default().push(Slot { agent, produce });
                for kind in p.joined_kinds() {
                    triggers.entry(kind).or_default().push(Slot { agent, produce });
                }
            }
        }
        let uniform_priority = ranked.windows(2).all(|w| w[0].priority == w[1].priority);
        let joins = Joins::of(&ranked);
        Ok(Runtime {
            joins,
            context: self.context,
            agents: ranked,
            triggers,
            uniform_priority,
            dispatcher: self.dispatcher,
            owner: crate::outbox::owner::process_owner(),
            produce_errors: self.produce_errors,
            delivery: self.delivery,
            clock: Clock::new(),
            max_concurrency: self.max_concurrency,
            budget: self.budget,
            stop: StopHandle::default(),
            turns: 0,
            inbox: Inbox::new(self.inbox_capacity),
            serving: false,
            served: Default::default(),
            produce_retry: self.produce_retry,
            metrics_every: self.metrics_every,
            resources: self.resources,
            calls: CallCache::default(),
            answers_loaded: false,
            trace: TraceParent::mint(),
            metrics: RunMetrics::default(),
        })
    }
}

/// Refuses a produce that uses a resource that is not registered.
fn check_resources(agents: &[Agent], resources: &Resources) -> Result<(), BuildError> {
    match crate::run::produce::missing_resource(agents, resources) {
        Some((agent, produce, resource)) => Err(BuildError::MissingResource {
            agent: agent.name().to_owned(),
            produce: produce.name().to_owned(),
            resource,
        }),
        None => Ok(()),
    }
}

/// Refuses ambiguous registrations: duplicate agent or produce names, and two distinct types
/// with one kind among the triggers and declared outputs.
fn check_registrations(agents: &[Agent]) -> Result<(), BuildError> {
    let mut agent_names = foldhash::HashSet::default();
    let mut kinds: HashMap<Kind, ArtifactType> = HashMap::new();
    let pending = ArtifactType::of::<PendingAction>();
    kinds.insert(pending.kind, pending);
    // The runtime's own artifact types: a type of the user's with one of their kinds would
    // be taken for them.
    for builtin in [
        ArtifactType::of::<Timer>(),
        ArtifactType::of::<crate::model::question::Question>(),
        ArtifactType::of::<crate::model::parked::Parked>(),
    ] {
        kinds.insert(builtin.kind, builtin);
    }
    for agent in agents {
        if !agent_names.insert(agent.name()) {
            return Err(BuildError::DuplicateAgent {
                agent: agent.name().to_owned(),
            });
        }
        let mut produce_names = foldhash::HashSet::default();
        for produce in &agent.produces {
            if !produce_names.insert(produce.name()) {
                return Err(BuildError::DuplicateProduce {
                    agent: agent.name().to_owned(),
                    produce: produce.name().to_owned(),
                });
            }
            if let Err(problem) = crate::run::join::check(produce) {
                return Err(BuildError::Join {
                    agent: agent.name().to_owned(),
                    produce: produce.name().to_owned(),
                    problem,
                });
            }
            for ty in produce.types() {
                let known = *kinds.entry(ty.kind).or_insert(*ty);
                if known.type_id != ty.type_id {
                    return Err(BuildError::KindCollision {
                        kind: ty.kind,
                        first: known.name,
                        second: ty.name,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Runs produces over a [`Context`] in generations and delivers the intents they record.
///
/// A turn ([`run`](Runtime::run)) repeats generations until no event is queued and nothing
/// is deliverable, or a budget limit is hit. Each generation takes the queued events, matches
/// produces, runs them concurrently against one snapshot, validates their patches, commits
/// them as one atomic unit and then drains the outbox. Methods that run take `&mut self`, so
/// one turn at a time runs per runtime.
pub struct Runtime {
    pub(crate) context: Context,
    pub(crate) agents: Vec<Agent>,
    pub(crate) triggers: HashMap<Kind, Vec<Slot>>,
    pub(crate) uniform_priority: bool,
    /// The join indexes of its join produces, in step with the context before each generation.
    pub(crate) joins: Joins,
    pub(crate) dispatcher: Option<Arc<dyn ErasedDispatcher>>,
    /// Who this process is, in the leases of its deliveries.
    pub(crate) owner: Arc<str>,
    pub(crate) produce_errors: ProduceErrors,
    pub(crate) delivery: DeliveryOptions,
    clock: Clock,
    pub(crate) max_concurrency: usize,
    pub(crate) budget: Budget,
    pub(crate) stop: StopHandle,
    turns: u64,
    /// Writes sent through handles, for `serve`.
    pub(crate) inbox: crate::run::handle::Inbox,
    /// Whether the runtime serves ([`serve`](Runtime::serve)): its delivery then runs beside
    /// its turns, and turns neither drain nor claim in their commits.
    pub(crate) serving: bool,
    /// The produces' retry policies (see [`RuntimeBuilder::produce_retry_policy`]).
    produce_retry: ProduceRetries,
    /// How often a serving runtime sets its outbox gauges (see
    /// [`RuntimeBuilder::metrics_interval`]).
    pub(crate) metrics_every: Duration,
    /// What its `serve` calls did, over its life (see [`ServeReport`](crate::ServeReport)).
    pub(crate) served: crate::run::serve::ServeReport,
    /// What every run of the runtime reads with `ProduceCall::resource`.
    pub(crate) resources: Resources,
    /// The answers of runs whose generation did not commit, for their next attempt.
    pub(crate) calls: CallCache,
    /// The answers the context's store kept before commits that never came were loaded into
    /// `calls` (before the first generation).
    pub(crate) answers_loaded: bool,
    /// The trace the core's own ids put this turn's runs in (`model::trace`): minted per turn.
    pub(crate) trace: TraceParent,
    /// The handles of the produces' run metrics, looked up again each turn.
    pub(crate) metrics: RunMetrics,
}

impl Runtime {
    /// Starts building a runtime over `context`.
    pub fn builder(context: Context) -> RuntimeBuilder {
        RuntimeBuilder {
            context,
            agents: Vec::new(),
            dispatcher: None,
            produce_errors: ProduceErrors::default(),
            delivery: DeliveryOptions::default(),
            max_concurrency: 1024,
            budget: Budget::default(),
            resources: Resources::new(),
            inbox_capacity: DEFAULT_INBOX_CAPACITY,
            produce_retry: (RetryPolicy::default(), HashMap::new()),
            metrics_every: DEFAULT_METRICS_INTERVAL,
        }
    }

    /// The context, for reads.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// The context, for direct writes between turns.
    pub fn context_mut(&mut self) -> &mut Context {
        &mut self.context
    }

    /// Gives the context back.
    pub fn into_context(self) -> Context {
        self.context
    }

    /// The retry policy of the produce `produce` of agent `agent`.
    pub(crate) fn produce_retry_policy(&self, agent: &str, produce: &str) -> &RetryPolicy {
        let (default, by_name) = &self.produce_retry;
        by_name.get(&(agent.to_owned(), produce.to_owned())).unwrap_or(default)
    }

    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// A handle that stops a running turn from another task.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Runs one turn with the runtime's budget.
    ///
    /// # Errors
    /// [`RunError::Produce`] when a produce fails in fail-loud mode (nothing of that
    /// generation is committed; its events stay queued), [`RunError::Delivery`] when a
    /// delivery fails in fail-loud mode (the failure is recorded in the ledger first).
    pub async fn run(&mut self) -> Result<TurnReport, RunError> {
        self.run_with(self.budget).await
    }

    /// Runs one turn with `budget`.
    ///
    /// # Errors
    /// As [`run`](Runtime::run).
    pub async fn run_with(&mut self, budget: Budget) -> Result<TurnReport, RunError> {
        // A turn run directly delivers in the turn, whatever a `serve` dropped midway left.
        self.serving = false;
        self.run_turn(budget).await
    }

    /// One turn with `budget`, delivering in the turn unless the runtime serves.
    pub(crate) async fn run_turn(&mut self, budget: Budget) -> Result<TurnReport, RunError> {
        self.turns += 1;
        let turn = self.turns;
        self.trace = TraceParent::mint();
        self.metrics.clear();
        let span =
            tracing::info_span!("turn", turn, session = %self.context.session(), trace_id = tracing::field::Empty);
        if !crate::model::trace::propagating() && !span.is_disabled() {
            // The runs' trace, unless a tracing backend gives them its own.
            span.record("trace_id", tracing::field::display(self.trace.trace_id_hex()));
        }
        self.turn(turn, budget).instrument(span).await
    }

    async fn turn(&mut self, turn: u64, budget: Budget) -> Result<TurnReport, RunError> {
        // A deadline too far to represent (`Duration::MAX`) is no deadline.
        let deadline = budget.deadline.and_then(|d| Instant::now().checked_add(d));
        let mut report = TurnReport {
            outcome: TurnOutcome::Completed,
            turn,
            generations: 0,
            runs: 0,
            deliveries: DrainReport::default(),
            failed_runs: Vec::new(),
            conflicts: 0,
            overtaken: 0,
            parked: 0,
            timers_fired: 0,
            next_wake_at: None,
            usage: Vec::new(),
        };
        // Only a budget that limits usage is checked by calls.
        let meter = (budget.max_tokens.is_some() || budget.max_cost.is_some())
            .then(|| Arc::new(Meter::new(budget.max_tokens, budget.max_cost)));
        // Intents committed before this turn (or due for a retry) go out first, unless the
        // runtime's delivery runs beside its turns (`serve`).
        if !self.serving {
            if let Some(outcome) = self.drain(deadline, &mut report.deliveries, None).await? {
                return Ok(self.finish(report, outcome).await);
            }
        }
        // Conflicts in a row after which the other writer showed no progress, and conflicts
        // since this runtime last committed (the pause grows with them).
        let mut idle_conflicts = 0;
        let mut streak = 0;
        // The events of a generation that writes overtook, which it runs again.
        let mut rerun = None;
        loop {
            if let Some(outcome) = self.interrupted(deadline) {
                return Ok(self.finish(report, outcome).await);
            }
            // The timers due now fire before the events are taken, so that the generation
            // takes their fires with them.
            report.timers_fired += self.fire_due_timers().await?;
            // A runtime without produces leaves the queue to one that has them: consuming the
            // events would lose them for good.
            if self.context.queued_events() == 0 || self.triggers.is_empty() {
                return Ok(self.finish(report, TurnOutcome::Completed).await);
            }
            if budget.max_generations.is_some_and(|max| report.generations >= max) {
                return Ok(self.finish(report, TurnOutcome::GenerationsExhausted).await);
            }
            let remaining_runs = budget.max_runs.map(|max| max.saturating_sub(report.runs));
            let intake = match (rerun.take(), self.serving) {
                (Some(events), _) => Intake::Rerun { events },
                (None, true) => Intake::Accepted,
                (None, false) => Intake::Held,
            };
            let step = match generation::run(self, remaining_runs, deadline, &meter, &mut report, intake).await {
                Err(RunError::Store(StoreError::Conflict { .. })) if idle_conflicts < MAX_CONFLICT_RETRIES => {
                    crate::model::telemetry::record_conflict();
                    // Another writer committed to the session first: nothing of this
                    // generation was written. Take the other's commits and run it again,
                    // after a short, growing, jittered pause (the other writer is busy).
                    report.conflicts += 1;
                    let before = (self.context.generation(), self.context.queued_events());
                    let read = self.context.catch_up().await?;
                    if (self.context.generation(), self.context.queued_events()) == before {
                        idle_conflicts += 1;
                    } else {
                        idle_conflicts = 0;
                    }
                    tracing::info!(
                        commits = read,
                        retry = report.conflicts,
                        "another writer committed first; running the generation again on its head"
                    );
                    streak += 1;
                    tokio::time::sleep(conflict_pause(streak)).await;
                    continue;
                }
                step => step?,
            };
            streak = 0;
            let preclaimed = match step {
                generation::Step::Committed { preclaimed, acted } => {
                    if acted && self.serving {
                        // The delivery beside the turns claims what the generation acted.
                        self.inbox.nudge.notify_one();
                    }
                    preclaimed
                }
                generation::Step::Consumed => None,
                generation::Step::Interrupted(outcome) => return Ok(self.finish(report, outcome).await),
                generation::Step::Overtaken { events } => {
                    report.overtaken += 1;
                    rerun = Some(events);
                    continue;
                }
            };
            if !self.serving {
                if let Some(outcome) = self.drain(deadline, &mut report.deliveries, preclaimed).await? {
                    return Ok(self.finish(report, outcome).await);
                }
            }
            // The turn's calls have spent its budget: the turn ends here, after the generation
            // that spent it (and, if a call found it spent, the events before that call's).
            if let Some(exhausted) = meter.as_ref().and_then(|m| m.exhausted()) {
                return Ok(self.finish(report, exhausted.outcome()).await);
            }
        }
    }

    async fn finish(&self, mut report: TurnReport, outcome: TurnOutcome) -> TurnReport {
        if outcome == TurnOutcome::Stopped {
            self.stop.clear();
        }
        // What of this session's intents still waits, counted once per turn.
        let ledger = self.context.ledger().session(self.context.session());
        let counted = match self.dispatcher {
            Some(_) => ledger.counts().await.map(|c| c.waiting()),
            None => ledger.pending().await,
        };
        let waiting = match counted {
            Ok(waiting) => usize::try_from(waiting).unwrap_or(usize::MAX),
            Err(e) => {
                tracing::warn!(error = %e, "the ledger could not be read");
                report.deliveries.waiting
            }
        };
        report.deliveries.waiting = waiting;
        if self.dispatcher.is_none() && waiting > 0 {
            tracing::warn!(
                waiting,
                "no dispatcher is configured, so intents stay pending; add one with RuntimeBuilder::dispatcher"
            );
        }
        report.outcome = outcome;
        report.next_wake_at = self.next_wake_at();
        tracing::debug!(outcome = ?outcome, generations = report.generations, runs = report.runs, delivered = report.deliveries.delivered, "turn finished");
        report
    }

    fn interrupted(&self, deadline: Option<Instant>) -> Option<TurnOutcome> {
        if self.stop.is_requested() {
            Some(TurnOutcome::Stopped)
        } else if deadline.is_some_and(|d| Instant::now() >= d) {
            Some(TurnOutcome::DeadlineExceeded)
        } else {
            None
        }
    }

    /// Delivers every intent that is due, without running a generation. Retries scheduled for
    /// later stay scheduled (see [`settle`](Runtime::settle)).
    ///
    /// # Errors
    /// [`FlushError::NoDispatcher`] without a dispatcher; [`FlushError::Delivery`] when a
    /// delivery fails with [`DeliveryErrors::FailLoud`] (recorded in the ledger first);
    /// [`FlushError::Store`] when the durable store fails.
    pub async fn flush(&mut self) -> Result<DrainReport, FlushError> {
        self.drain_with(false).await
    }

    /// Delivers every waiting intent, sleeping until scheduled retries are due, until each is
    /// delivered, dead, held or waiting for [`retry`](Runtime::retry) — or a
    /// [`StopHandle`] stops it. Use it to ride out a transient outage; with tokio's paused
    /// clock, the backoff takes no real time.
    ///
    /// # Errors
    /// As [`flush`](Runtime::flush).
    pub async fn settle(&mut self) -> Result<DrainReport, FlushError> {
        self.drain_with(true).await
    }

    async fn drain_with(&mut self, settle: bool) -> Result<DrainReport, FlushError> {
        let Some(dispatcher) = self.dispatcher.clone() else {
            return Err(FlushError::NoDispatcher);
        };
        let mut report = DrainReport::default();
        let span = tracing::info_span!("flush", session = %self.context.session(), settle);
        let scope = Scope::session(self.context.session());
        let drain = self.drainer(&dispatcher, &scope, None);
        let outcome = if settle {
            drain.settle(&mut report).instrument(span).await
        } else {
            drain.run(&mut report).instrument(span).await
        };
        if outcome.map_err(FlushError::from)? == Some(Interrupted::Stopped) {
            self.stop.clear();
        }
        Ok(report)
    }

    /// Re-arms a failed, dead or held intent: it becomes pending, due now, and the next drain
    /// (a turn, [`flush`](Runtime::flush) or [`settle`](Runtime::settle)) delivers it again
    /// with the same idempotency key.
    ///
    /// # Errors
    /// [`RetryError::UnknownKey`] for a key the ledger does not hold, [`RetryError::NotFailed`]
    /// for an intent that is pending, in flight or delivered, [`RetryError::Store`] if the
    /// durable store could not record it (the intent then stays as it was).
    pub async fn retry(&self, key: &str) -> Result<Delivery, RetryError> {
        self.context.outbox().retry(key, self.clock.now()).await
    }

    /// Cancels a pending, failed, dead, held or awaiting-approval intent for good: it is never
    /// handed to a dispatcher again, and the ledger records `reason`. Cancelling a cancelled
    /// intent again changes nothing.
    ///
    /// # Errors
    /// [`CancelError::UnknownKey`] for a key the ledger does not hold,
    /// [`CancelError::NotCancellable`] for one delivered or in flight, [`CancelError::Store`]
    /// if the store could not record it (the intent then stays as it was).
    pub async fn cancel(&self, key: &str, reason: &str) -> Result<Delivery, CancelError> {
        self.context.outbox().cancel(key, reason, self.clock.now()).await
    }

    /// Approves an intent a produce acted with
    /// [`act_with_approval`](crate::Effects::act_with_approval): it becomes pending, due now,
    /// and the next drain delivers it once, like any other. The ledger records who approved
    /// it (`by`) and when ([`Delivery::decision`]); the store keeps it across a restart.
    /// Approving an approved intent again changes nothing.
    ///
    /// # Errors
    /// See [`OutboxStore::approve`](crate::OutboxStore::approve).
    pub async fn approve(&self, key: &str, by: &str) -> Result<Delivery, ApprovalError> {
        self.context.outbox().approve(key, by, self.clock.now()).await
    }

    /// Rejects an intent awaiting approval: it is final and never handed to a dispatcher; the
    /// ledger records who rejected it, when and why.
    ///
    /// # Errors
    /// See [`OutboxStore::reject`](crate::OutboxStore::reject).
    pub async fn reject(&self, key: &str, by: &str, reason: &str) -> Result<Delivery, ApprovalError> {
        self.context.outbox().reject(key, by, reason, self.clock.now()).await
    }

    /// How many due intents of the session a generation's commit claims for the turn's drain
    /// that follows it: as many as the drain would claim first; none without a dispatcher.
    pub(crate) fn commit_claim(&self) -> Option<usize> {
        match self.serving {
            // The delivery beside the turns claims for itself.
            true => None,
            false => self.dispatcher.as_ref().map(|_| self.delivery.concurrency),
        }
    }

    /// The lease of its claims: its delivery options', else the one its context was opened with.
    pub(crate) fn lease(&self) -> Duration {
        self.delivery.lease.unwrap_or_else(|| self.context.lease_duration())
    }

    /// Delivers the intents due now, starting with what the generation's commit claimed; see
    /// [`Drain::run`].
    async fn drain(
        &mut self,
        deadline: Option<Instant>,
        report: &mut DrainReport,
        preclaimed: Option<Preclaimed>,
    ) -> Result<Option<TurnOutcome>, RunError> {
        let Some(dispatcher) = self.dispatcher.clone() else {
            return Ok(None);
        };
        let scope = Scope::session(self.context.session());
        Ok(self
            .drainer(&dispatcher, &scope, deadline)
            .run_without_count(report, preclaimed)
            .await?
            .map(TurnOutcome::from))
    }

    fn drainer<'a>(
        &'a self,
        dispatcher: &'a Arc<dyn ErasedDispatcher>,
        scope: &'a Scope,
        deadline: Option<Instant>,
    ) -> Drain<'a> {
        Drain {
            outbox: self.context.outbox_ref(),
            scope,
            owner: &self.owner,
            lease: self.lease(),
            dispatcher,
            config: &self.delivery,
            clock: &self.clock,
            stop: &self.stop,
            deadline,
            nudge: None,
        }
    }
}

impl From<Interrupted> for TurnOutcome {
    fn from(interrupted: Interrupted) -> Self {
        match interrupted {
            Interrupted::Stopped => TurnOutcome::Stopped,
            Interrupted::DeadlineExceeded => TurnOutcome::DeadlineExceeded,
        }
    }
}

impl From<DrainError> for RunError {
    fn from(e: DrainError) -> Self {
        match e {
            DrainError::Delivery(f) => RunError::Delivery(f),
            DrainError::Store(e) => RunError::Store(e),
        }
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("context", &self.context)
            .field("agents", &self.agents.iter().map(|a| a.name()).collect::<Vec<_>>())
            .field("produce_errors", &self.produce_errors)
            .field("delivery", &self.delivery)
            .finish()
    }
}

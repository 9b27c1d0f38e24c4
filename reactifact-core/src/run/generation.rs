//! One generation: match events to produces, run them against one snapshot, validate, commit.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;
use tracing::Instrument;

use crate::model::artifact::{Generation, Stored};
use crate::model::call::RecordedCall;
use crate::model::event::EventKind;
use crate::model::panic::panic_message;
use crate::model::patch::Op;
use crate::model::telemetry::ProduceMetrics;
use crate::model::trace::TraceParent;
use crate::outbox::drain::Preclaimed;
use crate::run::calls::{CallLog, Exhausted, Harvest, Journal, Meter, RunKey, TakenCalls};
use crate::run::effects::Buffer;
use crate::run::join::Parts;
use crate::run::matching::{self, Work};
use crate::run::produce::{Agent, Produce, ProduceFailure, RunFailure, RunInput, RunSlot};
use crate::run::resources::Resources;
use crate::run::retries::Retries;
use crate::run::runtime::{ProduceErrors, RunError, Runtime, TurnOutcome, TurnReport};
use crate::session::context::{CommitFailure, GenerationCommit, TurnClaim};
use crate::state::commit::{Emitted, Read, RunRecord, TriggerRef};
use crate::state::readers::Readers;
use crate::state::snapshot::Snapshot;
use crate::store::answers::{AnswerStore, AnsweredRun};

/// Where a produce is registered: agent index (in priority order) and produce index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) agent: usize,
    pub(crate) produce: usize,
}

/// How a generation step ended.
pub(crate) enum Step {
    /// A generation was committed.
    Committed {
        /// With a dispatcher, what its commit claimed for the drain that follows.
        preclaimed: Option<Preclaimed>,
        /// Whether a committed run acted an intent (the commit may still have skipped it, its
        /// key being known already).
        acted: bool,
    },
    /// The events taken matched no produce; they were consumed without a commit.
    Consumed,
    /// The turn must end with this outcome; nothing was committed.
    Interrupted(TurnOutcome),
    /// Writes sent through handles were committed while the runs executed ([`Intake::Accepted`]):
    /// nothing of the generation was committed, its answers are kept, and it runs again on
    /// the new head with [`Intake::Rerun`] over the same `events`.
    Overtaken {
        /// The events the generation took.
        events: usize,
    },
}

/// What a generation does with the writes a serving runtime receives while its runs execute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Intake {
    /// Not serving: writes wait until the turn is over.
    Held,
    /// Writes are committed as they arrive, each acknowledged at once; a generation they
    /// overtake runs again ([`Step::Overtaken`]).
    Accepted,
    /// The run again of a generation that writes overtook: it takes at most `events` events
    /// (the overtaken generation's, still at the head of the queue) and writes wait for its
    /// commit. Its runs reuse the answers of the overtaken ones, so it rarely waits at all,
    /// and it cannot be overtaken again: a generation always commits.
    Rerun {
        /// How many events the overtaken generation took.
        events: usize,
    },
}

/// Runs one generation of the turn; `meter` counts what the turn's calls use.
pub(crate) async fn run(
    rt: &mut Runtime,
    remaining_runs: Option<u64>,
    deadline: Option<Instant>,
    meter: &Option<Arc<Meter>>,
    report: &mut TurnReport,
    intake: Intake,
) -> Result<Step, RunError> {
    let snapshot = rt.context.snapshot();
    rt.joins.sync(&rt.context);
    let watching = matching::Watching::of(rt);
    let max_events = match intake {
        Intake::Rerun { events } => events,
        Intake::Held | Intake::Accepted => usize::MAX,
    };
    let batch = matching::select(rt, &snapshot, &watching, remaining_runs, meter.is_some(), max_events);
    if batch.events == 0 {
        return Ok(Step::Interrupted(TurnOutcome::RunsExhausted));
    }
    if batch.work.is_empty() {
        rt.context.consume_events(batch.events).await?;
        return Ok(Step::Consumed);
    }
    let generation = rt.context.generation().next();
    let span = tracing::debug_span!(
        "generation",
        generation = generation.0,
        runs = batch.work.len(),
        events = batch.events
    );
    // Each run's calls, answered first from what an earlier attempt of the same run recorded
    // in a generation that did not commit (in this process, or kept in the store before a
    // process that stopped).
    if !rt.answers_loaded {
        load_answers(rt).await;
    }
    let mut tracker = Tracker::new(rt, &batch.work, meter);
    // Writes committed while the runs execute (a serving runtime's intake).
    let mut overtaken = 0u64;
    let executed = {
        let runners = Runners {
            agents: &rt.agents,
            resources: &rt.resources,
            max_concurrency: rt.max_concurrency,
            trace: &rt.trace,
        };
        let execution = execute(runners, &batch.work, &mut tracker, &snapshot, generation).instrument(span.clone());
        let deadline_passed = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(execution, deadline_passed);
        let accepting = intake == Intake::Accepted;
        let (stop, context, inbox) = (&rt.stop, &mut rt.context, &mut rt.inbox);
        loop {
            tokio::select! {
                biased;
                results = &mut execution => break Ok(results),
                () = stop.requested() => break Err(TurnOutcome::Stopped),
                () = &mut deadline_passed => break Err(TurnOutcome::DeadlineExceeded),
                Some(submitted) = inbox.rx.recv(), if accepting => {
                    if inbox.tally.commit(context, submitted).await {
                        overtaken += 1;
                    }
                }
            }
        }
    };
    drop(snapshot);
    let mut calls = Calls::of(rt, &batch.work, tracker.finish_all(), report);
    let Executed {
        results,
        traces,
        durations,
    } = match executed {
        Ok(executed) => executed,
        Err(outcome) => {
            tracing::info!(parent: &span, outcome = ?outcome, "generation cancelled; its events stay queued");
            calls.keep_queued(rt, &batch.work, 0);
            return Ok(Step::Interrupted(outcome));
        }
    };
    if overtaken > 0 {
        // Its snapshot is no longer the head: it runs again on the head, with its answers.
        tracing::debug!(parent: &span, writes = overtaken, "writes committed while the generation ran; it runs again on them, with its answers");
        calls.keep_queued(rt, &batch.work, 0);
        return Ok(Step::Overtaken { events: batch.events });
    }
    let _entered = span.enter();
    for (work, took) in batch.work.iter().zip(&durations) {
        produce_metrics(rt, work).duration.record(took.as_secs_f64());
    }
    // A call that found the turn's budget spent was not made: the runs of its event and of
    // every later one are not committed and those events stay queued; the runs of the events
    // before it commit.
    let events = match calls.cut(&batch.work) {
        None => batch.events,
        Some((0, exhausted)) => {
            tracing::info!(limit = ?exhausted, "a call found the turn's budget spent before any event's work was done; nothing is committed");
            calls.keep_queued(rt, &batch.work, 0);
            return Ok(Step::Interrupted(exhausted.outcome()));
        }
        Some((cut, exhausted)) => {
            tracing::info!(limit = ?exhausted, committed = cut, queued = batch.events - cut, "a call found the turn's budget spent; the work of the events before it commits, the rest stays queued");
            cut
        }
    };

    // A serving runtime never fails on a produce: a failed run is dropped and retried.
    let isolate = rt.produce_errors == ProduceErrors::Isolate || rt.serving;
    // The retries and parked events of the runs that failed, and the retry timers of the
    // retried runs that succeeded (deleted), written in the generation's commit.
    let mut retries = Retries::default();
    let mut records = Vec::with_capacity(batch.work.len());
    let mut record_work = Vec::with_capacity(batch.work.len());
    let mut record_traces = Vec::with_capacity(batch.work.len());
    let mut failures = Vec::new();
    let mut acted = false;
    for (i, (work, result)) in batch.work.iter().zip(results).enumerate() {
        if work.events.1 >= events {
            continue; // cut off by the budget: it runs again
        }
        let produce = &rt.agents[work.slot.agent].produces[work.slot.produce];
        match result {
            Ok(RunOutput { ops, reads }) => {
                acted |= ops.iter().any(|op| matches!(op, Op::Act { .. }));
                records.push(RunRecord {
                    agent: Some(rt.agents[work.slot.agent].name.clone()),
                    produce: Some(produce.name_arc().clone()),
                    trigger: Some(TriggerRef {
                        id: work.trigger.id.clone(),
                        version: work.trigger.version,
                        hash: work.trigger.hash,
                        event: work.event,
                    }),
                    ops,
                    reads,
                    watches_reads: produce.reacts_to(EventKind::Stale),
                    calls: calls.recorded(i),
                });
                record_work.push(i);
                record_traces.push(traces[i]);
            }
            Err(failure) => {
                let failure = failure_at(rt, work, failure);
                if rt.serving {
                    retries.failed(rt, work, &failure.failure.to_string());
                }
                failures.push(failure);
                continue;
            }
        }
        if work.retry.is_some() {
            retries.succeeded(work);
        }
    }
    if let Some(record) = retries.record() {
        records.push(record);
        record_traces.push(None);
    }
    // Not kept through the commit, where a large generation's memory peaks.
    drop((traces, durations));
    if !failures.is_empty() && !isolate {
        calls.keep_queued(rt, &batch.work, 0);
        let others = failures.len() - 1;
        let first = failures.swap_remove(0);
        return Err(RunError::Produce {
            first: Box::new(first),
            others,
        });
    }

    // The produce runs (the retries' record, a direct run, is not one).
    let mut runs = record_work.len() as u64;
    let claim = rt.commit_claim();
    let lease = rt.lease();
    let committed = {
        let (agents, triggers) = (rt.agents.as_slice(), &rt.triggers);
        let reacts = |event: &Emitted, generation: Generation, readers: &Readers| {
            matching::reacts(agents, triggers, &watching, event, generation, readers)
        };
        let turn = GenerationCommit {
            reacts: &reacts,
            claim: claim.map(|limit| TurnClaim {
                limit,
                owner: &rt.owner,
                lease,
                policy: &rt.delivery.claims,
            }),
            traces: &record_traces,
        };
        rt.context.commit_generation(records, events, isolate, &turn).await
    };
    let preclaimed;
    // A patch that does not apply fails its run like an error: retried when serving, in a
    // write of its own (the only window in which a crash loses a retry).
    let mut late = Retries::default();
    match committed {
        Ok((rejected, claimed)) => {
            preclaimed = claimed
                .zip(claim)
                .map(|(claimed, asked)| Preclaimed::new(rt.context.outbox(), claimed, asked));
            runs -= rejected.len() as u64;
            {
                // Scoped: the iterator is not held across the awaits below.
                let mut dropped = rejected.iter().map(|&(r, _)| r).peekable();
                for (r, &w) in record_work.iter().enumerate() {
                    if dropped.next_if_eq(&r).is_none() {
                        produce_metrics(rt, &batch.work[w]).committed.increment(1);
                    }
                }
            }
            for (r, error) in rejected {
                let Some(&w) = record_work.get(r) else {
                    tracing::error!(error = %error, "the retries of the generation's failed runs were refused");
                    continue;
                };
                let work = &batch.work[w];
                if rt.serving {
                    late.failed(rt, work, &error.to_string());
                }
                failures.push(failure_at(rt, work, RunFailure::Commit(error)));
            }
            // The events taken are consumed, with the runs that failed on them (isolated or
            // rejected): only the runs of events that stay queued run again.
            let committed = calls.committed(rt, &batch.work, events);
            calls.keep_queued(rt, &batch.work, events);
            if !committed.is_empty() {
                drop_answers(rt, committed).await;
            }
        }
        Err(CommitFailure::Patch(r, error)) => {
            calls.keep_queued(rt, &batch.work, 0);
            let work = &batch.work[record_work[r]];
            return Err(RunError::Produce {
                first: Box::new(failure_at(rt, work, RunFailure::Commit(error))),
                others: 0,
            });
        }
        Err(CommitFailure::Store(e)) => {
            calls.keep_queued(rt, &batch.work, 0);
            return Err(RunError::Store(e));
        }
    }
    if let Some(record) = late.record() {
        if let Err(e) = rt.context.commit_direct_async(record.ops).await {
            tracing::error!(error = %e, "the retries of runs whose patch did not apply could not be written; those runs are not retried");
        }
    }
    report.parked += retries.parked + late.parked;
    for failure in &failures {
        tracing::warn!(agent = %failure.agent, produce = %failure.produce, artifact_id = %failure.trigger, error = %failure.failure, "produce run isolated; its patch was dropped");
    }
    crate::model::telemetry::record_generation();
    report.generations += 1;
    report.runs += runs;
    report.failed_runs.extend(failures);
    Ok(Step::Committed { preclaimed, acted })
}

/// The spans of batch events that runs tie together, merged: a run covering events `s..=e`
/// (a debounced run, a staleness rerun replaced by its trigger's update) makes every cut `c`
/// with `s < c <= e` split it. Sorted and disjoint, as `(s, e)`.
fn tied(work: &[Work]) -> Vec<(usize, usize)> {
    let mut spans: Vec<(usize, usize)> = work.iter().map(|w| w.events).filter(|(s, e)| s < e).collect();
    spans.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
    for (s, e) in spans {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    merged
}

/// The largest cut no greater than `cut` that splits no run's events.
fn whole(tied: &[(usize, usize)], cut: usize) -> usize {
    match tied.iter().find(|(s, e)| *s < cut && cut <= *e) {
        Some((s, _)) => *s,
        None => cut,
    }
}

/// The key of a run's answers in the runtime's [`CallCache`](crate::run::calls::CallCache).
fn run_key(work: &Work) -> RunKey {
    (
        work.slot.agent,
        work.slot.produce,
        work.trigger.id.clone(),
        work.trigger.generation,
        work.trigger.version,
        work.trigger.hash,
        work.event,
    )
}

/// Which run of its produce on its trigger a work item is, as its answers are kept.
fn answered_run(work: &Work) -> AnsweredRun {
    AnsweredRun {
        generation: work.trigger.generation,
        version: work.trigger.version,
        hash: work.trigger.hash,
        event: work.event,
    }
}

/// Loads the answers a durable context's session kept before commits that never came (the
/// process stopped first) into the runtime's cache, once, before its first generation: the
/// re-runs of those runs get them without calling again. An answer of a produce this runtime
/// does not have, or of a trigger version that changed since, is never asked for.
async fn load_answers(rt: &mut Runtime) {
    rt.answers_loaded = true;
    let Some(store) = rt.context.store().and_then(|store| store.answers()) else {
        return;
    };
    let kept = match store.load().await {
        Ok(kept) => kept,
        Err(e) => {
            tracing::warn!(error = %e, "the answers kept before a commit could not be read; runs that lost their commit call again");
            return;
        }
    };
    let mut runs: Vec<(RunKey, Vec<RecordedCall>)> = Vec::new();
    for answer in kept {
        let slot = rt.agents.iter().enumerate().find_map(|(a, agent)| {
            agent
                .produces
                .iter()
                .position(|p| AnswerStore::producer(&agent.name, p.name()) == answer.produce)
                .map(|p| (a, p))
        });
        let Some((agent, produce)) = slot else {
            continue;
        };
        let run = answer.run;
        let key = (
            agent,
            produce,
            answer.trigger,
            run.generation,
            run.version,
            run.hash,
            run.event,
        );
        match runs.iter_mut().find(|(k, _)| *k == key) {
            Some((_, calls)) => calls.push(answer.call),
            None => runs.push((key, vec![answer.call])),
        }
    }
    for (key, calls) in runs {
        rt.calls.keep(key, calls);
    }
}

/// Drops the answers kept for `runs` (`({agent}/{produce}, trigger id)`), whose runs committed.
async fn drop_answers(rt: &Runtime, runs: Vec<(String, String)>) {
    let store = rt.context.store().and_then(|store| store.answers());
    if let Some(store) = store {
        if let Err(e) = store.drop(&runs).await {
            tracing::warn!(error = %e, "the answers kept before a commit could not be dropped after it");
        }
    }
}

/// The buffers of a generation's runs that wait, and what the calls of those that finished
/// came to. A run that finishes at its first poll gives its calls as it ends; one still
/// waiting when the generation is cancelled gives them up then.
struct Tracker {
    meter: Option<Arc<Meter>>,
    /// Where a durable context's runs keep their answers before the commit.
    answers: Option<AnswerStore>,
    /// Per work item, the calls an earlier attempt of its run recorded (empty unless the
    /// runtime's cache holds some).
    priors: Vec<Vec<RecordedCall>>,
    running: Vec<Option<Arc<Mutex<Buffer>>>>,
    /// The calls of finished runs that recorded, used or were refused any.
    finished: Vec<(usize, Harvest)>,
}

impl Tracker {
    fn new(rt: &mut Runtime, work: &[Work], meter: &Option<Arc<Meter>>) -> Tracker {
        let priors = match rt.calls.is_empty() {
            true => Vec::new(),
            false => work.iter().map(|w| rt.calls.take(&run_key(w))).collect(),
        };
        Tracker {
            meter: meter.clone(),
            answers: rt.context.store().and_then(|store| store.answers()),
            priors,
            running: std::iter::repeat_with(|| None).take(work.len()).collect(),
            finished: Vec::new(),
        }
    }

    /// The buffer for work item `i`'s run, as it starts, with room for `ops` operations;
    /// `producer` names its agent and produce.
    fn start(&mut self, i: usize, work: &Work, ops: usize, producer: (&Arc<str>, &Arc<str>)) -> Arc<Mutex<Buffer>> {
        let prior = self.priors.get_mut(i).map(std::mem::take).unwrap_or_default();
        // The runs of the batch's first event are never refused, so every turn commits
        // something. On a budgeted turn no run reaches past that event (`matching::select`
        // takes no event that would fold into one of them), so a cut never splits them.
        let refusable = work.events.0 > 0;
        let buffer = Buffer::new(CallLog::live(prior, self.meter.clone(), refusable), ops);
        if let Some(store) = &self.answers {
            buffer.lock().unwrap_or_else(|e| e.into_inner()).journal = Some(Arc::new(Journal {
                store: store.clone(),
                agent: producer.0.clone(),
                produce: producer.1.clone(),
                trigger: work.trigger.id.clone(),
                run: answered_run(work),
            }));
        }
        buffer
    }

    /// Work item `i`'s run waits, with `buffer`: its calls are taken from there if the
    /// generation is cancelled before it ends.
    fn waits(&mut self, i: usize, buffer: &Arc<Mutex<Buffer>>) {
        self.running[i] = Some(buffer.clone());
    }

    /// Keeps the calls of work item `i`'s run, which has finished.
    fn finish(&mut self, i: usize, calls: TakenCalls) {
        self.running[i] = None;
        self.keep(i, calls.harvest());
    }

    fn keep(&mut self, i: usize, calls: Harvest) {
        if !calls.is_empty() {
            self.finished.push((i, calls));
        }
    }

    /// Takes the calls of every run, finished or not, in work order; a run that never started
    /// (its generation was cancelled first) keeps its earlier attempt's answers.
    fn finish_all(mut self) -> Vec<(usize, Harvest)> {
        for i in 0..self.running.len() {
            if let Some(buffer) = self.running[i].take() {
                let calls = buffer.lock().unwrap_or_else(|e| e.into_inner()).take_calls();
                self.keep(i, calls);
            }
        }
        for (i, prior) in self.priors.into_iter().enumerate() {
            if !prior.is_empty() {
                self.finished.push((i, Harvest::not_started(prior)));
            }
        }
        self.finished.sort_unstable_by_key(|(i, _)| *i);
        self.finished
    }
}

/// What the runs of a generation recorded in their calls, until the generation commits or
/// gives up.
struct Calls {
    /// The calls of the work items that recorded any, by work index, in work order (most
    /// generations record none, and then this costs nothing), with the earlier attempt's
    /// answers each did not reuse.
    calls: Vec<(usize, Vec<RecordedCall>, Vec<RecordedCall>)>,
    /// The work items with a call the turn's budget refused, and the limit it found.
    refused: Vec<usize>,
    deferred: Option<Exhausted>,
}

impl Calls {
    /// The runs' calls (by work index, in work order), with what they used counted in the
    /// turn's report.
    fn of(rt: &Runtime, work: &[Work], harvests: Vec<(usize, Harvest)>, report: &mut TurnReport) -> Calls {
        let mut calls = Vec::new();
        let mut refused = Vec::new();
        let mut deferred = None;
        for (i, harvest) in harvests {
            let work = &work[i];
            if harvest.made > 0 || harvest.reused > 0 {
                let agent = &rt.agents[work.slot.agent];
                let produce = &agent.produces[work.slot.produce];
                report.count_usage(&agent.name, produce.name(), harvest.spent, harvest.made, harvest.reused);
                harvest.record_usage(&agent.name, produce.name_arc());
            }
            if harvest.deferred.is_some() {
                refused.push(i);
                deferred = deferred.or(harvest.deferred);
            }
            if !harvest.calls.is_empty() || !harvest.leftover.is_empty() {
                calls.push((i, harvest.calls, harvest.leftover));
            }
        }
        Calls {
            calls,
            refused,
            deferred,
        }
    }

    /// Where a spent budget cuts the batch, if a call found it spent: the number of events
    /// (from the head) whose work all ran without a refused call, so that they, and only they,
    /// are consumed. A run covers a range of events (a debounced run the events it replaced);
    /// one that reaches past the cut is cut off with its first event.
    fn cut(&self, work: &[Work]) -> Option<(usize, Exhausted)> {
        let exhausted = self.deferred?;
        let first = self.refused.iter().map(|&i| work[i].events.0).min()?;
        Some((whole(&tied(work), first), exhausted))
    }

    /// Work item `i`'s calls, for its run's record.
    fn recorded(&self, i: usize) -> Vec<RecordedCall> {
        match self.calls.binary_search_by_key(&i, |(at, _, _)| *at) {
            Ok(at) => self.calls[at].1.clone(),
            Err(_) => Vec::new(),
        }
    }

    /// The runs among the first `consumed` events of the batch that recorded calls, as
    /// `({agent}/{produce}, trigger id)`: whose answers kept before the commit are dropped.
    fn committed(&self, rt: &Runtime, work: &[Work], consumed: usize) -> Vec<(String, String)> {
        let mut runs: Vec<(String, String)> = Vec::new();
        for (i, _, _) in &self.calls {
            let work = &work[*i];
            if work.events.1 < consumed {
                let agent = &rt.agents[work.slot.agent];
                let run = (
                    AnswerStore::producer(&agent.name, agent.produces[work.slot.produce].name()),
                    work.trigger.id.to_string(),
                );
                if !runs.contains(&run) {
                    runs.push(run);
                }
            }
        }
        runs
    }

    /// Keeps, for their next attempt, the calls of the runs whose events stay queued: those
    /// not among the first `consumed` events of the batch (0 when nothing was committed).
    fn keep_queued(&mut self, rt: &mut Runtime, work: &[Work], consumed: usize) {
        for (i, mut calls, leftover) in self.calls.drain(..) {
            if work[i].events.1 >= consumed {
                calls.extend(leftover);
                rt.calls.keep(run_key(&work[i]), calls);
            }
        }
    }
}

/// The metric handles of the produce of `work`.
fn produce_metrics<'r>(rt: &'r mut Runtime, work: &Work) -> &'r ProduceMetrics {
    let agents = &rt.agents;
    rt.metrics.of((work.slot.agent, work.slot.produce), || {
        let agent = &agents[work.slot.agent];
        (agent.name.clone(), agent.produces[work.slot.produce].name_arc().clone())
    })
}

fn failure_at(rt: &Runtime, work: &Work, failure: RunFailure) -> ProduceFailure {
    let agent = &rt.agents[work.slot.agent];
    ProduceFailure {
        agent: agent.name.to_string(),
        produce: agent.produces[work.slot.produce].name().to_owned(),
        trigger: work.trigger.id.clone(),
        failure,
    }
}

/// What a generation's runs use of the runtime: its agents, the resources they read, the
/// limit on runs at once and the turn's trace. Borrowed apart from the context, so that a
/// serving runtime commits writes while the runs execute.
#[derive(Clone, Copy)]
pub(crate) struct Runners<'a> {
    pub(crate) agents: &'a [Agent],
    pub(crate) resources: &'a Resources,
    pub(crate) max_concurrency: usize,
    pub(crate) trace: &'a TraceParent,
}

/// Runs every work item concurrently, bounded by the global and per-agent limits, and
/// returns the results in work order, whatever order they complete in.
async fn execute(
    rt: Runners<'_>,
    work: &[Work],
    tracker: &mut Tracker,
    snapshot: &Snapshot,
    generation: Generation,
) -> Executed {
    let mut schedule = Schedule {
        rt,
        work,
        tracker,
        snapshot,
        generation,
        results: std::iter::repeat_with(|| None).take(work.len()).collect(),
        traces: vec![None; work.len()],
        durations: vec![Duration::ZERO; work.len()],
        active: vec![0; rt.agents.len()],
        waiting: vec![VecDeque::new(); rt.agents.len()],
        running: FuturesUnordered::new(),
        spare: Vec::new(),
        next: 0,
        clock: Instant::now(),
    };
    std::future::poll_fn(|cx| schedule.poll(cx)).await;
    Executed {
        results: schedule
            .results
            .into_iter()
            .map(|r| r.expect("every work item ran"))
            .collect(),
        traces: schedule.traces,
        durations: schedule.durations,
    }
}

/// A run's work index, how it ended, how long it ran and when it ended.
type Done = (usize, Ended, Duration, Instant);

/// The work of a generation as [`execute`] runs it. Each run is polled where it starts; only
/// one that waits joins `running` (most finish at their first poll, and then cost no boxing or
/// queueing).
struct Schedule<'a> {
    rt: Runners<'a>,
    work: &'a [Work],
    tracker: &'a mut Tracker,
    snapshot: &'a Snapshot,
    generation: Generation,
    results: Vec<Option<Result<RunOutput, RunFailure>>>,
    traces: Vec<Option<TraceParent>>,
    durations: Vec<Duration>,
    /// Per agent, its runs started and not finished.
    active: Vec<usize>,
    /// Work of an agent at its limit waits here; an agent with waiting work is always at its
    /// limit, because each completion of its runs starts its next waiting one.
    waiting: Vec<VecDeque<usize>>,
    running: FuturesUnordered<RunTask>,
    /// The slots of runs that ended, at most one per produce, each for its produce's next run
    /// (a slot runs only its own produce's runs). Kept only while work is left to start, so a
    /// generation of one run keeps none (and allocates nothing for it).
    spare: Vec<(Slot, RunSlot)>,
    /// The next work item not yet started or waiting.
    next: usize,
    /// The last time read: when the schedule began, when a run ended, or when one first
    /// waited. A run started now counts its duration from then — the schedule's own work since
    /// is all that lies between — so a run that ends at its first poll reads the clock once.
    clock: Instant,
}

impl Schedule<'_> {
    /// Starts what may start, in work order, and takes what finishes, until every run has
    /// finished (`Ready`) or all that run wait (`Pending`).
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            while self.running.len() < self.rt.max_concurrency && self.next < self.work.len() {
                let i = self.next;
                self.next += 1;
                let agent = self.work[i].slot.agent;
                if self.rt.agents[agent]
                    .concurrency
                    .is_some_and(|limit| self.active[agent] >= limit)
                {
                    self.waiting[agent].push_back(i);
                } else if let Some(done) = self.start(i, cx) {
                    self.finish(done, cx);
                }
            }
            // With nothing running, nothing waits either (an agent's waiting work waits for
            // one of its runs) and every item has started: all are done.
            match self.running.poll_next_unpin(cx) {
                Poll::Ready(Some(done)) => self.finish(done, cx),
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Starts work item `i` and polls it once: what it yields if it finished then; otherwise
    /// it joins `running`.
    fn start(&mut self, i: usize, cx: &mut Context<'_>) -> Option<Done> {
        let work = &self.work[i];
        self.active[work.slot.agent] += 1;
        let agent = &self.rt.agents[work.slot.agent];
        let producer = (&agent.name, agent.produces[work.slot.produce].name_arc());
        let buffer = self.tracker.start(i, work, ops_hint(self.rt.agents, work), producer);
        let spare = self
            .spare
            .iter()
            .position(|(slot, _)| *slot == work.slot)
            .map(|at| self.spare.swap_remove(at).1);
        let (trace, mut run) = self.run_one(i, buffer, spare);
        self.traces[i] = Some(trace);
        match Pin::new(&mut run).poll(cx) {
            Poll::Ready(done) => Some(done),
            Poll::Pending => {
                self.tracker.waits(i, &run.run.buffer);
                self.running.push(run);
                // The next run starts after this one's first poll.
                self.clock = Instant::now();
                None
            }
        }
    }

    /// Work item `index`'s run, started (in `spare`, an empty slot of its produce's runs, if
    /// there is one) but not yet polled, and its trace context; its duration counts from the
    /// schedule's last clock reading.
    fn run_one(&self, index: usize, buffer: Arc<Mutex<Buffer>>, spare: Option<RunSlot>) -> (TraceParent, RunTask) {
        let (rt, work, generation, started) = (self.rt, &self.work[index], self.generation, self.clock);
        let agent = &rt.agents[work.slot.agent];
        let produce = &agent.produces[work.slot.produce];
        let span = tracing::debug_span!(
            "produce",
            agent = %agent.name,
            produce = produce.name(),
            artifact_id = %work.trigger.id,
            generation = generation.0,
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty,
        );
        let trace = crate::model::trace::run_context(&span, rt.trace);
        let run = match &work.condition_panicked {
            None => start_run(
                produce,
                Run {
                    trigger: work.trigger.clone(),
                    event: work.event,
                    joined: work.joined.clone(),
                    generation,
                    resources: rt.resources.clone(),
                    buffer,
                },
                self.snapshot,
                spare,
            ),
            Some(message) => Started {
                state: RunState::Failed(RunFailure::Panicked(format!("its condition panicked: {message}"))),
                buffer,
                ops_hint: produce.ops_recorder(),
            },
        };
        let task = RunTask {
            index,
            started,
            run,
            span,
        };
        (trace, task)
    }

    /// Takes a finished run's result; its agent's next waiting work starts in its place (and
    /// so on, while those finish at once).
    fn finish(&mut self, done: Done, cx: &mut Context<'_>) {
        let mut done = Some(done);
        while let Some((i, ended, took, at)) = done.take() {
            self.clock = at;
            let Slot { agent, produce } = self.work[i].slot;
            // Checked as it ends, while its operations are in the cache.
            self.results[i] = Some(check_outputs(&self.rt.agents[agent].produces[produce], ended.result));
            self.durations[i] = took;
            self.tracker.finish(i, ended.calls);
            let work_left = self.next < self.work.len() || !self.waiting[agent].is_empty();
            if let Some(spare) = ended.slot.filter(|_| work_left) {
                let of = Slot { agent, produce };
                if !self.spare.iter().any(|(slot, _)| *slot == of) {
                    self.spare.push((of, spare));
                }
            }
            self.active[agent] -= 1;
            if let Some(queued) = self.waiting[agent].pop_front() {
                done = self.start(queued, cx);
            }
        }
    }
}

/// What [`execute`] returns: each work item's result (its outputs checked against what its
/// produce declares, see [`check_outputs`]), the trace context of its run and how long it ran,
/// in work order.
struct Executed {
    results: Vec<Result<RunOutput, RunFailure>>,
    traces: Vec<Option<TraceParent>>,
    durations: Vec<Duration>,
}

/// One run of a generation, as [`execute`] polls it: within its span, timed from `started`
/// (its start, trigger decoding included); it yields its work index, how it ended, how long it
/// ran and when it ended.
struct RunTask {
    index: usize,
    started: Instant,
    run: Started,
    span: tracing::Span,
}

impl Future for RunTask {
    type Output = Done;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let _entered = this.span.enter();
        match Pin::new(&mut this.run).poll(cx) {
            Poll::Ready(ended) => {
                let now = Instant::now();
                Poll::Ready((this.index, ended, now.duration_since(this.started), now))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Refuses a run's output that creates a kind its produce does not declare.
pub(crate) fn check_outputs(produce: &Produce, result: Result<RunOutput, RunFailure>) -> Result<RunOutput, RunFailure> {
    let output = result?;
    match output
        .ops
        .iter()
        .find_map(|op| op.created_kind().filter(|k| !produce.declares(*k)).map(|k| (op, k)))
    {
        Some((op, kind)) => Err(RunFailure::UndeclaredOutput {
            id: op.id().clone(),
            kind,
        }),
        None => Ok(output),
    }
}

/// What one produce run recorded.
pub(crate) struct RunOutput {
    /// The patch.
    pub(crate) ops: Vec<Op>,
    /// What it read through its snapshot.
    pub(crate) reads: Vec<Read>,
}

/// What one run is given, besides its produce and snapshot.
pub(crate) struct Run {
    pub(crate) trigger: Arc<Stored>,
    pub(crate) event: EventKind,
    pub(crate) joined: Option<Parts>,
    pub(crate) generation: Generation,
    pub(crate) resources: Resources,
    /// Its buffer (see [`Buffer::new`]), where its operations, reads and calls are recorded:
    /// the run yields its calls as it ends ([`Ended`]); a caller that may cancel it keeps a
    /// clone to take them from.
    pub(crate) buffer: Arc<Mutex<Buffer>>,
}

/// Starts one run of `produce` against `snapshot`, catching panics; the future yields how the
/// run ended (its patch and reads, or its failure) and its calls. Used by the generation loop,
/// the replay oracle and the produce test harness.
pub(crate) fn start_run(produce: &Produce, run: Run, snapshot: &Snapshot, spare: Option<RunSlot>) -> Started {
    let buffer = run.buffer;
    let input = RunInput {
        trigger: run.trigger,
        event: run.event,
        snapshot: snapshot.clone(),
        buffer: buffer.clone(),
        generation: run.generation,
        joined: run.joined,
        resources: run.resources,
    };
    let state = match std::panic::catch_unwind(AssertUnwindSafe(|| produce.start(spare, input))) {
        Ok(slot) => RunState::Running(slot),
        Err(panic) => RunState::Failed(RunFailure::Panicked(panic_message(&panic))),
    };
    Started {
        state,
        buffer,
        ops_hint: produce.ops_recorder(),
    }
}

/// A started run (see [`start_run`]). `Unpin`, so the generation polls it where it is first —
/// most runs finish at their first poll and never join its set of running futures — and moves
/// it into that set only if it waits. It seals its buffer as it ends and yields its calls with
/// its result.
pub(crate) struct Started {
    state: RunState,
    /// The run's buffer, sealed when it ends.
    buffer: Arc<Mutex<Buffer>>,
    /// Where its produce keeps how many operations its last run recorded.
    ops_hint: Arc<AtomicU32>,
}

enum RunState {
    Running(RunSlot),
    /// It failed before it ran: its produce panicked as it started, or its condition did.
    Failed(RunFailure),
    Done,
}

/// How a run ended: its result, and what its calls came to.
pub(crate) struct Ended {
    pub(crate) result: Result<RunOutput, RunFailure>,
    pub(crate) calls: TakenCalls,
    /// The run's slot, empty, for its produce's next run; `None` if the run never ran or
    /// panicked.
    pub(crate) slot: Option<RunSlot>,
}

impl Future for Started {
    type Output = Ended;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let (outcome, slot) = match std::mem::replace(&mut this.state, RunState::Done) {
            RunState::Running(mut slot) => {
                match std::panic::catch_unwind(AssertUnwindSafe(|| slot.as_mut().poll(cx))) {
                    Ok(Poll::Pending) => {
                        this.state = RunState::Running(slot);
                        return Poll::Pending;
                    }
                    Ok(Poll::Ready(outcome)) => (outcome, Some(slot)),
                    // The slot still holds the future that panicked: dropped with it.
                    Err(panic) => (Err(RunFailure::Panicked(panic_message(&panic))), None),
                }
            }
            RunState::Failed(failure) => (Err(failure), None),
            RunState::Done => panic!("a produce run polled after it ended"),
        };
        let (sealed, calls) = {
            let mut buffer = this.buffer.lock().unwrap_or_else(|e| e.into_inner());
            (buffer.seal(), buffer.take_call_log())
        };
        this.ops_hint
            .store(u32::try_from(sealed.ops.len()).unwrap_or(u32::MAX), Ordering::Relaxed);
        let result = outcome.and_then(|()| match sealed.error {
            Some(e) => Err(RunFailure::Effect(e)),
            None => Ok(RunOutput {
                ops: sealed.ops,
                reads: sealed.reads,
            }),
        });
        Poll::Ready(Ended { result, calls, slot })
    }
}

/// Room for the operations of `work`'s run (see [`Produce::ops_hint`]).
fn ops_hint(agents: &[Agent], work: &Work) -> usize {
    agents[work.slot.agent].produces[work.slot.produce].ops_hint()
}

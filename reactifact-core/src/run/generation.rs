//! One generation: match events to produces, run them against one snapshot, validate, commit.

use std::any::Any;
use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use tokio::time::Instant;
use tracing::Instrument;

use crate::model::artifact::{Generation, Stored};
use crate::model::event::{Event, EventKind};
use crate::model::patch::Op;
use crate::outbox::drain::Preclaimed;
use crate::model::call::RecordedCall;
use crate::run::calls::{CallLog, Exhausted, Meter, RunKey, Source};
use crate::run::effects::Buffer;
use crate::run::resources::Resources;
use crate::run::join::Parts;
use crate::run::matching::{self, Work};
use crate::run::produce::{Produce, ProduceFailure, RunFailure, RunInput};
use crate::run::runtime::{ProduceErrors, RunError, Runtime, TurnOutcome, TurnReport};
use crate::state::commit::{Read, RunRecord, TriggerRef};
use crate::state::context::{CommitFailure, GenerationCommit};
use crate::state::readers::Readers;
use crate::state::snapshot::Snapshot;

/// Where a produce is registered: agent index (in priority order) and produce index.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    pub(crate) agent: usize,
    pub(crate) produce: usize,
}

/// How a generation step ended.
pub(crate) enum Step {
    /// A generation was committed; with a dispatcher, what its commit claimed for the drain
    /// that follows.
    Committed(Option<Preclaimed>),
    /// The events taken matched no produce; they were consumed without a commit.
    Consumed,
    /// The turn must end with this outcome; nothing was committed.
    Interrupted(TurnOutcome),
}

/// Runs one generation of the turn; `meter` counts what the turn's calls use.
pub(crate) async fn run(
    rt: &mut Runtime,
    remaining_runs: Option<u64>,
    deadline: Option<Instant>,
    meter: &Arc<Meter>,
    report: &mut TurnReport,
) -> Result<Step, RunError> {
    let snapshot = rt.context.snapshot();
    rt.joins.sync(&rt.context);
    let watching = matching::Watching::of(rt);
    let batch = matching::select(rt, &snapshot, &watching, remaining_runs);
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
    // in a generation that did not commit.
    let logs: Vec<Arc<CallLog>> = batch
        .work
        .iter()
        .map(|work| {
            let produce = &rt.agents[work.slot.agent].produces[work.slot.produce];
            let prior = rt.calls.take(&run_key(work));
            CallLog::new(produce.name_arc().clone(), Source::Live { prior }, meter.clone())
        })
        .collect();
    let executed = {
        let execution = execute(rt, &batch.work, &logs, &snapshot, generation).instrument(span.clone());
        let deadline_passed = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            results = execution => Ok(results),
            () = rt.stop.requested() => Err(TurnOutcome::Stopped),
            () = deadline_passed => Err(TurnOutcome::DeadlineExceeded),
        }
    };
    drop(snapshot);
    let mut calls = Calls::harvest(rt, &batch.work, &logs, report);
    let results = match executed {
        Ok(results) => results,
        Err(outcome) => {
            tracing::info!(parent: &span, outcome = ?outcome, "generation cancelled; its events stay queued");
            calls.keep_uncommitted(rt, &batch.work);
            return Ok(Step::Interrupted(outcome));
        }
    };
    let _entered = span.enter();
    if let Some(exhausted) = calls.deferred {
        tracing::info!(limit = ?exhausted, "a call found the turn's budget spent; the generation is not committed and its events stay queued");
        calls.keep_uncommitted(rt, &batch.work);
        return Ok(Step::Interrupted(match exhausted {
            Exhausted::Tokens => TurnOutcome::TokensExhausted,
            Exhausted::Cost => TurnOutcome::CostExhausted,
        }));
    }

    let isolate = rt.produce_errors == ProduceErrors::Isolate;
    let mut records = Vec::with_capacity(batch.work.len());
    let mut record_work = Vec::with_capacity(batch.work.len());
    let mut failures = Vec::new();
    for (i, (work, result)) in batch.work.iter().zip(results).enumerate() {
        let produce = &rt.agents[work.slot.agent].produces[work.slot.produce];
        match check_outputs(produce, result) {
            Ok(RunOutput { ops, reads }) => {
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
            }
            Err(failure) => failures.push(failure_at(rt, work, failure)),
        }
    }
    if !failures.is_empty() && !isolate {
        calls.keep_uncommitted(rt, &batch.work);
        let others = failures.len() - 1;
        let first = failures.swap_remove(0);
        return Err(RunError::Produce {
            first: Box::new(first),
            others,
        });
    }

    let mut runs = records.len() as u64;
    let claim = rt.commit_claim();
    let (agents, triggers) = (rt.agents.as_slice(), &rt.triggers);
    let reacts = |event: &Event, readers: &Readers| matching::reacts(agents, triggers, &watching, event, readers);
    let turn = GenerationCommit { reacts: &reacts, claim };
    let preclaimed;
    match rt
        .context
        .commit_generation(records, batch.events, isolate, &turn)
        .await
    {
        Ok((rejected, claimed)) => {
            preclaimed = claimed
                .zip(claim)
                .map(|(claimed, asked)| Preclaimed::new(rt.context.outbox(), claimed, asked));
            runs -= rejected.len() as u64;
            for &i in &record_work {
                calls.committed[i] = true;
            }
            for (r, error) in rejected {
                let work = &batch.work[record_work[r]];
                calls.committed[record_work[r]] = false;
                failures.push(failure_at(rt, work, RunFailure::Commit(error)));
            }
            calls.keep_uncommitted(rt, &batch.work);
        }
        Err(CommitFailure::Patch(r, error)) => {
            calls.keep_uncommitted(rt, &batch.work);
            let work = &batch.work[record_work[r]];
            return Err(RunError::Produce {
                first: Box::new(failure_at(rt, work, RunFailure::Commit(error))),
                others: 0,
            });
        }
        Err(CommitFailure::Store(e)) => {
            calls.keep_uncommitted(rt, &batch.work);
            return Err(RunError::Store(e));
        }
    }
    for failure in &failures {
        tracing::warn!(agent = %failure.agent, produce = %failure.produce, artifact_id = %failure.trigger, error = %failure.failure, "produce run isolated; its patch was dropped");
    }
    report.generations += 1;
    report.runs += runs;
    report.failed_runs.extend(failures);
    Ok(Step::Committed(preclaimed))
}

/// The key of a run's answers in the runtime's [`CallCache`](crate::run::calls::CallCache).
fn run_key(work: &Work) -> RunKey {
    (
        work.slot.agent,
        work.slot.produce,
        work.trigger.id.clone(),
        work.trigger.version,
        work.trigger.hash,
        work.event,
    )
}

/// What the runs of a generation recorded in their calls, until the generation commits or
/// gives up.
struct Calls {
    /// Per work item, its calls.
    calls: Vec<Vec<RecordedCall>>,
    /// Per work item, whether its run was committed.
    committed: Vec<bool>,
    /// A call found the turn's budget spent.
    deferred: Option<Exhausted>,
}

impl Calls {
    /// Ends the runs' calls and counts what they used in the turn's report.
    fn harvest(rt: &Runtime, work: &[Work], logs: &[Arc<CallLog>], report: &mut TurnReport) -> Calls {
        let mut calls = Vec::with_capacity(logs.len());
        let mut deferred = None;
        for (work, log) in work.iter().zip(logs) {
            let harvest = log.harvest();
            if harvest.made > 0 || harvest.reused > 0 {
                let agent = &rt.agents[work.slot.agent];
                let produce = &agent.produces[work.slot.produce];
                report.count_usage(&agent.name, produce.name(), harvest.spent, harvest.made, harvest.reused);
            }
            deferred = deferred.or(harvest.deferred);
            calls.push(harvest.calls);
        }
        Calls {
            committed: vec![false; calls.len()],
            calls,
            deferred,
        }
    }

    /// Work item `i`'s calls, for its run's record.
    fn recorded(&self, i: usize) -> Vec<RecordedCall> {
        self.calls[i].clone()
    }

    /// Keeps the answers of the runs that did not commit, for their next attempt.
    fn keep_uncommitted(&mut self, rt: &mut Runtime, work: &[Work]) {
        for (i, calls) in self.calls.iter_mut().enumerate() {
            if !self.committed[i] && !calls.is_empty() {
                rt.calls.keep(run_key(&work[i]), std::mem::take(calls));
            }
        }
    }
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

/// Runs every work item concurrently, bounded by the global and per-agent limits, and
/// returns the results in work order, whatever order they complete in.
async fn execute(
    rt: &Runtime,
    work: &[Work],
    logs: &[Arc<CallLog>],
    snapshot: &Snapshot,
    generation: Generation,
) -> Vec<Result<RunOutput, RunFailure>> {
    let mut results: Vec<Option<Result<RunOutput, RunFailure>>> = Vec::with_capacity(work.len());
    results.resize_with(work.len(), || None);
    let mut active = vec![0usize; rt.agents.len()];
    // Work of an agent at its limit waits here; an agent with waiting work is always at its
    // limit, because each completion of its runs starts its next waiting one.
    let mut waiting: Vec<VecDeque<usize>> = vec![VecDeque::new(); rt.agents.len()];
    let mut running = FuturesUnordered::new();
    let mut next = 0;
    loop {
        while running.len() < rt.max_concurrency && next < work.len() {
            let agent = work[next].slot.agent;
            if rt.agents[agent].concurrency.is_some_and(|limit| active[agent] >= limit) {
                waiting[agent].push_back(next);
            } else {
                active[agent] += 1;
                running.push(run_one(rt, next, &work[next], &logs[next], snapshot, generation));
            }
            next += 1;
        }
        let Some((done, result)) = running.next().await else {
            break;
        };
        results[done] = Some(result);
        let agent = work[done].slot.agent;
        active[agent] -= 1;
        if let Some(queued) = waiting[agent].pop_front() {
            active[agent] += 1;
            running.push(run_one(rt, queued, &work[queued], &logs[queued], snapshot, generation));
        }
    }
    results.into_iter().map(|r| r.expect("every work item ran")).collect()
}

fn run_one(
    rt: &Runtime,
    index: usize,
    work: &Work,
    log: &Arc<CallLog>,
    snapshot: &Snapshot,
    generation: Generation,
) -> impl Future<Output = (usize, Result<RunOutput, RunFailure>)> + Send + 'static {
    let agent = &rt.agents[work.slot.agent];
    let produce = &agent.produces[work.slot.produce];
    let span = tracing::debug_span!("produce", agent = %agent.name, produce = produce.name(), artifact_id = %work.trigger.id, generation = generation.0);
    let failed = work
        .condition_panicked
        .as_ref()
        .map(|message| RunFailure::Panicked(format!("its condition panicked: {message}")));
    let run = match failed {
        None => Some(start_run(
            produce,
            Run {
                trigger: work.trigger.clone(),
                event: work.event,
                joined: work.joined.clone(),
                generation,
                resources: rt.resources.clone(),
                calls: log.clone(),
            },
            snapshot,
        )),
        Some(_) => None,
    };
    async move {
        match (run, failed) {
            (Some(run), _) => (index, run.await),
            (None, failed) => (index, Err(failed.expect("a run or its failure"))),
        }
    }
    .instrument(span)
}

/// Refuses a run's output that creates a kind its produce does not declare.
pub(crate) fn check_outputs(
    produce: &Produce,
    result: Result<RunOutput, RunFailure>,
) -> Result<RunOutput, RunFailure> {
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
    /// Where its calls are recorded and answered from; the caller harvests it afterwards.
    pub(crate) calls: Arc<CallLog>,
}

/// Starts one run of `produce` against `snapshot`, catching panics; the future yields the
/// run's patch and reads. Used by the generation loop, the replay oracle and the produce test
/// harness.
pub(crate) fn start_run(
    produce: &Produce,
    run: Run,
    snapshot: &Snapshot,
) -> impl Future<Output = Result<RunOutput, RunFailure>> + Send + 'static {
    let buffer = Arc::new(Mutex::new(Buffer::default()));
    let input = RunInput {
        trigger: run.trigger,
        event: run.event,
        snapshot: snapshot.clone(),
        buffer: buffer.clone(),
        generation: run.generation,
        joined: run.joined,
        resources: run.resources,
        calls: run.calls,
    };
    let started = std::panic::catch_unwind(AssertUnwindSafe(|| produce.start(input)));
    async move {
        let outcome = match started {
            Ok(future) => AssertUnwindSafe(future)
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| Err(RunFailure::Panicked(panic_message(&panic)))),
            Err(panic) => Err(RunFailure::Panicked(panic_message(&panic))),
        };
        let sealed = buffer.lock().unwrap_or_else(|e| e.into_inner()).seal();
        outcome.and_then(|()| match sealed.error {
            Some(e) => Err(RunFailure::Effect(e)),
            None => Ok(RunOutput {
                ops: sealed.ops,
                reads: sealed.reads,
            }),
        })
    }
}

pub(crate) fn panic_message(panic: &Box<dyn Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

//! The replay oracle: re-execute recorded produce runs against the snapshots they saw and
//! compare the patches with the recorded ones.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::model::action::PendingAction;
use crate::model::artifact::{ArtifactId, Generation, Stored, Version};
use crate::model::event::EventKind;
use crate::model::field_diff::{diff_bytes, FieldDiff};
use crate::model::hash::ContentHash;
use crate::model::patch::Op;
use crate::run::calls::{CallLog, MissKind, ReplayMiss, Source};
use crate::run::effects::Buffer;
use crate::run::generation::{start_run, Ended, Run};
use crate::run::join::Joins;
use crate::run::produce::{Agent, Produce};
use crate::run::resources::Resources;
use crate::run::runtime::Runtime;
use crate::session::context::Context;
use crate::state::commit::{Commit, RunRecord};
use crate::state::refold::{Checks, Refold, VerifyError};
use crate::state::snapshot::Snapshot;

/// The first run whose replay does not reproduce its recorded patch.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Divergence {
    /// The commit (generation) holding the run.
    pub generation: Generation,
    /// The run's index in the commit.
    pub run: usize,
    /// The run's agent.
    pub agent: String,
    /// The run's produce.
    pub produce: String,
    /// The run's trigger.
    pub trigger: ArtifactId,
    /// The artifact where the patches first differ, when there is one.
    pub id: Option<ArtifactId>,
    /// How they differ.
    pub difference: Difference,
}

/// How a replayed run differs from its record.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Difference {
    /// The same operation on the same id wrote different content. `fields` lists the differing
    /// fields when both sides decode as structs or maps (for an intent, its payload's fields,
    /// under `payload`); it is empty when the content is not structured.
    Content {
        /// The differing fields, at most 16.
        fields: Vec<FieldDiff>,
    },
    /// The operations differ in shape: another operation, mode, kind or id, or one side has
    /// an operation the other lacks. Each side is described as `create_once receipt:1`, or
    /// `nothing`.
    Operation {
        /// The recorded operation.
        recorded: String,
        /// The replayed operation.
        replayed: String,
    },
    /// The replayed run failed.
    Failed {
        /// The failure, as displayed.
        error: String,
    },
    /// No agent and produce of the given names was passed to the oracle.
    UnknownProduce,
    /// The run is a join's, and the snapshot it saw no longer completes its set: a joined
    /// part with the trigger's key is missing, or an absent part has one (the key functions
    /// changed).
    JoinIncomplete,
    /// The trigger is not in the snapshot the run saw at the version and hash it recorded.
    TriggerMissing {
        /// The version the run recorded.
        version: Version,
    },
    /// A recorded call does not replay: the replayed run asked for a call the record does not
    /// have, with another request, or did not ask for one it has (the produce, the call and
    /// the difference are named). The replay calls nothing: it answers only from the record.
    Call(ReplayMiss),
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "generation {}, run {} ({}/{} on `{}`)",
            self.generation.0, self.run, self.agent, self.produce, self.trigger
        )?;
        if let Some(id) = &self.id {
            write!(f, ", artifact `{id}`")?;
        }
        match &self.difference {
            Difference::Content { fields } if fields.is_empty() => write!(f, ": the content differs"),
            Difference::Content { fields } => {
                f.write_str(": ")?;
                for (i, field) in fields.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    let path = if field.path.is_empty() {
                        "the value"
                    } else {
                        &field.path
                    };
                    write!(f, "{path} was {} and is now {}", field.recorded, field.replayed)?;
                }
                Ok(())
            }
            Difference::Operation { recorded, replayed } => {
                write!(f, ": recorded {recorded}, replayed {replayed}")
            }
            Difference::Failed { error } => write!(f, ": the replayed run failed: {error}"),
            Difference::UnknownProduce => write!(f, ": no such agent and produce was given to replay"),
            Difference::JoinIncomplete => write!(
                f,
                ": the snapshot the run saw does not complete its join (a joined part is missing or an absent one is present)"
            ),
            Difference::TriggerMissing { version } => write!(
                f,
                ": the trigger is not at version {} in the snapshot the run saw",
                version.0
            ),
            Difference::Call(miss) => write!(
                f,
                ": recorded call `{}` (#{} of that name): {}",
                miss.call, miss.index, miss.kind
            ),
        }
    }
}

/// Why a replay did not pass.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// A run's replay does not reproduce its recorded patch.
    #[error("replay diverged at {0}")]
    Diverged(Box<Divergence>),
    /// The log itself does not refold (see [`Context::verify`]).
    #[error("replay could not rebuild the recorded snapshots: {0}")]
    Log(#[from] VerifyError),
    /// A produce given to the replay uses a resource that was not given
    /// ([`Context::replay_with`]); nothing was replayed.
    #[error("produce `{produce}` (agent `{agent}`) uses resource `{resource}`, which the replay was not given; pass it to Context::replay_with")]
    MissingResource {
        /// The agent.
        agent: String,
        /// The produce's name.
        produce: String,
        /// The resource's type name.
        resource: &'static str,
    },
}

/// What a passing replay checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayReport {
    /// Commits whose runs were replayed (direct writes have nothing to replay).
    pub commits: usize,
    /// Produce runs re-executed, each with a patch equal to its record.
    pub runs: usize,
}

impl Context {
    /// The replay oracle: re-executes every recorded produce run of the log — the produce of
    /// that name among `agents`, on its recorded trigger, against the snapshot the run
    /// originally saw (the state after the commit before its own) — and compares each new patch
    /// with the recorded one, operation by operation (kind, mode, id and content hash).
    ///
    /// The snapshots are rebuilt by refolding the log (checking parent links, commit hashes
    /// and state hashes); the live context is only read. No dispatcher is called and nothing is written:
    /// the replayed patches are compared and dropped. Runs are replayed one at a time, in log
    /// order. Matching is not re-done: a run whose condition would no longer hold is still
    /// replayed, and a run that would now be matched but was not recorded is not noticed.
    ///
    /// # Errors
    /// [`ReplayError::Diverged`] with the first [`Divergence`] in log order: the produce, the
    /// generation, the artifact id and, for structured content, the differing fields;
    /// [`ReplayError::Log`] if the log does not refold; [`ReplayError::MissingResource`] if a
    /// produce uses a resource (give them with [`replay_with`](Context::replay_with)).
    pub async fn replay(&self, agents: &[Agent]) -> Result<ReplayReport, ReplayError> {
        self.replay_with(agents, &Resources::new()).await
    }

    /// [`replay`](Context::replay) with the resources the produces use
    /// ([`ProduceCall::resource`](crate::ProduceCall::resource)). Recorded calls
    /// ([`ProduceCall::record`](crate::ProduceCall::record)) are answered from the log only —
    /// their closures are never called — so a resource that reaches the world (a model client)
    /// is not used; a produce that asks for a call the log does not have, or with another
    /// request, diverges with [`Difference::Call`].
    ///
    /// # Errors
    /// As [`replay`](Context::replay); [`ReplayError::MissingResource`] when a produce uses a
    /// resource that `resources` lacks.
    pub async fn replay_with(&self, agents: &[Agent], resources: &Resources) -> Result<ReplayReport, ReplayError> {
        if let Some((agent, produce, resource)) = crate::run::produce::missing_resource(agents, resources) {
            return Err(ReplayError::MissingResource {
                agent: agent.name().to_owned(),
                produce: produce.name().to_owned(),
                resource,
            });
        }
        let mut refold = Refold::new(Checks::COMMITS);
        let mut report = ReplayReport { commits: 0, runs: 0 };
        let mut deleted = Deleted::default();
        // The join indexes of the snapshots, kept in step as the log is refolded.
        let mut joins = Joins::of(agents);
        let (log, _) = self.whole_async().await?;
        for commit in log {
            let produced: Vec<(usize, &RunRecord)> = commit
                .runs
                .iter()
                .enumerate()
                .filter(|(_, r)| r.produce.is_some())
                .collect();
            if !produced.is_empty() {
                let snapshot = Snapshot::new(refold.state().clone());
                for (index, run) in produced {
                    replay_run(agents, resources, commit, index, run, &snapshot, &deleted, &joins).await?;
                    report.runs += 1;
                }
                report.commits += 1;
            }
            for emitted in refold.step(commit)? {
                if let Some(stored) = emitted.deleted {
                    deleted.insert((stored.id.clone(), stored.version, stored.hash), stored);
                }
            }
            if !joins.is_empty() {
                joins.apply(commit, refold.state());
            }
        }
        Ok(report)
    }
}

impl Runtime {
    /// [`Context::replay`] of this runtime's context with its agents. Calls no dispatcher.
    ///
    /// # Errors
    /// As [`Context::replay`].
    pub async fn replay(&self) -> Result<ReplayReport, ReplayError> {
        self.context.replay_with(&self.agents, &self.resources).await
    }
}

/// The versions the log deleted, by id, version and content hash: the triggers of runs that
/// reacted to a deletion.
type Deleted = HashMap<(ArtifactId, Version, ContentHash), Arc<Stored>>;

fn find<'a>(agents: &'a [Agent], agent: &str, produce: &str) -> Option<&'a Produce> {
    agents
        .iter()
        .filter(|a| a.name() == agent)
        .flat_map(|a| &a.produces)
        .find(|p| p.name() == produce)
}

#[allow(clippy::too_many_arguments)]
async fn replay_run(
    agents: &[Agent],
    resources: &Resources,
    commit: &Commit,
    index: usize,
    run: &RunRecord,
    snapshot: &Snapshot,
    deleted: &Deleted,
    joins: &Joins,
) -> Result<(), ReplayError> {
    let agent = run.agent.as_deref().unwrap_or_default();
    let produce_name = run.produce.as_deref().unwrap_or_default();
    let Some(trigger) = &run.trigger else {
        return Ok(());
    };
    let diverged = |id: Option<ArtifactId>, difference: Difference| {
        ReplayError::Diverged(Box::new(Divergence {
            generation: commit.generation,
            run: index,
            agent: agent.to_owned(),
            produce: produce_name.to_owned(),
            trigger: trigger.id.clone(),
            id,
            difference,
        }))
    };
    let Some(produce) = find(agents, agent, produce_name) else {
        return Err(diverged(None, Difference::UnknownProduce));
    };
    let found = match trigger.event {
        // A deletion's trigger is the version deleted, which the snapshot no longer holds.
        EventKind::Deleted => deleted
            .get(&(trigger.id.clone(), trigger.version, trigger.hash))
            .filter(|_| snapshot.state.get(trigger.id.as_str()).is_none()),
        EventKind::Created | EventKind::Updated | EventKind::Stale => snapshot
            .state
            .get(trigger.id.as_str())
            .filter(|stored| stored.version == trigger.version && stored.hash == trigger.hash),
    };
    let stored = match found {
        Some(stored) => Arc::clone(stored),
        None => {
            return Err(diverged(
                Some(trigger.id.clone()),
                Difference::TriggerMissing {
                    version: trigger.version,
                },
            ))
        }
    };
    // A join run joins the parts that share its trigger's key in the snapshot it saw.
    let joined = match produce.is_join() {
        false => None,
        true => {
            let parts =
                Joins::slot_named(agents, agent, produce_name).and_then(|slot| joins.parts(slot, &stored, snapshot));
            match parts {
                Some(parts) => Some(parts),
                None => return Err(diverged(Some(trigger.id.clone()), Difference::JoinIncomplete)),
            }
        }
    };
    let buffer = Buffer::new(
        Some(CallLog::answering(
            produce.name_arc().clone(),
            Source::Replay {
                recorded: run.calls.clone(),
            },
        )),
        run.ops.len(),
    );
    let run_input = Run {
        trigger: stored,
        event: trigger.event,
        joined,
        generation: commit.generation,
        resources: resources.clone(),
        buffer,
    };
    let Ended {
        result: output, calls, ..
    } = start_run(produce, run_input, snapshot, None).await;
    // A call that does not replay explains whatever else differs — except a recorded call the
    // run did not ask for because it failed first: the failure is the news.
    let miss = calls.harvest().miss;
    if let Some(miss) = miss.filter(|miss| miss.kind != MissKind::NotAsked || output.is_ok()) {
        return Err(diverged(None, Difference::Call(miss)));
    }
    let output = output.map_err(|e| diverged(None, Difference::Failed { error: e.to_string() }))?;
    let recorded = &run.ops;
    let replayed = &output.ops;
    for i in 0..recorded.len().max(replayed.len()) {
        match (recorded.get(i), replayed.get(i)) {
            (Some(a), Some(b)) if same_shape(a, b) => {
                if let Some(fields) = content_difference(a, b) {
                    return Err(diverged(Some(a.id().clone()), Difference::Content { fields }));
                }
            }
            (a, b) => {
                let id = a.or(b).map(|op| op.id().clone());
                return Err(diverged(
                    id,
                    Difference::Operation {
                        recorded: describe(a),
                        replayed: describe(b),
                    },
                ));
            }
        }
    }
    Ok(())
}

/// Whether two operations are the same operation on the same id (content aside).
fn same_shape(a: &Op, b: &Op) -> bool {
    match (a, b) {
        (
            Op::Put {
                mode: ma,
                id: ia,
                kind: ka,
                ..
            },
            Op::Put {
                mode: mb,
                id: ib,
                kind: kb,
                ..
            },
        ) => ma == mb && ia == ib && ka == kb,
        (
            Op::Act {
                key: ka, action: aa, ..
            },
            Op::Act {
                key: kb, action: ab, ..
            },
        ) => ka == kb && aa == ab,
        (Op::Delete { id: a }, Op::Delete { id: b }) => a == b,
        (Op::Link(a), Op::Link(b)) | (Op::Unlink(a), Op::Unlink(b)) => a == b,
        _ => false,
    }
}

/// `None` when the contents are equal; otherwise the differing fields.
fn content_difference(a: &Op, b: &Op) -> Option<Vec<FieldDiff>> {
    match (a, b) {
        (
            Op::Put {
                hash: ha, bytes: ba, ..
            },
            Op::Put {
                hash: hb, bytes: bb, ..
            },
        ) => (ha != hb).then(|| diff_bytes("", ba, bb)),
        (
            Op::Act {
                hash: ha, bytes: ba, ..
            },
            Op::Act {
                hash: hb, bytes: bb, ..
            },
        ) => (ha != hb).then(|| {
            match (
                rmp_serde::from_slice::<PendingAction>(ba),
                rmp_serde::from_slice::<PendingAction>(bb),
            ) {
                (Ok(pa), Ok(pb)) => diff_bytes("payload", &pa.payload, &pb.payload),
                _ => diff_bytes("", ba, bb),
            }
        }),
        _ => None,
    }
}

fn describe(op: Option<&Op>) -> String {
    let Some(op) = op else {
        return "nothing".to_owned();
    };
    match op {
        Op::Put { mode, id, kind, .. } => {
            let mode = match mode {
                crate::model::patch::PutMode::Create => "create",
                crate::model::patch::PutMode::Upsert => "upsert",
                crate::model::patch::PutMode::CreateOnce => "create_once",
                crate::model::patch::PutMode::Update => "update",
            };
            format!("{mode} {kind} `{id}`")
        }
        Op::Act { key, action, .. } => format!("act {action} `{key}`"),
        Op::Delete { id } => format!("delete `{id}`"),
        Op::Link(r) => format!("link `{}` -[{}]-> `{}`", r.from, r.name, r.to),
        Op::Unlink(r) => format!("unlink `{}` -[{}]-> `{}`", r.from, r.name, r.to),
    }
}

/// Helpers for tests and CI: [`assert_replays`](testing::assert_replays) after a code change, and
/// the produce test harness ([`ProduceTest`](testing::ProduceTest)) for unit tests of one produce.
pub mod testing {
    pub use crate::run::harness::{ProduceTest, RunEffects};
    use crate::run::produce::Agent;
    use crate::run::resources::Resources;
    use crate::session::context::Context;

    /// Replays `ctx`'s log with `agents` ([`Context::replay`]) and panics with the first
    /// divergence if a produce no longer reproduces its recorded patch. One line in a test
    /// after a code change:
    ///
    /// ```
    /// # use reactifact_core::{Agent, Context};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// # let ctx = Context::new("orders");
    /// # let agents: Vec<Agent> = Vec::new();
    /// reactifact_core::testing::assert_replays(&ctx, &agents).await;
    /// # });
    /// ```
    ///
    /// # Panics
    /// On the first divergence, or if the log does not refold.
    pub async fn assert_replays(ctx: &Context, agents: &[Agent]) {
        if let Err(e) = ctx.replay(agents).await {
            panic!("{e}");
        }
    }

    /// [`assert_replays`] with the resources the produces use
    /// ([`Context::replay_with`]).
    ///
    /// # Panics
    /// As [`assert_replays`].
    pub async fn assert_replays_with(ctx: &Context, agents: &[Agent], resources: &Resources) {
        if let Err(e) = ctx.replay_with(agents, resources).await {
            panic!("{e}");
        }
    }
}

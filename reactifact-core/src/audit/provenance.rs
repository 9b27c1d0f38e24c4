//! Effect provenance ("why was this action sent?") and content-derived idempotency keys.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::model::action::{ActionKey, Origin};
use crate::model::artifact::{ArtifactId, Generation, Record};
use crate::model::call::RecordedCall;
use crate::model::delivery::{Decision, Delivery};
use crate::model::hash::{self, CommitHash, ContentHash};
use crate::model::patch::{Op, PutMode};
use crate::session::context::Context;
use crate::state::commit::{Commit, Read, RunRecord, TriggerRef};
use crate::state::refold::VerifyError;
use crate::store::StoreError;

/// Derives an idempotency key from a name and an artifact's id and content hash:
/// `{name}:{32 hex digits}`, the first 128 bits of a SHA-256 over the three.
///
/// The key depends on nothing else, so every re-derivation — a retry, a resume, a replay,
/// another branch — gives the same key for the same content, and a change of content gives a
/// new one. The id is part of it so that two artifacts with equal content (two identical
/// orders) still get two keys.
///
/// ```
/// # use reactifact_core::{content_key, ArtifactId, ContentHash};
/// let key = content_key("notify", &ArtifactId::from("order:1"), &ContentHash([7; 32]));
/// assert!(key.as_str().starts_with("notify:"));
/// assert_eq!(key, content_key("notify", &ArtifactId::from("order:1"), &ContentHash([7; 32])));
/// ```
pub fn content_key(name: &str, id: &ArtifactId, hash: &ContentHash) -> ActionKey {
    let mut hasher = Sha256::new();
    hasher.update(b"reactifact/key/v1");
    for part in [name.as_bytes(), id.as_str().as_bytes()] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    hasher.update(hash.as_bytes());
    let digest: [u8; 32] = hasher.finalize().into();
    ActionKey::from(format!("{name}:{}", hash::hex(&digest[..16])))
}

impl<T> Record<T> {
    /// An idempotency key derived from this record's id and content hash and `name` (see
    /// [`content_key`]). In a produce, `call.trigger.key("notify")` gives a key that every
    /// re-run on the same trigger content derives again.
    pub fn key(&self, name: &str) -> ActionKey {
        content_key(name, &self.id, &self.hash)
    }
}

impl TriggerRef {
    /// The key [`Record::key`] derives from the trigger this refers to.
    pub fn key(&self, name: &str) -> ActionKey {
        content_key(name, &self.id, &self.hash)
    }
}

/// Why an intent exists: the commit and produce run that recorded it, what triggered that
/// run and what it read, and how its delivery went. Built by [`Context::provenance`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Provenance<'a> {
    /// The intent's idempotency key.
    pub key: ActionKey,
    /// The commit (generation) that recorded the intent.
    pub generation: Generation,
    /// That commit's hash.
    pub commit: CommitHash,
    /// The index of the run in the commit.
    pub run: usize,
    /// The run: agent, produce, trigger, operations and reads.
    pub record: &'a RunRecord,
    /// The intent's delivery in the ledger, if this store's ledger has it.
    pub delivery: Option<Delivery>,
    /// Whether the produce acted it with approval
    /// ([`Effects::act_with_approval`](crate::Effects::act_with_approval)), as the hashed
    /// `PendingAction` of the commit says.
    pub requires_approval: bool,
    /// The chain of runs behind the run that recorded the intent, nearest first: the run
    /// that wrote the content of its trigger, then the run that wrote the content of *that*
    /// run's trigger, and so on back to the outside write that started it (a run with no
    /// produce: [`Cause::is_outside_write`]). The chain stops early — its last cause has a
    /// trigger — when this log does not hold the run that wrote a trigger (it was written on
    /// another branch before a merge, or before the first commit this log keeps).
    pub chain: Vec<Cause<'a>>,
}

/// One run in the chain behind an intent ([`Provenance::chain`]): the run that wrote the
/// content a later run was triggered by.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Cause<'a> {
    /// The commit (generation) of the run.
    pub generation: Generation,
    /// That commit's hash.
    pub commit: CommitHash,
    /// The index of the run in the commit.
    pub run: usize,
    /// The run: agent, produce, its own trigger, operations, reads and recorded calls.
    pub record: &'a RunRecord,
    /// What it wrote that triggered the next run of the chain: the id, version and content.
    pub wrote: TriggerRef,
}

impl Cause<'_> {
    /// Whether the run is a write from outside the produces (`ctx.create`, a handle's write,
    /// an import): where the chain starts.
    pub fn is_outside_write(&self) -> bool {
        self.record.produce.is_none()
    }
}

impl Provenance<'_> {
    /// The agent of the run, `None` for a direct write.
    pub fn agent(&self) -> Option<&str> {
        self.record.agent.as_deref()
    }

    /// The produce of the run, `None` for a direct write.
    pub fn produce(&self) -> Option<&str> {
        self.record.produce.as_deref()
    }

    /// The artifact version that triggered the run.
    pub fn trigger(&self) -> Option<&TriggerRef> {
        self.record.trigger.as_ref()
    }

    /// The ids and versions the run read through its snapshot.
    pub fn reads(&self) -> &[Read] {
        &self.record.reads
    }

    /// The operator's approval or rejection of the intent, as the ledger keeps it (`None` if
    /// it needed none, still awaits one, or the ledger does not hold it).
    pub fn decision(&self) -> Option<&Decision> {
        self.delivery.as_ref().and_then(Delivery::decision)
    }

    /// The calls the run recorded ([`ProduceCall::record`](crate::ProduceCall::record) and
    /// its kin: a model's answer, a tool's, the clock), in the order asked: each with its
    /// name, the model asked (if recorded with one), the tokens it used and its answer's hash.
    pub fn calls(&self) -> &[RecordedCall] {
        &self.record.calls
    }

    /// The outside write the chain starts from, if this log holds the whole chain.
    pub fn started_by(&self) -> Option<&Cause<'_>> {
        self.chain.last().filter(|cause| cause.is_outside_write())
    }
}

/// The run of `log`, before generation `before`, that last wrote the content `trigger` names:
/// the newest run that put `trigger.id` with that content hash while the id held other
/// content (or none). A put of the same content again (a refresh), or a create-once of an id
/// that exists, changes nothing, so it is not the cause.
fn writer_of<'a>(log: &'a [Commit], before: Generation, trigger: &TriggerRef) -> Option<(&'a Commit, usize)> {
    let mut current: Option<&ContentHash> = None;
    let mut writer = None;
    for commit in log.iter().take_while(|commit| commit.generation < before) {
        for (at, run) in commit.runs.iter().enumerate() {
            for op in &run.ops {
                match op {
                    Op::Put { mode, id, hash, .. } if *id == trigger.id => {
                        let skipped = *mode == PutMode::CreateOnce && current.is_some();
                        if !skipped && current != Some(hash) {
                            current = Some(hash);
                            writer = (*hash == trigger.hash).then_some((commit, at));
                        }
                    }
                    Op::Delete { id } if *id == trigger.id => {
                        current = None;
                        writer = None;
                    }
                    _ => {}
                }
            }
        }
    }
    writer.filter(|_| current == Some(&trigger.hash))
}

/// The chain of runs behind `record` (see [`Provenance::chain`]), each found in `log` before
/// the commit of the run it caused. Bounded by the log's length: each cause is in an earlier
/// commit than the run it caused.
fn chain_of<'a>(log: &'a [Commit], generation: Generation, record: &RunRecord) -> Vec<Cause<'a>> {
    let mut chain: Vec<Cause<'a>> = Vec::new();
    let mut trigger = record.trigger.clone();
    let mut before = generation;
    while let Some(wrote) = trigger {
        let Some((commit, run)) = writer_of(log, before, &wrote) else {
            break;
        };
        let record = &commit.runs[run];
        trigger = record.trigger.clone();
        before = commit.generation;
        chain.push(Cause {
            generation: commit.generation,
            commit: commit.hash,
            run,
            record,
            wrote,
        });
    }
    chain
}

impl fmt::Display for Provenance<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "intent `{}` was recorded in commit {} ({})",
            self.key,
            self.generation.0,
            self.commit.short()
        )?;
        match (self.agent(), self.produce()) {
            (Some(agent), Some(produce)) => write!(f, " by {agent}/{produce}")?,
            _ => f.write_str(" by a direct write")?,
        }
        if let Some(trigger) = self.trigger() {
            write!(
                f,
                ", triggered by `{}` version {} (content {})",
                trigger.id,
                trigger.version.0,
                trigger.hash.short()
            )?;
        }
        if !self.reads().is_empty() {
            f.write_str(", reading ")?;
            for (i, read) in self.reads().iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                match read.version {
                    Some(v) => write!(f, "`{}` version {}", read.id, v.0)?,
                    None => write!(f, "`{}` (absent)", read.id)?,
                }
            }
        }
        if !self.calls().is_empty() {
            f.write_str(", calling ")?;
            for (i, call) in self.calls().iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "`{}`", call.name)?;
                if let Some(model) = &call.model {
                    write!(f, " ({model})")?;
                }
            }
        }
        for cause in &self.chain {
            let wrote = &cause.wrote;
            match (cause.record.agent.as_deref(), cause.record.produce.as_deref()) {
                (Some(agent), Some(produce)) => write!(
                    f,
                    "; `{}` version {} was written by {agent}/{produce} in commit {}",
                    wrote.id, wrote.version.0, cause.generation.0
                )?,
                _ => write!(
                    f,
                    "; `{}` version {} was written from outside in commit {}",
                    wrote.id, wrote.version.0, cause.generation.0
                )?,
            }
        }
        if self.requires_approval {
            match self.decision() {
                Some(decision) => {
                    write!(f, "; it required approval: {} by {}", decision.verdict, decision.by)?;
                    if let Some(digest) = &decision.digest {
                        write!(f, " of digest {}", digest.short())?;
                    }
                }
                None => f.write_str("; it requires approval, not given yet")?,
            }
            if let Some(reason) = self.decision().and_then(|d| d.reason.as_deref()) {
                write!(f, " ({reason})")?;
            }
        }
        if let Some(delivery) = &self.delivery {
            write!(
                f,
                "; delivery {:?} after {} attempt(s)",
                delivery.status(),
                delivery.attempts()
            )?;
        }
        Ok(())
    }
}

/// The index of the first run of `commit` that acts `key`: the one whose intent the commit
/// created (a later act of the same key is skipped at commit).
fn acting_run(commit: &Commit, key: &str) -> Option<usize> {
    commit.runs.iter().position(|run| {
        run.ops
            .iter()
            .any(|op| matches!(op, Op::Act { key: k, .. } if k.as_str() == key))
    })
}

impl Context {
    /// The commit of this context's log that `origin` names, or `None` if it is not in this
    /// context's history (another branch's commit made after the fork: open that session).
    ///
    /// O(1): a commit's hash covers its generation, so a commit sits at the same position in
    /// every log that holds it; the hash is checked, so a generation from another session
    /// never yields the wrong commit. A commit before the checkpoint a context was opened from
    /// is read with the older commits (see [`Context::log`]).
    ///
    /// # Errors
    /// As [`Context::log`], for a commit before the checkpoint.
    pub fn commit_of(&self, origin: &Origin) -> Result<Option<&Commit>, VerifyError> {
        let generation = origin.generation();
        let log = self.held_log();
        let commit = if generation > log.base_generation() {
            log.held_at(generation)
        } else {
            let at = usize::try_from(generation.0).ok().and_then(|g| g.checked_sub(1));
            match at {
                Some(at) => self.log()?.get(at),
                None => None,
            }
        };
        Ok(commit.filter(|commit| commit.hash == origin.commit()))
    }

    /// The run of this context's log that recorded the intent `key`: the generation of its
    /// commit here and the run's index in that commit: the first commit of the log acting the
    /// key (O(log)). `None` if no commit of this log acts it.
    ///
    /// # Errors
    /// As [`Context::log`].
    pub fn intent_origin(&self, key: &str) -> Result<Option<(Generation, usize)>, VerifyError> {
        Ok(self
            .log()?
            .iter()
            .find_map(|commit| acting_run(commit, key).map(|run| (commit.generation, run))))
    }

    /// Answers "why was this action sent?": from the intent's key to the commit and the run
    /// (agent, produce) that recorded it, the run's trigger (id, version, content hash), what
    /// it read, and the delivery in the ledger. `None` if no commit acts `key`.
    ///
    /// # Errors
    /// [`StoreError`] if the ledger cannot be read; [`StoreError::History`] if the commits
    /// before the checkpoint the context was opened from cannot be read (see
    /// [`Context::log`]).
    pub async fn provenance(&self, key: &str) -> Result<Option<Provenance<'_>>, StoreError> {
        let history = |e: VerifyError| StoreError::History {
            store: self.store_description(),
            session: self.session().to_owned(),
            detail: e.to_string(),
        };
        let (log, _) = self.whole_async().await.map_err(history)?;
        let Some((generation, run)) = self.intent_origin(key).map_err(history)? else {
            return Ok(None);
        };
        let Some(commit) = usize::try_from(generation.0 - 1).ok().and_then(|at| log.get(at)) else {
            return Ok(None);
        };
        let record = &commit.runs[run];
        let requires_approval = record.ops.iter().any(|op| {
            matches!(op, Op::Act { key: k, bytes, .. }
                if k.as_str() == key && crate::model::action::requires_approval(bytes))
        });
        Ok(Some(Provenance {
            key: ActionKey::from(key),
            generation,
            commit: commit.hash,
            run,
            record,
            delivery: self.ledger().get(key).await?,
            requires_approval,
            chain: chain_of(log, generation, record),
        }))
    }
}

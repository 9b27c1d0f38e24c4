//! The stored form of a commit's runs: rmp-serde, with every operation's bytes.
//!
//! [`Op`]'s own `Serialize` leaves the bytes out (it is the commit-hash input, where the
//! content hash stands for them), so storage uses these mirrors. Content hashes are not
//! stored: decoding recomputes them from the bytes. A run's reads (its provenance) are stored
//! after its operations and left out when empty, so runs that read nothing encode as before
//! reads were recorded and older rows decode with no reads. Its recorded calls come after the
//! reads (then written even when empty), left out when there are none.
//!
//! A checkpoint's body ([`encode_checkpoint`]) is the live state as it is held (every
//! artifact with its version, generation, creation position, content hash and bytes; the
//! relations; the creation counter), the event queue's position and its queued events. Its
//! content hashes are stored: the store's digest over the body guards them, and the state
//! hash built from them is checked against the commit the checkpoint names.

use std::borrow::Cow;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::action::{ActionKey, Payload};
use crate::model::artifact::{ArtifactId, Generation, Kind, Stored, Version};
use crate::model::call::{CallOutcome, RecordedCall, Usage};
use crate::model::event::{Event, EventKind, QueuedEvent};
use crate::model::hash::{self, CommitHash, ContentHash, StateHash};
use crate::model::patch::{Op, PutMode};
use crate::model::relation::Relation;
use crate::state::commit::{Read, RunRecord, TriggerRef};
use crate::state::live::State;
use crate::state::readers::{Reader, ReaderKey, Readers};

#[derive(Serialize, Deserialize)]
struct RunRepr<'a> {
    #[serde(borrow)]
    agent: Option<Cow<'a, str>>,
    #[serde(borrow)]
    produce: Option<Cow<'a, str>>,
    trigger: Option<TriggerRepr>,
    #[serde(borrow)]
    ops: Vec<OpRepr<'a>>,
    /// Left out when the run read nothing and recorded no call; present (perhaps empty)
    /// before `calls`, which is positional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reads: Option<Vec<(ArtifactId, Option<Version>)>>,
    #[serde(borrow, default, skip_serializing_if = "Vec::is_empty")]
    calls: Vec<CallRepr<'a>>,
}

/// A recorded call: its name, request hash, outcome (the answer's bytes, the error it failed
/// with, why it could not be recorded, or that it was abandoned) and usage `(tokens in, tokens out, cost)`. The answer's hash is recomputed from its bytes.
#[derive(Serialize, Deserialize)]
struct CallRepr<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    request: ContentHash,
    #[serde(borrow)]
    outcome: OutcomeRepr<'a>,
    usage: (u64, u64, u64),
    /// Last and left out when `None`, so a call without a model encodes as it did before.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    model: Option<Cow<'a, str>>,
}

#[derive(Serialize, Deserialize)]
enum OutcomeRepr<'a> {
    Answered(#[serde(with = "serde_bytes", borrow)] Cow<'a, [u8]>),
    Failed(#[serde(borrow)] Cow<'a, str>),
    Unrecordable(#[serde(borrow)] Cow<'a, str>),
    Abandoned,
}

impl<'a> CallRepr<'a> {
    fn of(call: &'a RecordedCall) -> Self {
        CallRepr {
            name: Cow::Borrowed(&call.name),
            request: call.request,
            outcome: match &call.outcome {
                CallOutcome::Answered { bytes, .. } => OutcomeRepr::Answered(Cow::Borrowed(bytes)),
                CallOutcome::Failed { error } => OutcomeRepr::Failed(Cow::Borrowed(error)),
                CallOutcome::Unrecordable { error } => OutcomeRepr::Unrecordable(Cow::Borrowed(error)),
                CallOutcome::Abandoned => OutcomeRepr::Abandoned,
            },
            usage: (call.usage.tokens_in, call.usage.tokens_out, call.usage.cost),
            model: call.model.as_deref().map(Cow::Borrowed),
        }
    }

    fn into_call(self) -> RecordedCall {
        let (tokens_in, tokens_out, cost) = self.usage;
        RecordedCall {
            name: Arc::from(&*self.name),
            request: self.request,
            outcome: match self.outcome {
                OutcomeRepr::Answered(bytes) => CallOutcome::Answered {
                    hash: hash::content_hash(&bytes),
                    bytes: Arc::from(&*bytes),
                },
                OutcomeRepr::Failed(error) => CallOutcome::Failed {
                    error: error.into_owned(),
                },
                OutcomeRepr::Unrecordable(error) => CallOutcome::Unrecordable {
                    error: error.into_owned(),
                },
                OutcomeRepr::Abandoned => CallOutcome::Abandoned,
            },
            usage: Usage {
                tokens_in,
                tokens_out,
                cost,
            },
            model: self.model.map(|model| Arc::from(&*model)),
        }
    }
}

/// A run's trigger: `[id, version, hash]` as before event kinds were recorded, with a fourth
/// element, `[event kind, watches reads]`, only when the kind is not the one its version implies
/// (`Created` for version 1, `Updated` after it: a deletion, a staleness rerun) or the produce
/// watches its reads.
#[derive(Serialize, Deserialize)]
struct TriggerRepr {
    id: ArtifactId,
    version: Version,
    hash: ContentHash,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    extra: Option<TriggerExtra>,
}

#[derive(Serialize, Deserialize)]
struct TriggerExtra {
    event: EventKind,
    #[serde(default)]
    watches_reads: bool,
}

impl TriggerRepr {
    fn of(run: &RunRecord) -> Option<Self> {
        let trigger = run.trigger.as_ref()?;
        Some(TriggerRepr {
            id: trigger.id.clone(),
            version: trigger.version,
            hash: trigger.hash,
            extra: (!trigger.event.is_inferred() || run.watches_reads).then_some(TriggerExtra {
                event: trigger.event,
                watches_reads: run.watches_reads,
            }),
        })
    }

    /// The trigger, and whether the run watches its reads.
    fn into_trigger(self) -> (TriggerRef, bool) {
        let (event, watches_reads) = match self.extra {
            Some(extra) => (extra.event, extra.watches_reads),
            None => (EventKind::inferred(self.version), false),
        };
        (
            TriggerRef {
                event,
                id: self.id,
                version: self.version,
                hash: self.hash,
            },
            watches_reads,
        )
    }
}

#[derive(Serialize, Deserialize)]
enum OpRepr<'a> {
    Put {
        mode: PutMode,
        id: ArtifactId,
        kind: Kind,
        #[serde(with = "serde_bytes", borrow)]
        bytes: Cow<'a, [u8]>,
    },
    Delete {
        id: ArtifactId,
    },
    Link(Relation),
    Unlink(Relation),
    Act {
        key: ActionKey,
        #[serde(borrow)]
        action: Cow<'a, str>,
        #[serde(with = "serde_bytes", borrow)]
        bytes: Cow<'a, [u8]>,
        #[serde(with = "serde_bytes", borrow)]
        payload: Cow<'a, [u8]>,
    },
}

pub(crate) fn encode_runs(runs: &[RunRecord]) -> Vec<u8> {
    let repr: Vec<RunRepr<'_>> = runs
        .iter()
        .map(|run| RunRepr {
            agent: run.agent.as_deref().map(Cow::Borrowed),
            produce: run.produce.as_deref().map(Cow::Borrowed),
            trigger: TriggerRepr::of(run),
            ops: run.ops.iter().map(op_repr).collect(),
            reads: (!run.reads.is_empty() || !run.calls.is_empty())
                .then(|| run.reads.iter().map(|r| (r.id.clone(), r.version)).collect()),
            calls: run.calls.iter().map(CallRepr::of).collect(),
        })
        .collect();
    // The bytes dominate: start with room for them, so the buffer is not regrown and copied.
    let bytes: usize = runs.iter().flat_map(|r| &r.ops).map(op_bytes).sum::<usize>()
        + runs
            .iter()
            .flat_map(|r| &r.calls)
            .map(|c| c.name.len() + c.answer_bytes().map_or(64, <[u8]>::len) + 56)
            .sum::<usize>();
    let mut out = Vec::with_capacity(bytes + 96 * runs.len() + 64);
    rmp_serde::encode::write(&mut out, &repr).expect("runs always encode");
    out
}

/// About how many bytes an operation's encoding takes.
fn op_bytes(op: &Op) -> usize {
    match op {
        Op::Put { id, bytes, .. } => id.as_str().len() + bytes.len() + 16,
        Op::Act {
            key, bytes, payload, ..
        } => 2 * key.id().as_str().len() + bytes.len() + payload.len() + 24,
        Op::Delete { id } => id.as_str().len() + 8,
        Op::Link(r) | Op::Unlink(r) => r.from.as_str().len() + r.name.len() + r.to.as_str().len() + 8,
    }
}

fn op_repr(op: &Op) -> OpRepr<'_> {
    match op {
        Op::Put {
            mode, id, kind, bytes, ..
        } => OpRepr::Put {
            mode: *mode,
            id: id.clone(),
            kind: *kind,
            bytes: Cow::Borrowed(bytes),
        },
        Op::Delete { id } => OpRepr::Delete { id: id.clone() },
        Op::Link(r) => OpRepr::Link(r.clone()),
        Op::Unlink(r) => OpRepr::Unlink(r.clone()),
        Op::Act {
            key,
            action,
            bytes,
            payload,
            ..
        } => OpRepr::Act {
            key: key.clone(),
            action: Cow::Borrowed(action),
            bytes: Cow::Borrowed(bytes),
            payload: Cow::Borrowed(payload),
        },
    }
}

pub(crate) fn decode_runs(bytes: &[u8]) -> Result<Vec<RunRecord>, rmp_serde::decode::Error> {
    let repr: Vec<RunRepr<'_>> = rmp_serde::from_slice(bytes)?;
    Ok(repr
        .into_iter()
        .map(|run| {
            let (trigger, watches_reads) = match run.trigger.map(TriggerRepr::into_trigger) {
                Some((trigger, watches)) => (Some(trigger), watches),
                None => (None, false),
            };
            RunRecord {
                agent: run.agent.map(|a| Arc::from(&*a)),
                produce: run.produce.map(|p| Arc::from(&*p)),
                trigger,
                ops: run.ops.into_iter().map(op_from).collect(),
                reads: run
                    .reads
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(id, version)| Read { id, version })
                    .collect(),
                watches_reads,
                calls: run.calls.into_iter().map(CallRepr::into_call).collect(),
            }
        })
        .collect())
}

fn op_from(repr: OpRepr<'_>) -> Op {
    match repr {
        OpRepr::Put { mode, id, kind, bytes } => Op::Put {
            mode,
            id,
            kind,
            hash: hash::content_hash(&bytes),
            bytes: Arc::from(&*bytes),
        },
        OpRepr::Delete { id } => Op::Delete { id },
        OpRepr::Link(r) => Op::Link(r),
        OpRepr::Unlink(r) => Op::Unlink(r),
        OpRepr::Act {
            key,
            action,
            bytes,
            payload,
        } => {
            let bytes = Arc::<[u8]>::from(&*bytes);
            // The payload stored beside the bytes is the one inside them (shared with them),
            // unless the log was changed: then it is kept as stored, for `verify` to report.
            let payload = Payload::in_record(&bytes)
                .filter(|inside| inside[..] == *payload)
                .unwrap_or_else(|| Payload::from(&*payload));
            Op::Act {
                key,
                action: Arc::from(&*action),
                hash: hash::content_hash(&bytes),
                bytes,
                payload,
            }
        }
    }
}

/// The format of a checkpoint body this build writes (its first field).
const CHECKPOINT_FORMAT: u32 = 1;

#[derive(Serialize)]
struct CheckpointOut<'a> {
    format: u32,
    next_created: u64,
    next_event_seq: u64,
    artifacts: Vec<StoredOut<'a>>,
    relations: Vec<&'a Relation>,
    events: Vec<(u64, &'a Event)>,
    /// What later builds added; left out when empty, so such a body encodes as before.
    #[serde(skip_serializing_if = "Option::is_none")]
    extra: Option<ExtraOut<'a>>,
}

#[derive(Serialize)]
struct ExtraOut<'a> {
    /// For the queued deletions, by event number, the version deleted.
    deleted: Vec<(u64, StoredOut<'a>)>,
    /// The readers index: (agent, produce, trigger, generation, reads, the reads it wrote), in
    /// key order.
    readers: Vec<ReaderRepr<'a>>,
}

type ReaderRepr<'a> = (
    &'a str,
    &'a str,
    &'a ArtifactId,
    Generation,
    &'a [ArtifactId],
    &'a [ArtifactId],
);

type ReaderIn = (String, String, ArtifactId, Generation, Vec<ArtifactId>, Vec<ArtifactId>);

#[derive(Serialize)]
struct StoredOut<'a> {
    id: &'a ArtifactId,
    kind: Kind,
    version: Version,
    generation: Generation,
    created: u64,
    hash: ContentHash,
    #[serde(with = "serde_bytes")]
    bytes: &'a [u8],
}

impl<'a> StoredOut<'a> {
    fn of(s: &'a Stored) -> Self {
        StoredOut {
            id: &s.id,
            kind: s.kind,
            version: s.version,
            generation: s.generation,
            created: s.created,
            hash: s.hash,
            bytes: &s.bytes,
        }
    }
}

#[derive(Deserialize)]
struct CheckpointIn<'a> {
    format: u32,
    next_created: u64,
    next_event_seq: u64,
    #[serde(borrow)]
    artifacts: Vec<StoredIn<'a>>,
    relations: Vec<Relation>,
    events: Vec<(u64, Event)>,
    #[serde(default, borrow)]
    extra: Option<ExtraIn<'a>>,
}

#[derive(Deserialize)]
struct ExtraIn<'a> {
    #[serde(default, borrow)]
    deleted: Vec<(u64, StoredIn<'a>)>,
    #[serde(default)]
    readers: Vec<ReaderIn>,
}

#[derive(Deserialize)]
struct StoredIn<'a> {
    id: ArtifactId,
    kind: Kind,
    version: Version,
    generation: Generation,
    created: u64,
    hash: ContentHash,
    #[serde(with = "serde_bytes", borrow)]
    bytes: Cow<'a, [u8]>,
}

impl StoredIn<'_> {
    fn into_stored(self) -> Stored {
        Stored {
            id: self.id,
            kind: self.kind,
            version: self.version,
            hash: self.hash,
            generation: self.generation,
            created: self.created,
            bytes: Arc::from(&*self.bytes),
        }
    }
}

/// What a checkpoint's body holds, decoded.
pub(crate) struct CheckpointBody {
    pub(crate) state: State,
    pub(crate) next_event_seq: u64,
    pub(crate) events: Vec<QueuedEvent>,
    pub(crate) readers: Readers,
}

/// Encodes a checkpoint's body: O(state), so it runs on the store's thread, never on an
/// executor thread.
pub(crate) fn encode_checkpoint(
    state: &State,
    next_event_seq: u64,
    events: &[QueuedEvent],
    readers: &Readers,
) -> Vec<u8> {
    let artifacts: Vec<StoredOut<'_>> = state.artifacts().map(|s| StoredOut::of(s)).collect();
    let bytes: usize = artifacts.iter().map(|a| a.bytes.len() + a.id.as_str().len() + 64).sum();
    let body = CheckpointOut {
        format: CHECKPOINT_FORMAT,
        next_created: state.created_counter(),
        next_event_seq,
        artifacts,
        relations: state.relations().collect(),
        events: events.iter().map(|q| (q.seq, &q.event)).collect(),
        extra: None,
    };
    let deleted: Vec<(u64, StoredOut<'_>)> = events
        .iter()
        .filter_map(|q| q.deleted.as_ref().map(|s| (q.seq, StoredOut::of(s))))
        .collect();
    let readers: Vec<ReaderRepr<'_>> = readers
        .entries()
        .into_iter()
        .map(|(key, reader)| {
            (
                &*key.agent,
                &*key.produce,
                &key.trigger,
                reader.generation,
                &reader.reads[..],
                &reader.wrote[..],
            )
        })
        .collect();
    let body = CheckpointOut {
        extra: (!deleted.is_empty() || !readers.is_empty()).then_some(ExtraOut { deleted, readers }),
        ..body
    };
    let mut out = Vec::with_capacity(bytes + 64);
    rmp_serde::encode::write(&mut out, &body).expect("a checkpoint always encodes");
    out
}

/// The digest a stored checkpoint carries: SHA-256 over the session, the commit it names
/// (generation, commit hash, state hash) and its body.
pub(crate) fn checkpoint_digest(
    session: &str,
    generation: u64,
    hash: &[u8],
    state_hash: &[u8],
    body: &[u8],
) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(b"reactifact/checkpoint/v1");
    hasher.update((session.len() as u64).to_le_bytes());
    hasher.update(session.as_bytes());
    hasher.update(generation.to_le_bytes());
    hasher.update(hash);
    hasher.update(state_hash);
    hasher.update(body);
    hasher.finalize().into()
}

/// `bytes` as a 32-byte hash, or what is wrong with `what` in words.
pub(crate) fn hash32(bytes: &[u8], what: &str) -> Result<[u8; 32], String> {
    bytes
        .try_into()
        .map_err(|_| format!("{what} is {} bytes, not a 32-byte hash", bytes.len()))
}

/// A stored checkpoint of `session`, checked: the commit hash and state hash it names, and its
/// body, which matches its digest, decodes, and has the state hash it names.
pub(crate) fn check_checkpoint(
    session: &str,
    generation: u64,
    hash: &[u8],
    state_hash: &[u8],
    body: &[u8],
    digest: &[u8],
) -> Result<(CommitHash, StateHash, CheckpointBody), String> {
    let commit_hash = CommitHash(hash32(hash, "its commit hash")?);
    let named = StateHash(hash32(state_hash, "its state hash")?);
    if digest[..] != checkpoint_digest(session, generation, hash, state_hash, body)[..] {
        return Err("it does not match its digest (it was changed or damaged)".into());
    }
    let body = decode_checkpoint(body)?;
    let decoded = body.state.state_hash();
    if decoded != named {
        return Err(format!("its state has state hash {decoded}, not the {named} it names"));
    }
    Ok((commit_hash, named, body))
}

/// Decodes a checkpoint's body; an error in words if it does not decode.
pub(crate) fn decode_checkpoint(bytes: &[u8]) -> Result<CheckpointBody, String> {
    let body: CheckpointIn<'_> = rmp_serde::from_slice(bytes).map_err(|e| format!("its body does not decode: {e}"))?;
    if body.format != CHECKPOINT_FORMAT {
        return Err(format!("its body has format {}, not {CHECKPOINT_FORMAT}", body.format));
    }
    let artifacts = body.artifacts.into_iter().map(StoredIn::into_stored);
    let extra = body.extra.unwrap_or(ExtraIn {
        deleted: Vec::new(),
        readers: Vec::new(),
    });
    let mut deleted: std::collections::HashMap<u64, Arc<Stored>> = extra
        .deleted
        .into_iter()
        .map(|(seq, s)| (seq, Arc::new(s.into_stored())))
        .collect();
    let events: Vec<QueuedEvent> = body
        .events
        .into_iter()
        .map(|(seq, event)| QueuedEvent {
            seq,
            deleted: deleted.remove(&seq),
            event,
        })
        .collect();
    if let Some(seq) = deleted.keys().min() {
        return Err(format!(
            "it holds a deleted version for event number {seq}, which is not one of its queued events"
        ));
    }
    Ok(CheckpointBody {
        state: State::from_parts(artifacts, body.relations, body.next_created),
        next_event_seq: body.next_event_seq,
        events,
        readers: Readers::from_entries(extra.readers.into_iter().map(
            |(agent, produce, trigger, generation, reads, wrote)| {
                (
                    ReaderKey {
                        agent: Arc::from(agent),
                        produce: Arc::from(produce),
                        trigger,
                    },
                    Reader {
                        generation,
                        reads: reads.into(),
                        wrote: wrote.into(),
                    },
                )
            },
        )),
    })
}

/// A recorded call as a store keeps its answer before the run commits
/// ([`AnswerRow::call`](crate::store::AnswerRow)): the encoding a run record gives it.
pub(crate) fn encode_call(call: &RecordedCall) -> Vec<u8> {
    rmp_serde::to_vec(&CallRepr::of(call)).expect("a recorded call always encodes")
}

/// [`encode_call`] undone; `None` for bytes that are not a recorded call.
pub(crate) fn decode_call(bytes: &[u8]) -> Option<RecordedCall> {
    rmp_serde::from_slice::<CallRepr<'_>>(bytes)
        .ok()
        .map(CallRepr::into_call)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize)]
    struct Receipt {
        total: u32,
    }

    impl crate::model::artifact::Artifact for Receipt {
        const KIND: &'static str = "receipt";
    }

    #[test]
    fn runs_round_trip_with_their_bytes() {
        let put = Op::put(PutMode::Upsert, ArtifactId::from("receipt:1"), &Receipt { total: 7 }).unwrap();
        let key = ActionKey::from("k");
        let act = Op::act("notify", key.clone(), &"payload").unwrap();
        let runs = vec![RunRecord {
            agent: Some(Arc::from("billing")),
            produce: Some(Arc::from("process_order")),
            trigger: Some(TriggerRef {
                event: EventKind::Updated,
                id: ArtifactId::from("order:1"),
                version: Version(3),
                hash: hash::content_hash(b"x"),
            }),
            ops: vec![
                put,
                act,
                Op::Delete {
                    id: ArtifactId::from("gone"),
                },
                Op::Link(Relation::new("a", "r", "b")),
            ],
            reads: vec![
                Read {
                    id: ArtifactId::from("customer:ada"),
                    version: Some(Version(2)),
                },
                Read {
                    id: ArtifactId::from("missing"),
                    version: None,
                },
            ],
            watches_reads: false,
            calls: Vec::new(),
        }];
        let decoded = decode_runs(&encode_runs(&runs)).unwrap();
        assert_eq!(format!("{runs:?}"), format!("{decoded:?}"));

        // A run on a deletion, a staleness rerun and a watching run keep their kind and flag;
        // the others encode their trigger as the three elements they always had.
        for (event, version, watches_reads) in [
            (EventKind::Deleted, 2, false),
            (EventKind::Stale, 1, true),
            (EventKind::Created, 1, true),
            (EventKind::Updated, 5, false),
        ] {
            let mut run = runs[0].clone();
            let trigger = run.trigger.as_mut().unwrap();
            trigger.event = event;
            trigger.version = Version(version);
            run.watches_reads = watches_reads;
            let encoded = encode_runs(std::slice::from_ref(&run));
            let decoded = decode_runs(&encoded).unwrap();
            assert_eq!(format!("{run:?}"), format!("{:?}", decoded[0]));
            let plain = !watches_reads && event.is_inferred();
            let mut bare = run.clone();
            bare.trigger.as_mut().unwrap().event = EventKind::inferred(Version(version));
            bare.watches_reads = false;
            assert_eq!(plain, encode_runs(&[bare]) == encoded, "{event:?} {watches_reads}");
        }
    }

    #[test]
    fn runs_without_reads_encode_as_before_reads_were_recorded() {
        /// The run encoding before reads were added.
        #[derive(Serialize)]
        struct OldRun<'a> {
            agent: Option<&'a str>,
            produce: Option<&'a str>,
            trigger: Option<(ArtifactId, Version, ContentHash)>,
            ops: Vec<OpRepr<'a>>,
        }
        let old = rmp_serde::to_vec(&vec![OldRun {
            agent: Some("a"),
            produce: Some("p"),
            trigger: None,
            ops: vec![OpRepr::Delete {
                id: ArtifactId::from("x"),
            }],
        }])
        .unwrap();
        let decoded = decode_runs(&old).unwrap();
        assert!(decoded[0].reads.is_empty());
        assert_eq!(encode_runs(&decoded), old);
    }

    #[test]
    fn a_checkpoint_body_round_trips_the_state_and_the_queue() {
        use crate::model::event::EventKind;
        let mut state = State::default();
        for (i, id) in ["receipt:1", "receipt:2", "receipt:3"].into_iter().enumerate() {
            let bytes = crate::model::artifact::encode(&Receipt { total: i as u32 }).unwrap();
            let created = state.next_created();
            state.put(
                &ArtifactId::from(id),
                Some(Arc::new(Stored {
                    id: ArtifactId::from(id),
                    kind: Kind::of::<Receipt>(),
                    version: Version(i as u64 + 1),
                    hash: hash::content_hash(&bytes),
                    generation: Generation(7),
                    created,
                    bytes: Arc::from(bytes),
                })),
            );
        }
        state.set_relation(&Relation::new("receipt:1", "next", "receipt:2"), true);
        let events = vec![QueuedEvent {
            seq: 41,
            event: Event {
                kind: EventKind::Updated,
                id: ArtifactId::from("receipt:3"),
                artifact_kind: Kind::of::<Receipt>(),
                version: Version(3),
                generation: Generation(7),
            },
            deleted: None,
        }];
        let plain = encode_checkpoint(&state, 42, &events, &Readers::default());
        let body = decode_checkpoint(&plain).unwrap();
        assert!(body.state.difference(&state).is_none());
        assert_eq!(body.state.state_hash(), state.state_hash());
        assert_eq!(body.next_event_seq, 42);
        assert_eq!(body.events.len(), 1);
        assert_eq!((body.events[0].seq, &body.events[0].event), (41, &events[0].event));
        assert!(body.events[0].deleted.is_none());
        assert!(decode_checkpoint(b"\x93\x01").is_err());

        // A queued deletion keeps the version deleted; a body without any encodes as before.
        let bytes = crate::model::artifact::encode(&Receipt { total: 9 }).unwrap();
        let gone = Arc::new(Stored {
            id: ArtifactId::from("receipt:9"),
            kind: Kind::of::<Receipt>(),
            version: Version(2),
            hash: hash::content_hash(&bytes),
            generation: Generation(6),
            created: 0,
            bytes: Arc::from(bytes),
        });
        let mut with_deletion = events.clone();
        with_deletion.push(QueuedEvent {
            seq: 42,
            event: Event {
                kind: EventKind::Deleted,
                id: ArtifactId::from("receipt:9"),
                artifact_kind: Kind::of::<Receipt>(),
                version: Version(2),
                generation: Generation(7),
            },
            deleted: Some(gone.clone()),
        });
        let encoded = encode_checkpoint(&state, 43, &with_deletion, &Readers::default());
        assert!(encoded.len() > plain.len());
        let body = decode_checkpoint(&encoded).unwrap();
        assert!(body.events[0].deleted.is_none());
        let back = body.events[1].deleted.as_ref().expect("the version deleted is kept");
        assert_eq!(
            (&back.id, back.version, back.hash, back.generation, &back.bytes[..]),
            (&gone.id, gone.version, gone.hash, gone.generation, &gone.bytes[..])
        );
    }
}

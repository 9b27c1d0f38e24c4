//! The bytes a commit's hash covers, written without serde's machinery.
//!
//! A commit hash is the SHA-256 of `reactifact/commit/v2` and rmp-serde's named-field encoding
//! of the tuple `(parent, generation, state_hash, events_consumed, runs[, merged])` (commits
//! written before the number of events consumed was covered have the hash of
//! `reactifact/commit/v1` and the tuple without it, which verification still accepts for
//! them). Serde writes that encoding
//! a few bytes at a time through a chain of generic calls, several times the cost of the
//! hashing itself for a commit of many small runs. This module writes the same bytes directly
//! for the shapes every generation has — the header, the run records, their triggers and their
//! `Put` and `Act` operations — and hands the rest (deletions, relations, reads, calls, an
//! event kind a trigger records) to rmp-serde. The bytes are rmp-serde's exactly: the tests
//! compare the two encodings on every shape, so no recorded hash changes.

use serde::Serialize;

use crate::model::artifact::Generation;
use crate::model::hash::{CommitHash, StateHash};
use crate::model::patch::{Op, PutMode};
use crate::state::commit::{RunRecord, TriggerRef};

/// Appends rmp-serde's named-field encoding of `value`.
fn serde_into(out: &mut Vec<u8>, value: &(impl Serialize + ?Sized)) {
    let mut serializer = rmp_serde::Serializer::new(out).with_struct_map();
    value
        .serialize(&mut serializer)
        .expect("commit records encode into a vector without error");
}

// The markers rmp-serde writes, through the `rmp` functions it calls. Writing to a `Vec`
// cannot fail, so their results carry no information.

fn str(out: &mut Vec<u8>, text: &str) {
    let _ = rmp::encode::write_str(out, text);
}

fn bin(out: &mut Vec<u8>, bytes: &[u8]) {
    let _ = rmp::encode::write_bin(out, bytes);
}

fn map(out: &mut Vec<u8>, len: usize) {
    let _ = rmp::encode::write_map_len(out, len as u32);
}

fn array(out: &mut Vec<u8>, len: usize) {
    let _ = rmp::encode::write_array_len(out, len as u32);
}

fn uint(out: &mut Vec<u8>, value: u64) {
    let _ = rmp::encode::write_uint(out, value);
}

fn nil(out: &mut Vec<u8>) {
    let _ = rmp::encode::write_nil(out);
}

fn optional_str(out: &mut Vec<u8>, text: Option<&str>) {
    match text {
        Some(text) => str(out, text),
        None => nil(out),
    }
}

/// The tuple's opening: everything before its runs' records. `events_consumed` is `None` for
/// the tuple of a `reactifact/commit/v1` hash, which does not hold it.
pub(crate) fn header(
    out: &mut Vec<u8>,
    parent: Option<&CommitHash>,
    generation: Generation,
    state_hash: &StateHash,
    events_consumed: Option<u64>,
    runs: usize,
    merged: bool,
) {
    array(out, 4 + usize::from(events_consumed.is_some()) + usize::from(merged));
    match parent {
        Some(parent) => bin(out, parent.as_bytes()),
        None => nil(out),
    }
    uint(out, generation.0);
    bin(out, state_hash.as_bytes());
    if let Some(events_consumed) = events_consumed {
        uint(out, events_consumed);
    }
    array(out, runs);
}

/// The tuple's closing: the merged parent of a merge commit.
pub(crate) fn trailer(out: &mut Vec<u8>, merged: Option<&CommitHash>) {
    if let Some(merged) = merged {
        bin(out, merged.as_bytes());
    }
}

/// One run record, as rmp-serde encodes `RunRecord` (its fields in declaration order, the
/// optional ones only when set).
pub(crate) fn run(out: &mut Vec<u8>, run: &RunRecord) {
    let fields =
        4 + usize::from(!run.reads.is_empty()) + usize::from(run.watches_reads) + usize::from(!run.calls.is_empty());
    map(out, fields);
    str(out, "agent");
    optional_str(out, run.agent.as_deref());
    str(out, "produce");
    optional_str(out, run.produce.as_deref());
    str(out, "trigger");
    match &run.trigger {
        Some(trigger) => self::trigger(out, trigger),
        None => nil(out),
    }
    str(out, "ops");
    array(out, run.ops.len());
    for op in &run.ops {
        self::op(out, op);
    }
    if !run.reads.is_empty() {
        str(out, "reads");
        serde_into(out, &run.reads);
    }
    if run.watches_reads {
        str(out, "watches_reads");
        serde_into(out, &true);
    }
    if !run.calls.is_empty() {
        str(out, "calls");
        serde_into(out, &run.calls);
    }
}

fn trigger(out: &mut Vec<u8>, trigger: &TriggerRef) {
    if !trigger.event.is_inferred() {
        // The event kind is a fourth field: rare enough for serde.
        serde_into(out, trigger);
        return;
    }
    map(out, 3);
    str(out, "id");
    str(out, trigger.id.as_str());
    str(out, "version");
    uint(out, trigger.version.0);
    str(out, "hash");
    bin(out, trigger.hash.as_bytes());
}

fn op(out: &mut Vec<u8>, op: &Op) {
    match op {
        Op::Put {
            mode, id, kind, hash, ..
        } => {
            // An externally tagged struct variant: `{"Put": {fields}}`; `bytes` is skipped.
            map(out, 1);
            str(out, "Put");
            map(out, 4);
            str(out, "mode");
            str(out, put_mode(*mode));
            str(out, "id");
            str(out, id.as_str());
            str(out, "kind");
            str(out, kind.as_str());
            str(out, "hash");
            bin(out, hash.as_bytes());
        }
        Op::Act { key, action, hash, .. } => {
            // `bytes` and `payload` are skipped.
            map(out, 1);
            str(out, "Act");
            map(out, 4);
            str(out, "key");
            str(out, key.as_str());
            str(out, "action");
            str(out, action);
            str(out, "id");
            str(out, key.id().as_str());
            str(out, "hash");
            bin(out, hash.as_bytes());
        }
        other => serde_into(out, other),
    }
}

/// A unit variant encodes as its name.
fn put_mode(mode: PutMode) -> &'static str {
    match mode {
        PutMode::Create => "Create",
        PutMode::Upsert => "Upsert",
        PutMode::CreateOnce => "CreateOnce",
        PutMode::Update => "Update",
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::model::action::ActionKey;
    use crate::model::artifact::{ArtifactId, Generation, Kind, Version};
    use crate::model::call::{CallOutcome, RecordedCall, Usage};
    use crate::model::event::EventKind;
    use crate::model::hash::{content_hash, CommitHash, StateHash};
    use crate::model::patch::{Op, PutMode};
    use crate::model::relation::Relation;
    use crate::state::commit::{Commit, Read, RunRecord, TriggerRef};

    /// Texts across every length marker of a MessagePack string: fixstr, str 8, str 16, str 32.
    fn text(len: usize) -> String {
        "abcdefghijklmnopqrstuvwxyz".chars().cycle().take(len).collect()
    }

    fn put(mode: PutMode, id: &str) -> Op {
        Op::Put {
            mode,
            id: ArtifactId::from(id),
            kind: Kind::intern("receipt"),
            hash: content_hash(id.as_bytes()),
            bytes: Arc::from(&b"\x80"[..]),
        }
    }

    fn act(key: &str, action: &str) -> Op {
        let key = ActionKey::from(key);
        Op::Act {
            key,
            action: Arc::from(action),
            hash: content_hash(b"pending"),
            bytes: Arc::from(&b"\x80"[..]),
            payload: crate::model::action::Payload::from(&b"\xc0"[..]),
        }
    }

    fn trigger(version: u64, event: EventKind) -> TriggerRef {
        TriggerRef {
            id: ArtifactId::from("order:1"),
            version: Version(version),
            hash: content_hash(b"order"),
            event,
        }
    }

    fn run(trigger: Option<TriggerRef>, ops: Vec<Op>) -> RunRecord {
        RunRecord {
            agent: trigger.as_ref().map(|_| Arc::from("billing")),
            produce: trigger.as_ref().map(|_| Arc::from("process_order")),
            trigger,
            ..RunRecord::direct(ops)
        }
    }

    /// Every shape a record takes, each field at the edges of its encoding.
    fn records() -> Vec<RunRecord> {
        let relation = Relation::new("order:1", "billed_by", "receipt:1");
        let mut records = vec![
            RunRecord::direct(Vec::new()),
            RunRecord::direct(vec![put(PutMode::Create, "order:1")]),
            run(Some(trigger(1, EventKind::Created)), Vec::new()),
            run(
                Some(trigger(2, EventKind::Updated)),
                vec![put(PutMode::Upsert, "receipt:1"), act("notify:order:1", "notify")],
            ),
            run(
                Some(trigger(127, EventKind::Created)),
                vec![put(PutMode::CreateOnce, "x")],
            ),
            run(Some(trigger(128, EventKind::Deleted)), vec![put(PutMode::Update, "x")]),
            run(Some(trigger(u64::from(u16::MAX) + 1, EventKind::Stale)), Vec::new()),
            run(Some(trigger(u64::MAX, EventKind::Updated)), Vec::new()),
            run(
                Some(trigger(3, EventKind::Updated)),
                vec![
                    Op::Delete {
                        id: ArtifactId::from("gone"),
                    },
                    Op::Link(relation.clone()),
                    Op::Unlink(relation),
                ],
            ),
        ];
        for len in [0, 31, 32, 255, 256, 65_535, 65_536] {
            let long = text(len);
            let mut record = run(
                Some(TriggerRef {
                    id: ArtifactId::from(long.as_str()),
                    ..trigger(1, EventKind::Created)
                }),
                vec![put(PutMode::Create, &long), act(&long, &long)],
            );
            record.agent = Some(Arc::from(long.as_str()));
            records.push(record);
        }
        for ops in [15, 16, 65_535, 65_536] {
            records.push(RunRecord::direct(
                (0..ops).map(|i| put(PutMode::Create, &format!("a:{i}"))).collect(),
            ));
        }
        let mut reads = run(Some(trigger(1, EventKind::Created)), vec![act("k", "notify")]);
        reads.reads = vec![
            Read {
                id: ArtifactId::from("customer:1"),
                version: Some(Version(4)),
            },
            Read {
                id: ArtifactId::from("missing"),
                version: None,
            },
        ];
        records.push(reads.clone());
        let mut watching = reads;
        watching.watches_reads = true;
        watching.calls = vec![
            RecordedCall {
                name: Arc::from("llm"),
                request: content_hash(b"request"),
                outcome: CallOutcome::Answered {
                    hash: content_hash(b"answer"),
                    bytes: Arc::from(&b"\xa6answer"[..]),
                },
                usage: Usage::tokens(12, 34),
                model: Some(Arc::from("gpt-4o-mini")),
            },
            RecordedCall {
                name: Arc::from("reactifact.now"),
                request: content_hash(b""),
                outcome: CallOutcome::Failed {
                    error: "timeout".into(),
                },
                usage: Usage::ZERO,
                model: None,
            },
        ];
        records.push(watching.clone());
        watching.reads.clear();
        records.push(watching);
        records
    }

    #[test]
    fn the_encoding_is_rmp_serdes_byte_for_byte() {
        let records = records();
        let parent = CommitHash(*content_hash(b"parent").as_bytes());
        let merged = CommitHash(*content_hash(b"merged").as_bytes());
        let state = StateHash(*content_hash(b"state").as_bytes());
        for record in &records {
            let mut ours = Vec::new();
            super::run(&mut ours, record);
            let theirs = rmp_serde::to_vec_named(record).unwrap();
            assert!(ours == theirs, "record {record:?} encodes differently");
        }
        // The header's shapes on small commits, then every record in one commit (its runs
        // straddle the hasher's buffer); each with the count of events consumed at the edges
        // of its encoding, and without it (a `reactifact/commit/v1` hash).
        let small: Vec<RunRecord> = records.iter().filter(|r| r.ops.len() < 100).cloned().collect();
        let counts = [None, Some(0), Some(127), Some(128), Some(65_536), Some(usize::MAX)];
        for generation in [0, 1, 127, 128, 65_536, u64::MAX] {
            for parent in [None, Some(&parent)] {
                for merged in [None, Some(&merged)] {
                    for runs in [&small[..0], &small[..1], &small[..15], &small[..16]] {
                        for consumed in counts {
                            let generation = Generation(generation);
                            let ours = match consumed {
                                Some(n) => Commit::compute_hash(parent, merged, generation, &state, n, runs),
                                None => Commit::compute_hash_v1(parent, merged, generation, &state, runs),
                            };
                            assert_eq!(
                                ours,
                                Commit::compute_hash_with_serde(parent, merged, generation, &state, consumed, runs),
                                "generation {generation:?}, {} runs, parent {parent:?}, merged {merged:?}, \
                                 consumed {consumed:?}",
                                runs.len()
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(
            Commit::compute_hash(Some(&parent), None, Generation(9), &state, 3, &records),
            Commit::compute_hash_with_serde(Some(&parent), None, Generation(9), &state, Some(3), &records),
        );
        assert_eq!(
            Commit::compute_hash_v1(Some(&parent), None, Generation(9), &state, &records),
            Commit::compute_hash_with_serde(Some(&parent), None, Generation(9), &state, None, &records),
        );
    }

    /// [`Commit::compute_hash`] of the commit of `a_commits_hash_is_the_one_recorded_before_the_encoder`.
    const V2_HASH: &str = "cfccfc498969eb3c15c801a18123c85ce0882921ae818fbfd89094c561700db0";

    #[test]
    fn a_commits_hash_is_the_one_recorded_before_the_encoder() {
        // Computed through rmp-serde (`compute_hash_with_serde`, the code before this module):
        // a change that moved both encodings at once — a field renamed or reordered, another
        // rmp-serde — still fails here, as it would fail every recorded log's verification.
        let runs = vec![
            RunRecord::direct(vec![put(PutMode::Create, "order:1")]),
            run(
                Some(trigger(1, EventKind::Created)),
                vec![put(PutMode::Create, "receipt:1"), act("notify:order:1", "notify")],
            ),
        ];
        let state = StateHash(*content_hash(b"state").as_bytes());
        let hash = Commit::compute_hash_v1(None, None, Generation(2), &state, &runs);
        assert_eq!(
            hash.to_string(),
            "2b654bf4c760a57dbf024cc9aacf63799f8974d5f66c449fb31acf922b5fcc75"
        );
        // The hash that covers the events consumed, as first computed: pinned the same way.
        let hash = Commit::compute_hash(None, None, Generation(2), &state, 1, &runs);
        assert_eq!(hash.to_string(), V2_HASH);
        assert_ne!(
            hash,
            Commit::compute_hash(None, None, Generation(2), &state, 2, &runs),
            "the count is in the hash"
        );
    }
}

//! The produce-scoped write buffer.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Serialize;

use crate::model::action::{ActionKey, ActionMeta, PendingAction};
use crate::model::artifact::{self, Artifact, ArtifactId, Kind, Version};
use crate::model::hash::content_hash;
use crate::model::patch::{EffectError, Op, PutMode};
use crate::model::relation::Relation;
use crate::model::timer::Timer;
use crate::run::calls::{CallLog, Journal};
use crate::state::commit::Read;
use crate::state::snapshot::{ReadLog, Snapshot};

/// Marks `Self` as an output that produce `P` declared.
///
/// `#[produce(Receipt, also_creates = [PendingAction])]` implements it for `Receipt` and
/// `PendingAction` with `P` the produce, so writing any other type through that produce's
/// [`Effects`] is a compile error. [`Dynamic`] accepts every type and leaves the check to the
/// runtime, which validates every patch against the produce's declared outputs before anything
/// is applied.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a declared output of produce `{P}`",
    label = "produce `{P}` does not declare `{Self}`",
    note = "declare it on the produce: `#[produce(.., also_creates = [{Self}])]`"
)]
pub trait DeclaredOutput<P>: Artifact {}

/// Declarations checked at run time rather than compile time: every type is accepted by
/// [`Effects<Dynamic>`], and the runtime rejects a patch that creates an undeclared kind.
/// Produces built with [`Produce::new`](crate::Produce::new) use it.
#[derive(Debug)]
pub enum Dynamic {}

impl<T: Artifact> DeclaredOutput<Dynamic> for T {}

#[derive(Default)]
pub(crate) struct Buffer {
    pub(crate) ops: Vec<Op>,
    /// The first effect error (boxed: a buffer is built for every run, and it is rare).
    pub(crate) error: Option<Box<EffectError>>,
    /// What the run read through its snapshot, in read order (repeats removed at seal).
    reads: Vec<Read>,
    /// Keys acted in this run, so a second `act` of a key is found without a scan.
    acted: ActedKeys,
    sealed: bool,
    /// The run's recorded calls (see `run/calls.rs`), once there is something to keep.
    pub(crate) calls: Option<Box<CallLog>>,
    /// The calls were taken: later ones are refused.
    pub(crate) calls_taken: bool,
    /// Where the answers of the calls the run makes are kept before its generation commits
    /// (a durable context's runs only).
    pub(crate) journal: Option<Arc<Journal>>,
}

impl ReadLog for Mutex<Buffer> {
    fn record_read(&self, id: ArtifactId, version: Option<Version>) {
        self.lock().unwrap_or_else(|e| e.into_inner()).record_read(id, version);
    }
}

/// The keys a run acted: the first two in place (most runs act once or twice, and allocate
/// nothing for them), the rest in a set.
#[derive(Default)]
struct ActedKeys {
    first: [Option<ActionKey>; 2],
    more: foldhash::HashSet<ActionKey>,
}

impl ActedKeys {
    /// Adds `key`; false if it was there already.
    fn insert(&mut self, key: &ActionKey) -> bool {
        for slot in &mut self.first {
            match slot {
                Some(acted) if acted == key => return false,
                Some(_) => {}
                None => {
                    *slot = Some(key.clone());
                    return true;
                }
            }
        }
        self.more.insert(key.clone())
    }
}

/// What a sealed buffer hands back: the run's patch, its reads and the first effect error.
pub(crate) struct Sealed {
    pub(crate) ops: Vec<Op>,
    pub(crate) reads: Vec<Read>,
    pub(crate) error: Option<EffectError>,
}

impl Buffer {
    /// The buffer of a run whose calls start from `calls` (see `CallLog::live`), with room
    /// for `ops` operations.
    pub(crate) fn new(calls: Option<CallLog>, ops: usize) -> Arc<Mutex<Buffer>> {
        Arc::new(Mutex::new(Buffer {
            ops: Vec::with_capacity(ops),
            calls: calls.map(Box::new),
            ..Buffer::default()
        }))
    }

    /// Whether the run has finished: later writes, reads and calls are refused.
    pub(crate) fn is_sealed(&self) -> bool {
        self.sealed
    }

    /// Records a read of `id` at `version` made through the run's snapshot; ignored once the
    /// run has finished.
    pub(crate) fn record_read(&mut self, id: ArtifactId, version: Option<Version>) {
        if !self.sealed && self.reads.last().is_none_or(|last| last.id != id) {
            self.reads.push(Read { id, version });
        }
    }

    /// Takes the recorded operations and reads; later writes and reads are refused.
    pub(crate) fn seal(&mut self) -> Sealed {
        self.sealed = true;
        let mut ops = std::mem::take(&mut self.ops);
        // The commit log keeps the ops for the life of the context: no spare capacity.
        ops.shrink_to_fit();
        let mut reads = std::mem::take(&mut self.reads);
        if reads.len() > 1 {
            let mut seen = foldhash::HashSet::default();
            reads.retain(|read| seen.insert(read.id.clone()));
        }
        reads.shrink_to_fit();
        Sealed {
            ops,
            reads,
            error: self.error.take().map(|e| *e),
        }
    }
}

/// The write buffer of one produce run: what the produce wants to change.
///
/// Nothing here touches the context. Each call appends an operation to the produce's patch;
/// the runtime validates the patches of a generation and commits them together. Methods take
/// `&self`, so they can be called from anywhere in the produce's body.
///
/// An encoding failure is reported when the run is collected and fails the run, so the
/// methods need no `?`. The type parameter `D` names the produce's declarations; see
/// [`DeclaredOutput`].
pub struct Effects<D = Dynamic> {
    buffer: Arc<Mutex<Buffer>>,
    snapshot: Snapshot,
    _declared: PhantomData<fn() -> D>,
}

impl<D> Effects<D> {
    pub(crate) fn new(buffer: Arc<Mutex<Buffer>>, snapshot: Snapshot) -> Self {
        Effects {
            buffer,
            snapshot,
            _declared: PhantomData,
        }
    }

    fn push(&self, op: Result<Op, EffectError>) {
        let mut buffer = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        if buffer.sealed {
            let id = match &op {
                Ok(op) => op.id().clone(),
                Err(_) => ArtifactId::from(""),
            };
            tracing::warn!(artifact_id = %id, "effects used after the produce run finished; write dropped");
            return;
        }
        match op {
            Ok(op) => buffer.ops.push(op),
            Err(e) => {
                if buffer.error.is_none() {
                    buffer.error = Some(Box::new(e));
                }
            }
        }
    }

    fn put<T: Artifact>(&self, mode: PutMode, id: impl Into<ArtifactId>, value: &T) {
        self.push(Op::put(mode, id.into(), value));
    }

    /// Creates the artifact, or refreshes it if the id exists at commit time: a new version
    /// only if the content hash differs. Re-running a produce therefore creates nothing twice.
    pub fn create<T: DeclaredOutput<D>>(&self, id: impl Into<ArtifactId>, value: T) {
        self.put(PutMode::Create, id, &value);
    }

    /// Creates or replaces the artifact; equal content is a no-op.
    pub fn upsert<T: DeclaredOutput<D>>(&self, id: impl Into<ArtifactId>, value: T) {
        self.put(PutMode::Upsert, id, &value);
    }

    /// Creates the artifact only if the id does not exist at commit time.
    pub fn create_once<T: DeclaredOutput<D>>(&self, id: impl Into<ArtifactId>, value: T) {
        self.put(PutMode::CreateOnce, id, &value);
    }

    /// Replaces an existing artifact. An id that does not exist at commit time fails the
    /// commit; equal content is a no-op (no version, no event). Updating needs no declaration.
    pub fn update<T: Artifact>(&self, id: impl Into<ArtifactId>, value: T) {
        self.put(PutMode::Update, id, &value);
    }

    /// Deletes the artifact and every relation touching it; a missing id is a no-op.
    pub fn delete(&self, id: impl Into<ArtifactId>) {
        self.push(Ok(Op::Delete { id: id.into() }));
    }

    /// Adds the relation `from -[name]-> to`; both must exist at commit time.
    pub fn link(&self, from: impl Into<ArtifactId>, name: &str, to: impl Into<ArtifactId>) {
        self.push(Ok(Op::Link(Relation::new(from, name, to))));
    }

    /// Removes the relation `from -[name]-> to`, if present.
    pub fn unlink(&self, from: impl Into<ArtifactId>, name: &str, to: impl Into<ArtifactId>) {
        self.push(Ok(Op::Unlink(Relation::new(from, name, to))));
    }

    /// Records an intent: a [`PendingAction`] of `kind` with idempotency `key` and `payload`,
    /// stored at `action:{key}` and delivered by the outbox after the commit.
    ///
    /// Returns `None`, recording nothing, when the intent already exists in the snapshot this
    /// produce reads (or was already acted in this run); the commit also skips it if another
    /// produce of the same generation recorded it first. If `action:{key}` holds an artifact
    /// of another kind, the intent is not dropped: the commit refuses it with
    /// [`CommitError::ActionIdTaken`](crate::CommitError::ActionIdTaken), failing the run.
    /// Derive `key` from stable content (an order id, a content hash), never from the clock or
    /// a random number, so that a retry, a replay or another branch derives the same key.
    pub fn act<P: Serialize + ?Sized>(&self, kind: &str, key: impl Into<ActionKey>, payload: &P) -> Option<ActionKey>
    where
        PendingAction: DeclaredOutput<D>,
    {
        self.act_as(kind, key.into(), payload, &ActionMeta::default())
    }

    /// Records an intent, like [`act`](Effects::act), that an operator must approve before it
    /// is delivered: it is committed with the state that justified it, and registered in the
    /// delivery ledger as [`AwaitingApproval`](crate::DeliveryStatus::AwaitingApproval) —
    /// never claimed, never handed to a dispatcher — until
    /// [`Runtime::approve`](crate::Runtime::approve) (or `reactifact outbox approve`) makes it
    /// pending; after [`Runtime::reject`](crate::Runtime::reject) it is never delivered.
    ///
    /// That it needs approval is part of the hashed `PendingAction`
    /// ([`PendingAction::requires_approval`]), so a retry, a replay or another branch
    /// re-derives the same decision. A key already acted (with or without approval) is not
    /// acted again: the first decision stands.
    pub fn act_with_approval<P: Serialize + ?Sized>(
        &self,
        kind: &str,
        key: impl Into<ActionKey>,
        payload: &P,
    ) -> Option<ActionKey>
    where
        PendingAction: DeclaredOutput<D>,
    {
        let meta = ActionMeta {
            requires_approval: true,
            ..ActionMeta::default()
        };
        self.act_as(kind, key.into(), payload, &meta)
    }

    /// An intent to record with options: `effects.intent(kind, key, &payload)`, then
    /// [`not_before`](IntentBuilder::not_before) or
    /// [`with_approval`](IntentBuilder::with_approval), then [`act`](IntentBuilder::act),
    /// which records it as [`Effects::act`] does.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use reactifact_core::{Effects, PendingAction};
    /// # fn remind(effects: &Effects, order_id: u64, placed_at: SystemTime) {
    /// // The reminder goes out a day after the order was placed (a time in the trigger's
    /// // data, so a retry or a replay derives the same intent), not before.
    /// effects
    ///     .intent("email", format!("reminder:{order_id}"), &order_id)
    ///     .not_before(placed_at + Duration::from_secs(24 * 3600))
    ///     .act();
    /// # }
    /// ```
    pub fn intent<'a, P: Serialize + ?Sized>(
        &'a self,
        kind: &'a str,
        key: impl Into<ActionKey>,
        payload: &'a P,
    ) -> IntentBuilder<'a, D, P>
    where
        PendingAction: DeclaredOutput<D>,
    {
        IntentBuilder {
            effects: self,
            kind,
            key: key.into(),
            payload,
            meta: ActionMeta::default(),
        }
    }

    fn act_as<P: Serialize + ?Sized>(
        &self,
        kind: &str,
        key: ActionKey,
        payload: &P,
        meta: &ActionMeta,
    ) -> Option<ActionKey> {
        let id = key.artifact_id();
        // Checked before anything is encoded: on a re-run the intent usually exists.
        if let Some((kind, _, _)) = self.snapshot.meta(id.as_str()) {
            if kind == Kind::of::<PendingAction>() {
                return None;
            }
            // Another kind under the intent's id: the commit refuses the act, naming it.
        }
        {
            let mut buffer = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
            if !buffer.sealed && !buffer.acted.insert(&key) {
                return None;
            }
        }
        self.push(Op::act_as(kind, key.clone(), payload, meta));
        Some(key)
    }

    /// Schedules a wake-up: a [`Timer`] at `timer:{key}`, due at `at` with `payload`. When the
    /// runtime's clock ([`Runtime::now`](crate::Runtime::now)) reaches `at`, the runtime
    /// commits the timer as fired, and the produces triggered by `Timer` run on it in the next
    /// generation (see `docs/concepts.md`, "Timers"). Returns the timer's id, or `None` when
    /// nothing was recorded.
    ///
    /// Scheduling a key again with another time or payload reschedules it (an upsert: it is
    /// pending again, due at the new time, even if it had fired). Scheduling it again with the
    /// same time and payload records nothing — whether the timer is pending or already fired —
    /// so a produce that runs again (on a later version of its trigger, on another branch)
    /// never re-arms a timer that fired. `at` is clamped to the times a timer keeps: from the
    /// Unix epoch (due at once) to the end of the year 9999 (never, in practice).
    ///
    /// Derive `at` from something a retry and a replay see again — the trigger's data (a time
    /// written into it from outside), or the time of the timer that triggered this run
    /// ([`Timer::after`]) — never from the clock read inside the produce.
    ///
    /// The produce declares `Timer` (`#[produce(.., also_creates = [Timer])]`, or
    /// [`Produce::creates::<Timer>()`](crate::Produce::creates) for one built by hand): without
    /// it the call is a compile error, or, through [`Dynamic`], a run failure.
    pub fn wake_at<P: Serialize + ?Sized>(
        &self,
        at: SystemTime,
        key: impl AsRef<str>,
        payload: &P,
    ) -> Option<ArtifactId>
    where
        Timer: DeclaredOutput<D>,
    {
        let key = key.as_ref();
        let id = Timer::id_of(key);
        let timer = match Timer::new(key, at, payload) {
            Ok(timer) => timer,
            Err(source) => {
                self.push(Err(EffectError::Encode {
                    id,
                    kind: Kind::of::<Timer>(),
                    source,
                }));
                return None;
            }
        };
        if let Some((kind, _, hash)) = self.snapshot.meta(id.as_str()) {
            if kind == Kind::of::<Timer>() {
                let fired = Timer {
                    fired: true,
                    ..timer.clone()
                };
                let same = [&timer, &fired]
                    .into_iter()
                    .any(|t| artifact::encode(t).is_ok_and(|bytes| content_hash(&bytes) == hash));
                if same {
                    return None;
                }
            }
        }
        self.put(PutMode::Upsert, id.clone(), &timer);
        Some(id)
    }

    /// Cancels the wake-up scheduled under `key`: deletes `timer:{key}` (a missing timer is a
    /// no-op). Needs no declaration, as deletes do not.
    pub fn cancel_wake(&self, key: impl AsRef<str>) {
        self.delete(Timer::id_of(key.as_ref()));
    }

    /// The snapshot this produce reads: the state before its generation.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }
}

impl<D> std::fmt::Debug for Effects<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let buffer = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Effects").field("ops", &buffer.ops.len()).finish()
    }
}

/// An intent with options, recorded by [`act`](IntentBuilder::act): [`Effects::intent`].
#[must_use = "an intent is recorded only by `act`"]
pub struct IntentBuilder<'a, D, P: ?Sized> {
    effects: &'a Effects<D>,
    kind: &'a str,
    key: ActionKey,
    payload: &'a P,
    meta: ActionMeta,
}

impl<D, P: Serialize + ?Sized> IntentBuilder<'_, D, P> {
    /// Not delivered before `at`: the intent is registered pending, due at `at` (at once if
    /// `at` has passed), so no drain claims it earlier; it survives restarts like any intent,
    /// is listed with its due time (`reactifact outbox list`), and can be cancelled until it
    /// is delivered. With [`with_approval`](IntentBuilder::with_approval), an approval before
    /// `at` leaves it due at `at`.
    ///
    /// `at` is part of the hashed `PendingAction` ([`PendingAction::not_before`], in whole
    /// milliseconds, rounded up), so derive it from something a retry and a replay see again —
    /// a time in the trigger's data — never from the clock read inside the produce. Times
    /// before the Unix epoch are the epoch; times past the year 9999 are then.
    pub fn not_before(mut self, at: SystemTime) -> Self {
        let at =
            crate::model::delivery::ceil_millis(at.min(SystemTime::UNIX_EPOCH + crate::model::delivery::FAR_FUTURE));
        self.meta.not_before = Some(crate::model::delivery::unix_millis(at));
        self
    }

    /// Puts the intent in the ordering group `group` (say `order:42`): the intents of one
    /// group are handed out one at a time, in the order they were committed, across every
    /// drain and process of the store — the next only once the one before is final
    /// (delivered, cancelled or rejected). Until then it is
    /// [`Blocked`](crate::ledger::DeliveryStatus::Blocked). A dead intent blocks its group
    /// until an operator retries it (delivered in place, in order) or cancels it (skipped).
    /// Intents of other groups, and those without one, keep the full concurrency.
    ///
    /// The group is part of the hashed `PendingAction` ([`PendingAction::group`]). An empty
    /// name fails the run ([`EffectError::EmptyGroup`](crate::error::EffectError::EmptyGroup)).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.meta.group = Some(group.into());
        self
    }

    /// Waits for an operator's approval before delivery, as
    /// [`Effects::act_with_approval`] does.
    pub fn with_approval(mut self) -> Self {
        self.meta.requires_approval = true;
        self
    }

    /// Records the intent, as [`Effects::act`] does: `None`, recording nothing, when the key
    /// was already acted (the first decision, with its options, stands).
    pub fn act(self) -> Option<ActionKey> {
        self.effects.act_as(self.kind, self.key, self.payload, &self.meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::artifact::Generation;
    use crate::state::commit::tests::raw_put;
    use crate::state::commit::Apply;
    use crate::state::live::State;

    #[test]
    fn an_act_over_another_kind_in_the_snapshot_is_recorded_for_the_commit_to_refuse() {
        let mut state = State::default();
        let mut apply = Apply::new(&mut state, Generation(1));
        apply.patch(&[raw_put("action:k1", "order", &("ada", 1u32))]).unwrap();
        apply.finish();
        let buffer = Arc::new(Mutex::new(Buffer::default()));
        let effects: Effects = Effects::new(buffer.clone(), Snapshot::new(state.clone()));
        assert_eq!(effects.act("notify", "k1", &"payload"), Some(ActionKey::from("k1")));
        let sealed = buffer.lock().unwrap().seal();
        assert!(matches!(&sealed.ops[..], [Op::Act { key, .. }] if key.as_str() == "k1"));
    }

    #[test]
    fn acted_keys_find_a_repeat_in_place_and_in_the_set() {
        let mut acted = ActedKeys::default();
        let keys: Vec<ActionKey> = (0..5).map(|i| ActionKey::from(format!("k{i}"))).collect();
        for key in &keys {
            assert!(acted.insert(key), "{key} is new");
        }
        assert_eq!(acted.more.len(), 3, "the first two stay in place");
        for key in keys.iter().rev() {
            assert!(!acted.insert(&ActionKey::from(key.as_str())), "{key} again");
        }
    }
}

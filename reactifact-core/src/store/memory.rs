//! The in-memory outbox: the delivery ledger of a context that has no durable store, shared by
//! the context and its forks through an `Arc`.
//!
//! Every operation runs synchronously under one [`Mutex`], which is never held across an
//! await: the futures the [`OutboxStore`] methods return do all their work in their first
//! poll. The costs, with `n` the entries of the ledger:
//!
//! - *register*, *record*, *renew*, *retry*, *cancel*, *approve*, *reject*: O(1) amortised
//!   per intent (plus one
//!   step per session an intent is attached to);
//! - *claim*: O(1) amortised per claimed intent, plus one step per expired lease it reclaims
//!   and per stale queue item it skips. Due intents wait in one queue per (session, kind) pair
//!   a claim has asked for (the session or the kind may be "any"), ordered by due time and then
//!   registration order. A queue is built from the ledger the first time a scope needs it
//!   (O(n log n), once), and kept up to date from then on, so a claim for session `S` never
//!   walks other sessions' due entries. A scope naming several sessions or kinds merges their
//!   queues: O(sessions × kinds) per claimed intent;
//! - *purge*: O(log n) per purged entry (final entries wait in order of their last change,
//!   delivered, cancelled and rejected ones apart);
//! - *attempts*: O(attempts of the key);
//! - *lease owners* and *take over*: O(intents in flight) (times the distinct owners, for the
//!   list of owners), plus O(1) amortised per intent taken over;
//! - *counts*: O(1) for the whole ledger, one session, or a set of kinds (per-status counters
//!   are kept for each); O(n) for any other scope;
//! - *next_due*: like a claim of one intent, plus the in-flight leases it skips until the
//!   first in scope;
//! - *list*: O(entries scanned from the cursor).
//!
//! Queue items are invalidated lazily: an entry leaving the due state is not looked up in the
//! queues; its items are skipped when they come to the front, and a queue that has grown to
//! twice its live length is compacted (amortised O(1) per push).
//!
//! Memory: an entry takes 192 bytes (its intent's parts and its state, not a whole
//! [`Delivery`]: the one a caller receives is built from it) and 8 bytes in the key index,
//! besides its key, its payload (shared with the committed `PendingAction`) and what it
//! rarely has (an error, a decision, attached sessions, the history of attempts that ended
//! other than delivered: one pointer while empty). Beside the entries: 16 bytes per final
//! entry until it is purged (the purge order), about 16 bytes per intent in flight (their
//! positions by key, so that a record finds its entry without probing the whole ledger's
//! index), and, while some intent is always in flight, 4 bytes per claim or renewal made
//! within one lease duration (the expiry index is cleared whenever nothing is in flight). A
//! purged entry leaves its key behind (its tombstone), so that the key is never registered
//! again. Each entry keeps its last claim (its lease while in flight; a delivered attempt is
//! read from it: no allocation on the delivery path).
//!
//! Times are kept in whole milliseconds, like every store: a time passed in is truncated to
//! its millisecond, except a retry time, which is rounded up (never early).

use std::collections::{btree_map, BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use foldhash::{HashMap, HashSet};
use hashbrown::HashTable;

use crate::model::action::{ActionKey, Intent, Origin, Payload};
use crate::model::delivery::{
    from_unix_millis, later, unix_millis, Attempt, AttemptOutcome, Decision, Delivery, DeliveryStatus, FenceToken,
    Lease, NewIntent, Remarks, Verdict, ATTEMPTS_KEPT,
};
use crate::model::hash::ContentHash;
use crate::model::outcome::{due_at, LastError};
use crate::model::rate::{RateSpend, RateState};
use crate::model::trace::TraceParent;
use crate::model::turn;
use crate::store::outbox::{
    check_decision, ApprovalError, BoxFuture, CancelError, ClaimRequest, Claimed, LedgerQuery, OutboxStore, Page,
    PurgeFilter, Recorded, Recording, RetryError, Scope, StatusCounts,
};
use crate::store::StoreError;

/// The position of an entry in registration order.
type Pos = u32;

/// A key's hash as [`Inner::index`] keeps it (32 bits), widened for the table: its top bits,
/// which the table compares first, and its low bits, which place it, both from the hash.
fn spread(hash: u32) -> u64 {
    (u64::from(hash) << 32) | u64::from(hash)
}

/// A queue item: (due time in Unix milliseconds, position, the entry's stamp when queued).
type Item = (u64, Pos, u32);

/// "Any session" or "any kind" in a queue key.
const ANY: u32 = u32::MAX;

/// The outbox of a context without a durable store: the delivery ledger in memory, behind one
/// lock, implementing the whole [`OutboxStore`] contract (claims with leases and fencing
/// tokens, reclaim of expired leases, records, renewals, retry, cancel, purge and queries).
///
/// A [`Context`](crate::Context) created in memory registers the intents of each commit here
/// once the commit has succeeded; its forks share the same `MemoryOutbox`, so a key is
/// delivered once however many branches commit it. A standalone
/// [`Drainer`](crate::Drainer) can drain it too, through
/// [`Context::outbox`](crate::Context::outbox).
///
/// Nothing survives the process. The costs of its operations are in the module
/// documentation of `store/memory.rs`: claims, records and registrations are O(1) amortised
/// per intent.
pub struct MemoryOutbox {
    inner: Mutex<Inner>,
}

impl MemoryOutbox {
    /// An empty outbox.
    pub fn new() -> Arc<MemoryOutbox> {
        Arc::new(MemoryOutbox::default())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the intents of a commit made at `now`, in commit order: a key the outbox has never held is inserted pending, due at `now`, owned by the
    /// committing session (`intent.origin.session`); a key it holds, not final and owned by
    /// another session, gets the committing session as a member (attached); a final or purged
    /// key is left as it is.
    // Called by the in-memory context after each commit, and by the contract suite. Out of
    // line (one call per commit), so that a profile names it.
    #[inline(never)]
    pub(crate) fn register(&self, intents: impl ExactSizeIterator<Item = NewIntent>, now: SystemTime) {
        self.lock().register(intents, now);
    }

    /// [`register`](Self::register) for the store contract suite (crate
    /// `reactifact-store-contract`) and tests of the outbox alone. Not public API.
    #[doc(hidden)]
    pub fn register_intents(&self, intents: Vec<NewIntent>, now: SystemTime) {
        self.register(intents.into_iter(), now);
    }

    /// Every entry's key, kind and origin, in registration order (for
    /// [`MemoryStore::verify_outbox`](crate::store::MemoryStore)).
    pub(crate) fn origins(&self) -> Vec<(ActionKey, Arc<str>, Origin)> {
        let inner = self.lock();
        let kinds = &inner.kinds.names;
        let entries = inner.slots.iter().flatten();
        entries
            .map(|e| (e.key.clone(), kinds[e.kind as usize].clone(), e.origin.clone()))
            .collect()
    }

    /// Whether `key` has an entry or the tombstone of a purged one (for
    /// [`MemoryStore::verify_outbox`](crate::store::MemoryStore)).
    pub(crate) fn holds(&self, key: &str) -> bool {
        let inner = self.lock();
        inner.entry(key).is_some() || inner.purged.contains(key)
    }
}

impl Default for MemoryOutbox {
    fn default() -> Self {
        MemoryOutbox {
            inner: Mutex::new(Inner::default()),
        }
    }
}

impl fmt::Debug for MemoryOutbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("MemoryOutbox")
            .field("entries", &inner.slots.len())
            .field("counts", &inner.tally.total.counts())
            .finish()
    }
}

/// One ledger entry and what the outbox keeps beside it: what a [`Delivery`] holds, kept
/// compactly ([`Entry::delivery`] builds the `Delivery` a caller receives): times in whole
/// milliseconds, the kind as its interned id, the intent's attempt number as `attempts`, the
/// lease from the last claim while one is in flight.
struct Entry {
    key: ActionKey,
    payload: Payload,
    origin: Origin,
    trace: Option<TraceParent>,
    status: DeliveryStatus,
    /// [`Delivery::attempts`], also the intent's attempt number.
    attempts: u32,
    /// The token of the last claim (0 before the first).
    token: FenceToken,
    recorded_ms: u64,
    updated_ms: u64,
    /// When it was delivered, [`NOT_DELIVERED`] before.
    delivered_ms: u64,
    remarks: Remarks,
    // (Unlike a durable store's row, no copy of the committed `PendingAction` bytes and their
    // hash: memory cannot be tampered with, so claims never re-check them, and the state holds
    // the bytes.)
    /// The owning session's id.
    session: u32,
    /// The kind's id.
    kind: u32,
    /// Whether the committed `PendingAction` asks for approval.
    requires_approval: bool,
    /// When the entry is due, in Unix milliseconds, while it is claimable (pending, or failed
    /// with a retry scheduled); [`NOT_DUE`] otherwise (read through [`Entry::due`]).
    due_ms: u64,
    /// Bumped every time the entry is queued: queue items with an older stamp are stale.
    stamp: u32,
    /// The last claim (kept after it ended, for the attempt history: a delivered attempt is
    /// read from it); while the entry is in flight, its lease.
    last_claim: Option<LastClaim>,
    /// What most entries never have, behind one pointer (`None` while empty).
    rare: Option<Box<Rare>>,
}

/// [`Entry::due_ms`] of an entry that is not claimable. (A due time of `u64::MAX` itself, a
/// retry time saturated past the year 500,000,000, is kept one millisecond earlier.)
const NOT_DUE: u64 = u64::MAX;

/// [`Entry::delivered_ms`] of an entry not delivered. (A delivery at `u64::MAX` itself, a time
/// saturated past the year 500,000,000, is kept one millisecond earlier.)
const NOT_DELIVERED: u64 = u64::MAX;

/// An entry's last claim, as its attempt history reports it. Its fencing token is the entry's
/// (only a claim changes that), and a memory ledger keeps its times in whole milliseconds.
struct LastClaim {
    owner: Arc<str>,
    claimed_ms: u64,
    /// When its lease expires (or expired), as last renewed.
    expires_ms: u64,
}

/// The rarely set part of an [`Entry`].
#[derive(Default)]
struct Rare {
    /// The ids of the sessions the entry is attached to besides its owner's.
    members: Vec<u32>,
    /// The attempts that ended other than delivered, oldest first (at most
    /// [`ATTEMPTS_KEPT`], the latest).
    history: Vec<Attempt>,
    /// For an entry whose `PendingAction` asks for approval: its action hash, which an
    /// operator's decision records as what it approved ([`Decision::digest`]).
    action_hash: Option<ContentHash>,
}

impl Entry {
    /// The entry as a caller receives it; `kinds` are the interned kind names.
    fn delivery(&self, kinds: &Names) -> Delivery {
        let lease = match (self.status, &self.last_claim) {
            (DeliveryStatus::InFlight, Some(claim)) => Some(Lease {
                owner: claim.owner.clone(),
                expires_at: from_unix_millis(claim.expires_ms),
                token: self.token,
            }),
            _ => None,
        };
        Delivery {
            intent: Intent {
                key: self.key.clone(),
                kind: kinds.names[self.kind as usize].clone(),
                payload: self.payload.clone(),
                origin: self.origin.clone(),
                attempt: self.attempts,
                trace: self.trace,
            },
            status: self.status,
            attempts: self.attempts,
            recorded_at: from_unix_millis(self.recorded_ms),
            updated_at: from_unix_millis(self.updated_ms),
            delivered_at: self.delivered_at(),
            lease,
            token: self.token,
            remarks: self.remarks.clone(),
        }
    }

    fn delivered_at(&self) -> Option<SystemTime> {
        (self.delivered_ms != NOT_DELIVERED).then(|| from_unix_millis(self.delivered_ms))
    }

    /// When the entry is due, in Unix milliseconds, while it is claimable.
    fn due(&self) -> Option<u64> {
        (self.due_ms != NOT_DUE).then_some(self.due_ms)
    }

    fn set_due(&mut self, due: Option<u64>) {
        self.due_ms = due.map_or(NOT_DUE, |ms| ms.min(NOT_DUE - 1));
    }

    fn in_queue(&self, (session, kind): (u32, u32)) -> bool {
        (session == ANY || self.session == session || self.members().contains(&session))
            && (kind == ANY || self.kind == kind)
    }

    /// The ids of the sessions the entry is attached to besides its owner's (usually none).
    fn members(&self) -> &[u32] {
        self.rare.as_ref().map_or(&[], |r| &r.members)
    }

    /// The attempts that ended other than delivered, oldest first (usually none).
    fn history(&self) -> &[Attempt] {
        self.rare.as_ref().map_or(&[], |r| &r.history)
    }

    /// The earliest time it may be due, in Unix milliseconds (0: no such bound).
    fn not_before_ms(&self) -> u64 {
        self.remarks.not_before().map_or(0, unix_millis)
    }

    fn rare_mut(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }
}

/// Per-status counters; index by [`class`].
#[derive(Clone, Copy, Default, Debug)]
struct Counts([u64; 11]);

impl Counts {
    fn add(&mut self, other: &Counts) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    fn counts(&self) -> StatusCounts {
        let c = self.0;
        StatusCounts {
            pending: c[0],
            in_flight: c[1],
            delivered: c[2],
            failed: c[3] + c[4],
            retrying: c[4],
            dead: c[5],
            held: c[6],
            cancelled: c[7],
            awaiting_approval: c[8],
            rejected: c[9],
            blocked: c[10],
        }
    }
}

/// The counter of in-flight entries.
const IN_FLIGHT: usize = 1;

/// Which counter an entry counts in: its status, with failed ones split by whether a retry
/// is scheduled.
fn class(d: &Entry) -> usize {
    match d.status {
        DeliveryStatus::Pending => 0,
        DeliveryStatus::InFlight => IN_FLIGHT,
        DeliveryStatus::Delivered => 2,
        DeliveryStatus::Failed if d.remarks.next_attempt_at().is_some() => 4,
        DeliveryStatus::Failed => 3,
        DeliveryStatus::Dead => 5,
        DeliveryStatus::Held => 6,
        DeliveryStatus::Cancelled => 7,
        DeliveryStatus::AwaitingApproval => 8,
        DeliveryStatus::Rejected => 9,
        DeliveryStatus::Blocked => 10,
    }
}

/// The counters of the whole ledger, of each kind and of each session (owned and attached).
#[derive(Default)]
struct Tally {
    total: Counts,
    by_kind: Vec<Counts>,
    by_session: Vec<Counts>,
}

impl Tally {
    /// Moves an entry from one counter to another (`None`: not counted, before registration
    /// or after a purge).
    fn moved(&mut self, e: &Entry, from: Option<usize>, to: Option<usize>) {
        if from == to {
            return;
        }
        let sessions = std::iter::once(e.session).chain(e.members().iter().copied());
        let kind = &mut self.by_kind[e.kind as usize];
        for counts in [&mut self.total, kind] {
            shift(counts, from, to);
        }
        for s in sessions {
            shift(&mut self.by_session[s as usize], from, to);
        }
    }
}

fn shift(counts: &mut Counts, from: Option<usize>, to: Option<usize>) {
    if let Some(f) = from {
        counts.0[f] -= 1;
    }
    if let Some(t) = to {
        counts.0[t] += 1;
    }
}

/// Interned names (sessions or kinds), so that entries and queues carry small ids.
#[derive(Default)]
struct Names {
    ids: HashMap<Arc<str>, u32>,
    names: Vec<Arc<str>>,
}

impl Names {
    fn get(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    /// The id of `name`, and whether it is new.
    fn intern(&mut self, name: &Arc<str>) -> (u32, bool) {
        if let Some(&id) = self.ids.get(&**name) {
            return (id, false);
        }
        let id = u32::try_from(self.names.len()).expect("fewer than 2^32 names");
        self.ids.insert(name.clone(), id);
        self.names.push(name.clone());
        (id, true)
    }
}

/// Items ordered by (time, position): a FIFO while they come in order (the common case:
/// registration and record times grow), and an ordered set for the rest.
#[derive(Default)]
struct OrderedQueue {
    fifo: VecDeque<Item>,
    out_of_order: BTreeSet<Item>,
    /// The length after the last compaction.
    compacted: usize,
}

impl OrderedQueue {
    fn push(&mut self, item: Item) {
        match self.fifo.back() {
            Some(&(at, pos, _)) if (item.0, item.1) < (at, pos) => {
                self.out_of_order.insert(item);
            }
            _ => self.fifo.push_back(item),
        }
    }

    fn len(&self) -> usize {
        self.fifo.len() + self.out_of_order.len()
    }

    /// The smallest item, and whether it is the FIFO's.
    fn peek(&self) -> Option<(Item, bool)> {
        match (self.fifo.front(), self.out_of_order.first()) {
            (Some(&a), Some(&b)) if (b.0, b.1) < (a.0, a.1) => Some((b, false)),
            (Some(&a), _) => Some((a, true)),
            (None, Some(&b)) => Some((b, false)),
            (None, None) => None,
        }
    }

    fn pop(&mut self) -> Option<Item> {
        match self.peek()? {
            (_, true) => self.fifo.pop_front(),
            (_, false) => self.out_of_order.pop_first(),
        }
    }

    /// The first live item, dropping the stale ones before it.
    fn front(&mut self, slots: &Slots) -> Option<Item> {
        while let Some((item, _)) = self.peek() {
            if live(slots, item) {
                return Some(item);
            }
            self.pop();
        }
        None
    }

    /// Pushes `item`, compacting the queue when stale items make up more than half of it.
    fn push_live(&mut self, item: Item, slots: &Slots) {
        self.push(item);
        if self.len() > 2 * self.compacted + 64 {
            self.fifo.retain(|&it| live(slots, it));
            self.out_of_order.retain(|&it| live(slots, it));
            self.compacted = self.len();
        }
    }
}

/// The ledger's entries by position; `None` once purged.
type Slots = Chunked<Option<Entry>>;

/// A vector in chunks of a fixed size: growing never moves an element. (In one `Vec`, the
/// registration that crosses its capacity reallocates the whole ledger — 100 MB at a third of a
/// million entries — inside the commit that registers it: a copy of every entry, unless the
/// allocator happens to remap the block, as glibc does only above its mmap threshold.)
struct Chunked<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Chunked<T> {
    /// Elements a chunk holds (about 1.2 MB of ledger entries).
    const CHUNK: usize = 4096;

    fn len(&self) -> usize {
        self.len
    }

    fn push(&mut self, value: T) {
        if self.len % Self::CHUNK == 0 {
            // The first chunk grows by doubling to exactly `CHUNK`, so that a small ledger
            // stays small; a ledger that filled it gets every later chunk whole, never copied
            // (its pages are touched only as entries arrive).
            self.chunks.push(match self.len {
                0 => Vec::new(),
                _ => Vec::with_capacity(Self::CHUNK),
            });
        }
        self.chunks.last_mut().expect("a chunk with room").push(value);
        self.len += 1;
    }

    fn get(&self, pos: usize) -> Option<&T> {
        self.chunks.get(pos / Self::CHUNK)?.get(pos % Self::CHUNK)
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }

    /// The elements from position `start` on, with their positions.
    fn enumerate_from(&self, start: usize) -> impl Iterator<Item = (usize, &T)> {
        let first = (start / Self::CHUNK).min(self.chunks.len());
        self.chunks[first..]
            .iter()
            .flatten()
            .enumerate()
            .map(move |(i, value)| (first * Self::CHUNK + i, value))
            .skip(start - first * Self::CHUNK)
    }
}

impl<T> std::ops::Index<usize> for Chunked<T> {
    type Output = T;

    fn index(&self, pos: usize) -> &T {
        &self.chunks[pos / Self::CHUNK][pos % Self::CHUNK]
    }
}

impl<T> std::ops::IndexMut<usize> for Chunked<T> {
    fn index_mut(&mut self, pos: usize) -> &mut T {
        &mut self.chunks[pos / Self::CHUNK][pos % Self::CHUNK]
    }
}

/// Whether a queue item still stands for its entry: the entry is due then, and was queued
/// with this stamp.
fn live(slots: &Slots, (due, pos, stamp): Item) -> bool {
    slots
        .get(pos as usize)
        .and_then(Option::as_ref)
        .is_some_and(|e| e.due() == Some(due) && e.stamp == stamp)
}

/// Whether the entry at `pos` is in flight under a lease expiring at `expiry` (Unix ms).
fn holds_lease(slots: &Slots, pos: Pos, expiry: u64) -> bool {
    slots[pos as usize].as_ref().is_some_and(|e| {
        e.status == DeliveryStatus::InFlight && e.last_claim.as_ref().is_some_and(|c| c.expires_ms == expiry)
    })
}

/// The due queues, by (session id or [`ANY`], kind id or [`ANY`]), built when a scope first
/// needs one, and which shapes of key exist among them, so that queuing an entry looks up only
/// queues that may exist (usually one: its session's, for any kind).
#[derive(Default)]
struct DueQueues {
    map: HashMap<(u32, u32), OrderedQueue>,
    /// Whether a queue of any session (`(ANY, _)`) exists.
    any_session: bool,
    /// Whether a queue of one kind (`(_, kind)`) exists.
    by_kind: bool,
    /// The due entries each session registered (not those attached to it), by session id,
    /// from the session's first entry on: a fair claim takes each session's earliest.
    owned: Vec<OrderedQueue>,
}

impl DueQueues {
    fn insert(&mut self, key: (u32, u32), queue: OrderedQueue) {
        self.any_session |= key.0 == ANY;
        self.by_kind |= key.1 != ANY;
        self.map.insert(key, queue);
    }

    /// Pushes `item` onto every existing queue of one of `sessions` (which may name
    /// [`ANY`]), for any kind or for `kind`.
    fn push(&mut self, slots: &Slots, sessions: impl IntoIterator<Item = u32>, kind: u32, item: Item) {
        if self.map.is_empty() {
            return;
        }
        for session in sessions {
            if session == ANY && !self.any_session {
                continue;
            }
            if let Some(q) = self.map.get_mut(&(session, ANY)) {
                q.push_live(item, slots);
            }
            if self.by_kind {
                if let Some(q) = self.map.get_mut(&(session, kind)) {
                    q.push_live(item, slots);
                }
            }
        }
    }

    /// Pushes the item of the entry at `pos` onto every existing queue the entry belongs to.
    fn push_entry(&mut self, slots: &Slots, pos: Pos, item: Item) {
        let Some(e) = slots[pos as usize].as_ref() else {
            return;
        };
        let sessions = [ANY, e.session].into_iter().chain(e.members().iter().copied());
        self.push(slots, sessions, e.kind, item);
        self.push_owned(slots, e.session, item);
    }

    /// Pushes `item` onto the queue of the entries `session` registered.
    fn push_owned(&mut self, slots: &Slots, session: u32, item: Item) {
        if let Some(q) = self.owned.get_mut(session as usize) {
            q.push_live(item, slots);
        }
    }
}

/// What a claim grants each entry it takes: its owner, and the lease from `now_ms` until
/// `expiry_ms`.
struct Grant<'a> {
    owner: &'a Arc<str>,
    now_ms: u64,
    expiry_ms: u64,
}

/// The time `t` kept at millisecond resolution (truncated).
fn millis(t: SystemTime) -> (u64, SystemTime) {
    let ms = unix_millis(t);
    (ms, from_unix_millis(ms))
}

/// Puts this in-flight entry, whose lease expired, back to pending, counting the expired
/// lease and saying why in `last_error`.
fn reclaim(entry: &mut Entry) {
    // (The history entry of the expired attempt is written by `Inner::reclaim_expired`.)
    end_lease(entry, crate::model::delivery::reclaimed_error);
}

/// Puts this in-flight entry, whose holder was proved dead, back to pending, as [`reclaim`]
/// does, with `last_error` saying that its lease was taken over.
fn take_over(entry: &mut Entry) {
    // (The history entry of the attempt is written by `Inner::take_over`.)
    end_lease(entry, crate::model::delivery::taken_over_error);
}

fn end_lease(entry: &mut Entry, error: fn(u32, &str) -> String) {
    let owner = entry
        .last_claim
        .as_ref()
        .map_or_else(|| "an unknown drainer".to_owned(), |c| c.owner.to_string());
    entry.status = DeliveryStatus::Pending;
    entry.remarks.count_expired_lease();
    entry.remarks.set_last_error(Some(error(entry.attempts, &owner)));
}

/// The attempt of the entry's last claim, as if still in flight (its lease as last renewed).
fn in_flight(e: &Entry) -> Option<Attempt> {
    let claim = e.last_claim.as_ref()?;
    Some(Attempt {
        token: e.token,
        number: e.attempts,
        owner: claim.owner.clone(),
        claimed_at: from_unix_millis(claim.claimed_ms),
        lease_expires_at: from_unix_millis(claim.expires_ms),
        ended_at: None,
        outcome: AttemptOutcome::InFlight,
    })
}

/// The ledger, behind the outbox's lock.
#[derive(Default)]
struct Inner {
    /// Entries in registration order.
    slots: Slots,
    /// Every live entry's position, found by the hash of its key (kept beside it: a resize
    /// reads no entry): 8 bytes a key, where a map from the key to its position took 24 and
    /// the index is as large as the ledger.
    index: HashTable<(Pos, u32)>,
    /// The keys of purged entries (their tombstones: a purged key is never registered again).
    purged: HashSet<ActionKey>,
    /// Hashes the keys for `index`.
    hasher: foldhash::fast::RandomState,
    sessions: Names,
    kinds: Names,
    /// The due queues.
    queues: DueQueues,
    /// The positions of the entries in flight, by the address of their key's text
    /// ([`ActionKey::addr`]): the record of a key as the claim handed it out finds its entry
    /// here, in a table as small as what is in flight, instead of probing `index`, whose
    /// buckets have long left the cache in a large ledger. Kept by `transition` and `claim`.
    in_flight: HashMap<usize, Pos>,
    /// In-flight entries by lease expiry (Unix milliseconds): the positions that took or
    /// renewed a lease expiring then. An entry that left flight, or moved to a renewed lease,
    /// is skipped when its old expiry comes.
    leases: BTreeMap<u64, Vec<Pos>>,
    /// Final entries by the time they became final, for purge: delivered ones, cancelled
    /// ones, rejected ones.
    finals: [OrderedQueue; 3],
    tally: Tally,
    /// The queue keys of the scope being claimed (kept to reuse its allocation).
    scratch: Vec<(u32, u32)>,
    /// The positions a claim took (kept to reuse its allocation).
    taken: Vec<Pos>,
    /// The open (not final) entries of each ordering group, in registration order: the first
    /// is the group's head, the others are blocked behind it. A group without open entries
    /// has none here.
    groups: HashMap<Arc<str>, VecDeque<Pos>>,
    /// The state of each rate limit's bucket that a claim or a pause wrote.
    rates: HashMap<Arc<str>, RateState>,
}

impl Inner {
    fn session_id(&mut self, name: &Arc<str>) -> u32 {
        let (id, new) = self.sessions.intern(name);
        if new {
            self.tally.by_session.push(Counts::default());
            self.queues.owned.push(OrderedQueue::default());
        }
        id
    }

    fn kind_id(&mut self, name: &Arc<str>) -> u32 {
        let (id, new) = self.kinds.intern(name);
        if new {
            self.tally.by_kind.push(Counts::default());
        }
        id
    }

    fn entry(&self, key: &str) -> Option<(Pos, &Entry)> {
        let pos = self.position(key, self.key_hash(key))?;
        self.slots[pos as usize].as_ref().map(|e| (pos, e))
    }

    /// The hash of `key` as `index` keeps it.
    fn key_hash(&self, key: &str) -> u32 {
        (self.hasher.hash_one(key) >> 32) as u32
    }

    /// The position of the live entry of `key`, whose [`key_hash`](Inner::key_hash) is `hash`.
    fn position(&self, key: &str, hash: u32) -> Option<Pos> {
        let slots = &self.slots;
        let found = self.index.find(spread(hash), |&(pos, h)| {
            h == hash && slots[pos as usize].as_ref().is_some_and(|e| e.key.as_str() == key)
        });
        found.map(|&(pos, _)| pos)
    }

    /// The entry of `key`: found among those in flight if `key` is a clone of an in-flight
    /// entry's key, through the index otherwise.
    fn entry_of(&self, key: &ActionKey) -> Option<(Pos, &Entry)> {
        let in_flight = self.in_flight.get(&key.addr()).and_then(|&pos| {
            let e = self.slots[pos as usize].as_ref()?;
            e.key.is_clone_of(key).then_some((pos, e))
        });
        in_flight.or_else(|| self.entry(key.as_str()))
    }

    fn register(&mut self, intents: impl ExactSizeIterator<Item = NewIntent>, now: SystemTime) {
        let now_ms = unix_millis(now);
        self.index.reserve(intents.len(), |&(_, h)| spread(h));
        // A commit's intents share their session, and usually their kind: the last name
        // interned is compared (`Arc`'s equality compares the allocations first) before the
        // interning map is asked.
        let mut last_session: Option<(Arc<str>, u32)> = None;
        let mut last_kind: Option<u32> = None;
        for new in intents {
            let name = new.intent.origin.session_name();
            let session = match &last_session {
                Some((last, id)) if last == name => *id,
                _ => {
                    let id = self.session_id(name);
                    last_session = Some((name.clone(), id));
                    id
                }
            };
            let pos = Pos::try_from(self.slots.len()).expect("fewer than 2^32 intents");
            let key = new.intent.key.as_str();
            let hash = self.key_hash(key);
            if let Some(pos) = self.position(key, hash) {
                let e = self.slots[pos as usize].as_mut().expect("the index holds live entries");
                if e.status.is_final() || e.session == session || e.members().contains(&session) {
                    continue;
                }
                e.rare_mut().members.push(session);
                let class = class(e);
                shift(&mut self.tally.by_session[session as usize], None, Some(class));
                if let Some(due) = e.due() {
                    let item = (due, pos, e.stamp);
                    let kind = e.kind;
                    self.queues.push(&self.slots, [session], kind, item);
                }
                continue;
            }
            if !self.purged.is_empty() && self.purged.contains(key) {
                continue; // purged: never registered again
            }
            self.index.insert_unique(spread(hash), (pos, hash), |&(_, h)| spread(h));
            let name = &new.intent.kind;
            let kind = match last_kind {
                Some(id) if self.kinds.names[id as usize] == *name => id,
                _ => self.kind_id(name),
            };
            last_kind = Some(kind);
            let meta = crate::model::action::action_meta(&new.bytes);
            let requires_approval = meta.requires_approval;
            let due_ms = meta.not_before.map_or(now_ms, |at| at.max(now_ms));
            // Behind an open entry of its group: blocked until that one is final.
            let group = meta.group.map(Arc::<str>::from);
            let blocked = group.as_ref().is_some_and(|g| {
                let open = self.groups.entry(g.clone()).or_default();
                open.push_back(pos);
                open.len() > 1
            });
            let Intent {
                key,
                payload,
                origin,
                trace,
                ..
            } = new.intent;
            let mut entry = Entry {
                key,
                payload,
                origin,
                trace,
                status: match (blocked, requires_approval) {
                    (true, _) => DeliveryStatus::Blocked,
                    (false, true) => DeliveryStatus::AwaitingApproval,
                    (false, false) => DeliveryStatus::Pending,
                },
                attempts: 0,
                token: FenceToken(0),
                recorded_ms: now_ms,
                updated_ms: now_ms,
                delivered_ms: NOT_DELIVERED,
                remarks: Remarks::default(),
                session,
                kind,
                requires_approval,
                due_ms: NOT_DUE,
                stamp: 1,
                last_claim: None,
                rare: None,
            };
            if let Some(at) = meta.not_before {
                entry.remarks.set_not_before(from_unix_millis(at));
            }
            if let Some(group) = group {
                entry.remarks.set_group(group);
            }
            if requires_approval {
                entry.rare_mut().action_hash = Some(new.action_hash);
            }
            let due = entry.status == DeliveryStatus::Pending;
            entry.set_due(due.then_some(due_ms));
            self.tally.moved(&entry, None, Some(class(&entry)));
            self.slots.push(Some(entry));
            if due {
                // Its session and kind as known here: the entry just written is not read back.
                self.queues.push(&self.slots, [ANY, session], kind, (due_ms, pos, 1));
                self.queues.push_owned(&self.slots, session, (due_ms, pos, 1));
            }
        }
    }

    /// Applies `change` to the live entry at `pos` at `now` (whole milliseconds), and keeps
    /// the counters, the due queues and the purge order up to date. Entries entering pending
    /// are due at `now` (or at their `not_before`, if later: an approval before it); failed
    /// ones with a retry at their `next_attempt_at`.
    fn transition(&mut self, pos: Pos, now: SystemTime, change: impl FnOnce(&mut Entry)) -> DeliveryStatus {
        let now_ms = unix_millis(now);
        let e = self.slots[pos as usize].as_mut().expect("a live entry");
        let from = class(e);
        change(e);
        e.updated_ms = now_ms;
        let status = e.status;
        let due = due_at(status, e.remarks.next_attempt_at(), now).map(|at| unix_millis(at).max(e.not_before_ms()));
        e.set_due(due);
        let to = class(e);
        self.tally.moved(e, Some(from), Some(to));
        if from == IN_FLIGHT && to != IN_FLIGHT {
            self.in_flight.remove(&e.key.addr());
        }
        if let Some(due) = e.due() {
            e.stamp = e.stamp.wrapping_add(1);
            let item = (due, pos, e.stamp);
            self.queues.push_entry(&self.slots, pos, item);
        } else if status.is_final() {
            let queue = match status {
                DeliveryStatus::Cancelled => 1,
                DeliveryStatus::Rejected => 2,
                _ => 0,
            };
            self.finals[queue].push((now_ms, pos, 0));
            let group = self.slots[pos as usize]
                .as_ref()
                .and_then(|e| e.remarks.group().cloned());
            if let Some(group) = group {
                self.release(&group, pos, now);
            }
        }
        status
    }

    /// Takes the entry at `pos`, now final, out of its ordering group's open entries; if the
    /// group's head is then blocked, it becomes pending (or awaits approval, if it asks for it
    /// and has none), due at `now` or at its `not_before`.
    fn release(&mut self, group: &Arc<str>, pos: Pos, now: SystemTime) {
        let Some(open) = self.groups.get_mut(group) else {
            return;
        };
        if let Some(i) = open.iter().position(|&p| p == pos) {
            open.remove(i);
        }
        let Some(&head) = open.front() else {
            self.groups.remove(group);
            return;
        };
        if self.slots[head as usize]
            .as_ref()
            .is_some_and(|e| e.status == DeliveryStatus::Blocked)
        {
            self.transition(head, now, |d| {
                d.status = match d.requires_approval && d.remarks.decision().is_none() {
                    true => DeliveryStatus::AwaitingApproval,
                    false => DeliveryStatus::Pending,
                };
            });
        }
    }

    /// Puts every in-flight entry whose lease expired at `now` back to pending, due now.
    fn reclaim_expired(&mut self, now: SystemTime) -> usize {
        let now_ms = unix_millis(now);
        let mut reclaimed = 0;
        while let Some(expiring) = self.leases.first_entry() {
            if *expiring.key() > now_ms {
                break;
            }
            let (expiry, positions) = expiring.remove_entry();
            for pos in positions {
                if holds_lease(&self.slots, pos, expiry) {
                    self.end_attempt(pos, now, AttemptOutcome::Expired);
                    self.transition(pos, now, reclaim);
                    reclaimed += 1;
                }
            }
        }
        self.forget_leases_if_none_in_flight();
        reclaimed
    }

    /// The distinct owners of the leases in flight in `scope`.
    fn lease_owners(&self, scope: &Scope) -> Vec<Arc<str>> {
        let mut owners: Vec<Arc<str>> = Vec::new();
        for &pos in self.in_flight.values() {
            let Some(e) = self.slots[pos as usize].as_ref() else {
                continue;
            };
            let Some(claim) = e.last_claim.as_ref() else { continue };
            if e.status == DeliveryStatus::InFlight && !owners.contains(&claim.owner) && self.admits(e, scope) {
                owners.push(claim.owner.clone());
            }
        }
        owners
    }

    /// Puts every entry in flight under a lease of `owner` back to pending, due at `now`, as an
    /// expired lease is; returns their keys in registration order.
    fn take_over(&mut self, owner: &str, now: SystemTime) -> Vec<ActionKey> {
        let mut held: Vec<Pos> = self
            .in_flight
            .values()
            .copied()
            .filter(|&pos| {
                self.slots[pos as usize].as_ref().is_some_and(|e| {
                    e.status == DeliveryStatus::InFlight && e.last_claim.as_ref().is_some_and(|c| &*c.owner == owner)
                })
            })
            .collect();
        held.sort_unstable();
        let mut keys = Vec::with_capacity(held.len());
        for pos in held {
            self.end_attempt(pos, now, AttemptOutcome::Expired);
            self.transition(pos, now, take_over);
            keys.extend(self.slots[pos as usize].as_ref().map(|e| e.key.clone()));
        }
        // (The taken leases' expiries are skipped when they come: their entries are no longer in
        // flight under them, as after a record.)
        self.forget_leases_if_none_in_flight();
        keys
    }

    /// Adds the attempt in flight at `pos` to its history, ended at `now` with `outcome`.
    fn end_attempt(&mut self, pos: Pos, now: SystemTime, outcome: AttemptOutcome) {
        let e = self.slots[pos as usize].as_mut().expect("a live entry");
        if let Some(attempt) = in_flight(e) {
            let history = &mut e.rare_mut().history;
            if history.len() >= ATTEMPTS_KEPT {
                history.remove(0);
            }
            history.push(Attempt {
                ended_at: Some(millis(now).1),
                outcome,
                ..attempt
            });
        }
    }

    fn attempts(&self, key: &str) -> Option<Vec<Attempt>> {
        let (_, e) = self.entry(key)?;
        let mut attempts = e.history().to_vec();
        let last = match e.status {
            DeliveryStatus::InFlight => in_flight(e),
            DeliveryStatus::Delivered => in_flight(e).map(|a| Attempt {
                ended_at: e.delivered_at(),
                outcome: AttemptOutcome::Delivered,
                ..a
            }),
            _ => None,
        };
        attempts.extend(last);
        Some(attempts)
    }

    /// Drops the expiries of leases that have all ended.
    fn forget_leases_if_none_in_flight(&mut self) {
        if self.tally.total.0[IN_FLIGHT] == 0 {
            // Emptied entry by entry, which keeps the map's node, and the largest buffer of
            // positions kept for the next claim: a claim after the last one ended allocates
            // nothing for its leases.
            while let Some((_, mut positions)) = self.leases.pop_first() {
                if positions.capacity() > self.taken.capacity() {
                    positions.clear();
                    self.taken = positions;
                }
            }
            self.in_flight.clear();
        }
    }

    /// The queue keys of `scope` in `self.scratch`, every queue built.
    fn scope_queues(&mut self, scope: &Scope) {
        let mut keys = std::mem::take(&mut self.scratch);
        keys.clear();
        let sessions = scope.session_filter().map_or(1, <[_]>::len);
        for s in 0..sessions {
            let session = match scope.session_filter() {
                None => ANY,
                Some(names) => self.session_id(&names[s]),
            };
            match scope.kind_filter() {
                None => {
                    if !keys.contains(&(session, ANY)) {
                        keys.push((session, ANY));
                    }
                }
                Some(kinds) => {
                    for kind in kinds {
                        let key = (session, self.kind_id(kind));
                        if !keys.contains(&key) {
                            keys.push(key);
                        }
                    }
                }
            }
        }
        for &key in &keys {
            if !self.queues.map.contains_key(&key) {
                let mut items: Vec<Item> = self
                    .slots
                    .iter()
                    .enumerate()
                    .filter_map(|(pos, e)| {
                        let e = e.as_ref()?;
                        let due = e.due()?;
                        e.in_queue(key).then_some((due, pos as Pos, e.stamp))
                    })
                    .collect();
                items.sort_unstable();
                let mut queue = OrderedQueue::default();
                for item in items {
                    queue.push(item);
                }
                queue.compacted = queue.len();
                self.queues.insert(key, queue);
            }
        }
        self.scratch = keys;
    }

    /// The earliest live item of the scope's queues (in `self.scratch`), and which queue; of
    /// the queues of the highest priority (`priorities`, by queue; empty: all equal) that
    /// have an item due at `now_ms`, if any.
    fn earliest(&mut self, priorities: &[i32], now_ms: u64) -> Option<(Item, usize)> {
        let mut best: Option<(i32, Item, usize)> = None;
        for (i, key) in self.scratch.iter().enumerate() {
            let queue = self.queues.map.get_mut(key).expect("scope queues are built");
            if let Some(item) = queue.front(&self.slots) {
                // A queue with nothing due yet ranks below every due one.
                let rank = match item.0 <= now_ms {
                    true => priorities.get(i).copied().unwrap_or(0),
                    false => i32::MIN,
                };
                if best.is_none_or(|(r, b, _)| {
                    (std::cmp::Reverse(rank), item.0, item.1) < (std::cmp::Reverse(r), b.0, b.1)
                }) {
                    best = Some((rank, item, i));
                }
            }
        }
        best.map(|(_, item, i)| (item, i))
    }

    fn claim(&mut self, request: &ClaimRequest<'_>) -> Claimed {
        let reclaimed = self.reclaim_expired(request.now);
        let mut claims = Vec::with_capacity(request.limit.min(1024));
        if request.limit == 0 {
            return Claimed {
                claims,
                reclaimed,
                ..Claimed::default()
            };
        }
        let (now_ms, now) = millis(request.now);
        let expiry_ms = unix_millis(later(now, request.lease));
        let buckets = request.buckets_in_scope();
        let mut spend = RateSpend::new(
            buckets
                .into_iter()
                .map(|b| (b, self.rates.get(&b.name).copied().unwrap_or_default())),
            request.now,
        );
        if !request.policy.by_kind() {
            self.scope_queues(request.scope);
        } else {
            // A queue per kind, so that a kind whose bucket ran out drops out of the claim, and
            // kinds are taken by priority.
            let kinds = match request.scope.kind_filter() {
                Some(kinds) => kinds.to_vec(),
                None => self.kinds.names.clone(),
            };
            self.scope_queues(&request.scope.clone().kinds(kinds));
        }
        let mut taken = std::mem::take(&mut self.taken);
        // Each claim's due time and position, for the order of a claim that took turns.
        let mut order: Vec<(u64, Pos)> = Vec::new();
        let grant = Grant {
            owner: request.owner,
            now_ms,
            expiry_ms,
        };
        // Sessions take turns: first the earliest due intent of each session of the scope.
        let mut heads = false;
        if request.takes_turns() {
            for (due, pos) in self.session_heads(request.scope, now_ms, request.limit) {
                let kind = self.slots[pos as usize].as_ref().expect("a live item").kind;
                if spend.take(&self.kinds.names[kind as usize]) {
                    heads = true;
                    order.push((due, pos));
                    claims.push(self.grant(pos, &grant));
                    taken.push(pos);
                }
            }
        }
        let mut priorities: Vec<i32> = match request.policy.priorities.is_empty() {
            true => Vec::new(),
            false => self
                .scratch
                .iter()
                .map(|&(_, kind)| request.policy.priority_of(&self.kinds.names[kind as usize]))
                .collect(),
        };
        while claims.len() < request.limit {
            let Some((item, queue)) = self.earliest(&priorities, now_ms) else {
                break;
            };
            if item.0 > now_ms {
                break;
            }
            let pos = item.1;
            let kind = self.slots[pos as usize].as_ref().expect("a live item").kind;
            if !spend.take(&self.kinds.names[kind as usize]) {
                self.scratch.swap_remove(queue);
                if !priorities.is_empty() {
                    priorities.swap_remove(queue);
                }
                continue;
            }
            self.queues.map.get_mut(&self.scratch[queue]).expect("built").pop();
            if heads || !priorities.is_empty() {
                order.push((item.0, pos));
            }
            claims.push(self.grant(pos, &grant));
            taken.push(pos);
        }
        if heads || !priorities.is_empty() {
            // In the order they fell due, as any claim hands them out.
            let mut sorted: Vec<(u64, Pos, Delivery)> =
                order.drain(..).zip(claims).map(|((d, p), c)| (d, p, c)).collect();
            sorted.sort_unstable_by_key(|&(due, pos, _)| (due, pos));
            claims = sorted.into_iter().map(|(_, _, c)| c).collect();
        }
        if !taken.is_empty() {
            match self.leases.entry(expiry_ms) {
                // The positions move in as they are (the buffer comes back when the leases
                // are forgotten).
                btree_map::Entry::Vacant(expiring) => {
                    expiring.insert(std::mem::take(&mut taken));
                }
                btree_map::Entry::Occupied(mut expiring) => expiring.get_mut().append(&mut taken),
            }
        }
        self.taken = taken;
        for (name, state) in spend.spent() {
            self.rates.insert(name.clone(), state);
        }
        Claimed {
            claims,
            reclaimed,
            integrity: Vec::new(),
            throttled: spend.throttled(),
        }
    }

    /// The entries of the earliest due intent of each session of `scope` that has one, at most
    /// `limit`: all of them when there are no more, else `limit` drawn anew for each claim.
    fn session_heads(&mut self, scope: &Scope, now_ms: u64, limit: usize) -> Vec<(u64, Pos)> {
        let sessions: Vec<u32> = match scope.session_filter() {
            None => (0..u32::try_from(self.sessions.names.len()).unwrap_or(u32::MAX)).collect(),
            Some(names) => names.iter().filter_map(|n| self.sessions.get(n)).collect(),
        };
        let draw = turn::draw();
        let mut heads: Vec<(u64, u64, Pos)> = Vec::new();
        for session in sessions {
            let Some(queue) = self.queues.owned.get_mut(session as usize) else {
                continue;
            };
            if let Some((due, pos, _)) = queue.front(&self.slots) {
                if due <= now_ms {
                    heads.push((turn::place(u64::from(session), draw), due, pos));
                }
            }
        }
        if heads.len() > limit {
            heads.sort_unstable();
            heads.truncate(limit);
        }
        heads.into_iter().map(|(_, due, pos)| (due, pos)).collect()
    }

    /// Puts the due entry at `pos` in flight under `grant`: its delivery, as claimed.
    fn grant(&mut self, pos: Pos, grant: &Grant<'_>) -> Delivery {
        let e = self.slots[pos as usize].as_mut().expect("a live item");
        let from = class(e);
        e.set_due(None);
        e.status = DeliveryStatus::InFlight;
        e.attempts = e.attempts.saturating_add(1);
        e.token = FenceToken(e.token.0 + 1);
        e.remarks.set_next_attempt_at(None);
        e.updated_ms = grant.now_ms;
        e.last_claim = Some(LastClaim {
            owner: grant.owner.clone(),
            claimed_ms: grant.now_ms,
            expires_ms: grant.expiry_ms,
        });
        self.tally.moved(e, Some(from), Some(IN_FLIGHT));
        self.in_flight.insert(e.key.addr(), pos);
        e.delivery(&self.kinds)
    }

    fn pause(&mut self, bucket: &str, until: SystemTime) {
        let state = self.rates.get(bucket).copied().unwrap_or_default().paused(until);
        self.rates.insert(Arc::from(bucket), state);
    }

    fn record(&mut self, recording: &Recording, now: SystemTime) -> Recorded {
        let found = self.entry_of(&recording.key);
        let held = found
            .and_then(|(pos, e)| (e.status == DeliveryStatus::InFlight && e.token == recording.token).then_some(pos));
        let Some(pos) = held else {
            let current = found.map(|(_, e)| e);
            return Recorded::Stale {
                status: current.map(|d| d.status),
                token: current.map_or(FenceToken(0), |d| d.token),
            };
        };
        let now_ms = unix_millis(now);
        let t = recording.outcome.transition();
        if let Some(ended) = t.history.clone() {
            self.end_attempt(pos, now, ended);
        }
        let status = self.transition(pos, now, |d| {
            d.status = t.status;
            if t.uncount_attempt {
                d.attempts = d.attempts.saturating_sub(1);
            }
            if t.count_interrupted {
                d.remarks.count_interrupted();
            }
            match t.last_error {
                LastError::Clear => d.remarks.set_last_error(None),
                LastError::Keep => {}
                LastError::Set(error) => d.remarks.set_last_error(Some(error.to_owned())),
            }
            if t.delivered {
                d.delivered_ms = now_ms.min(NOT_DELIVERED - 1);
            }
            d.remarks.set_next_attempt_at(t.next_attempt_at);
        });
        self.forget_leases_if_none_in_flight();
        Recorded::Accepted(status)
    }

    fn renew(&mut self, key: &str, token: FenceToken, until: SystemTime) -> bool {
        let until_ms = unix_millis(until);
        let Some(pos) = self.position(key, self.key_hash(key)) else {
            return false;
        };
        let Some(e) = self.slots[pos as usize].as_mut() else {
            return false;
        };
        match &mut e.last_claim {
            Some(lease) if e.status == DeliveryStatus::InFlight && e.token == token => {
                lease.expires_ms = until_ms;
                self.leases.entry(until_ms).or_default().push(pos);
                true
            }
            _ => false,
        }
    }

    fn retry(&mut self, key: &str, now: SystemTime) -> Result<Delivery, RetryError> {
        let Some((pos, e)) = self.entry(key) else {
            return Err(RetryError::UnknownKey(ActionKey::from(key)));
        };
        let status = e.status;
        if !matches!(
            status,
            DeliveryStatus::Failed | DeliveryStatus::Dead | DeliveryStatus::Held
        ) {
            return Err(RetryError::NotFailed {
                key: e.key.clone(),
                status,
            });
        }
        // An intent that needs approval and never had one goes back to waiting for it.
        let unapproved = e.requires_approval && e.remarks.decision().is_none();
        self.transition(pos, now, |d| {
            d.status = if unapproved {
                DeliveryStatus::AwaitingApproval
            } else {
                DeliveryStatus::Pending
            };
            d.remarks.set_next_attempt_at(None);
        });
        Ok(self.slots[pos as usize].as_ref().expect("live").delivery(&self.kinds))
    }

    fn decide(
        &mut self,
        key: &str,
        verdict: Verdict,
        by: &str,
        reason: Option<&str>,
        now: SystemTime,
    ) -> Result<Delivery, ApprovalError> {
        let Some((pos, e)) = self.entry(key) else {
            return Err(ApprovalError::UnknownKey(ActionKey::from(key)));
        };
        if !check_decision(key, e.status, e.remarks.decision(), verdict, by)? {
            return Ok(e.delivery(&self.kinds));
        }
        let (_, at) = millis(now);
        let digest = e.rare.as_ref().and_then(|r| r.action_hash);
        self.transition(pos, now, |d| {
            d.status = match verdict {
                Verdict::Approved => DeliveryStatus::Pending,
                Verdict::Rejected => DeliveryStatus::Rejected,
            };
            d.remarks
                .set_decision(Decision::new(verdict, by, at, reason.map(str::to_owned)).with_digest(digest));
        });
        Ok(self.slots[pos as usize].as_ref().expect("live").delivery(&self.kinds))
    }

    fn cancel(&mut self, key: &str, reason: &str, now: SystemTime) -> Result<Delivery, CancelError> {
        let Some((pos, e)) = self.entry(key) else {
            return Err(CancelError::UnknownKey(ActionKey::from(key)));
        };
        match e.status {
            DeliveryStatus::Cancelled => return Ok(e.delivery(&self.kinds)),
            DeliveryStatus::Pending
            | DeliveryStatus::Failed
            | DeliveryStatus::Dead
            | DeliveryStatus::Held
            | DeliveryStatus::AwaitingApproval
            | DeliveryStatus::Blocked => {}
            status => {
                return Err(CancelError::NotCancellable {
                    key: e.key.clone(),
                    status,
                })
            }
        }
        self.transition(pos, now, |d| {
            d.status = DeliveryStatus::Cancelled;
            d.remarks.set_next_attempt_at(None);
            d.remarks.set_cancel_reason(reason.to_owned());
        });
        Ok(self.slots[pos as usize].as_ref().expect("live").delivery(&self.kinds))
    }

    fn purge(&mut self, filter: PurgeFilter, before: SystemTime, limit: usize) -> u64 {
        let queues: &[usize] = match filter {
            PurgeFilter::Delivered => &[0],
            PurgeFilter::Cancelled => &[1],
            PurgeFilter::Rejected => &[2],
            _ => &[0, 1, 2],
        };
        let mut purged = 0;
        while purged < limit as u64 {
            // The oldest of the queues the filter admits.
            let Some((queue, (changed, pos, _))) = queues
                .iter()
                .filter_map(|&q| self.finals[q].peek().map(|(item, _)| (q, item)))
                .min_by_key(|&(_, (changed, pos, _))| (changed, pos))
            else {
                break;
            };
            if from_unix_millis(changed) >= before {
                break;
            }
            self.finals[queue].pop();
            if let Some(e) = self.slots[pos as usize].take() {
                self.tally.moved(&e, Some(class(&e)), None);
                let key = e.key;
                let found = self
                    .index
                    .find_entry(spread(self.key_hash(key.as_str())), |&(p, _)| p == pos);
                found.expect("a live entry is in the index").remove();
                self.purged.insert(key);
                purged += 1;
            }
        }
        purged
    }

    fn admits(&self, e: &Entry, scope: &Scope) -> bool {
        let sessions = std::iter::once(e.session)
            .chain(e.members().iter().copied())
            .map(|s| &*self.sessions.names[s as usize]);
        scope.admits(&self.kinds.names[e.kind as usize], sessions)
    }

    fn list(&self, query: &LedgerQuery) -> Page {
        let start = query
            .after
            .map_or(0, |after| usize::try_from(after).unwrap_or(usize::MAX));
        let limit = query.limit.max(1);
        let mut entries = Vec::new();
        let mut last = 0;
        let mut next = None;
        for (pos, e) in self.slots.enumerate_from(start) {
            let Some(e) = e else { continue };
            if query.status.is_some_and(|s| s != e.status) || !self.admits(e, &query.scope) {
                continue;
            }
            if entries.len() == limit {
                // One more matches: the cursor is the sequence number (position + 1) of the
                // last entry taken.
                next = Some(last as u64 + 1);
                break;
            }
            entries.push(e.delivery(&self.kinds));
            last = pos;
        }
        Page { entries, next }
    }

    fn counts(&self, scope: &Scope) -> StatusCounts {
        match (scope.session_filter(), scope.kind_filter()) {
            (None, None) => self.tally.total.counts(),
            (None, Some(kinds)) => {
                let mut sum = Counts::default();
                for (i, kind) in kinds.iter().enumerate() {
                    if kinds[..i].contains(kind) {
                        continue;
                    }
                    if let Some(id) = self.kinds.get(kind) {
                        sum.add(&self.tally.by_kind[id as usize]);
                    }
                }
                sum.counts()
            }
            (Some([session]), None) => self
                .sessions
                .get(session)
                .map_or_else(StatusCounts::default, |id| self.tally.by_session[id as usize].counts()),
            _ => {
                let mut sum = Counts::default();
                for e in self.slots.iter().flatten() {
                    if self.admits(e, scope) {
                        sum.0[class(e)] += 1;
                    }
                }
                sum.counts()
            }
        }
    }

    fn next_due(&mut self, scope: &Scope) -> Option<SystemTime> {
        self.scope_queues(scope);
        let due = self.earliest(&[], u64::MAX).map(|(item, _)| item.0);
        // Drop fully stale leases from the front, then find the first live one in scope.
        while let Some(first) = self.leases.first_entry() {
            let expiry = *first.key();
            let any_live = first.get().iter().any(|&pos| holds_lease(&self.slots, pos, expiry));
            if any_live {
                break;
            }
            first.remove();
        }
        let lease = self.leases.iter().find_map(|(&expiry, positions)| {
            positions
                .iter()
                .any(|&pos| {
                    holds_lease(&self.slots, pos, expiry)
                        && self.slots[pos as usize].as_ref().is_some_and(|e| self.admits(e, scope))
                })
                .then_some(expiry)
        });
        due.into_iter().chain(lease).min().map(from_unix_millis)
    }
}

impl OutboxStore for MemoryOutbox {
    fn describe(&self) -> String {
        "memory".to_owned()
    }

    fn claim<'a>(&'a self, request: ClaimRequest<'a>) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        Box::pin(async move { Ok(self.lock().claim(&request)) })
    }

    fn lease_owners<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<Vec<Arc<str>>, StoreError>> {
        Box::pin(async move { Ok(self.lock().lease_owners(scope)) })
    }

    fn pause<'a>(&'a self, bucket: &'a str, until: SystemTime) -> BoxFuture<'a, Result<(), StoreError>> {
        self.lock().pause(bucket, until);
        Box::pin(std::future::ready(Ok(())))
    }

    fn rate_states(&self) -> BoxFuture<'_, Result<Vec<(String, RateState)>, StoreError>> {
        let mut states: Vec<(String, RateState)> = self
            .lock()
            .rates
            .iter()
            .map(|(name, state)| (name.to_string(), *state))
            .collect();
        states.sort_by(|a, b| a.0.cmp(&b.0));
        Box::pin(std::future::ready(Ok(states)))
    }

    fn take_over<'a>(&'a self, owner: &'a str, now: SystemTime) -> BoxFuture<'a, Result<Vec<ActionKey>, StoreError>> {
        Box::pin(async move { Ok(self.lock().take_over(owner, now)) })
    }

    fn record<'a>(
        &'a self,
        outcomes: &'a [Recording],
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Vec<Recorded>, StoreError>> {
        Box::pin(async move {
            let mut inner = self.lock();
            Ok(outcomes.iter().map(|r| inner.record(r, now)).collect())
        })
    }

    fn submit(&self, outcomes: Vec<Recording>, now: SystemTime) {
        let mut inner = self.lock();
        for recording in &outcomes {
            inner.record(recording, now);
        }
    }

    fn renew<'a>(
        &'a self,
        held: &'a [(ActionKey, FenceToken)],
        until: SystemTime,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(async move {
            let mut inner = self.lock();
            Ok(held
                .iter()
                .map(|(key, token)| inner.renew(key.as_str(), *token, until))
                .collect())
        })
    }

    fn retry<'a>(&'a self, key: &'a str, now: SystemTime) -> BoxFuture<'a, Result<Delivery, RetryError>> {
        Box::pin(async move { self.lock().retry(key, now) })
    }

    fn cancel<'a>(
        &'a self,
        key: &'a str,
        reason: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, CancelError>> {
        Box::pin(async move { self.lock().cancel(key, reason, now) })
    }

    fn approve<'a>(
        &'a self,
        key: &'a str,
        by: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, ApprovalError>> {
        Box::pin(std::future::ready(self.lock().decide(
            key,
            Verdict::Approved,
            by,
            None,
            now,
        )))
    }

    fn reject<'a>(
        &'a self,
        key: &'a str,
        by: &'a str,
        reason: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, ApprovalError>> {
        Box::pin(std::future::ready(self.lock().decide(
            key,
            Verdict::Rejected,
            by,
            Some(reason),
            now,
        )))
    }

    fn purge(&self, filter: PurgeFilter, before: SystemTime, limit: usize) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move { Ok(self.lock().purge(filter, before, limit)) })
    }

    fn attempts<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Vec<Attempt>>, StoreError>> {
        Box::pin(async move { Ok(self.lock().attempts(key)) })
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Delivery>, StoreError>> {
        Box::pin(async move {
            let inner = self.lock();
            Ok(inner.entry(key).map(|(_, e)| e.delivery(&inner.kinds)))
        })
    }

    fn list<'a>(&'a self, query: &'a LedgerQuery) -> BoxFuture<'a, Result<Page, StoreError>> {
        Box::pin(async move { Ok(self.lock().list(query)) })
    }

    fn counts<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<StatusCounts, StoreError>> {
        Box::pin(async move { Ok(self.lock().counts(scope)) })
    }

    fn next_due<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<Option<SystemTime>, StoreError>> {
        Box::pin(async move { Ok(self.lock().next_due(scope)) })
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::model::action::{Origin, PendingAction};
    use crate::model::artifact::Generation;
    use crate::model::hash::{content_hash, CommitHash};
    use crate::model::outcome::{FailedAttempt, Outcome};

    #[test]
    fn a_chunked_vector_keeps_every_position_across_its_chunks() {
        let n = 3 * Chunked::<u32>::CHUNK + 5;
        let mut v = Chunked::default();
        for i in 0..n {
            v.push(i as u32);
            assert_eq!(v.len(), i + 1);
        }
        let first = &v[0] as *const u32;
        v.push(0);
        assert_eq!(&v[0] as *const u32, first, "growing moved an element");
        let (last, full) = v.chunks.split_last().unwrap();
        assert!(
            full.iter().all(|c| c.capacity() == Chunked::<u32>::CHUNK),
            "a full chunk over-allocated"
        );
        assert!(last.capacity() <= Chunked::<u32>::CHUNK);
        for i in [0, 1, Chunked::<u32>::CHUNK - 1, Chunked::<u32>::CHUNK, n - 1] {
            assert_eq!(v[i], i as u32);
            assert_eq!(v.get(i), Some(&(i as u32)));
        }
        assert_eq!(v.get(n + 1), None);
        v[Chunked::<u32>::CHUNK] = 7;
        assert_eq!(v.iter().filter(|&&x| x == 7).count(), 2);
        for start in [
            0,
            1,
            Chunked::<u32>::CHUNK - 1,
            Chunked::<u32>::CHUNK,
            2 * Chunked::<u32>::CHUNK + 1,
            n + 1,
            usize::MAX,
        ] {
            let expected: Vec<(usize, u32)> = (start.min(n + 1)..n + 1).map(|i| (i, v[i])).collect();
            let got: Vec<(usize, u32)> = v.enumerate_from(start).map(|(i, &x)| (i, x)).collect();
            assert_eq!(got, expected, "from {start}");
        }
    }

    fn intent(session: &Arc<str>, key: &str) -> NewIntent {
        let bytes = rmp_serde::to_vec_named(&PendingAction {
            kind: "notify".into(),
            key: key.into(),
            payload: Vec::new(),
            requires_approval: false,
            not_before: None,
            group: None,
        })
        .unwrap();
        NewIntent {
            intent: Intent {
                key: ActionKey::from(key),
                kind: Arc::from("notify"),
                payload: Vec::new().into(),
                origin: Origin::new(session.clone(), CommitHash([1; 32]), Generation(1), 0),
                attempt: 0,
                trace: None,
            },
            action_hash: content_hash(&bytes),
            bytes: Arc::from(bytes),
        }
    }

    fn recording(key: ActionKey, claim: &Delivery) -> Recording {
        Recording {
            key,
            token: claim.token,
            outcome: Outcome::Delivered,
        }
    }

    #[test]
    fn a_record_finds_its_entry_by_the_claimed_key_or_by_a_key_made_apart_and_a_stale_one_stays_stale() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let session: Arc<str> = Arc::from("s");
        let outbox = MemoryOutbox::new();
        outbox.register(
            [intent(&session, "k1"), intent(&session, "k2"), intent(&session, "k3")].into_iter(),
            t0,
        );
        let scope = Scope::all();
        let owner: Arc<str> = Arc::from("drain");
        let claim = |now| {
            outbox.lock().claim(&ClaimRequest {
                scope: &scope,
                limit: 10,
                owner: &owner,
                lease: Duration::from_secs(10),
                now,
                policy: crate::store::ClaimPolicy::none(),
            })
        };
        let first = claim(t0).claims;
        assert_eq!(first.len(), 3);
        let delivered = Recorded::Accepted(DeliveryStatus::Delivered);
        {
            let mut inner = outbox.lock();
            // k1 with (a clone of) the key the claim handed out, k2 with a key made apart.
            assert_eq!(
                inner.record(&recording(first[0].key().clone(), &first[0]), t0),
                delivered
            );
            assert_eq!(
                inner.record(&recording(ActionKey::from("k2"), &first[1]), t0),
                delivered
            );
            // Recorded again, either way: stale.
            for key in [first[0].key().clone(), ActionKey::from("k1")] {
                let again = inner.record(&recording(key, &first[0]), t0);
                assert!(
                    matches!(
                        again,
                        Recorded::Stale {
                            status: Some(DeliveryStatus::Delivered),
                            ..
                        }
                    ),
                    "{again:?}"
                );
            }
        }
        // k3's lease expires and another claim takes it: the first holder's late outcome, with
        // the key it was handed, is stale; the second holder's is recorded.
        let second = claim(t0 + Duration::from_secs(11)).claims;
        assert_eq!(second.len(), 1);
        assert!(second[0].key().is_clone_of(first[2].key()));
        let mut inner = outbox.lock();
        let late = inner.record(&recording(first[2].key().clone(), &first[2]), t0);
        assert!(
            matches!(
                late,
                Recorded::Stale {
                    status: Some(DeliveryStatus::InFlight),
                    ..
                }
            ),
            "{late:?}"
        );
        assert_eq!(
            inner.record(&recording(second[0].key().clone(), &second[0]), t0),
            delivered
        );
        assert!(inner.in_flight.is_empty(), "nothing in flight, no position kept");
        assert_eq!(inner.tally.total.counts().delivered, 3);
    }

    #[test]
    fn an_entry_reads_back_as_the_delivery_it_stands_for_through_claims_records_and_reclaims() {
        let t0 = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let session: Arc<str> = Arc::from("s");
        let outbox = MemoryOutbox::new();
        let mut new = intent(&session, "k1");
        let trace: TraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            .parse()
            .unwrap();
        new.intent.trace = Some(trace);
        new.intent.payload = vec![1u8, 2, 3].into();
        // Sub-millisecond times are kept to the millisecond, as every store keeps them.
        outbox.register([new].into_iter(), t0 + Duration::from_micros(700));
        let scope = Scope::all();
        let owner: Arc<str> = Arc::from("drain-1");
        let get = |inner: &Inner| {
            let (_, e) = inner.entry("k1").expect("registered");
            e.delivery(&inner.kinds)
        };
        let check_intent = |d: &Delivery| {
            let intent = d.intent();
            assert_eq!(intent.key().as_str(), "k1");
            assert_eq!(intent.kind(), "notify");
            assert_eq!(&intent.payload[..], &[1, 2, 3]);
            assert_eq!(intent.trace_parent(), Some(&trace));
            assert_eq!(intent.origin().session(), "s");
            assert_eq!(intent.attempt(), d.attempts(), "the intent's attempt is the last one");
        };
        let mut inner = outbox.lock();
        let d = get(&inner);
        check_intent(&d);
        assert_eq!(
            (d.status(), d.attempts(), d.token()),
            (DeliveryStatus::Pending, 0, FenceToken(0))
        );
        assert_eq!((d.recorded_at(), d.updated_at(), d.delivered_at()), (t0, t0, None));
        assert!(d.lease().is_none());

        let claim = |inner: &mut Inner, now| {
            inner.claim(&ClaimRequest {
                scope: &scope,
                limit: 10,
                owner: &owner,
                lease: Duration::from_secs(10),
                now,
                policy: crate::store::ClaimPolicy::none(),
            })
        };
        let t1 = t0 + Duration::from_secs(1);
        let claimed = claim(&mut inner, t1).claims;
        assert_eq!(claimed.len(), 1);
        let d = get(&inner);
        check_intent(&d);
        check_intent(&claimed[0]);
        assert_eq!(
            (d.status(), d.attempts(), d.token()),
            (DeliveryStatus::InFlight, 1, FenceToken(1))
        );
        assert_eq!((d.recorded_at(), d.updated_at()), (t0, t1));
        let lease = d.lease().expect("in flight under a lease");
        assert_eq!(
            (&*lease.owner, lease.expires_at, lease.token),
            ("drain-1", t1 + Duration::from_secs(10), d.token())
        );
        assert_eq!(claimed[0].lease(), Some(lease));
        assert!(inner.renew("k1", d.token(), t1 + Duration::from_secs(20)));
        assert_eq!(get(&inner).lease().unwrap().expires_at, t1 + Duration::from_secs(20));

        // The renewed lease expires: reclaimed, pending again, no lease, the holder named.
        let t2 = t1 + Duration::from_secs(21);
        let again = claim(&mut inner, t2);
        assert_eq!(again.reclaimed, 1);
        assert_eq!(again.claims.len(), 1);
        let d = get(&inner);
        check_intent(&d);
        assert_eq!(
            (d.status(), d.attempts(), d.token()),
            (DeliveryStatus::InFlight, 2, FenceToken(2))
        );
        assert_eq!(d.expired_leases(), 1);
        assert!(
            d.last_error().is_some_and(|e| e.contains("drain-1")),
            "{:?}",
            d.last_error()
        );

        // Held: the attempt is not counted, and the intent's attempt follows.
        let held = Recording {
            key: ActionKey::from("k1"),
            token: d.token(),
            outcome: Outcome::Held {
                reason: "no route".into(),
            },
        };
        assert_eq!(inner.record(&held, t2), Recorded::Accepted(DeliveryStatus::Held));
        let d = get(&inner);
        check_intent(&d);
        assert_eq!((d.status(), d.attempts()), (DeliveryStatus::Held, 1));
        assert!(d.lease().is_none(), "no lease once the attempt ended");
        assert_eq!(d.last_error(), Some("no route"));

        inner.retry("k1", t2).unwrap();
        let t3 = t2 + Duration::from_secs(1);
        let d = claim(&mut inner, t3).claims.remove(0);
        let failed = Recording {
            key: ActionKey::from("k1"),
            token: d.token(),
            outcome: Outcome::Failed {
                error: "boom".into(),
                next: FailedAttempt::RetryAt(t3 + Duration::from_micros(1_500)),
            },
        };
        assert_eq!(inner.record(&failed, t3), Recorded::Accepted(DeliveryStatus::Failed));
        let d = get(&inner);
        check_intent(&d);
        assert_eq!(
            (d.status(), d.attempts(), d.last_error()),
            (DeliveryStatus::Failed, 2, Some("boom"))
        );
        // A retry time is rounded up to its millisecond (never early).
        assert_eq!(d.next_attempt_at(), Some(t3 + Duration::from_millis(2)));

        let t4 = t3 + Duration::from_secs(1);
        let d = claim(&mut inner, t4).claims.remove(0);
        assert_eq!(d.next_attempt_at(), None, "a claim clears the scheduled retry");
        assert_eq!(
            inner.record(&recording(d.key().clone(), &d), t4),
            Recorded::Accepted(DeliveryStatus::Delivered)
        );
        let d = get(&inner);
        check_intent(&d);
        assert_eq!(
            (d.status(), d.attempts(), d.token()),
            (DeliveryStatus::Delivered, 3, FenceToken(4))
        );
        assert_eq!((d.recorded_at(), d.updated_at(), d.delivered_at()), (t0, t4, Some(t4)));
        assert_eq!((d.last_error(), d.lease()), (None, None));
        // The delivered attempt is read from the last claim.
        let attempts = inner.attempts("k1").unwrap();
        let last = attempts.last().unwrap();
        assert_eq!(
            (&last.outcome, last.claimed_at, last.ended_at),
            (&AttemptOutcome::Delivered, t4, Some(t4))
        );
        assert_eq!(&*last.owner, "drain-1");
    }

    #[test]
    fn the_key_index_finds_every_live_key_and_never_a_purged_one_across_growth_purges_and_reregistration() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let (s1, s2): (Arc<str>, Arc<str>) = (Arc::from("s1"), Arc::from("s2"));
        let outbox = MemoryOutbox::new();
        let n = 5_000;
        let key = |i: usize| format!("key-{i}");
        // Registered in growing batches (the index grows several times), one key twice.
        let mut registered = 0;
        for batch in [1, 7, 100, 1_000, n - 1_108] {
            let mut keys: Vec<NewIntent> = (registered..registered + batch).map(|i| intent(&s1, &key(i))).collect();
            keys.push(intent(&s1, &key(0)));
            outbox.register(keys.into_iter(), t0);
            registered += batch;
        }
        let mut inner = outbox.lock();
        assert_eq!(inner.slots.len(), n, "a key registered again is not a new entry");
        for i in 0..n {
            let (pos, e) = inner.entry(&key(i)).unwrap_or_else(|| panic!("{} is found", key(i)));
            assert_eq!((pos as usize, e.key.as_str()), (i, key(i).as_str()));
        }
        assert!(inner.entry("key-absent").is_none());
        // Deliver every third key, purge those, and register every key again from another
        // session: the purged keys stay gone, the others are attached.
        let scope = Scope::all();
        let owner: Arc<str> = Arc::from("drain");
        let claimed = inner
            .claim(&ClaimRequest {
                scope: &scope,
                limit: n,
                owner: &owner,
                lease: Duration::from_secs(60),
                now: t0,
                policy: crate::store::ClaimPolicy::none(),
            })
            .claims;
        assert_eq!(claimed.len(), n);
        for d in claimed
            .iter()
            .filter(|d| d.key().as_str()[4..].parse::<usize>().unwrap() % 3 == 0)
        {
            inner.record(&recording(d.key().clone(), d), t0);
        }
        let purged = (0..n).filter(|i| i % 3 == 0).count() as u64;
        assert_eq!(
            inner.purge(PurgeFilter::Delivered, t0 + Duration::from_secs(1), usize::MAX),
            purged
        );
        inner.register((0..n).map(|i| intent(&s2, &key(i))), t0);
        assert_eq!(inner.slots.len(), n, "no key is registered twice, purged or not");
        for i in 0..n {
            match inner.entry(&key(i)) {
                None => assert_eq!(i % 3, 0, "{} is live", key(i)),
                Some((pos, e)) => {
                    assert_ne!(i % 3, 0, "{} was purged", key(i));
                    assert_eq!((pos as usize, e.key.as_str()), (i, key(i).as_str()));
                    assert_eq!(e.members(), [1], "{} is attached to the second session", key(i));
                }
            }
        }
        assert_eq!(inner.index.len() as u64, n as u64 - purged);
        assert_eq!(inner.purged.len() as u64, purged);
    }

    #[test]
    fn a_delivery_at_the_end_of_time_still_reads_as_delivered() {
        // A time from outside whose milliseconds do not fit in a u64.
        let end = UNIX_EPOCH + Duration::from_secs(u64::MAX / 500);
        let session: Arc<str> = Arc::from("s");
        let outbox = MemoryOutbox::new();
        outbox.register([intent(&session, "k1")].into_iter(), end);
        let scope = Scope::all();
        let owner: Arc<str> = Arc::from("drain");
        let mut inner = outbox.lock();
        let claimed = inner
            .claim(&ClaimRequest {
                scope: &scope,
                limit: 1,
                owner: &owner,
                lease: Duration::MAX,
                now: end,
                policy: crate::store::ClaimPolicy::none(),
            })
            .claims;
        assert_eq!(claimed.len(), 1);
        let recorded = inner.record(&recording(claimed[0].key().clone(), &claimed[0]), end);
        assert_eq!(recorded, Recorded::Accepted(DeliveryStatus::Delivered));
        let (_, e) = inner.entry("k1").unwrap();
        let d = e.delivery(&inner.kinds);
        assert_eq!(d.status(), DeliveryStatus::Delivered);
        assert!(
            d.delivered_at().is_some_and(|at| at > UNIX_EPOCH),
            "{:?}",
            d.delivered_at()
        );
        assert_eq!(
            inner.attempts("k1").unwrap().last().map(|a| a.outcome.clone()),
            Some(AttemptOutcome::Delivered)
        );
    }
}

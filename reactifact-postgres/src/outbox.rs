//! [`PostgresOutbox`]: the outbox of a PostgreSQL database, an [`OutboxStore`] any number of
//! processes share.
//!
//! Every operation is one statement where it can be (a claim is two: the reclaim of expired
//! leases, then the claim proper), each in its own transaction, on a connection of the pool:
//!
//! - a **claim** locks the due rows it takes with `FOR UPDATE SKIP LOCKED` (served by the
//!   partial index of due rows), and in the same statement puts the intact ones in flight and
//!   holds the damaged ones; two concurrent claims, in one process or two, never take one row;
//! - a **record** of a batch is one `UPDATE … FROM unnest(…)`, fenced per row on `status = in
//!   flight AND token`, so a batch of outcomes is one commit (group commit);
//! - a **renew** of a batch is one statement, fenced the same way.
//!
//! Every statement that writes a row writes its digest (`outbox_digest`, see the schema) in the
//! same `SET`, and checks the old one in its `WHERE`: a row changed outside reactifact is
//! held, never delivered.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use deadpool_postgres::{Object, Pool, PoolError};
use reactifact_core::error::{ApprovalError, CancelError, RetryError, StoreError};
use reactifact_core::ledger::{
    Attempt, AttemptOutcome, Delivery, DeliveryStatus, FenceToken, LedgerQuery, Page, PurgeFilter, StatusCounts,
};
use reactifact_core::store::{
    check_decision, micros, reclaimed_error, taken_over_error, BoxFuture, ClaimOrder, ClaimPolicy, ClaimRequest,
    Claimed, LastError, NewIntent, OutboxStore, Outcome, RateBucket, RateSpend, RateState, Recorded, Recording,
    Verdict, Wakeups, ATTEMPTS_KEPT,
};
use reactifact_core::{ActionKey, Scope};
use tokio::sync::{oneshot, watch};
use tokio_postgres::types::ToSql;
use tokio_postgres::GenericClient;

use crate::connect::{pool_error, store_error, valid_schema, DriverError, PostgresOptions, Target};
use crate::listen::{self, Notifications};
use crate::row::{self, columns, hold_set, intact, ms, set_with_digest, Row};
use crate::schema::{self, quoted};
use crate::OpenError;

/// The outbox of a PostgreSQL store: the delivery ledger as the `outbox` table of the store's
/// schema, shared by every drain of every process connected to it.
///
/// Cheap to clone (every clone shares the pool). Open it with [`PostgresOutbox::connect`] or
/// [`PostgresOutbox::open`]; both create or upgrade the schema first.
#[derive(Clone)]
pub struct PostgresOutbox {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    /// The parsed URL, for the listening connection.
    config: tokio_postgres::Config,
    schema: String,
    /// The schema, quoted, as the statements name it.
    s: String,
    /// How the store names itself (no password).
    name: String,
    /// The `LISTEN`/`NOTIFY` channel.
    channel: String,
    /// A receiver of the listener's wake-ups while it runs (kept so that it runs as long as
    /// the outbox does).
    listener: Mutex<Option<watch::Receiver<u64>>>,
    /// The rate limits whose bucket rows this outbox knows exist (rows are never deleted).
    rate_rows: Mutex<std::collections::HashSet<String>>,
    sql: Statements,
}

/// The statements that do not depend on a scope, built once for the schema.
struct Statements {
    reclaim: String,
    take_over: String,
    record: String,
    renew: String,
    hold_claimed: String,
    attempts: String,
    by_key: String,
    by_key_for_update: String,
    rearm: String,
    cancel: String,
    decide: String,
    register: String,
    attach: String,
    /// Takes the advisory locks of the ordering groups `$1` (sorted), for the rest of the
    /// transaction: registrations into a group and the releases of its next intent run one
    /// at a time, so neither misses the other.
    lock_groups: String,
    /// The first open row of each group of `$1` that is blocked, locked.
    blocked_heads: String,
    /// Blocked rows (`$1`) made pending or awaiting approval (`$2` their status, `$3` their due
    /// time) at `$4`.
    promote: String,
    /// Whether the group `$1` has an open row registered before the row `$2`.
    open_before: String,
    /// The group of the row of key `$1`.
    group_of: String,
    /// After an insert: deletes what it inserted of a key a concurrent prune tombstoned, and
    /// notifies.
    unprune_and_notify: String,
    /// The purge (and prune) batch statements of [`PurgeFilter::Final`], `Delivered` and `Cancelled`.
    purge: [String; 4],
    /// Inserts the rows of the rate limits `$1` that have none (full, not paused).
    rates_insert: String,
    /// The state of the rate limits `$1`, their rows locked in name order; a row another
    /// transaction holds is skipped.
    rates_lock: String,
    /// Writes the theoretical arrival times `$2` of the rate limits `$1`.
    rates_spent: String,
    /// Pauses the rate limit `$1` until `$2` (a pause only lengthens).
    rates_pause: String,
}

impl std::fmt::Debug for PostgresOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOutbox")
            .field("store", &self.inner.name)
            .finish()
    }
}

/// Parameters of a statement built at run time, numbered as they are pushed.
#[derive(Default)]
struct Params {
    values: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl Params {
    /// Adds a value; returns its placeholder (`$n`).
    fn push(&mut self, value: impl ToSql + Sync + Send + 'static) -> String {
        self.values.push(Box::new(value));
        format!("${}", self.values.len())
    }

    fn refs(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.values.iter().map(|v| &**v as &(dyn ToSql + Sync)).collect()
    }
}

/// How long a claim takes a rate limit whose bucket another claim holds as paused: the
/// drain looks again after it.
const BUSY_BUCKET: Duration = Duration::from_millis(20);

/// How a claim that chooses kind by kind ([`Inner::claim_sql`]) treats the kinds its policy
/// names: per kind, its rate limit's bucket and allowance (`None`: not limited), and its
/// priority.
#[derive(Default)]
struct Shares {
    kinds: Vec<String>,
    buckets: Vec<Option<String>>,
    caps: Vec<Option<i64>>,
    priorities: Vec<i32>,
}

impl Shares {
    fn of(spend: &RateSpend<'_>, policy: &ClaimPolicy) -> Shares {
        let mut shares = Shares::default();
        for (bucket, allowed) in spend.allowances() {
            for kind in &bucket.kinds {
                shares.kinds.push(kind.to_string());
                shares.buckets.push(Some(bucket.name.to_string()));
                shares.caps.push(Some(i64::from(allowed)));
                shares.priorities.push(policy.priority_of(kind));
            }
        }
        for (kind, priority) in &policy.priorities {
            if !shares.kinds.iter().any(|k| k == &**kind) {
                shares.kinds.push(kind.to_string());
                shares.buckets.push(None);
                shares.caps.push(None);
                shares.priorities.push(*priority);
            }
        }
        shares
    }
}

/// ` AND …` restricting rows `o` to `scope`.
fn scope_sql(s: &str, scope: &Scope, params: &mut Params) -> String {
    let mut sql = String::new();
    if let Some(sessions) = scope.session_filter() {
        let list = params.push(sessions.iter().map(ToString::to_string).collect::<Vec<String>>());
        sql.push_str(&format!(
            " AND (o.session = ANY({list}) OR EXISTS (SELECT 1 FROM {s}.outbox_members m WHERE m.key = o.key AND m.session = ANY({list})))"
        ));
    }
    if let Some(kinds) = scope.kind_filter() {
        let list = params.push(kinds.iter().map(ToString::to_string).collect::<Vec<String>>());
        sql.push_str(&format!(" AND o.kind = ANY({list})"));
    }
    sql
}

/// The columns of the record statement's `u`: what each outcome of a batch does to its row
/// (`Outcome::transition`, the table every store applies), one array per column.
#[derive(Default)]
struct Transitions {
    status: Vec<i64>,
    error: Vec<Option<String>>,
    next_at: Vec<Option<i64>>,
    due: Vec<Option<i64>>,
    uncount: Vec<bool>,
    interrupted: Vec<bool>,
    keep_error: Vec<bool>,
    delivered: Vec<bool>,
    history: Vec<Option<i64>>,
}

impl Transitions {
    fn of(batch: &[Recording], now: SystemTime) -> Transitions {
        let mut t = Transitions::default();
        for r in batch {
            let change = r.outcome.transition();
            t.status.push(i64::from(change.status.code()));
            t.due.push(change.due_at(now).map(ms));
            t.next_at.push(change.next_attempt_at.map(ms));
            t.uncount.push(change.uncount_attempt);
            t.interrupted.push(change.count_interrupted);
            t.keep_error.push(change.last_error == LastError::Keep);
            t.error.push(match change.last_error {
                LastError::Set(error) => Some(error.to_owned()),
                LastError::Clear | LastError::Keep => None,
            });
            t.delivered.push(change.delivered);
            t.history.push(change.history.as_ref().map(|h| i64::from(h.code().0)));
        }
        t
    }
}

/// The columns of the registration statement's batch, one array per column.
pub(crate) struct Registration<'a> {
    pub(crate) keys: Vec<&'a str>,
    pub(crate) kinds: Vec<&'a str>,
    pub(crate) sessions: Vec<&'a str>,
    pub(crate) commits: Vec<Vec<u8>>,
    pub(crate) generations: Vec<i64>,
    pub(crate) runs: Vec<i64>,
    pub(crate) hashes: Vec<&'a [u8]>,
    pub(crate) bytes: Vec<&'a [u8]>,
    pub(crate) now: i64,
    pub(crate) awaiting: Vec<bool>,
    pub(crate) traces: Vec<Option<Vec<u8>>>,
    pub(crate) not_before: Vec<Option<i64>>,
    pub(crate) groups: Vec<Option<String>>,
}

impl<'a> Registration<'a> {
    pub(crate) fn of(intents: &'a [NewIntent], now: SystemTime) -> Self {
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        Registration {
            keys: intents.iter().map(|n| n.intent.key().as_str()).collect(),
            kinds: intents.iter().map(|n| n.intent.kind()).collect(),
            sessions: intents.iter().map(|n| n.intent.origin().session()).collect(),
            commits: intents.iter().map(|n| n.intent.origin().commit().0.to_vec()).collect(),
            generations: intents.iter().map(|n| int(n.intent.origin().generation().0)).collect(),
            runs: intents
                .iter()
                .map(|n| i64::try_from(n.intent.origin().run()).unwrap_or(i64::MAX))
                .collect(),
            hashes: intents.iter().map(|n| &n.action_hash.0[..]).collect(),
            bytes: intents.iter().map(|n| &n.bytes[..]).collect(),
            now: ms(now),
            awaiting: intents.iter().map(NewIntent::requires_approval).collect(),
            traces: intents
                .iter()
                .map(|n| n.intent.trace_parent().map(|t| t.to_bytes().to_vec()))
                .collect(),
            not_before: intents.iter().map(|n| n.not_before().map(ms)).collect(),
            groups: intents.iter().map(NewIntent::group).collect(),
        }
    }

    /// Whether an intent of the batch names an ordering group.
    pub(crate) fn grouped(&self) -> bool {
        self.groups.iter().any(Option::is_some)
    }

    /// Whether, with `inserted` rows inserted, some key of the batch was held already (to be
    /// attached to its session).
    pub(crate) fn some_held(&self, inserted: i64) -> bool {
        let mut distinct = self.keys.clone();
        distinct.sort_unstable();
        distinct.dedup();
        usize::try_from(inserted).unwrap_or(0) < distinct.len()
    }
}

/// A statement that ends the leases of the in-flight rows `rows` selects (a `WHERE` condition
/// and an `ORDER BY` of rows `o`) at `$1`, their holders dead or stalled past them: each
/// attempt ended expired in the history, each row pending and due at `$1`, one more expired
/// lease, `last_error` from the template `$2` (`chr(1)` the attempt, `chr(2)` the holder); a
/// damaged row is held. `result` selects from `r` (the rows ended, by `seq`), `e` (the rows
/// selected) and `h` (the keys held).
fn end_leases_sql(s: &str, rows: &str, result: &str) -> String {
    let ok = intact(s, "o");
    format!(
        "WITH e AS MATERIALIZED (
             SELECT o.seq, o.key, o.token, o.attempts, o.owner, o.updated_at, o.lease_until
               FROM {s}.outbox o WHERE {rows} FOR UPDATE SKIP LOCKED
         ), r AS (
             UPDATE {s}.outbox o SET {set} FROM e WHERE o.seq = e.seq AND o.status = 1 AND {ok} RETURNING o.seq
         ), ended AS (
             -- The ended attempts, in the history (an in-flight row's updated_at is its
             -- claim's time).
             INSERT INTO {s}.outbox_attempts
                 (key, token, number, owner, claimed_at, lease_until, ended_at, outcome, error, retry_at)
             SELECT e.key, e.token, e.attempts, e.owner, e.updated_at, e.lease_until, $1, {expired}, NULL, NULL
               FROM e JOIN r ON r.seq = e.seq
             ON CONFLICT (key, token) DO NOTHING
         ), trimmed AS (
             -- Only the latest attempts are kept: the statement sees the history as it was
             -- before it, so the older ones beyond all but one make room for the new one.
             DELETE FROM {s}.outbox_attempts a USING e JOIN r ON r.seq = e.seq
              WHERE a.key = e.key AND a.token < (SELECT b.token FROM {s}.outbox_attempts b WHERE b.key = e.key
                                                  ORDER BY b.token DESC LIMIT 1 OFFSET {keep_old})
         ), h AS (
             UPDATE {s}.outbox o SET {hold} FROM e WHERE o.seq = e.seq AND NOT {ok} RETURNING o.key
         )
         {result}",
        set = set_with_digest(
            s,
            "o",
            &[
                ("status", "0::bigint"),
                ("due_at", "$1"),
                ("owner", "NULL::text"),
                ("lease_until", "NULL::bigint"),
                ("expired", "o.expired + 1"),
                (
                    "last_error",
                    "replace(replace($2::text, chr(1), o.attempts::text), chr(2), o.owner)"
                ),
                ("next_attempt_at", "NULL::bigint"),
                ("updated_at", "$1"),
            ],
        ),
        hold = hold_set(s, "o", "$1"),
        expired = AttemptOutcome::Expired.code().0,
        keep_old = ATTEMPTS_KEPT - 2,
    )
}

impl Statements {
    fn new(s: &str) -> Statements {
        let cols = columns(s);
        let ok = intact(s, "o");
        // The reclaim of expired leases ($1 now, $2 the `last_error` template), and the take-over
        // of the claims of one owner ($3), proved dead: the same transition.
        let reclaim = end_leases_sql(
            s,
            "o.lease_until <= $1 ORDER BY o.lease_until, o.seq",
            "SELECT (SELECT count(*) FROM r), (SELECT array_agg(key) FROM h)",
        );
        let take_over = end_leases_sql(
            s,
            "o.lease_until IS NOT NULL AND o.owner = $3::text ORDER BY o.seq",
            "SELECT (SELECT array_agg(e.key ORDER BY e.seq) FROM e JOIN r ON r.seq = e.seq), (SELECT array_agg(key) FROM h)",
        );
        let record = format!(
            "WITH u AS MATERIALIZED (
                 SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::bigint[], $7::bigint[],
                                     $8::bool[], $9::bool[], $10::bool[], $11::bool[], $12::bigint[])
                     WITH ORDINALITY AS u(key, token, status, error, next_at, due, uncount, interrupted,
                                          keep_error, delivered, history, ord)
             ), t AS MATERIALIZED (
                 -- The rows, locked in one order (seq) by every record and renewal, and each
                 -- checked once, as locked. The rows of ordering groups only when $13 lets
                 -- (a transaction that holds their groups' locks: their outcome may release
                 -- the next intent of the group).
                 SELECT u.ord, o.seq, ({ok}) AS ok, o.key, o.token, o.attempts, o.owner, o.updated_at, o.lease_until
                   FROM u JOIN {s}.outbox o ON o.key = u.key
                  WHERE $13::bool OR o.grp IS NULL
                  ORDER BY o.seq FOR UPDATE OF o
             ), done AS (
                 UPDATE {s}.outbox o SET {set} FROM t JOIN u ON u.ord = t.ord
                  WHERE o.seq = t.seq AND t.ok AND o.status = 1 AND o.token = u.token
                 RETURNING u.ord, o.status
             ), ended AS (
                 -- Accepted outcomes other than delivered and released end an attempt of the
                 -- history, as it was in flight (its updated_at is its claim's time).
                 INSERT INTO {s}.outbox_attempts
                     (key, token, number, owner, claimed_at, lease_until, ended_at, outcome, error, retry_at)
                 SELECT t.key, t.token, t.attempts, t.owner, t.updated_at, t.lease_until, $6::bigint,
                        u.history, u.error, u.next_at
                   FROM done d JOIN t ON t.ord = d.ord JOIN u ON u.ord = d.ord
                  WHERE u.history IS NOT NULL
                 ON CONFLICT (key, token) DO NOTHING
             ), trimmed AS (
                 -- Only the latest attempts are kept (as in the reclaim statement).
                 DELETE FROM {s}.outbox_attempts a USING done d JOIN t ON t.ord = d.ord JOIN u ON u.ord = d.ord
                  WHERE u.history IS NOT NULL AND a.key = t.key
                    AND a.token < (SELECT b.token FROM {s}.outbox_attempts b WHERE b.key = t.key
                                    ORDER BY b.token DESC LIMIT 1 OFFSET {keep_old})
             ), bad AS (
                 UPDATE {s}.outbox o SET {hold} FROM t WHERE o.seq = t.seq AND NOT t.ok RETURNING t.ord
             )
             SELECT d.status, b.ord IS NOT NULL, cur.status, cur.token, cur.grp
               FROM u LEFT JOIN done d ON d.ord = u.ord LEFT JOIN bad b ON b.ord = u.ord
                      LEFT JOIN {s}.outbox cur ON cur.key = u.key
              ORDER BY u.ord",
            set = set_with_digest(
                s,
                "o",
                &[
                    // What the outcome does is computed in Rust (`Outcome::transition`), the
                    // one table every store applies; the statement only applies it.
                    ("status", "u.status"),
                    ("due_at", "u.due"),
                    ("owner", "NULL::text"),
                    ("lease_until", "NULL::bigint"),
                    (
                        "attempts",
                        "CASE WHEN u.uncount THEN greatest(o.attempts - 1, 0) ELSE o.attempts END"
                    ),
                    ("interrupted", "o.interrupted + u.interrupted::int"),
                    (
                        "last_error",
                        "CASE WHEN u.keep_error THEN o.last_error ELSE u.error END"
                    ),
                    ("updated_at", "$6::bigint"),
                    (
                        "delivered_at",
                        "CASE WHEN u.delivered THEN $6::bigint ELSE o.delivered_at END"
                    ),
                    ("next_attempt_at", "u.next_at"),
                ],
            ),
            hold = hold_set(s, "o", "$6::bigint"),
            keep_old = ATTEMPTS_KEPT - 2,
        );
        let renew = format!(
            "WITH u AS MATERIALIZED (
                 SELECT * FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS u(key, token, ord)
             ), t AS MATERIALIZED (
                 SELECT o.seq, ({ok}) AS ok FROM u JOIN {s}.outbox o ON o.key = u.key
                  ORDER BY o.seq FOR UPDATE OF o
             ), r AS (
                 UPDATE {s}.outbox o SET {set} FROM t
                  WHERE o.seq = t.seq AND t.ok AND o.status = 1
                    AND o.token IN (SELECT u.token FROM u WHERE u.key = o.key)
                 RETURNING o.key, o.token
             )
             SELECT EXISTS (SELECT 1 FROM r WHERE r.key = u.key AND r.token = u.token) FROM u ORDER BY u.ord",
            set = set_with_digest(s, "o", &[("lease_until", "$3::bigint"), ("claim_until", "$3::bigint")]),
        );
        let hold_claimed = format!(
            "UPDATE {s}.outbox o SET {set} WHERE o.seq = $1 AND o.status = 1 AND o.token = $4",
            set = set_with_digest(
                s,
                "o",
                &[
                    ("status", "5::bigint"),
                    ("due_at", "NULL::bigint"),
                    ("owner", "NULL::text"),
                    ("lease_until", "NULL::bigint"),
                    ("next_attempt_at", "NULL::bigint"),
                    ("attempts", "greatest(o.attempts - 1, 0)"),
                    ("last_error", "$2::text"),
                    ("updated_at", "$3::bigint"),
                ],
            ),
        );
        let by_key = format!("SELECT {cols} FROM {s}.outbox o WHERE o.key = $1");
        // One statement, one snapshot: the ended attempts, then the last claim (a row for
        // every held key, with a NULL outcome unless it is in flight or delivered).
        let attempts = format!(
            "SELECT 0 AS part, h.token, h.number, h.owner, h.claimed_at, h.lease_until, h.ended_at, h.outcome,
                    h.error, h.retry_at
               FROM {s}.outbox_attempts h WHERE h.key = $1
             UNION ALL
             SELECT 1, o.token, o.attempts,
                    CASE WHEN o.status = 1 THEN o.owner ELSE o.claim_owner END,
                    CASE WHEN o.status = 1 THEN o.updated_at ELSE o.claimed_at END,
                    CASE WHEN o.status = 1 THEN o.lease_until ELSE o.claim_until END,
                    CASE WHEN o.status = 2 THEN o.delivered_at END,
                    CASE WHEN o.status = 1 THEN {in_flight}::bigint
                         WHEN o.status = 2 AND o.claim_token = o.token THEN {delivered}::bigint END,
                    NULL::text, NULL::bigint
               FROM {s}.outbox o WHERE o.key = $1
              ORDER BY 1, 2",
            in_flight = AttemptOutcome::InFlight.code().0,
            delivered = AttemptOutcome::Delivered.code().0,
        );
        let by_key_for_update = format!("{by_key} FOR UPDATE");
        let rearm = format!(
            "UPDATE {s}.outbox o SET {set} WHERE o.seq = $1 RETURNING {cols}",
            set = set_with_digest(
                s,
                "o",
                &[
                    // $3: pending (due at $4, now or its `not_before`), awaiting approval again
                    // (an intent that requires it and never had it), or blocked (behind an
                    // earlier open intent of its group); $4 NULL for the last two.
                    ("status", "$3::bigint"),
                    ("due_at", "$4::bigint"),
                    ("owner", "NULL::text"),
                    ("lease_until", "NULL::bigint"),
                    ("next_attempt_at", "NULL::bigint"),
                    ("updated_at", "$2::bigint"),
                ],
            ),
        );
        // An operator's decision: $3 the verdict's code (1 approved: pending, due at $6, now or
        // its `not_before`; 2 rejected), $4 who, $5 why; bound to the action hash the row
        // holds (a claim hands it out only while it still holds it).
        let decide = format!(
            "UPDATE {s}.outbox o SET {set} WHERE o.seq = $1 AND o.status = 7 RETURNING {cols}",
            set = set_with_digest(
                s,
                "o",
                &[
                    ("status", "CASE WHEN $3::bigint = 1 THEN 0 ELSE 8 END::bigint"),
                    ("due_at", "CASE WHEN $3::bigint = 1 THEN $6::bigint END::bigint"),
                    ("decision", "$3::bigint"),
                    ("decided_by", "$4::text"),
                    ("decided_at", "$2::bigint"),
                    ("decision_reason", "$5::text"),
                    ("decided_digest", "o.action_hash"),
                    ("updated_at", "$2::bigint"),
                ],
            ),
        );
        let cancel = format!(
            "UPDATE {s}.outbox o SET {set} WHERE o.seq = $1 RETURNING {cols}",
            set = set_with_digest(
                s,
                "o",
                &[
                    ("status", "6::bigint"),
                    ("due_at", "NULL::bigint"),
                    ("owner", "NULL::text"),
                    ("lease_until", "NULL::bigint"),
                    ("next_attempt_at", "NULL::bigint"),
                    ("cancel_reason", "$3::text"),
                    ("updated_at", "$2::bigint"),
                ],
            ),
        );
        // An intent behind an open one of its ordering group ($13, NULL for none) is registered
        // blocked (9), not due; one that requires approval ($10) awaiting it (7), not due; the
        // others are due now ($9) or at their `not_before` ($12, NULL for none), whichever is
        // later. Its trace context ($11, NULL for none) and its group are kept beside it,
        // outside the digest.
        let fresh = "n.key, n.kind, n.session, n.origin_commit, n.origin_gen, n.origin_run, n.action_hash, n.bytes, \
             $9::bigint, CASE WHEN n.blocked THEN 9 WHEN n.awaiting THEN 7 ELSE 0 END::bigint, \
             CASE WHEN n.blocked OR n.awaiting THEN NULL ELSE greatest($9::bigint, n.not_before) END::bigint, 0::bigint, NULL::text, NULL::bigint, 0::bigint, \
             0::bigint, 0::bigint, NULL::text, NULL::text, $9::bigint, NULL::bigint, NULL::bigint, NULL::bigint, \
             NULL::text, NULL::bigint, NULL::text";
        let register = format!(
            "WITH given AS (
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::bigint[], $6::bigint[],
                                      $7::bytea[], $8::bytea[], $10::bool[], $11::bytea[], $12::bigint[], $13::text[])
                     WITH ORDINALITY AS n(key, kind, session, origin_commit, origin_gen, origin_run, action_hash, bytes,
                                          awaiting, trace_parent, not_before, grp, ord)
             ), n AS (
                 -- Blocked: its group has an open row, or a new key of it comes earlier in this
                 -- batch (a key the outbox holds is not inserted, and does not count).
                 SELECT g.*, g.grp IS NOT NULL AND (
                            count(*) FILTER (WHERE g.grp IS NOT NULL AND NOT EXISTS (
                                SELECT 1 FROM {s}.outbox o WHERE o.key = g.key))
                                OVER (PARTITION BY g.grp ORDER BY g.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) > 0
                            OR EXISTS (SELECT 1 FROM {s}.outbox p WHERE p.grp = g.grp AND p.status NOT IN (2, 6, 8))
                        ) AS blocked
                   FROM given g
             ), ins AS (
                 INSERT INTO {s}.outbox (key, kind, session, origin_commit, origin_gen, origin_run, action_hash, bytes,
                     recorded_at, status, due_at, token, owner, lease_until, attempts, expired, interrupted,
                     last_error, cancel_reason, updated_at, delivered_at, next_attempt_at, decision, decided_by,
                     decided_at, decision_reason, digest, trace_parent, grp)
                 SELECT {fresh}, {s}.outbox_digest({fresh}), n.trace_parent, n.grp
                   FROM n WHERE NOT EXISTS (SELECT 1 FROM {s}.outbox_purged p WHERE p.key = n.key)
                  ORDER BY n.ord
                 ON CONFLICT (key) DO NOTHING
                 RETURNING 1
             )
             SELECT count(*) FROM ins"
        );
        // The locks in one order (by name), through a subquery the planner keeps as it is.
        let lock_groups = format!(
            "SELECT count(pg_advisory_xact_lock({GROUP_LOCK_CLASS}, hashtext('{s}:' || g)))
               FROM (SELECT DISTINCT g FROM unnest($1::text[]) AS g WHERE g IS NOT NULL ORDER BY g OFFSET 0) AS l"
        );
        let blocked_heads = format!(
            "WITH h AS (
                 SELECT DISTINCT ON (p.grp) p.seq, p.status FROM {s}.outbox p
                  WHERE p.grp = ANY($1::text[]) AND p.status NOT IN (2, 6, 8)
                  ORDER BY p.grp, p.seq
             )
             SELECT {cols} FROM {s}.outbox o JOIN h ON h.seq = o.seq WHERE h.status = 9
              ORDER BY o.seq FOR UPDATE OF o"
        );
        let promote = format!(
            "UPDATE {s}.outbox o SET {set}
               FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS u(seq, status, due)
              WHERE o.seq = u.seq AND o.status = 9",
            set = set_with_digest(
                s,
                "o",
                &[
                    ("status", "u.status"),
                    ("due_at", "u.due"),
                    ("updated_at", "$4::bigint"),
                ],
            ),
        );
        let group_of = format!("SELECT o.grp FROM {s}.outbox o WHERE o.key = $1");
        let open_before = format!(
            "SELECT EXISTS (SELECT 1 FROM {s}.outbox o WHERE o.grp = $1 AND o.seq < $2 AND o.status NOT IN (2, 6, 8))"
        );
        let attach = format!(
            "INSERT INTO {s}.outbox_members (session, key)
             SELECT n.session, o.key FROM unnest($1::text[], $2::text[]) AS n(session, key)
               JOIN {s}.outbox o ON o.key = n.key
              WHERE o.session <> n.session AND o.status NOT IN (2, 6, 8)
             ON CONFLICT DO NOTHING"
        );
        // A registration whose insert waited for a concurrent prune of the same key (the old
        // row locked, then deleted) inserts the key again, because the tombstone was not in
        // its snapshot; this next statement, with a snapshot of its own, sees the prune's
        // tombstone and takes the row out again, in the same transaction.
        let unprune_and_notify = format!(
            "WITH d AS (
                 DELETE FROM {s}.outbox o WHERE o.key = ANY($2::text[])
                    AND EXISTS (SELECT 1 FROM {s}.outbox_purged p WHERE p.key = o.key)
                 RETURNING o.key
             )
             SELECT pg_notify($1, ''), (SELECT count(*) FROM d)"
        );
        Statements {
            rates_insert: format!(
                "INSERT INTO {s}.outbox_rates (name, tat, paused_until) SELECT n, 0, 0 FROM unnest($1::text[]) n
                 ON CONFLICT (name) DO NOTHING"
            ),
            rates_lock: format!(
                "SELECT name, tat, paused_until FROM {s}.outbox_rates WHERE name = ANY($1::text[])
                  ORDER BY name FOR UPDATE SKIP LOCKED"
            ),
            rates_spent: format!(
                "UPDATE {s}.outbox_rates r SET tat = v.tat FROM unnest($1::text[], $2::bigint[]) v(name, tat) WHERE r.name = v.name"
            ),
            rates_pause: format!(
                "INSERT INTO {s}.outbox_rates AS r (name, tat, paused_until) VALUES ($1, 0, $2)
                 ON CONFLICT (name) DO UPDATE SET paused_until = greatest(r.paused_until, excluded.paused_until)"
            ),
            attempts,
            purge: [
                PurgeFilter::Final,
                PurgeFilter::Delivered,
                PurgeFilter::Cancelled,
                PurgeFilter::Rejected,
            ]
            .map(|filter| crate::prune::statement(s, filter)),
            unprune_and_notify,
            reclaim,
            take_over,
            record,
            renew,
            hold_claimed,
            by_key,
            by_key_for_update,
            rearm,
            cancel,
            decide,
            register,
            attach,
            lock_groups,
            blocked_heads,
            promote,
            open_before,
            group_of,
        }
    }
}

impl PostgresOutbox {
    /// Connects to the server at `url` and opens the store in schema
    /// [`DEFAULT_SCHEMA`](crate::DEFAULT_SCHEMA), creating or upgrading it.
    ///
    /// # Errors
    /// See [`PostgresOutbox::open`].
    pub async fn connect(url: &str) -> Result<Arc<PostgresOutbox>, OpenError> {
        Self::open(PostgresOptions::new(url)).await
    }

    /// Connects as `options` say and opens the store in its schema, creating the schema or
    /// upgrading it to this build's version first (under an advisory lock: concurrent opens
    /// wait for each other).
    ///
    /// # Errors
    /// [`OpenError::BadUrl`], [`OpenError::BadSchema`]; [`OpenError::Connect`] (naming host,
    /// port, database and user) when no connection can be made; [`OpenError::ForeignSchema`] for a
    /// schema of another program; [`OpenError::NewerSchema`] for a schema a newer build
    /// migrated; [`OpenError::Prepare`] for an error of the server while migrating.
    pub async fn open(options: PostgresOptions) -> Result<Arc<PostgresOutbox>, OpenError> {
        let schema = options.schema_name().to_owned();
        if !valid_schema(&schema) {
            return Err(OpenError::BadSchema { schema });
        }
        let target = Target::parse(&options)?;
        let name = target.describe(&schema);
        let pool = target.pool(options.pool_size_value(), options.connect_timeout_value())?;
        let mut client = pool.get().await.map_err(|e| match e {
            PoolError::Backend(e) => target.connect_error(DriverError::boxed(e)),
            other => target.connect_error(other.to_string()),
        })?;
        schema::migrate(&mut client, &schema, &name, options.may_migrate()).await?;
        drop(client);
        let s = quoted(&schema);
        Ok(Arc::new(PostgresOutbox {
            inner: Arc::new(Inner {
                pool,
                config: target.config.clone(),
                // At most 11 + 48 bytes: PostgreSQL refuses a channel name of 64 bytes or more.
                channel: format!("reactifact_{schema}"),
                sql: Statements::new(&s),
                s,
                schema,
                name,
                listener: Mutex::new(None),
                rate_rows: Mutex::default(),
            }),
        }))
    }

    /// The schema (namespace) the store lives in.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// The store's pool, for code that writes in the same database (a commit that registers
    /// its intents in its own transaction, see [`register`](Self::register)).
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The `NOTIFY` channel registrations notify.
    pub fn channel(&self) -> &str {
        &self.inner.channel
    }

    /// Starts listening for the store's notifications (once per outbox; later calls share
    /// the connection) and returns a waiter. A drainer waits on
    /// [`Notifications::next`] and on its poll interval, whichever comes first, and claims
    /// when either does. Must be called within a tokio runtime.
    pub fn listen(&self) -> Notifications {
        let mut listener = self.inner.listener.lock().unwrap_or_else(|e| e.into_inner());
        let receiver = listener.get_or_insert_with(|| {
            let (sender, receiver) = watch::channel(0u64);
            tokio::spawn(listen::run(
                self.inner.config.clone(),
                self.inner.channel.clone(),
                self.inner.name.clone(),
                sender,
            ));
            receiver
        });
        Notifications::new(receiver.clone())
    }

    /// Registers intents in a transaction: a commit's, or one the application owns (the
    /// transactional outbox: its own rows and the intents that go with them, committed
    /// together or not at all; build them with [`Enqueue`](reactifact_core::store::Enqueue)).
    /// `client` is that transaction (or any client of the store's database), `now` the time
    /// of registration. A key neither held nor purged is inserted, pending and due at `now`
    /// (or at its `not_before`, blocked behind its ordering group, or awaiting approval),
    /// owned by its intent's session, with its trace context
    /// ([`Intent::trace_parent`](reactifact_core::Intent::trace_parent), kept beside it); a
    /// key held (not final) by another session is attached to the intent's; a final or purged
    /// key is left alone. Notifies the store's channel when it inserted any (the notification
    /// goes out when the transaction commits, waking drainers at once); a rolled-back
    /// transaction leaves nothing.
    ///
    /// # Errors
    /// [`StoreError::Backend`] for an error of the server; the transaction should be rolled
    /// back.
    pub async fn register<C: GenericClient + Sync>(
        &self,
        client: &C,
        intents: &[NewIntent],
        now: SystemTime,
    ) -> Result<(), StoreError> {
        self.register_on(&Plain(client), intents, now).await
    }

    /// [`register`](Self::register) in an sqlx transaction of the application (or on any sqlx
    /// connection to the store's database: `&mut *tx` for a `sqlx::Transaction`), with the
    /// same rules: the intents are delivered only if the transaction commits, and the
    /// notification that wakes drainers goes out with the commit. Feature `sqlx`.
    ///
    /// # Errors
    /// [`StoreError::Backend`] for an error of the server (the sqlx error inside); the
    /// transaction should be rolled back.
    #[cfg(feature = "sqlx")]
    pub async fn register_sqlx(
        &self,
        conn: &mut sqlx::PgConnection,
        intents: &[NewIntent],
        now: SystemTime,
    ) -> Result<(), StoreError> {
        use sqlx::Row as _;
        if intents.is_empty() {
            return Ok(());
        }
        let err = |e: sqlx::Error| {
            let retryable = matches!(e, sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut);
            StoreError::backend(self.inner.name.clone(), retryable, e)
        };
        let r = Registration::of(intents, now);
        let sql = &self.inner.sql;
        if r.grouped() {
            sqlx::query(&sql.lock_groups)
                .bind(&r.groups)
                .execute(&mut *conn)
                .await
                .map_err(err)?;
        }
        let hashes: Vec<Vec<u8>> = r.hashes.iter().map(|h| h.to_vec()).collect();
        let bytes: Vec<Vec<u8>> = r.bytes.iter().map(|b| b.to_vec()).collect();
        let inserted: i64 = sqlx::query(&sql.register)
            .bind(&r.keys)
            .bind(&r.kinds)
            .bind(&r.sessions)
            .bind(&r.commits)
            .bind(&r.generations)
            .bind(&r.runs)
            .bind(&hashes)
            .bind(&bytes)
            .bind(r.now)
            .bind(&r.awaiting)
            .bind(&r.traces)
            .bind(&r.not_before)
            .bind(&r.groups)
            .fetch_one(&mut *conn)
            .await
            .map_err(err)?
            .try_get(0)
            .map_err(err)?;
        if r.some_held(inserted) {
            sqlx::query(&sql.attach)
                .bind(&r.sessions)
                .bind(&r.keys)
                .execute(&mut *conn)
                .await
                .map_err(err)?;
        }
        if inserted > 0 {
            let taken_back: i64 = sqlx::query(&sql.unprune_and_notify)
                .bind(&self.inner.channel)
                .bind(&r.keys)
                .fetch_one(&mut *conn)
                .await
                .map_err(err)?
                .try_get(1)
                .map_err(err)?;
            self.taken_back(taken_back);
        }
        Ok(())
    }

    /// [`register`](Self::register) on a connection that prepares its statements its own way
    /// (the log's connections cache them).
    pub(crate) async fn register_on<C: Prepare>(
        &self,
        client: &C,
        intents: &[NewIntent],
        now: SystemTime,
    ) -> Result<(), StoreError> {
        if intents.is_empty() {
            return Ok(());
        }
        let err = |e| store_error(&self.inner.name, e);
        let r = Registration::of(intents, now);
        if r.grouped() {
            // Registrations into a group, and the releases of its next intent, one at a time
            // (see `lock_groups`); `client` is the registering transaction.
            let lock = client.statement(&self.inner.sql.lock_groups).await.map_err(err)?;
            client.rows(&lock, &[&r.groups]).await.map_err(err)?;
        }
        let one = |rows: Vec<tokio_postgres::Row>| {
            rows.into_iter()
                .next()
                .ok_or_else(|| StoreError::closed(self.inner.name.clone()))
        };
        let register = client.statement(&self.inner.sql.register).await.map_err(err)?;
        let params: &[&(dyn ToSql + Sync)] = &[
            &r.keys,
            &r.kinds,
            &r.sessions,
            &r.commits,
            &r.generations,
            &r.runs,
            &r.hashes,
            &r.bytes,
            &r.now,
            &r.awaiting,
            &r.traces,
            &r.not_before,
            &r.groups,
        ];
        let inserted: i64 = one(client.rows(&register, params).await.map_err(err)?)?.get(0);
        if r.some_held(inserted) {
            let attach = client.statement(&self.inner.sql.attach).await.map_err(err)?;
            client.rows(&attach, &[&r.sessions, &r.keys]).await.map_err(err)?;
        }
        if inserted > 0 {
            let unprune = client
                .statement(&self.inner.sql.unprune_and_notify)
                .await
                .map_err(err)?;
            let taken_back: i64 = one(client
                .rows(&unprune, &[&self.inner.channel, &r.keys])
                .await
                .map_err(err)?)?
            .get(1);
            self.taken_back(taken_back);
        }
        Ok(())
    }

    /// Logs the keys a registration took out again because a concurrent prune tombstoned them.
    fn taken_back(&self, keys: i64) {
        if keys > 0 {
            tracing::debug!(store = %self.inner.name, keys, "registered keys a concurrent prune tombstoned were taken out again");
        }
    }

    /// Claims as `request` says in `tx`, the transaction of a commit on a connection of the
    /// log store ([`PostgresStore`](crate::PostgresStore)): the commit's claim for its turn.
    pub(crate) async fn claim_in<C: Prepare>(&self, tx: &C, request: ClaimRequest<'_>) -> Result<Claimed, StoreError> {
        self.inner.claim_on(tx, &request).await
    }

    /// Gives back claims that were never handed out (a commit whose caller was gone when it
    /// landed): pending and due again, no attempt spent.
    pub(crate) async fn release(&self, claimed: &Claimed, now: SystemTime) {
        self.inner.release(claimed, now).await;
    }

    /// The schema, quoted, as statements name it.
    pub(crate) fn quoted_schema(&self) -> &str {
        &self.inner.s
    }

    /// How the store names itself.
    pub(crate) fn name(&self) -> &str {
        &self.inner.name
    }

    /// Registers `intents` as a commit made at `now` would ([`register`](Self::register)), in
    /// a transaction of its own: for tests and tools that register without a commit.
    pub async fn register_alone(&self, intents: &[NewIntent], now: SystemTime) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let err = |e| store_error(&self.inner.name, e);
        let tx = client.transaction().await.map_err(err)?;
        self.register(&*tx, intents, now).await?;
        tx.commit().await.map_err(err)
    }

    async fn client(&self) -> Result<Object, StoreError> {
        self.inner.pool.get().await.map_err(|e| pool_error(&self.inner.name, e))
    }

    /// The batch statement purging the final rows `filter` admits.
    fn purge_sql(&self, filter: PurgeFilter) -> &str {
        &self.inner.sql.purge[match filter {
            PurgeFilter::Delivered => 1,
            PurgeFilter::Cancelled => 2,
            PurgeFilter::Rejected => 3,
            _ => 0,
        }]
    }

    fn err(&self) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
        move |e| store_error(&self.inner.name, e)
    }
}

/// One row of the attempts statement: `None` for the last claim of a row that is neither in
/// flight nor delivered (or claimed before the history was kept), and for an unknown outcome.
fn attempt_of(row: &tokio_postgres::Row) -> Result<Option<Attempt>, tokio_postgres::Error> {
    let (Some(outcome), Some(owner), Some(claimed_at), Some(lease_until)) = (
        row.try_get::<_, Option<i64>>(7)?,
        row.try_get::<_, Option<String>>(3)?,
        row.try_get::<_, Option<i64>>(4)?,
        row.try_get::<_, Option<i64>>(5)?,
    ) else {
        return Ok(None);
    };
    let retry_at = row.try_get::<_, Option<i64>>(9)?.map(row::time);
    let Some(outcome) = u8::try_from(outcome)
        .ok()
        .and_then(|code| AttemptOutcome::from_code(code, row.try_get(8).ok().flatten(), retry_at))
    else {
        tracing::warn!(code = outcome, "an attempt of unknown outcome in the history; skipped");
        return Ok(None);
    };
    let count = |n: i64| u32::try_from(n.max(0)).unwrap_or(u32::MAX);
    Ok(Some(Attempt::new(
        FenceToken(u64::try_from(row.try_get::<_, i64>(1)?).unwrap_or(0)),
        count(row.try_get(2)?),
        Arc::from(owner),
        row::time(claimed_at),
        row::time(lease_until),
        row.try_get::<_, Option<i64>>(6)?.map(row::time),
        outcome,
    )))
}

type SqlParams<'a> = &'a [&'a (dyn ToSql + Sync)];
type Rows = Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>;

/// A connection a claim or a registration runs on: a connection of the pool prepares through
/// deadpool's cache, a transaction of the log's connections through theirs, and any other
/// client each time.
pub(crate) trait Prepare: Sync {
    /// `sql`, prepared.
    fn statement<'a>(
        &'a self,
        sql: &'a str,
    ) -> impl std::future::Future<Output = Result<tokio_postgres::Statement, tokio_postgres::Error>> + Send + 'a;

    /// Runs `statement`, returning its rows.
    fn rows<'a>(
        &'a self,
        statement: &'a tokio_postgres::Statement,
        params: SqlParams<'a>,
    ) -> impl std::future::Future<Output = Rows> + Send + 'a;
}

/// Any client (a user's transaction, say), preparing each statement when it runs it.
pub(crate) struct Plain<'a, C>(pub(crate) &'a C);

impl<C: GenericClient + Sync> Prepare for Plain<'_, C> {
    fn statement<'a>(
        &'a self,
        sql: &'a str,
    ) -> impl std::future::Future<Output = Result<tokio_postgres::Statement, tokio_postgres::Error>> + Send + 'a {
        self.0.prepare(sql)
    }

    fn rows<'a>(
        &'a self,
        statement: &'a tokio_postgres::Statement,
        params: SqlParams<'a>,
    ) -> impl std::future::Future<Output = Rows> + Send + 'a {
        self.0.query(statement, params)
    }
}

impl Prepare for tokio_postgres::Client {
    fn statement<'a>(
        &'a self,
        sql: &'a str,
    ) -> impl std::future::Future<Output = Result<tokio_postgres::Statement, tokio_postgres::Error>> + Send + 'a {
        self.prepare(sql)
    }

    fn rows<'a>(
        &'a self,
        statement: &'a tokio_postgres::Statement,
        params: SqlParams<'a>,
    ) -> impl std::future::Future<Output = Rows> + Send + 'a {
        self.query(statement, params)
    }
}

impl Prepare for tokio_postgres::Transaction<'_> {
    fn statement<'a>(
        &'a self,
        sql: &'a str,
    ) -> impl std::future::Future<Output = Result<tokio_postgres::Statement, tokio_postgres::Error>> + Send + 'a {
        self.prepare(sql)
    }

    fn rows<'a>(
        &'a self,
        statement: &'a tokio_postgres::Statement,
        params: SqlParams<'a>,
    ) -> impl std::future::Future<Output = Rows> + Send + 'a {
        self.query(statement, params)
    }
}

/// [`Prepare`] for the pool's connections and their transactions: statements from the
/// connection's cache.
macro_rules! prepare_cached {
    ($($client:ty),*) => { $(
        impl Prepare for $client {
            fn statement<'a>(
                &'a self,
                sql: &'a str,
            ) -> impl std::future::Future<Output = Result<tokio_postgres::Statement, tokio_postgres::Error>> + Send + 'a
            {
                self.prepare_cached(sql)
            }

            fn rows<'a>(
                &'a self,
                statement: &'a tokio_postgres::Statement,
                params: SqlParams<'a>,
            ) -> impl std::future::Future<Output = Rows> + Send + 'a {
                self.query(statement, params)
            }
        }
    )* };
}

prepare_cached!(Object, deadpool_postgres::Transaction<'_>);

impl Inner {
    fn err(&self) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
        move |e| store_error(&self.name, e)
    }

    async fn client(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(|e| pool_error(&self.name, e))
    }

    /// The claim statement for `scope`; with `shares`, of the rows of each rate limit's kinds
    /// at most its allowance.
    fn claim_sql(&self, request: &ClaimRequest<'_>, until: i64, shares: Option<Shares>) -> (String, Params) {
        let s = &self.s;
        let (scope, turns) = (request.scope, request.takes_turns());
        let mut params = Params::default();
        let now = params.push(ms(request.now));
        let limit = params.push(i64::try_from(request.limit).unwrap_or(i64::MAX));
        let owner = params.push(request.owner.to_string());
        let until = params.push(until);
        let filter = scope_sql(s, scope, &mut params);
        let ok = format!("{} AND sha256(o.bytes) = o.action_hash", intact(s, "o"));
        let shares_used = shares.is_some();
        // `c`: the rows the claim takes, locked, with whether each is intact.
        let choose = if shares.is_none() && !turns {
            // The earliest due rows of the scope.
            format!(
                "WITH c AS MATERIALIZED (
                     SELECT o.seq, o.due_at, ({ok}) AS ok FROM {s}.outbox o WHERE o.due_at <= {now}{filter}
                      ORDER BY o.due_at, o.seq LIMIT {limit} FOR UPDATE SKIP LOCKED
                 )"
            )
        } else {
            let mut ctes = Vec::new();
            // Sessions take turns: every session with a due (or scheduled) row and none among
            // the earliest rows (`rest`), one seek of `outbox_session_due` each; of those with
            // a due row, `limit` drawn at random (all, when there are no more); the earliest due
            // row of each, locked (a row another claim holds is skipped for the session's next).
            let mut pool = Vec::new();
            let mut turn_ctes = None;
            let mut only = String::new();
            if turns {
                only = match scope.session_filter() {
                    Some(sessions) => {
                        let list = params.push(sessions.iter().map(ToString::to_string).collect::<Vec<String>>());
                        format!(" AND session = ANY({list})")
                    }
                    None => String::new(),
                };
                // Sessions with a row among the earliest (`rest`) are skipped, not walked:
                // each probe is bounded by the next of them, so it never reads their rows
                // (whose claimed, not yet vacuumed entries lead their part of the index).
                let probe = |lower: &str| {
                    format!(
                        "(SELECT o.session, o.due_at FROM {s}.outbox o
                           WHERE o.due_at IS NOT NULL{lower} AND o.session < b.next
                           ORDER BY o.session, o.due_at LIMIT 1)
                         UNION ALL
                         (SELECT o.session, o.due_at FROM {s}.outbox o
                           WHERE b.next IS NULL AND o.due_at IS NOT NULL{lower}
                           ORDER BY o.session, o.due_at LIMIT 1)"
                    )
                };
                let (first, next) = (probe(""), probe(" AND o.session > p.prev"));
                turn_ctes = Some(format!(
                    "taken_by AS (
                         SELECT DISTINCT session FROM rest
                     ), sess(session, due_at, prev, more) AS (
                         SELECT n.session, n.due_at, coalesce(n.session, b.next), coalesce(n.session, b.next) IS NOT NULL
                           FROM (SELECT min(session) AS next FROM taken_by) b
                           LEFT JOIN LATERAL ({first}) n ON true
                         UNION ALL
                         SELECT n.session, n.due_at, coalesce(n.session, b.next), coalesce(n.session, b.next) IS NOT NULL
                           FROM sess p
                          CROSS JOIN LATERAL (SELECT min(r.session) AS next FROM taken_by r WHERE r.session > p.prev) b
                           LEFT JOIN LATERAL ({next}) n ON true
                          WHERE p.more
                     ), turns AS (
                         SELECT session FROM sess WHERE session IS NOT NULL AND due_at <= {now}{only}
                          ORDER BY random() LIMIT {limit}
                     ), heads AS (
                         SELECT x.* FROM turns t CROSS JOIN LATERAL (
                             SELECT o.seq, o.due_at, ({ok}) AS ok, o.kind, o.session, 0 AS pass FROM {s}.outbox o
                              WHERE o.session = t.session AND o.due_at <= {now}{filter}
                              ORDER BY o.due_at, o.seq LIMIT 1 FOR UPDATE SKIP LOCKED
                         ) x
                     )"
                ));
                pool.push("SELECT * FROM heads".to_owned());
            }
            match shares {
                None => {
                    ctes.push(format!(
                        "rest AS (
                             SELECT o.seq, o.due_at, ({ok}) AS ok, o.kind, o.session, 1 AS pass FROM {s}.outbox o
                              WHERE o.due_at <= {now}{filter}
                              ORDER BY o.due_at, o.seq LIMIT {limit} FOR UPDATE SKIP LOCKED
                         )"
                    ));
                }
                Some(shares) => {
                    let kinds = params.push(shares.kinds);
                    let buckets = params.push(shares.buckets);
                    let caps = params.push(shares.caps);
                    let priorities = params.push(shares.priorities);
                    // Every kind with a due (or scheduled) row, one seek of
                    // `outbox_kind_due` each, with its priority; the earliest rows of each
                    // kind, up to its bucket's allowance (any other kind: up to the limit).
                    ctes.push(format!(
                        "kinds AS (
                             (SELECT o.kind FROM {s}.outbox o WHERE o.due_at IS NOT NULL ORDER BY o.kind LIMIT 1)
                             UNION ALL
                             SELECT (SELECT o.kind FROM {s}.outbox o WHERE o.due_at IS NOT NULL AND o.kind > k.kind
                                      ORDER BY o.kind LIMIT 1)
                               FROM kinds k WHERE k.kind IS NOT NULL
                         ), shares AS (
                             SELECT k.kind, coalesce('b:' || l.bucket, 'k:' || k.kind) AS bucket,
                                    coalesce(l.cap, {limit}) AS cap, coalesce(l.priority, 0) AS priority
                               FROM kinds k
                               LEFT JOIN unnest({kinds}::text[], {buckets}::text[], {caps}::bigint[], {priorities}::int[])
                                         l(kind, bucket, cap, priority)
                                 ON l.kind = k.kind
                              WHERE k.kind IS NOT NULL
                         ), rest AS (
                             SELECT x.* FROM shares sh CROSS JOIN LATERAL (
                                 SELECT o.seq, o.due_at, ({ok}) AS ok, o.kind, o.session, 1 AS pass FROM {s}.outbox o
                                  WHERE o.kind = sh.kind AND o.due_at <= {now}{filter}
                                  ORDER BY o.due_at, o.seq LIMIT sh.cap FOR UPDATE SKIP LOCKED
                             ) x
                         )"
                    ));
                }
            }
            // After `rest`: a session with a row among the earliest takes its turn there (its
            // earliest row not held by another claim is the first of them), and needs no seek
            // of its own.
            match turn_ctes {
                Some(turn_ctes) => {
                    ctes.push(turn_ctes);
                    // (A row of `rest` attached to a session of the scope but registered by
                    // another is no one's turn.)
                    pool.push(format!(
                        "SELECT seq, due_at, ok, kind, session,
                                CASE WHEN row_number() OVER (PARTITION BY session ORDER BY due_at, seq) = 1{only}
                                     THEN 0 ELSE 1 END
                           FROM rest"
                    ));
                }
                None => pool.push("SELECT * FROM rest".to_owned()),
            }
            // The turns first, then by priority; of each rate limit's bucket no more than its
            // allowance.
            let capped = match shares_used {
                true => {
                    "SELECT p.*, row_number() OVER (PARTITION BY sh.bucket ORDER BY p.pass, sh.priority DESC, p.due_at, p.seq) AS nth,
                            sh.cap, sh.priority
                       FROM pool p JOIN shares sh ON sh.kind = p.kind"
                }
                false => "SELECT p.*, 1 AS nth, 1 AS cap, 0 AS priority FROM pool p",
            };
            format!(
                "WITH RECURSIVE {}, pool AS (
                     {}
                 ), c AS MATERIALIZED (
                     SELECT seq, due_at, ok FROM ({capped}) w WHERE nth <= cap
                      ORDER BY pass, priority DESC, due_at, seq LIMIT {limit}
                 )",
                ctes.join(", "),
                pool.join(" UNION ALL "),
            )
        };
        let set = set_with_digest(
            s,
            "o",
            &[
                ("status", "1::bigint"),
                ("due_at", "NULL::bigint"),
                ("token", "o.token + 1"),
                ("owner", &format!("{owner}::text")),
                ("lease_until", &format!("{until}::bigint")),
                ("attempts", "o.attempts + 1"),
                ("next_attempt_at", "NULL::bigint"),
                ("updated_at", &format!("{now}::bigint")),
                // The last claim, kept after the attempt ends (not digested).
                ("claim_owner", &format!("{owner}::text")),
                ("claimed_at", &format!("{now}::bigint")),
                ("claim_until", &format!("{until}::bigint")),
                ("claim_token", "o.token + 1"),
            ],
        );
        let hold = hold_set(s, "o", &format!("{now}::bigint"));
        // The rows just written, with their digests: intact.
        let trusted = format!("o.seq, {}, true, o.trace_parent, o.grp", row::prefixed("o"));
        let sql = format!(
            // Each row is checked once, as locked (a row changed since the statement began
            // is re-read when it is locked), and cannot change until the claim commits.
            "{choose}, taken AS (
                 UPDATE {s}.outbox o SET {set} FROM c WHERE o.seq = c.seq AND c.ok
                 RETURNING c.due_at AS was_due, {cols}
             ), held AS (
                 UPDATE {s}.outbox o SET {hold} FROM c WHERE o.seq = c.seq AND NOT c.ok RETURNING o.key
             )
             SELECT h.keys, t.* FROM (SELECT array_agg(key) AS keys FROM held) h LEFT JOIN taken t ON true",
            cols = trusted,
        );
        (sql, params)
    }

    /// Claims on a connection of the pool: one statement, or, spending from rate limits, a
    /// transaction that holds their buckets' rows locked from the read of their state to the
    /// write of what the claim spent.
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claimed, StoreError> {
        let mut client = self.client().await?;
        let buckets = request.buckets_in_scope();
        if request.limit == 0 || buckets.is_empty() {
            return self.claim_on(&client, request).await;
        }
        let err = self.err();
        // The buckets' rows, created once, outside the claim's transaction: an insert that
        // met another claim's uncommitted insert of the same row would wait for it.
        let missing: Vec<String> = {
            let known = self.rate_rows.lock().unwrap_or_else(|e| e.into_inner());
            buckets
                .iter()
                .filter(|b| !known.contains(&*b.name))
                .map(|b| b.name.to_string())
                .collect()
        };
        if !missing.is_empty() {
            let insert = client.prepare_cached(&self.sql.rates_insert).await.map_err(&err)?;
            client.execute(&insert, &[&missing]).await.map_err(&err)?;
            self.rate_rows.lock().unwrap_or_else(|e| e.into_inner()).extend(missing);
        }
        let tx = client.transaction().await.map_err(&err)?;
        let claimed = self.claim_on(&tx, request).await?;
        tx.commit().await.map_err(&err)?;
        Ok(claimed)
    }

    /// The states of `buckets` at `now`, their rows locked (in name order) until the
    /// transaction of `client` ends. A bucket whose row another claim holds (it is between
    /// its read and its write, or stalled there: a process stopped, a connection hung) is
    /// skipped, not waited for: it is taken as paused for a moment, so that this claim takes
    /// nothing of its kinds and the drain looks again soon. So is a bucket without a row yet
    /// (a commit's claim, which does not create rows; the drain's next claim does).
    async fn lock_rates<C: Prepare>(
        &self,
        client: &C,
        buckets: &[&RateBucket],
        now: SystemTime,
    ) -> Result<Vec<RateState>, StoreError> {
        let err = self.err();
        let names: Vec<&str> = buckets.iter().map(|b| &*b.name).collect();
        let lock = client.statement(&self.sql.rates_lock).await.map_err(&err)?;
        let rows = client.rows(&lock, &[&names]).await.map_err(&err)?;
        let time = |us: i64| u64::try_from(us).unwrap_or(0);
        let busy = RateState::default().paused(now.checked_add(BUSY_BUCKET).unwrap_or(now));
        Ok(buckets
            .iter()
            .map(|b| {
                rows.iter()
                    .find(|r| r.get::<_, &str>(0) == &*b.name)
                    .map_or(busy, |row| RateState {
                        tat: time(row.get(1)),
                        paused_until: time(row.get(2)),
                    })
            })
            .collect())
    }

    /// [`claim`](Inner::claim) on `client`: a connection of the pool, or the transaction of a
    /// commit that claims for its turn's drain.
    ///
    /// A claim that spends from rate limits must run in a transaction: their buckets' rows
    /// are locked by it.
    pub(crate) async fn claim_on<C: Prepare>(
        &self,
        client: &C,
        request: &ClaimRequest<'_>,
    ) -> Result<Claimed, StoreError> {
        let (limit, now) = (request.limit, request.now);
        let at = ms(now);
        let far = SystemTime::UNIX_EPOCH + Duration::from_secs(FAR_FUTURE_SECS);
        let until = ms(now.checked_add(request.lease).map_or(far, |t| t.min(far)));
        let err = self.err();
        let mut claimed = Claimed::default();
        let template = reclaimed_error("\u{1}", "\u{2}");
        let reclaim = client.statement(&self.sql.reclaim).await.map_err(&err)?;
        let reclaim_params: &[&(dyn ToSql + Sync)] = &[&at, &template];
        // The reclaim, then the claim proper, sent together (pipelined: one round trip; the
        // server runs them in order, each with a snapshot of its own).
        let buckets = if limit == 0 {
            Vec::new()
        } else {
            request.buckets_in_scope()
        };
        let states = match buckets.is_empty() {
            true => Vec::new(),
            false => self.lock_rates(client, &buckets, now).await?,
        };
        let mut spend = RateSpend::new(buckets.iter().copied().zip(states), now);
        let shares = request.policy.by_kind().then(|| Shares::of(&spend, request.policy));
        let (sql, params) = self.claim_sql(request, until, shares);
        let refs = params.refs();
        let (reclaimed, rows) = if limit == 0 {
            (client.rows(&reclaim, reclaim_params).await, Ok(Vec::new()))
        } else {
            let stmt = client.statement(&sql).await.map_err(&err)?;
            futures_util::future::join(client.rows(&reclaim, reclaim_params), client.rows(&stmt, &refs)).await
        };
        // What the claim took is handed back even if the reclaim failed (outside a
        // transaction the claim committed on its own): the reclaim is housekeeping that the
        // next claim does again.
        let rows = match rows {
            Ok(rows) => rows,
            // In a transaction a failed reclaim aborts it, and the claim fails only as a
            // consequence (25P02): the reclaim's error is the cause.
            Err(e) => {
                return Err(err(match reclaimed {
                    Err(r) => r,
                    Ok(_) => e,
                }))
            }
        };
        match reclaimed {
            Ok(reclaimed) => {
                let reclaim = reclaimed.first().ok_or_else(|| StoreError::closed(self.name.clone()))?;
                claimed.reclaimed = usize::try_from(reclaim.get::<_, i64>(0)).unwrap_or(0);
                let held: Option<Vec<String>> = reclaim.get(1);
                for key in held.unwrap_or_default() {
                    tracing::warn!(store = %self.name, action_key = %key, "an outbox row failed its integrity check; it is held, not delivered");
                    claimed.integrity.push(ActionKey::from(key));
                }
            }
            Err(e) if limit == 0 => return Err(err(e)),
            Err(e) => {
                tracing::warn!(store = %self.name, error = %err(e), "the reclaim of expired leases failed; the next claim tries again");
            }
        }
        let mut taken = Vec::with_capacity(rows.len());
        for (i, found) in rows.iter().enumerate() {
            if i == 0 {
                let held: Option<Vec<String>> = found.get(0);
                for key in held.unwrap_or_default() {
                    tracing::warn!(store = %self.name, action_key = %key, "an outbox row failed its integrity check; it is held, not delivered");
                    claimed.integrity.push(ActionKey::from(key));
                }
            }
            if found.get::<_, Option<i64>>(2).is_none() {
                continue; // No row taken.
            }
            let was_due: i64 = found.get(1);
            taken.push((was_due, Row::read(found, 2).map_err(&err)?));
        }
        taken.sort_by_key(|(due, row)| (*due, row.seq));
        for (_, row) in taken {
            // The statement took no more than each bucket allows: this only counts.
            spend.take(&row.kind);
            match row.check_intent() {
                Ok(payload) => claimed.claims.push(row.delivery(&payload)),
                Err(detail) => {
                    tracing::warn!(store = %self.name, action_key = %row.key, detail, "an outbox row failed its integrity check; it is held, not delivered");
                    let stmt = client.statement(&self.sql.hold_claimed).await.map_err(&err)?;
                    client
                        .rows(&stmt, &[&row.seq, &format!("integrity: {detail}"), &at, &row.token])
                        .await
                        .map_err(&err)?;
                    claimed.integrity.push(ActionKey::from(row.key));
                }
            }
        }
        let (names, tats): (Vec<&str>, Vec<i64>) = spend
            .spent()
            .map(|(name, state)| (&**name, i64::try_from(state.tat).unwrap_or(i64::MAX)))
            .unzip();
        if !names.is_empty() {
            let stmt = client.statement(&self.sql.rates_spent).await.map_err(&err)?;
            client.rows(&stmt, &[&names, &tats]).await.map_err(&err)?;
        }
        claimed.throttled = spend.throttled();
        Ok(claimed)
    }

    /// Gives back claims never handed out (their caller was gone): pending and due again, no
    /// attempt spent; a failure is logged (they stay in flight until their leases expire).
    async fn release(&self, claimed: &Claimed, now: SystemTime) {
        let released: Vec<Recording> = claimed
            .claims
            .iter()
            .map(|d| Recording {
                key: d.key().clone(),
                token: d.token(),
                outcome: Outcome::Released,
            })
            .collect();
        if let Err(e) = self.record(&released, now).await {
            tracing::warn!(store = %self.name, error = %e, "a dropped claim could not release its intents; they stay in flight until their leases expire");
        }
    }

    async fn record(&self, outcomes: &[Recording], now: SystemTime) -> Result<Vec<Recorded>, StoreError> {
        let mut results = Vec::with_capacity(outcomes.len());
        if outcomes.is_empty() {
            return Ok(results);
        }
        let mut client = self.client().await?;
        let err = self.err();
        let stmt = client.prepare_cached(&self.sql.record).await.map_err(&err)?;
        // One statement per run of distinct keys (a key recorded twice in one batch is
        // recorded in order, as two statements).
        let mut start = 0;
        while start < outcomes.len() {
            let mut seen = std::collections::HashSet::new();
            let mut end = start;
            while end < outcomes.len() && seen.insert(outcomes[end].key.as_str()) {
                end += 1;
            }
            let batch = &outcomes[start..end];
            let (mut answers, grouped) = self.record_batch(&**client, &stmt, batch, now, false).await?;
            if !grouped.is_empty() {
                // The rows of ordering groups, again, in a transaction that holds their
                // groups' locks and releases the next intent of each group whose row it made
                // final (delivered): one transaction, so a crash never leaves a group blocked.
                let subset: Vec<Recording> = grouped.iter().map(|(i, _)| batch[*i].clone()).collect();
                let groups: Vec<Option<String>> = grouped.iter().map(|(_, g)| Some(g.clone())).collect();
                let tx = client.transaction().await.map_err(&err)?;
                let lock = tx.prepare_cached(&self.sql.lock_groups).await.map_err(&err)?;
                tx.query(&lock, &[&groups]).await.map_err(&err)?;
                let (again, _) = self.record_batch(&*tx, &stmt, &subset, now, true).await?;
                let released: Vec<&str> = grouped
                    .iter()
                    .zip(&again)
                    .filter(|(_, answer)| matches!(answer, Recorded::Accepted(s) if s.is_final()))
                    .map(|((_, group), _)| group.as_str())
                    .collect();
                self.release_groups(&tx, &released, ms(now)).await?;
                tx.commit().await.map_err(&err)?;
                for ((i, _), answer) in grouped.iter().zip(again) {
                    answers[*i] = answer;
                }
            }
            results.extend(answers);
            start = end;
        }
        Ok(results)
    }

    /// Runs the record statement for `batch` (distinct keys) on `client`. Without
    /// `grouped_too`, the rows of ordering groups are left as they are and returned apart, by
    /// their index in `batch`, with their group (their answers are placeholders).
    async fn record_batch(
        &self,
        client: &impl GenericClient,
        stmt: &tokio_postgres::Statement,
        batch: &[Recording],
        now: SystemTime,
        grouped_too: bool,
    ) -> Result<(Vec<Recorded>, Vec<(usize, String)>), StoreError> {
        let err = self.err();
        let at = ms(now);
        let keys: Vec<&str> = batch.iter().map(|r| r.key.as_str()).collect();
        let tokens: Vec<i64> = batch
            .iter()
            .map(|r| i64::try_from(r.token.0).unwrap_or(i64::MAX))
            .collect();
        let t = Transitions::of(batch, now);
        let rows = client
            .query(
                stmt,
                &[
                    &keys,
                    &tokens,
                    &t.status,
                    &t.error,
                    &t.next_at,
                    &at,
                    &t.due,
                    &t.uncount,
                    &t.interrupted,
                    &t.keep_error,
                    &t.delivered,
                    &t.history,
                    &grouped_too,
                ],
            )
            .await
            .map_err(&err)?;
        let mut answers = Vec::with_capacity(batch.len());
        let mut grouped = Vec::new();
        for (i, (r, row)) in batch.iter().zip(&rows).enumerate() {
            let accepted: Option<i64> = row.get(0);
            let damaged: bool = row.get(1);
            let group: Option<String> = row.get(4);
            let stale = || Recorded::Stale {
                status: row.get::<_, Option<i64>>(2).map(status_of),
                token: FenceToken(
                    row.get::<_, Option<i64>>(3)
                        .map_or(0, |t| u64::try_from(t).unwrap_or(0)),
                ),
            };
            answers.push(match (accepted, group) {
                (Some(code), _) => Recorded::Accepted(status_of(code)),
                (None, _) if damaged => {
                    tracing::warn!(store = %self.name, action_key = %r.key, "an outbox row failed its integrity check; it is held, not delivered");
                    Recorded::Stale {
                        status: Some(DeliveryStatus::Held),
                        token: r.token,
                    }
                }
                (None, Some(group)) if !grouped_too => {
                    grouped.push((i, group));
                    stale()
                }
                (None, _) => stale(),
            });
        }
        Ok((answers, grouped))
    }

    /// Takes the advisory lock of the group of `key`, if it has one, for the rest of `tx`:
    /// before the row's own lock, as every writer of a group's rows takes them.
    async fn lock_group_of(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        key: &str,
    ) -> Result<Option<String>, StoreError> {
        let err = self.err();
        let group: Option<String> = tx
            .query_opt(&self.sql.group_of, &[&key])
            .await
            .map_err(&err)?
            .and_then(|row| row.get(0));
        if let Some(group) = &group {
            tx.query(&self.sql.lock_groups, &[&vec![Some(group.as_str())]])
                .await
                .map_err(&err)?;
        }
        Ok(group)
    }

    /// After rows of `groups` became final in `tx` (which holds the groups' locks): the first
    /// open row of each group, if blocked, becomes pending (or awaits approval, if it asks for
    /// it and has no decision), due at `at` or at its `not_before`.
    async fn release_groups(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        groups: &[&str],
        at: i64,
    ) -> Result<(), StoreError> {
        if groups.is_empty() {
            return Ok(());
        }
        let err = self.err();
        let heads = tx.query(&self.sql.blocked_heads, &[&groups]).await.map_err(&err)?;
        let (mut seqs, mut statuses, mut dues) = (Vec::new(), Vec::new(), Vec::new());
        for found in &heads {
            let head = Row::read(found, 0).map_err(&err)?;
            if !head.intact {
                // Left blocked: never handed out, and `verify` names it.
                continue;
            }
            let (status, due) = if head.requires_approval() && head.decision.is_none() {
                (row::AWAITING_APPROVAL, None)
            } else {
                (row::PENDING, Some(head.due_from(at)))
            };
            seqs.push(head.seq);
            statuses.push(status);
            dues.push(due);
        }
        if seqs.is_empty() {
            return Ok(());
        }
        tx.execute(&self.sql.promote, &[&seqs, &statuses, &dues, &at])
            .await
            .map_err(&err)?;
        tx.execute(self.notify_sql(), &[&self.channel]).await.map_err(&err)?;
        Ok(())
    }

    async fn read_one(&self, key: &str) -> Result<Option<Row>, StoreError> {
        let client = self.client().await?;
        let err = self.err();
        let stmt = client.prepare_cached(&self.sql.by_key).await.map_err(&err)?;
        match client.query_opt(&stmt, &[&key]).await.map_err(&err)? {
            Some(found) => Ok(Some(Row::read(&found, 0).map_err(&err)?)),
            None => Ok(None),
        }
    }

    /// The row of `key`, locked for the rest of `tx`; `None` if there is none, an integrity
    /// error if it was changed outside reactifact.
    async fn lock_intact(&self, tx: &tokio_postgres::Transaction<'_>, key: &str) -> Result<Option<Row>, StoreError> {
        let err = self.err();
        let Some(found) = tx.query_opt(&self.sql.by_key_for_update, &[&key]).await.map_err(&err)? else {
            return Ok(None);
        };
        let row = Row::read(&found, 0).map_err(&err)?;
        if !row.intact {
            return Err(self.damaged(&row));
        }
        Ok(Some(row))
    }

    /// An operator's approval or rejection of `key`, in one transaction, the row locked.
    async fn decide(
        &self,
        key: &str,
        verdict: Verdict,
        by: &str,
        reason: Option<&str>,
        now: SystemTime,
    ) -> Result<Delivery, ApprovalError> {
        let mut client = self.client().await?;
        let err = self.err();
        let tx = client.transaction().await.map_err(&err)?;
        let group = self.lock_group_of(&tx, key).await?;
        let Some(row) = self.lock_intact(&tx, key).await? else {
            return Err(ApprovalError::UnknownKey(ActionKey::from(key)));
        };
        // An unknown status code (only in a row that failed its check) reads as held.
        let status = row.status().unwrap_or(DeliveryStatus::Held);
        // Ended here (not left to the drop), so that the locks go at once.
        match check_decision(key, status, row.decision().as_ref(), verdict, by) {
            Ok(true) => {}
            refused => {
                tx.rollback().await.map_err(&err)?;
                return refused.map(|_| row.view());
            }
        }
        // What the operator decides on is the row's action hash: its bytes must hash to it.
        if !row.bytes_match() {
            tx.rollback().await.map_err(&err)?;
            return Err(ApprovalError::Store(StoreError::integrity(
                self.name.clone(),
                row.key.clone(),
                row::REHASHED,
            )));
        }
        let at = ms(now);
        let code = i64::from(verdict.code());
        let updated = tx
            .query_one(
                &self.sql.decide,
                &[&row.seq, &at, &code, &by, &reason, &row.due_from(at)],
            )
            .await
            .map_err(&err)?;
        let row = Row::read(&updated, 0).map_err(&err)?;
        if let (Verdict::Rejected, Some(group)) = (verdict, &group) {
            self.release_groups(&tx, &[group.as_str()], at).await?;
        }
        if verdict == Verdict::Approved {
            tx.execute(self.notify_sql(), &[&self.channel]).await.map_err(&err)?;
        }
        tx.commit().await.map_err(&err)?;
        Ok(row.view())
    }

    fn damaged(&self, row: &Row) -> StoreError {
        StoreError::integrity(self.name.clone(), row.key.clone(), row::CHANGED)
    }

    fn notify_sql(&self) -> &'static str {
        "SELECT pg_notify($1, '')"
    }
}

/// The latest time the ledger records (the end of the year 9999, UTC), as the core's stores
/// keep it: a lease further ahead is kept as this.
const FAR_FUTURE_SECS: u64 = 253_402_300_799;

/// The first key of the advisory locks of ordering groups (the second is the hash of the
/// schema and the group): `0x52_46_47_52`, "RFGR".
const GROUP_LOCK_CLASS: i32 = 0x5246_4752;

/// The status of a stored code (held for an unknown one).
fn status_of(code: i64) -> DeliveryStatus {
    u8::try_from(code)
        .ok()
        .and_then(DeliveryStatus::from_code)
        .unwrap_or(DeliveryStatus::Held)
}

impl OutboxStore for PostgresOutbox {
    fn describe(&self) -> String {
        self.inner.name.clone()
    }

    /// The store's notifications ([`PostgresOutbox::listen`]): a serving drainer claims as soon
    /// as any process registers an intent, instead of at its next poll.
    fn wakeups(&self) -> Option<Wakeups> {
        Some(Box::pin(futures_util::stream::unfold(
            self.listen(),
            |mut notifications| async move { notifications.next().await.then_some(((), notifications)) },
        )))
    }

    fn rate_states(&self) -> BoxFuture<'_, Result<Vec<(String, RateState)>, StoreError>> {
        Box::pin(async move {
            let client = self.client().await?;
            let sql = format!(
                "SELECT name, tat, paused_until FROM {}.outbox_rates ORDER BY name",
                self.inner.s
            );
            let stmt = client.prepare_cached(&sql).await.map_err(self.err())?;
            let time = |us: i64| u64::try_from(us).unwrap_or(0);
            let rows = client.query(&stmt, &[]).await.map_err(self.err())?;
            rows.iter()
                .map(|row| {
                    let state = RateState {
                        tat: time(row.try_get(1)?),
                        paused_until: time(row.try_get(2)?),
                    };
                    Ok((row.try_get(0)?, state))
                })
                .collect::<Result<_, tokio_postgres::Error>>()
                .map_err(self.err())
        })
    }

    fn pause<'a>(&'a self, bucket: &'a str, until: SystemTime) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let until = i64::try_from(micros(until)).unwrap_or(i64::MAX);
            let stmt = client
                .prepare_cached(&self.inner.sql.rates_pause)
                .await
                .map_err(self.err())?;
            // A claim stalled while it holds the bucket's row (a stopped process) makes the
            // pause fail after a second, not wait as long as the stall: the drain that asked
            // for it logs that and goes on.
            let tx = client.transaction().await.map_err(self.err())?;
            tx.batch_execute("SET LOCAL lock_timeout = '1s'")
                .await
                .map_err(self.err())?;
            tx.execute(&stmt, &[&bucket, &until]).await.map_err(self.err())?;
            tx.commit().await.map_err(self.err())
        })
    }

    fn claim<'a>(&'a self, request: ClaimRequest<'a>) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        let inner = self.inner.clone();
        let name = inner.name.clone();
        let order = ClaimOrder::of(&request);
        let now = order.now;
        // The claim runs to its end even if its caller is gone by then (a dropped drain): it
        // then releases what it took, instead of leaving it in flight for a whole lease.
        let (answer, answered) = oneshot::channel();
        let handle = tokio::runtime::Handle::try_current();
        Box::pin(async move {
            let task = async move {
                let claimed = inner.claim(&order.request()).await;
                if let Err(Ok(claimed)) = answer.send(claimed) {
                    inner.release(&claimed, now).await;
                }
            };
            match handle {
                Ok(handle) => {
                    handle.spawn(task);
                }
                Err(_) => task.await,
            }
            answered.await.unwrap_or_else(|_| Err(StoreError::closed(name)))
        })
    }

    fn record<'a>(
        &'a self,
        outcomes: &'a [Recording],
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Vec<Recorded>, StoreError>> {
        Box::pin(self.inner.record(outcomes, now))
    }

    fn lease_owners<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<Vec<Arc<str>>, StoreError>> {
        Box::pin(async move {
            let s = &self.inner.s;
            let mut params = Params::default();
            let filter = scope_sql(s, scope, &mut params);
            let sql = format!("SELECT DISTINCT o.owner FROM {s}.outbox o WHERE o.lease_until IS NOT NULL{filter}");
            let client = self.client().await?;
            let err = self.err();
            let stmt = client.prepare_cached(&sql).await.map_err(&err)?;
            let rows = client.query(&stmt, &params.refs()).await.map_err(&err)?;
            Ok(rows
                .iter()
                .filter_map(|row| row.get::<_, Option<String>>(0))
                .map(|owner| Arc::from(owner.as_str()))
                .collect())
        })
    }

    fn take_over<'a>(&'a self, owner: &'a str, now: SystemTime) -> BoxFuture<'a, Result<Vec<ActionKey>, StoreError>> {
        Box::pin(async move {
            let inner = &self.inner;
            let client = inner.client().await?;
            let err = inner.err();
            let at = ms(now);
            let template = taken_over_error("\u{1}", "\u{2}");
            let stmt = client.prepare_cached(&inner.sql.take_over).await.map_err(&err)?;
            let row = client.query_one(&stmt, &[&at, &template, &owner]).await.map_err(&err)?;
            let held: Option<Vec<String>> = row.get(1);
            for key in held.unwrap_or_default() {
                tracing::warn!(store = %inner.name, action_key = %key, "an outbox row failed its integrity check; it is held, not delivered");
            }
            let taken: Option<Vec<String>> = row.get(0);
            // The intents taken over are due now: a wake-up lets the serving drains of every
            // process claim them at once.
            let taken: Vec<ActionKey> = taken.unwrap_or_default().into_iter().map(ActionKey::from).collect();
            if !taken.is_empty() {
                let notify = client.prepare_cached(inner.notify_sql()).await.map_err(&err)?;
                client.execute(&notify, &[&inner.channel]).await.map_err(&err)?;
            }
            Ok(taken)
        })
    }

    fn submit(&self, outcomes: Vec<Recording>, now: SystemTime) {
        if outcomes.is_empty() {
            return;
        }
        let inner = self.inner.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(e) = inner.record(&outcomes, now).await {
                        tracing::warn!(store = %inner.name, error = %e, "submitted outcomes could not be recorded; they stay in flight until their leases expire");
                    }
                });
            }
            Err(_) => {
                tracing::warn!(store = %inner.name, "submitted outcomes outside a tokio runtime were not recorded; they stay in flight until their leases expire");
            }
        }
    }

    fn renew<'a>(
        &'a self,
        held: &'a [(ActionKey, FenceToken)],
        until: SystemTime,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(async move {
            if held.is_empty() {
                return Ok(Vec::new());
            }
            let client = self.client().await?;
            let err = self.err();
            let keys: Vec<&str> = held.iter().map(|(k, _)| k.as_str()).collect();
            let tokens: Vec<i64> = held
                .iter()
                .map(|(_, t)| i64::try_from(t.0).unwrap_or(i64::MAX))
                .collect();
            let until = ms(until);
            let stmt = client.prepare_cached(&self.inner.sql.renew).await.map_err(&err)?;
            let rows = client.query(&stmt, &[&keys, &tokens, &until]).await.map_err(&err)?;
            Ok(rows.iter().map(|r| r.get::<_, bool>(0)).collect())
        })
    }

    fn retry<'a>(&'a self, key: &'a str, now: SystemTime) -> BoxFuture<'a, Result<Delivery, RetryError>> {
        Box::pin(async move {
            let inner = &self.inner;
            let mut client = inner.client().await?;
            let err = inner.err();
            let tx = client.transaction().await.map_err(&err)?;
            let group = inner.lock_group_of(&tx, key).await?;
            let Some(row) = inner.lock_intact(&tx, key).await? else {
                return Err(RetryError::UnknownKey(ActionKey::from(key)));
            };
            match row.status {
                row::FAILED | row::DEAD | row::HELD => {
                    let at = ms(now);
                    // Never ahead of an earlier open intent of its group.
                    let behind = match &group {
                        Some(group) => tx
                            .query_one(&inner.sql.open_before, &[group, &row.seq])
                            .await
                            .map_err(&err)?
                            .get(0),
                        None => false,
                    };
                    let (status, due) = if behind {
                        (row::BLOCKED, None)
                    } else if row.requires_approval() && row.decision.is_none() {
                        (row::AWAITING_APPROVAL, None)
                    } else {
                        (row::PENDING, Some(row.due_from(at)))
                    };
                    let updated = tx
                        .query_one(&inner.sql.rearm, &[&row.seq, &at, &status, &due])
                        .await
                        .map_err(&err)?;
                    let row = Row::read(&updated, 0).map_err(&err)?;
                    tx.execute(inner.notify_sql(), &[&inner.channel]).await.map_err(&err)?;
                    tx.commit().await.map_err(&err)?;
                    Ok(row.view())
                }
                _ => {
                    tx.rollback().await.map_err(&err)?;
                    Err(RetryError::NotFailed {
                        key: ActionKey::from(key),
                        status: row.status().unwrap_or(DeliveryStatus::Held),
                    })
                }
            }
        })
    }

    fn cancel<'a>(
        &'a self,
        key: &'a str,
        reason: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, CancelError>> {
        Box::pin(async move {
            let inner = &self.inner;
            let mut client = inner.client().await?;
            let err = inner.err();
            let tx = client.transaction().await.map_err(&err)?;
            let group = inner.lock_group_of(&tx, key).await?;
            let Some(row) = inner.lock_intact(&tx, key).await? else {
                return Err(CancelError::UnknownKey(ActionKey::from(key)));
            };
            match row.status {
                row::CANCELLED => {
                    tx.rollback().await.map_err(&err)?;
                    Ok(row.view())
                }
                row::PENDING | row::FAILED | row::DEAD | row::HELD | row::AWAITING_APPROVAL | row::BLOCKED => {
                    let at = ms(now);
                    let updated = tx
                        .query_one(&inner.sql.cancel, &[&row.seq, &at, &reason])
                        .await
                        .map_err(&err)?;
                    let row = Row::read(&updated, 0).map_err(&err)?;
                    if let Some(group) = &group {
                        inner.release_groups(&tx, &[group.as_str()], at).await?;
                    }
                    tx.commit().await.map_err(&err)?;
                    Ok(row.view())
                }
                _ => {
                    tx.rollback().await.map_err(&err)?;
                    Err(CancelError::NotCancellable {
                        key: ActionKey::from(key),
                        status: row.status().unwrap_or(DeliveryStatus::Held),
                    })
                }
            }
        })
    }

    fn approve<'a>(
        &'a self,
        key: &'a str,
        by: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, ApprovalError>> {
        Box::pin(self.inner.decide(key, Verdict::Approved, by, None, now))
    }

    fn reject<'a>(
        &'a self,
        key: &'a str,
        by: &'a str,
        reason: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, ApprovalError>> {
        Box::pin(self.inner.decide(key, Verdict::Rejected, by, Some(reason), now))
    }

    fn purge(&self, filter: PurgeFilter, before: SystemTime, limit: usize) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let client = self.client().await?;
            let err = self.err();
            let stmt = client.prepare_cached(self.purge_sql(filter)).await.map_err(&err)?;
            let (before, limit, now) = (
                ms(before),
                i64::try_from(limit).unwrap_or(i64::MAX),
                ms(SystemTime::now()),
            );
            let purged: i64 = client
                .query_one(&stmt, &[&before, &limit, &now])
                .await
                .map_err(&err)?
                .get(0);
            Ok(u64::try_from(purged).unwrap_or(0))
        })
    }

    fn attempts<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Vec<Attempt>>, StoreError>> {
        Box::pin(async move {
            let client = self.client().await?;
            let err = self.err();
            let stmt = client.prepare_cached(&self.inner.sql.attempts).await.map_err(&err)?;
            let rows = client.query(&stmt, &[&key]).await.map_err(&err)?;
            // The row of the key comes last (part 1): without it the ledger does not hold the
            // key, whatever history rows an older build's purge left behind.
            if rows.last().is_none_or(|row| row.get::<_, i32>(0) != 1) {
                return Ok(None);
            }
            let mut attempts = Vec::with_capacity(rows.len());
            for row in &rows {
                let attempt = attempt_of(row).map_err(&err)?;
                attempts.extend(attempt);
            }
            Ok(Some(attempts))
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Delivery>, StoreError>> {
        Box::pin(async move {
            match self.inner.read_one(key).await? {
                None => Ok(None),
                Some(row) if row.intact => Ok(Some(row.view())),
                Some(row) => Err(self.inner.damaged(&row)),
            }
        })
    }

    fn list<'a>(&'a self, query: &'a LedgerQuery) -> BoxFuture<'a, Result<Page, StoreError>> {
        Box::pin(async move {
            let s = &self.inner.s;
            let mut params = Params::default();
            let after = params.push(query.after.map_or(0, |a| i64::try_from(a).unwrap_or(i64::MAX)));
            let mut sql = format!("SELECT {} FROM {s}.outbox o WHERE o.seq > {after}", columns(s));
            sql.push_str(&scope_sql(s, &query.scope, &mut params));
            if let Some(status) = query.status {
                let code = params.push(i64::from(status.code()));
                sql.push_str(&format!(" AND o.status = {code}"));
            }
            let limit = query.limit.max(1);
            let fetch = params.push(i64::try_from(limit).unwrap_or(i64::MAX - 1) + 1);
            sql.push_str(&format!(" ORDER BY o.seq LIMIT {fetch}"));
            let client = self.client().await?;
            let err = self.err();
            let stmt = client.prepare_cached(&sql).await.map_err(&err)?;
            let rows = client.query(&stmt, &params.refs()).await.map_err(&err)?;
            let mut page = Page::default();
            let mut last = 0;
            for found in &rows {
                if page.entries.len() == limit {
                    page.next = Some(u64::try_from(last).unwrap_or(0));
                    break;
                }
                let row = Row::read(found, 0).map_err(&err)?;
                if !row.intact {
                    return Err(self.inner.damaged(&row));
                }
                last = row.seq;
                page.entries.push(row.view());
            }
            Ok(page)
        })
    }

    fn counts<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<StatusCounts, StoreError>> {
        Box::pin(async move {
            let s = &self.inner.s;
            let mut params = Params::default();
            let filter = scope_sql(s, scope, &mut params);
            let sql = format!(
                "SELECT o.status, count(*), count(o.next_attempt_at) FROM {s}.outbox o WHERE true{filter} GROUP BY o.status"
            );
            let client = self.client().await?;
            let err = self.err();
            let stmt = client.prepare_cached(&sql).await.map_err(&err)?;
            let mut counts = StatusCounts::default();
            for row in client.query(&stmt, &params.refs()).await.map_err(&err)? {
                let (status, n, retrying): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
                let n = u64::try_from(n).unwrap_or(0);
                match status {
                    row::PENDING => counts.pending += n,
                    row::IN_FLIGHT => counts.in_flight += n,
                    2 => counts.delivered += n,
                    row::FAILED => {
                        counts.failed += n;
                        counts.retrying += u64::try_from(retrying).unwrap_or(0);
                    }
                    row::DEAD => counts.dead += n,
                    row::CANCELLED => counts.cancelled += n,
                    row::AWAITING_APPROVAL => counts.awaiting_approval += n,
                    row::REJECTED => counts.rejected += n,
                    row::BLOCKED => counts.blocked += n,
                    // Held, and (in a damaged row) an unknown code: not delivered until an
                    // operator acts.
                    _ => counts.held += n,
                }
            }
            Ok(counts)
        })
    }

    fn next_due<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<Option<SystemTime>, StoreError>> {
        Box::pin(async move {
            let s = &self.inner.s;
            let mut params = Params::default();
            let filter = scope_sql(s, scope, &mut params);
            let sql = format!(
                "SELECT least(
                     (SELECT min(o.due_at) FROM {s}.outbox o WHERE o.due_at IS NOT NULL{filter}),
                     (SELECT min(o.lease_until) FROM {s}.outbox o WHERE o.lease_until IS NOT NULL{filter}))"
            );
            let client = self.client().await?;
            let err = self.err();
            let stmt = client.prepare_cached(&sql).await.map_err(&err)?;
            let at: Option<i64> = client.query_one(&stmt, &params.refs()).await.map_err(&err)?.get(0);
            Ok(at.map(row::time))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan of a claim, as `EXPLAIN` gives it for the store's own statement.
    async fn plan(outbox: &PostgresOutbox, scope: &Scope) -> String {
        plan_under(outbox, scope, ClaimPolicy::none()).await
    }

    /// The plan of a claim under `policy` (with its rate limits' buckets all full).
    async fn plan_under(outbox: &PostgresOutbox, scope: &Scope, policy: &ClaimPolicy) -> String {
        let owner: Arc<str> = Arc::from("d");
        let request = ClaimRequest {
            scope,
            limit: 16,
            owner: &owner,
            lease: Duration::from_millis(1),
            now: SystemTime::UNIX_EPOCH + Duration::from_millis(1),
            policy,
        };
        let buckets = request.buckets_in_scope();
        let spend = RateSpend::new(buckets.into_iter().map(|b| (b, RateState::default())), request.now);
        let shares = policy.by_kind().then(|| Shares::of(&spend, policy));
        let (sql, params) = outbox.inner.claim_sql(&request, 2, shares);
        let client = outbox.client().await.unwrap();
        // EXPLAIN without ANALYZE: the statement is planned, not run.
        let rows = client.query(&format!("EXPLAIN {sql}"), &params.refs()).await.unwrap();
        rows.iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[tokio::test]
    async fn claims_read_the_partial_index_of_due_rows() {
        let Ok(url) = std::env::var("REACTIFACT_TEST_POSTGRES_URL") else {
            println!("skipped: REACTIFACT_TEST_POSTGRES_URL is not set");
            return;
        };
        let schema = format!("rft_plan_{}", std::process::id());
        let outbox = PostgresOutbox::open(PostgresOptions::new(&url).schema(&schema))
            .await
            .unwrap();
        let names: Vec<String> = (0..5000).map(|i| format!("k{i}")).collect();
        let keys: Vec<(&str, &str)> = names.iter().map(|k| (k.as_str(), "x")).collect();
        let intents = reactifact_store_contract::new_intents("a", 1, &keys);
        outbox.register_alone(&intents, SystemTime::UNIX_EPOCH).await.unwrap();
        let client = outbox.client().await.unwrap();
        client
            .batch_execute(&format!("ANALYZE \"{schema}\".outbox"))
            .await
            .unwrap();
        let plans = [
            plan(&outbox, &Scope::all()).await,
            plan(&outbox, &Scope::session("a")).await,
            plan(&outbox, &Scope::all().sessions(["a", "b"]).kinds(["x"])).await,
        ];
        // Turns seek sessions through their index; a rate-limited claim seeks kinds through
        // theirs; neither scans the table.
        let turns = ClaimPolicy {
            turns: true,
            ..ClaimPolicy::default()
        };
        let turned = plan_under(&outbox, &Scope::all(), &turns).await;
        let limited = ClaimPolicy {
            rates: vec![RateBucket {
                name: Arc::from("x"),
                kinds: vec![Arc::from("x")],
                limit: reactifact_core::RateLimit::per_second(10),
            }],
            ..ClaimPolicy::default()
        };
        let rated = plan_under(&outbox, &Scope::all(), &limited).await;
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .await
            .unwrap();
        for plan in plans {
            assert!(plan.contains("Index Scan using outbox_due"), "{plan}");
            assert!(plan.contains("LockRows"), "{plan}");
            assert!(!plan.contains("Seq Scan on outbox o "), "{plan}");
        }
        assert!(
            turned.contains("outbox_session_due") && turned.contains("outbox_due"),
            "{turned}"
        );
        assert!(rated.contains("outbox_kind_due"), "{rated}");
        for plan in [turned, rated] {
            assert!(!plan.contains("Seq Scan on outbox o"), "{plan}");
        }
    }
}

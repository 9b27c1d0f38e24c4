//! The store's tables, in a schema (namespace) of their own, and their migrations.
//!
//! `{schema}.schema_version` holds one row per applied migration. Migrating runs in one
//! transaction under `pg_advisory_xact_lock(LOCK_CLASS, hashtext(schema))`, so processes that
//! start together on a new database wait for each other: one creates the schema, the others
//! find it at the current version. A schema at a newer version than this build knows is
//! refused; a schema holding tables but no version table is another program's, and refused.
//!
//! The row digest is the SQL function `{schema}.outbox_digest(…)`: SHA-256 of the text form
//! of a row value holding a domain string and every column of a row but `seq` and `digest`
//! (`bytea` columns in hex, so that the `bytea_output` setting does not change it). A row
//! value's text form quotes every field that needs it and tells NULL from an empty string, so
//! two different rows never have one text form. It is one call of built-in functions (a
//! digest of tagged fields built from SQL helper functions cost 27 times as much per row).
//! Every statement that writes a row writes its digest with it; every read that hands a row
//! out checks it.
//!
//! Version 4 adds the operator's decision on an intent that awaited approval (four columns)
//! and the digest function's overload over 26 columns: a row whose decision columns are all
//! NULL digests exactly as before (the 22-column function), so no row is rewritten by the
//! migration; a row with a decision digests a row value of all 26 columns, whose text form
//! (with four more fields) is never that of a row without one.
//!
//! Version 5 adds the trace context kept beside each intent: `trace_parent`, a nullable
//! `bytea` (the 25 bytes of `TraceParent::to_bytes`), written at registration and never
//! changed. It is not digested (advisory: changed, it can only misattribute a trace, never
//! change what is delivered; a value that does not decode reads as none), so the migration
//! adds a column and rewrites no row.
//!
//! Version 6 adds ordering groups: `grp`, a nullable `text`, the group the intent's
//! `PendingAction` names, written at registration and never changed, not digested (a claim
//! checks it against the hashed bytes); the status code 9 (blocked behind an earlier open row
//! of its group, not due); and `outbox_group_open`, a partial index of the open rows of
//! groups. The migration adds a column and an index and rewrites no row.
//!
//! Version 7 adds rate limits and fair claims: `outbox_rates`, one row per rate limit's
//! bucket (its theoretical arrival time and the end of its pause, in microseconds since the
//! Unix epoch), locked and written by the claims that spend from it; and two partial indexes
//! of due rows, by kind (a rate-limited claim takes each kind's share from it) and by session
//! (a claim takes each session's turn from it). It rewrites no row.
//!
//! Version 8 binds approvals to what they approve: `decided_digest`, a nullable `bytea`, the
//! action hash of the row when an operator approved or rejected it, and the digest function's
//! overload over 27 columns: a row whose `decided_digest` is NULL digests exactly as before
//! (the 26-column function: a row without a decision, or with one an older build recorded),
//! so the migration rewrites no row; a row with one digests a row value of all 27 columns. A
//! claim hands out an approved row only while its action hash is that digest.
//!
//! Version 8 also adds `call_answers`: the answers of recorded calls, kept as they arrive,
//! before the generation of their run commits, and dropped once a run of the same produce on
//! the same trigger commits.

use tokio_postgres::Client;

use crate::connect::store_error;
use crate::OpenError;

/// The schema version this build writes and reads.
pub(crate) const SCHEMA_VERSION: i32 = 8;

/// The first key of the advisory lock migrations take (the second is the schema's hash):
/// `0x52_46_50_47`, "RFPG".
const LOCK_CLASS: i32 = 0x5246_5047;

/// The digested columns of `outbox`, in digest order (all but `seq` and `digest`): the 22 of
/// version 1, the decision columns of version 4, then the approved digest of version 8.
pub(crate) const DIGESTED: [&str; 27] = [
    "key",
    "kind",
    "session",
    "origin_commit",
    "origin_gen",
    "origin_run",
    "action_hash",
    "bytes",
    "recorded_at",
    "status",
    "due_at",
    "token",
    "owner",
    "lease_until",
    "attempts",
    "expired",
    "interrupted",
    "last_error",
    "cancel_reason",
    "updated_at",
    "delivered_at",
    "next_attempt_at",
    "decision",
    "decided_by",
    "decided_at",
    "decision_reason",
    "decided_digest",
];

/// Version 1: the outbox, its attachments, its tombstones, and the digest functions. `{s}`
/// stands for the quoted schema.
const V1: &str = r#"
CREATE FUNCTION {s}.outbox_digest(
        key text, kind text, session text, origin_commit bytea, origin_gen bigint, origin_run bigint,
        action_hash bytea, bytes bytea, recorded_at bigint, status bigint, due_at bigint, token bigint,
        owner text, lease_until bigint, attempts bigint, expired bigint, interrupted bigint,
        last_error text, cancel_reason text, updated_at bigint, delivered_at bigint, next_attempt_at bigint)
    RETURNS bytea
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT sha256(convert_to(ROW('reactifact/postgres/outbox/row/v1', key, kind, session,
        encode(origin_commit, 'hex'), origin_gen, origin_run, encode(action_hash, 'hex'), encode(bytes, 'hex'),
        recorded_at, status, due_at, token, owner, lease_until, attempts, expired, interrupted, last_error,
        cancel_reason, updated_at, delivered_at, next_attempt_at)::text, 'UTF8')) $$;

CREATE TABLE {s}.outbox (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key text NOT NULL UNIQUE,
    kind text NOT NULL,
    session text NOT NULL,
    origin_commit bytea NOT NULL,
    origin_gen bigint NOT NULL,
    origin_run bigint NOT NULL,
    action_hash bytea NOT NULL,
    bytes bytea NOT NULL,
    recorded_at bigint NOT NULL,
    status bigint NOT NULL,
    due_at bigint,
    token bigint NOT NULL,
    owner text,
    lease_until bigint,
    attempts bigint NOT NULL,
    expired bigint NOT NULL,
    interrupted bigint NOT NULL,
    last_error text,
    cancel_reason text,
    updated_at bigint NOT NULL,
    delivered_at bigint,
    next_attempt_at bigint,
    digest bytea NOT NULL,
    CHECK ((status = 1) = (owner IS NOT NULL AND lease_until IS NOT NULL)),
    CHECK (due_at IS NULL OR status IN (0, 3)),
    CHECK (status <> 0 OR due_at IS NOT NULL)
);
-- Claims read due rows in due order from this index, also when scoped to sessions (the session
-- and attachment filter is applied to the rows it yields: an index on (session, due_at) could
-- not give due order across a session's own and attached rows, and every claim's update would
-- pay for it).
CREATE INDEX outbox_due ON {s}.outbox (due_at, seq) WHERE due_at IS NOT NULL;
CREATE INDEX outbox_leases ON {s}.outbox (lease_until, seq) WHERE lease_until IS NOT NULL;
CREATE INDEX outbox_final ON {s}.outbox (updated_at, seq) WHERE status IN (2, 6);
CREATE TABLE {s}.outbox_members (
    session text NOT NULL,
    key text NOT NULL,
    PRIMARY KEY (session, key)
);
CREATE INDEX outbox_members_key ON {s}.outbox_members (key);
CREATE TABLE {s}.outbox_purged (
    key text PRIMARY KEY,
    purged_at bigint NOT NULL
);
"#;

/// Version 2: sessions' logs — their rows, their commits (one row each, the runs as the core
/// encoded them) and their checkpoints.
const V2: &str = r#"
CREATE TABLE {s}.sessions (
    name text PRIMARY KEY,
    generation bigint NOT NULL CHECK (generation >= 0),
    head bytea,
    consumed_seq bigint NOT NULL CHECK (consumed_seq >= 0),
    parent text,
    fork_generation bigint,
    created_at bigint NOT NULL,
    CHECK ((parent IS NULL) = (fork_generation IS NULL))
);
CREATE TABLE {s}.commits (
    session text NOT NULL,
    generation bigint NOT NULL,
    hash bytea NOT NULL,
    parent bytea,
    merged bytea,
    state_hash bytea NOT NULL,
    events_consumed bigint NOT NULL,
    runs bytea NOT NULL,
    PRIMARY KEY (session, generation)
);
-- Merges reach other sessions' commits by hash.
CREATE INDEX commits_hash ON {s}.commits (hash);
CREATE TABLE {s}.checkpoints (
    session text NOT NULL,
    generation bigint NOT NULL,
    hash bytea NOT NULL,
    state_hash bytea NOT NULL,
    body bytea NOT NULL,
    digest bytea NOT NULL,
    created_at bigint NOT NULL,
    PRIMARY KEY (session, generation)
);
"#;

/// Version 3: the attempt history. `outbox_attempts` holds one row per attempt that ended
/// other than delivered; four columns of `outbox` keep the last claim after it ended (a
/// delivered attempt is read from them while `claim_token` is the row's token: a claim by an
/// older build leaves them behind). None of it is digested: the history is diagnostic,
/// and no transition reads it.
const V3: &str = r#"
ALTER TABLE {s}.outbox ADD COLUMN claim_owner text, ADD COLUMN claimed_at bigint, ADD COLUMN claim_until bigint,
    ADD COLUMN claim_token bigint;
-- A purge of cancelled rows only reads these (few) rows, not every old delivered one.
CREATE INDEX outbox_cancelled ON {s}.outbox (updated_at, seq) WHERE status = 6;
CREATE TABLE {s}.outbox_attempts (
    key text NOT NULL,
    token bigint NOT NULL,
    number bigint NOT NULL,
    owner text NOT NULL,
    claimed_at bigint NOT NULL,
    lease_until bigint NOT NULL,
    ended_at bigint NOT NULL,
    outcome bigint NOT NULL,
    error text,
    retry_at bigint,
    PRIMARY KEY (key, token)
);
"#;

/// Version 4: human approval. The operator's decision on an intent that awaited approval
/// (`decision`: 1 approved, 2 rejected; who, when, why), digested whenever one is set by the
/// 26-column overload of `outbox_digest` (which is the 22-column digest for a row without
/// one, so no row changes); the status codes 7 (awaiting approval) and 8 (rejected, final);
/// `outbox_final` covers rejected rows too, and `outbox_rejected` serves a purge of them.
const V4: &str = r#"
ALTER TABLE {s}.outbox ADD COLUMN decision bigint, ADD COLUMN decided_by text, ADD COLUMN decided_at bigint,
    ADD COLUMN decision_reason text;
CREATE FUNCTION {s}.outbox_digest(
        key text, kind text, session text, origin_commit bytea, origin_gen bigint, origin_run bigint,
        action_hash bytea, bytes bytea, recorded_at bigint, status bigint, due_at bigint, token bigint,
        owner text, lease_until bigint, attempts bigint, expired bigint, interrupted bigint,
        last_error text, cancel_reason text, updated_at bigint, delivered_at bigint, next_attempt_at bigint,
        decision bigint, decided_by text, decided_at bigint, decision_reason text)
    RETURNS bytea
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT CASE
        WHEN decision IS NULL AND decided_by IS NULL AND decided_at IS NULL AND decision_reason IS NULL
        THEN {s}.outbox_digest(key, kind, session, origin_commit, origin_gen, origin_run, action_hash, bytes,
            recorded_at, status, due_at, token, owner, lease_until, attempts, expired, interrupted, last_error,
            cancel_reason, updated_at, delivered_at, next_attempt_at)
        ELSE sha256(convert_to(ROW('reactifact/postgres/outbox/row/v1', key, kind, session,
            encode(origin_commit, 'hex'), origin_gen, origin_run, encode(action_hash, 'hex'), encode(bytes, 'hex'),
            recorded_at, status, due_at, token, owner, lease_until, attempts, expired, interrupted, last_error,
            cancel_reason, updated_at, delivered_at, next_attempt_at, decision, decided_by, decided_at,
            decision_reason)::text, 'UTF8'))
        END $$;
DROP INDEX {s}.outbox_final;
CREATE INDEX outbox_final ON {s}.outbox (updated_at, seq) WHERE status IN (2, 6, 8);
CREATE INDEX outbox_rejected ON {s}.outbox (updated_at, seq) WHERE status = 8;
"#;

/// Version 5: trace context. The W3C context of the produce run that committed an intent
/// (`TraceParent::to_bytes`), kept beside it and outside the digest; NULL for the rows of
/// earlier versions and for intents committed outside a produce run.
const V5: &str = r#"
ALTER TABLE {s}.outbox ADD COLUMN trace_parent bytea;
"#;

/// Version 6: ordering groups. The group kept beside each intent (outside the digest), and
/// the open rows of each group, by which registration finds whether its group has one and a
/// row that became final finds the next.
const V6: &str = r#"
ALTER TABLE {s}.outbox ADD COLUMN grp text;
CREATE INDEX outbox_group_open ON {s}.outbox (grp, seq) WHERE grp IS NOT NULL AND status NOT IN (2, 6, 8);
"#;

/// Version 7: rate limits and fair claims. The state of each rate limit's bucket, and the
/// due rows by kind and by session.
const V7: &str = r#"
CREATE TABLE {s}.outbox_rates (
    name text PRIMARY KEY,
    tat bigint NOT NULL,
    paused_until bigint NOT NULL
);
CREATE INDEX outbox_kind_due ON {s}.outbox (kind, due_at, seq) WHERE due_at IS NOT NULL;
CREATE INDEX outbox_session_due ON {s}.outbox (session, due_at, seq) WHERE due_at IS NOT NULL;
"#;

/// Version 8: approvals bound to what they approve — the action hash an operator's decision
/// was made on, digested by the 27-column overload of `outbox_digest` whenever it is set
/// (which is the 26-column digest for a row without it, so no row changes) — and the answers
/// of recorded calls, kept as they arrive before the generation of their run commits (one row
/// per answer, in the order kept).
const V8: &str = r#"
ALTER TABLE {s}.outbox ADD COLUMN decided_digest bytea;
CREATE FUNCTION {s}.outbox_digest(
        key text, kind text, session text, origin_commit bytea, origin_gen bigint, origin_run bigint,
        action_hash bytea, bytes bytea, recorded_at bigint, status bigint, due_at bigint, token bigint,
        owner text, lease_until bigint, attempts bigint, expired bigint, interrupted bigint,
        last_error text, cancel_reason text, updated_at bigint, delivered_at bigint, next_attempt_at bigint,
        decision bigint, decided_by text, decided_at bigint, decision_reason text, decided_digest bytea)
    RETURNS bytea
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT CASE
        WHEN decided_digest IS NULL
        THEN {s}.outbox_digest(key, kind, session, origin_commit, origin_gen, origin_run, action_hash, bytes,
            recorded_at, status, due_at, token, owner, lease_until, attempts, expired, interrupted, last_error,
            cancel_reason, updated_at, delivered_at, next_attempt_at, decision, decided_by, decided_at,
            decision_reason)
        ELSE sha256(convert_to(ROW('reactifact/postgres/outbox/row/v1', key, kind, session,
            encode(origin_commit, 'hex'), origin_gen, origin_run, encode(action_hash, 'hex'), encode(bytes, 'hex'),
            recorded_at, status, due_at, token, owner, lease_until, attempts, expired, interrupted, last_error,
            cancel_reason, updated_at, delivered_at, next_attempt_at, decision, decided_by, decided_at,
            decision_reason, encode(decided_digest, 'hex'))::text, 'UTF8'))
        END $$;
CREATE TABLE {s}.call_answers (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session text NOT NULL,
    produce text NOT NULL,
    trigger text NOT NULL,
    run bytea NOT NULL,
    call bytea NOT NULL
);
CREATE INDEX call_answers_run ON {s}.call_answers (session, produce, trigger);
"#;

/// The migrations, in order: `MIGRATIONS[v - 1]` takes the schema from version `v - 1` to `v`.
const MIGRATIONS: [(&str, &str); SCHEMA_VERSION as usize] = [
    ("the outbox", V1),
    ("sessions' logs", V2),
    ("the attempt history", V3),
    ("human approval", V4),
    ("trace context", V5),
    ("ordering groups", V6),
    ("rate limits and fair claims", V7),
    ("approvals bound to their digest, answers kept before a commit", V8),
];

/// `"schema"`: the schema's name as an identifier (a name [`valid_schema`] accepts needs no
/// escaping inside the quotes).
///
/// [`valid_schema`]: crate::connect::valid_schema
pub(crate) fn quoted(schema: &str) -> String {
    format!("\"{schema}\"")
}

/// Creates or upgrades the store's schema to [`SCHEMA_VERSION`], under the advisory lock.
/// With `may_migrate` false, a missing store or an older version is refused instead, and
/// nothing is written.
pub(crate) async fn migrate(
    client: &mut Client,
    schema: &str,
    store: &str,
    may_migrate: bool,
) -> Result<(), OpenError> {
    let err = |e| OpenError::Prepare {
        source: store_error(store, e),
    };
    let s = quoted(schema);
    let tx = client.transaction().await.map_err(err)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&LOCK_CLASS, &schema],
    )
    .await
    .map_err(err)?;
    let exists: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[&schema],
        )
        .await
        .map_err(err)?
        .get(0);
    let found = if exists {
        let versioned: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = 'schema_version')",
                &[&schema],
            )
            .await
            .map_err(err)?
            .get(0);
        if versioned {
            tx.query_one(
                &format!("SELECT coalesce(max(version), 0) FROM {s}.schema_version"),
                &[],
            )
            .await
            .map_err(err)?
            .get::<_, i32>(0)
        } else {
            let tables: Vec<String> = tx
                .query(
                    "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                      WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f') ORDER BY 1 LIMIT 5",
                    &[&schema],
                )
                .await
                .map_err(err)?
                .iter()
                .map(|row| row.get(0))
                .collect();
            if !tables.is_empty() {
                // Ended here, not left open in a pooled connection (it would pin the xmin
                // horizon until the connection is next used or closed).
                tx.rollback().await.map_err(err)?;
                return Err(OpenError::ForeignSchema {
                    store: store.to_owned(),
                    schema: schema.to_owned(),
                    tables: tables.join(", "),
                });
            }
            0
        }
    } else if !may_migrate {
        tx.rollback().await.map_err(err)?;
        return Err(OpenError::NoStore {
            store: store.to_owned(),
            schema: schema.to_owned(),
        });
    } else {
        tx.batch_execute(&format!("CREATE SCHEMA {s}")).await.map_err(err)?;
        0
    };
    if found > SCHEMA_VERSION {
        tx.rollback().await.map_err(err)?;
        return Err(OpenError::NewerSchema {
            path: store.into(),
            found: found.into(),
            supported: SCHEMA_VERSION.into(),
        });
    }
    if found == SCHEMA_VERSION {
        // Nothing to change: the transaction only read.
        tx.rollback().await.map_err(err)?;
        return Ok(());
    }
    if !may_migrate {
        tx.rollback().await.map_err(err)?;
        return Err(if found == 0 {
            OpenError::NoStore {
                store: store.to_owned(),
                schema: schema.to_owned(),
            }
        } else {
            OpenError::OlderSchema {
                path: store.into(),
                found: found.into(),
                supported: SCHEMA_VERSION.into(),
            }
        });
    }
    if found == 0 {
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {s}.schema_version (
                 version integer PRIMARY KEY,
                 description text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now()
             )"
        ))
        .await
        .map_err(err)?;
    }
    for (version, (description, sql)) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let version = version as i32 + 1;
        tx.batch_execute(&sql.replace("{s}", &s)).await.map_err(err)?;
        tx.execute(
            &format!("INSERT INTO {s}.schema_version (version, description) VALUES ($1, $2)"),
            &[&version, description],
        )
        .await
        .map_err(err)?;
        tracing::info!(store, version, description, "migrated the postgres outbox schema");
    }
    tx.commit().await.map_err(err)?;
    Ok(())
}

//! [`PostgresStore`]: sessions' logs in PostgreSQL, beside the outbox — the
//! [`LogStore`] that [`Context::open_store`](reactifact_core::Context::open_store) opens.
//!
//! Three tables of the store's schema (version 2): `sessions` (one row per session: its
//! generation, head, consumed position and fork point), `commits` (one row per commit, its
//! runs as the core encoded them) and `checkpoints`. A commit is one transaction: the
//! session's row moves only if it is still at the generation the writer loaded
//! (`UPDATE … WHERE generation = $expected`; a racing writer's update waits for the row lock
//! and then finds the generation moved, so exactly one of two wins), then the commit's row,
//! the registration of its intents in the outbox and the commit's claim for its turn.
//!
//! The log's statements run on connections of their own, driven by a runtime of the store's
//! own (one thread), so that a context's blocking direct writes may wait for them from any
//! executor or none, and so that a commit whose caller is gone still runs to its end (and then
//! gives back what its claim took).

use std::sync::Arc;
use std::time::SystemTime;

use reactifact_core::audit::{ContentHash, VerifyError};
use reactifact_core::error::StoreError;
use reactifact_core::store::{
    Act, AnswerRow, Append, BoxFuture, CheckpointRow, Claimed, CommitRow, LogStore, OutboxCheck, OutboxStore,
    SessionRow, Verdict,
};
use tokio::sync::{oneshot, Mutex};
use tokio_postgres::{Client, NoTls, Statement, Transaction};

use crate::connect::{store_error, DriverError, PostgresOptions, Target};
use crate::outbox::{PostgresOutbox, Prepare};
use crate::row::{intact, ms, CHANGED, REHASHED};
use crate::OpenError;

/// How many connections the log uses unless [`PostgresOptions::log_connections`] says.
pub const DEFAULT_LOG_CONNECTIONS: usize = 2;

/// The PostgreSQL store: sessions' logs, their checkpoints and the outbox, in one schema of a
/// database that any number of processes share.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use reactifact_core::Context;
/// use reactifact_postgres::{PostgresOptions, PostgresStore};
///
/// let store = PostgresStore::open(PostgresOptions::new("postgres://app@127.0.0.1:5432/app")).await?;
/// let mut ctx = Context::open_store(store.clone(), "orders").await?;
/// // `Runtime::builder(ctx)…` as on SQLite; `Drainer::builder(store.outbox().clone(), …)`
/// // serves the outbox from any process.
/// # Ok(()) }
/// ```
///
/// Several processes may open one session: their commits are fenced on the session's
/// generation, and a runtime that loses the race reads the winner's commits and runs its
/// generation again ([`TurnReport::conflicts`](reactifact_core::runtime::TurnReport::conflicts)).
pub struct PostgresStore {
    outbox: Arc<PostgresOutbox>,
    log: Arc<Log>,
}

/// The log's connections and the runtime that drives them.
struct Log {
    name: String,
    s: String,
    outbox: Arc<PostgresOutbox>,
    /// How to connect again when a connection closed (a server restart, a terminated backend).
    config: tokio_postgres::Config,
    connections: Vec<Mutex<LogConnection>>,
    runtime: Driver,
}

/// One connection of the log, with the statements prepared on it.
struct LogConnection {
    client: Client,
    statements: Statements,
}

/// Statements prepared on one connection, by their SQL: each is parsed once per connection, so
/// a statement costs one round trip, not two.
#[derive(Default)]
struct Statements(std::sync::Mutex<std::collections::HashMap<String, Statement>>);

impl Statements {
    /// `sql`, prepared on `on` (the connection, or a transaction of it) the first time.
    async fn get<C: Prepare>(&self, on: &C, sql: &str) -> Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = self.0.lock().unwrap_or_else(|e| e.into_inner()).get(sql) {
            return Ok(statement.clone());
        }
        let statement = on.statement(sql).await?;
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }
}

/// A transaction of a log connection whose statements are prepared through the connection's
/// cache (the commit's claim runs on it).
struct CachedTransaction<'a> {
    tx: &'a Transaction<'a>,
    statements: &'a Statements,
}

impl Prepare for CachedTransaction<'_> {
    fn statement<'a>(
        &'a self,
        sql: &'a str,
    ) -> impl std::future::Future<Output = Result<Statement, tokio_postgres::Error>> + Send + 'a {
        self.statements.get(self.tx, sql)
    }

    fn rows<'a>(
        &'a self,
        statement: &'a Statement,
        params: &'a [&'a (dyn tokio_postgres::types::ToSql + Sync)],
    ) -> impl std::future::Future<Output = Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>> + Send + 'a {
        self.tx.query(statement, params)
    }
}

/// A runtime of the store's own; shut down without waiting when the store is dropped (which
/// may happen inside another runtime, where a blocking shutdown would panic).
struct Driver(Option<tokio::runtime::Runtime>);

impl Driver {
    /// Spawns `task` on the store's runtime (nothing once it is shut down).
    fn spawn<T: Send + 'static>(
        &self,
        task: impl std::future::Future<Output = T> + Send + 'static,
    ) -> tokio::task::JoinHandle<T> {
        match &self.0 {
            Some(runtime) => runtime.spawn(task),
            None => unreachable!("the runtime lives as long as the store"),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore").field("store", &self.log.name).finish()
    }
}

/// For `verify`: a [`VerifyError::OutboxDecision`] if the outbox row `row` (of `verify_outbox`'s
/// query: its decision at 8, its approved digest at 9) records a decision bound to a digest
/// that is not the action hash the log acted for `key` in its origin commit and run, or not
/// the one the row holds (`held`).
fn decision_mismatch(
    check: &OutboxCheck,
    row: &tokio_postgres::Row,
    key: &str,
    origin: [u8; 32],
    generation: reactifact_core::runtime::Generation,
    held: &[u8],
) -> Option<VerifyError> {
    let verdict = Verdict::from_code(row.get::<_, Option<i64>>(8)?)?;
    let decided: [u8; 32] = row.get::<_, Option<&[u8]>>(9)?.try_into().ok()?;
    let run = u64_of(row.get(5));
    let act = check
        .acts
        .iter()
        .find(|a| a.key.as_str() == key && a.commit == origin && a.run == run)?;
    let held: [u8; 32] = held.try_into().ok()?;
    (decided != act.action_hash || decided != held).then(|| VerifyError::OutboxDecision {
        generation,
        key: key.into(),
        verdict,
        decided: ContentHash(decided),
        acted: ContentHash(act.action_hash),
        held: ContentHash(held),
    })
}

fn u64_of(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn i64_of(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

const COMMIT_COLUMNS: &str = "session, generation, hash, parent, merged, state_hash, events_consumed, runs";

fn commit_row(row: &tokio_postgres::Row) -> CommitRow {
    CommitRow::new(
        row.get(0),
        u64_of(row.get(1)),
        row.get(2),
        row.get(3),
        row.get(4),
        row.get(5),
        u64_of(row.get(6)),
        row.get(7),
    )
}

impl PostgresStore {
    /// Connects as `options` say and opens the store in its schema, creating the schema or
    /// upgrading it to this build's version first (under an advisory lock), with the outbox's
    /// pool and [`PostgresOptions::log_connections`] connections for the log.
    ///
    /// # Errors
    /// As [`PostgresOutbox::open`].
    pub async fn open(options: PostgresOptions) -> Result<Arc<PostgresStore>, OpenError> {
        let outbox = PostgresOutbox::open(options.clone()).await?;
        let target = Target::parse(&options)?;
        // Owned by a `Driver` at once: dropped here, inside the caller's runtime, a runtime
        // must shut down without blocking.
        let runtime = Driver(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("reactifact-postgres-log")
                .enable_all()
                .build()
                .map_err(|e| target.connect_error(e))?,
        ));
        let mut connections = Vec::new();
        for _ in 0..options.log_connections_value() {
            let config = target.config.clone();
            let client = runtime
                .spawn(async move { connect(&config).await })
                .await
                .map_err(|e| target.connect_error(e))?
                .map_err(|e| target.connect_error(DriverError::boxed(e)))?;
            connections.push(Mutex::new(LogConnection {
                client,
                statements: Statements::default(),
            }));
        }
        let log = Log {
            name: outbox.name().to_owned(),
            s: outbox.quoted_schema().to_owned(),
            outbox: outbox.clone(),
            config: target.config.clone(),
            connections,
            runtime,
        };
        Ok(Arc::new(PostgresStore {
            outbox,
            log: Arc::new(log),
        }))
    }

    /// Connects to the server at `url` and opens the store in schema
    /// [`DEFAULT_SCHEMA`](crate::DEFAULT_SCHEMA).
    ///
    /// # Errors
    /// As [`PostgresOutbox::open`].
    pub async fn connect(url: &str) -> Result<Arc<PostgresStore>, OpenError> {
        Self::open(PostgresOptions::new(url)).await
    }

    /// The store's outbox, for a [`Drainer`](reactifact_core::Drainer) or the ledger's
    /// operations.
    pub fn outbox(&self) -> &Arc<PostgresOutbox> {
        &self.outbox
    }

    /// Runs `op` on a log connection (the one `session` maps to, so one session's writes
    /// queue on one connection), as a task of the store's runtime: it runs to its end even if
    /// the returned future is dropped.
    fn run<T, F>(
        &self,
        session: &str,
        op: impl FnOnce(Arc<Log>, usize) -> F,
    ) -> BoxFuture<'static, Result<T, StoreError>>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        self.run_or(session, op, |_, _| async {})
    }

    /// [`run`](Self::run), handing the result to `unreceived` if the caller is gone by the time
    /// it is ready (a commit cut off, whose claim must be given back).
    fn run_or<T, F, U>(
        &self,
        session: &str,
        op: impl FnOnce(Arc<Log>, usize) -> F,
        unreceived: impl FnOnce(Arc<Log>, Result<T, StoreError>) -> U + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
        U: std::future::Future<Output = ()> + Send + 'static,
    {
        let log = self.log.clone();
        let index = connection_for(session, log.connections.len());
        let name = log.name.clone();
        let (answer, answered) = oneshot::channel();
        let task = op(log.clone(), index);
        let on = log.clone();
        self.log.runtime.spawn(async move {
            if let Err(result) = answer.send(task.await) {
                unreceived(on, result).await;
            }
        });
        Box::pin(async move { answered.await.unwrap_or_else(|_| Err(StoreError::closed(name))) })
    }
}

/// A connection to the server, driven by the runtime this runs on (the store's).
async fn connect(config: &tokio_postgres::Config) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "a connection of the postgres log ended");
        }
    });
    Ok(client)
}

/// Whether the server aborted the transaction as a deadlock or a serialization failure (so
/// that nothing of it was written, and it may be made again at once).
fn aborted_by_server(e: &StoreError) -> bool {
    use tokio_postgres::error::SqlState;
    let mut source = std::error::Error::source(e);
    while let Some(error) = source {
        if let Some(pg) = error.downcast_ref::<tokio_postgres::Error>() {
            return pg
                .code()
                .is_some_and(|c| *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE);
        }
        source = error.source();
    }
    false
}

/// Which connection serves `session`.
fn connection_for(session: &str, connections: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    session.hash(&mut hasher);
    (hasher.finish() % connections.max(1) as u64) as usize
}

type Params<'a> = &'a [&'a (dyn tokio_postgres::types::ToSql + Sync)];

/// An act as the outbox check matches rows against it: key, commit, run, kind, action hash.
type ActKey<'a> = (&'a str, [u8; 32], u64, &'a str, [u8; 32]);

impl Log {
    fn err(&self) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
        move |e| store_error(&self.name, e)
    }

    /// Connection `index`, connected again first if it closed (its prepared statements go
    /// with it).
    async fn connection(&self, index: usize) -> Result<tokio::sync::MutexGuard<'_, LogConnection>, StoreError> {
        let mut conn = self.connections[index].lock().await;
        if conn.client.is_closed() {
            tracing::info!(store = %self.name, "a connection of the log had closed; connecting again");
            conn.client = connect(&self.config).await.map_err(self.err())?;
            conn.statements = Statements::default();
        }
        Ok(conn)
    }

    /// Runs `sql` (prepared once per connection) on connection `index`, outside a transaction.
    async fn query(&self, index: usize, sql: &str, params: Params<'_>) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let conn = self.connection(index).await?;
        let statement = conn.statements.get(&conn.client, sql).await.map_err(self.err())?;
        conn.client.query(&statement, params).await.map_err(self.err())
    }

    async fn session(&self, index: usize, name: &str) -> Result<Option<SessionRow>, StoreError> {
        let s = &self.s;
        let sql =
            format!("SELECT generation, head, consumed_seq, parent, fork_generation FROM {s}.sessions WHERE name = $1");
        let row = self.query(index, &sql, &[&name]).await?.into_iter().next();
        Ok(row.map(|row| {
            let parent: Option<String> = row.get(3);
            let fork: Option<i64> = row.get(4);
            SessionRow::new(
                u64_of(row.get(0)),
                row.get(1),
                u64_of(row.get(2)),
                parent.zip(fork.map(u64_of)),
            )
        }))
    }

    async fn create_session(&self, index: usize, name: &str, row: SessionRow) -> Result<bool, StoreError> {
        let s = &self.s;
        let (parent, fork) = match row.fork {
            Some((parent, at)) => (Some(parent), Some(i64_of(at))),
            None => (None, None),
        };
        let sql = format!(
            "INSERT INTO {s}.sessions (name, generation, head, consumed_seq, parent, fork_generation, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (name) DO NOTHING RETURNING name"
        );
        let params: Params<'_> = &[
            &name,
            &i64_of(row.generation),
            &row.head,
            &i64_of(row.consumed_seq),
            &parent,
            &fork,
            &ms(SystemTime::now()),
        ];
        Ok(!self.query(index, &sql, params).await?.is_empty())
    }

    async fn commits(&self, index: usize, session: &str, after: u64, upto: u64) -> Result<Vec<CommitRow>, StoreError> {
        let s = &self.s;
        let sql = format!(
            "SELECT {COMMIT_COLUMNS} FROM {s}.commits
              WHERE session = $1 AND generation > $2 AND generation <= $3 ORDER BY generation"
        );
        let rows = self
            .query(index, &sql, &[&session, &i64_of(after), &i64_of(upto)])
            .await?;
        Ok(rows.iter().map(commit_row).collect())
    }

    async fn commit_by_hash(&self, index: usize, hash: Vec<u8>) -> Result<Option<CommitRow>, StoreError> {
        let s = &self.s;
        let sql = format!("SELECT {COMMIT_COLUMNS} FROM {s}.commits WHERE hash = $1 LIMIT 1");
        let rows = self.query(index, &sql, &[&hash]).await?;
        Ok(rows.first().map(commit_row))
    }

    /// [`append_once`](Self::append_once), again (a few times) when the server aborted it
    /// as a deadlock or a serialization failure: two commits registering shared keys in
    /// opposite orders wait for each other, and the server aborts one; nothing of it was
    /// written.
    async fn append(&self, index: usize, append: Append) -> Result<Option<Claimed>, StoreError> {
        const TRIES: u32 = 5;
        let mut tries = 1;
        loop {
            match self.append_once(index, &append).await {
                Err(e) if tries < TRIES && aborted_by_server(&e) => {
                    tracing::debug!(store = %self.name, error = %e, tries, "a commit was aborted by the server; it is made again");
                    tries += 1;
                }
                appended => return appended,
            }
        }
    }

    async fn append_once(&self, index: usize, append: &Append) -> Result<Option<Claimed>, StoreError> {
        let mut conn = self.connection(index).await?;
        let LogConnection { client, statements } = &mut *conn;
        let err = self.err();
        let s = &self.s;
        let commit = &append.commit;
        let tx = client.transaction().await.map_err(&err)?;
        let cached = CachedTransaction { tx: &tx, statements };
        // One statement: the session's row moves, fenced on the generation the writer loaded
        // and on the consumed events never moving back (a stale copy would run them again),
        // and only then is the commit's row inserted.
        let append_sql = format!(
            "WITH moved AS (
                 UPDATE {s}.sessions SET generation = $1, head = $2, consumed_seq = $3
                  WHERE name = $4 AND generation = $5 AND consumed_seq <= $3 RETURNING name
             )
             INSERT INTO {s}.commits ({COMMIT_COLUMNS})
             SELECT name, $1, $2, $6, $7, $8, $9, $10 FROM moved"
        );
        let statement = statements.get(&tx, &append_sql).await.map_err(&err)?;
        let appended = tx
            .execute(
                &statement,
                &[
                    &i64_of(commit.generation),
                    &commit.hash,
                    &i64_of(append.consumed_before),
                    &commit.session,
                    &i64_of(append.expected),
                    &commit.parent,
                    &commit.merged,
                    &commit.state_hash,
                    &i64_of(commit.events_consumed),
                    &commit.runs,
                ],
            )
            .await
            .map_err(&err)?;
        if appended == 0 {
            tx.rollback().await.map_err(&err)?;
            return Ok(None);
        }
        self.outbox.register_on(&cached, &append.intents, append.now).await?;
        let claimed = match &append.claim {
            Some(order) => self.outbox.claim_in(&cached, order.request()).await?,
            None => Claimed::default(),
        };
        tx.commit().await.map_err(&err)?;
        Ok(Some(claimed))
    }

    async fn consume(&self, index: usize, session: &str, expected: u64, before: u64) -> Result<bool, StoreError> {
        let s = &self.s;
        let sql = format!(
            "UPDATE {s}.sessions SET consumed_seq = $2
              WHERE name = $1 AND generation = $3 AND consumed_seq <= $2 RETURNING name"
        );
        let moved = self
            .query(index, &sql, &[&session, &i64_of(before), &i64_of(expected)])
            .await?;
        Ok(!moved.is_empty())
    }

    async fn put_checkpoint(&self, index: usize, row: CheckpointRow, keep: usize) -> Result<(), StoreError> {
        let mut conn = self.connection(index).await?;
        let err = self.err();
        let s = &self.s;
        let tx = conn.client.transaction().await.map_err(&err)?;
        tx.execute(
            &format!(
                "INSERT INTO {s}.checkpoints (session, generation, hash, state_hash, body, digest, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (session, generation) DO UPDATE SET hash = excluded.hash,
                     state_hash = excluded.state_hash, body = excluded.body, digest = excluded.digest,
                     created_at = excluded.created_at"
            ),
            &[
                &row.session,
                &i64_of(row.generation),
                &row.hash,
                &row.state_hash,
                &row.body,
                &row.digest,
                &ms(SystemTime::now()),
            ],
        )
        .await
        .map_err(&err)?;
        tx.execute(
            &format!(
                "DELETE FROM {s}.checkpoints WHERE session = $1 AND generation NOT IN
                     (SELECT generation FROM {s}.checkpoints WHERE session = $1 ORDER BY generation DESC LIMIT $2)"
            ),
            &[&row.session, &i64_of(keep as u64)],
        )
        .await
        .map_err(&err)?;
        tx.commit().await.map_err(&err)
    }

    async fn checkpoints(&self, index: usize, session: &str) -> Result<Vec<CheckpointRow>, StoreError> {
        let s = &self.s;
        let sql = format!(
            "SELECT session, generation, hash, state_hash, body, digest FROM {s}.checkpoints
              WHERE session = $1 ORDER BY generation"
        );
        let rows = self.query(index, &sql, &[&session]).await?;
        Ok(rows
            .iter()
            .map(|row| {
                CheckpointRow::new(
                    row.get(0),
                    u64_of(row.get(1)),
                    row.get(2),
                    row.get(3),
                    row.get(4),
                    row.get(5),
                )
            })
            .collect())
    }

    async fn keep_answer(&self, index: usize, row: AnswerRow) -> Result<(), StoreError> {
        let s = &self.s;
        let sql =
            format!("INSERT INTO {s}.call_answers (session, produce, trigger, run, call) VALUES ($1, $2, $3, $4, $5)");
        self.query(
            index,
            &sql,
            &[&row.session, &row.produce, &row.trigger, &row.run, &row.call],
        )
        .await
        .map(drop)
    }

    async fn answers(&self, index: usize, session: &str) -> Result<Vec<AnswerRow>, StoreError> {
        let s = &self.s;
        let sql = format!(
            "SELECT session, produce, trigger, run, call FROM {s}.call_answers WHERE session = $1 ORDER BY seq"
        );
        let rows = self.query(index, &sql, &[&session]).await?;
        Ok(rows
            .iter()
            .map(|row| AnswerRow::new(row.get(0), row.get(1), row.get(2), row.get(3), row.get(4)))
            .collect())
    }

    async fn drop_answers(&self, index: usize, session: &str, runs: &[(String, String)]) -> Result<(), StoreError> {
        let s = &self.s;
        let (produces, triggers): (Vec<&str>, Vec<&str>) = runs.iter().map(|(p, t)| (p.as_str(), t.as_str())).unzip();
        let sql = format!(
            "DELETE FROM {s}.call_answers a USING unnest($2::text[], $3::text[]) AS r(produce, trigger)
              WHERE a.session = $1 AND a.produce = r.produce AND a.trigger = r.trigger"
        );
        self.query(index, &sql, &[&session, &produces, &triggers])
            .await
            .map(drop)
    }

    async fn verify_outbox(&self, index: usize, check: OutboxCheck) -> Result<Option<VerifyError>, StoreError> {
        let conn = self.connection(index).await?;
        let client = &conn.client;
        let err = self.err();
        let s = &self.s;
        let rows = client
            .query(
                &format!(
                    "SELECT {ok}, sha256(o.bytes) = o.action_hash, o.key, o.kind, o.origin_commit, o.origin_run, o.action_hash,
                            o.origin_gen, o.decision, o.decided_digest
                       FROM {s}.outbox o ORDER BY o.seq",
                    ok = intact(s, "o"),
                ),
                &[],
            )
            .await
            .map_err(&err)?;
        let acts: std::collections::HashSet<ActKey<'_>> = check
            .acts
            .iter()
            .map(|a: &Act| (a.key.as_str(), a.commit, a.run, a.kind.as_str(), a.action_hash))
            .collect();
        for row in &rows {
            let key: String = row.get(2);
            if !row.get::<_, bool>(0) {
                return Ok(Some(VerifyError::OutboxChanged {
                    generation: check.first_act(&key),
                    key: key.into(),
                    detail: CHANGED.into(),
                }));
            }
            if !row.get::<_, bool>(1) {
                return Ok(Some(VerifyError::OutboxChanged {
                    generation: check.first_act(&key),
                    key: key.into(),
                    detail: REHASHED.into(),
                }));
            }
            let origin: Vec<u8> = row.get(4);
            let Ok(origin) = <[u8; 32]>::try_from(origin.as_slice()) else {
                continue;
            };
            let Some(&generation) = check.commits.get(&origin) else {
                continue; // Born of another session's commit.
            };
            let kind: String = row.get(3);
            let action_hash: Vec<u8> = row.get(6);
            if let Some(mismatch) = decision_mismatch(&check, row, &key, origin, generation, &action_hash) {
                return Ok(Some(mismatch));
            }
            // The row names the commit by its hash and its generation: both must agree.
            let acted = u64_of(row.get(7)) == generation.0
                && <[u8; 32]>::try_from(action_hash.as_slice())
                    .is_ok_and(|hash| acts.contains(&(key.as_str(), origin, u64_of(row.get(5)), kind.as_str(), hash)));
            if !acted {
                return Ok(Some(VerifyError::OutboxForged {
                    generation,
                    key: key.into(),
                }));
            }
        }
        let keys: Vec<&str> = check.acts.iter().map(|a| a.key.as_str()).collect();
        let missing = client
            .query_opt(
                &format!(
                    "SELECT k.n FROM unnest($1::text[]) WITH ORDINALITY AS k(key, n)
                      WHERE NOT EXISTS (SELECT 1 FROM {s}.outbox o WHERE o.key = k.key)
                        AND NOT EXISTS (SELECT 1 FROM {s}.outbox_purged p WHERE p.key = k.key)
                      ORDER BY k.n LIMIT 1"
                ),
                &[&keys],
            )
            .await
            .map_err(&err)?;
        // The first act (in log order) whose key has neither a row nor a tombstone.
        let act = missing.and_then(|row| {
            let n: i64 = row.get(0);
            usize::try_from(n - 1).ok().and_then(|i| check.acts.get(i))
        });
        Ok(act.map(|act| VerifyError::OutboxMissing {
            generation: act.generation,
            key: act.key.clone(),
        }))
    }
}

impl LogStore for PostgresStore {
    fn describe(&self) -> String {
        self.log.name.clone()
    }

    fn outbox(&self) -> Arc<dyn OutboxStore> {
        self.outbox.clone()
    }

    fn session<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<SessionRow>, StoreError>> {
        let name = name.to_owned();
        self.run(&name.clone(), move |log, i| async move { log.session(i, &name).await })
    }

    fn create_session<'a>(&'a self, name: &'a str, row: SessionRow) -> BoxFuture<'a, Result<bool, StoreError>> {
        let name = name.to_owned();
        self.run(&name.clone(), move |log, i| async move {
            log.create_session(i, &name, row).await
        })
    }

    fn commits<'a>(
        &'a self,
        session: &'a str,
        after: u64,
        upto: u64,
    ) -> BoxFuture<'a, Result<Vec<CommitRow>, StoreError>> {
        let session = session.to_owned();
        self.run(&session.clone(), move |log, i| async move {
            log.commits(i, &session, after, upto).await
        })
    }

    fn commit_by_hash<'a>(&'a self, hash: &'a [u8]) -> BoxFuture<'a, Result<Option<CommitRow>, StoreError>> {
        let hash = hash.to_vec();
        self.run("", move |log, i| async move { log.commit_by_hash(i, hash).await })
    }

    fn append(&self, append: Append) -> BoxFuture<'_, Result<Option<Claimed>, StoreError>> {
        let session = append.commit.session.clone();
        let now = append.now;
        self.run_or(
            &session,
            move |log, i| async move { log.append(i, append).await },
            // The caller is gone (its commit was cut off): what the claim took is given back
            // at once, not left in flight for a lease.
            move |log, appended| async move {
                if let Ok(Some(claimed)) = appended {
                    log.outbox.release(&claimed, now).await;
                }
            },
        )
    }

    fn consume<'a>(&'a self, session: &'a str, expected: u64, before: u64) -> BoxFuture<'a, Result<bool, StoreError>> {
        let session = session.to_owned();
        self.run(&session.clone(), move |log, i| async move {
            log.consume(i, &session, expected, before).await
        })
    }

    fn put_checkpoint(&self, row: CheckpointRow, keep: usize) -> BoxFuture<'_, Result<(), StoreError>> {
        let session = row.session.clone();
        self.run(
            &session,
            move |log, i| async move { log.put_checkpoint(i, row, keep).await },
        )
    }

    fn checkpoints<'a>(&'a self, session: &'a str) -> BoxFuture<'a, Result<Vec<CheckpointRow>, StoreError>> {
        let session = session.to_owned();
        self.run(&session.clone(), move |log, i| async move {
            log.checkpoints(i, &session).await
        })
    }

    fn keep_answer(&self, row: AnswerRow) -> BoxFuture<'_, Result<(), StoreError>> {
        let session = row.session.clone();
        self.run(&session, move |log, i| async move { log.keep_answer(i, row).await })
    }

    fn answers<'a>(&'a self, session: &'a str) -> BoxFuture<'a, Result<Vec<AnswerRow>, StoreError>> {
        let session = session.to_owned();
        self.run(
            &session.clone(),
            move |log, i| async move { log.answers(i, &session).await },
        )
    }

    fn drop_answers<'a>(
        &'a self,
        session: &'a str,
        runs: &'a [(String, String)],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (session, runs) = (session.to_owned(), runs.to_vec());
        self.run(&session.clone(), move |log, i| async move {
            log.drop_answers(i, &session, &runs).await
        })
    }

    fn verify_outbox(&self, check: OutboxCheck) -> BoxFuture<'_, Result<Option<VerifyError>, StoreError>> {
        self.run("", move |log, i| async move { log.verify_outbox(i, check).await })
    }
}

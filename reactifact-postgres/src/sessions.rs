//! What an operator's tool (the `reactifact` CLI) reads of a PostgreSQL store before and
//! after opening it: whether a schema holds a store, and at which version, without creating
//! or migrating anything ([`PostgresStore::probe`]); and the store's sessions, each with its
//! head, fork point and the number of its own commits ([`PostgresStore::sessions`]). Neither
//! writes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reactifact_core::audit::CommitHash;
use reactifact_core::error::StoreError;
use reactifact_core::runtime::Generation;
use tokio_postgres::NoTls;

use crate::connect::{pool_error, store_error, valid_schema, DriverError, OpenError, PostgresOptions, Target};
use crate::log::PostgresStore;
use crate::schema::SCHEMA_VERSION;

/// What [`PostgresStore::probe`] found in a schema of a database.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchemaProbe {
    /// The store, as it describes itself (`postgres://user@host:port/database schema s`, no
    /// password).
    pub store: String,
    /// The database connected to.
    pub database: String,
    /// The schema looked in.
    pub schema: String,
    /// The version of the store in the schema; `None` when the schema holds no reactifact
    /// store (it does not exist, or has no version table).
    pub version: Option<i32>,
    /// The version this build writes and reads: a store at an older one is upgraded by
    /// [`PostgresStore::open`], one at a newer one is refused by it.
    pub supported: i32,
}

/// One session of a PostgreSQL store, as [`PostgresStore::sessions`] reads it: the columns
/// that [`reactifact_core::store::SessionInfo`] gives for a SQLite file, and what the store keeps
/// besides.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PgSessionInfo {
    /// The session's name.
    pub name: String,
    /// The generation of its last commit (0 for a session without commits): the length of
    /// its log, a branch's log counting its parent's commits up to the fork.
    pub generation: Generation,
    /// The hash of its last commit, `None` for a session without commits.
    pub head: Option<CommitHash>,
    /// For a branch, the session it was forked from and the generation it was forked at.
    pub forked_from: Option<(String, Generation)>,
    /// When the session was created.
    pub created_at: SystemTime,
    /// The position in its event queue up to which its commits consumed events.
    pub consumed_seq: u64,
    /// How many commits the store holds for the session itself (a branch's log also reads
    /// its parent's commits up to the fork, which are not counted here).
    pub commits: u64,
}

impl PostgresStore {
    /// Connects as `options` say, on one connection of its own (closed before this returns),
    /// and finds whether the schema of `options` holds a store and at which version, without
    /// creating, migrating or locking anything: what a tool that must never create a store
    /// checks before [`open`](PostgresStore::open), which would. Awaited within a tokio
    /// runtime.
    ///
    /// # Errors
    /// [`OpenError::BadUrl`], [`OpenError::BadSchema`]; [`OpenError::Connect`] (naming host,
    /// port, database and user) when no connection can be made; [`OpenError::Store`] for an
    /// error of the server.
    pub async fn probe(options: &PostgresOptions) -> Result<SchemaProbe, OpenError> {
        let schema = options.schema_name().to_owned();
        if !valid_schema(&schema) {
            return Err(OpenError::BadSchema { schema });
        }
        let target = Target::parse(options)?;
        let store = target.describe(&schema);
        let (client, connection) = target
            .config
            .connect(NoTls)
            .await
            .map_err(|e| target.connect_error(DriverError::boxed(e)))?;
        let driver = tokio::spawn(connection);
        let err = |e| OpenError::Store(store_error(&store, e));
        let versioned: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = 'schema_version')",
                &[&schema],
            )
            .await
            .map_err(err)?
            .get(0);
        let version = if versioned {
            let s = crate::schema::quoted(&schema);
            let found: i32 = client
                .query_one(
                    &format!("SELECT coalesce(max(version), 0) FROM {s}.schema_version"),
                    &[],
                )
                .await
                .map_err(err)?
                .get(0);
            Some(found).filter(|v| *v > 0)
        } else {
            None
        };
        drop(client);
        let _ = driver.await;
        Ok(SchemaProbe {
            store,
            database: target.database,
            schema,
            version,
            supported: SCHEMA_VERSION,
        })
    }

    /// The store's sessions, ordered by name, each with its head, its fork point and the
    /// number of its own commits: one query on the store's pool (so it is awaited within a
    /// tokio runtime, as the outbox's operations are). It only reads.
    ///
    /// # Errors
    /// [`StoreError::Backend`] for an error of the server, or for a session row whose head is
    /// not a 32-byte hash (a row changed outside reactifact).
    pub async fn sessions(&self) -> Result<Vec<PgSessionInfo>, StoreError> {
        let outbox = self.outbox();
        let name = outbox.name();
        let s = outbox.quoted_schema();
        let client = outbox.pool().get().await.map_err(|e| pool_error(name, e))?;
        let rows = client
            .query(
                &format!(
                    "SELECT s.name, s.generation, s.head, s.consumed_seq, s.parent, s.fork_generation, s.created_at,
                            (SELECT count(*) FROM {s}.commits c WHERE c.session = s.name)
                       FROM {s}.sessions s ORDER BY s.name"
                ),
                &[],
            )
            .await
            .map_err(|e| store_error(name, e))?;
        rows.iter()
            .map(|row| {
                let session: String = row.get(0);
                let head: Option<Vec<u8>> = row.get(2);
                let head = match head {
                    None => None,
                    Some(bytes) => Some(CommitHash(<[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
                        StoreError::backend(
                            name,
                            false,
                            format!(
                                "the head of session `{session}` is {} bytes long, not a 32-byte hash",
                                bytes.len()
                            ),
                        )
                    })?)),
                };
                let parent: Option<String> = row.get(4);
                let fork: Option<i64> = row.get(5);
                Ok(PgSessionInfo {
                    generation: Generation(unsigned(row.get(1))),
                    head,
                    consumed_seq: unsigned(row.get(3)),
                    forked_from: parent.map(|parent| (parent, Generation(fork.map_or(0, unsigned)))),
                    created_at: UNIX_EPOCH + Duration::from_millis(unsigned(row.get(6))),
                    commits: unsigned(row.get(7)),
                    name: session,
                })
            })
            .collect()
    }
}

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

//! What an operator's tool (the `reactifact` CLI) reads of a PostgreSQL store before and
//! after opening it: whether a schema holds a store, and at which version, without creating
//! or migrating anything ([`PostgresStore::probe`]); and the store's sessions, each with its
//! head, fork point, consumed event position and the number of its own commits, as
//! [`SessionInfo`] (the type a SQLite file's sessions are listed by too:
//! [`PostgresStore::sessions`]). Neither writes.

use std::time::{Duration, UNIX_EPOCH};

use reactifact_core::audit::CommitHash;
use reactifact_core::error::StoreError;
use reactifact_core::runtime::Generation;
use reactifact_core::store::SessionInfo;
use tokio_postgres::NoTls;

use crate::connect::{pool_error, store_error, valid_schema, DriverError, PostgresOptions, Target};
use crate::log::PostgresStore;
use crate::schema::SCHEMA_VERSION;
use crate::OpenError;

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

/// One session of a PostgreSQL store: the type every backend lists sessions by,
/// [`SessionInfo`], which [`PostgresStore::sessions`] returns.
#[deprecated(note = "use `reactifact_core::store::SessionInfo`, which `PostgresStore::sessions` returns")]
pub type PgSessionInfo = SessionInfo;

impl PostgresStore {
    /// Connects as `options` say, on one connection of its own (closed before this returns),
    /// and finds whether the schema of `options` holds a store and at which version, without
    /// creating, migrating or locking anything: what a tool that must never create a store
    /// checks before [`open`](PostgresStore::open), which would. Awaited within a tokio
    /// runtime.
    ///
    /// # Errors
    /// [`OpenError::BadUrl`], [`OpenError::BadSchema`]; [`OpenError::Connect`] (naming host,
    /// port, database and user) when no connection can be made; [`OpenError::Prepare`] for an
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
        let err = |e| OpenError::Prepare {
            source: store_error(&store, e),
        };
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

    /// The store's sessions, ordered by name, each with its generation, head, fork point,
    /// consumed event position and the number of its own commits: the values
    /// [`list_sessions`](reactifact_core::store::list_sessions) gives for a SQLite file that
    /// holds the same history (the creation times aside). One query on the store's pool (so
    /// it is awaited within a tokio runtime, as the outbox's operations are); it only reads.
    ///
    /// # Errors
    /// [`StoreError::Backend`] for an error of the server, or for a session row whose head is
    /// not a 32-byte hash or whose fork generation is negative (a row changed outside
    /// reactifact).
    pub async fn sessions(&self) -> Result<Vec<SessionInfo>, StoreError> {
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
                // The schema checks that generations and positions are not negative, but not
                // the fork point: a negative one is a row changed outside reactifact.
                let fork: i64 = row.get::<_, Option<i64>>(5).unwrap_or(0);
                let fork = u64::try_from(fork).map_err(|_| {
                    StoreError::backend(
                        name,
                        false,
                        format!("the fork generation of session `{session}` is negative ({fork})"),
                    )
                })?;
                let mut info = SessionInfo::new(session, UNIX_EPOCH + Duration::from_millis(unsigned(row.get(6))));
                info.generation = Generation(unsigned(row.get(1)));
                info.head = head;
                info.forked_from = parent.map(|parent| (parent, Generation(fork)));
                info.consumed_seq = unsigned(row.get(3));
                info.commits = unsigned(row.get(7));
                Ok(info)
            })
            .collect()
    }
}

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

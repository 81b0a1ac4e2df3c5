//! `PostgresProvider`: the struct, its connections and pool, the migration,
//! and the helpers every operation uses.

use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio_util::task::AbortOnDropHandle;

use lease_api::backend::{
    DEFAULT_MAX_KEYS, DEFAULT_MAX_TTL, MultiKey, OwnerId, validate_namespace,
};
use lease_api::backend::{ProbedCapabilities, WatchHub};
use lease_api::{
    Capabilities, ExpiryClock, FencingToken, Lease, LeaseError, LeaseInfo, Notifications, Result,
    TokenDurability,
};
use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::config::PostgresConfig;
use crate::hosts::Hosts;
use sqlx::{Postgres, Row, Transaction};
use tokio::sync::OnceCell;

use crate::conns::{Conns, PING_IF_IDLE_FOR};
use crate::sql::{Statements, validate_identifier};

/// The LISTEN task; dropping it (a new listener, the last provider clone)
/// stops the task.
pub(crate) struct Listener {
    pub(crate) task: AbortOnDropHandle<()>,
}

pub(crate) struct Inner {
    /// Made on first use: the pool spawns tasks, so it needs a runtime.
    pub(crate) pool: OnceLock<PgPool>,
    /// The connections acquire, extend, release and inspect run on.
    pub(crate) conns: Conns,
    /// The server, or the servers of which one is the primary.
    pub(crate) hosts: Arc<Hosts>,
    /// `host:port` the pool connects to now, when it has moved (several hosts).
    pub(crate) pool_host: Arc<std::sync::Mutex<Option<String>>>,
    /// With several hosts, the first call waits for the probe: the failover
    /// declaration depends on the primary's replication settings.
    pub(crate) probed_first: OnceCell<()>,
    pub(crate) connect_options: sqlx::postgres::PgConnectOptions,
    pub(crate) pool_options: PgPoolOptions,
    pub(crate) sql: Statements,
    pub(crate) namespace: String,
    pub(crate) create_table: bool,
    pub(crate) migrated: OnceCell<()>,
    /// Whether the waiters' marks have their unique index (looked up once).
    pub(crate) marks_indexed: OnceCell<bool>,
    pub(crate) response_timeout: Duration,
    pub(crate) hub: Arc<WatchHub>,
    pub(crate) listener: tokio::sync::Mutex<Option<Listener>>,
    pub(crate) caps: ProbedCapabilities,
    pub(crate) display: String,
    /// Patroni's REST API addresses, for the failover probe.
    pub(crate) patroni: Vec<String>,
    /// Cancels of acquires that had no answer (`orphans.rs`).
    pub(crate) cleanups: tokio_util::task::TaskTracker,
    /// Their turns: [`CANCELS_AT_ONCE`] run at once.
    pub(crate) cancel_turns: tokio::sync::Semaphore,
}

/// Cancels of one provider running at once; the rest wait their turn, so a
/// store that stalls many acquires is not also flooded with their cancels.
const CANCELS_AT_ONCE: usize = 4;

/// Leases in a PostgreSQL table, timed by the database clock.
///
/// Acquire, extend, release and inspect are one statement each, one round trip
/// on the wire. Clones share their connections and one LISTEN connection
/// (opened on the first wait). See the crate docs.
#[derive(Clone)]
pub struct PostgresProvider {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for PostgresProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresProvider")
            .field("server", &self.inner.display)
            .field("namespace", &self.inner.namespace)
            .finish_non_exhaustive()
    }
}

/// A failed TLS handshake or certificate check, a refused login (28xxx:
/// wrong password, no pg_hba entry such as a plain connection where only TLS
/// is allowed) or a missing privilege (42501).
fn is_denied(e: &sqlx::Error) -> bool {
    let rustls_refused = |io: &std::io::Error| {
        io.get_ref()
            .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
    };
    matches!(e, sqlx::Error::Tls(_))
        || matches!(e, sqlx::Error::Io(io) if rustls_refused(io))
        || matches!(e, sqlx::Error::Database(d) if d.code().is_some_and(|c| {
            c.starts_with("28") || c.as_ref() == "42501"
        }))
}

fn is_unavailable(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Protocol(_)
    ) || matches!(e, sqlx::Error::Database(d) if d.code().is_some_and(|c| {
        // 57P01..57P03: admin shutdown, crash shutdown, cannot connect now; 08xxx:
        // connection exceptions; 53300 too many connections; 40001/40P01
        // serialization failure and deadlock; 55P03 lock not available. The rest
        // (42xxx undefined table or permission, 28xxx authentication) is permanent.
        // 25006 (read-only transaction) is a primary demoted to a standby.
        c.starts_with("57P")
            || c.starts_with("08")
            || matches!(c.as_ref(), "53300" | "40001" | "40P01" | "55P03" | "25006")
    }))
}

/// SQLSTATE 57014 (`query_canceled`): raised by `statement_timeout`, and by a
/// cancel request (`pg_cancel_backend`), which is told apart only by the
/// message text, and that is translated under `lc_messages`. Both end the
/// statement unapplied; a transient timeout is the honest answer to either.
fn is_statement_timeout(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("57014"))
}

impl PostgresProvider {
    /// Sets up a provider. Connections are made on first use, so this does not
    /// fail when the database is down; operations then return `Unavailable`.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for a malformed URL, namespace, schema or table name.
    pub fn new(config: PostgresConfig) -> Result<Self> {
        let base = Capabilities::new(
            "postgres",
            ExpiryClock::StoreServer,
            Notifications::Native("PostgreSQL LISTEN/NOTIFY"),
        )
        .with_ttl_limits(Duration::from_millis(10), DEFAULT_MAX_TTL)
        .with_expiry_slack(Duration::from_millis(5))
        .with_fair_waiting(true)
        .with_multi_key(MultiKey::atomic(DEFAULT_MAX_KEYS))
        .with_shared_leases(true);
        Self::with_capabilities(config, base)
    }

    /// A provider declaring `base` until the probe adds token durability
    /// (and, with several hosts, the failover declaration): for the modes
    /// built on this one, such as [`AdvisoryProvider`](crate::AdvisoryProvider).
    pub(crate) fn with_capabilities(config: PostgresConfig, base: Capabilities) -> Result<Self> {
        validate_namespace(&config.namespace)?;
        validate_identifier("schema", &config.schema)?;
        validate_identifier("table", &config.table)?;
        if !(config.url.starts_with("postgres://") || config.url.starts_with("postgresql://")) {
            return Err(LeaseError::Config(
                "a PostgreSQL URL starts with postgres:// or postgresql://".into(),
            ));
        }
        for addr in &config.patroni {
            let port = addr
                .rsplit_once(':')
                .map(|(host, port)| (host, port.parse::<u16>()));
            if !matches!(port, Some((host, Ok(p))) if !host.is_empty() && p > 0) {
                return Err(LeaseError::Config(format!(
                    "a Patroni REST API address is host:port, not {addr:?}"
                )));
            }
        }
        // rustls needs its crypto provider chosen once per process (sslmode).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let hosts = Arc::new(Hosts::parse(
            &config.url,
            config.connect_timeout,
            config.response_timeout,
        )?);
        let options = hosts.current();
        let display = format!("postgres://{}", hosts.display());
        let multi = hosts.is_multi();
        let pool_options = PgPoolOptions::new()
            .max_connections(config.max_connections)
            .min_connections(0)
            .acquire_timeout(config.connect_timeout)
            // The pool serves LISTEN, the migration, the probe and fenced
            // transactions (lease statements run on `Conns`). sqlx would ping
            // every connection it hands out; only one that sat idle can have
            // been cut (a server restart, a proxy's idle timeout), so only
            // those are checked.
            .test_before_acquire(false)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if multi {
                        // The pool's host may be a standby (the first host
                        // listed, or the primary since demoted): refuse it.
                        if !crate::hosts::is_writable(conn).await? {
                            return Err(sqlx::Error::Protocol(
                                "the pool's host is a standby or read-only".into(),
                            ));
                        }
                    }
                    Ok(())
                })
            })
            .before_acquire(move |conn, meta| {
                Box::pin(async move {
                    if meta.idle_for < PING_IF_IDLE_FOR {
                        return Ok(true);
                    }
                    if multi {
                        // In place of the ping, same one round trip: with
                        // several hosts an idle pooled connection may sit on
                        // a primary since demoted (or made read-only), and is
                        // closed instead of handed out.
                        return crate::hosts::is_writable(conn).await;
                    }
                    sqlx::Connection::ping(conn).await?;
                    Ok(true)
                })
            });
        let base = base.with_durable_tokens(TokenDurability::Unknown(
            "not yet probed: tokens are rows, durable unless fsync or synchronous_commit is off"
                .into(),
        ));
        Ok(PostgresProvider {
            inner: Arc::new(Inner {
                pool: OnceLock::new(),
                conns: Conns::new(
                    Arc::clone(&hosts),
                    config.max_connections,
                    config.response_timeout,
                ),
                pool_host: Arc::default(),
                probed_first: OnceCell::new(),
                hosts,
                connect_options: options,
                pool_options,
                sql: Statements::new(&config.schema, &config.table),
                namespace: config.namespace,
                create_table: config.create_table,
                migrated: OnceCell::new(),
                marks_indexed: OnceCell::new(),
                response_timeout: config.response_timeout,
                hub: Arc::default(),
                listener: tokio::sync::Mutex::new(None),
                caps: ProbedCapabilities::new(base),
                display,
                patroni: config.patroni,
                cleanups: tokio_util::task::TaskTracker::new(),
                cancel_turns: tokio::sync::Semaphore::new(CANCELS_AT_ONCE),
            }),
        })
    }

    /// A provider for `url` with defaults for everything else.
    ///
    /// # Errors
    /// As [`PostgresProvider::new`].
    pub fn from_url(url: &str) -> Result<Self> {
        Self::new(PostgresConfig::new(url))
    }

    /// The pool, to run your own statements (for example inside
    /// [`begin_fenced`](Self::begin_fenced)'s transaction). Made on first use.
    ///
    /// With several hosts, the pool connects to the host that last answered
    /// as the primary.
    ///
    /// # Errors
    /// [`LeaseError::Config`] when called outside a tokio runtime.
    pub fn pool(&self) -> Result<&PgPool> {
        let pool = match self.inner.pool.get() {
            Some(p) => p,
            None => {
                in_runtime()?;
                self.inner.pool.get_or_init(|| {
                    self.inner
                        .pool_options
                        .clone()
                        .connect_lazy_with(self.inner.connect_options.clone())
                })
            }
        };
        if self.inner.hosts.is_multi() {
            point_pool(pool, &self.inner.hosts, &self.inner.pool_host);
        }
        Ok(pool)
    }

    pub(crate) fn map_err(&self, e: sqlx::Error) -> LeaseError {
        self.map_err_for("a statement", e)
    }

    /// As [`map_err`](Self::map_err), naming `operation` in a timeout.
    fn map_err_for(&self, operation: &'static str, e: sqlx::Error) -> LeaseError {
        if is_statement_timeout(&e) {
            // The server ended the statement: its limit (the response
            // timeout, set at connect on the lease connections; a role's
            // own elsewhere) or a cancel request. Nothing was applied, as
            // when the client gives up, so the same error.
            return LeaseError::timeout(operation, self.inner.response_timeout);
        }
        if is_denied(&e) {
            return LeaseError::denied(
                format!(
                    "PostgreSQL at {} refused our credentials, certificate check or permissions",
                    self.inner.display
                ),
                e,
            );
        }
        if is_unavailable(&e) {
            LeaseError::unavailable(
                format!("PostgreSQL at {} is unreachable", self.inner.display),
                e,
            )
        } else {
            LeaseError::backend(
                format!(
                    "PostgreSQL at {} answered with an error",
                    self.inner.display
                ),
                e,
            )
        }
    }

    pub(crate) async fn bounded<T>(
        &self,
        what: &'static str,
        f: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T> {
        lease_api::backend::bounded(what, self.inner.response_timeout, f, |e| {
            self.map_err_for(what, e)
        })
        .await
    }

    /// Creates the schema (if not `public`) and the lease table if they do not
    /// exist. Safe to run from many processes at once: it takes a transaction-level
    /// advisory lock first.
    ///
    /// # Errors
    /// `Unavailable` when the database is down; `Backend` without the privilege.
    pub async fn migrate(&self) -> Result<()> {
        let sql = &self.inner.sql;
        self.bounded("the migration", async {
            let mut tx = self
                .pool()
                .map_err(|e| sqlx::Error::Configuration(e.into()))?
                .begin()
                .await?;
            sqlx::query("SELECT pg_advisory_xact_lock(hashtext('lease-postgres migrate'))")
                .execute(&mut *tx)
                .await?;
            if let Some(s) = &sql.create_schema {
                sqlx::query(s).execute(&mut *tx).await?;
            }
            sqlx::query(&sql.create_table).execute(&mut *tx).await?;
            sqlx::query(&sql.waiters.create_table)
                .execute(&mut *tx)
                .await?;
            sqlx::query(&sql.rw.create_table).execute(&mut *tx).await?;
            let has_mark: bool = sqlx::query_scalar(&sql.waiters.has_mark)
                .fetch_one(&mut *tx)
                .await?;
            if !has_mark {
                sqlx::query(&sql.waiters.add_mark).execute(&mut *tx).await?;
            }
            let has_holder: bool = sqlx::query_scalar(&sql.has_holder)
                .fetch_one(&mut *tx)
                .await?;
            if !has_holder {
                sqlx::query(&sql.add_holder).execute(&mut *tx).await?;
            }
            tx.commit().await
        })
        .await?;
        // The waiters' marks are unique where this role may add the index
        // (it must own the table); without it, joins take the statement
        // from before the index (see `WaiterStatements::join_unindexed`).
        let limit = self.inner.response_timeout;
        let indexed = lease_api::backend::bounded(
            "the waiters' index",
            limit,
            async {
                let pool = self
                    .pool()
                    .map_err(|e| sqlx::Error::Configuration(e.into()))?;
                let has: bool = sqlx::query_scalar(&sql.waiters.has_mark_index)
                    .fetch_one(pool)
                    .await?;
                if !has {
                    let mut tx = pool.begin().await?;
                    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('lease-postgres migrate'))")
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(&sql.waiters.dedupe_marks)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(&sql.waiters.mark_index)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                }
                Ok(())
            },
            |e| {
                // The server ended the build (a role's own statement_timeout,
                // a cancel): it would end it again on every call, so this is
                // a refusal, not a timeout to retry.
                if is_statement_timeout(&e) {
                    LeaseError::backend("PostgreSQL ended the waiters' index build", e)
                } else {
                    self.map_err(e)
                }
            },
        )
        .await;
        if let Err(e) = indexed {
            // A server that is down or slow fails the migration (tried again
            // on the next call); one that refuses the index leaves joins
            // without it.
            if e.is_transient() {
                return Err(e);
            }
            tracing::warn!(error = %e, "could not add the unique index on the waiters' marks; joins go without it");
        }
        Ok(())
    }

    /// Deletes the rows of every namespace whose name starts with `prefix`,
    /// whoever holds them, and returns how many went. Tokens of those keys start
    /// again afterwards: only for namespaces nobody uses any more, such as a
    /// finished `lease conformance` run's. Runs no DDL.
    ///
    /// # Errors
    /// `Config` for an empty prefix; `Unavailable` when the database is down.
    pub async fn purge_namespaces(&self, prefix: &str) -> Result<u64> {
        lease_api::backend::validate_purge_prefix(prefix)?;
        let done = self
            .bounded(
                "purge",
                sqlx::query(&self.inner.sql.purge)
                    .bind(prefix)
                    .execute(self.pool()?),
            )
            .await?;
        // The fair waiters of those namespaces; a table made before fair
        // waiting existed has none.
        let waiters = self
            .bounded(
                "purge",
                sqlx::query(&self.inner.sql.waiters.purge)
                    .bind(prefix)
                    .execute(self.pool()?),
            )
            .await
            .map(|d| d.rows_affected())
            .unwrap_or(0);
        // Read/write leases; a table made before them has none.
        let rw = self
            .bounded(
                "purge",
                sqlx::query(&self.inner.sql.rw.purge)
                    .bind(prefix)
                    .execute(self.pool()?),
            )
            .await
            .map(|d| d.rows_affected())
            .unwrap_or(0);
        Ok(done.rows_affected() + waiters + rw)
    }

    /// The servers, for connections of the modes built on this provider.
    pub(crate) fn hosts(&self) -> &Arc<Hosts> {
        &self.inner.hosts
    }

    /// The namespace (also through [`LeaseProvider::namespace`](lease_api::LeaseProvider::namespace)).
    pub(crate) fn namespace_str(&self) -> &str {
        &self.inner.namespace
    }

    /// An inspect row (token, owner, remaining µs, holder) as a `LeaseInfo`.
    pub(crate) fn lease_info(&self, row: &sqlx::postgres::PgRow) -> Result<LeaseInfo> {
        let decode = |e: sqlx::Error| self.map_err(e);
        let token: i64 = row.try_get(0).map_err(decode)?;
        let owner: Option<String> = row.try_get(1).map_err(decode)?;
        let remaining: i64 = row.try_get(2).map_err(decode)?;
        let holder: Option<String> = row.try_get(3).map_err(decode)?;
        Ok(LeaseInfo::new(
            FencingToken(u64::try_from(token).unwrap_or(0)),
            from_micros(remaining),
            owner.as_deref().and_then(OwnerId::from_hex),
            holder,
        ))
    }

    /// The connections with a server-side statement limit, for statements
    /// that must not commit after the client gave up on them.
    pub(crate) fn conns(&self) -> &Conns {
        &self.inner.conns
    }

    /// The NOTIFY channel of this provider's table.
    pub(crate) fn channel(&self) -> &str {
        &self.inner.sql.channel
    }

    /// How long a statement may take.
    pub(crate) fn response_timeout(&self) -> Duration {
        self.inner.response_timeout
    }

    /// The server as shown in messages (`postgres://host:port`).
    pub(crate) fn display(&self) -> &str {
        &self.inner.display
    }

    /// `schema.table`, quoted.
    pub(crate) fn table_sql(&self) -> &str {
        &self.inner.sql.table
    }

    pub(crate) async fn ready(&self) -> Result<()> {
        in_runtime()?;
        self.probe_first().await;
        self.start_probe();
        if !self.inner.create_table {
            return Ok(());
        }
        self.inner
            .migrated
            .get_or_try_init(|| self.migrate())
            .await
            .map(|_| ())
    }

    /// Begins a transaction that holds the lease row `FOR SHARE` after checking
    /// that `lease` (owner, token) is still held and not expired on the database
    /// clock. Run the protected writes in it and commit: they commit only while
    /// the lease is held, because a takeover must update that row and waits for
    /// this transaction to end. Keep it short: renewals of the same lease wait too.
    ///
    /// ```no_run
    /// # async fn demo(provider: lease_postgres::PostgresProvider, lease: lease_api::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = provider.begin_fenced(&lease).await?;
    /// sqlx::query("UPDATE ledger SET settled = true WHERE batch = $1")
    ///     .bind(42_i64)
    ///     .execute(&mut *tx)
    ///     .await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `Lost` when the lease is no longer held (nothing is written);
    /// `Unavailable` when the database cannot be reached.
    pub async fn begin_fenced(&self, lease: &Lease) -> Result<Transaction<'static, Postgres>> {
        self.ready().await?;
        let mut tx = self.bounded("BEGIN", self.pool()?.begin()).await?;
        let held = self
            .bounded(
                "the fence check",
                sqlx::query(&self.inner.sql.fence)
                    .bind(&self.inner.namespace)
                    .bind(lease.key().as_str())
                    .bind(lease.owner().to_hex())
                    .bind(token_i64(lease.token())?)
                    .fetch_optional(&mut *tx),
            )
            .await?;
        if held.is_none() {
            // Dropping the transaction rolls it back.
            return Err(LeaseError::lost(lease));
        }
        Ok(tx)
    }
}

/// Points `pool` at the host that last answered as the primary, if it is
/// not there yet. Connections it already holds stay until they fail.
pub(crate) fn point_pool(pool: &PgPool, hosts: &Hosts, at: &std::sync::Mutex<Option<String>>) {
    let options = hosts.current();
    let host = format!("{}:{}", options.get_host(), options.get_port());
    let mut at = at.lock().unwrap_or_else(|p| p.into_inner());
    if at.as_deref() != Some(host.as_str()) {
        if at.is_some() {
            tracing::info!(primary = %host, "PostgreSQL primary moved");
        }
        pool.set_connect_options(options);
        *at = Some(host);
    }
}

/// Connections and the background tasks need a tokio runtime: say so
/// instead of panicking inside tokio.
pub(crate) fn in_runtime() -> Result<()> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(LeaseError::Config(
            "PostgresProvider must be used inside a tokio runtime".into(),
        ));
    }
    Ok(())
}

pub(crate) fn token_i64(t: FencingToken) -> Result<i64> {
    i64::try_from(t.get())
        .map_err(|_| LeaseError::protocol(format!("token {t} does not fit a bigint")))
}

pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

pub(crate) fn from_micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

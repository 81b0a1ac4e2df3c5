//! `PostgresProvider`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio_util::task::AbortOnDropHandle;

use async_trait::async_trait;
use lease_api::backend::{
    DEFAULT_MAX_TTL, DEFAULT_NAMESPACE, KeyWatch, OwnerId, Place, Ticket, WaitQueue,
    validate_namespace,
};
use lease_api::backend::{ProbedCapabilities, WatchHub};
use lease_api::{
    Capabilities, ExpiryClock, Failover, FailoverTokens, FencingToken, Lease, LeaseError,
    LeaseInfo, LeaseKey, LeaseProvider, Notifications, Result, TokenDurability, TryAcquire,
};
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};

use crate::hosts::Hosts;
use sqlx::{Postgres, Row, Transaction};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::conns::{Conns, PING_IF_IDLE_FOR};
use crate::sql::{Statements, payload, ticket_payload, validate_identifier};

/// How to reach PostgreSQL and where the lease table lives.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PostgresConfig {
    /// `postgres://user:password@host:port/database` (also `postgresql://`).
    pub url: String,
    /// The namespace; providers in different namespaces never see each other.
    pub namespace: String,
    /// The schema of the lease table. Default `public`.
    pub schema: String,
    /// The lease table. Default `lease_leases`.
    pub table: String,
    /// How long to wait for a connection (from the pool or a new one).
    pub connect_timeout: Duration,
    /// How long to wait for a statement's answer.
    pub response_timeout: Duration,
    /// How many connections lease statements may use at once (default 10).
    /// The pool for LISTEN, the migration, the probe and fenced transactions
    /// has the same limit; it is used far less, so it seldom holds more than one
    /// or two.
    pub max_connections: u32,
    /// Create the table on first use. Default true; turn off when schemas are
    /// managed elsewhere and call [`PostgresProvider::migrate`] there instead.
    pub create_table: bool,
}

impl PostgresConfig {
    /// A configuration for `url` with defaults for everything else.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresConfig {
            url: url.into(),
            namespace: DEFAULT_NAMESPACE.into(),
            schema: "public".into(),
            table: "lease_leases".into(),
            connect_timeout: Duration::from_secs(3),
            response_timeout: Duration::from_secs(3),
            max_connections: 10,
            create_table: true,
        }
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets schema and table.
    pub fn table(mut self, schema: impl Into<String>, table: impl Into<String>) -> Self {
        self.schema = schema.into();
        self.table = table.into();
        self
    }

    /// Sets both timeouts.
    pub fn timeouts(mut self, connect: Duration, response: Duration) -> Self {
        self.connect_timeout = connect;
        self.response_timeout = response;
        self
    }

    /// Sets the pool size.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Creates the table on first use (the default), or leaves it to
    /// [`PostgresProvider::migrate`] run elsewhere.
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }
}

/// The LISTEN task; dropping it (a new listener, the last provider clone)
/// stops the task.
struct Listener {
    task: AbortOnDropHandle<()>,
}

struct Inner {
    /// Made on first use: the pool spawns tasks, so it needs a runtime.
    pool: OnceLock<PgPool>,
    /// The connections acquire, extend, release and inspect run on.
    conns: Conns,
    /// The server, or the servers of which one is the primary.
    hosts: Arc<Hosts>,
    /// `host:port` the pool connects to now, when it has moved (several hosts).
    pool_host: Arc<std::sync::Mutex<Option<String>>>,
    /// With several hosts, the first call waits for the probe: the failover
    /// declaration depends on the primary's replication settings.
    probed_first: OnceCell<()>,
    connect_options: sqlx::postgres::PgConnectOptions,
    pool_options: PgPoolOptions,
    sql: Statements,
    namespace: String,
    create_table: bool,
    migrated: OnceCell<()>,
    response_timeout: Duration,
    hub: Arc<WatchHub>,
    listener: tokio::sync::Mutex<Option<Listener>>,
    caps: ProbedCapabilities,
    display: String,
}

/// Leases in a PostgreSQL table, timed by the database clock.
///
/// Acquire, extend, release and inspect are one statement each, one round trip
/// on the wire. Clones share their connections and one LISTEN connection
/// (opened on the first wait). See the crate docs.
#[derive(Clone)]
pub struct PostgresProvider {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PostgresProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresProvider")
            .field("server", &self.inner.display)
            .field("namespace", &self.inner.namespace)
            .finish_non_exhaustive()
    }
}

/// How long the LISTEN connection may stay quiet before it is checked with a
/// query: a connection whose peer vanished without a reset would otherwise
/// miss every release until the process restarts.
const LISTEN_HEARTBEAT: Duration = Duration::from_secs(15);

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
        .with_fair_waiting(true);
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
                response_timeout: config.response_timeout,
                hub: Arc::default(),
                listener: tokio::sync::Mutex::new(None),
                caps: ProbedCapabilities::new(base),
                display,
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
        lease_api::backend::bounded(what, self.inner.response_timeout, f, |e| self.map_err(e)).await
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
        .await
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
        Ok(done.rows_affected() + waiters)
    }

    /// The servers, for connections of the modes built on this provider.
    pub(crate) fn hosts(&self) -> &Arc<Hosts> {
        &self.inner.hosts
    }

    /// The namespace (also through [`LeaseProvider::namespace`]).
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

    /// With several hosts, the first call waits for the probe, so the
    /// capabilities read after it carry the failover declaration. A probe
    /// that fails is tried again by the next call.
    async fn probe_first(&self) {
        if self.inner.hosts.is_multi() {
            let _ = self
                .inner
                .probed_first
                .get_or_try_init(|| async { self.probe().await.map(|_| ()) })
                .await;
        }
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

    /// Asks the server whether committed rows survive a crash (`fsync`,
    /// `synchronous_commit`) and returns the capabilities with that answer (also
    /// what [`capabilities`](LeaseProvider::capabilities) reports from then on).
    /// Happens by itself in the background on first use.
    ///
    /// # Errors
    /// `Unavailable` when the database cannot be reached.
    pub async fn probe(&self) -> Result<Capabilities> {
        if self.inner.hosts.is_multi() {
            // Find the primary before the pool is used: the first host
            // listed may be a standby.
            self.bounded(
                "finding the primary",
                self.inner.hosts.connect_primary(|o| o),
            )
            .await?;
        }
        let row = self
            .bounded(
                "the probe",
                sqlx::query(
                    "SELECT current_setting('fsync'), current_setting('synchronous_commit')",
                )
                .fetch_one(self.pool()?),
            )
            .await?;
        let fsync: String = row.try_get(0).unwrap_or_default();
        let sync_commit: String = row.try_get(1).unwrap_or_default();
        let durable_tokens = if fsync != "on" {
            TokenDurability::Volatile(format!(
                "fsync is {fsync}: a clean restart keeps tokens, a crash of the server can lose recent rows and reissue tokens"
            ))
        } else if sync_commit == "off" {
            TokenDurability::Volatile(
                "synchronous_commit is off: a crash can lose the last transactions and reissue tokens".into(),
            )
        } else {
            TokenDurability::Durable(
                "tokens are committed rows (fsync on, synchronous commit); released rows keep them"
                    .into(),
            )
        };
        if !self.inner.hosts.is_multi() {
            return Ok(self.inner.caps.record(durable_tokens));
        }
        let failover = self.probe_failover().await?;
        Ok(self.inner.caps.record_with(|c| {
            c.with_durable_tokens(durable_tokens)
                .with_failover(Some(failover))
        }))
    }

    /// With several hosts: whether the primary's commits wait for a standby
    /// (`synchronous_standby_names`, `synchronous_commit`, and a standby
    /// streaming as `sync` or `quorum` now), which decides what a promotion
    /// keeps.
    async fn probe_failover(&self) -> Result<Failover> {
        let row = self
            .bounded(
                "the replication probe",
                sqlx::query(
                    "SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit'), \
                     (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))",
                )
                .fetch_one(self.pool()?),
            )
            .await?;
        let names: String = row.try_get(0).unwrap_or_default();
        let commit: String = row.try_get(1).unwrap_or_default();
        let sync_standbys: i64 = row.try_get(2).unwrap_or_default();
        // The settings decide: with them every commit waits (blocks, if no
        // standby is there) until a synchronous standby has it. How many are
        // in sync right now is only reported.
        let synchronous = !names.trim().is_empty()
            && matches!(commit.as_str(), "on" | "remote_write" | "remote_apply");
        let tokens = if synchronous {
            FailoverTokens::Increasing(format!(
                "every commit, each token's among them, reaches a synchronous standby before it returns \
                 (synchronous_standby_names '{names}', synchronous_commit {commit}; {sync_standbys} in sync when probed)"
            ))
        } else {
            FailoverTokens::MayRepeat(format!(
                "the standbys are asynchronous (synchronous_standby_names '{names}', synchronous_commit {commit}, \
                 {sync_standbys} in sync): a promotion can lose the last commits, tokens and leases among them"
            ))
        };
        // Counted from the promotion (PostgreSQL has no failover agent of its
        // own: Patroni, repmgr or a managed service promotes a standby): one
        // statement fails on the old primary, and the next connects to each
        // host in turn until one answers as primary.
        let per_host = self.inner.hosts.connect_timeout();
        let hosts = u32::try_from(self.inner.hosts.len()).unwrap_or(u32::MAX);
        Ok(Failover::new(
            tokens,
            synchronous,
            self.inner.response_timeout * 2 + per_host.saturating_mul(hosts),
        ))
    }

    fn start_probe(&self) {
        if self.inner.caps.begin() {
            let this = self.clone();
            tokio::spawn(async move {
                if this.probe().await.is_err() {
                    this.inner.caps.failed();
                }
            });
        }
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

    async fn ensure_listener(&self) -> Result<()> {
        let mut slot = self.inner.listener.lock().await;
        if slot.as_ref().is_some_and(|l| !l.task.is_finished()) {
            return Ok(());
        }
        let channel = self.inner.sql.channel.clone();
        let pool = self.pool()?.clone();
        let limit = self.inner.response_timeout;
        let hosts = Arc::clone(&self.inner.hosts);
        let pool_host = Arc::clone(&self.inner.pool_host);
        let connect = move |pool: PgPool, channel: String| {
            let (hosts, pool_host) = (Arc::clone(&hosts), Arc::clone(&pool_host));
            async move {
                match tokio::time::timeout(limit + hosts.connect_timeout(), async {
                    if hosts.is_multi() {
                        // LISTEN is refused on a standby: find the primary first
                        // (after a promotion, nothing else may have yet).
                        drop(hosts.connect_primary(|o| o).await?);
                        point_pool(&pool, &hosts, &pool_host);
                    }
                    let mut l = PgListener::connect_with(&pool).await?;
                    l.listen(&channel).await?;
                    Ok::<_, sqlx::Error>(l)
                })
                .await
                {
                    Ok(r) => r.map_err(|e| e.to_string()),
                    Err(_) => Err(format!("no answer within {limit:?}")),
                }
            }
        };
        let first =
            connect(pool.clone(), channel.clone())
                .await
                .map_err(|e| LeaseError::Unavailable {
                    message: format!("LISTEN at PostgreSQL {} failed: {e}", self.inner.display),
                    source: None,
                })?;
        let hub = Arc::clone(&self.inner.hub);
        let task = tokio::spawn(async move {
            let mut listener = Some(first);
            let mut backoff = Duration::from_millis(50);
            loop {
                let Some(l) = listener.as_mut() else {
                    match connect(pool.clone(), channel.clone()).await {
                        Ok(l) => {
                            listener = Some(l);
                            backoff = Duration::from_millis(50);
                            // Releases while no LISTEN was active were not
                            // announced to us: every waiter looks again now.
                            hub.wake_all();
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "re-LISTEN failed; retrying");
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(Duration::from_secs(1));
                        }
                    }
                    continue;
                };
                let received = match tokio::time::timeout(LISTEN_HEARTBEAT, l.try_recv()).await {
                    Ok(r) => r,
                    // Quiet for a while: make sure the connection is alive (a
                    // peer that vanished without a reset would leave try_recv
                    // waiting forever, and every release unannounced).
                    Err(_) => {
                        let ping =
                            tokio::time::timeout(limit, sqlx::query("SELECT 1").execute(&mut *l));
                        match ping.await {
                            Ok(Ok(_)) => continue,
                            _ => Ok(None),
                        }
                    }
                };
                match received {
                    Ok(Some(n)) => hub.wake(n.payload()),
                    // The connection broke. Reconnect ourselves (not inside
                    // sqlx), so the wake-up comes after LISTEN is active again.
                    Ok(None) | Err(_) => {
                        listener = None;
                        hub.wake_all();
                    }
                }
            }
        });
        *slot = Some(Listener {
            task: AbortOnDropHandle::new(task),
        });
        Ok(())
    }
}

/// Points `pool` at the host that last answered as the primary, if it is
/// not there yet. Connections it already holds stay until they fail.
fn point_pool(pool: &PgPool, hosts: &Hosts, at: &std::sync::Mutex<Option<String>>) {
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

#[async_trait]
impl LeaseProvider for PostgresProvider {
    fn capabilities(&self) -> &Capabilities {
        self.inner.caps.get()
    }

    fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        self.ready().await?;
        let owner = OwnerId::random();
        let holder = lease_api::holder();
        let sent_at = Instant::now();
        let row = self
            .bounded("acquire", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query(&self.inner.sql.acquire)
                    .bind(&self.inner.namespace)
                    .bind(key.as_str())
                    .bind(owner.to_hex())
                    .bind(micros(ttl))
                    .bind(&*holder)
                    .fetch_optional(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        let Some(row) = row else {
            // A concurrent acquirer inserted the row after our snapshot and won.
            return Ok(TryAcquire::Held { remaining: None });
        };
        let decode = |e: sqlx::Error| self.map_err(e);
        let won: bool = row.try_get(0).map_err(decode)?;
        let token: i64 = row.try_get(1).map_err(decode)?;
        if won {
            let token = u64::try_from(token)
                .map_err(|_| LeaseError::protocol(format!("negative token {token}")))?;
            Ok(TryAcquire::Acquired(
                Lease::new(key.clone(), FencingToken(token), owner, ttl, sent_at)
                    .with_holder(holder),
            ))
        } else {
            let remaining: Option<i64> = row.try_get(2).map_err(decode)?;
            Ok(TryAcquire::Held {
                remaining: remaining.map(from_micros),
            })
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        self.ready().await?;
        let sent_at = Instant::now();
        let token = token_i64(lease.token())?;
        let done = self
            .bounded("extend", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query(&self.inner.sql.extend)
                    .bind(&self.inner.namespace)
                    .bind(lease.key().as_str())
                    .bind(lease.owner().to_hex())
                    .bind(token)
                    .bind(micros(ttl))
                    .execute(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        if done.rows_affected() == 1 {
            Ok(lease.renewed(ttl, sent_at))
        } else {
            Err(LeaseError::lost(lease))
        }
    }

    /// One `UPDATE ... FROM unnest(...)` for the whole batch, owner and
    /// token compared per row.
    async fn extend_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        let caps = self.capabilities();
        let ttls: Vec<Result<Duration>> = leases
            .iter()
            .map(|l| {
                let ttl = caps.grant_ttl(l.ttl())?;
                token_i64(l.token())?;
                Ok(ttl)
            })
            .collect();
        let sent: Vec<(&Lease, Duration)> = leases
            .iter()
            .zip(&ttls)
            .filter_map(|(l, t)| t.as_ref().ok().map(|t| (l, *t)))
            .collect();
        let mut extended = std::collections::HashSet::new();
        // Sent before the statement: every row's validity counts from here (C10).
        let sent_at = Instant::now();
        if !sent.is_empty() {
            self.ready().await?;
            let keys: Vec<&str> = sent.iter().map(|(l, _)| l.key().as_str()).collect();
            let owners: Vec<String> = sent.iter().map(|(l, _)| l.owner().to_hex()).collect();
            let tokens: Vec<i64> = sent
                .iter()
                .map(|(l, _)| i64::try_from(l.token().get()).unwrap_or(-1))
                .collect();
            let ttl_micros: Vec<i64> = sent.iter().map(|(_, t)| micros(*t)).collect();
            let rows = self
                .bounded("extend", async {
                    let mut c = self.inner.conns.checkout().await?;
                    let r = sqlx::query(&self.inner.sql.extend_many)
                        .bind(&self.inner.namespace)
                        .bind(&keys)
                        .bind(&owners)
                        .bind(&tokens)
                        .bind(&ttl_micros)
                        .fetch_all(c.conn())
                        .await;
                    c.done(&r);
                    r
                })
                .await?;
            for row in rows {
                let decode = |e: sqlx::Error| self.map_err(e);
                let key: String = row.try_get(0).map_err(decode)?;
                let token: i64 = row.try_get(1).map_err(decode)?;
                extended.insert((key, token));
            }
        }
        Ok(leases
            .iter()
            .zip(ttls)
            .map(|(lease, ttl)| {
                let ttl = ttl?;
                let token = i64::try_from(lease.token().get()).unwrap_or(-1);
                if extended.contains(&(lease.key().as_str().to_owned(), token)) {
                    Ok(lease.renewed(ttl, sent_at))
                } else {
                    Err(LeaseError::lost(lease))
                }
            })
            .collect())
    }

    fn batch_limit(&self) -> usize {
        1000
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.ready().await?;
        let token = token_i64(lease.token())?;
        let released = self
            .bounded("release", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query(&self.inner.sql.release)
                    .bind(&self.inner.namespace)
                    .bind(lease.key().as_str())
                    .bind(lease.owner().to_hex())
                    .bind(token)
                    .bind(&self.inner.sql.channel)
                    .bind(payload(&self.inner.namespace, lease.key().as_str()))
                    .fetch_optional(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        match released {
            Some(_) => Ok(()),
            None => Err(LeaseError::not_held(lease)),
        }
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        // Reading never creates or alters the table (`lease status` runs no
        // DDL): a table or schema that does not exist holds no lease.
        in_runtime()?;
        self.probe_first().await;
        self.start_probe();
        let answer = async {
            let mut c = self.inner.conns.checkout().await?;
            let r = sqlx::query(&self.inner.sql.inspect)
                .bind(&self.inner.namespace)
                .bind(key.as_str())
                .fetch_optional(c.conn())
                .await;
            c.done(&r);
            match r {
                Err(sqlx::Error::Database(e))
                    if matches!(e.code().as_deref(), Some("42P01" | "3F000")) =>
                {
                    Ok(None)
                }
                r => r,
            }
        };
        let row = self.bounded("inspect", answer).await?;
        row.map(|r| self.lease_info(&r)).transpose()
    }

    fn wait_queue(&self) -> Option<&dyn WaitQueue> {
        self.capabilities()
            .fair_waiting
            .then_some(self as &dyn WaitQueue)
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        // Registered before the listener is checked: a listener that dies in
        // between wakes this watch too.
        let watch = self
            .inner
            .hub
            .watch(&payload(&self.inner.namespace, key.as_str()));
        self.ensure_listener().await?;
        Ok(Box::new(watch))
    }
}

/// Fair waiting on a table beside the lease table (`<table>_waiters`): a
/// row per waiter, ordered by an identity column, with a deadline on the
/// database clock. Leaving sends a NOTIFY only the waiter behind listens
/// for; a dead waiter's row is skipped, and dropped, once its deadline
/// passed.
#[async_trait]
impl WaitQueue for PostgresProvider {
    async fn join(&self, key: &LeaseKey, ttl: Duration, mark: u64) -> Result<Ticket> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        self.ready().await?;
        let seq: i64 = self
            .bounded("joining the queue", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query_scalar(&self.inner.sql.waiters.join)
                    .bind(&self.inner.namespace)
                    .bind(key.as_str())
                    .bind(micros(ttl))
                    .bind(mark_i64(mark))
                    .fetch_one(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        let seq = u64::try_from(seq)
            .map_err(|_| LeaseError::protocol(format!("negative waiter number {seq}")))?;
        Ok(Ticket::new(key.clone(), seq, mark))
    }

    async fn place(&self, ticket: &Ticket) -> Result<Place> {
        self.ready().await?;
        let seq = seq_i64(ticket)?;
        let row = self
            .bounded("the queue", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query(&self.inner.sql.waiters.place)
                    .bind(&self.inner.namespace)
                    .bind(ticket.key().as_str())
                    .bind(seq)
                    .bind(mark_i64(ticket.mark()))
                    .fetch_one(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        let decode = |e: sqlx::Error| self.map_err(e);
        let own: bool = row.try_get(0).map_err(decode)?;
        let ahead: Option<i64> = row.try_get(1).map_err(decode)?;
        let remaining: Option<i64> = row.try_get(2).map_err(decode)?;
        let ahead_mark: Option<i64> = row.try_get(3).map_err(decode)?;
        Ok(match (own, ahead) {
            (false, _) => Place::Gone,
            (true, None) => Place::First,
            (true, Some(ahead)) => Place::Behind {
                ahead: Ticket::new(
                    ticket.key().clone(),
                    u64::try_from(ahead).unwrap_or(0),
                    u64::from_ne_bytes(ahead_mark.unwrap_or(0).to_ne_bytes()),
                ),
                remaining: Some(from_micros(remaining.unwrap_or(0))),
            },
        })
    }

    async fn watch_ticket(&self, ahead: &Ticket) -> Result<Box<dyn KeyWatch>> {
        // Registered and listening first, then looked at: a leave before the
        // look shows as a missing row, one after it as a notification.
        let watch = self.inner.hub.watch(&ticket_payload(
            &self.inner.namespace,
            ahead.key().as_str(),
            ahead.seq(),
        ));
        self.ensure_listener().await?;
        let seq = seq_i64(ahead)?;
        let live: bool = self
            .bounded("the queue", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query_scalar(&self.inner.sql.waiters.live)
                    .bind(&self.inner.namespace)
                    .bind(ahead.key().as_str())
                    .bind(seq)
                    .bind(mark_i64(ahead.mark()))
                    .fetch_one(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        if live {
            Ok(Box::new(watch))
        } else {
            Ok(Box::new(lease_api::backend::ReadyWatch))
        }
    }

    async fn refresh(&self, ticket: &Ticket, ttl: Duration) -> Result<bool> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        let seq = seq_i64(ticket)?;
        let done = self
            .bounded("refreshing a waiter", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query(&self.inner.sql.waiters.refresh)
                    .bind(&self.inner.namespace)
                    .bind(ticket.key().as_str())
                    .bind(seq)
                    .bind(mark_i64(ticket.mark()))
                    .bind(micros(ttl))
                    .execute(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn leave(&self, ticket: &Ticket) -> Result<()> {
        let seq = seq_i64(ticket)?;
        self.bounded("leaving the queue", async {
            let mut c = self.inner.conns.checkout().await?;
            let r = sqlx::query(&self.inner.sql.waiters.leave)
                .bind(&self.inner.namespace)
                .bind(ticket.key().as_str())
                .bind(seq)
                .bind(mark_i64(ticket.mark()))
                .bind(&self.inner.sql.channel)
                .bind(ticket_payload(
                    &self.inner.namespace,
                    ticket.key().as_str(),
                    ticket.seq(),
                ))
                .execute(c.conn())
                .await;
            c.done(&r);
            r
        })
        .await?;
        Ok(())
    }
}

/// A ticket's mark as PostgreSQL's `bigint` (the same 64 bits).
fn mark_i64(mark: u64) -> i64 {
    i64::from_ne_bytes(mark.to_ne_bytes())
}

fn seq_i64(ticket: &Ticket) -> Result<i64> {
    i64::try_from(ticket.seq())
        .map_err(|_| LeaseError::protocol(format!("waiter number {} out of range", ticket.seq())))
}

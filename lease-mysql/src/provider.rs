//! `MysqlProvider`: the struct, its connections and pool, the migration, the
//! probe and the helpers every operation uses.

use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lease_api::backend::{DEFAULT_MAX_TTL, MultiKey, ProbedCapabilities, validate_namespace};
use lease_api::{
    Capabilities, ExpiryClock, Failover, FailoverTokens, FencingToken, Lease, LeaseError,
    Notifications, Result, TokenDurability,
};
use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{Row, Transaction};
use tokio::sync::OnceCell;

use crate::config::MysqlConfig;
use crate::conns::{Conns, PING_IF_IDLE_FOR, session_setup};
pub(crate) use crate::error::error_number;
use crate::error::{is_denied, is_unavailable};
use crate::hosts::{Hosts, split_hosts};
use crate::sql::{Statements, validate_identifier};

pub(crate) struct Inner {
    /// Made on first use: the pool spawns tasks, so it needs a runtime.
    pub(crate) pool: OnceLock<MySqlPool>,
    /// The connections acquire, extend, release and inspect run on.
    pub(crate) conns: Conns,
    pub(crate) connect_options: MySqlConnectOptions,
    /// The server, or the nodes of which the one that answered last is used.
    pub(crate) hosts: Arc<Hosts>,
    /// `host:port` the pool connects to now (several hosts).
    pub(crate) pool_host: std::sync::Mutex<Option<String>>,
    pub(crate) pool_options: MySqlPoolOptions,
    pub(crate) sql: Statements,
    pub(crate) namespace: String,
    pub(crate) create_table: bool,
    pub(crate) migrated: OnceCell<()>,
    pub(crate) response_timeout: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) caps: ProbedCapabilities,
    pub(crate) display: String,
    /// Whether the server runs Galera, asked once.
    pub(crate) galera: OnceCell<bool>,
    /// Cancels of acquires that had no answer (`orphans.rs`).
    pub(crate) cleanups: tokio_util::task::TaskTracker,
    /// Their turns: [`CANCELS_AT_ONCE`] run at once.
    pub(crate) cancel_turns: tokio::sync::Semaphore,
}

/// Cancels of one provider running at once; the rest wait their turn, so a
/// store that stalls many acquires is not also flooded with their cancels.
const CANCELS_AT_ONCE: usize = 4;

/// Leases in a MySQL or MariaDB table, timed by the database clock.
///
/// Acquire, extend, release and inspect are one statement each, one round
/// trip on the wire. Clones share their connections. See the crate docs.
#[derive(Clone)]
pub struct MysqlProvider {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for MysqlProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlProvider")
            .field("server", &self.inner.display)
            .field("namespace", &self.inner.namespace)
            .finish_non_exhaustive()
    }
}

/// The URL as sqlx reads it: `mariadb://` is `mysql://`.
fn sqlx_url(url: &str) -> Result<String> {
    if let Some(rest) = url.strip_prefix("mariadb://") {
        Ok(format!("mysql://{rest}"))
    } else if url.starts_with("mysql://") {
        Ok(url.to_owned())
    } else {
        Err(LeaseError::Config(
            "a MySQL URL starts with mysql:// or mariadb://".into(),
        ))
    }
}

impl MysqlProvider {
    /// Sets up a provider. Connections are made on first use, so this does
    /// not fail when the database is down; operations then return
    /// `Unavailable`.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for a malformed URL, namespace or table name.
    pub fn new(config: MysqlConfig) -> Result<Self> {
        let base = Capabilities::new(
            "mysql",
            ExpiryClock::StoreServer,
            Notifications::Polled(config.poll_interval),
        )
        // DATETIME(6): microseconds; a TTL under 10 ms is a unit mistake.
        .with_ttl_limits(Duration::from_millis(10), DEFAULT_MAX_TTL)
        .with_expiry_slack(Duration::from_millis(5))
        .with_multi_key(MultiKey::in_key_order());
        Self::with_capabilities(config, base)
    }

    /// A provider declaring `base` until the probe adds token durability:
    /// for the modes built on this one, such as
    /// [`AdvisoryProvider`](crate::AdvisoryProvider).
    pub(crate) fn with_capabilities(config: MysqlConfig, base: Capabilities) -> Result<Self> {
        validate_namespace(&config.namespace)?;
        validate_identifier("table", &config.table)?;
        let url = sqlx_url(&config.url)?;
        // rustls needs its crypto provider chosen once per process (ssl-mode).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut per_host = Vec::new();
        for one in split_hosts(&url)? {
            let options = MySqlConnectOptions::from_str(&one).map_err(|e| {
                // sqlx's message may quote the URL, password and all: say only what is wrong.
                let what = match e {
                    sqlx::Error::Configuration(c) => c.to_string().replace(&one, "<url>"),
                    _ => "unreadable".into(),
                };
                LeaseError::Config(format!("the MySQL URL is not valid: {what}"))
            })?;
            if options.get_database().is_none_or(str::is_empty) {
                return Err(LeaseError::Config(
                    "the MySQL URL must name a database: mysql://user@host:3306/database".into(),
                ));
            }
            per_host.push(options.statement_cache_capacity(32));
        }
        let options = per_host[0].clone();
        let hosts = Arc::new(Hosts::new(
            per_host,
            config.connect_timeout,
            config.response_timeout,
        ));
        let display = format!("mysql://{}", hosts.display());
        let setup = session_setup(config.response_timeout);
        let multi = hosts.is_multi();
        let pool_options = MySqlPoolOptions::new()
            .max_connections(config.max_connections)
            .min_connections(0)
            .acquire_timeout(config.connect_timeout)
            .test_before_acquire(false)
            .after_connect(move |conn, _| {
                let setup = setup.clone();
                Box::pin(async move {
                    sqlx::query(&setup).execute(&mut *conn).await?;
                    // The pool's host may be a node outside the primary
                    // component: refuse it.
                    if multi
                        && !matches!(
                            crate::hosts::galera_state(conn).await?,
                            crate::hosts::Galera::Ready
                        )
                    {
                        return Err(sqlx::Error::Protocol(
                            "the node is not a ready Galera node".into(),
                        ));
                    }
                    Ok(())
                })
            })
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IF_IDLE_FOR {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            });
        let base = base.with_durable_tokens(TokenDurability::Unknown(
            "not yet probed: tokens are InnoDB rows, durable when innodb_flush_log_at_trx_commit is 1"
                .into(),
        ));
        Ok(MysqlProvider {
            inner: Arc::new(Inner {
                pool: OnceLock::new(),
                conns: Conns::new(
                    Arc::clone(&hosts),
                    config.max_connections,
                    config.response_timeout,
                ),
                hosts,
                pool_host: std::sync::Mutex::new(None),
                connect_options: options,
                pool_options,
                sql: Statements::new(&config.table),
                namespace: config.namespace,
                create_table: config.create_table,
                migrated: OnceCell::new(),
                response_timeout: config.response_timeout,
                poll_interval: config.poll_interval,
                caps: ProbedCapabilities::new(base),
                display,
                galera: OnceCell::new(),
                cleanups: tokio_util::task::TaskTracker::new(),
                cancel_turns: tokio::sync::Semaphore::new(CANCELS_AT_ONCE),
            }),
        })
    }

    /// A provider for `url` with defaults for everything else.
    ///
    /// # Errors
    /// As [`MysqlProvider::new`].
    pub fn from_url(url: &str) -> Result<Self> {
        Self::new(MysqlConfig::new(url))
    }

    /// The pool, to run your own statements (for example inside
    /// [`begin_fenced`](Self::begin_fenced)'s transaction). Made on first use.
    ///
    /// # Errors
    /// [`LeaseError::Config`] when called outside a tokio runtime.
    pub fn pool(&self) -> Result<&MySqlPool> {
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
            // Points the pool at the host the lease statements use now, if
            // it is not there yet; connections it holds stay until they fail.
            let options = self.inner.hosts.current();
            let host = format!("{}:{}", options.get_host(), options.get_port());
            let mut at = self
                .inner
                .pool_host
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if at.as_deref() != Some(host.as_str()) {
                pool.set_connect_options(options);
                *at = Some(host);
            }
        }
        Ok(pool)
    }

    /// Whether the server is a Galera node (`wsrep_on`), asked once.
    pub(crate) async fn is_galera(&self) -> Result<bool> {
        self.inner
            .galera
            .get_or_try_init(|| async {
                let on: Option<(String, String)> = self
                    .bounded(
                        "the Galera probe",
                        sqlx::query_as("SHOW VARIABLES LIKE 'wsrep_on'")
                            .fetch_optional(self.pool()?),
                    )
                    .await?;
                Ok::<_, LeaseError>(on.is_some_and(|(_, v)| v.eq_ignore_ascii_case("ON")))
            })
            .await
            .copied()
    }

    /// The URL's database.
    pub(crate) fn database(&self) -> &str {
        self.inner
            .connect_options
            .get_database()
            .unwrap_or_default()
    }

    /// A new connection with the session settings, outside the slots: for
    /// the sessions of the advisory mode.
    pub(crate) async fn connect_session(&self) -> Result<sqlx::MySqlConnection, sqlx::Error> {
        self.inner.conns.connect().await
    }

    /// How long a statement may take.
    pub(crate) fn response_timeout(&self) -> Duration {
        self.inner.response_timeout
    }

    pub(crate) fn map_err(&self, e: sqlx::Error) -> LeaseError {
        let server = &self.inner.display;
        if let sqlx::Error::Configuration(c) = &e {
            return LeaseError::Config(format!("MySQL at {server}: {c}"));
        }
        if is_denied(&e) {
            LeaseError::denied(
                format!(
                    "MySQL at {server} refused our credentials, certificate check or permissions"
                ),
                e,
            )
        } else if matches!(error_number(&e), Some(1205 | 1213)) {
            LeaseError::unavailable(
                format!(
                    "MySQL at {server} rolled the statement back (a deadlock, a lock wait timeout or a Galera certification conflict); nothing changed"
                ),
                e,
            )
        } else if is_unavailable(&e) {
            LeaseError::unavailable(format!("MySQL at {server} is unreachable"), e)
        } else {
            LeaseError::backend(format!("MySQL at {server} answered with an error"), e)
        }
    }

    pub(crate) async fn bounded<T>(
        &self,
        what: &'static str,
        f: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T> {
        lease_api::backend::bounded(what, self.inner.response_timeout, f, |e| self.map_err(e)).await
    }

    /// Creates the lease table if it does not exist, and checks that the
    /// session is in strict mode (a value that does not fit is an error, not
    /// silently cut). Safe to run from many processes at once.
    ///
    /// # Errors
    /// `Unavailable` when the database is down; `Denied` without the
    /// privilege; `Config` when strict mode cannot be set.
    pub async fn migrate(&self) -> Result<()> {
        let create = &self.inner.sql.create_table;
        let table = &self.inner.sql.table;
        let mode: String = self
            .bounded("the migration", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = async {
                    // Only when missing: on Galera, DDL runs in total order
                    // on every node and aborts the transactions on the
                    // table there, even when the table exists.
                    let exists: Option<i64> = sqlx::query_scalar(
                        "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
                    )
                    .bind(table)
                    .fetch_optional(c.conn())
                    .await?;
                    if exists.is_none() {
                        sqlx::query(create).execute(c.conn()).await?;
                    }
                    sqlx::query_scalar("SELECT @@SESSION.sql_mode")
                        .fetch_one(c.conn())
                        .await
                }
                .await;
                c.done(&r);
                r
            })
            .await?;
        if !mode.split(',').any(|m| m.starts_with("STRICT_")) {
            return Err(LeaseError::Config(format!(
                "MySQL at {} runs our sessions with sql_mode {mode:?}, not strict: a key or token that does not fit would be cut silently",
                self.inner.display
            )));
        }
        Ok(())
    }

    /// Deletes the rows of every namespace whose name starts with `prefix`,
    /// whoever holds them, and returns how many went. Tokens of those keys
    /// start again afterwards: only for namespaces nobody uses any more.
    ///
    /// # Errors
    /// `Config` for an empty prefix; `Unavailable` when the database is down.
    pub async fn purge_namespaces(&self, prefix: &str) -> Result<u64> {
        lease_api::backend::validate_purge_prefix(prefix)?;
        let done = self
            .bounded(
                "purge",
                sqlx::query(&self.inner.sql.purge)
                    .bind(prefix.as_bytes())
                    .bind(prefix.as_bytes())
                    .execute(self.pool()?),
            )
            .await;
        match done {
            Ok(d) => Ok(d.rows_affected()),
            // No table: nothing to purge.
            Err(LeaseError::Backend { .. }) => Ok(0),
            Err(e) => Err(e),
        }
    }

    pub(crate) async fn ready(&self) -> Result<()> {
        in_runtime()?;
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

    /// Asks the server whether a commit survives a crash
    /// (`innodb_flush_log_at_trx_commit`) and returns the capabilities with
    /// that answer. Happens by itself in the background on first use.
    ///
    /// # Errors
    /// `Unavailable` when the database cannot be reached.
    pub async fn probe(&self) -> Result<Capabilities> {
        let row = self
            .bounded(
                "the probe",
                sqlx::query("SELECT VERSION(), @@GLOBAL.innodb_flush_log_at_trx_commit")
                    .fetch_one(self.pool()?),
            )
            .await?;
        let version: String = row.try_get(0).unwrap_or_default();
        let flush: i64 = row
            .try_get::<u64, _>(1)
            .map(|v| i64::try_from(v).unwrap_or(-1))
            .or_else(|_| row.try_get::<i64, _>(1))
            .unwrap_or(-1);
        let durable = if flush == 1 {
            TokenDurability::Durable(format!(
                "tokens are InnoDB rows, flushed to disk at every commit (innodb_flush_log_at_trx_commit 1, {version}); released rows keep them"
            ))
        } else {
            TokenDurability::Volatile(format!(
                "innodb_flush_log_at_trx_commit is {flush} ({version}): a crash can lose the last second of commits and reissue tokens"
            ))
        };
        let galera = self.probe_galera().await?;
        Ok(self
            .inner
            .caps
            .record_with(|c| c.with_durable_tokens(durable).with_failover(galera)))
    }

    /// On a Galera node: what the loss of the node the provider uses keeps.
    /// `None` for a single server (a failover there is a restart).
    async fn probe_galera(&self) -> Result<Option<Failover>> {
        let status: Vec<(String, String)> = self
            .bounded(
                "the Galera probe",
                sqlx::query_as(
                    "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_cluster_size', 'wsrep_cluster_status')",
                )
                .fetch_all(self.pool()?),
            )
            .await?;
        let get = |name: &str| {
            status
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        let wsrep: Vec<(String, String)> = self
            .bounded(
                "the Galera probe",
                sqlx::query_as("SHOW VARIABLES LIKE 'wsrep_on'").fetch_all(self.pool()?),
            )
            .await?;
        if !wsrep.iter().any(|(_, v)| v.eq_ignore_ascii_case("ON")) {
            return Ok(None);
        }
        let options: Vec<(String, String)> = self
            .bounded(
                "the Galera probe",
                sqlx::query_as("SHOW VARIABLES LIKE 'wsrep_provider_options'")
                    .fetch_all(self.pool()?),
            )
            .await?;
        // How long the surviving nodes take to agree that a node is gone
        // (Galera's default is 5 s); commits wait meanwhile.
        let suspect = options
            .first()
            .and_then(|(_, v)| provider_option(v, "evs.suspect_timeout"))
            .and_then(iso_duration)
            .unwrap_or(Duration::from_secs(5));
        let size = get("wsrep_cluster_size").unwrap_or_default();
        let status = get("wsrep_cluster_status").unwrap_or_default();
        // A commit returns only once every node has certified its write set:
        // whichever node the provider moves to orders it after every token
        // handed out before, and a write that conflicts with one still being
        // applied there is aborted (a deadlock error), never committed twice.
        let tokens = FailoverTokens::Increasing(format!(
            "Galera certifies every commit on all nodes before it returns (cluster of {size}, {status} when probed)"
        ));
        let hosts = u32::try_from(self.inner.hosts.len()).unwrap_or(u32::MAX);
        Ok(Some(Failover::new(
            tokens,
            true,
            suspect
                .saturating_add(self.inner.response_timeout.saturating_mul(2))
                .saturating_add(self.inner.hosts.connect_timeout().saturating_mul(hosts)),
        )))
    }

    pub(crate) fn start_probe(&self) {
        if self.inner.caps.begin() {
            let this = self.clone();
            tokio::spawn(async move {
                if this.probe().await.is_err() {
                    this.inner.caps.failed();
                }
            });
        }
    }

    /// Begins a transaction that holds the lease row `LOCK IN SHARE MODE`
    /// (`FOR SHARE`) after checking that `lease` (owner, token) is still held
    /// and not expired on the database clock. Run the protected writes in it
    /// and commit: they commit only while the lease is held, because a
    /// takeover must update that row and waits for this transaction to end.
    /// Keep it short: renewals of the same lease wait too.
    ///
    /// ```no_run
    /// # async fn demo(provider: lease_mysql::MysqlProvider, lease: lease_api::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = provider.begin_fenced(&lease).await?;
    /// sqlx::query("UPDATE ledger SET settled = 1 WHERE batch = ?")
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
    pub async fn begin_fenced(&self, lease: &Lease) -> Result<Transaction<'static, MySql>> {
        self.ready().await?;
        if self.is_galera().await? {
            // Row locks are local to a node and not certified: a takeover
            // through another node would not wait for this transaction.
            return Err(LeaseError::Config(
                "begin_fenced needs a single MySQL/MariaDB server: on Galera a row lock does not hold off a takeover through another node; fence the write with the lease's token instead".into(),
            ));
        }
        let mut tx = self.bounded("BEGIN", self.pool()?.begin()).await?;
        let held = self
            .bounded(
                "the fence check",
                sqlx::query(&self.inner.sql.fence)
                    .bind(self.inner.namespace.as_bytes())
                    .bind(lease.key().as_str().as_bytes())
                    .bind(lease.owner().to_hex())
                    .bind(lease.token().get())
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

/// Connections and the background tasks need a tokio runtime: say so
/// instead of panicking inside tokio.
pub(crate) fn in_runtime() -> Result<()> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(LeaseError::Config(
            "MysqlProvider must be used inside a tokio runtime".into(),
        ));
    }
    Ok(())
}

/// One option's value in Galera's `wsrep_provider_options`
/// (`name = value; name = value; ...`).
fn provider_option<'a>(options: &'a str, name: &str) -> Option<&'a str> {
    options.split(';').find_map(|pair| {
        let (n, v) = pair.split_once('=')?;
        (n.trim() == name).then(|| v.trim())
    })
}

/// An ISO 8601 time duration as Galera writes them: `PT3S`, `PT1.5S`,
/// `PT1M30S`, `PT1H`.
fn iso_duration(text: &str) -> Option<Duration> {
    let mut rest = text.strip_prefix("PT")?;
    let mut secs = 0.0;
    while !rest.is_empty() {
        let end = rest.find(|c: char| c.is_ascii_alphabetic())?;
        let n: f64 = rest[..end].parse().ok()?;
        secs += n * match &rest[end..=end] {
            "H" => 3600.0,
            "M" => 60.0,
            "S" => 1.0,
            _ => return None,
        };
        rest = &rest[end + 1..];
    }
    Duration::try_from_secs_f64(secs).ok()
}

pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

pub(crate) fn from_micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

pub(crate) fn token(t: u64) -> FencingToken {
    FencingToken(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn galera_timeouts_are_read() {
        let options =
            "base_port = 4567; evs.suspect_timeout = PT3S; evs.inactive_timeout = PT1M30S";
        let get = |n| provider_option(options, n).and_then(iso_duration);
        assert_eq!(get("evs.suspect_timeout"), Some(Duration::from_secs(3)));
        assert_eq!(get("evs.inactive_timeout"), Some(Duration::from_secs(90)));
        assert_eq!(get("base_port"), None);
        assert_eq!(iso_duration("PT1.5S"), Some(Duration::from_millis(1500)));
        assert_eq!(iso_duration("PT1H"), Some(Duration::from_secs(3600)));
        assert_eq!(iso_duration("P1D"), None);
    }
}

//! Leases as MySQL/MariaDB named locks (`GET_LOCK`), each on a session of
//! its own: the provider, its sessions and the bookkeeping of held leases.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_api::backend::{DEFAULT_MAX_TTL, OwnerId};
use lease_api::{
    Capabilities, ExpiryClock, Lease, LeaseError, LeaseKey, LeaseProvider, Notifications, Result,
};
use sqlx::mysql::{MySql, MySqlConnection};
use sqlx::{Connection, Transaction};
use tokio::time::Instant;

use crate::{MysqlConfig, MysqlProvider};

mod ops;
mod sql;
mod watch;

use sql::AdvisorySql;

/// The table an advisory provider keeps its tokens in unless told otherwise.
pub const ADVISORY_TABLE: &str = "lease_advisory";

/// How many unlocked sessions a provider keeps open for the next acquire.
const IDLE_SESSIONS: usize = 8;

/// An idle session unused this long is checked before it takes a lock.
const CHECK_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// The shortest `wait_timeout` (seconds) a session may have to be kept idle
/// for the next acquire: well above [`CHECK_IF_IDLE_FOR`].
const PARK_MIN_WAIT_SECS: u64 = 5;

/// The UUID namespace lock names are derived in (SHA-1, RFC 9562 version 5).
const LOCK_NAME_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x6c65_6173_652d_6d79_7371_6c2d_6c6f_636b);

/// Leases held as MySQL/MariaDB named locks (`GET_LOCK`).
///
/// Each held lease has a database session of its own, pinned to it until
/// release, and the lock lives as long as that session. The TTL runs on the
/// **database** clock: the session's `wait_timeout` is the lease's TTL (in
/// whole seconds), so a holder that stops renewing (frozen, partitioned, or
/// a lease dropped) has its session closed by the server when the TTL runs
/// out, which frees the lock. An extend is a statement on that session,
/// which restarts the server's idle timer.
///
/// What it adds over plain `GET_LOCK`:
/// - **Fencing tokens**: each acquisition increments a per-key counter row
///   in the same statement that takes the lock (`INSERT .. SELECT .. WHERE
///   GET_LOCK(..) = 1`), so tokens grow as on every other backend, and
///   [`begin_fenced`](Self::begin_fenced) works on the token row.
/// - **A lost signal**: a renewal on a session that ended is `Lost`.
/// - **Waiting in the lock's queue**: a waiter's session asks for the lock
///   itself (blocking, up to its wait) and hands it straight back, so it
///   wakes when the holder releases and when the holder's session ends for
///   any other reason; the handoff costs what `GET_LOCK` costs.
///
/// **Lock names**: MySQL limits a name to 64 characters, and MySQL 8
/// compares names case-insensitively (MariaDB does not). A key's name is
/// `lease:` and 32 hex digits of SHA-1 over the database, table, namespace
/// and key, length-prefixed ([`lock_name`](Self::lock_name)): any key up to
/// 512 bytes fits, and `a`, `A`, `a ` and `á` are different locks on both
/// servers. Two keys share a name only if SHA-1's 122 kept bits collide.
///
/// **The session is the lease**, as with PostgreSQL's advisory mode: a
/// holder whose process dies frees the key at once, but the server can also
/// end a session its holder still uses (a restart, `KILL`, a firewall that
/// resets the connection), and the holder learns it only at its next
/// renewal. So the capabilities declare `holder_session: Some(0)`. Fence
/// the resource with the token, or write through `begin_fenced`.
///
/// Not for Galera: named locks are local to one node, so two clients on
/// two nodes could both hold a key; the provider refuses a server with
/// `wsrep_on`. Costs: one database session per held lease
/// (`max_connections` bounds how many leases a server holds at once), TTLs
/// in whole seconds.
///
/// ```no_run
/// # async fn demo() -> lease_api::Result<()> {
/// use std::time::Duration;
/// use lease_api::{LeaseKey, LeaseProvider};
/// use lease_mysql::{AdvisoryProvider, MysqlConfig};
///
/// let provider = AdvisoryProvider::new(MysqlConfig::new("mysql://app@127.0.0.1/app"))?;
/// let key = LeaseKey::new("report/2026-12")?;
/// if let Some(lease) = provider.try_acquire(&key, Duration::from_secs(30)).await?.into_lease() {
///     println!("locked {key} as {}, token {}", provider.lock_name(&key), lease.token());
///     provider.release(&lease).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct AdvisoryProvider {
    inner: Arc<Inner>,
}

struct Inner {
    /// The table mode's provider on the token table: its migration, probe,
    /// pool, connection settings and error mapping.
    base: MysqlProvider,
    sql: AdvisorySql,
    /// Held leases by (key, token): the owner and the pinned session.
    held: Mutex<HashMap<(String, u64), Held>>,
    /// Unlocked sessions for the next acquire, with their `wait_timeout`.
    idle: Mutex<Vec<(Session, Instant)>>,
    /// Acquire attempts in flight, at most `max_connections`.
    attempts: tokio::sync::Semaphore,
    table_id: String,
}

/// A session and the `wait_timeout` (seconds) it was last given.
pub(super) struct Session {
    conn: MySqlConnection,
    wait_timeout: u64,
}

/// A held lease's owner and session.
type Held = (OwnerId, Arc<Pinned>);

/// A held lease's session. `conn` is `None` once the session was closed.
struct Pinned {
    conn: tokio::sync::Mutex<Option<Session>>,
    /// Local validity: sent + granted TTL of the last acquire or extend.
    valid_until: Mutex<Instant>,
}

impl Pinned {
    fn valid_until(&self) -> Instant {
        *lock(&self.valid_until)
    }
}

impl std::fmt::Debug for AdvisoryProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdvisoryProvider")
            .field("provider", &self.inner.base)
            .finish_non_exhaustive()
    }
}

impl AdvisoryProvider {
    /// Sets up a provider; nothing connects until first use. The token
    /// table is `config`'s table, except that the table mode's default
    /// (`lease_leases`) becomes [`ADVISORY_TABLE`]: never point a table-mode
    /// provider and an advisory one at the same table, since they keep keys
    /// out by different means.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for a malformed URL, namespace or table.
    pub fn new(mut config: MysqlConfig) -> Result<Self> {
        if config.table == "lease_leases" {
            config.table = ADVISORY_TABLE.into();
        }
        let caps = Capabilities::new(
            "mysql-advisory",
            ExpiryClock::StoreServer,
            Notifications::Native("the named lock's wait queue (GET_LOCK)"),
        )
        // wait_timeout counts whole seconds, and the server notices an idle
        // session's timeout when its read times out.
        .with_ttl_limits(Duration::from_secs(1), DEFAULT_MAX_TTL)
        .with_ttl_granularity(Duration::from_secs(1))
        .with_expiry_slack(Duration::from_millis(500))
        .with_holder_session(Some(Duration::ZERO));
        let attempts = usize::try_from(config.max_connections.max(1)).unwrap_or(1);
        let table_id = config.table.clone();
        let base = MysqlProvider::with_capabilities(config, caps)?;
        let sql = AdvisorySql::new(&table_id);
        let table_id = format!("{}.{table_id}", base.database());
        Ok(AdvisoryProvider {
            inner: Arc::new(Inner {
                base,
                sql,
                held: Mutex::default(),
                idle: Mutex::default(),
                attempts: tokio::sync::Semaphore::new(attempts),
                table_id,
            }),
        })
    }

    /// A provider for `url` with defaults for everything else.
    ///
    /// # Errors
    /// As [`AdvisoryProvider::new`].
    pub fn from_url(url: &str) -> Result<Self> {
        Self::new(MysqlConfig::new(url))
    }

    /// The named lock of `key` in this provider's database, table and
    /// namespace: what `performance_schema.metadata_locks` (MySQL) or
    /// `information_schema.METADATA_LOCK_INFO` (MariaDB) shows, for finding
    /// the session that holds it.
    pub fn lock_name(&self, key: &LeaseKey) -> String {
        let mut name = Vec::with_capacity(self.inner.table_id.len() + key.as_str().len() + 64);
        for part in [
            self.inner.table_id.as_str(),
            self.inner.base.namespace(),
            key.as_str(),
        ] {
            // Length-prefixed, so no two (namespace, key) pairs spell the same bytes.
            name.extend_from_slice(&(part.len() as u64).to_be_bytes());
            name.extend_from_slice(part.as_bytes());
        }
        format!(
            "lease:{}",
            uuid::Uuid::new_v5(&LOCK_NAME_NAMESPACE, &name).simple()
        )
    }

    /// Creates the token table if missing; see [`MysqlProvider::migrate`].
    ///
    /// # Errors
    /// `Unavailable` when the database is down; `Denied` without the privilege.
    pub async fn migrate(&self) -> Result<()> {
        self.inner.base.migrate().await
    }

    /// Begins a transaction that commits only while `lease` is still the
    /// key's latest acquisition: it holds the token row, which a later
    /// acquire must update, so a write in it can never land after a newer
    /// holder got its token.
    ///
    /// # Errors
    /// `Lost` when a newer acquisition exists or the lease was released.
    pub async fn begin_fenced(&self, lease: &Lease) -> Result<Transaction<'static, MySql>> {
        self.inner.base.begin_fenced(lease).await
    }

    /// Deletes the token rows of namespaces starting with `prefix`; see
    /// [`MysqlProvider::purge_namespaces`].
    ///
    /// # Errors
    /// As [`MysqlProvider::purge_namespaces`].
    pub async fn purge_namespaces(&self, prefix: &str) -> Result<u64> {
        self.inner.base.purge_namespaces(prefix).await
    }

    /// Migrates, then refuses a Galera node once: its named locks are not
    /// seen by the other nodes.
    async fn ready(&self) -> Result<()> {
        self.inner.base.ready().await?;
        let galera = self.inner.base.is_galera().await?;
        if galera {
            return Err(LeaseError::Config(
                "the advisory mode needs a single MySQL/MariaDB server: GET_LOCK locks are local to one Galera node; use the table mode".into(),
            ));
        }
        Ok(())
    }

    /// A session for the next acquire: an idle one (checked if it sat
    /// idle), else a new one.
    async fn session(&self) -> std::result::Result<Session, sqlx::Error> {
        loop {
            let next = lock(&self.inner.idle).pop();
            let Some((mut s, since)) = next else { break };
            if since.elapsed() < CHECK_IF_IDLE_FOR || s.conn.ping().await.is_ok() {
                return Ok(s);
            }
        }
        Ok(Session {
            conn: self.inner.base.connect_session().await?,
            wait_timeout: 0,
        })
    }

    fn park(&self, session: Session) {
        // A session given a short wait_timeout (a short TTL) may be closed
        // by the server between the idle check and its next statement:
        // only sessions that outlast the check by far are kept.
        if session.wait_timeout != 0 && session.wait_timeout < PARK_MIN_WAIT_SECS {
            return;
        }
        let mut idle = lock(&self.inner.idle);
        if idle.len() < IDLE_SESSIONS {
            idle.push((session, Instant::now()));
        }
    }

    /// The pinned session of `lease`, if this provider holds it: matched by
    /// key and token, then owner.
    fn pinned(&self, lease: &Lease) -> Option<Arc<Pinned>> {
        let held = lock(&self.inner.held);
        match held.get(&(lease.key().as_str().to_owned(), lease.token().get())) {
            Some((owner, pinned)) if *owner == lease.owner() => Some(Arc::clone(pinned)),
            _ => None,
        }
    }

    fn forget(&self, lease: &Lease, pinned: &Arc<Pinned>) {
        let mut held = lock(&self.inner.held);
        let k = (lease.key().as_str().to_owned(), lease.token().get());
        if held.get(&k).is_some_and(|(_, p)| Arc::ptr_eq(p, pinned)) {
            held.remove(&k);
        }
    }

    /// Drops sessions whose lease ran out: the server closes them at their
    /// idle timeout anyway, and nothing can extend them any more.
    fn sweep(&self) {
        let now = Instant::now();
        // A session in use (an extend in flight) is left to its user.
        lock(&self.inner.held)
            .retain(|_, (_, p)| p.valid_until() > now || p.conn.try_lock().is_err());
    }
}

impl Session {
    /// Gives the session `wait_timeout` = the TTL in whole seconds (rounded
    /// up), unless it has it already: the server closes it, and frees its
    /// lock, when it sits idle that long.
    async fn expire_after(&mut self, ttl: Duration) -> std::result::Result<(), sqlx::Error> {
        let secs = wait_secs(ttl);
        if self.wait_timeout != secs {
            sqlx::query(&format!("SET SESSION wait_timeout = {secs}"))
                .execute(&mut self.conn)
                .await?;
            self.wait_timeout = secs;
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `wait_timeout` for a TTL: whole seconds, rounded up, at least 1.
fn wait_secs(ttl: Duration) -> u64 {
    ttl.as_micros().div_ceil(1_000_000).max(1) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(namespace: &str, key: &str) -> String {
        let p =
            AdvisoryProvider::new(MysqlConfig::new("mysql://u@h/db").namespace(namespace)).unwrap();
        p.lock_name(&LeaseKey::new(key).unwrap())
    }

    #[test]
    fn lock_names_fit_and_tell_look_alikes_apart() {
        let n = name("billing", "settlement/2026-12-02");
        assert_eq!(n.len(), 38, "{n}");
        assert!(n.bytes().all(|b| !b.is_ascii_uppercase()), "{n}");
        let long = "é".repeat(256);
        let mut seen = std::collections::HashSet::new();
        for key in ["a", "A", "a ", "á", "a\u{301}", long.as_str()] {
            assert!(seen.insert(name("billing", key)), "{key:?} shares a lock");
        }
        assert_ne!(name("a", "bc"), name("ab", "c"));
        assert_ne!(name("billing", "k"), name("other", "k"));
        // Two versions of this crate deciding differently would let two
        // holders in during a rolling upgrade: the name of a key is fixed.
        assert_eq!(n, STABLE_NAME);
    }

    const STABLE_NAME: &str = "lease:0d87599b382e586b8245c6de58495823";

    #[test]
    fn wait_timeouts_round_up_to_whole_seconds() {
        assert_eq!(wait_secs(Duration::from_millis(1)), 1);
        assert_eq!(wait_secs(Duration::from_millis(1500)), 2);
        assert_eq!(wait_secs(Duration::from_secs(7 * 24 * 3600)), 604_800);
    }
}

//! Leases as PostgreSQL advisory locks, each on a session of its own: the
//! provider, its sessions and the bookkeeping of held leases.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_api::backend::{DEFAULT_MAX_TTL, OwnerId};
use lease_api::{
    Capabilities, ExpiryClock, Lease, LeaseError, LeaseKey, LeaseProvider, Notifications, Result,
};
use sqlx::postgres::PgConnection;
use sqlx::{Connection, Postgres, Transaction};
use tokio::time::Instant;

use crate::sql::payload;
use crate::{PostgresConfig, PostgresProvider};

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

/// The UUID namespace lock ids are derived in (SHA-1, RFC 9562 version 5).
const LOCK_ID_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x6c65_6173_652d_6164_7669_736f_7279_0001);

/// Leases held as PostgreSQL session advisory locks (`pg_try_advisory_lock`).
///
/// Each held lease has a database session of its own, pinned to it until
/// release. The lock, not a row, keeps others out, so the lease ends the
/// moment that session does: the holder's process exits or is killed, its
/// connection is cut, or an operator runs `pg_terminate_backend`. A TTL still
/// applies and runs on the **database** clock: the session's
/// `idle_session_timeout` is the lease's TTL, so a holder that stops renewing
/// (frozen, partitioned, or a lease simply dropped) has its session ended by
/// the server when the TTL runs out, which frees the lock. An extend is a
/// statement on that session, which restarts the server's idle timer.
///
/// What it adds over plain advisory locks:
/// - **Fencing tokens**: each acquisition increments a per-key counter row in
///   the same statement that takes the lock, so tokens grow as with every
///   other backend, and [`begin_fenced`](Self::begin_fenced) works as for
///   [`PostgresProvider`].
/// - **A lost signal**: a renewal on a session that ended is `Lost`, so a
///   [`LeaseGuard`](lease_api::LeaseGuard) fires at its next renewal (a third
///   of the TTL by default), not when its local validity runs out.
/// - **Waiting in the lock queue**: a waiter's session asks for the lock
///   itself (blocking, up to its wait) and hands it straight back, so it
///   wakes when the holder releases and also when the holder's session ends
///   for any other reason, which no `NOTIFY` announces. Releases still send
///   `NOTIFY` on the table's channel for other listeners.
///
/// **The session is the lease**, and that cuts both ways. A holder whose
/// process dies frees the key at once instead of after its TTL (the point
/// of this mode). But the server can also end a session its holder still
/// uses: a server restart or crash, `pg_terminate_backend`, a failover, a
/// firewall that resets the connection. The key is then free at once, and
/// the holder learns it only at its next statement, its next renewal (a
/// guard renews every third of the TTL by default; renew more often to
/// shrink the window). Until then two processes can believe they hold the
/// key, which the table mode ([`PostgresProvider`]) rules out, since its
/// rows outlive sessions and restarts. So the capabilities declare
/// `holder_session: Some(0)`: a lease may end before its TTL. Fence the
/// protected resource with the token, or write through
/// [`begin_fenced`](Self::begin_fenced): a token row cannot be bumped by a
/// newer holder while an older holder's fenced transaction is open.
///
/// Lock ids: a key's id is 64 bits of SHA-1 over the table, namespace and
/// key ([`lock_id`](Self::lock_id); `pg_locks` shows it as `classid`, the high
/// half, and `objid`, the low half, with `objsubid = 1`). Two keys can share
/// an id: among `n` keys in use in one database the chance that any two do is
/// about `n² / 2^65` (one in 37 million for a million keys). Two such keys
/// then exclude each other, as if they were one key; they are never both
/// held by two owners at once, so a collision costs waiting, never safety.
///
/// Costs: one database session per held lease (PostgreSQL's
/// `max_connections` bounds how many leases a database can hold at once, and
/// a pooler must run in session mode); PostgreSQL 14 or later
/// (`idle_session_timeout`). A renewal that fails for any reason, a timeout
/// included, ends the session and so the lease: there is no retry on a
/// session that may have lost its lock.
///
/// ```no_run
/// # async fn demo() -> lease_api::Result<()> {
/// use std::time::Duration;
/// use lease_api::{LeaseKey, LeaseProvider};
/// use lease_postgres::{AdvisoryProvider, PostgresConfig};
///
/// let provider = AdvisoryProvider::new(PostgresConfig::new("postgres://app@127.0.0.1/app"))?;
/// let key = LeaseKey::new("report/2026-12")?;
/// if let Some(lease) = provider.try_acquire(&key, Duration::from_secs(30)).await?.into_lease() {
///     println!("locked {key} as advisory lock {}, token {}", provider.lock_id(&key), lease.token());
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
    /// LISTEN session, pool and error mapping.
    base: PostgresProvider,
    sql: AdvisorySql,
    /// Held leases by (key, token): the owner and the pinned session.
    held: Mutex<HashMap<(String, u64), Held>>,
    /// Unlocked sessions for the next acquire.
    idle: Mutex<Vec<(PgConnection, Instant)>>,
    /// `statement_timeout` for every session, in milliseconds.
    statement_ms: String,
    /// Acquire attempts in flight, at most `max_connections`: each takes a
    /// session (held sessions are not counted; each holds a lease).
    attempts: tokio::sync::Semaphore,
    table_id: String,
}

/// A held lease's owner and session.
type Held = (OwnerId, Arc<Pinned>);

/// A held lease's session. `conn` is `None` once the session was closed.
struct Pinned {
    conn: tokio::sync::Mutex<Option<PgConnection>>,
    /// The server process of the session, checked by every statement on
    /// it: behind a pooler in transaction mode it would not be the same.
    pid: i32,
    /// Local validity: sent + granted TTL of the last acquire or extend.
    valid_until: Mutex<Instant>,
}

impl Pinned {
    fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for AdvisoryProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdvisoryProvider")
            .field("server", &self.inner.base.display())
            .field("namespace", &self.inner.base.namespace())
            .finish_non_exhaustive()
    }
}

impl AdvisoryProvider {
    /// Sets up a provider; nothing connects until first use. The token table
    /// is `config`'s table, except that the table mode's default
    /// (`lease_leases`) becomes [`ADVISORY_TABLE`]: never point a table-mode
    /// provider and an advisory one at the same table, since they keep keys
    /// out by different means.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for a malformed URL, namespace, schema or table.
    pub fn new(mut config: PostgresConfig) -> Result<Self> {
        if config.table == "lease_leases" {
            config.table = ADVISORY_TABLE.into();
        }
        let table_id = format!("{}.{}", config.schema, config.table);
        let caps = Capabilities::new(
            "postgres-advisory",
            ExpiryClock::StoreServer,
            Notifications::Native("PostgreSQL LISTEN/NOTIFY"),
        )
        // The server's idle timer counts whole milliseconds; ending a session
        // and freeing its locks takes the backend a moment.
        .with_ttl_limits(Duration::from_millis(100), DEFAULT_MAX_TTL)
        .with_expiry_slack(Duration::from_millis(250))
        // The lease ends with the session: at once when the holder's process
        // dies (its socket closes), at the TTL otherwise.
        .with_holder_session(Some(Duration::ZERO));
        let statement_ms = config.response_timeout.as_millis().max(1).to_string();
        let attempts = usize::try_from(config.max_connections.max(1)).unwrap_or(1);
        let base = PostgresProvider::with_capabilities(config, caps)?;
        let sql = AdvisorySql::new(base.table_sql());
        Ok(AdvisoryProvider {
            inner: Arc::new(Inner {
                base,
                sql,
                held: Mutex::default(),
                idle: Mutex::default(),
                statement_ms,
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
        Self::new(PostgresConfig::new(url))
    }

    /// The 64-bit advisory lock id of `key` in this provider's table and
    /// namespace: what `pg_locks` shows (`classid` the high 32 bits, `objid`
    /// the low 32, `objsubid = 1`), for finding the session that holds it.
    pub fn lock_id(&self, key: &LeaseKey) -> i64 {
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
        let (hi, lo) = uuid::Uuid::new_v5(&LOCK_ID_NAMESPACE, &name).as_u64_pair();
        // Version and variant bits sit in different halves: the XOR of the
        // halves has none fixed.
        (hi ^ lo) as i64
    }

    /// Creates the token table (and schema) if missing; see
    /// [`PostgresProvider::migrate`].
    ///
    /// # Errors
    /// `Unavailable` when the database is down; `Backend` without the privilege.
    pub async fn migrate(&self) -> Result<()> {
        self.inner.base.migrate().await
    }

    /// Begins a transaction that commits only while `lease` is still the
    /// key's latest acquisition; see [`PostgresProvider::begin_fenced`]. A
    /// later acquirer's token upsert waits for this transaction, so a write
    /// in it can never land after a newer holder got its token.
    ///
    /// # Errors
    /// `Lost` when a newer acquisition exists or the lease was released.
    pub async fn begin_fenced(&self, lease: &Lease) -> Result<Transaction<'static, Postgres>> {
        self.inner.base.begin_fenced(lease).await
    }

    /// Deletes the token rows of namespaces starting with `prefix`; see
    /// [`PostgresProvider::purge_namespaces`].
    ///
    /// # Errors
    /// As [`PostgresProvider::purge_namespaces`].
    pub async fn purge_namespaces(&self, prefix: &str) -> Result<u64> {
        self.inner.base.purge_namespaces(prefix).await
    }

    /// A session for the next acquire: an idle one (checked if it sat idle),
    /// else a new one.
    async fn session(&self) -> std::result::Result<PgConnection, sqlx::Error> {
        loop {
            let next = lock(&self.inner.idle).pop();
            let Some((mut conn, since)) = next else { break };
            if since.elapsed() < CHECK_IF_IDLE_FOR || conn.ping().await.is_ok() {
                return Ok(conn);
            }
        }
        let ms = self.inner.statement_ms.as_str();
        self.inner
            .base
            .hosts()
            .connect_primary(|o| {
                o.options([("statement_timeout", ms)])
                    .application_name("lease-advisory")
            })
            .await
    }

    fn park(&self, conn: PgConnection) {
        let mut idle = lock(&self.inner.idle);
        if idle.len() < IDLE_SESSIONS {
            idle.push((conn, Instant::now()));
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

    /// Releases a lease held by another provider or process: its row is
    /// cleared and its session ended (which needs the same database role or
    /// `pg_signal_backend`).
    async fn release_elsewhere(&self, lease: &Lease, token: i64) -> Result<()> {
        self.inner.base.ready().await?;
        let namespace = self.inner.base.namespace();
        let row = self
            .inner
            .base
            .bounded("release", async {
                let mut conn = self.session().await?;
                let row = sqlx::query(&self.inner.sql.release_elsewhere)
                    .bind(namespace)
                    .bind(lease.key().as_str())
                    .bind(lease.owner().to_hex())
                    .bind(token)
                    .bind(self.inner.base.channel())
                    .bind(payload(namespace, lease.key().as_str()))
                    .fetch_optional(&mut conn)
                    .await?;
                self.park(conn);
                Ok(row)
            })
            .await?;
        match row {
            Some(_) => Ok(()),
            None => Err(LeaseError::not_held(lease)),
        }
    }

    fn forget(&self, lease: &Lease, pinned: &Arc<Pinned>) {
        let mut held = lock(&self.inner.held);
        let k = (lease.key().as_str().to_owned(), lease.token().get());
        if held.get(&k).is_some_and(|(_, p)| Arc::ptr_eq(p, pinned)) {
            held.remove(&k);
        }
    }

    /// Drops sessions whose lease ran out: the server ends them at their
    /// idle timeout anyway, and nothing can extend them any more.
    fn sweep(&self) {
        let now = Instant::now();
        // A session in use (an extend in flight) is left to its user.
        lock(&self.inner.held)
            .retain(|_, (_, p)| p.valid_until() > now || p.conn.try_lock().is_err());
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// PostgreSQL before 14 has no `idle_session_timeout` (42704, an unknown
/// setting): say what is needed instead.
fn before_14(e: sqlx::Error) -> sqlx::Error {
    match &e {
        sqlx::Error::Database(d) if d.code().as_deref() == Some("42704") => {
            sqlx::Error::Configuration(
                "the advisory-lock mode needs PostgreSQL 14 or later (idle_session_timeout)".into(),
            )
        }
        _ => e,
    }
}

/// `idle_session_timeout` for a TTL, in whole milliseconds, rounded up.
fn idle_ms(ttl: Duration) -> String {
    ttl.as_micros().div_ceil(1000).max(1).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(namespace: &str, key: &str) -> i64 {
        let p =
            AdvisoryProvider::new(PostgresConfig::new("postgres://u@h/db").namespace(namespace))
                .unwrap();
        p.lock_id(&LeaseKey::new(key).unwrap())
    }

    #[test]
    fn lock_ids_are_stable_across_versions_and_distinct_per_namespace_and_key() {
        // Two versions of this crate deciding differently would let two
        // holders in during a rolling upgrade: the id of a key is fixed.
        assert_eq!(id("billing", "settlement/2026-12-02"), STABLE_ID);
        assert_ne!(id("a", "bc"), id("ab", "c"));
        assert_ne!(id("billing", "k"), id("billing", "k2"));
        assert_ne!(id("billing", "k"), id("other", "k"));
        let in_other_table = AdvisoryProvider::new(
            PostgresConfig::new("postgres://u@h/db")
                .namespace("billing")
                .table("public", "elsewhere"),
        )
        .unwrap()
        .lock_id(&LeaseKey::new("settlement/2026-12-02").unwrap());
        assert_ne!(in_other_table, STABLE_ID);
    }

    const STABLE_ID: i64 = -2_004_028_977_936_746_861;

    #[test]
    fn idle_timeouts_round_up_to_whole_milliseconds() {
        assert_eq!(idle_ms(Duration::from_micros(1500)), "2");
        assert_eq!(idle_ms(Duration::from_secs(7 * 24 * 3600)), "604800000");
    }
}

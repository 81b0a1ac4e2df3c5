//! `SqliteProvider`.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use lease_api::backend::{
    DEFAULT_MAX_KEYS, DEFAULT_MAX_TTL, DEFAULT_NAMESPACE, MultiKey, OwnerId, validate_namespace,
};
use lease_api::{
    Capabilities, ExpiryClock, FencingToken, LeaseError, LeaseKey, Notifications, Result,
    TokenDurability,
};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Row, Sqlite, Transaction};
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, OnceCell};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

/// How to open the lease database.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SqliteConfig {
    /// The database file; created (with its directory's parent existing) on
    /// first use.
    pub path: PathBuf,
    /// The namespace; providers in different namespaces never see each other.
    pub namespace: String,
    /// How long one operation waits for another process's write to finish
    /// before it is reported as `Unavailable`.
    pub busy_timeout: Duration,
}

impl SqliteConfig {
    /// The database at `path`, default namespace, a 5 s busy timeout.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SqliteConfig {
            path: path.into(),
            namespace: DEFAULT_NAMESPACE.into(),
            busy_timeout: Duration::from_secs(5),
        }
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets the busy timeout.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }
}

/// Leases in one SQLite file, shared by every process on the host that opens
/// it. See the crate docs for where each guarantee comes from.
#[derive(Clone)]
pub struct SqliteProvider {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: SqliteConfig,
    pub(crate) pool: SqlitePool,
    pub(crate) ready: OnceCell<()>,
    pub(crate) caps: Capabilities,
    pub(crate) boot: String,
    /// The notification directory: a release touches the file of its key's
    /// bucket there.
    pub(crate) notify_dir: PathBuf,
    /// One write transaction of this provider at a time: the tasks of one
    /// process queue here, in order, instead of in SQLite's busy handler,
    /// which sleeps in coarse steps. Other processes still meet the busy
    /// handler.
    pub(crate) write_lock: Arc<tokio::sync::Mutex<()>>,
    /// One `Notify` per bucket, woken by the inotify task.
    pub(crate) released: Arc<Vec<Arc<Notify>>>,
    pub(crate) watcher: OnceCell<DropGuard>,
    /// Keys this provider found held, until when at least (as etcd's
    /// provider keeps them): a try on such a key reads before it writes.
    pub(crate) seen_held: std::sync::Mutex<std::collections::HashMap<String, Instant>>,
}

impl std::fmt::Debug for SqliteProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteProvider")
            .field("path", &self.inner.config.path)
            .field("namespace", &self.inner.config.namespace)
            .finish_non_exhaustive()
    }
}

/// Milliseconds of `CLOCK_MONOTONIC`: the host clock every process shares.
pub(crate) fn host_now_ms() -> Result<i64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map_err(|e| LeaseError::protocol(format!("cannot read CLOCK_MONOTONIC: {e}")))?;
    Ok(t.tv_sec()
        .saturating_mul(1000)
        .saturating_add(t.tv_nsec() / 1_000_000))
}

/// This boot's id; monotonic times of another boot mean nothing now.
/// Without it the provider refuses to start: a process that could not tell
/// boots apart would take every other process's lease as an old boot's.
fn boot_id() -> Result<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            LeaseError::Config(
                "cannot read /proc/sys/kernel/random/boot_id: the SQLite provider needs it to tell this boot's leases from an earlier boot's (run it where /proc is mounted)".into(),
            )
        })
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn token_i64(t: FencingToken) -> i64 {
    i64::try_from(t.get()).unwrap_or(-1)
}

/// Extends (or the many-lease form) compare owner, token and boot.
pub(crate) const EXTEND: &str = "UPDATE lease_leases SET expires_at = ?1
     WHERE namespace = ?2 AND key = ?3 AND owner = ?4 AND token = ?5 AND boot = ?6 AND expires_at > ?7";
pub(crate) const RELEASE: &str = "UPDATE lease_leases SET owner = NULL, expires_at = NULL, holder = NULL
     WHERE namespace = ?1 AND key = ?2 AND owner = ?3 AND token = ?4 AND boot = ?5 AND expires_at > ?6";
/// Notification buckets: a release wakes the waiters of keys in its bucket.
const BUCKETS: usize = 1024;
/// How many leases one `extend_many` transaction takes.
pub(crate) const BATCH: usize = 1000;
/// How often a busy database is retried after the busy timeout.
pub(crate) const BUSY_RETRIES: usize = 3;

impl SqliteProvider {
    /// Sets up a provider; the database is opened (and created) on first use.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for a bad namespace or an empty path.
    pub fn new(config: SqliteConfig) -> Result<Self> {
        validate_namespace(&config.namespace)?;
        if config.path.as_os_str().is_empty() {
            return Err(LeaseError::Config("the SQLite path is empty".into()));
        }
        let options = SqliteConnectOptions::new()
            .filename(&config.path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // A committed token must survive a power cut (C8).
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(config.busy_timeout);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(config.busy_timeout)
            .connect_lazy_with(options);
        let caps = Capabilities::new(
            "sqlite",
            ExpiryClock::HostMonotonic,
            Notifications::Native("inotify on the notification file"),
        )
        .with_ttl_limits(Duration::from_millis(10), DEFAULT_MAX_TTL)
        .with_multi_key(MultiKey::atomic(DEFAULT_MAX_KEYS))
        .with_shared_leases(true)
        .with_ttl_granularity(Duration::from_millis(1))
        .with_expiry_slack(Duration::from_millis(5))
        .with_durable_tokens(TokenDurability::Durable(
            "one counter per file, raised in the acquire's transaction, written with synchronous=FULL".into(),
        ));
        let mut notify_dir = config.path.clone().into_os_string();
        notify_dir.push("-notify");
        Ok(SqliteProvider {
            inner: Arc::new(Inner {
                notify_dir: PathBuf::from(notify_dir),
                config,
                pool,
                ready: OnceCell::new(),
                caps,
                boot: boot_id()?,
                write_lock: Arc::new(tokio::sync::Mutex::new(())),
                released: Arc::new((0..BUCKETS).map(|_| Arc::new(Notify::new())).collect()),
                watcher: OnceCell::new(),
                seen_held: std::sync::Mutex::default(),
            }),
        })
    }

    /// A provider for a `sqlite://` URL path, in the default namespace.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::new(SqliteConfig::new(path.as_ref()))
    }

    pub(crate) fn map_err(&self, e: sqlx::Error) -> LeaseError {
        let path = self.inner.config.path.display();
        // SQLite's primary result code is the low byte of the extended one.
        let primary = match &e {
            sqlx::Error::Database(d) => d
                .code()
                .and_then(|c| c.parse::<i64>().ok())
                .map(|c| c & 0xff),
            _ => None,
        };
        // BUSY, LOCKED, and PROTOCOL (a transient WAL race).
        let busy = matches!(primary, Some(5 | 6 | 15));
        let cannot_open = primary == Some(14)
            || matches!(
                e,
                sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed
            );
        if busy || cannot_open {
            LeaseError::unavailable(
                format!(
                    "the SQLite lease database {path} is {}",
                    if busy {
                        "busy (another process holds its write lock)"
                    } else {
                        "not reachable (cannot open the file)"
                    }
                ),
                e,
            )
        } else {
            LeaseError::backend(format!("the SQLite lease database {path} failed"), e)
        }
    }

    /// Creates the tables once per provider.
    pub(crate) async fn ready(&self) -> Result<()> {
        self.inner
            .ready
            .get_or_try_init(|| async {
                let mut tx = self.begin().await?;
                for sql in [
                    "CREATE TABLE IF NOT EXISTS lease_leases (
                        namespace  TEXT    NOT NULL,
                        key        TEXT    NOT NULL,
                        owner      TEXT    NULL,
                        token      INTEGER NOT NULL,
                        expires_at INTEGER NULL,
                        boot       TEXT    NULL,
                        holder     TEXT    NULL,
                        PRIMARY KEY (namespace, key)
                    ) WITHOUT ROWID",
                    "CREATE TABLE IF NOT EXISTS lease_tokens (
                        id   INTEGER PRIMARY KEY CHECK (id = 1),
                        last INTEGER NOT NULL
                    )",
                    "INSERT OR IGNORE INTO lease_tokens (id, last) VALUES (1, 0)",
                    crate::schema::RW_TABLES[0],
                    crate::schema::RW_TABLES[1],
                ] {
                    sqlx::query(sql)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| self.map_err(e))?;
                }
                tx.commit().await.map_err(|e| self.map_err(e))
            })
            .await
            .map(|_| ())
    }

    /// A write transaction that holds SQLite's write lock from its first
    /// statement (`BEGIN IMMEDIATE`), retried while another process holds it.
    pub(crate) async fn begin(&self) -> Result<Transaction<'static, Sqlite>> {
        let mut last = None;
        for _ in 0..BUSY_RETRIES {
            match self.inner.pool.begin_with("BEGIN IMMEDIATE").await {
                Ok(tx) => return Ok(tx),
                Err(e) => {
                    let mapped = self.map_err(e);
                    if !mapped.is_transient() {
                        return Err(mapped);
                    }
                    last = Some(mapped);
                }
            }
        }
        Err(last.unwrap_or_else(|| LeaseError::protocol("no attempt to begin a transaction")))
    }

    /// Runs a whole write transaction in its own task, so a caller that
    /// drops its future never leaves a connection inside a transaction, and
    /// a commit that happens is never half-observed.
    pub(crate) async fn write<T, F, Fut>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(SqliteProvider) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        self.ready().await?;
        let this = self.clone();
        // The transaction goes on to its commit or rollback in its task; the
        // caller waits for it no longer than a busy database is waited for.
        let limit = self.inner.config.busy_timeout * 2 + Duration::from_secs(1);
        let queue = Arc::clone(&self.inner.write_lock);
        // A caller that gave up while its task still queued for its turn
        // must not get a lease nobody holds: the task then does nothing.
        // (One that gives up during the transaction itself can still see it
        // commit; such a lease runs out by its TTL.)
        let gone = CancellationToken::new();
        let given_up = gone.clone();
        let task = tokio::spawn(async move {
            let _turn = queue.lock_owned().await;
            if given_up.is_cancelled() {
                return Err(LeaseError::timeout("a SQLite transaction", limit));
            }
            f(this).await
        });
        match tokio::time::timeout(limit, task).await {
            Ok(joined) => joined.map_err(|e| {
                LeaseError::protocol(format!("a SQLite transaction task failed: {e}"))
            })?,
            Err(_) => {
                gone.cancel();
                Err(LeaseError::timeout("a SQLite transaction", limit))
            }
        }
    }

    pub(crate) fn seen_held(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Instant>> {
        self.inner
            .seen_held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The bucket of `key`: releases wake only the waiters of their bucket.
    pub(crate) fn bucket(&self, key: &LeaseKey) -> usize {
        // FNV-1a: the same in every process, whatever its Rust version.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let ns = self.inner.config.namespace.as_bytes();
        for b in ns.iter().chain([0u8].iter()).chain(key.as_str().as_bytes()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        usize::try_from(h % BUCKETS as u64).unwrap_or(0)
    }

    /// Wakes the waiters of `key` on the host: closing a file opened for
    /// writing is an `IN_CLOSE_WRITE` event, with the file's name, for every
    /// watcher of the notification directory.
    pub(crate) fn announce(&self, key: &LeaseKey) {
        let file = self
            .inner
            .notify_dir
            .join(format!("{:03x}", self.bucket(key)));
        let touched = std::fs::create_dir_all(&self.inner.notify_dir).and_then(|()| {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&file)
        });
        if let Err(e) = touched {
            tracing::debug!(path = %file.display(), error = %e, "cannot touch the notification file; waiters wake by the TTL");
        }
    }

    /// Starts the inotify watch once; afterwards every release on the host
    /// wakes this provider's waiters of its key's bucket.
    pub(crate) async fn ensure_watcher(&self) -> Result<()> {
        self.inner
            .watcher
            .get_or_try_init(|| async {
                // The directory must exist before it can be watched.
                std::fs::create_dir_all(&self.inner.notify_dir).map_err(|e| {
                    LeaseError::unavailable(
                        format!(
                            "cannot create the notification directory {}",
                            self.inner.notify_dir.display()
                        ),
                        e,
                    )
                })?;
                let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
                    .map_err(|e| LeaseError::unavailable("cannot start inotify", e))?;
                inotify
                    .add_watch(&self.inner.notify_dir, AddWatchFlags::IN_CLOSE_WRITE)
                    .map_err(|e| {
                        LeaseError::unavailable("cannot watch the notification directory", e)
                    })?;
                // `AsyncFd::new` is deprecated in favour of an unsafe
                // `register`: the risk is a descriptor closed while still
                // registered. Here the AsyncFd owns the Inotify, which owns
                // the descriptor, so it is deregistered before it is closed.
                #[allow(deprecated)]
                let fd = AsyncFd::new(Watched(inotify))
                    .map_err(|e| LeaseError::unavailable("cannot register inotify", e))?;
                let stop = CancellationToken::new();
                tokio::spawn(watch_releases(
                    fd,
                    Arc::clone(&self.inner.released),
                    stop.clone(),
                ));
                Ok::<_, LeaseError>(stop.drop_guard())
            })
            .await
            .map(|_| ())
    }

    /// How long the lease row of `key` still runs, if it is held (read in
    /// the write transaction `tx`, at `now`).
    pub(crate) async fn held_for(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        key: &LeaseKey,
        now: i64,
    ) -> Result<Option<i64>> {
        let row: Option<(Option<String>, Option<i64>, Option<String>)> = sqlx::query(
            "SELECT owner, expires_at, boot FROM lease_leases WHERE namespace = ?1 AND key = ?2",
        )
        .bind(&self.inner.config.namespace)
        .bind(key.as_str())
        .fetch_optional(&mut **tx)
        .await
        .map_err(|e| self.map_err(e))?
        .map(|r| (r.get(0), r.get(1), r.get(2)));
        Ok(self.lease_row_live(&row, now))
    }

    /// Writes `key`'s lease row for `owner` until `now + ttl`, with the next
    /// token of the file's counter, in `tx`; returns the token.
    pub(crate) async fn claim_row(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        key: &LeaseKey,
        (owner, holder): (OwnerId, &str),
        (now, ttl): (i64, Duration),
    ) -> Result<FencingToken> {
        let token: i64 =
            sqlx::query("UPDATE lease_tokens SET last = last + 1 WHERE id = 1 RETURNING last")
                .fetch_one(&mut **tx)
                .await
                .map_err(|e| self.map_err(e))?
                .get(0);
        sqlx::query(
            "INSERT INTO lease_leases (namespace, key, owner, token, expires_at, boot, holder)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (namespace, key) DO UPDATE SET owner = excluded.owner,
                token = excluded.token, expires_at = excluded.expires_at,
                boot = excluded.boot, holder = excluded.holder",
        )
        .bind(&self.inner.config.namespace)
        .bind(key.as_str())
        .bind(owner.to_hex())
        .bind(token)
        .bind(now.saturating_add(millis(ttl)))
        .bind(&self.inner.boot)
        .bind(holder)
        .execute(&mut **tx)
        .await
        .map_err(|e| self.map_err(e))?;
        u64::try_from(token)
            .map(FencingToken)
            .map_err(|_| LeaseError::protocol(format!("negative token {token}")))
    }

    pub(crate) fn lease_row_live(
        &self,
        row: &Option<(Option<String>, Option<i64>, Option<String>)>,
        now: i64,
    ) -> Option<i64> {
        match row {
            Some((Some(_), Some(expires), Some(boot)))
                if *boot == self.inner.boot && *expires > now =>
            {
                Some(*expires - now)
            }
            _ => None,
        }
    }

    /// Deletes every lease row of the namespaces starting with `prefix` (the
    /// token counter stays, so tokens keep growing); returns how many went.
    ///
    /// # Errors
    /// `Config` for an empty prefix; `Unavailable` when the file is busy.
    pub async fn purge_namespaces(&self, prefix: &str) -> Result<u64> {
        lease_api::backend::validate_purge_prefix(prefix)?;
        let prefix = prefix.to_owned();
        self.write(move |this| async move {
            let mut tx = this.begin().await?;
            let done =
                sqlx::query("DELETE FROM lease_leases WHERE substr(namespace, 1, length(?1)) = ?1")
                    .bind(&prefix)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| this.map_err(e))?;
            let mut gone = done.rows_affected();
            for table in ["lease_rw", "lease_rw_epochs"] {
                gone += sqlx::query(&format!(
                    "DELETE FROM {table} WHERE substr(namespace, 1, length(?1)) = ?1"
                ))
                .bind(&prefix)
                .execute(&mut *tx)
                .await
                .map_err(|e| this.map_err(e))?
                .rows_affected();
            }
            tx.commit().await.map_err(|e| this.map_err(e))?;
            Ok(gone)
        })
        .await
    }
}

/// The inotify descriptor, for tokio's readiness.
struct Watched(Inotify);

impl AsRawFd for Watched {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Wakes the waiters of a bucket on each event of its file (every waiter if
/// the kernel's event queue overflowed), until the provider goes.
async fn watch_releases(
    fd: AsyncFd<Watched>,
    released: Arc<Vec<Arc<Notify>>>,
    stop: CancellationToken,
) {
    loop {
        let ready = tokio::select! {
            _ = stop.cancelled() => return,
            r = fd.readable() => r,
        };
        let mut guard = match ready {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(error = %e, "inotify failed; waiters wake by the TTL");
                return;
            }
        };
        match guard.get_inner().0.read_events() {
            Ok(events) => {
                for event in events {
                    let bucket = event
                        .name
                        .as_ref()
                        .and_then(|n| n.to_str())
                        .and_then(|n| usize::from_str_radix(n, 16).ok())
                        .and_then(|b| released.get(b));
                    match bucket {
                        Some(n) if !event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) => {
                            n.notify_waiters();
                        }
                        _ => released.iter().for_each(|n| n.notify_waiters()),
                    }
                }
            }
            Err(nix::errno::Errno::EAGAIN) => guard.clear_ready(),
            Err(e) => {
                tracing::warn!(error = %e, "reading inotify failed; waiters wake by the TTL");
                return;
            }
        }
    }
}

impl FromStr for SqliteConfig {
    type Err = LeaseError;

    /// `sqlite:///absolute/path/leases.db` or `sqlite://relative/path.db`.
    fn from_str(url: &str) -> Result<Self> {
        let path = url
            .strip_prefix("sqlite://")
            .ok_or_else(|| LeaseError::Config(format!("{url:?} is not a sqlite:// URL")))?;
        if path.is_empty() {
            return Err(LeaseError::Config(
                "a sqlite:// URL needs a file path, e.g. sqlite:///var/lib/lease/leases.db".into(),
            ));
        }
        Ok(SqliteConfig::new(path))
    }
}

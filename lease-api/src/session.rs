//! `LeaseSession`: many leases of one process kept alive by one renewal loop.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::guard::{Shared, lock};
use crate::session_store::SessionStore;
use crate::time::deadline_after;
use crate::watch::KeyWatch;
use crate::{
    AcquireOptions, Capabilities, FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey,
    LeaseProvider, LostReason, Result, TryAcquire, acquire,
};

/// The session store of a backend without its own: each key by
/// `try_acquire`, renewals by `extend_many`.
#[derive(Debug)]
struct PerLeaseStore {
    provider: Arc<dyn LeaseProvider>,
}

#[async_trait]
impl SessionStore for PerLeaseStore {
    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.provider.try_acquire(key, ttl).await
    }
    async fn renew(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        self.provider.extend_many(leases).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.provider.release(lease).await
    }
    fn batch_limit(&self) -> usize {
        self.provider.batch_limit()
    }
}

/// How a [`LeaseSession`] holds its leases.
///
/// ```
/// use std::time::Duration;
/// use lease_api::SessionConfig;
///
/// let config = SessionConfig::ttl(Duration::from_secs(30)).renew_every(Duration::from_secs(5));
/// assert_eq!(config.ttl, Duration::from_secs(30));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SessionConfig {
    /// The TTL of every lease of the session.
    pub ttl: Duration,
    /// How often the session renews all its leases. Default: a third of the
    /// validity window, as [`LeaseGuard`](crate::LeaseGuard) does.
    pub renew_every: Option<Duration>,
    /// After a failed renewal round, retry after this long. Default: a tenth
    /// of the validity window, between 10 ms and 1 s.
    pub retry_every: Option<Duration>,
    /// Fire a lease's lost signal this long before its local validity ends
    /// when renewals keep failing. Default: a tenth of the window, at most 1 s.
    pub lost_margin: Option<Duration>,
    /// How many renewal calls run at once. Default 4.
    pub parallel_batches: usize,
}

impl SessionConfig {
    /// Leases of `ttl`, with defaults for everything else.
    pub fn ttl(ttl: Duration) -> Self {
        SessionConfig {
            ttl,
            renew_every: None,
            retry_every: None,
            lost_margin: None,
            parallel_batches: 4,
        }
    }

    /// Sets [`renew_every`](Self::renew_every).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// Sets [`retry_every`](Self::retry_every).
    pub fn retry_every(mut self, every: Duration) -> Self {
        self.retry_every = Some(every);
        self
    }

    /// Sets [`lost_margin`](Self::lost_margin).
    pub fn lost_margin(mut self, margin: Duration) -> Self {
        self.lost_margin = Some(margin);
        self
    }

    /// Sets [`parallel_batches`](Self::parallel_batches) (at least 1).
    pub fn parallel_batches(mut self, n: usize) -> Self {
        self.parallel_batches = n.max(1);
        self
    }
}

#[derive(Clone, Copy, Debug)]
struct Timing {
    window: Duration,
    renew_every: Duration,
    retry_every: Duration,
    lost_margin: Duration,
}

impl Timing {
    /// The timing of a guard whose validity window is `window`, as
    /// [`LeaseGuard`](crate::LeaseGuard) derives it.
    fn new(window: Duration, config: &SessionConfig) -> Self {
        let lost_margin = config
            .lost_margin
            .unwrap_or((window / 10).min(Duration::from_secs(1)))
            .min(window / 2);
        let renew_every = config
            .renew_every
            .unwrap_or(window / 3)
            .min(window.saturating_sub(lost_margin) / 2)
            .max(Duration::from_millis(1));
        let retry_every = config
            .retry_every
            .unwrap_or((window / 10).clamp(Duration::from_millis(10), Duration::from_secs(1)))
            .max(Duration::from_millis(1));
        Timing {
            window,
            renew_every,
            retry_every,
            lost_margin,
        }
    }

    fn fire_at(&self, lease: &Lease) -> Instant {
        self.fire_at_of(lease.valid_until())
    }

    fn fire_at_of(&self, valid_until: Instant) -> Instant {
        valid_until
            .checked_sub(self.lost_margin)
            .unwrap_or(valid_until)
    }
}

/// What the renewal loop must know about leases added since it last looked.
#[derive(Clone, Copy, Debug)]
struct Added {
    window: Duration,
    earliest_valid_until: Instant,
}

/// Counters of a session's renewal loop, for benchmarks and monitoring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionStats {
    /// Leases held now.
    pub held: usize,
    /// Renewal rounds run (each renews every held lease).
    pub rounds: u64,
    /// Store calls the rounds made (one per batch).
    pub renew_calls: u64,
    /// Leases whose lost signal fired.
    pub lost: u64,
}

struct Inner {
    provider: Arc<dyn LeaseProvider>,
    store: Arc<dyn SessionStore>,
    acquirer: Arc<SessionAcquirer>,
    ttl: Duration,
    parallel: usize,
    leases: Mutex<HashMap<u64, Arc<Shared>>>,
    next_id: AtomicU64,
    /// Leases added since the loop last looked: the shortest validity window
    /// and the earliest validity among them.
    pending: Mutex<Option<Added>>,
    added: Notify,
    stop: CancellationToken,
    rounds: AtomicU64,
    renew_calls: AtomicU64,
    lost: AtomicU64,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseSession")
            .field("store", &self.store)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Many leases of one process, renewed together by one loop (C11 for many keys).
///
/// A [`LeaseGuard`](crate::LeaseGuard) renews its one lease with its own task
/// and its own store call. A session holds any number of leases and renews
/// them all with one loop, in batched store calls: one script call (Redis),
/// one `UPDATE ... FROM unnest` (PostgreSQL), one batched script per node
/// (Redlock) for up to a thousand leases, one keep-alive of the session's etcd
/// lease, one multi-read on ZooKeeper, whose holder nodes live on the client
/// session. A held lease costs a map entry, no task and no stream.
///
/// Use a guard for one key, or a few; use a session when a process holds many
/// keys at once (a lease per partition, per tenant, per shard).
///
/// Each lease keeps its own fencing token and its own lost signal: a key the
/// store says is gone fires that lease only; when renewals fail for the whole
/// session (the store is unreachable), each lease fires by its own local
/// validity, before it ends.
///
/// ```
/// # async fn demo() -> lease_api::Result<()> {
/// use std::{sync::Arc, time::Duration};
/// use lease_api::{LeaseKey, LeaseProvider, LeaseSession, MemoryProvider, SessionConfig};
///
/// let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
/// let session = LeaseSession::open(provider, SessionConfig::ttl(Duration::from_secs(10))).await?;
/// let mut shards = Vec::new();
/// for shard in 0..100 {
///     let key = LeaseKey::new(format!("shard/{shard}"))?;
///     shards.push(session.try_acquire(&key).await?.expect("free key"));
/// }
/// assert_eq!(session.stats().held, 100);
/// // Each lease has its own token and its own lost signal.
/// assert!(!shards[7].is_lost());
/// shards.pop().expect("a lease").release().await?;
/// session.close().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LeaseSession {
    inner: Arc<Inner>,
}

impl LeaseSession {
    /// Opens a session over `provider`, whose leases all have `config.ttl`.
    /// Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// `InvalidTtl` for a TTL outside the provider's limits (C3); errors of
    /// the backend's session set-up (an etcd lease grant).
    pub async fn open(provider: Arc<dyn LeaseProvider>, config: SessionConfig) -> Result<Self> {
        let ttl = provider.capabilities().grant_ttl(config.ttl)?;
        let store = match provider.session_store(ttl).await? {
            Some(store) => store,
            None => Arc::new(PerLeaseStore {
                provider: Arc::clone(&provider),
            }),
        };
        let acquirer = Arc::new(SessionAcquirer {
            provider: Arc::clone(&provider),
            store: Arc::clone(&store),
        });
        let inner = Arc::new(Inner {
            provider,
            store,
            acquirer,
            ttl,
            parallel: config.parallel_batches.max(1),
            leases: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            pending: Mutex::new(None),
            added: Notify::new(),
            stop: CancellationToken::new(),
            rounds: AtomicU64::new(0),
            renew_calls: AtomicU64::new(0),
            lost: AtomicU64::new(0),
        });
        tokio::spawn(renew_loop(Arc::clone(&inner), config));
        Ok(LeaseSession { inner })
    }

    /// The most leases one renewal call of this session takes.
    pub fn batch_limit(&self) -> usize {
        self.inner.store.batch_limit()
    }

    /// The TTL every lease of the session was granted.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// Takes `key` if it is free, in one store step (C2); `None` when someone
    /// else holds it.
    ///
    /// # Errors
    /// As [`LeaseProvider::try_acquire`].
    pub async fn try_acquire(&self, key: &LeaseKey) -> Result<Option<SessionLease>> {
        self.acquire(key, Duration::ZERO).await
    }

    /// Takes `key`, waiting up to `wait` for it as [`acquire`] does (C9):
    /// woken by the store's notifications, and a dropped future leaks no lease.
    ///
    /// # Errors
    /// As [`acquire`].
    pub async fn acquire(&self, key: &LeaseKey, wait: Duration) -> Result<Option<SessionLease>> {
        if self.inner.stop.is_cancelled() {
            return Err(LeaseError::Config("the lease session is closed".into()));
        }
        let options = AcquireOptions::ttl(self.inner.ttl).wait(wait);
        let Some(lease) = acquire(&self.inner.acquirer, key, options).await? else {
            return Ok(None);
        };
        Ok(Some(self.adopt(lease)))
    }

    fn adopt(&self, lease: Lease) -> SessionLease {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let window = lease
            .valid_until()
            .saturating_duration_since(lease.sent_at());
        let valid_until = lease.valid_until();
        {
            let mut pending = lock(&self.inner.pending);
            let merged = match *pending {
                Some(p) => Added {
                    window: p.window.min(window),
                    earliest_valid_until: p.earliest_valid_until.min(valid_until),
                },
                None => Added {
                    window,
                    earliest_valid_until: valid_until,
                },
            };
            *pending = Some(merged);
        }
        let shared = Arc::new(Shared::new(lease));
        lock(&self.inner.leases).insert(id, Arc::clone(&shared));
        self.inner.added.notify_one();
        SessionLease {
            id,
            shared,
            session: Arc::clone(&self.inner),
            done: false,
        }
    }

    /// What the renewal loop has done so far.
    pub fn stats(&self) -> SessionStats {
        SessionStats {
            held: lock(&self.inner.leases).len(),
            rounds: self.inner.rounds.load(Ordering::Relaxed),
            renew_calls: self.inner.renew_calls.load(Ordering::Relaxed),
            lost: self.inner.lost.load(Ordering::Relaxed),
        }
    }

    /// Stops renewing and releases every lease still held, then gives the
    /// store's session state back. Each lease's lost signal fires
    /// ([`LostReason::Closed`]) so no job goes on believing it holds a key.
    pub async fn close(self) {
        self.inner.stop.cancel();
        let held: Vec<Arc<Shared>> = lock(&self.inner.leases).drain().map(|(_, s)| s).collect();
        let store = &self.inner.store;
        if store.close_releases_all() {
            for shared in held {
                shared.fire(LostReason::Closed);
            }
            store.close().await;
            return;
        }
        futures_util::stream::iter(held)
            .for_each_concurrent(64, |shared| async move {
                let lease = lock(&shared.lease).clone();
                shared.fire(LostReason::Closed);
                if let Err(e) = store.release(&lease).await {
                    tracing::debug!(key = %lease.key(), error = %e, "release at session close failed");
                }
            })
            .await;
        self.inner.store.close().await;
    }
}

impl Drop for LeaseSession {
    /// A session dropped without [`close`](LeaseSession::close) stops
    /// renewing; its leases fire their lost signals and run out by their TTL.
    fn drop(&mut self) {
        if self.inner.stop.is_cancelled() {
            return;
        }
        self.inner.stop.cancel();
        for (_, shared) in lock(&self.inner.leases).drain() {
            shared.fire(LostReason::Closed);
        }
        // A store-side session would keep the keys alive as long as its
        // client lives (the handles still hold it): end it.
        if self.inner.store.tied_to_session()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            let store = Arc::clone(&self.inner.store);
            handle.spawn(async move { store.abandon().await });
        }
    }
}

/// One lease of a [`LeaseSession`]: its token, its key and its own lost signal.
///
/// Release it with [`release`](Self::release); dropping it releases on a best
/// effort basis in the background. The session goes on either way. A lease
/// whose release fails runs out by its TTL, or, on a store-side session
/// (etcd, ZooKeeper), when the session is closed or abandoned.
#[derive(Debug)]
pub struct SessionLease {
    id: u64,
    shared: Arc<Shared>,
    session: Arc<Inner>,
    done: bool,
}

impl SessionLease {
    /// The lease as last renewed.
    pub fn lease(&self) -> Lease {
        self.shared.lease()
    }

    /// The leased key.
    pub fn key(&self) -> LeaseKey {
        self.shared.key()
    }

    /// The fencing token (renewal keeps it).
    pub fn token(&self) -> FencingToken {
        self.shared.token()
    }

    /// Resolves when this lease is lost, with the reason.
    pub async fn lost(&self) -> LostReason {
        self.shared.lost().await
    }

    /// A token cancelled when this lease is lost, to hand to the job.
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.lost.clone()
    }

    /// True once the lost signal has fired.
    pub fn is_lost(&self) -> bool {
        self.shared.lost.is_cancelled()
    }

    /// Why the lease was lost, once it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason()
    }

    /// Takes the lease out of the session and releases it in the store; the
    /// session's other leases stay held.
    ///
    /// # Errors
    /// `NotHeld` if the lease was already lost; `Unavailable` if the store is
    /// down (the lease then runs out by its TTL).
    pub async fn release(mut self) -> Result<()> {
        self.done = true;
        lock(&self.session.leases).remove(&self.id);
        let lease = self.lease();
        self.session.store.release(&lease).await
    }
}

impl Drop for SessionLease {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let removed = lock(&self.session.leases).remove(&self.id).is_some();
        if !removed || self.is_lost() {
            return;
        }
        let lease = self.lease();
        let store = Arc::clone(&self.session.store);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(e) = store.release(&lease).await {
                        tracing::debug!(key = %lease.key(), error = %e, "best-effort release on drop failed");
                    }
                });
            }
            Err(_) => tracing::warn!(
                key = %lease.key(),
                "session lease dropped outside a tokio runtime; it runs out by its TTL"
            ),
        }
    }
}

/// Fires every lease of the session when the renewal loop ends for a reason
/// other than being stopped (a panic, a runtime shutting down).
struct FireUnlessStopped(Arc<Inner>);

impl Drop for FireUnlessStopped {
    fn drop(&mut self) {
        if !self.0.stop.is_cancelled() {
            for (_, shared) in lock(&self.0.leases).drain() {
                shared.fire(LostReason::Expired(
                    "the session's renewal task ended without being stopped".into(),
                ));
            }
        }
    }
}

async fn renew_loop(inner: Arc<Inner>, config: SessionConfig) {
    let _fire = FireUnlessStopped(Arc::clone(&inner));
    // Derived from the shortest validity window of any lease added so far
    // (a ZooKeeper session or a slow Redlock acquire shortens it).
    let mut timing: Option<Timing> = None;
    let backend = inner.provider.capabilities().backend;
    let limit = inner.store.batch_limit().max(1);
    // With no lease held, sleep until one is added.
    let mut next_round: Option<Instant> = None;
    loop {
        let wake = async {
            match next_round {
                Some(at) => sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = inner.stop.cancelled() => return,
            _ = inner.added.notified() => {
                let Some(added) = lock(&inner.pending).take() else {
                    continue;
                };
                let t = match timing {
                    Some(t) if t.window <= added.window => t,
                    _ => Timing::new(added.window, &config),
                };
                timing = Some(t);
                // Renew the new leases within a period, and never after
                // their own fire time (at once if it already passed).
                let due = (Instant::now() + t.renew_every).min(t.fire_at_of(added.earliest_valid_until));
                next_round = Some(next_round.map_or(due, |n| n.min(due)));
                continue;
            }
            () = wake => {}
        }
        let Some(t) = timing else {
            next_round = None;
            continue;
        };
        inner.rounds.fetch_add(1, Ordering::Relaxed);
        let round_started = Instant::now();
        let held: Vec<(u64, Arc<Shared>)> = lock(&inner.leases)
            .iter()
            .map(|(id, s)| (*id, Arc::clone(s)))
            .collect();
        // The round may not outlast the earliest fire time: a store that
        // hangs must not hold a lost signal back (C11).
        let round_deadline = held
            .iter()
            .map(|(_, s)| t.fire_at(&lock(&s.lease)))
            .min()
            .unwrap_or(round_started);
        let failed = Mutex::new(false);
        let round = futures_util::stream::iter(held.chunks(limit)).for_each_concurrent(
            inner.parallel,
            |chunk| {
                let inner = &inner;
                let failed = &failed;
                async move {
                    let leases: Vec<Lease> =
                        chunk.iter().map(|(_, s)| lock(&s.lease).clone()).collect();
                    inner.renew_calls.fetch_add(1, Ordering::Relaxed);
                    apply_renewal(
                        inner,
                        backend,
                        chunk,
                        inner.store.renew(&leases).await,
                        failed,
                    );
                }
            },
        );
        if tokio::time::timeout_at(round_deadline, round)
            .await
            .is_err()
        {
            tracing::warn!(
                leases = held.len(),
                "a session renewal round ran into the first lease's fire time; firing by validity"
            );
            *lock(&failed) = true;
        }
        drop(held);
        // Fire every lease whose validity runs out, and find when the next
        // round must run: the period after this round, sooner after a failure,
        // and never after a lease's fire time.
        let now = Instant::now();
        let failed = *lock(&failed);
        let mut next = if failed {
            deadline_after(now, t.retry_every)
        } else {
            deadline_after(round_started, t.renew_every)
        };
        let mut any = false;
        let mut expired = 0usize;
        lock(&inner.leases).retain(|_, shared| {
            let fire_at = t.fire_at(&lock(&shared.lease));
            if now >= fire_at {
                let last = lock(&shared.last_error).take();
                crate::record::record_lost(backend, "expired");
                inner.lost.fetch_add(1, Ordering::Relaxed);
                shared.fire(LostReason::Expired(last.unwrap_or_else(|| {
                    "the store did not answer before local validity ended".to_string()
                })));
                expired += 1;
                return false;
            }
            if shared.lost.is_cancelled() {
                return false;
            }
            next = next.min(fire_at);
            any = true;
            true
        });
        if expired > 0 && inner.store.tied_to_session() {
            abandon(&inner, backend).await;
            any = false;
        }
        next_round = any.then_some(next);
    }
}

/// Applies one batch's answers: renewed leases take their new validity, a
/// lease the store says is gone fires alone, errors are kept for the reason.
fn apply_renewal(
    inner: &Inner,
    backend: &'static str,
    chunk: &[(u64, Arc<Shared>)],
    answer: Result<Vec<Result<Lease>>>,
    failed: &Mutex<bool>,
) {
    match answer {
        Ok(results) if results.len() == chunk.len() => {
            for ((id, shared), result) in chunk.iter().zip(results) {
                match result {
                    Ok(renewed) => {
                        crate::record::record_renewal(backend, true);
                        *lock(&shared.lease) = renewed;
                    }
                    // Not for a lease released meanwhile, which left the
                    // table first.
                    Err(e) if e.is_not_held() => {
                        if lock(&inner.leases).remove(id).is_some() {
                            crate::record::record_lost(backend, "revoked");
                            inner.lost.fetch_add(1, Ordering::Relaxed);
                            shared.fire(LostReason::Revoked);
                        }
                    }
                    Err(e) => {
                        crate::record::record_renewal(backend, false);
                        *lock(failed) = true;
                        lock(&shared.last_error).replace(e.to_string());
                    }
                }
            }
        }
        Ok(results) => {
            *lock(failed) = true;
            tracing::warn!(
                sent = chunk.len(),
                answers = results.len(),
                "a session renewal answered for the wrong number of leases"
            );
        }
        Err(e) => {
            crate::record::record_renewal(backend, false);
            tracing::warn!(leases = chunk.len(), error = %e, "session renewal failed; retrying until local validity ends");
            *lock(failed) = true;
            let text = e.to_string();
            for (_, shared) in chunk {
                lock(&shared.last_error).replace(text.clone());
            }
        }
    }
}

/// A lease of a store-side session (an etcd lease, a ZooKeeper session) ran
/// out of local validity: the whole store session is in doubt, and its keys
/// must not outlive the leases that were told they are lost. Every lease of
/// the session fires, and the store ends its session (an etcd revoke, a
/// ZooKeeper session close); later acquires start a new one.
async fn abandon(inner: &Inner, backend: &'static str) {
    let rest: Vec<Arc<Shared>> = lock(&inner.leases).drain().map(|(_, s)| s).collect();
    for shared in rest {
        crate::record::record_lost(backend, "expired");
        inner.lost.fetch_add(1, Ordering::Relaxed);
        shared.fire(LostReason::Expired(
            "the store session was abandoned after another of its leases ran out of validity"
                .into(),
        ));
    }
    inner.store.abandon().await;
}

/// Lets [`acquire`] take keys through a session's store: tries go to the
/// store, watches and inspection to the provider.
#[derive(Debug)]
struct SessionAcquirer {
    provider: Arc<dyn LeaseProvider>,
    store: Arc<dyn SessionStore>,
}

#[async_trait]
impl LeaseProvider for SessionAcquirer {
    fn capabilities(&self) -> &Capabilities {
        self.provider.capabilities()
    }
    fn namespace(&self) -> &str {
        self.provider.namespace()
    }
    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.store.try_acquire(key, ttl).await
    }
    async fn extend(&self, lease: &Lease, _ttl: Duration) -> Result<Lease> {
        let mut renewed = self.store.renew(std::slice::from_ref(lease)).await?;
        renewed
            .pop()
            .unwrap_or_else(|| Err(LeaseError::protocol("a session renewal returned no answer")))
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.store.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        self.provider.inspect(key).await
    }
    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        self.provider.watch(key).await
    }
    fn watch_reports_state(&self) -> bool {
        self.provider.watch_reports_state()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::MemoryProvider;

    /// The in-memory store, whose batched renewal can be made to hang: a
    /// store that accepts the request and never answers.
    #[derive(Debug)]
    struct Hanging {
        inner: MemoryProvider,
        hang: AtomicBool,
    }

    #[async_trait]
    impl LeaseProvider for Hanging {
        fn capabilities(&self) -> &Capabilities {
            self.inner.capabilities()
        }
        fn namespace(&self) -> &str {
            self.inner.namespace()
        }
        async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
            self.inner.try_acquire(key, ttl).await
        }
        async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
            self.inner.extend(lease, ttl).await
        }
        async fn extend_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
            if self.hang.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            self.inner.extend_many(leases).await
        }
        async fn release(&self, lease: &Lease) -> Result<()> {
            self.inner.release(lease).await
        }
        async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
            self.inner.inspect(key).await
        }
    }

    /// A renewal round that never returns must not hold the lost signals
    /// back: every lease fires before its local validity ends.
    #[tokio::test(start_paused = true)]
    async fn a_hanging_renewal_does_not_delay_the_lost_signals() {
        let store = Arc::new(Hanging {
            inner: MemoryProvider::new(),
            hang: AtomicBool::new(false),
        });
        let session = LeaseSession::open(store.clone(), SessionConfig::ttl(Duration::from_secs(9)))
            .await
            .unwrap();
        let mut held = Vec::new();
        for i in 0..3 {
            let key = LeaseKey::new(format!("k{i}")).unwrap();
            held.push(session.try_acquire(&key).await.unwrap().unwrap());
        }
        store.hang.store(true, Ordering::SeqCst);
        for l in &held {
            let reason = tokio::time::timeout(Duration::from_secs(60), l.lost())
                .await
                .expect("the lost signal never fired");
            assert!(
                Instant::now() < l.lease().valid_until(),
                "fired after validity"
            );
            assert!(matches!(reason, LostReason::Expired(_)), "{reason:?}");
        }
    }

    /// A lease added with a shorter validity window than the first one is
    /// renewed (or fired) by its own window, not the first lease's period.
    #[tokio::test(start_paused = true)]
    async fn a_later_lease_with_a_shorter_window_is_renewed_in_time() {
        let store = Arc::new(Hanging {
            inner: MemoryProvider::new(),
            hang: AtomicBool::new(false),
        });
        let provider: Arc<dyn LeaseProvider> = store.clone();
        let session = LeaseSession::open(
            Arc::clone(&provider),
            SessionConfig::ttl(Duration::from_secs(30)),
        )
        .await
        .unwrap();
        let first = session
            .try_acquire(&LeaseKey::new("first").unwrap())
            .await
            .unwrap()
            .unwrap();
        // Let the loop settle on the first lease's timing.
        tokio::time::sleep(Duration::from_millis(10)).await;
        // A lease whose window is a tenth of the TTL (as a ZooKeeper session
        // or a slow Redlock acquire makes it), adopted directly.
        let short = provider
            .try_acquire(&LeaseKey::new("short").unwrap(), Duration::from_secs(30))
            .await
            .unwrap()
            .into_lease()
            .unwrap()
            .with_valid_until(Instant::now() + Duration::from_secs(3));
        let short = session.adopt(short);
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(!short.is_lost(), "{:?}", short.lost_reason());
        assert!(!first.is_lost());
        // Renewed by the store: its validity moved past the original 3 s.
        assert!(short.lease().valid_until() > Instant::now());
    }
}

//! `LeaseSession`: many leases of one process kept alive by one renewal loop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::held::{HeldLease, Shared, lock};
use crate::session_adapters::{PerLeaseStore, SessionAcquirer};
use crate::session_renew::renew_loop;
use crate::session_state::{Added, Inner};
use crate::{
    AcquireOptions, Lease, LeaseError, LeaseKey, LeaseProvider, LostReason, Result, SessionConfig,
    SessionLease, acquire,
};

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
            held: HeldLease::new(shared),
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use async_trait::async_trait;
    use tokio::time::Instant;

    use super::*;
    use crate::{Capabilities, LeaseInfo, MemoryProvider, TryAcquire};

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
        assert_eq!(held[0].lost_at(), None, "lost_at before any loss");
        for l in &held {
            let reason = tokio::time::timeout(Duration::from_secs(60), l.lost())
                .await
                .expect("the lost signal never fired");
            let fired = l.lost_at().expect("a fired lease says when");
            assert!(fired <= Instant::now(), "fired in the future");
            assert!(fired < l.lease().valid_until(), "fired after validity");
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

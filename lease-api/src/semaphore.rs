//! A counting semaphore over any provider: N permits, each a lease.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::key::MAX_KEY_BYTES;
use crate::wait::{cancel_safe_try_acquire, watch_or_fallback};
use crate::watch::MAX_BLIND_WAIT;
use crate::{Lease, LeaseError, LeaseKey, LeaseProvider, Result, TryAcquire};

/// The most permits a semaphore may have: each is a key, and a waiter
/// watches every one.
pub const MAX_PERMITS: usize = 1024;

/// At most `permits` holders at once, over any [`LeaseProvider`]
/// (DistributedLock's and Redisson's semaphores, Curator's
/// `InterProcessSemaphoreV2`).
///
/// Permit `i` of semaphore `name` is the key `name#permit/i`: holding a
/// permit is holding that key's lease, so each permit has its own fencing
/// token, is renewed like any lease (wrap it in a
/// [`LeaseGuard`](crate::LeaseGuard)), and comes back by itself when its
/// holder crashes, after its TTL. The bound is the contract's mutual
/// exclusion per key (C2), applied to `permits` keys: never more than
/// `permits` live leases exist. A waiter watches every permit and wakes on
/// the first release (or expiry); it tries the permits from a random one
/// so contenders spread out.
///
/// All users of one semaphore must agree on `permits`: a process that
/// believes there are more permits uses keys the others never look at.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lease_api::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use lease_api::MemoryProvider;
/// use lease_api::recipes::Semaphore;
///
/// let provider = Arc::new(MemoryProvider::new());
/// let pool = Semaphore::new(provider, "export-slots", 2)?;
/// let ttl = Duration::from_secs(30);
/// let a = pool.try_acquire(ttl).await?.expect("a permit is free");
/// let b = pool.try_acquire(ttl).await?.expect("a permit is free");
/// assert!(pool.try_acquire(ttl).await?.is_none(), "both permits are taken");
/// pool.release(&a).await?;
/// let c = pool.acquire(ttl, Duration::from_secs(1)).await?.expect("a's permit");
/// assert_eq!(c.slot(), a.slot());
/// assert!(c.lease().token() > a.lease().token());
/// # pool.release(&b).await?; pool.release(&c).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    provider: Arc<dyn LeaseProvider>,
    keys: Vec<LeaseKey>,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("permits", &self.keys.len())
            .field("first", &self.keys.first())
            .finish_non_exhaustive()
    }
}

/// One held permit of a [`Semaphore`]: a lease on the permit's key.
#[derive(Clone, Debug)]
pub struct Permit {
    lease: Lease,
    slot: usize,
}

impl Permit {
    /// The permit's lease: its fencing token, validity and key. Hand it to a
    /// [`LeaseGuard`](crate::LeaseGuard) to keep it past its TTL.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Which permit (0-based) this is.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The lease, for a guard or a session.
    pub fn into_lease(self) -> Lease {
        self.lease
    }
}

impl Semaphore {
    /// A semaphore of `permits` permits named `name` in `provider`'s
    /// namespace.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for 0 or more than [`MAX_PERMITS`] permits;
    /// [`LeaseError::InvalidKey`] for a name that cannot form the permit keys.
    pub fn new(provider: Arc<dyn LeaseProvider>, name: &str, permits: usize) -> Result<Self> {
        if permits == 0 || permits > MAX_PERMITS {
            return Err(LeaseError::Config(format!(
                "a semaphore has 1 to {MAX_PERMITS} permits, not {permits}"
            )));
        }
        let suffix = format!("#permit/{}", permits - 1);
        if name.len() + suffix.len() > MAX_KEY_BYTES {
            return Err(LeaseError::InvalidKey {
                reason: format!(
                    "a semaphore name may have at most {} bytes with {permits} permits",
                    MAX_KEY_BYTES - suffix.len()
                ),
            });
        }
        let keys = (0..permits)
            .map(|i| LeaseKey::new(format!("{name}#permit/{i}")))
            .collect::<Result<Vec<_>>>()?;
        Ok(Semaphore { provider, keys })
    }

    /// How many permits there are.
    pub fn permits(&self) -> usize {
        self.keys.len()
    }

    /// The key of permit `slot`, for `inspect` or a status page.
    pub fn key(&self, slot: usize) -> Option<&LeaseKey> {
        self.keys.get(slot)
    }

    /// Takes a free permit for `ttl`, trying each once; `None` when all are
    /// held.
    ///
    /// # Errors
    /// As [`LeaseProvider::try_acquire`].
    pub async fn try_acquire(&self, ttl: Duration) -> Result<Option<Permit>> {
        Ok(self.try_each(ttl).await?.0)
    }

    /// One pass over the permits from a random one: a permit, or the
    /// shortest remaining time any holder told.
    async fn try_each(&self, ttl: Duration) -> Result<(Option<Permit>, Option<Duration>)> {
        let n = self.keys.len();
        let start = usize::try_from(uuid::Uuid::new_v4().as_u128() % n as u128).unwrap_or(0);
        let mut soonest: Option<Duration> = None;
        let mut failed = None;
        for i in 0..n {
            let slot = (start + i) % n;
            match cancel_safe_try_acquire(&self.provider, &self.keys[slot], ttl).await {
                Ok(TryAcquire::Acquired(lease)) => return Ok((Some(Permit { lease, slot }), None)),
                Ok(TryAcquire::Held { remaining }) => {
                    let r = remaining.unwrap_or(MAX_BLIND_WAIT);
                    soonest = Some(soonest.map_or(r, |s| s.min(r)));
                }
                // A transient failure on one permit (its shard is down) must
                // not keep the others from being tried.
                Err(e) if e.is_transient() => failed = Some(e),
                Err(e) => return Err(e),
            }
        }
        match failed {
            // Every other permit was held: report the failure, so a waiter
            // retries with backoff.
            Some(e) => Err(e),
            None => Ok((None, soonest)),
        }
    }

    /// Takes a permit for `ttl`, waiting up to `wait` (`Duration::MAX`:
    /// forever) for one to be released or to expire. Dropping the future
    /// leaks no permit: an attempt that wins after the drop is released.
    ///
    /// # Errors
    /// As [`acquire`](crate::acquire): invalid TTL at once; a store
    /// unavailable past the wait.
    pub async fn acquire(&self, ttl: Duration, wait: Duration) -> Result<Option<Permit>> {
        self.provider.capabilities().grant_ttl(ttl)?;
        let deadline = crate::time::deadline_in(wait);
        let mut backoff = Duration::from_millis(50);
        let mut watch_retry = Duration::from_millis(100);
        loop {
            // Watch every permit before trying: a release in between is not missed.
            let mut watches = Vec::with_capacity(self.keys.len());
            if !wait.is_zero() {
                for key in &self.keys {
                    watches.push(watch_or_fallback(&self.provider, key, &mut watch_retry).await);
                }
            }
            let error = match self.try_each(ttl).await {
                Ok((Some(permit), _)) => return Ok(Some(permit)),
                Ok((None, soonest)) => {
                    backoff = Duration::from_millis(50);
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(None);
                    }
                    let until = soonest
                        .unwrap_or(MAX_BLIND_WAIT)
                        .saturating_add(Duration::from_millis(1))
                        .min(deadline - now);
                    let changed = watches.iter_mut().map(|w| w.changed(until));
                    futures_util::future::select_all(changed).await;
                    continue;
                }
                Err(e) => e,
            };
            if !error.is_transient() || Instant::now() + backoff >= deadline {
                return Err(error);
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// Gives `permit` back at once and wakes waiters.
    ///
    /// # Errors
    /// As [`LeaseProvider::release`]: `NotHeld` when the permit's lease
    /// ended meanwhile.
    pub async fn release(&self, permit: &Permit) -> Result<()> {
        self.provider.release(&permit.lease).await
    }
}

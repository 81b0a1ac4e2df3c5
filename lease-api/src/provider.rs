//! The `LeaseProvider` trait every backend implements, and its change watch.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;

use crate::{Capabilities, Lease, LeaseInfo, LeaseKey, Result, TryAcquire};

/// One store's implementation of the lease contract (C1..C17).
///
/// The trait is object safe: build an `Arc<dyn LeaseProvider>` from configuration
/// and hand it around. Every method is one atomic step in the store; the helpers
/// that combine them ([`acquire`](crate::acquire), [`LeaseGuard`](crate::LeaseGuard),
/// [`run_with_lease`](crate::run_with_lease)) work over any provider.
#[async_trait]
pub trait LeaseProvider: Send + Sync + fmt::Debug {
    /// What this provider guarantees (C15).
    fn capabilities(&self) -> &Capabilities;

    /// The namespace this provider works in; providers with different
    /// namespaces never see each other's keys (C1).
    fn namespace(&self) -> &str;

    /// Takes the key if it is free or expired, in one atomic store step (C2).
    ///
    /// A live lease of someone else is [`TryAcquire::Held`], not an error.
    ///
    /// # Errors
    /// `InvalidTtl` (C3), `Unavailable`/`Timeout` when the store is unreachable.
    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire>;

    /// Pushes the lease's expiry to store-now + `ttl`, keeping its token (C6).
    /// Returns the lease with its new TTL and local validity.
    ///
    /// # Errors
    /// `Lost` if this owner no longer holds the key, even if nobody took it.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease>;

    /// Frees the key at once and wakes waiters (C7).
    ///
    /// # Errors
    /// `NotHeld` if this owner does not hold the key (double release, expiry,
    /// takeover); the current holder is never touched.
    async fn release(&self, lease: &Lease) -> Result<()>;

    /// The current holder's token and remaining TTL, or `None` for a free key.
    /// Changes nothing (C13).
    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>>;

    /// Starts watching `key` for a change that may free it (C9).
    ///
    /// Call this **before** a `try_acquire` that may find the key held, then wait
    /// on the returned watch: a release between the two is not missed. The
    /// default has no notifications and only sleeps; backends override it with
    /// their store's notifications.
    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        let _ = key;
        Ok(Box::new(SleepWatch))
    }

    /// Whether a watch set up **after** a `try_acquire` that found the key held
    /// still cannot miss a release in between: true when [`watch`](Self::watch)
    /// looks at the key's current state as it registers and reports a key
    /// that is free already as changed (ZooKeeper's exists watch does). Then
    /// [`acquire`] tries first and sets the watch up only when the key is
    /// held, so a waiter woken by a release needs one store step to take the
    /// key, not two. Default `false`: watch first, then try.
    fn watch_reports_state(&self) -> bool {
        false
    }

    /// Extends many leases, each by its own [`Lease::ttl`], in as few store
    /// round trips as the store allows, each compared by owner and token in
    /// the store (C6 per lease). One answer per lease, in order: a lease no
    /// longer held is `Lost` and changes nothing for the others.
    ///
    /// The default runs [`extend`](Self::extend) for each lease, all at once;
    /// batching backends take up to [`batch_limit`](Self::batch_limit) leases
    /// in one call. A [`LeaseSession`](crate::LeaseSession) renews with it.
    ///
    /// # Errors
    /// `Unavailable`/`Timeout` for the whole call when the store did not
    /// answer: nothing is known about any of the leases then.
    async fn extend_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        Ok(futures_util::future::join_all(leases.iter().map(|l| self.extend(l, l.ttl()))).await)
    }

    /// The most leases one [`extend_many`](Self::extend_many) call takes;
    /// a session splits its renewals into batches of this size.
    fn batch_limit(&self) -> usize {
        64
    }

    /// The store-side session a [`LeaseSession`](crate::LeaseSession) runs
    /// on, for stores that tie many keys to one renewal (an etcd lease, a
    /// ZooKeeper session). Default `None`: the session takes keys with
    /// [`try_acquire`](Self::try_acquire) and renews them with
    /// [`extend_many`](Self::extend_many).
    ///
    /// # Errors
    /// The store's error setting the session up.
    async fn session_store(
        &self,
        ttl: Duration,
    ) -> Result<Option<Arc<dyn crate::backend::SessionStore>>> {
        let _ = ttl;
        Ok(None)
    }

    /// Waits, up to `limit`, for background work that keeps the store clean,
    /// such as cancelling an acquire that timed out but may still run. Call it
    /// before a short-lived process exits (the `lease` command does). Default:
    /// nothing to wait for.
    async fn flush(&self, limit: Duration) {
        let _ = limit;
    }

    /// The store's queues of waiters, for fair waiting (C17): `Some` exactly
    /// when [`Capabilities::fair_waiting`](crate::Capabilities::fair_waiting)
    /// is declared. Default `None`.
    fn wait_queue(&self) -> Option<&dyn crate::backend::WaitQueue> {
        None
    }
}

/// A registered interest in one key, returned by [`LeaseProvider::watch`].
#[async_trait]
pub trait KeyWatch: Send {
    /// Resolves when the key may have changed, or when `max` has passed, which
    /// ever is first. Spurious wake-ups are allowed: callers retry `try_acquire`.
    async fn changed(&mut self, max: Duration);
}

/// The default watch: no notifications, sleeps for the whole allowance.
#[derive(Debug)]
pub struct SleepWatch;

#[async_trait]
impl KeyWatch for SleepWatch {
    async fn changed(&mut self, max: Duration) {
        tokio::time::sleep(max).await;
    }
}

/// Stands in for a watch whose set-up failed for a reason that may pass (the
/// notification connection was cut while subscribing): wakes after `cap` at
/// most, so the next round sets the watch up again instead of sleeping
/// through a release nobody could announce.
struct RetryWatch {
    cap: Duration,
}

#[async_trait]
impl KeyWatch for RetryWatch {
    async fn changed(&mut self, max: Duration) {
        tokio::time::sleep(max.min(self.cap)).await;
    }
}

/// The first retry after a watch failed transiently; doubled up to
/// [`WATCH_RETRY_MAX`] while it keeps failing.
const WATCH_RETRY_MIN: Duration = Duration::from_millis(100);
/// The longest a waiter goes without trying to set its watch up again.
const WATCH_RETRY_MAX: Duration = Duration::from_secs(2);

/// A watch woken by a [`Notify`]: backends keep one `Notify` per watched key and
/// call `notify_waiters` when a notification for that key arrives (or when their
/// notification channel breaks, so waiters retry instead of missing a release).
///
/// The watch registers itself at construction, so a `notify_waiters` between
/// [`NotifyWatch::new`] and [`KeyWatch::changed`] is not lost.
pub struct NotifyWatch {
    notify: Arc<Notify>,
    pending: Pin<Box<OwnedNotified>>,
}

impl fmt::Debug for NotifyWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NotifyWatch").finish_non_exhaustive()
    }
}

impl NotifyWatch {
    /// Registers interest in `notify` now.
    pub fn new(notify: Arc<Notify>) -> Self {
        let mut pending = Box::pin(Arc::clone(&notify).notified_owned());
        pending.as_mut().enable();
        NotifyWatch { notify, pending }
    }
}

#[async_trait]
impl KeyWatch for NotifyWatch {
    async fn changed(&mut self, max: Duration) {
        if tokio::time::timeout(max, self.pending.as_mut())
            .await
            .is_ok()
        {
            let mut next = Box::pin(Arc::clone(&self.notify).notified_owned());
            next.as_mut().enable();
            self.pending = next;
        }
    }
}

/// The longest a waiter sleeps between attempts when the store did not say how
/// long the holder's lease runs: a safety net for a lost notification, not a poll.
pub const MAX_BLIND_WAIT: Duration = Duration::from_secs(5);

/// What [`acquire`] asks for: the lease's TTL, and how long to wait while the
/// key is held by someone else.
///
/// The two are both durations, so they are named here instead of passed side by
/// side, where swapping them compiles and waits for the TTL instead:
///
/// ```
/// use std::time::Duration;
/// use lease_api::AcquireOptions;
///
/// let options = AcquireOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(5));
/// assert_eq!(options.wait, Duration::from_secs(5));
/// // Without `wait`, a held key is answered at once.
/// assert!(AcquireOptions::ttl(Duration::from_secs(30)).wait.is_zero());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcquireOptions {
    /// The lease's time to live, checked against the provider's limits (C3).
    pub ttl: Duration,
    /// How long to wait for a held key; zero answers at once,
    /// `Duration::MAX` waits forever.
    pub wait: Duration,
    /// Wait in the key's queue of waiters, served in arrival order (C17);
    /// see [`fair`](Self::fair).
    pub fair: bool,
}

impl AcquireOptions {
    /// A lease of `ttl`, not waiting for a held key.
    pub fn ttl(ttl: Duration) -> Self {
        AcquireOptions {
            ttl,
            wait: Duration::ZERO,
            fair: false,
        }
    }

    /// Waits in arrival order (C17): the waiter takes a ticket in the key's
    /// queue of waiters in the store, is woken only when the ticket ahead of
    /// it leaves, and alone among the queue watches the key once it is
    /// first. No herd wakes on a release, and the longest wait is bounded by
    /// the holds ahead. Fairness holds among fair waiters; a plain acquire
    /// may still take a freed key first. Costs a few store round trips per
    /// acquire (join, place, leave). A fair acquire that does not wait takes
    /// a free key only when no fair waiter is queued.
    ///
    /// Backends without a queue of waiters answer
    /// [`LeaseError::Config`](crate::LeaseError::Config); see
    /// [`Capabilities::fair_waiting`](crate::Capabilities::fair_waiting).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use lease_api::{acquire, AcquireOptions, LeaseKey, LeaseProvider, MemoryProvider};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lease_api::Result<()> {
    /// let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
    /// let key = LeaseKey::new("settlement/batch-7")?;
    /// let options = AcquireOptions::ttl(Duration::from_secs(30))
    ///     .wait(Duration::from_secs(5))
    ///     .fair();
    /// let lease = acquire(&provider, &key, options).await?.expect("a free key");
    /// provider.release(&lease).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn fair(mut self) -> Self {
        self.fair = true;
        self
    }

    /// Waits up to `wait` while the key is held.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Waits until the key is acquired, however long that takes.
    pub fn wait_forever(self) -> Self {
        self.wait(Duration::MAX)
    }
}

/// Acquires `key`, waiting up to `wait` for it to become free (C9).
///
/// Returns `Ok(None)` when `wait` runs out with the key still held. Waiting uses
/// the provider's notifications, with a retry when the holder's remaining TTL
/// runs out as a fallback. Each attempt runs in its own task: if this future is
/// dropped while an attempt is in flight and that attempt wins, the lease is
/// released at once, so a dropped waiter never leaks a lease.
///
/// While waiting, a store that is briefly unavailable is retried (with backoff)
/// until the wait runs out; then its error is returned. Errors a retry cannot
/// fix (see [`LeaseError::is_transient`](crate::LeaseError::is_transient)) are returned at once. A `wait` of
/// `Duration::MAX` waits forever. When the provider cannot set up a watch, the
/// waiter falls back to retrying when the holder's TTL runs out.
///
/// # Errors
/// Invalid TTL at once; `Unavailable`/`Timeout` when the store could not be
/// reached before the wait ran out (at once when `wait` is zero); a permanent
/// store error (`Backend`: permissions, a wrong type, a missing table) at once.
pub async fn acquire<P>(
    provider: &Arc<P>,
    key: &LeaseKey,
    options: AcquireOptions,
) -> Result<Option<Lease>>
where
    P: LeaseProvider + ?Sized + 'static,
{
    let AcquireOptions { ttl, wait, fair } = options;
    let started = Instant::now();
    let mut waited = Duration::ZERO;
    let result = if fair {
        crate::fair::acquire_fair(provider, key, ttl, wait, &mut waited).await
    } else {
        acquire_waiting(provider, key, ttl, wait, &mut waited).await
    };
    let outcome = match &result {
        Ok(Some(_)) => "acquired",
        Ok(None) => "not_acquired",
        Err(e) => crate::observe::error_outcome(e),
    };
    crate::observe::record_acquire(
        provider.capabilities().backend,
        outcome,
        started.elapsed(),
        waited,
    );
    result
}

pub(crate) async fn acquire_waiting<P>(
    provider: &Arc<P>,
    key: &LeaseKey,
    ttl: Duration,
    wait: Duration,
    waited: &mut Duration,
) -> Result<Option<Lease>>
where
    P: LeaseProvider + ?Sized + 'static,
{
    // `Duration::MAX` (or any wait past the far future) means "wait forever".
    let deadline = crate::backend::deadline_in(wait);
    let mut backoff = Duration::from_millis(50);
    let mut watch_retry = WATCH_RETRY_MIN;
    loop {
        let error = match attempt(provider, key, ttl, wait.is_zero(), &mut watch_retry).await {
            Ok((TryAcquire::Acquired(lease), _)) => return Ok(Some(lease)),
            Ok((TryAcquire::Held { remaining }, watch)) => {
                backoff = Duration::from_millis(50);
                let now = Instant::now();
                let Some(mut watch) = watch.filter(|_| now < deadline) else {
                    return Ok(None);
                };
                // Wake on the store's notification, or when the holder's lease
                // would end, or at the deadline, whichever comes first.
                let until_expiry = remaining
                    .map(|r| r.saturating_add(Duration::from_millis(1)))
                    .unwrap_or(MAX_BLIND_WAIT);
                watch.changed(until_expiry.min(deadline - now)).await;
                *waited += now.elapsed();
                continue;
            }
            Err(e) => e,
        };
        // A store blip while waiting: retry until the wait runs out, then report it.
        let now = Instant::now();
        if !error.is_transient() || now + backoff >= deadline {
            return Err(error);
        }
        tracing::debug!(key = %key, error = %error, "store unavailable while waiting; retrying");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// One round: register a watch (unless not waiting), then try; or, for a
/// provider whose watch reports the key's state, try first and watch only a
/// held key.
async fn attempt<P>(
    provider: &Arc<P>,
    key: &LeaseKey,
    ttl: Duration,
    no_wait: bool,
    watch_retry: &mut Duration,
) -> Result<(TryAcquire, Option<Box<dyn KeyWatch>>)>
where
    P: LeaseProvider + ?Sized + 'static,
{
    if provider.watch_reports_state() {
        let tried = cancel_safe_try_acquire(provider, key, ttl).await?;
        if no_wait || matches!(tried, TryAcquire::Acquired(_)) {
            return Ok((tried, None));
        }
        let watch = watch_or_fallback(provider, key, watch_retry).await;
        return Ok((tried, Some(watch)));
    }
    let watch = if no_wait {
        None
    } else {
        Some(watch_or_fallback(provider, key, watch_retry).await)
    };
    Ok((cancel_safe_try_acquire(provider, key, ttl).await?, watch))
}

/// A watch on `key`, or a stand-in when it cannot be set up: a watch that
/// cannot be set up must not block a free key, so the try goes ahead. A
/// transient failure (a connection cut while subscribing) is retried soon,
/// with backoff; a lasting one (a user without pub/sub permission) waits by
/// the holder's TTL.
pub(crate) async fn watch_or_fallback<P>(
    provider: &Arc<P>,
    key: &LeaseKey,
    watch_retry: &mut Duration,
) -> Box<dyn KeyWatch>
where
    P: LeaseProvider + ?Sized + 'static,
{
    match provider.watch(key).await {
        Ok(w) => {
            *watch_retry = WATCH_RETRY_MIN;
            w
        }
        Err(e) if e.is_transient() => {
            tracing::debug!(key = %key, error = %e, retry = ?*watch_retry, "cannot watch the key now; trying again soon");
            let w = RetryWatch { cap: *watch_retry };
            *watch_retry = watch_retry.saturating_mul(2).min(WATCH_RETRY_MAX);
            Box::new(w)
        }
        Err(e) => {
            tracing::debug!(key = %key, error = %e, "cannot watch the key; waiting by the holder's TTL instead");
            Box::new(SleepWatch)
        }
    }
}

pub(crate) async fn cancel_safe_try_acquire<P>(
    provider: &Arc<P>,
    key: &LeaseKey,
    ttl: Duration,
) -> Result<TryAcquire>
where
    P: LeaseProvider + ?Sized + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let p = Arc::clone(provider);
    let k = key.clone();
    tokio::spawn(async move {
        let outcome = p.try_acquire(&k, ttl).await;
        // The receiver is gone when the caller dropped its future: give the
        // lease back instead of leaking it until its TTL.
        if let Err(Ok(TryAcquire::Acquired(lease))) = tx.send(outcome)
            && let Err(e) = p.release(&lease).await
        {
            tracing::warn!(key = %lease.key(), error = %e, "could not release the lease of a dropped acquire");
        }
    });
    let mut pending = Pending {
        rx: Some(rx),
        provider: Arc::clone(provider),
    };
    let answer = match pending.rx.as_mut() {
        Some(rx) => rx.await,
        None => return Err(crate::LeaseError::protocol("no acquire in flight")),
    };
    pending.rx = None;
    match answer {
        Ok(outcome) => outcome,
        Err(_) => Err(crate::LeaseError::protocol(
            "the acquire task ended without an answer (the runtime is shutting down)",
        )),
    }
}

/// The answer of an acquire task not yet taken. Dropped with the caller's
/// future, it closes the channel (so a later answer is released by the
/// task) and releases an answer that arrived already: between the task's
/// send and the caller's next poll, a won lease would otherwise sit in the
/// channel, unreleased and unrenewed, until its TTL.
struct Pending<P: LeaseProvider + ?Sized + 'static> {
    rx: Option<tokio::sync::oneshot::Receiver<Result<TryAcquire>>>,
    provider: Arc<P>,
}

impl<P: LeaseProvider + ?Sized + 'static> Drop for Pending<P> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        rx.close();
        if let Ok(Ok(TryAcquire::Acquired(lease))) = rx.try_recv()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let p = Arc::clone(&self.provider);
            runtime.spawn(async move {
                if let Err(e) = p.release(&lease).await {
                    tracing::warn!(key = %lease.key(), error = %e, "could not release the lease of a dropped acquire");
                }
            });
        }
    }
}

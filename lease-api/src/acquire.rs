//! [`acquire`]: one call that tries, waits (plainly or in the key's queue of
//! waiters) and records what happened.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::provider::LeaseProvider;
use crate::{Lease, LeaseKey, Result};

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
        crate::fair::acquire_fair(
            provider,
            key,
            ttl,
            wait,
            &mut waited,
            crate::fair::Take::Plain,
        )
        .await
    } else {
        crate::wait::acquire_waiting(provider, key, ttl, wait, &mut waited).await
    };
    let outcome = match &result {
        Ok(Some(_)) => "acquired",
        Ok(None) => "not_acquired",
        Err(e) => crate::record::error_outcome(e),
    };
    crate::record::record_acquire(
        provider.capabilities().backend,
        outcome,
        started.elapsed(),
        waited,
    );
    result
}

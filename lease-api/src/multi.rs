//! [`acquire_all`]: every key of a set or none, waiting while one is held
//! (C18); every attempt in a task of its own, so a dropped waiter leaks no key.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::provider::LeaseProvider;
use crate::wait::watch_or_fallback;
use crate::watch::{KeyWatch, MAX_BLIND_WAIT};
use crate::{AcquireOptions, Lease, LeaseError, LeaseKey, Result, TryAcquireAll};

/// Acquires every key of `keys` or none, waiting up to `options.wait` while
/// one of them is held (C18).
///
/// Returns one lease per key, in the order of `keys`, each with its own
/// fencing token; `Ok(None)` when the wait ran out with a key still held,
/// and then no key is held by this call (on a provider without one-step
/// sets, unless a give-back of a partly taken set found the store down: see
/// [`LeaseProvider::try_acquire_all`]). Each attempt is one
/// [`LeaseProvider::try_acquire_all`]: one atomic store step where the
/// provider declares [`MultiKey::atomic`](crate::backend::MultiKey::atomic),
/// otherwise the keys in key order, with the taken ones given back on a miss.
/// Either way two callers with overlapping sets never deadlock, whatever
/// order they name their keys in.
///
/// A waiter watches the key it found held (registered before it tries again,
/// so a release in between is not missed) and retries when that holder's TTL
/// runs out. Each attempt runs in its own task: if this future is dropped
/// while an attempt is in flight and the attempt wins, every key is given
/// back at once.
///
/// Hold the set with a [`LeaseSetGuard`](crate::LeaseSetGuard) to renew it
/// together and lose it together; give it back with [`release_all`].
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use lease_api::{acquire_all, release_all, AcquireOptions, LeaseKey, LeaseProvider, MemoryProvider};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lease_api::Result<()> {
/// let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
/// let keys = [LeaseKey::new("account/17")?, LeaseKey::new("account/4")?];
/// let options = AcquireOptions::ttl(Duration::from_secs(30)).wait(Duration::from_secs(5));
/// let leases = acquire_all(&provider, &keys, options).await?.expect("both free");
/// assert_eq!(leases[0].key(), &keys[0]);
/// assert_eq!(leases[1].key(), &keys[1]);
/// release_all(&*provider, &leases).await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// `Config` for an empty set, a key named twice, more keys than the provider
/// takes at once, or a [`fair`](AcquireOptions::fair) wait (sets wait
/// plainly); `InvalidTtl`; `Unavailable`/`Timeout` when the store could not
/// be reached before the wait ran out; a permanent store error at once.
pub async fn acquire_all<P>(
    provider: &Arc<P>,
    keys: &[LeaseKey],
    options: AcquireOptions,
) -> Result<Option<Vec<Lease>>>
where
    P: LeaseProvider + ?Sized + 'static,
{
    let started = Instant::now();
    let mut waited = Duration::ZERO;
    let result = acquire_all_waiting(provider, keys, options, &mut waited).await;
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

async fn acquire_all_waiting<P>(
    provider: &Arc<P>,
    keys: &[LeaseKey],
    options: AcquireOptions,
    waited: &mut Duration,
) -> Result<Option<Vec<Lease>>>
where
    P: LeaseProvider + ?Sized + 'static,
{
    let AcquireOptions { ttl, wait, fair } = options;
    if fair {
        return Err(LeaseError::Config(
            "a set of keys waits plainly: fair (queued) waiting is for one key".into(),
        ));
    }
    // Refuse a bad set before the first attempt, so a waiter never sleeps on one.
    crate::key::validate_key_set(keys, provider.capabilities().multi_key.max_keys)?;
    provider.capabilities().grant_ttl(ttl)?;
    let deadline = crate::time::deadline_in(wait);
    let mut backoff = Duration::from_millis(50);
    let mut watch_retry = Duration::from_millis(100);
    // The watch on the key the last attempt found held, set up before the
    // next attempt so a release between the two is not missed.
    let mut watching: Option<(LeaseKey, Box<dyn KeyWatch>)> = None;
    loop {
        let error = match cancel_safe_try_acquire_all(provider, keys, ttl).await {
            Ok(TryAcquireAll::Acquired(leases)) => return Ok(Some(leases)),
            Ok(TryAcquireAll::Held { key, remaining }) => {
                backoff = Duration::from_millis(50);
                let now = Instant::now();
                if wait.is_zero() || now >= deadline {
                    return Ok(None);
                }
                match watching.take() {
                    // Watched since before this attempt: sleep until it changes.
                    Some((watched, mut watch)) if watched == key => {
                        let until_expiry = remaining
                            .map(|r| r.saturating_add(Duration::from_millis(1)))
                            .unwrap_or(MAX_BLIND_WAIT);
                        watch.changed(until_expiry.min(deadline - now)).await;
                        *waited += now.elapsed();
                    }
                    // A key not watched yet: watch it, then try again at once.
                    _ => {}
                }
                let watch = watch_or_fallback(provider, &key, &mut watch_retry).await;
                watching = Some((key, watch));
                continue;
            }
            Err(e) => e,
        };
        let now = Instant::now();
        if !error.is_transient() || now + backoff >= deadline {
            return Err(error);
        }
        tracing::debug!(error = %error, "store unavailable while waiting for a set of keys; retrying");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// Gives back every lease of a set, all at once (C7 per lease). Every lease
/// is released even when one fails; the first error is returned.
///
/// # Errors
/// The first lease's error, as [`LeaseProvider::release`] reports it.
pub async fn release_all<P>(provider: &P, leases: &[Lease]) -> Result<()>
where
    P: LeaseProvider + ?Sized,
{
    let answers =
        futures_util::future::join_all(leases.iter().map(|lease| provider.release(lease))).await;
    answers.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
}

/// One [`LeaseProvider::try_acquire_all`] in a task of its own; a set won
/// after the caller stopped listening is given back.
async fn cancel_safe_try_acquire_all<P>(
    provider: &Arc<P>,
    keys: &[LeaseKey],
    ttl: Duration,
) -> Result<TryAcquireAll>
where
    P: LeaseProvider + ?Sized + 'static,
{
    let (p, set) = (Arc::clone(provider), keys.to_vec());
    crate::attempt::in_own_task(
        provider,
        async move { p.try_acquire_all(&set, ttl).await },
        None,
    )
    .await
}

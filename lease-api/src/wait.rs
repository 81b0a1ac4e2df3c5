//! Plain waiting for a key: watch, try, sleep until the next chance; every
//! attempt in a task of its own, so a dropped waiter never leaks a lease.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::provider::LeaseProvider;
use crate::watch::{KeyWatch, MAX_BLIND_WAIT, SleepWatch};
use crate::{Lease, LeaseKey, Result, TryAcquire};

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
    let deadline = crate::time::deadline_in(wait);
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
    let (p, k) = (Arc::clone(provider), key.clone());
    crate::attempt::in_own_task(provider, async move { p.try_acquire(&k, ttl).await }, None).await
}

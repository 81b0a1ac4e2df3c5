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

//! The wait of a read/write acquire (C19): try, and watch the lease while it
//! is held, every attempt in a task of its own. [`crate::rw`]'s acquires and
//! the fair path's last step (once first in line) both run it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::OwnerId;
use crate::provider::LeaseProvider;
use crate::watch::{KeyWatch, MAX_BLIND_WAIT, SleepWatch};
use crate::{Lease, LeaseKey, Result, TryAcquire};

/// Waits up to `wait` for `key`'s read/write lease: as a reader when
/// `writer` is `None`, else as the writer with that waiting record.
pub(crate) async fn wait_rw<P>(
    provider: &Arc<P>,
    key: &LeaseKey,
    ttl: Duration,
    wait: Duration,
    writer: Option<Option<OwnerId>>,
) -> Result<Option<Lease>>
where
    P: LeaseProvider + ?Sized + 'static,
{
    let granted = provider.capabilities().grant_ttl(ttl)?;
    let deadline = crate::time::deadline_in(wait);
    let mut backoff = Duration::from_millis(50);
    loop {
        // Registered before the try, so a release in between is not missed.
        // A writer's record lasts one TTL: setting up a watch may not take
        // the time it needs to renew it.
        let mut watch: Option<Box<dyn KeyWatch>> = if wait.is_zero() {
            None
        } else {
            let limit = if writer.is_some() {
                granted / 2
            } else {
                Duration::MAX
            };
            let set_up = tokio::time::timeout(limit, provider.watch_rw(key)).await;
            Some(match set_up {
                Ok(Ok(w)) => w,
                Ok(Err(e)) => {
                    tracing::debug!(key = %key, error = %e, "cannot watch the read/write lease; waiting by its holders' TTL");
                    Box::new(SleepWatch)
                }
                Err(_) => Box::new(SleepWatch),
            })
        };
        let error = match attempt(provider, key, ttl, writer).await {
            Ok(TryAcquire::Acquired(lease)) => return Ok(Some(lease)),
            Ok(TryAcquire::Held { remaining }) => {
                backoff = Duration::from_millis(50);
                let now = Instant::now();
                let Some(mut w) = watch.take().filter(|_| now < deadline) else {
                    return Ok(None);
                };
                let mut nap = remaining
                    .map(|r| r.saturating_add(Duration::from_millis(1)))
                    .unwrap_or(MAX_BLIND_WAIT);
                if writer.is_some() {
                    // The waiting record lasts one TTL: renew it well before.
                    nap = nap.min(granted / 2);
                }
                w.changed(nap.min(deadline - now)).await;
                continue;
            }
            Err(e) => e,
        };
        let now = Instant::now();
        if !error.is_transient() || now + backoff >= deadline {
            return Err(error);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
        if writer.is_some() {
            backoff = backoff.min(granted / 2);
        }
    }
}

/// One try in a task of its own: a lease won after the caller stopped
/// listening is given back; a writer's waiting record that attempt made is
/// withdrawn after it (the drop's own withdrawal may have run before the
/// attempt recorded it again).
async fn attempt<P>(
    provider: &Arc<P>,
    key: &LeaseKey,
    ttl: Duration,
    writer: Option<Option<OwnerId>>,
) -> Result<TryAcquire>
where
    P: LeaseProvider + ?Sized + 'static,
{
    let (p, k) = (Arc::clone(provider), key.clone());
    let unheard: Option<crate::attempt::Unheard<P>> = match writer {
        Some(Some(id)) => {
            let k = key.clone();
            Some(Box::new(move |p: Arc<P>| {
                Box::pin(async move {
                    if let Err(e) = p.withdraw_writer(&k, id).await {
                        tracing::debug!(key = %k, error = %e, "could not withdraw a dropped writer; its record ends with its TTL");
                    }
                })
            }))
        }
        _ => None,
    };
    crate::attempt::in_own_task(
        provider,
        async move {
            match writer {
                None => p.try_acquire_read(&k, ttl).await,
                Some(waiting) => p.try_acquire_write(&k, ttl, waiting).await,
            }
        },
        unheard,
    )
    .await
}

//! [`acquire_read`] and [`acquire_write`]: waiting for a read/write lease
//! (C19), every attempt in a task of its own so a dropped waiter leaks no
//! lease, and a waiting writer's record withdrawn when it gives up.

use std::sync::Arc;
use std::time::Duration;

use crate::lease::OwnerId;
use crate::provider::LeaseProvider;
use crate::{AcquireOptions, Lease, LeaseError, LeaseKey, Result};

/// Acquires `key`'s read/write lease as a reader, waiting up to
/// `options.wait` while a writer holds it or waits for it (C19).
///
/// Any number of readers hold the key at once. A writer that waits keeps new
/// readers out, so a stream of readers cannot starve it; a reader that
/// crashed holds writers up only until its TTL. The lease carries the last
/// writer's token as its [`writer_epoch`](crate::LeaseKind::Read), for
/// [`FenceGate::read`](crate::FenceGate::read). Renew it with a
/// [`LeaseGuard`](crate::LeaseGuard) and give it back with
/// [`LeaseProvider::release`], as any lease.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use lease_api::{acquire_read, acquire_write, AcquireOptions, LeaseKey, LeaseProvider, MemoryProvider};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lease_api::Result<()> {
/// let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
/// let key = LeaseKey::new("partitions/2026-12")?;
/// let options = AcquireOptions::ttl(Duration::from_secs(30));
/// let a = acquire_read(&provider, &key, options).await?.expect("no writer");
/// let b = acquire_read(&provider, &key, options).await?.expect("readers share");
/// assert!(acquire_write(&provider, &key, options).await?.is_none(), "readers hold it");
/// provider.release(&a).await?;
/// provider.release(&b).await?;
/// let w = acquire_write(&provider, &key, options).await?.expect("free");
/// assert!(w.token() > b.token());
/// # provider.release(&w).await?;
/// # Ok(()) }
/// ```
///
/// With [`fair`](AcquireOptions::fair), readers and writers are served in
/// the order they came (C17's queue of waiters): a reader behind a waiting
/// writer waits for it, and readers that come one after another at the head
/// of the line enter together. The read/write lease's fair waiters stand in a
/// line of their own, apart from the plain lease's. A fair writer that crashed
/// while first in line leaves its ticket within seconds, but its waiting
/// record keeps the reader behind it (and so the line) out for up to one TTL.
///
/// # Errors
/// `Config` for a provider without read/write leases, or a fair wait on one
/// without fair waiting; otherwise as [`acquire`](crate::acquire).
pub async fn acquire_read<P>(
    provider: &Arc<P>,
    key: &LeaseKey,
    options: AcquireOptions,
) -> Result<Option<Lease>>
where
    P: LeaseProvider + ?Sized + 'static,
{
    acquire_rw(provider, key, options, None).await
}

/// Acquires `key`'s read/write lease as its writer, waiting up to
/// `options.wait` while readers or another writer hold it (C19).
///
/// While it waits, the writer is recorded in the store as waiting, which
/// refuses new readers: the readers already in finish (or expire), and the
/// writer goes next. The record lasts one TTL from each attempt and is
/// withdrawn when the wait ends without the key (or this future is
/// dropped), so a crashed waiting writer keeps readers out for one TTL at
/// most. The writer's token is above every earlier reader's and writer's.
///
/// # Errors
/// As [`acquire_read`].
pub async fn acquire_write<P>(
    provider: &Arc<P>,
    key: &LeaseKey,
    options: AcquireOptions,
) -> Result<Option<Lease>>
where
    P: LeaseProvider + ?Sized + 'static,
{
    let waiting = (!options.wait.is_zero()).then(OwnerId::random);
    let mut withdraw = Withdraw {
        provider: Arc::clone(provider),
        key: key.clone(),
        waiting,
    };
    let result = acquire_rw(provider, key, options, Some(waiting)).await;
    // Served: the winning attempt removed the record itself.
    if matches!(result, Ok(Some(_))) {
        withdraw.waiting = None;
    }
    result
}

/// Withdraws a waiting writer's record when its wait ends without the key,
/// including when the waiting future is dropped.
struct Withdraw<P: LeaseProvider + ?Sized + 'static> {
    provider: Arc<P>,
    key: LeaseKey,
    waiting: Option<OwnerId>,
}

impl<P: LeaseProvider + ?Sized + 'static> Drop for Withdraw<P> {
    fn drop(&mut self) {
        let Some(id) = self.waiting.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (p, key) = (Arc::clone(&self.provider), self.key.clone());
        runtime.spawn(async move {
            if let Err(e) = p.withdraw_writer(&key, id).await {
                tracing::debug!(key = %key, error = %e, "could not withdraw a waiting writer; its record ends with its TTL");
            }
        });
    }
}

/// `writer`: `None` for a reader; `Some(waiting)` for a writer.
async fn acquire_rw<P>(
    provider: &Arc<P>,
    key: &LeaseKey,
    options: AcquireOptions,
    writer: Option<Option<OwnerId>>,
) -> Result<Option<Lease>>
where
    P: LeaseProvider + ?Sized + 'static,
{
    let AcquireOptions { ttl, wait, fair } = options;
    if !provider.capabilities().shared_leases {
        return Err(LeaseError::Config(format!(
            "the {} provider has no read/write leases (Capabilities::shared_leases is false)",
            provider.capabilities().backend
        )));
    }
    if fair {
        let mut waited = Duration::ZERO;
        let take = crate::fair::Take::ReadWrite(writer);
        return crate::fair::acquire_fair(provider, key, ttl, wait, &mut waited, take).await;
    }
    crate::rw_wait::wait_rw(provider, key, ttl, wait, writer).await
}

//! The `LeaseProvider` trait every backend implements.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::watch::{KeyWatch, SleepWatch};

use crate::lease::OwnerId;
use crate::{
    Capabilities, Lease, LeaseError, LeaseInfo, LeaseKey, Result, RwInfo, TryAcquire, TryAcquireAll,
};

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

    /// Takes every key of `keys` or none (C18): one lease per key, in the
    /// order asked, each with its own fencing token and owner id.
    ///
    /// The default takes the keys one after another in key order and gives
    /// back the ones it took when a later key is held or the store fails, so
    /// no two callers deadlock; others may see its first keys held for a
    /// moment. The give-back is one release per key: one the store does not
    /// answer (it went down between the acquire and the release) leaves that
    /// key held until its TTL, and is logged. Backends whose store can decide the
    /// set in one atomic step override it and declare
    /// [`MultiKey::atomic`](crate::backend::MultiKey::atomic) in
    /// [`Capabilities::multi_key`].
    ///
    /// Like [`try_acquire`](Self::try_acquire) this is one attempt; use
    /// [`acquire_all`](crate::acquire_all) to wait, which also gives the set
    /// back when its future is dropped.
    ///
    /// # Errors
    /// `Config` for an empty set, a key named twice or more keys than
    /// [`MultiKey::max_keys`](crate::backend::MultiKey::max_keys), before
    /// anything is sent; `InvalidTtl` (C3); `Unavailable`/`Timeout` when the
    /// store is unreachable (every key taken on the way is given back).
    async fn try_acquire_all(&self, keys: &[LeaseKey], ttl: Duration) -> Result<TryAcquireAll> {
        acquire_in_key_order(self, keys, ttl).await
    }

    /// Takes `key`'s read/write lease as one of its readers (C19), in one
    /// atomic store step: granted when no writer holds the key and no writer
    /// waits for it (a waiting writer keeps new readers out, so readers
    /// cannot starve it). The lease's kind is [`LeaseKind::Read`](crate::LeaseKind::Read),
    /// carrying the last writer's token; its own token is above that
    /// writer's. Extend and release it as any lease. A read/write lease is a
    /// store object of its own: the plain lease of the same key name is
    /// another one.
    ///
    /// # Errors
    /// `Config` when the provider has no read/write leases
    /// ([`Capabilities::shared_leases`]); as [`try_acquire`](Self::try_acquire) otherwise.
    async fn try_acquire_read(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        let _ = (key, ttl);
        Err(no_shared_leases(self.capabilities()))
    }

    /// Takes `key`'s read/write lease as its writer (C19), in one atomic
    /// store step: granted when no writer and no live reader holds the key.
    /// Its token is above every earlier reader's and writer's of the key.
    ///
    /// `waiting` is the id of a writer that waits for the key
    /// ([`acquire_write`](crate::acquire_write) makes one per call): while
    /// the key is held, the attempt records that writer as waiting until
    /// `ttl` from now (each attempt renews the record), which refuses new
    /// readers; the attempt that takes the key removes the record. `None`:
    /// a plain try, which records nothing.
    ///
    /// # Errors
    /// As [`try_acquire_read`](Self::try_acquire_read).
    async fn try_acquire_write(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        waiting: Option<OwnerId>,
    ) -> Result<TryAcquire> {
        let _ = (key, ttl, waiting);
        Err(no_shared_leases(self.capabilities()))
    }

    /// Ends the wait of writer `waiting` on `key` (it gave up): its record
    /// no longer keeps readers out. Nothing to do for an unknown writer.
    ///
    /// # Errors
    /// As [`try_acquire_read`](Self::try_acquire_read).
    async fn withdraw_writer(&self, key: &LeaseKey, waiting: OwnerId) -> Result<()> {
        let _ = (key, waiting);
        Err(no_shared_leases(self.capabilities()))
    }

    /// The writer, the live readers and the waiting writers of `key`'s
    /// read/write lease. Changes nothing.
    ///
    /// # Errors
    /// As [`try_acquire_read`](Self::try_acquire_read).
    async fn inspect_rw(&self, key: &LeaseKey) -> Result<RwInfo> {
        let _ = key;
        Err(no_shared_leases(self.capabilities()))
    }

    /// Starts watching `key`'s read/write lease for a change that may let a
    /// waiting reader or writer in (a release), as [`watch`](Self::watch)
    /// does for the plain lease. The default only sleeps.
    ///
    /// # Errors
    /// The store's error setting the watch up.
    async fn watch_rw(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        let _ = key;
        Ok(Box::new(SleepWatch))
    }

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
    /// [`acquire`](crate::acquire) tries first and sets the watch up only when the key is
    /// held, so a waiter woken by a release needs one store step to take the
    /// key, not two. Default `false`: watch first, then try.
    fn watch_reports_state(&self) -> bool {
        false
    }

    /// Whether a watch starts watching only when [`KeyWatch::changed`] is
    /// called, and then waits for the key to be **free** (PostgreSQL's
    /// advisory lock queue), rather than from when [`watch`](Self::watch)
    /// returns. Such a watch cannot see a handover from one holder to the
    /// next that happens before its wait starts, so an observer of holders
    /// ([`Election::observe`](crate::recipes::Election::observe)) looks again
    /// now and then. Default `false`.
    fn watch_is_lazy(&self) -> bool {
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
    ) -> Result<Option<Arc<dyn crate::session_store::SessionStore>>> {
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
    fn wait_queue(&self) -> Option<&dyn crate::queue::WaitQueue> {
        None
    }
}

/// The default [`LeaseProvider::try_acquire_all`]: the keys one after another
/// in key order (so two overlapping sets meet at their first shared key and
/// one of them goes through), giving back the taken ones, newest first, when
/// a key is held or the store fails. A backend that overrides
/// `try_acquire_all` calls it for the sets its store cannot take in one step
/// (a Redis Cluster's keys in different slots).
///
/// # Errors
/// As [`LeaseProvider::try_acquire_all`].
pub async fn acquire_in_key_order<P: LeaseProvider + ?Sized>(
    provider: &P,
    keys: &[LeaseKey],
    ttl: Duration,
) -> Result<TryAcquireAll> {
    crate::key::validate_key_set(keys, provider.capabilities().multi_key.max_keys)?;
    provider.capabilities().grant_ttl(ttl)?;
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
    let mut taken: Vec<(usize, Lease)> = Vec::with_capacity(keys.len());
    let mut miss = None;
    for &i in &order {
        match provider.try_acquire(&keys[i], ttl).await {
            Ok(TryAcquire::Acquired(lease)) => taken.push((i, lease)),
            Ok(TryAcquire::Held { remaining }) => {
                miss = Some(Ok(TryAcquireAll::Held {
                    key: keys[i].clone(),
                    remaining,
                }));
                break;
            }
            Err(e) => {
                miss = Some(Err(e));
                break;
            }
        }
    }
    let Some(miss) = miss else {
        taken.sort_by_key(|(i, _)| *i);
        return Ok(TryAcquireAll::Acquired(
            taken.into_iter().map(|(_, lease)| lease).collect(),
        ));
    };
    for (_, lease) in taken.iter().rev() {
        if let Err(e) = provider.release(lease).await {
            tracing::warn!(key = %lease.key(), error = %e, "could not give back a key of a set that was not taken whole; it runs out by its TTL");
        }
    }
    miss
}

/// The error of a read/write lease operation on a provider without them.
fn no_shared_leases(caps: &Capabilities) -> LeaseError {
    LeaseError::Config(format!(
        "the {} provider has no read/write leases (Capabilities::shared_leases is false)",
        caps.backend
    ))
}

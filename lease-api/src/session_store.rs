//! The store side of a lease session, a trait for backend authors (leaf:
//! the provider trait names it, and the session runs on it).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::{Lease, LeaseKey, Result, TryAcquire};

/// The store side of a [`LeaseSession`](crate::LeaseSession), for backend authors.
///
/// Most backends need none: the session then takes each key with
/// [`LeaseProvider::try_acquire`](crate::LeaseProvider::try_acquire) and renews with
/// [`LeaseProvider::extend_many`](crate::LeaseProvider::extend_many). A store with a session of its own returns
/// one from [`LeaseProvider::session_store`](crate::LeaseProvider::session_store): etcd attaches every key to one
/// etcd lease, ZooKeeper ties holder nodes to the client's session.
#[async_trait]
pub trait SessionStore: Send + Sync + fmt::Debug {
    /// Takes `key` for the session, as [`LeaseProvider::try_acquire`](crate::LeaseProvider::try_acquire) does.
    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire>;

    /// Renews up to [`batch_limit`](Self::batch_limit) leases of the session
    /// in one store round trip, each compared by owner and token in the store;
    /// one answer per lease, in order. `Err` for the whole call means nothing
    /// is known about any of them (the store did not answer).
    async fn renew(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>>;

    /// Releases one lease of the session; the others stay held.
    async fn release(&self, lease: &Lease) -> Result<()>;

    /// The most leases one [`renew`](Self::renew) call takes.
    fn batch_limit(&self) -> usize;

    /// Called once when the session closes, after its leases were released
    /// (see [`close_releases_all`](Self::close_releases_all)): gives
    /// store-side session state back (an etcd lease is revoked).
    async fn close(&self) {}

    /// True when the store ties every key of the session to one store-side
    /// session (an etcd lease, a ZooKeeper session): when one lease runs out
    /// of validity, the whole session is in doubt, and the loop fires every
    /// lease and calls [`abandon`](Self::abandon).
    fn tied_to_session(&self) -> bool {
        false
    }

    /// Ends the store-side session after its leases were told they are lost,
    /// so their keys do not outlive them: an etcd lease is revoked, a
    /// ZooKeeper session closed. Later acquires start a new one.
    async fn abandon(&self) {}

    /// True when [`close`](Self::close) itself frees every key of the session
    /// in one store call (revoking the etcd lease they are attached to deletes
    /// them all), so closing skips releasing them one by one.
    fn close_releases_all(&self) -> bool {
        false
    }
}

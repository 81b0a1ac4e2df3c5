//! `SessionLease`: the handle of one lease held by a lease session.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::guard::{Shared, lock};
use crate::session_state::Inner;
use crate::{FencingToken, Lease, LeaseKey, LostReason, Result};

/// One lease of a [`LeaseSession`](crate::LeaseSession): its token, its key and its own lost signal.
///
/// Release it with [`release`](Self::release); dropping it releases on a best
/// effort basis in the background. The session goes on either way. A lease
/// whose release fails runs out by its TTL, or, on a store-side session
/// (etcd, ZooKeeper), when the session is closed or abandoned.
#[derive(Debug)]
pub struct SessionLease {
    pub(crate) id: u64,
    pub(crate) shared: Arc<Shared>,
    pub(crate) session: Arc<Inner>,
    pub(crate) done: bool,
}

impl SessionLease {
    /// The lease as last renewed.
    pub fn lease(&self) -> Lease {
        self.shared.lease()
    }

    /// The leased key.
    pub fn key(&self) -> LeaseKey {
        self.shared.key()
    }

    /// The fencing token (renewal keeps it).
    pub fn token(&self) -> FencingToken {
        self.shared.token()
    }

    /// Resolves when this lease is lost, with the reason.
    pub async fn lost(&self) -> LostReason {
        self.shared.lost().await
    }

    /// A token cancelled when this lease is lost, to hand to the job.
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.lost.clone()
    }

    /// True once the lost signal has fired.
    pub fn is_lost(&self) -> bool {
        self.shared.lost.is_cancelled()
    }

    /// Why the lease was lost, once it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason()
    }

    /// Takes the lease out of the session and releases it in the store; the
    /// session's other leases stay held.
    ///
    /// # Errors
    /// `NotHeld` if the lease was already lost; `Unavailable` if the store is
    /// down (the lease then runs out by its TTL).
    pub async fn release(mut self) -> Result<()> {
        self.done = true;
        lock(&self.session.leases).remove(&self.id);
        let lease = self.lease();
        self.session.store.release(&lease).await
    }
}

impl Drop for SessionLease {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let removed = lock(&self.session.leases).remove(&self.id).is_some();
        if !removed || self.is_lost() {
            return;
        }
        let lease = self.lease();
        let store = Arc::clone(&self.session.store);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(e) = store.release(&lease).await {
                        tracing::debug!(key = %lease.key(), error = %e, "best-effort release on drop failed");
                    }
                });
            }
            Err(_) => tracing::warn!(
                key = %lease.key(),
                "session lease dropped outside a tokio runtime; it runs out by its TTL"
            ),
        }
    }
}

//! `SessionLease`: the handle of one lease held by a lease session.

use std::sync::Arc;

use crate::Result;
use crate::held::{HeldLease, lock};
use crate::session_state::Inner;

/// One lease of a [`LeaseSession`](crate::LeaseSession): its token, its key and its own lost signal.
///
/// Release it with [`release`](Self::release); dropping it releases on a best
/// effort basis in the background. The session goes on either way. A lease
/// whose release fails runs out by its TTL, or, on a store-side session
/// (etcd, ZooKeeper), when the session is closed or abandoned.
#[derive(Debug)]
pub struct SessionLease {
    pub(crate) id: u64,
    pub(crate) held: HeldLease,
    pub(crate) session: Arc<Inner>,
    pub(crate) done: bool,
}

impl SessionLease {
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

/// A session's lease reads as the lease it holds: `lease.token()`,
/// `lease.lost()` and the rest are [`HeldLease`]'s.
impl std::ops::Deref for SessionLease {
    type Target = HeldLease;

    fn deref(&self) -> &HeldLease {
        &self.held
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

//! An extend to another TTL whose caller drops it while the move is in
//! flight: the move may land unseen, leaving the key on an etcd lease the
//! caller does not know (and, with a shorter TTL, one that can end before the
//! validity the caller still believes). A background task then settles it.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use lease_api::Lease;
use lease_api::backend::LeaseHandle;
use tokio::time::Instant;

use crate::provider::{EtcdProvider, Fence};

/// Armed while an extend's move to etcd lease `new_id` is unanswered; the
/// extend defuses it once it has an answer to give.
pub(crate) struct MoveInFlight {
    provider: Option<EtcdProvider>,
    lease: Lease,
    seen: i64,
    new_id: i64,
}

impl MoveInFlight {
    pub(crate) fn arm(provider: &EtcdProvider, lease: &Lease, seen: i64, new_id: i64) -> Self {
        MoveInFlight {
            provider: Some(provider.clone()),
            lease: lease.clone(),
            seen,
            new_id,
        }
    }

    /// The extend answers its caller: nothing to settle.
    pub(crate) fn defuse(mut self) {
        self.provider = None;
    }
}

impl Drop for MoveInFlight {
    fn drop(&mut self) {
        let Some(provider) = self.provider.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(key = %self.lease.key(), "an extend was dropped outside a runtime during its move: the move cannot be settled, and may land unseen");
            return;
        };
        let (lease, seen, new_id) = (self.lease.clone(), self.seen, self.new_id);
        runtime.spawn(async move { provider.undo_move(&lease, seen, new_id).await });
    }
}

impl EtcdProvider {
    /// After an extend was dropped during its move: fences the move off, and
    /// if it landed, moves the key back to the etcd lease the caller's
    /// `Lease` names, which the caller renews and whose validity it believes.
    /// The unused etcd lease is revoked once the key is off it. Retried until
    /// that validity ends, after which nothing the caller believes depends on
    /// it. Only an etcd lease the register still counts as this lease's takes
    /// the key back: an answered move from another copy of the lease forgot
    /// it and is revoking it.
    pub(crate) async fn undo_move(&self, lease: &Lease, seen: i64, new_id: i64) {
        let LeaseHandle::EtcdLease(old_id) = lease.handle() else {
            return;
        };
        let gave_up = || {
            tracing::warn!(key = %lease.key(), "could not settle an extend dropped during its move; if the key is still held, it may be on an etcd lease its holder does not renew");
        };
        loop {
            match self.fence_move(lease, seen, new_id).await {
                Fence::NotMoved => {
                    self.revoke_in_background(new_id);
                    return;
                }
                Fence::Moved => break,
                // `fence_move` pauses between its own attempts.
                Fence::Unknown if Instant::now() < lease.valid_until() => {}
                Fence::Unknown => return gave_up(),
            }
        }
        if !self.is_issued(old_id) {
            return gave_up();
        }
        let key = self.etcd_key(lease.key());
        loop {
            let mut compares = self.held_compares(lease);
            compares.push(Compare::lease(key.clone(), CompareOp::Equal, new_id));
            let txn = Txn::new().when(compares).and_then(vec![TxnOp::put(
                key.clone(),
                "",
                Some(PutOptions::new().with_lease(old_id).with_ignore_value()),
            )]);
            match self
                .call("extend undo", |mut c| async move { c.txn(txn).await })
                .await
            {
                Ok(resp) if resp.succeeded() => return self.revoke_in_background(new_id),
                // The key changed since (released, moved again): nothing of
                // this move is left to undo.
                Ok(_) => return,
                Err(_) if Instant::now() < lease.valid_until() => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(_) => return gave_up(),
            }
        }
    }
}

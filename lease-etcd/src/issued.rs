//! The etcd leases this provider put its own leases' keys on, with what etcd
//! granted and when each was last renewed. A release makes one the key's
//! spare from these figures only, never from the `Lease` it is handed: a
//! caller may have rebuilt that with another TTL or time, or kept a copy from
//! before an extend moved the key to another etcd lease (whose revoke of the
//! old one may still be on its way).

use std::time::Duration;

use lease_api::backend::LeaseHandle;
use lease_api::{Lease, Result};

use crate::provider::{EtcdProvider, Issued, Spare};

impl EtcdProvider {
    fn issued(&self) -> std::sync::MutexGuard<'_, Issued> {
        self.inner
            .issued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes `lease`, just acquired for `asked` (or moved to a new etcd
    /// lease granted for it), if it is on an etcd lease of its own (a
    /// session's is the session's). Its TTL is what etcd granted.
    pub(crate) fn record_issued(&self, lease: &Lease, asked: Duration) {
        if let LeaseHandle::EtcdLease(id) = lease.handle() {
            self.issued().record(Spare {
                id,
                asked,
                granted: lease.ttl(),
                sent_at: lease.sent_at(),
            });
        }
    }

    /// After a keep-alive of `lease`'s etcd lease sent at `renewed.sent_at()`:
    /// the noted renewal moves up to it. Only the time is taken, and only for
    /// an etcd lease already noted: what etcd granted stays what the register
    /// says (a rebuilt `Lease` may claim another TTL, and a keep-alive renews
    /// to the TTL etcd granted).
    pub(crate) fn refresh_issued(&self, renewed: &Lease) {
        if let LeaseHandle::EtcdLease(id) = renewed.handle()
            && let Some(noted) = self.issued().by_id.get_mut(&id)
        {
            noted.sent_at = noted.sent_at.max(renewed.sent_at());
        }
    }

    /// The TTL etcd granted etcd lease `id`, which a keep-alive renews it
    /// to: from the register for a lease this provider handed out, else
    /// asked of etcd (a `Lease` rebuilt from its parts, as the CLI does, may
    /// claim any TTL). `None` when etcd no longer has the etcd lease.
    pub(crate) async fn granted_ttl(&self, id: i64) -> Result<Option<Duration>> {
        let noted = self.issued().by_id.get(&id).map(|s| s.granted);
        if noted.is_some() {
            return Ok(noted);
        }
        let resp = self
            .call("lease time-to-live", |mut c| async move {
                c.lease_time_to_live(id, None).await
            })
            .await?;
        Ok(u64::try_from(resp.granted_ttl())
            .ok()
            .filter(|s| *s > 0 && resp.ttl() > 0)
            .map(Duration::from_secs))
    }

    /// Whether etcd lease `id` is noted as the etcd lease of a lease this
    /// provider handed out (and no answered move has left it).
    pub(crate) fn is_issued(&self, id: i64) -> bool {
        self.issued().by_id.contains_key(&id)
    }

    /// Forgets the etcd lease of `lease`: an extend moved its key elsewhere
    /// and revokes it.
    pub(crate) fn forget_issued(&self, lease: &Lease) {
        if let LeaseHandle::EtcdLease(id) = lease.handle() {
            self.issued().by_id.remove(&id);
        }
    }

    /// After a release that deleted the key from etcd lease `deleted_from`:
    /// the lease's own etcd lease, which no longer carries the key, becomes
    /// the key's spare instead of being revoked. The next try on the key
    /// (this holder's again, or a woken waiter's of this provider) then needs
    /// no grant, and the release sends no revoke that would queue in etcd
    /// beside a woken waiter's transaction. Only an etcd lease this provider
    /// issued and still counts as the key's, the one the key was deleted
    /// from, qualifies; any other is revoked, as before.
    pub(crate) fn after_release(&self, k: String, lease: &Lease, deleted_from: Option<i64>) {
        let LeaseHandle::EtcdLease(id) = lease.handle() else {
            return;
        };
        let issued = self.issued().by_id.remove(&id);
        match issued {
            Some(spare) if deleted_from == Some(id) => self.keep_spare(k, spare),
            _ => self.revoke_in_background(id),
        }
    }
}

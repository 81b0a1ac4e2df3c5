//! The etcd side of a `LeaseSession`: every key attached to one etcd lease.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::{LeaseHandle, SessionStore};
use lease_api::{Lease, LeaseError, LeaseKey, LeaseProvider, Result, TryAcquire};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::EtcdProvider;

/// The session's etcd lease as last granted or kept alive.
#[derive(Clone, Copy, Debug)]
struct Current {
    id: i64,
    granted: Duration,
    /// When the request that last set its expiry was sent: the keys attached
    /// to it are surely held until `sent_at + granted` (C10).
    sent_at: Instant,
}

/// A `LeaseSession` on etcd: one etcd lease carries every key of the
/// session, so one keep-alive renews them all. The renewal also reads which
/// keys are still attached to it (a keys-only range read in pages of ten
/// thousand), so a key deleted behind the session's back is reported lost
/// alone. When the etcd lease itself runs out, every key goes with it and
/// the next acquire grants a new one.
#[derive(Debug)]
pub(crate) struct EtcdSessionStore {
    provider: EtcdProvider,
    ttl: Duration,
    current: Mutex<Option<Current>>,
}

impl EtcdSessionStore {
    pub(crate) fn new(provider: EtcdProvider, ttl: Duration) -> Self {
        EtcdSessionStore {
            provider,
            ttl,
            current: Mutex::new(None),
        }
    }

    /// The session's etcd lease, granted now if there is none. One not kept
    /// alive for a third of its TTL (an idle session) is kept alive first, so
    /// a new key's validity does not start in the past.
    async fn current(&self) -> Result<Current> {
        let mut slot = self.current.lock().await;
        if let Some(c) = *slot {
            if c.sent_at.elapsed() < c.granted / 3 {
                return Ok(c);
            }
            let sent_at = Instant::now();
            if self.provider.keep_alive_once(c.id).await? {
                // Renewed to the TTL it was granted.
                let c = Current { sent_at, ..c };
                *slot = Some(c);
                return Ok(c);
            }
            *slot = None;
        }
        let sent_at = Instant::now();
        let (id, granted) = self.provider.grant_lease(self.ttl).await?;
        let c = Current {
            id,
            granted,
            sent_at,
        };
        *slot = Some(c);
        Ok(c)
    }

    /// Forgets etcd lease `id` once it is known to be gone, so the next
    /// acquire grants a new one.
    async fn forget(&self, id: i64) {
        let mut slot = self.current.lock().await;
        if slot.is_some_and(|c| c.id == id) {
            *slot = None;
        }
    }
}

fn session_id(lease: &Lease) -> Option<i64> {
    match lease.handle() {
        LeaseHandle::EtcdSession(id) => Some(id),
        _ => None,
    }
}

#[async_trait]
impl SessionStore for EtcdSessionStore {
    async fn try_acquire(&self, key: &LeaseKey, _ttl: Duration) -> Result<TryAcquire> {
        for _ in 0..2 {
            let c = self.current().await?;
            match self
                .provider
                .claim(
                    key,
                    LeaseHandle::EtcdSession(c.id),
                    c.granted,
                    c.sent_at,
                    crate::provider::Unused::Leave,
                )
                .await
            {
                // The etcd lease ran out since the last renewal: take a new one.
                Err(e) if crate::provider::source_says_lease_not_found(&e) => {
                    self.forget(c.id).await;
                }
                other => return other,
            }
        }
        Err(LeaseError::Unavailable {
            message: "the session's etcd lease kept disappearing".into(),
            source: None,
        })
    }

    async fn renew(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        let Some(c) = *self.current.lock().await else {
            // The etcd lease these keys were on is gone.
            return Ok(leases.iter().map(|l| Err(LeaseError::lost(l))).collect());
        };
        let sent_at = Instant::now();
        if !self.provider.keep_alive_once(c.id).await? {
            self.forget(c.id).await;
            return Ok(leases.iter().map(|l| Err(LeaseError::lost(l))).collect());
        }
        self.provider.after_keep_alive().await;
        // Read only once the keep-alive answered: a key deleted before this
        // read is reported lost now. Read alongside it, a key deleted between
        // the read and the keep-alive was renewed for a round it no longer had.
        let attached = self.provider.keys_on(c.id).await?;
        // Renewed to the TTL it was granted.
        let granted = c.granted;
        {
            let mut slot = self.current.lock().await;
            if let Some(cur) = slot.as_mut().filter(|cur| cur.id == c.id) {
                cur.sent_at = sent_at;
            }
        }
        Ok(leases
            .iter()
            .map(|lease| {
                let on_it = session_id(lease) == Some(c.id)
                    && attached
                        .get(self.provider.store_key(lease.key()).as_bytes())
                        .and_then(|rev| u64::try_from(*rev).ok())
                        == Some(lease.token().get());
                if on_it {
                    Ok(lease.renewed(granted, sent_at))
                } else {
                    Err(LeaseError::lost(lease))
                }
            })
            .collect())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.provider.release(lease).await
    }

    fn batch_limit(&self) -> usize {
        // One keep-alive and one range scan serve every key of the session.
        usize::MAX
    }

    /// Revoking the session's etcd lease deletes every key attached to it.
    fn close_releases_all(&self) -> bool {
        true
    }

    fn tied_to_session(&self) -> bool {
        true
    }

    async fn abandon(&self) {
        self.close().await;
    }

    async fn close(&self) {
        if let Some(c) = self.current.lock().await.take()
            && let Err(e) = self.provider.revoke(c.id).await
        {
            tracing::debug!(lease_id = c.id, error = %e, "revoking the session's etcd lease failed; it runs out by its TTL");
        }
    }
}

/// The provider's own `session_store`.
pub(crate) fn open(provider: &EtcdProvider, ttl: Duration) -> Arc<dyn SessionStore> {
    Arc::new(EtcdSessionStore::new(provider.clone(), ttl))
}

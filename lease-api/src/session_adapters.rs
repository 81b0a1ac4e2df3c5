//! How a lease session reaches its provider: the per-lease store of a backend
//! without a session of its own, and the acquirer that lets `acquire` take
//! keys through the session's store.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::session_store::SessionStore;
use crate::watch::KeyWatch;
use crate::{
    Capabilities, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseProvider, Result, TryAcquire,
};

/// The session store of a backend without its own: each key by
/// `try_acquire`, renewals by `extend_many`.
#[derive(Debug)]
pub(crate) struct PerLeaseStore {
    pub(crate) provider: Arc<dyn LeaseProvider>,
}

#[async_trait]
impl SessionStore for PerLeaseStore {
    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.provider.try_acquire(key, ttl).await
    }
    async fn renew(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        self.provider.extend_many(leases).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.provider.release(lease).await
    }
    fn batch_limit(&self) -> usize {
        self.provider.batch_limit()
    }
}

/// Lets [`acquire`](fn@crate::acquire) take keys through a session's store: tries go to the
/// store, watches and inspection to the provider.
#[derive(Debug)]
pub(crate) struct SessionAcquirer {
    pub(crate) provider: Arc<dyn LeaseProvider>,
    pub(crate) store: Arc<dyn SessionStore>,
}

#[async_trait]
impl LeaseProvider for SessionAcquirer {
    fn capabilities(&self) -> &Capabilities {
        self.provider.capabilities()
    }
    fn namespace(&self) -> &str {
        self.provider.namespace()
    }
    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.store.try_acquire(key, ttl).await
    }
    async fn extend(&self, lease: &Lease, _ttl: Duration) -> Result<Lease> {
        let mut renewed = self.store.renew(std::slice::from_ref(lease)).await?;
        renewed
            .pop()
            .unwrap_or_else(|| Err(LeaseError::protocol("a session renewal returned no answer")))
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.store.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        self.provider.inspect(key).await
    }
    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        self.provider.watch(key).await
    }
    fn watch_reports_state(&self) -> bool {
        self.provider.watch_reports_state()
    }
    fn watch_is_lazy(&self) -> bool {
        self.provider.watch_is_lazy()
    }
}

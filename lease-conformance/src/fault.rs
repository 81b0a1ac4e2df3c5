//! Fault injection over any provider.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::{KeyWatch, SessionStore};
use lease_api::{
    Capabilities, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseProvider, Result, TryAcquire,
};

/// Wraps a provider and, while [`cut`](Self::cut), fails every call with
/// `Unavailable`, as if the network between this holder and the store were
/// partitioned. The store itself keeps running, so other holders see the lease
/// expire and take over: the setting of the "holder pauses past its TTL" and
/// "holder is cut off" failures.
#[derive(Debug)]
pub struct Partition {
    inner: Arc<dyn LeaseProvider>,
    cut: Arc<AtomicBool>,
}

impl Partition {
    /// Wraps `inner`, connected.
    pub fn new(inner: Arc<dyn LeaseProvider>) -> Arc<Self> {
        Arc::new(Partition {
            inner,
            cut: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Cuts (`true`) or heals (`false`) the link.
    pub fn cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }

    fn check(&self) -> Result<()> {
        check_link(&self.cut)
    }
}

fn check_link(cut: &AtomicBool) -> Result<()> {
    if cut.load(Ordering::SeqCst) {
        return Err(LeaseError::Unavailable {
            message: "the link to the store is cut (injected partition)".into(),
            source: None,
        });
    }
    Ok(())
}

/// A backend's session store behind a [`Partition`]: cut with it.
#[derive(Debug)]
struct PartitionedSession {
    inner: Arc<dyn SessionStore>,
    cut: Arc<AtomicBool>,
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl SessionStore for PartitionedSession {
    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        check_link(&self.cut)?;
        self.inner.try_acquire(key, ttl).await
    }
    async fn renew(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        check_link(&self.cut)?;
        self.inner.renew(leases).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        check_link(&self.cut)?;
        self.inner.release(lease).await
    }
    fn batch_limit(&self) -> usize {
        self.inner.batch_limit()
    }
    async fn close(&self) {
        self.inner.close().await;
    }
    fn close_releases_all(&self) -> bool {
        self.inner.close_releases_all()
    }
    fn tied_to_session(&self) -> bool {
        self.inner.tied_to_session()
    }
    async fn abandon(&self) {
        self.inner.abandon().await;
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl LeaseProvider for Partition {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    fn namespace(&self) -> &str {
        self.inner.namespace()
    }
    fn watch_reports_state(&self) -> bool {
        self.inner.watch_reports_state()
    }
    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.check()?;
        self.inner.try_acquire(key, ttl).await
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.check()?;
        self.inner.extend(lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.check()?;
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        self.check()?;
        self.inner.inspect(key).await
    }
    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        self.check()?;
        self.inner.watch(key).await
    }
    async fn flush(&self, limit: Duration) {
        self.inner.flush(limit).await;
    }
    async fn extend_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        self.check()?;
        self.inner.extend_many(leases).await
    }
    fn batch_limit(&self) -> usize {
        self.inner.batch_limit()
    }
    async fn session_store(&self, ttl: Duration) -> Result<Option<Arc<dyn SessionStore>>> {
        self.check()?;
        Ok(self.inner.session_store(ttl).await?.map(|inner| {
            Arc::new(PartitionedSession {
                inner,
                cut: Arc::clone(&self.cut),
            }) as Arc<dyn SessionStore>
        }))
    }
    fn wait_queue(&self) -> Option<&dyn lease_api::backend::WaitQueue> {
        self.inner
            .wait_queue()
            .map(|_| self as &dyn lease_api::backend::WaitQueue)
    }
}

/// The queue of waiters behind the partition: cut with the rest.
#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl lease_api::backend::WaitQueue for Partition {
    async fn join(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        mark: u64,
    ) -> Result<lease_api::backend::Ticket> {
        self.check()?;
        self.queue()?.join(key, ttl, mark).await
    }
    async fn place(
        &self,
        ticket: &lease_api::backend::Ticket,
    ) -> Result<lease_api::backend::Place> {
        self.check()?;
        self.queue()?.place(ticket).await
    }
    async fn watch_ticket(&self, ahead: &lease_api::backend::Ticket) -> Result<Box<dyn KeyWatch>> {
        self.check()?;
        self.queue()?.watch_ticket(ahead).await
    }
    async fn refresh(&self, ticket: &lease_api::backend::Ticket, ttl: Duration) -> Result<bool> {
        self.check()?;
        self.queue()?.refresh(ticket, ttl).await
    }
    async fn leave(&self, ticket: &lease_api::backend::Ticket) -> Result<()> {
        self.check()?;
        self.queue()?.leave(ticket).await
    }
}

impl Partition {
    fn queue(&self) -> Result<&dyn lease_api::backend::WaitQueue> {
        self.inner.wait_queue().ok_or_else(|| {
            LeaseError::Config("the provider behind the partition has no queue of waiters".into())
        })
    }
}

/// Wraps a provider, counts its store calls, and can make [`watch`](LeaseProvider::watch)
/// fail (a lost pub/sub permission, a notification channel that cannot be set up).
#[derive(Debug)]
pub struct Instrumented {
    inner: Arc<dyn LeaseProvider>,
    fail_watch: AtomicBool,
    try_acquires: AtomicU64,
}

impl Instrumented {
    /// Wraps `inner`, passing everything through.
    pub fn new(inner: Arc<dyn LeaseProvider>) -> Arc<Self> {
        Arc::new(Instrumented {
            inner,
            fail_watch: AtomicBool::new(false),
            try_acquires: AtomicU64::new(0),
        })
    }

    /// Makes `watch` fail with `Unavailable` (`true`) or pass through (`false`).
    pub fn fail_watch(&self, fail: bool) {
        self.fail_watch.store(fail, Ordering::SeqCst);
    }

    /// How many `try_acquire` calls went through so far.
    pub fn try_acquires(&self) -> u64 {
        self.try_acquires.load(Ordering::SeqCst)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl LeaseProvider for Instrumented {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    fn namespace(&self) -> &str {
        self.inner.namespace()
    }
    fn watch_reports_state(&self) -> bool {
        self.inner.watch_reports_state()
    }
    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.try_acquires.fetch_add(1, Ordering::SeqCst);
        self.inner.try_acquire(key, ttl).await
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.inner.extend(lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        self.inner.inspect(key).await
    }
    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        if self.fail_watch.load(Ordering::SeqCst) {
            return Err(LeaseError::Unavailable {
                message: "watching is refused (injected)".into(),
                source: None,
            });
        }
        self.inner.watch(key).await
    }
    async fn flush(&self, limit: Duration) {
        self.inner.flush(limit).await;
    }
    async fn extend_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        self.inner.extend_many(leases).await
    }
    fn batch_limit(&self) -> usize {
        self.inner.batch_limit()
    }
    async fn session_store(&self, ttl: Duration) -> Result<Option<Arc<dyn SessionStore>>> {
        self.inner.session_store(ttl).await
    }
    fn wait_queue(&self) -> Option<&dyn lease_api::backend::WaitQueue> {
        self.inner.wait_queue()
    }
}

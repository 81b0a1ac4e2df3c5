//! One forwarding layer: [`Layered`] implements every [`LeaseProvider`]
//! method once, forwarding to an inner provider and calling a [`Hook`]
//! around each store operation. Wrappers (observability, fault injection,
//! counters) are hooks, so none of them repeats the trait's method list and a
//! method added to the trait later cannot fall back to its default in one of
//! them.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tracing::Instrument;

use crate::lease::OwnerId;
use crate::queue::{Place, Ticket, WaitQueue};
use crate::session_store::SessionStore;
use crate::watch::KeyWatch;
use crate::{
    Capabilities, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseProvider, Result, RwInfo,
    TryAcquire, TryAcquireAll,
};

use crate::hook::{Answer, Hook, Op};

/// A provider that forwards every [`LeaseProvider`] method to `inner` and
/// calls its [`Hook`] around each store operation.
///
/// It is the one place that forwards the trait by hand (checked by
/// `clippy::missing_trait_methods`), so a wrapper written as a hook cannot
/// silently drop a method such as [`wait_queue`](LeaseProvider::wait_queue)
/// or [`session_store`](LeaseProvider::session_store). The session store and
/// the queue of waiters it hands out are layered too: their operations go
/// through the same hook ([`Op`]'s `Session*` and `Queue*` operations), and
/// everything else about them is the inner provider's. Its `Debug` is the
/// inner provider's.
///
/// [`Observed`](crate::Observed) is a `Layered` provider; so are the fault
/// injectors of `lease-conformance`.
pub struct Layered<P: ?Sized, H> {
    inner: Arc<P>,
    hook: Arc<H>,
    queue: QueueLayer<P, H>,
}

impl<P: ?Sized, H> Layered<P, H> {
    /// Layers `hook` over `inner`.
    pub fn with_hook(inner: Arc<P>, hook: H) -> Self {
        let hook = Arc::new(hook);
        let queue = QueueLayer {
            inner: Arc::clone(&inner),
            hook: Arc::clone(&hook),
        };
        Layered { inner, hook, queue }
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &Arc<P> {
        &self.inner
    }

    /// The hook.
    pub fn hook(&self) -> &H {
        &self.hook
    }
}

impl<P: fmt::Debug + ?Sized, H> fmt::Debug for Layered<P, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.inner, f)
    }
}

/// What an operation answered, for [`Hook::after`].
trait Answered {
    fn answer(&self) -> Answer<'_>;
}

impl Answered for TryAcquire {
    fn answer(&self) -> Answer<'_> {
        Answer::TryAcquire(self)
    }
}

impl Answered for TryAcquireAll {
    fn answer(&self) -> Answer<'_> {
        Answer::TryAcquireAll(self)
    }
}

impl Answered for RwInfo {
    fn answer(&self) -> Answer<'_> {
        Answer::RwHolders(self)
    }
}

impl Answered for Lease {
    fn answer(&self) -> Answer<'_> {
        Answer::Extended(self)
    }
}

impl Answered for Vec<Result<Lease>> {
    fn answer(&self) -> Answer<'_> {
        Answer::PerLease(self)
    }
}

impl Answered for Option<LeaseInfo> {
    fn answer(&self) -> Answer<'_> {
        Answer::Holder(self.as_ref())
    }
}

impl Answered for Option<Arc<dyn SessionStore>> {
    fn answer(&self) -> Answer<'_> {
        Answer::SessionStore(self.is_some())
    }
}

impl Answered for Ticket {
    fn answer(&self) -> Answer<'_> {
        Answer::Ticket(self)
    }
}

impl Answered for Place {
    fn answer(&self) -> Answer<'_> {
        Answer::Place(self)
    }
}

impl Answered for bool {
    fn answer(&self) -> Answer<'_> {
        Answer::Refreshed(*self)
    }
}

impl Answered for () {
    fn answer(&self) -> Answer<'_> {
        Answer::Done
    }
}

impl Answered for Box<dyn KeyWatch> {
    fn answer(&self) -> Answer<'_> {
        Answer::Done
    }
}

/// Runs one operation through `hook`: `before`, then `call` in the hook's
/// span, then `after`.
async fn through<H, T, F>(hook: &H, op: Op<'_>, call: impl FnOnce() -> F) -> Result<T>
where
    H: Hook,
    T: Answered,
    F: Future<Output = Result<T>>,
{
    hook.before(&op).await?;
    let span = hook.span(&op);
    let started = Instant::now();
    let result = call().instrument(span.clone()).await;
    hook.after(
        &op,
        result.as_ref().map(Answered::answer),
        started.elapsed(),
        &span,
    );
    result
}

/// [`through`] for an operation that cannot fail: no `before`.
async fn through_infallible<H: Hook>(hook: &H, op: Op<'_>, call: impl Future<Output = ()>) {
    let span = hook.span(&op);
    let started = Instant::now();
    call.instrument(span.clone()).await;
    hook.after(&op, Ok(Answer::Done), started.elapsed(), &span);
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: LeaseProvider + ?Sized, H: Hook> LeaseProvider for Layered<P, H> {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    fn namespace(&self) -> &str {
        self.inner.namespace()
    }

    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        through(&*self.hook, Op::TryAcquire { key, ttl }, || {
            self.inner.try_acquire(key, ttl)
        })
        .await
    }

    async fn try_acquire_all(&self, keys: &[LeaseKey], ttl: Duration) -> Result<TryAcquireAll> {
        through(&*self.hook, Op::TryAcquireAll { keys, ttl }, || {
            self.inner.try_acquire_all(keys, ttl)
        })
        .await
    }

    async fn try_acquire_read(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        through(&*self.hook, Op::TryAcquireRead { key, ttl }, || {
            self.inner.try_acquire_read(key, ttl)
        })
        .await
    }

    async fn try_acquire_write(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        waiting: Option<OwnerId>,
    ) -> Result<TryAcquire> {
        through(
            &*self.hook,
            Op::TryAcquireWrite { key, ttl, waiting },
            || self.inner.try_acquire_write(key, ttl, waiting),
        )
        .await
    }

    async fn withdraw_writer(&self, key: &LeaseKey, waiting: OwnerId) -> Result<()> {
        through(&*self.hook, Op::WithdrawWriter { key, waiting }, || {
            self.inner.withdraw_writer(key, waiting)
        })
        .await
    }

    async fn inspect_rw(&self, key: &LeaseKey) -> Result<RwInfo> {
        through(&*self.hook, Op::InspectRw { key }, || {
            self.inner.inspect_rw(key)
        })
        .await
    }

    async fn watch_rw(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        through(&*self.hook, Op::WatchRw { key }, || {
            self.inner.watch_rw(key)
        })
        .await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        through(&*self.hook, Op::Extend { lease, ttl }, || {
            self.inner.extend(lease, ttl)
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        through(&*self.hook, Op::Release { lease }, || {
            self.inner.release(lease)
        })
        .await
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        through(&*self.hook, Op::Inspect { key }, || self.inner.inspect(key)).await
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        through(&*self.hook, Op::Watch { key }, || self.inner.watch(key)).await
    }

    fn watch_reports_state(&self) -> bool {
        self.inner.watch_reports_state()
    }

    fn watch_is_lazy(&self) -> bool {
        self.inner.watch_is_lazy()
    }

    async fn extend_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        through(&*self.hook, Op::ExtendMany { leases }, || {
            self.inner.extend_many(leases)
        })
        .await
    }

    fn batch_limit(&self) -> usize {
        self.inner.batch_limit()
    }

    async fn session_store(&self, ttl: Duration) -> Result<Option<Arc<dyn SessionStore>>> {
        let store = through(&*self.hook, Op::SessionStore { ttl }, || {
            self.inner.session_store(ttl)
        })
        .await?;
        Ok(store.map(|inner| {
            Arc::new(SessionLayer {
                inner,
                hook: Arc::clone(&self.hook),
            }) as Arc<dyn SessionStore>
        }))
    }

    async fn flush(&self, limit: Duration) {
        through_infallible(&*self.hook, Op::Flush { limit }, self.inner.flush(limit)).await;
    }

    fn wait_queue(&self) -> Option<&dyn WaitQueue> {
        self.inner
            .wait_queue()
            .map(|_| &self.queue as &dyn WaitQueue)
    }
}

/// The session store a [`Layered`] provider hands out: the inner provider's,
/// with its operations through the hook.
struct SessionLayer<H> {
    inner: Arc<dyn SessionStore>,
    hook: Arc<H>,
}

impl<H> fmt::Debug for SessionLayer<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.inner, f)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<H: Hook> SessionStore for SessionLayer<H> {
    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        through(&*self.hook, Op::SessionTryAcquire { key, ttl }, || {
            self.inner.try_acquire(key, ttl)
        })
        .await
    }

    async fn renew(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        through(&*self.hook, Op::SessionRenew { leases }, || {
            self.inner.renew(leases)
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        through(&*self.hook, Op::SessionRelease { lease }, || {
            self.inner.release(lease)
        })
        .await
    }

    fn batch_limit(&self) -> usize {
        self.inner.batch_limit()
    }

    async fn close(&self) {
        through_infallible(&*self.hook, Op::SessionClose, self.inner.close()).await;
    }

    fn tied_to_session(&self) -> bool {
        self.inner.tied_to_session()
    }

    async fn abandon(&self) {
        through_infallible(&*self.hook, Op::SessionAbandon, self.inner.abandon()).await;
    }

    fn close_releases_all(&self) -> bool {
        self.inner.close_releases_all()
    }
}

/// The queue of waiters a [`Layered`] provider hands out: the inner
/// provider's, with its operations through the hook.
struct QueueLayer<P: ?Sized, H> {
    inner: Arc<P>,
    hook: Arc<H>,
}

impl<P: LeaseProvider + ?Sized, H> QueueLayer<P, H> {
    fn queue(&self) -> Result<&dyn WaitQueue> {
        self.inner.wait_queue().ok_or_else(|| {
            LeaseError::Config("the provider behind the layer has no queue of waiters".into())
        })
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: LeaseProvider + ?Sized, H: Hook> WaitQueue for QueueLayer<P, H> {
    async fn join(&self, key: &LeaseKey, ttl: Duration, mark: u64) -> Result<Ticket> {
        through(&*self.hook, Op::QueueJoin { key, ttl, mark }, || async {
            self.queue()?.join(key, ttl, mark).await
        })
        .await
    }

    fn retried_join_finds_its_ticket(&self) -> bool {
        self.queue()
            .is_ok_and(|q| q.retried_join_finds_its_ticket())
    }

    async fn place(&self, ticket: &Ticket) -> Result<Place> {
        through(&*self.hook, Op::QueuePlace { ticket }, || async {
            self.queue()?.place(ticket).await
        })
        .await
    }

    async fn watch_ticket(&self, ahead: &Ticket) -> Result<Box<dyn KeyWatch>> {
        through(&*self.hook, Op::QueueWatchTicket { ahead }, || async {
            self.queue()?.watch_ticket(ahead).await
        })
        .await
    }

    async fn refresh(&self, ticket: &Ticket, ttl: Duration) -> Result<bool> {
        through(&*self.hook, Op::QueueRefresh { ticket, ttl }, || async {
            self.queue()?.refresh(ticket, ttl).await
        })
        .await
    }

    async fn leave(&self, ticket: &Ticket) -> Result<()> {
        through(&*self.hook, Op::QueueLeave { ticket }, || async {
            self.queue()?.leave(ticket).await
        })
        .await
    }
}

#[cfg(test)]
#[path = "layered_tests.rs"]
mod tests;

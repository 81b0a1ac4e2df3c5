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

use crate::queue::{Place, Ticket, WaitQueue};
use crate::session_store::SessionStore;
use crate::watch::KeyWatch;
use crate::{
    Capabilities, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseProvider, Result, TryAcquire,
    TryAcquireAll,
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
mod tests {
    use crate::hook::Outcome;
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tracing::Span;

    use super::*;
    use crate::MemoryProvider;

    type Calls = Arc<Mutex<Vec<&'static str>>>;

    fn note(calls: &Calls, name: &'static str) {
        calls.lock().unwrap_or_else(|e| e.into_inner()).push(name);
    }

    fn taken(calls: &Calls) -> Vec<&'static str> {
        std::mem::take(&mut *calls.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The in-memory provider, writing down every method called on it, on
    /// its session store and on its queue of waiters. Its settings differ
    /// from the trait's defaults, so a layer that answers with a default
    /// instead of asking it shows.
    #[derive(Debug, Default)]
    struct Recorder {
        memory: MemoryProvider,
        calls: Calls,
    }

    #[async_trait]
    #[deny(clippy::missing_trait_methods)]
    impl LeaseProvider for Recorder {
        fn capabilities(&self) -> &Capabilities {
            note(&self.calls, "capabilities");
            self.memory.capabilities()
        }
        fn namespace(&self) -> &str {
            note(&self.calls, "namespace");
            self.memory.namespace()
        }
        async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
            note(&self.calls, "try_acquire");
            self.memory.try_acquire(key, ttl).await
        }
        async fn try_acquire_all(&self, keys: &[LeaseKey], ttl: Duration) -> Result<TryAcquireAll> {
            note(&self.calls, "try_acquire_all");
            self.memory.try_acquire_all(keys, ttl).await
        }
        async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
            note(&self.calls, "extend");
            self.memory.extend(lease, ttl).await
        }
        async fn release(&self, lease: &Lease) -> Result<()> {
            note(&self.calls, "release");
            self.memory.release(lease).await
        }
        async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
            note(&self.calls, "inspect");
            self.memory.inspect(key).await
        }
        async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
            note(&self.calls, "watch");
            self.memory.watch(key).await
        }
        fn watch_reports_state(&self) -> bool {
            note(&self.calls, "watch_reports_state");
            true
        }
        fn watch_is_lazy(&self) -> bool {
            note(&self.calls, "watch_is_lazy");
            true
        }
        async fn extend_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
            note(&self.calls, "extend_many");
            self.memory.extend_many(leases).await
        }
        fn batch_limit(&self) -> usize {
            note(&self.calls, "batch_limit");
            7
        }
        async fn session_store(&self, ttl: Duration) -> Result<Option<Arc<dyn SessionStore>>> {
            let _ = ttl;
            note(&self.calls, "session_store");
            Ok(Some(Arc::new(RecordingSession {
                memory: self.memory.clone(),
                calls: Arc::clone(&self.calls),
            })))
        }
        async fn flush(&self, limit: Duration) {
            note(&self.calls, "flush");
            self.memory.flush(limit).await;
        }
        fn wait_queue(&self) -> Option<&dyn WaitQueue> {
            note(&self.calls, "wait_queue");
            Some(self)
        }
    }

    #[async_trait]
    #[deny(clippy::missing_trait_methods)]
    impl WaitQueue for Recorder {
        async fn join(&self, key: &LeaseKey, ttl: Duration, mark: u64) -> Result<Ticket> {
            note(&self.calls, "queue.join");
            WaitQueue::join(&self.memory, key, ttl, mark).await
        }
        fn retried_join_finds_its_ticket(&self) -> bool {
            WaitQueue::retried_join_finds_its_ticket(&self.memory)
        }
        async fn place(&self, ticket: &Ticket) -> Result<Place> {
            note(&self.calls, "queue.place");
            WaitQueue::place(&self.memory, ticket).await
        }
        async fn watch_ticket(&self, ahead: &Ticket) -> Result<Box<dyn KeyWatch>> {
            note(&self.calls, "queue.watch_ticket");
            WaitQueue::watch_ticket(&self.memory, ahead).await
        }
        async fn refresh(&self, ticket: &Ticket, ttl: Duration) -> Result<bool> {
            note(&self.calls, "queue.refresh");
            WaitQueue::refresh(&self.memory, ticket, ttl).await
        }
        async fn leave(&self, ticket: &Ticket) -> Result<()> {
            note(&self.calls, "queue.leave");
            WaitQueue::leave(&self.memory, ticket).await
        }
    }

    /// The recorder's session store, over the same in-memory store.
    #[derive(Debug)]
    struct RecordingSession {
        memory: MemoryProvider,
        calls: Calls,
    }

    #[async_trait]
    #[deny(clippy::missing_trait_methods)]
    impl SessionStore for RecordingSession {
        async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
            note(&self.calls, "session.try_acquire");
            self.memory.try_acquire(key, ttl).await
        }
        async fn renew(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
            note(&self.calls, "session.renew");
            self.memory.extend_many(leases).await
        }
        async fn release(&self, lease: &Lease) -> Result<()> {
            note(&self.calls, "session.release");
            self.memory.release(lease).await
        }
        fn batch_limit(&self) -> usize {
            note(&self.calls, "session.batch_limit");
            5
        }
        async fn close(&self) {
            note(&self.calls, "session.close");
        }
        fn tied_to_session(&self) -> bool {
            note(&self.calls, "session.tied_to_session");
            true
        }
        async fn abandon(&self) {
            note(&self.calls, "session.abandon");
        }
        fn close_releases_all(&self) -> bool {
            note(&self.calls, "session.close_releases_all");
            true
        }
    }

    /// Writes down what it sees, and refuses every operation while told to.
    #[derive(Default)]
    struct Log {
        refuse: AtomicBool,
        before: Calls,
        after: Calls,
    }

    impl Hook for Log {
        async fn before(&self, op: &Op<'_>) -> Result<()> {
            note(&self.before, op.name());
            if self.refuse.load(Ordering::SeqCst) {
                return Err(LeaseError::Unavailable {
                    message: "refused by the hook".into(),
                    source: None,
                });
            }
            Ok(())
        }

        fn after(&self, op: &Op<'_>, outcome: Outcome<'_>, _: Duration, _: &Span) {
            assert!(outcome.is_ok(), "{} failed: {outcome:?}", op.name());
            note(&self.after, op.name());
        }
    }

    fn layered() -> (Layered<Recorder, Log>, Calls) {
        let recorder = Recorder::default();
        let calls = Arc::clone(&recorder.calls);
        (
            Layered::with_hook(Arc::new(recorder), Log::default()),
            calls,
        )
    }

    fn key(name: &str) -> LeaseKey {
        LeaseKey::new(name).unwrap()
    }

    const TTL: Duration = Duration::from_secs(5);

    /// Every method of the provider, of its session store and of its queue
    /// reaches the inner provider through the layer, with the inner
    /// provider's answer; every operation goes through the hook.
    #[tokio::test(start_paused = true)]
    async fn every_method_reaches_the_inner_provider() {
        let (layered, calls) = layered();
        let p: &dyn LeaseProvider = &layered;

        assert_eq!(p.capabilities().backend, "memory");
        assert_eq!(p.namespace(), layered.inner().memory.namespace());
        assert!(p.watch_reports_state());
        assert!(p.watch_is_lazy());
        assert_eq!(p.batch_limit(), 7);
        let lease = p.try_acquire(&key("a"), TTL).await.unwrap();
        let lease = lease.into_lease().unwrap();
        let lease = p.extend(&lease, TTL).await.unwrap();
        let set = p.try_acquire_all(&[key("m1"), key("m2")], TTL).await;
        assert_eq!(set.unwrap().into_leases().unwrap().len(), 2);
        let renewed = p.extend_many(std::slice::from_ref(&lease)).await.unwrap();
        assert_eq!(renewed.len(), 1);
        let info = p.inspect(&key("a")).await.unwrap().unwrap();
        assert_eq!(info.token, lease.token());
        p.watch(&key("a")).await.unwrap();
        p.release(&lease).await.unwrap();
        p.flush(Duration::from_millis(1)).await;

        let session = p.session_store(TTL).await.unwrap().unwrap();
        let held = session.try_acquire(&key("b"), TTL).await.unwrap();
        let held = held.into_lease().unwrap();
        assert_eq!(
            session
                .renew(std::slice::from_ref(&held))
                .await
                .unwrap()
                .len(),
            1
        );
        session.release(&held).await.unwrap();
        assert_eq!(session.batch_limit(), 5);
        assert!(session.tied_to_session());
        assert!(session.close_releases_all());
        session.close().await;
        session.abandon().await;

        let queue = p.wait_queue().unwrap();
        let ticket = queue.join(&key("c"), TTL, 1).await.unwrap();
        assert_eq!(queue.place(&ticket).await.unwrap(), Place::First);
        queue.watch_ticket(&ticket).await.unwrap();
        assert!(queue.refresh(&ticket, TTL).await.unwrap());
        queue.leave(&ticket).await.unwrap();

        let reached: BTreeSet<_> = taken(&calls).into_iter().collect();
        let every: BTreeSet<_> = [
            "capabilities",
            "namespace",
            "watch_reports_state",
            "watch_is_lazy",
            "batch_limit",
            "try_acquire",
            "try_acquire_all",
            "extend",
            "extend_many",
            "inspect",
            "watch",
            "release",
            "flush",
            "session_store",
            "session.try_acquire",
            "session.renew",
            "session.release",
            "session.batch_limit",
            "session.tied_to_session",
            "session.close_releases_all",
            "session.close",
            "session.abandon",
            "wait_queue",
            "queue.join",
            "queue.place",
            "queue.watch_ticket",
            "queue.refresh",
            "queue.leave",
        ]
        .into_iter()
        .collect();
        assert_eq!(
            every.difference(&reached).collect::<Vec<_>>(),
            Vec::<&&str>::new(),
            "not forwarded to the inner provider"
        );
        assert_eq!(reached, every);

        let ops = [
            "try_acquire",
            "extend",
            "try_acquire_all",
            "extend_many",
            "inspect",
            "watch",
            "release",
            "flush",
            "session_store",
            "session.try_acquire",
            "session.renew",
            "session.release",
            "session.close",
            "session.abandon",
            "queue.join",
            "queue.place",
            "queue.watch_ticket",
            "queue.refresh",
            "queue.leave",
        ];
        let cannot_fail = ["flush", "session.close", "session.abandon"];
        let hook = layered.hook();
        assert_eq!(taken(&hook.after), ops);
        let offered: Vec<_> = ops
            .into_iter()
            .filter(|op| !cannot_fail.contains(op))
            .collect();
        assert_eq!(taken(&hook.before), offered);
    }

    /// An operation the hook refuses answers with the hook's error and never
    /// reaches the inner provider (nor the hook's `after`): the provider's
    /// own, its session store's and its queue's.
    #[tokio::test(start_paused = true)]
    async fn a_refused_operation_never_reaches_the_inner_provider() {
        let (layered, calls) = layered();
        let p: &dyn LeaseProvider = &layered;
        let lease = p.try_acquire(&key("a"), TTL).await.unwrap();
        let lease = lease.into_lease().unwrap();
        let session = p.session_store(TTL).await.unwrap().unwrap();
        let queue = p.wait_queue().unwrap();
        let ticket = queue.join(&key("a"), TTL, 1).await.unwrap();
        taken(&calls);
        taken(&layered.hook().before);
        taken(&layered.hook().after);

        layered.hook().refuse.store(true, Ordering::SeqCst);
        let refused = |r: Result<()>, op: &str| match r {
            Err(LeaseError::Unavailable { message, .. }) if message == "refused by the hook" => {}
            other => panic!("{op} was not refused: {other:?}"),
        };
        refused(p.try_acquire(&key("b"), TTL).await.map(drop), "try_acquire");
        refused(p.extend(&lease, TTL).await.map(drop), "extend");
        refused(
            p.extend_many(std::slice::from_ref(&lease)).await.map(drop),
            "extend_many",
        );
        refused(p.inspect(&key("a")).await.map(drop), "inspect");
        refused(p.watch(&key("a")).await.map(drop), "watch");
        refused(p.release(&lease).await, "release");
        refused(p.session_store(TTL).await.map(drop), "session_store");
        refused(
            session.try_acquire(&key("b"), TTL).await.map(drop),
            "session.try_acquire",
        );
        refused(
            session.renew(std::slice::from_ref(&lease)).await.map(drop),
            "session.renew",
        );
        refused(session.release(&lease).await, "session.release");
        refused(queue.join(&key("a"), TTL, 2).await.map(drop), "queue.join");
        refused(queue.place(&ticket).await.map(drop), "queue.place");
        refused(
            queue.watch_ticket(&ticket).await.map(drop),
            "queue.watch_ticket",
        );
        refused(queue.refresh(&ticket, TTL).await.map(drop), "queue.refresh");
        refused(queue.leave(&ticket).await, "queue.leave");

        assert_eq!(
            taken(&calls),
            Vec::<&str>::new(),
            "reached the inner provider"
        );
        assert_eq!(taken(&layered.hook().before).len(), 15);
        assert_eq!(taken(&layered.hook().after), Vec::<&str>::new());

        // Still held by the refused holder: nothing reached the store.
        layered.hook().refuse.store(false, Ordering::SeqCst);
        let info = p.inspect(&key("a")).await.unwrap().unwrap();
        assert_eq!(info.token, lease.token());
    }
}

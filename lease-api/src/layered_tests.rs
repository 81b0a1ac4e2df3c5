//! Tests of `Layered`: every method reaches the inner provider through the
//! hook, and a refused operation never does.

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
    async fn try_acquire_read(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        note(&self.calls, "try_acquire_read");
        self.memory.try_acquire_read(key, ttl).await
    }
    async fn try_acquire_write(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        waiting: Option<OwnerId>,
    ) -> Result<TryAcquire> {
        note(&self.calls, "try_acquire_write");
        self.memory.try_acquire_write(key, ttl, waiting).await
    }
    async fn withdraw_writer(&self, key: &LeaseKey, waiting: OwnerId) -> Result<()> {
        note(&self.calls, "withdraw_writer");
        self.memory.withdraw_writer(key, waiting).await
    }
    async fn inspect_rw(&self, key: &LeaseKey) -> Result<RwInfo> {
        note(&self.calls, "inspect_rw");
        self.memory.inspect_rw(key).await
    }
    async fn watch_rw(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        note(&self.calls, "watch_rw");
        self.memory.watch_rw(key).await
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
    let reader = p.try_acquire_read(&key("rw"), TTL).await.unwrap();
    let reader = reader.into_lease().unwrap();
    let waiter = OwnerId::random();
    let writer = p.try_acquire_write(&key("rw"), TTL, Some(waiter)).await;
    assert!(!writer.unwrap().is_acquired(), "a writer beside a reader");
    assert_eq!(p.inspect_rw(&key("rw")).await.unwrap().readers.len(), 1);
    p.withdraw_writer(&key("rw"), waiter).await.unwrap();
    p.watch_rw(&key("rw")).await.unwrap();
    p.release(&reader).await.unwrap();
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
        "try_acquire_read",
        "try_acquire_write",
        "withdraw_writer",
        "inspect_rw",
        "watch_rw",
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
        "try_acquire_read",
        "try_acquire_write",
        "inspect_rw",
        "withdraw_writer",
        "watch_rw",
        "release",
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

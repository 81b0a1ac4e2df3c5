//! `Election::observe` tells terms apart by more than the token: a store
//! that lost its token counter (a Redis restarted without persistence) can
//! give a new leader a token an observer has already seen.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use lease_api::backend::KeyWatch;
use lease_api::recipes::Election;
use lease_api::{
    Capabilities, FencingToken, Lease, LeaseInfo, LeaseKey, LeaseProvider, MemoryProvider, Result,
    TryAcquire,
};

/// The in-memory provider, but every holder it reports carries token 1, as
/// after a store restart that reset the counter.
#[derive(Debug)]
struct OneToken(MemoryProvider);

#[async_trait]
impl LeaseProvider for OneToken {
    fn capabilities(&self) -> &Capabilities {
        self.0.capabilities()
    }
    fn namespace(&self) -> &str {
        self.0.namespace()
    }
    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.0.try_acquire(key, ttl).await
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.0.extend(lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.0.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        Ok(self
            .0
            .inspect(key)
            .await?
            .map(|i| LeaseInfo::new(FencingToken(1), i.remaining, i.owner, i.holder)))
    }
    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        self.0.watch(key).await
    }
    fn watch_reports_state(&self) -> bool {
        self.0.watch_reports_state()
    }
}

#[tokio::test]
async fn a_new_leader_with_a_token_already_seen_is_still_reported() {
    let provider: Arc<dyn LeaseProvider> = Arc::new(OneToken(MemoryProvider::new()));
    let ttl = Duration::from_secs(30);
    let a = Election::new(Arc::clone(&provider), "scheduler", ttl).unwrap();
    let b = Election::new(Arc::clone(&provider), "scheduler", ttl).unwrap();
    let first = a.campaign().await.unwrap();
    let mut observed = Box::pin(a.observe());
    let seen = observed.next().await.unwrap().unwrap().expect("a leads");
    assert_eq!(seen.token, FencingToken(1));
    // The stream is polled again only after the handover: it sees B's
    // term with the token it saw for A's.
    first.resign().await.unwrap();
    let _second = b.campaign().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(2), observed.next())
        .await
        .expect("the new leader was not reported: its token was seen before");
    assert!(
        matches!(next, Some(Ok(Some(_)))),
        "the new leader: {next:?}"
    );
}

/// The in-memory store, seen through a watch like PostgreSQL's lock queue:
/// it starts waiting for the key to be free only when asked to wait (lazy),
/// and it reports state. One look can be held after it read the store, so a test
/// can hand the lead over between the look and the wait.
#[derive(Debug)]
struct FreeWaiting {
    inner: Arc<MemoryProvider>,
    /// When armed, the next look signals `read` and waits for `go`.
    hold_next_look: std::sync::Mutex<
        Option<(
            tokio::sync::oneshot::Sender<()>,
            tokio::sync::oneshot::Receiver<()>,
        )>,
    >,
}

/// Waits until the key is free (at most `max`), as a session queued for the
/// key's lock does.
struct UntilFree {
    inner: Arc<MemoryProvider>,
    key: LeaseKey,
}

#[async_trait]
impl KeyWatch for UntilFree {
    async fn changed(&mut self, max: Duration) {
        let until = tokio::time::Instant::now() + max;
        while tokio::time::Instant::now() < until {
            if matches!(self.inner.inspect(&self.key).await, Ok(None)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[async_trait]
impl LeaseProvider for FreeWaiting {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    fn namespace(&self) -> &str {
        self.inner.namespace()
    }
    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.inner.try_acquire(key, ttl).await
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.inner.extend(lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        let info = self.inner.inspect(key).await?;
        let held = self.hold_next_look.lock().unwrap().take();
        if let Some((read, go)) = held {
            let _ = read.send(());
            let _ = go.await;
        }
        Ok(info)
    }
    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        Ok(Box::new(UntilFree {
            inner: Arc::clone(&self.inner),
            key: key.clone(),
        }))
    }
    fn watch_reports_state(&self) -> bool {
        true
    }
    fn watch_is_lazy(&self) -> bool {
        true
    }
}

/// A follower whose watch waits for the key to be free (PostgreSQL's
/// advisory locks) still reports a leader that took over between its look
/// and its wait, while that leader leads: the conformance election case
/// missed such a term on a loaded machine (the wait ended only with it).
#[tokio::test]
async fn a_handover_between_the_look_and_a_free_waiting_watch_is_reported() {
    let store = lease_api::MemoryStore::new();
    let memory = Arc::new(store.provider("elections").unwrap());
    let follower_view = Arc::new(FreeWaiting {
        inner: Arc::clone(&memory),
        hold_next_look: std::sync::Mutex::new(None),
    });
    let ttl = Duration::from_secs(30);
    let campaigners: Arc<dyn LeaseProvider> = memory;
    let a = Election::new(Arc::clone(&campaigners), "scheduler", ttl).unwrap();
    let b = Election::new(campaigners, "scheduler", ttl).unwrap();
    let follower = Election::new(
        Arc::clone(&follower_view) as Arc<dyn LeaseProvider>,
        "scheduler",
        ttl,
    )
    .unwrap();
    let first = a.campaign().await.unwrap();
    let mut observed = Box::pin(follower.observe());
    let seen = observed.next().await.unwrap().unwrap().expect("a leads");
    assert_eq!(seen.token, first.token());
    // The follower's next look reads A's term, then is held while the lead
    // passes to B; only then does its watch start waiting.
    let (read_tx, read_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel();
    *follower_view.hold_next_look.lock().unwrap() = Some((read_tx, go_rx));
    let next = tokio::spawn(async move { observed.next().await });
    read_rx.await.expect("the follower looked again");
    first.resign().await.unwrap();
    let second = b.campaign().await.unwrap();
    go_tx.send(()).unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("B's term was not reported while it lasted")
        .unwrap();
    match next {
        Some(Ok(Some(leader))) => assert_eq!(leader.token, second.token()),
        other => panic!("expected B's term, got {other:?}"),
    }
}

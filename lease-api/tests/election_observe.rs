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

//! An acquire dropped after its store call won, but before the caller took
//! the answer, gives the lease back at once instead of leaving it held
//! (unrenewed) until its TTL.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use lease_api::recipes::Semaphore;
use lease_api::{AcquireOptions, LeaseKey, LeaseProvider, MemoryProvider, acquire};

#[tokio::test]
async fn an_acquire_dropped_after_it_won_releases_the_lease() {
    let provider = Arc::new(MemoryProvider::new());
    let key = LeaseKey::new("report").unwrap();
    let mut pending = Box::pin(acquire(
        &provider,
        &key,
        AcquireOptions::ttl(Duration::from_secs(30)),
    ));
    // First poll: the attempt's task is spawned and the caller waits.
    let first = std::future::poll_fn(|cx| Poll::Ready(pending.as_mut().poll(cx))).await;
    assert!(first.is_pending());
    // The task runs and wins; its answer waits in the channel.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(provider.inspect(&key).await.unwrap().is_some());
    drop(pending);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        provider.inspect(&key).await.unwrap().is_none(),
        "the dropped acquire's lease is still held"
    );
}

#[tokio::test]
async fn a_semaphore_acquire_dropped_after_it_won_releases_the_permit() {
    let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
    let sem = Semaphore::new(Arc::clone(&provider), "slots", 1).unwrap();
    let mut pending = Box::pin(sem.acquire(Duration::from_secs(30), Duration::from_secs(5)));
    let first = std::future::poll_fn(|cx| Poll::Ready(pending.as_mut().poll(cx))).await;
    assert!(first.is_pending());
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(pending);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let key = sem.key(0).unwrap();
    assert!(
        provider.inspect(key).await.unwrap().is_none(),
        "the dropped acquire's permit is still held"
    );
}

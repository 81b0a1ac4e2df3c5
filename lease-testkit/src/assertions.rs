//! Shared test steps and assertions: retrying through a restart, handoff
//! notification, denial, an empty queue of waiters, a lost join answer.

use std::time::{Duration, Instant};

use crate::{Proxy, unique};

/// Retries `f` while it fails with `Unavailable` (a store coming back after a
/// restart), for up to 30 s; any other error, or no recovery, fails the test.
///
/// # Panics
/// When the store does not recover or answers with another error.
pub async fn until_ok<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, lease_api::LeaseError>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "the provider did not recover: {e}"
                );
                assert!(
                    matches!(e, lease_api::LeaseError::Unavailable { .. }),
                    "recovering gave {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Holds `key` through `holder` while `waiter` waits for it, then releases and
/// asserts the waiter got it within `within` of the release (so it was woken,
/// not timed out: the holder's TTL is far longer), with a larger token.
///
/// # Panics
/// When any step fails or the hand-off is late.
pub async fn assert_handoff_is_notified<P>(
    holder: &P,
    waiter: std::sync::Arc<P>,
    key: &lease_api::LeaseKey,
    ttl: Duration,
    within: Duration,
) where
    P: lease_api::LeaseProvider + 'static,
{
    let held = holder
        .try_acquire(key, ttl)
        .await
        .expect("acquire")
        .into_lease()
        .expect("the key is free");
    let k = key.clone();
    let waiting = tokio::spawn(async move {
        lease_api::acquire(&waiter, &k, lease_api::AcquireOptions::ttl(ttl).wait(ttl)).await
    });
    // Let the waiter register and find the key held.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the waiter did not wait");
    holder.release(&held).await.expect("release");
    let released = Instant::now();
    let got = waiting
        .await
        .expect("waiter task")
        .expect("waiter")
        .expect("the waiter got the key");
    assert!(
        released.elapsed() < within,
        "the waiter was not woken: it took {:?} after the release",
        released.elapsed()
    );
    assert!(got.token() > held.token());
    holder
        .release(&got)
        .await
        .expect("release the waiter's lease");
}

/// Asserts that `provider`'s acquire of `key` is `Denied` within `within`, not
/// transient, and that its message does not contain `secret`.
///
/// # Panics
/// Otherwise.
pub async fn assert_denied<P: lease_api::LeaseProvider>(
    what: &str,
    provider: &P,
    key: &lease_api::LeaseKey,
    secret: &str,
    within: Duration,
) {
    let started = Instant::now();
    let err = provider
        .try_acquire(key, Duration::from_secs(30))
        .await
        .expect_err(what);
    assert!(
        matches!(err, lease_api::LeaseError::Denied { .. }),
        "{what}: {err:?}"
    );
    assert!(!err.is_transient(), "{what}");
    assert!(!err.to_string().contains(secret), "{what}: {err}");
    assert!(
        started.elapsed() < within,
        "{what}: {:?}",
        started.elapsed()
    );
}

/// Asserts that nothing stays in `key`'s queue of waiters: within `within`
/// (a winner leaves the queue in the background) a new ticket is first.
///
/// # Panics
/// When a ticket stays ahead for `within`, or the store fails.
pub async fn assert_line_empty<P: lease_api::LeaseProvider + ?Sized>(
    p: &P,
    key: &lease_api::LeaseKey,
    within: Duration,
) {
    let queue = p.wait_queue().expect("a provider with a queue of waiters");
    let give_up = Instant::now() + within;
    loop {
        let probe = queue
            .join(
                key,
                Duration::from_secs(10),
                lease_api::backend::Ticket::random_mark(),
            )
            .await
            .expect("join");
        let place = queue.place(&probe).await.expect("place");
        queue.leave(&probe).await.expect("leave");
        if place == lease_api::backend::Place::First {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "a ticket stayed in line for {within:?}: {place:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The answer to a fair waiter's join is lost: `proxy` (between `p` and its
/// store) forwards the first request that contains `pattern(key)` (the
/// join's, for a fresh key) and drops the connection as the answer arrives.
/// The store made the ticket; the waiter, told only that the connection
/// broke, joins again. It must get the free key within 5 s (a reconnect and
/// a join again on a loaded machine), half the 10 s a ticket lives at most
/// (`MAX_TICKET_TTL`), and leave nothing in line: a retried join finds its own
/// ticket, or the lost one is removed.
///
/// # Panics
/// When the answer was never lost, the acquire took 5 s or more or failed,
/// or a ticket stayed in line.
pub async fn assert_a_lost_join_answer_costs_no_wait(
    p: std::sync::Arc<dyn lease_api::LeaseProvider>,
    proxy: &Proxy,
    pattern: impl Fn(&lease_api::LeaseKey) -> Vec<u8>,
) {
    use lease_api::{AcquireOptions, LeaseKey, acquire};
    let ttl = Duration::from_secs(30);
    let fair = |wait| AcquireOptions::ttl(ttl).wait(wait).fair();
    // The key's queue used once first (scripts loaded, statements prepared,
    // the key's nodes made) and left, so the answer lost is the join's.
    let key = LeaseKey::new(unique("lost-join")).expect("key");
    let lease = until_ok(|| acquire(&p, &key, fair(Duration::from_secs(5))))
        .await
        .expect("a free key");
    p.release(&lease).await.expect("release");
    assert_line_empty(&*p, &key, Duration::from_secs(5)).await;
    proxy.lose_reply_to(&pattern(&key));
    let started = Instant::now();
    let lease = acquire(&p, &key, fair(Duration::from_secs(20)))
        .await
        .expect("the fair acquire")
        .expect("the free key");
    let took = started.elapsed();
    assert!(proxy.reply_lost(), "the join's answer was never lost");
    assert!(
        took < Duration::from_secs(5),
        "the fair acquire took {took:?}: it waited behind the ticket of its lost join"
    );
    assert_line_empty(&*p, &key, Duration::from_secs(2)).await;
    p.release(&lease).await.expect("release");
}

/// The answer to a fair waiter's join is lost as its wait runs out: `proxy`
/// (between `p` and its store) forwards the first request that contains
/// `pattern(key)` (the join's, for a key held by another), drops the
/// connection as the answer arrives and refuses new ones, so the waiter
/// cannot retry before its wait ends. The store made the ticket; the waiter
/// never heard of it. Once the proxy heals, that ticket must go within 4 s
/// (far below its TTL, and on ZooKeeper it would live as long as the
/// session): the waiter clears what its lost join may have made.
///
/// # Panics
/// When the answer was never lost, the acquire got the held key, or a ticket
/// stayed in line.
pub async fn assert_a_join_lost_as_the_wait_ends_leaves_no_ticket(
    p: std::sync::Arc<dyn lease_api::LeaseProvider>,
    proxy: &Proxy,
    pattern: impl Fn(&lease_api::LeaseKey) -> Vec<u8>,
) {
    use lease_api::{AcquireOptions, LeaseKey, acquire};
    let ttl = Duration::from_secs(30);
    let fair = |wait| AcquireOptions::ttl(ttl).wait(wait).fair();
    let key = LeaseKey::new(unique("join-at-deadline")).expect("key");
    // The key's queue used once first (scripts loaded, statements prepared,
    // the key's nodes made), then the key held, so the fair acquire joins.
    let lease = until_ok(|| acquire(&p, &key, fair(Duration::from_secs(5))))
        .await
        .expect("a free key");
    assert_line_empty(&*p, &key, Duration::from_secs(5)).await;
    proxy.lose_reply_to_then_cut(&pattern(&key));
    let got = acquire(&p, &key, fair(Duration::from_millis(1500))).await;
    assert!(proxy.reply_lost(), "the join's answer was never lost");
    assert!(
        !matches!(got, Ok(Some(_))),
        "the fair acquire got a held key: {got:?}"
    );
    proxy.heal();
    // The client reconnects first.
    until_ok(|| p.inspect(&key)).await;
    assert_line_empty(&*p, &key, Duration::from_secs(4)).await;
    until_ok(|| p.release(&lease)).await;
}

//! Round trips on etcd, made visible by a proxy that delays every request
//! of the client under test: a woken waiter's acquire, a same-TTL extend,
//! and a watch that reports a release it started after.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lease_api::backend::KeyWatch;
use lease_api::{
    AcquireOptions, Capabilities, Lease, LeaseInfo, LeaseKey, LeaseProvider, Result, TryAcquire,
    acquire,
};
use lease_etcd::{EtcdConfig, EtcdProvider};
use lease_testkit::{store_url, unique};

const TTL: Duration = Duration::from_secs(10);

fn shared(ns: &str) -> EtcdProvider {
    EtcdProvider::new(EtcdConfig::new([store_url("LEASE_TEST_ETCD_URL")]).namespace(ns)).unwrap()
}

/// The waiter's client reaches the shared etcd through a proxy that delays
/// every request by `delay`, so each round trip it waits for is visible in
/// its timing; the holder and the checks talk to etcd directly.
async fn delayed(delay: Duration) -> (lease_testkit::Proxy, EtcdProvider) {
    let url = store_url("LEASE_TEST_ETCD_URL");
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let proxy = lease_testkit::Proxy::start(port).await;
    let p = EtcdProvider::new(
        EtcdConfig::new([format!("http://127.0.0.1:{}", proxy.port())])
            .namespace("delayed")
            .timeouts(delay * 4, delay * 4),
    )
    .unwrap();
    proxy.delay_requests(delay);
    (proxy, p)
}

/// etcd keeps `lease`'s key at least as long as the lease says it is valid.
async fn etcd_keeps_it(raw: &mut etcd_client::Client, lease: &Lease) {
    let left = raw
        .lease_time_to_live(etcd_lease_id(lease), None)
        .await
        .unwrap()
        .ttl();
    let believed = lease
        .valid_until()
        .into_std()
        .saturating_duration_since(Instant::now());
    assert!(
        Duration::from_secs(u64::try_from(left).unwrap_or(0) + 1) >= believed,
        "etcd keeps the key {left} s more, the lease says it is valid {believed:?} more"
    );
}

fn etcd_lease_id(lease: &lease_api::Lease) -> i64 {
    match lease.handle() {
        lease_api::backend::LeaseHandle::EtcdLease(id) => id,
        other => panic!("not an etcd lease: {other}"),
    }
}

/// A woken waiter takes the key in one round trip: the etcd lease it granted
/// when it found the key held is kept, and at the wake its transaction and a
/// keep-alive of that lease go out together (a grant and then the
/// transaction took two). The lease it gets is valid for no longer than etcd
/// keeps the key: the keep-alive really renewed the older etcd lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_takes_the_key_in_one_round_trip() {
    const DELAY: Duration = Duration::from_secs(1);
    let (_proxy, waiter) = delayed(DELAY).await;
    let holder = shared("delayed");
    let mut raw = etcd_client::Client::connect([store_url("LEASE_TEST_ETCD_URL")], None)
        .await
        .unwrap();
    let k = LeaseKey::new(unique("spare")).unwrap();
    let held = holder
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    assert!(
        matches!(
            waiter.try_acquire(&k, TTL).await.unwrap(),
            TryAcquire::Held { .. }
        ),
        "the key is held"
    );
    let mut watch = waiter.watch(&k).await.unwrap();
    // Long enough that an etcd lease granted at the first try, and not
    // renewed since, would run out visibly before a fresh TTL.
    tokio::time::sleep(Duration::from_secs(3)).await;
    holder.release(&held).await.unwrap();
    watch.changed(TTL).await;
    let woken = Instant::now();
    let got = waiter.try_acquire(&k, TTL).await.unwrap();
    let took = woken.elapsed();
    let got = got.into_lease().expect("the key was released");
    assert!(
        took < DELAY * 3 / 2,
        "the woken try took {took:?}, more than one round trip of {DELAY:?}"
    );
    etcd_keeps_it(&mut raw, &got).await;
    waiter.release(&got).await.unwrap();
}

/// An extend to the same TTL is a keep-alive and then a read of the key:
/// two round trips, not three (opening etcd-client's keep-alive stream
/// already renews the lease and waits for etcd's answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_takes_two_round_trips() {
    const DELAY: Duration = Duration::from_secs(1);
    let (_proxy, p) = delayed(DELAY).await;
    let k = LeaseKey::new(unique("extend-trips")).unwrap();
    let lease = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
    let started = Instant::now();
    let extended = p.extend(&lease, lease.ttl()).await.unwrap();
    let took = started.elapsed();
    assert!(
        took < DELAY * 5 / 2,
        "the extend took {took:?}, more than two round trips of {DELAY:?}"
    );
    assert!(extended.valid_until() > lease.valid_until());
    p.release(&extended).await.unwrap();
}

/// An etcd provider that counts the watches it has set up.
#[derive(Debug)]
struct Counting {
    inner: EtcdProvider,
    watches: AtomicUsize,
}

#[async_trait]
impl LeaseProvider for Counting {
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
        self.inner.inspect(key).await
    }
    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        let watch = self.inner.watch(key).await;
        self.watches.fetch_add(1, Ordering::SeqCst);
        watch
    }
    fn watch_reports_state(&self) -> bool {
        self.inner.watch_reports_state()
    }
}

/// A waiter in `acquire` holds the key one round trip after the release: it
/// tried first and watched only the held key, so once woken it sends its
/// transaction alone. (A waiter that set a new watch up before each try
/// needed two round trips after the wake, and two watches in all.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_acquire_holds_the_key_one_round_trip_after_the_release() {
    const DELAY: Duration = Duration::from_secs(1);
    let (_proxy, p) = delayed(DELAY).await;
    let waiter = Arc::new(Counting {
        inner: p,
        watches: AtomicUsize::new(0),
    });
    let holder = shared("delayed");
    let k = LeaseKey::new(unique("wake-trips")).unwrap();
    let held = holder
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let task = {
        let (w, k) = (Arc::clone(&waiter), k.clone());
        tokio::spawn(async move {
            let got = acquire(&w, &k, AcquireOptions::ttl(TTL).wait(TTL * 3)).await;
            (Instant::now(), got)
        })
    };
    // Its watch is set up: from here it only waits for an event.
    while waiter.watches.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let released = Instant::now();
    holder.release(&held).await.unwrap();
    let (at, got) = task.await.unwrap();
    let got = got.unwrap().expect("the key was released");
    let took = at - released;
    assert!(
        took < DELAY * 3 / 2,
        "the waiter held the key {took:?} after the release, more than one round trip of {DELAY:?}"
    );
    assert_eq!(waiter.watches.load(Ordering::SeqCst), 1, "one watch in all");
    waiter.release(&got).await.unwrap();
}

/// A watch set up after a try that found the key held reports a release in
/// between at once: it starts at the revision after the try's answer, and
/// etcd replays the deletion. (A watch from the current revision would wait
/// for the next deletion, here until the deadline.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_after_a_held_try_reports_a_release_in_between() {
    let (holder, waiter) = (shared("between"), shared("between"));
    let k = LeaseKey::new(unique("between")).unwrap();
    let held = holder
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    assert!(matches!(
        waiter.try_acquire(&k, TTL).await.unwrap(),
        TryAcquire::Held { .. }
    ));
    holder.release(&held).await.unwrap();
    // Taken again by someone else before the watch starts: the watch must
    // still report the release the try could not see.
    let again = holder
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let mut watch = waiter.watch(&k).await.unwrap();
    let started = Instant::now();
    watch.changed(TTL * 3).await;
    assert!(
        started.elapsed() < TTL / 2,
        "the release before the watch was reported after {:?}",
        started.elapsed()
    );
    holder.release(&again).await.unwrap();
}

/// A watch of a key this provider never saw held looks at the key as it
/// starts: a free key is reported at once, not at the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_of_a_free_key_never_seen_held_reports_it_at_once() {
    let p = shared("free-watch");
    let k = LeaseKey::new(unique("free-watch")).unwrap();
    let mut watch = p.watch(&k).await.unwrap();
    let started = Instant::now();
    watch.changed(TTL * 3).await;
    assert!(
        started.elapsed() < TTL / 2,
        "a free key was reported after {:?}",
        started.elapsed()
    );
    // A held key is not.
    let lease = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
    let other = shared("free-watch");
    let mut watch = other.watch(&k).await.unwrap();
    let waited = tokio::time::timeout(Duration::from_millis(500), watch.changed(TTL * 3)).await;
    assert!(waited.is_err(), "a held key was reported as changed");
    p.release(&lease).await.unwrap();
}

/// A release keeps its etcd lease as the key's spare instead of revoking
/// it: the holder's next try on the key is one round trip (the transaction
/// beside a keep-alive), not a grant and then the transaction; and the lease
/// it gets is no longer valid than etcd keeps the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_after_a_release_reuses_the_released_etcd_lease() {
    const DELAY: Duration = Duration::from_secs(1);
    let (_proxy, p) = delayed(DELAY).await;
    let mut raw = etcd_client::Client::connect([store_url("LEASE_TEST_ETCD_URL")], None)
        .await
        .unwrap();
    let k = LeaseKey::new(unique("again")).unwrap();
    let first = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
    p.release(&first).await.unwrap();
    let started = Instant::now();
    let again = p.try_acquire(&k, TTL).await.unwrap();
    let took = started.elapsed();
    let again = again.into_lease().expect("the key was released");
    assert!(
        took < DELAY * 3 / 2,
        "the try after the release took {took:?}, more than one round trip of {DELAY:?}"
    );
    assert_eq!(
        etcd_lease_id(&again),
        etcd_lease_id(&first),
        "the released etcd lease carries the key again"
    );
    assert!(again.token() > first.token());
    etcd_keeps_it(&mut raw, &again).await;
    p.release(&again).await.unwrap();
}

/// A release trusts only what the provider itself knows of the etcd lease,
/// never the `Lease` it is handed: one rebuilt with a longer TTL (as from a
/// stored identity), extended and released, leaves a spare that serves a try
/// for that TTL only if etcd really granted it. The next try for the longer TTL gets a lease no
/// longer valid than etcd keeps the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_a_rebuilt_lease_does_not_lend_its_claims_to_the_spare() {
    let p = shared("rebuilt");
    let mut raw = etcd_client::Client::connect([store_url("LEASE_TEST_ETCD_URL")], None)
        .await
        .unwrap();
    let k = LeaseKey::new(unique("rebuilt")).unwrap();
    let held = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
    let rebuilt = Lease::new(
        k.clone(),
        held.token(),
        held.owner(),
        TTL * 3,
        tokio::time::Instant::now(),
    )
    .with_handle(held.handle());
    // A same-TTL extend (for the rebuilt lease's TTL) is a keep-alive,
    // which renews to what etcd granted; then the release.
    let rebuilt = p.extend(&rebuilt, TTL * 3).await.unwrap();
    p.release(&rebuilt).await.unwrap();
    let again = p
        .try_acquire(&k, TTL * 3)
        .await
        .unwrap()
        .into_lease()
        .expect("the key was released");
    etcd_keeps_it(&mut raw, &again).await;
    p.release(&again).await.unwrap();
}

//! ZooKeeper-specific behaviour on private servers: session loss, restarts,
//! outages, and keys that look like paths.

use std::time::{Duration, Instant};

use lease_api::backend::{Place, Ticket};
use lease_api::{AcquireOptions, LeaseError, LeaseGuard, LeaseKey, LeaseProvider, acquire};
use lease_testkit::until_ok;
use lease_testkit::{OwnedProcess, Proxy, owned_zk, owned_zk_with_max_session, store_url};
use lease_zk::{ZkConfig, ZkProvider};
use std::sync::Arc;

const TTL: Duration = Duration::from_secs(30);
const TIMEOUT: Duration = Duration::from_millis(800);

fn on_port(port: u16) -> ZkConfig {
    ZkConfig::new(format!("127.0.0.1:{port}")).timeouts(TIMEOUT, TIMEOUT)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_frees_the_key_and_the_holders_guard_has_fired() {
    let zk: OwnedProcess = owned_zk();
    let session = Duration::from_secs(2);
    lost_session_case(&zk, session, session).await;
}

/// The server clamps the session timeout to its maximum: asked 6 s, granted
/// 2 s. Validity and the guard must follow the granted timeout, or a cut-off
/// holder still believes it holds the key after another client took it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clamped_session_timeout_bounds_validity_by_what_the_server_granted() {
    let granted = Duration::from_secs(2);
    let zk = owned_zk_with_max_session(granted);
    lost_session_case(&zk, Duration::from_secs(6), granted).await;
}

async fn lost_session_case(zk: &OwnedProcess, asked: Duration, session: Duration) {
    let proxy = Proxy::start(zk.port()).await;
    let holder: Arc<dyn LeaseProvider> =
        Arc::new(ZkProvider::new(on_port(proxy.port()).session_timeout(asked)).unwrap());
    let other = Arc::new(ZkProvider::new(on_port(zk.port())).unwrap());
    let k = LeaseKey::new("session-bound").unwrap();
    // A TTL longer than the granted session: only the session bounds validity.
    let ttl = Duration::from_secs(5);
    let lease = until_ok(|| holder.try_acquire(&k, ttl))
        .await
        .into_lease()
        .unwrap();
    assert_eq!(
        holder.capabilities().holder_session,
        Some(session),
        "capabilities must declare the session timeout the server granted"
    );
    assert!(
        lease.valid_until() <= lease.sent_at() + session * 2 / 3,
        "validity {:?} outlasts two thirds of the granted session {session:?}",
        lease.valid_until() - lease.sent_at()
    );
    let guard = LeaseGuard::new(Arc::clone(&holder), lease.clone());
    let lost = guard.lost_token();
    let lost_at = tokio::spawn(async move {
        lost.cancelled().await;
        Instant::now()
    });
    // The holder is cut off; its session expires on the server after `session`.
    proxy.cut();
    let started = Instant::now();
    let next = acquire(
        &other,
        &k,
        AcquireOptions::ttl(TTL).wait(Duration::from_secs(20)),
    )
    .await
    .unwrap()
    .expect("freed by session expiry");
    assert!(
        started.elapsed() < TTL,
        "freed by the session, long before the TTL"
    );
    assert!(next.token() > lease.token());
    let taken_at = Instant::now();
    let fired = lost_at.await.unwrap();
    eprintln!(
        "lost fired {:?} after the cut, key taken {:?} after the cut, reason {:?}",
        fired - started,
        taken_at - started,
        guard.lost_reason()
    );
    // Safety: the cut-off holder knew before anyone else could take the key.
    assert!(
        guard.is_lost(),
        "the holder's guard had not fired when the key was taken {:?} after the cut; validity ends in {:?}; last renewal sent {:?} ago",
        started.elapsed(),
        guard
            .lease()
            .valid_until()
            .saturating_duration_since(tokio::time::Instant::now()),
        guard.lease().sent_at().elapsed()
    );
    proxy.heal();
    // The holder gets a new session and sees the key held by the other.
    let again = until_ok(|| holder.try_acquire(&k, TTL)).await;
    assert!(!again.is_acquired());
    assert!(matches!(
        holder.release(&lease).await,
        Err(LeaseError::NotHeld { .. })
    ));
    other.release(&next).await.unwrap();
}

/// A private ZooKeeper the shared outage cases crash and restart (a watch
/// shares the session's connection: nothing of its own to kill).
struct PrivateZk(lease_testkit::Restartable);

impl PrivateZk {
    fn start() -> Self {
        PrivateZk(lease_testkit::Restartable::new(owned_zk()))
    }
}

#[async_trait::async_trait]
impl lease_conformance::ProviderFactory for PrivateZk {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        Ok(Arc::new(ZkProvider::new(
            on_port(self.0.port()).namespace(namespace),
        )?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        Ok(Arc::new(ZkProvider::new(on_port(1))?))
    }

    fn unavailable_within(&self) -> Duration {
        TIMEOUT * 4 + Duration::from_secs(2)
    }
}

#[async_trait::async_trait]
impl lease_conformance::Outage for PrivateZk {
    fn server(&self) -> &dyn lease_conformance::Server {
        &self.0
    }

    fn may_time_out(&self) -> bool {
        true
    }
}

lease_conformance::outage_tests!(zk_outage, PrivateZk::start());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_like_keys_are_distinct_single_nodes() {
    let ns = format!(
        "paths-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let p = ZkProvider::new(ZkConfig::new(store_url("LEASE_TEST_ZK_URL")).namespace(ns)).unwrap();
    let names = [
        "/",
        "a/b",
        "a",
        "b",
        ".",
        "..",
        "../..",
        "zookeeper",
        "/zookeeper",
        "%2F",
        "ключ",
        "🔒",
        "holder",
        "a/holder",
    ];
    let mut leases = Vec::new();
    for n in names {
        let k = LeaseKey::new(n).unwrap();
        leases.push(
            p.try_acquire(&k, TTL)
                .await
                .unwrap()
                .into_lease()
                .unwrap_or_else(|| panic!("{n:?} collided")),
        );
    }
    for l in &leases {
        assert_eq!(p.inspect(l.key()).await.unwrap().unwrap().token, l.token());
        p.release(l).await.unwrap();
    }
}

#[tokio::test]
async fn bad_configuration_is_refused() {
    assert!(matches!(
        ZkProvider::new(ZkConfig::new("")),
        Err(LeaseError::Config(_))
    ));
    assert!(matches!(
        ZkProvider::new(ZkConfig::new("h:2181/chroot")),
        Err(LeaseError::Config(_))
    ));
    assert!(matches!(
        ZkProvider::new(ZkConfig::new("h:2181").chroot("relative")),
        Err(LeaseError::Config(_))
    ));
}

/// ZooKeeper frozen (SIGSTOP) mid-acquire: the call times out, the server runs
/// the queued claim when it thaws, and the owner-guarded delete the provider
/// queued behind it on the same session removes it: no lease nobody knows of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_acquire_on_a_frozen_server_leaves_no_lease() {
    let zk = owned_zk();
    let p = ZkProvider::new(on_port(zk.port())).unwrap();
    let checker = ZkProvider::new(on_port(zk.port())).unwrap();
    let k = LeaseKey::new("frozen").unwrap();
    // Connected, with the key node in place.
    let warm = until_ok(|| p.try_acquire(&k, TTL))
        .await
        .into_lease()
        .unwrap();
    p.release(&warm).await.unwrap();
    assert!(until_ok(|| checker.inspect(&k)).await.is_none());
    zk.freeze();
    let err = p.try_acquire(&k, TTL).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    zk.thaw();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let held = until_ok(|| checker.inspect(&k)).await;
        if held.is_none() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a lease from the timed-out acquire is still held: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// With a digest identity every node the provider makes is writable by that
/// identity only (readable by anyone): another identity cannot delete the
/// holder node or take keys in the namespace, and gets `Denied`; the same
/// identity on another session works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_acls_keep_other_identities_off_the_nodes() {
    let zk = owned_zk();
    let ns = "acl";
    let with = |auth: Option<(&str, &str)>| {
        let mut c = on_port(zk.port()).namespace(ns);
        if let Some((user, password)) = auth {
            c = c.digest(user, password);
        }
        ZkProvider::new(c).unwrap()
    };
    let owner = with(Some(("app", "app-pw")));
    assert!(!format!("{owner:?}").contains("app-pw"));
    let k = LeaseKey::new("batch/7").unwrap();
    // The first call also waits for the fresh server to serve.
    let held = until_ok(|| owner.try_acquire(&k, TTL))
        .await
        .into_lease()
        .unwrap();

    // A raw client with another identity: the holder node is readable, not deletable.
    let intruder = zookeeper_client::Client::connect(&format!("127.0.0.1:{}", zk.port()))
        .await
        .unwrap();
    intruder.auth("digest", b"intruder:x").await.unwrap();
    let holder = "/lease/acl/batch%2F7/holder";
    intruder.get_data(holder).await.expect("anyone may read");
    assert_eq!(
        intruder.delete(holder, None).await.unwrap_err(),
        zookeeper_client::Error::NoAuth
    );
    assert_eq!(
        intruder
            .set_data("/lease/acl/batch%2F7", b"x", None)
            .await
            .unwrap_err(),
        zookeeper_client::Error::NoAuth
    );

    // Providers with a wrong password or none cannot take keys there.
    let k2 = LeaseKey::new("batch/8").unwrap();
    for (what, p) in [
        ("a wrong password", with(Some(("app", "wrong")))),
        ("no identity", with(None)),
    ] {
        let err = p.try_acquire(&k2, TTL).await.unwrap_err();
        assert!(matches!(err, LeaseError::Denied { .. }), "{what}: {err:?}");
        assert!(!err.to_string().contains("pw"), "{what}: {err}");
    }
    // Another application with its own identity and namespace shares the
    // `/lease` root (which the first identity created) and is not refused.
    let neighbour = ZkProvider::new(
        on_port(zk.port())
            .namespace("other")
            .digest("ops", "ops-pw"),
    )
    .unwrap();
    let l3 = neighbour
        .try_acquire(&k2, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    neighbour.release(&l3).await.unwrap();
    // ...but cannot delete the first one's namespace node.
    assert_eq!(
        intruder.delete("/lease/acl", None).await.unwrap_err(),
        zookeeper_client::Error::NoAuth
    );
    // The same identity on another session can.
    let again = with(Some(("app", "app-pw")));
    let l2 = again
        .try_acquire(&k2, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    again.release(&l2).await.unwrap();
    owner.release(&held).await.unwrap();
}

/// The server's count of packets received (`srvr`).
fn packets_received(port: u16) -> u64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"srvr").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.lines()
        .find_map(|l| l.strip_prefix("Received: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Received line in {out:?}"))
}

/// A lease this provider acquired is extended and released in one request
/// each (a version-checked multi), counted by the server: no read of the
/// holder node and no clock-probe write first. A lease rebuilt from its parts
/// (as `lease release` in another process does) takes the checked path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_leases_extend_and_release_in_one_request_each() {
    let zk = owned_zk();
    let p = ZkProvider::new(on_port(zk.port())).unwrap();
    let k = LeaseKey::new("one-request").unwrap();
    let lease = until_ok(|| p.try_acquire(&k, TTL))
        .await
        .into_lease()
        .unwrap();
    let rounds = 20u64;
    let before = packets_received(zk.port());
    let mut current = lease.clone();
    for _ in 0..rounds {
        current = p.extend(&current, TTL).await.unwrap();
    }
    p.release(&current).await.unwrap();
    let sent = packets_received(zk.port()) - before;
    // One per extend and one for the release; a session ping may fall in.
    assert!(
        sent <= rounds + 1 + 2,
        "{sent} requests for {rounds} extends and a release"
    );
    // The checked path still works, and costs more.
    let lease = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
    let rebuilt = lease_api::Lease::new(
        k.clone(),
        lease.token(),
        lease.owner(),
        TTL,
        tokio::time::Instant::now(),
    )
    .with_handle(lease.handle());
    let before = packets_received(zk.port());
    p.release(&rebuilt).await.unwrap();
    assert!(p.inspect(&k).await.unwrap().is_none());
    assert!(packets_received(zk.port()) - before >= 2);
}

/// Waits until the server has received nothing new for a while but our own
/// `srvr` (which counts as one): every client is parked.
async fn quiet(port: u16) -> u64 {
    let mut last = packets_received(port);
    loop {
        tokio::time::sleep(Duration::from_millis(40)).await;
        let now = packets_received(port);
        if now <= last + 1 {
            return now;
        }
        last = now;
    }
}

/// After the release's notification, a waiter takes the key with one request
/// (its claim multi): the exists watch reports the key's state, so the
/// waiter does not set a new watch before trying. Counted by the server over
/// several handoffs: the release and the claim, two requests each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_takes_the_key_with_one_request() {
    let zk = owned_zk();
    let holder = Arc::new(ZkProvider::new(on_port(zk.port())).unwrap());
    let waiter = Arc::new(ZkProvider::new(on_port(zk.port())).unwrap());
    let k = LeaseKey::new("handoff").unwrap();
    let rounds = 8u64;
    let mut sent = 0;
    for _ in 0..rounds {
        let held = until_ok(|| holder.try_acquire(&k, TTL))
            .await
            .into_lease()
            .unwrap();
        let (w, key) = (Arc::clone(&waiter), k.clone());
        let waiting = tokio::spawn(async move {
            acquire(
                &w,
                &key,
                AcquireOptions::ttl(TTL).wait(Duration::from_secs(20)),
            )
            .await
        });
        let before = quiet(zk.port()).await;
        holder.release(&held).await.unwrap();
        let got = waiting
            .await
            .unwrap()
            .unwrap()
            .expect("the waiter got the key");
        // Less the `srvr` itself.
        sent += packets_received(zk.port()) - before - 1;
        waiter.release(&got).await.unwrap();
    }
    // Two per handoff and our final `srvr`; a session ping may fall in.
    // Watching before trying again costs three.
    assert!(
        sent <= 3 * rounds - 3,
        "{sent} requests for {rounds} handoffs"
    );
}

/// A lease whose handle is not a ZooKeeper key version (rebuilt without it,
/// or from another backend) holds nothing here: ZooKeeper reads version -1
/// as "any version", so it must never reach a version check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_without_a_zookeeper_handle_touches_nothing() {
    let zk = owned_zk();
    let p = ZkProvider::new(on_port(zk.port())).unwrap();
    let k = LeaseKey::new("no-handle").unwrap();
    let held = until_ok(|| p.try_acquire(&k, TTL))
        .await
        .into_lease()
        .unwrap();
    let rebuilt = lease_api::Lease::new(
        k.clone(),
        held.token(),
        held.owner(),
        TTL,
        tokio::time::Instant::now(),
    );
    assert!(matches!(
        p.extend(&rebuilt, TTL).await,
        Err(LeaseError::Lost { .. })
    ));
    assert!(matches!(
        p.release(&rebuilt).await,
        Err(LeaseError::NotHeld { .. })
    ));
    assert_eq!(
        p.inspect(&k).await.unwrap().map(|i| i.token),
        Some(held.token())
    );
    p.release(&held).await.unwrap();
}

/// A session's holder nodes live on the session's own ZooKeeper session and
/// take no write to stay held: one renewal is one multi-read of up to a
/// thousand holder nodes, counted by the server, that finds a node deleted
/// behind the session's back. Closing the session drops every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_renews_a_thousand_holder_nodes_with_one_request() {
    let zk = owned_zk();
    let p = ZkProvider::new(on_port(zk.port())).unwrap();
    let store = until_ok(|| p.session_store(TTL)).await.unwrap();
    let mut leases = Vec::new();
    for i in 0..1000 {
        let k = LeaseKey::new(format!("batch/{i}")).unwrap();
        let l = until_ok(|| store.try_acquire(&k, TTL)).await;
        leases.push(l.into_lease().unwrap());
    }
    // Another client ends one lease; its holder node goes.
    p.release(&leases[7]).await.unwrap();
    let before = quiet(zk.port()).await;
    let answers = store.renew(&leases).await.unwrap();
    let sent = packets_received(zk.port()) - before;
    // The leader proof (one write), the multi-read, this `srvr`, and a
    // session ping that may fall in.
    assert!(sent <= 4, "{sent} requests to renew 1000 leases");
    for (i, a) in answers.iter().enumerate() {
        match (i, a) {
            (7, Err(LeaseError::Lost { .. })) => {}
            (7, other) => panic!("the deleted node's lease answered {other:?}"),
            (_, Ok(l)) => assert!(l.is_valid() && l.token() == leases[i].token()),
            (_, Err(e)) => panic!("lease {i}: {e}"),
        }
    }
    let k0 = leases[0].key().clone();
    assert!(p.inspect(&k0).await.unwrap().is_some());
    store.close().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.inspect(&k0).await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "closing the session left its nodes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The key's waiters node is lost and made again while a waiter holds a
/// ticket (an operator's cleanup, a restore): its numbering starts again
/// and a new waiter gets the stale ticket's number. The stale waiter must
/// find its ticket gone, not refresh, stand in or remove the new waiter's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_number_given_again_after_the_queue_was_lost_is_not_the_old_ticket() {
    let zk = owned_zk();
    let p = ZkProvider::new(on_port(zk.port()).namespace("reuse_test")).unwrap();
    let queue = p.wait_queue().expect("ZooKeeper has a queue of waiters");
    let k = LeaseKey::new("reused-ticket").unwrap();
    let stale = until_ok(|| queue.join(&k, TTL, Ticket::random_mark())).await;
    let admin = zookeeper_client::Client::connect(&format!("127.0.0.1:{}", zk.port()))
        .await
        .unwrap();
    let waiters = "/lease/reuse_test/reused-ticket/waiters";
    for child in admin.list_children(waiters).await.unwrap() {
        admin
            .delete(&format!("{waiters}/{child}"), None)
            .await
            .unwrap();
    }
    admin.delete(waiters, None).await.unwrap();
    let reused = loop {
        let t = queue.join(&k, TTL, Ticket::random_mark()).await.unwrap();
        assert!(t.seq() <= stale.seq(), "the numbering did not start again");
        if t.seq() == stale.seq() {
            break t;
        }
    };
    assert!(
        !queue.refresh(&stale, TTL).await.unwrap(),
        "the stale waiter refreshed the new waiter's ticket {reused:?}"
    );
    assert_eq!(queue.place(&stale).await.unwrap(), Place::Gone);
    queue.leave(&stale).await.unwrap();
    assert!(
        queue.refresh(&reused, TTL).await.unwrap(),
        "the stale waiter's leave removed the new waiter's ticket"
    );
    assert_eq!(queue.place(&reused).await.unwrap(), Place::First);
}

/// The answer to a fair waiter's join is lost (the connection drops after
/// ZooKeeper made the node): the lost node is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_acquire_whose_join_answer_was_lost_does_not_wait_behind_its_own_ticket() {
    let zk = owned_zk();
    let proxy = Proxy::start(zk.port()).await;
    let p = ZkProvider::new(on_port(proxy.port())).unwrap();
    // The join is the first request that creates a node under the key's waiters.
    lease_testkit::assert_a_lost_join_answer_costs_no_wait(Arc::new(p), &proxy, |k| {
        format!("{}/waiters/w-", k.as_str()).into_bytes()
    })
    .await;
}

/// The answer to a fair waiter's join is lost (the connection drops after
/// ZooKeeper made the node) just as its wait runs out, so it never retries: it must still
/// clear the ticket the store made. (The ZooKeeper provider already removes a
/// lost join's ticket itself; this checks the end state every backend owes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_acquire_that_ends_after_a_lost_join_leaves_no_ticket() {
    let zk = owned_zk();
    let proxy = Proxy::start(zk.port()).await;
    let p = ZkProvider::new(on_port(proxy.port())).unwrap();
    // The join is the first request that creates a node under the key's waiters.
    lease_testkit::assert_a_join_lost_as_the_wait_ends_leaves_no_ticket(Arc::new(p), &proxy, |k| {
        format!("{}/waiters/w-", k.as_str()).into_bytes()
    })
    .await;
}

/// A purge deletes the key node, whose version is the acquisition epoch, so
/// a new acquire after it starts the epochs again: the new holder's epoch
/// can equal the one the old holder recorded. The old holder's one-multi
/// extend and release (which check the epoch only, besides its own marker)
/// must not overwrite or delete the new holder's node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_purge_the_old_holder_can_neither_extend_nor_release_the_new_holders_lease() {
    let ns = lease_testkit::unique("purged");
    let config = || ZkConfig::new(store_url("LEASE_TEST_ZK_URL")).namespace(&ns);
    let old = ZkProvider::new(config()).unwrap();
    for op in ["extend", "release"] {
        let k = LeaseKey::new(format!("purged-{op}")).unwrap();
        let stale = until_ok(|| old.try_acquire(&k, TTL))
            .await
            .into_lease()
            .expect("a free key");
        let purger = ZkProvider::new(config()).unwrap();
        assert!(purger.purge_namespaces(&ns).await.unwrap() > 0);
        // A provider that connects after the purge makes the namespace again.
        let new = ZkProvider::new(config()).unwrap();
        let current = until_ok(|| new.try_acquire(&k, TTL))
            .await
            .into_lease()
            .expect("the purged key is free");
        assert_eq!(
            current.handle(),
            stale.handle(),
            "the test needs the epoch to repeat"
        );
        if op == "extend" {
            let extended = old.extend(&stale, TTL).await;
            assert!(
                matches!(extended, Err(LeaseError::Lost { .. })),
                "the old holder extended after a purge: {extended:?}"
            );
        } else {
            let released = old.release(&stale).await;
            assert!(
                matches!(released, Err(LeaseError::NotHeld { .. })),
                "the old holder released after a purge: {released:?}"
            );
        }
        let info = new
            .inspect(&k)
            .await
            .unwrap()
            .expect("the new holder's lease");
        assert_eq!(
            info.owner,
            Some(current.owner()),
            "{op} touched the new holder's node"
        );
        assert_eq!(info.token, current.token());
        new.extend(&current, TTL)
            .await
            .expect("the new holder extends");
        new.release(&current)
            .await
            .expect("the new holder releases");
    }
}

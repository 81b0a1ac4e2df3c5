//! etcd-specific behaviour: restart and outage of a private server, fenced
//! transactions, and exact-key watches.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::TxnOp;
use lease_api::{AcquireOptions, LeaseError, LeaseKey, LeaseProvider, TryAcquire, acquire};
use lease_etcd::{EtcdConfig, EtcdProvider};
use lease_testkit::{OwnedProcess, owned_etcd, store_url};
use lease_testkit::{unique, until_ok};

const TTL: Duration = Duration::from_secs(10);
const TIMEOUT: Duration = Duration::from_millis(800);

fn private(server: &OwnedProcess) -> EtcdProvider {
    EtcdProvider::new(
        EtcdConfig::new([format!("http://127.0.0.1:{}", server.port())]).timeouts(TIMEOUT, TIMEOUT),
    )
    .unwrap()
}

fn shared(ns: &str) -> EtcdProvider {
    EtcdProvider::new(EtcdConfig::new([store_url("LEASE_TEST_ETCD_URL")]).namespace(ns)).unwrap()
}

/// A private etcd the shared outage cases crash and restart (a watch shares
/// the client's connection: nothing of its own to kill).
struct PrivateEtcd(lease_testkit::Restartable);

impl PrivateEtcd {
    fn start() -> Self {
        PrivateEtcd(lease_testkit::Restartable::new(owned_etcd()))
    }
}

#[async_trait::async_trait]
impl lease_conformance::ProviderFactory for PrivateEtcd {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        Ok(Arc::new(EtcdProvider::new(
            EtcdConfig::new([format!("http://127.0.0.1:{}", self.0.port())])
                .namespace(namespace)
                .timeouts(TIMEOUT, TIMEOUT),
        )?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        Ok(Arc::new(EtcdProvider::new(
            EtcdConfig::new(["http://127.0.0.1:1"]).timeouts(TIMEOUT, TIMEOUT),
        )?))
    }

    fn unavailable_within(&self) -> Duration {
        (TIMEOUT * 2) * 2 + Duration::from_secs(1)
    }
}

#[async_trait::async_trait]
impl lease_conformance::Outage for PrivateEtcd {
    fn server(&self) -> &dyn lease_conformance::Server {
        &self.0
    }

    fn may_time_out(&self) -> bool {
        true
    }
}

lease_conformance::outage_tests!(etcd_outage, PrivateEtcd::start());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holders_guarded_transaction_is_rejected() {
    let ns = unique("fenced");
    let (a, b) = (shared(&ns), shared(&ns));
    let k = LeaseKey::new("ledger").unwrap();
    let short = a.capabilities().min_ttl;
    let stale = a
        .try_acquire(&k, short)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let bound = short + a.capabilities().expiry_slack + Duration::from_secs(3);
    let fresh = acquire(
        &Arc::new(b.clone()),
        &k,
        AcquireOptions::ttl(TTL).wait(bound),
    )
    .await
    .unwrap()
    .expect("taken over");
    let target = format!("fenced-data/{ns}");
    match a
        .txn_if_held(&stale, vec![TxnOp::put(target.clone(), "stale", None)])
        .await
    {
        Err(LeaseError::Lost { .. }) => {}
        other => panic!("stale guarded txn: {other:?}"),
    }
    b.txn_if_held(&fresh, vec![TxnOp::put(target.clone(), "fresh", None)])
        .await
        .unwrap();
    b.release(&fresh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_are_exact_and_never_wake_on_a_longer_key() {
    let ns = unique("exact");
    let p = shared(&ns);
    let short = LeaseKey::new("job").unwrap();
    let long = LeaseKey::new("job-2").unwrap();
    let nested = LeaseKey::new("job/2").unwrap();
    let holder = p
        .try_acquire(&short, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let others = [
        p.try_acquire(&long, TTL)
            .await
            .unwrap()
            .into_lease()
            .expect("a longer key is another lease"),
        p.try_acquire(&nested, TTL)
            .await
            .unwrap()
            .into_lease()
            .expect("a nested key is another lease"),
    ];
    let mut watch = p.watch(&short).await.unwrap();
    for l in &others {
        p.release(l).await.unwrap();
    }
    // Releasing the longer keys must not wake the watch on the short one.
    let quiet = Duration::from_millis(800);
    let started = Instant::now();
    watch.changed(quiet).await;
    assert!(
        started.elapsed() >= quiet,
        "woken after {:?} by another key",
        started.elapsed()
    );
    // Releasing the key itself does, at once.
    p.release(&holder).await.unwrap();
    let started = Instant::now();
    watch.changed(Duration::from_secs(10)).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn bad_endpoints_are_config_errors() {
    for eps in [
        vec![],
        vec!["127.0.0.1:2379".to_string()],
        vec!["etcd://x".to_string()],
    ] {
        let err = EtcdProvider::new(EtcdConfig::new(eps.clone())).unwrap_err();
        assert!(matches!(err, LeaseError::Config(_)), "{eps:?}: {err}");
    }
}

/// A restart makes the member leader again, and etcd's lessor then restarts
/// every lease at its full TTL: an unrenewed lease outlives its TTL. The
/// capabilities must declare how far (`failover_extension`), and the key must be
/// free within TTL + slack + that bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_extends_leases_no_further_than_declared() {
    let mut server = owned_etcd();
    let p = private(&server);
    let caps = p.capabilities().clone();
    let ttl = Duration::from_secs(4);
    let k = LeaseKey::new("failover-extension").unwrap();
    let lease = until_ok(|| p.try_acquire(&k, ttl))
        .await
        .into_lease()
        .unwrap();
    let sent = Instant::now();
    tokio::time::sleep(ttl / 2).await;
    server.kill();
    server.start_again();
    let waiter = Arc::new(private(&server));
    let extension = caps
        .failover_extension
        .map_or(Duration::ZERO, |f| f.bound(ttl));
    let bound = ttl + caps.expiry_slack + extension + Duration::from_secs(2);
    let next = until_ok(|| acquire(&waiter, &k, AcquireOptions::ttl(ttl).wait(bound)))
        .await
        .expect("the key was freed within the declared bound");
    let freed = sent.elapsed();
    eprintln!(
        "a {ttl:?} lease was freed {freed:?} after acquire across a restart (declared bound {bound:?})"
    );
    assert!(next.token() > lease.token());
    assert!(
        freed <= bound,
        "freed after {freed:?}, declared bound {bound:?}"
    );
    waiter.release(&next).await.unwrap();
}

/// etcd serving only TLS with client-certificate auth, and users enabled:
/// `app` (read-write on the lease prefix) acquires, waits (the watch runs over
/// TLS) and releases; a wrong password, a user without permission and an
/// untrusted CA are `Denied` at once. (A missing client certificate is not
/// among them: under TLS 1.3 the server refuses it after the handshake, and the
/// client sees only a closed connection, which reads as `Unavailable`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates_and_users_works_and_refusals_are_denied() {
    use lease_etcd::EtcdTls;
    use lease_testkit::{TestCa, etcdctl_tls, owned_etcd_tls};
    let ca = TestCa::new();
    let server = owned_etcd_tls(&ca);
    for args in [
        &["user", "add", "root", "--new-user-password=root-pw"][..],
        &["user", "add", "app", "--new-user-password=app-pw"],
        &["user", "add", "nobody", "--new-user-password=nobody-pw"],
        &["role", "add", "leases"],
        &[
            "role",
            "grant-permission",
            "leases",
            "--prefix=true",
            "readwrite",
            "lease/",
        ],
        &["user", "grant-role", "app", "leases"],
        &["auth", "enable"],
    ] {
        etcdctl_tls(&server, &ca, args);
    }
    let endpoint = format!("https://127.0.0.1:{}", server.port());
    let tls = |ca_file: std::path::PathBuf, with_cert: bool| {
        let tls = EtcdTls::default().ca(ca_file);
        match with_cert.then(|| ca.client()) {
            Some((cert, key)) => tls.identity(cert, key),
            None => tls,
        }
    };
    let make = |user: &str, password: &str, tls: EtcdTls| {
        EtcdProvider::new(
            EtcdConfig::new([endpoint.clone()])
                .credentials(user, password)
                .tls(tls)
                .timeouts(Duration::from_secs(2), Duration::from_secs(2)),
        )
        .unwrap()
    };
    let holder = make("app", "app-pw", tls(ca.ca(), true));
    let waiter = Arc::new(make("app", "app-pw", tls(ca.ca(), true)));
    assert!(!format!("{holder:?}").contains("app-pw"));
    let k = LeaseKey::new(unique("tls")).unwrap();
    // Woken by its watch over TLS.
    lease_testkit::assert_handoff_is_notified(&holder, waiter, &k, TTL, Duration::from_secs(3))
        .await;

    let other = TestCa::new();
    for (what, p) in [
        ("a wrong password", make("app", "wrong", tls(ca.ca(), true))),
        (
            "a user without permission",
            make("nobody", "nobody-pw", tls(ca.ca(), true)),
        ),
        (
            "an untrusted CA",
            make("app", "app-pw", tls(other.ca(), true)),
        ),
    ] {
        lease_testkit::assert_denied(what, &p, &k, "-pw", Duration::from_secs(5)).await;
    }
}

/// The answer to a fair waiter's join is lost (the connection drops after
/// etcd stored the ticket's key): the ticket's etcd lease is revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_acquire_whose_join_answer_was_lost_does_not_wait_behind_its_own_ticket() {
    let server = owned_etcd();
    let proxy = lease_testkit::Proxy::start(server.port()).await;
    let p = EtcdProvider::new(
        EtcdConfig::new([format!("http://127.0.0.1:{}", proxy.port())]).timeouts(TIMEOUT, TIMEOUT),
    )
    .unwrap();
    // The join's put is the first request with a key under the key's queue prefix.
    lease_testkit::assert_a_lost_join_answer_costs_no_wait(Arc::new(p), &proxy, |k| {
        format!("\0q/{}\0/", k.as_str()).into_bytes()
    })
    .await;
}

/// The answer to a fair waiter's join is lost (the connection drops after
/// etcd stored the ticket's key) just as its wait runs out, so it never retries: it must still
/// clear the ticket the store made. (The etcd provider already removes a
/// lost join's ticket itself; this checks the end state every backend owes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_acquire_that_ends_after_a_lost_join_leaves_no_ticket() {
    let server = owned_etcd();
    let proxy = lease_testkit::Proxy::start(server.port()).await;
    let p = EtcdProvider::new(
        EtcdConfig::new([format!("http://127.0.0.1:{}", proxy.port())]).timeouts(TIMEOUT, TIMEOUT),
    )
    .unwrap();
    // The join's put is the first request with a key under the key's queue prefix.
    lease_testkit::assert_a_join_lost_as_the_wait_ends_leaves_no_ticket(Arc::new(p), &proxy, |k| {
        format!("\0q/{}\0/", k.as_str()).into_bytes()
    })
    .await;
}

/// A key deleted behind a session's back between its keep-alive and its
/// read of the keys on its etcd lease is reported lost in that renewal, not
/// renewed for one more round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_key_deleted_during_a_renewal_is_lost_in_that_renewal() {
    use lease_api::{LeaseSession, SessionConfig};
    use std::sync::atomic::{AtomicU32, Ordering};
    let ns = unique("session_delete");
    let p = shared(&ns);
    let session = LeaseSession::open(
        Arc::new(p.clone()),
        SessionConfig::ttl(Duration::from_secs(6)).renew_every(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let k = LeaseKey::new("deleted-behind-its-back").unwrap();
    let lease = session.try_acquire(&k).await.unwrap().expect("free key");
    let lost = lease.lost_token();
    // A second lease keeps the renewal rounds going once the first is lost.
    let other = session
        .try_acquire(&LeaseKey::new("stays").unwrap())
        .await
        .unwrap()
        .expect("free key");
    let (raw, store_key) = raw_client_and_key(&ns, "deleted-behind-its-back").await;
    // Round 1 deletes the key right after its keep-alive; round 2 notes
    // whether round 1 already called it lost.
    let rounds = Arc::new(AtomicU32::new(0));
    let lost_by_round_two = Arc::new(std::sync::Mutex::new(None));
    let (r, seen, l) = (
        Arc::clone(&rounds),
        Arc::clone(&lost_by_round_two),
        lost.clone(),
    );
    p.set_after_keep_alive(Arc::new(move || {
        let round = r.fetch_add(1, Ordering::SeqCst) + 1;
        let (mut raw, key, seen, l) =
            (raw.clone(), store_key.clone(), Arc::clone(&seen), l.clone());
        Box::pin(async move {
            match round {
                1 => {
                    raw.delete(key, None).await.unwrap();
                }
                2 => *seen.lock().unwrap() = Some(l.is_cancelled()),
                _ => {}
            }
        })
    }));
    tokio::time::timeout(Duration::from_secs(10), lost.cancelled())
        .await
        .expect("the deleted key was never reported lost");
    let give_up = Instant::now() + Duration::from_secs(10);
    while lost_by_round_two.lock().unwrap().is_none() {
        assert!(Instant::now() < give_up, "no second renewal round");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        *lost_by_round_two.lock().unwrap(),
        Some(true),
        "the key deleted in renewal round 1 was renewed in it and reported lost only in round 2"
    );
    assert!(
        !other.is_lost(),
        "the other key of the session was lost too"
    );
    session.close().await;
}

/// A key deleted by another client (a release with this lease's token, a
/// purge) between an extend's keep-alive and its read of the key makes that
/// extend fail as lost: the read follows the keep-alive, so no delete before
/// the last read is missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_during_an_extend_fails_that_extend() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let ns = unique("extend_delete");
    let p = shared(&ns);
    let k = LeaseKey::new("deleted-during-extend").unwrap();
    let ttl = p.capabilities().practical_ttl(Duration::from_secs(10));
    let lease = match p.try_acquire(&k, ttl).await.unwrap() {
        TryAcquire::Acquired(l) => l,
        other => panic!("free key: {other:?}"),
    };
    let (raw, store_key) = raw_client_and_key(&ns, "deleted-during-extend").await;
    let deletes = Arc::new(AtomicU32::new(0));
    let d = Arc::clone(&deletes);
    p.set_after_keep_alive(Arc::new(move || {
        let (mut raw, key, d) = (raw.clone(), store_key.clone(), Arc::clone(&d));
        Box::pin(async move {
            if d.fetch_add(1, Ordering::SeqCst) == 0 {
                raw.delete(key, None).await.unwrap();
            }
        })
    }));
    let extended = p.extend(&lease, lease.ttl()).await;
    assert_eq!(deletes.load(Ordering::SeqCst), 1, "the hook ran once");
    assert!(
        matches!(extended, Err(LeaseError::Lost { .. })),
        "an extend whose key was deleted after its keep-alive must fail as lost: {extended:?}"
    );
}

/// A client of the test store and the etcd key of lease `name` in namespace
/// `ns` (the namespace's one that ends with the name).
async fn raw_client_and_key(ns: &str, name: &str) -> (etcd_client::Client, Vec<u8>) {
    let mut raw = etcd_client::Client::connect([store_url("LEASE_TEST_ETCD_URL")], None)
        .await
        .unwrap();
    let found = raw
        .get(
            format!("lease/{ns}/"),
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_keys_only(),
            ),
        )
        .await
        .unwrap();
    let key = found
        .kvs()
        .iter()
        .map(|kv| kv.key().to_vec())
        .find(|key| key.ends_with(name.as_bytes()))
        .expect("the lease's key");
    (raw, key)
}

/// An extend to another TTL moves the key to a new etcd lease in one
/// transaction. When that transaction's answer is lost (the connection
/// drops as etcd answers), the key may already be on the new etcd lease:
/// revoking it then would delete the key inside the holder's validity.
/// Whatever the extend answers, nobody else may take the key while the lease
/// the holder is left with is valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_to_another_ttl_whose_answer_was_lost_keeps_the_key() {
    let server = owned_etcd();
    let proxy = lease_testkit::Proxy::start(server.port()).await;
    let p = EtcdProvider::new(
        EtcdConfig::new([format!("http://127.0.0.1:{}", proxy.port())]).timeouts(TIMEOUT, TIMEOUT),
    )
    .unwrap();
    let other = private(&server);
    let name = unique("lost-extend");
    let k = LeaseKey::new(&name).unwrap();
    let lease = match p.try_acquire(&k, TTL).await.unwrap() {
        TryAcquire::Acquired(l) => l,
        other => panic!("free key: {other:?}"),
    };
    // The transaction is the first request after the grant to name the key.
    proxy.lose_reply_to(name.as_bytes());
    let extended = p.extend(&lease, TTL * 2).await;
    assert!(proxy.reply_lost(), "the transaction's answer was not lost");
    let held = match extended {
        Ok(l) => {
            assert_eq!(l.ttl(), TTL * 2, "{l:?}");
            l
        }
        Err(e) => {
            assert!(e.is_transient(), "a lost answer is no loss: {e:?}");
            lease
        }
    };
    // A revoke runs in the background within milliseconds: 3 s is far past it.
    let until = (Instant::now() + Duration::from_secs(3)).min(held.valid_until().into_std());
    while Instant::now() < until {
        match other.try_acquire(&k, TTL).await {
            Ok(TryAcquire::Held { .. }) | Err(_) => {}
            Ok(TryAcquire::Acquired(l)) => panic!(
                "another client took the key while the holder's lease was valid for {:?} more: {l:?}",
                held.valid_until()
                    .into_std()
                    .saturating_duration_since(Instant::now())
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A key moved to another etcd lease behind the holder's back (as a lost
/// extend to another TTL can leave it, on an etcd lease nobody keeps alive)
/// is not renewed by a keep-alive of the holder's own etcd lease: that
/// extend fails as lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_on_another_etcd_lease_is_not_renewed_by_a_keep_alive() {
    let ns = unique("moved_key");
    let p = shared(&ns);
    let k = LeaseKey::new("moved").unwrap();
    let lease = match p.try_acquire(&k, TTL).await.unwrap() {
        TryAcquire::Acquired(l) => l,
        other => panic!("free key: {other:?}"),
    };
    let (mut raw, store_key) = raw_client_and_key(&ns, "moved").await;
    let orphan = raw.lease_grant(30, None).await.unwrap().id();
    raw.put(
        store_key,
        "",
        Some(
            etcd_client::PutOptions::new()
                .with_lease(orphan)
                .with_ignore_value(),
        ),
    )
    .await
    .unwrap();
    let extended = p.extend(&lease, lease.ttl()).await;
    assert!(
        matches!(extended, Err(LeaseError::Lost { .. })),
        "a key on another etcd lease must not count as renewed: {extended:?}"
    );
    raw.lease_revoke(orphan).await.unwrap();
}

/// An extend to another TTL whose move never reached etcd (the request is
/// lost with its connection): the provider cannot tell that from a lost
/// answer, so it fences the move off (a no-op put guarded on the revision
/// the move was guarded on) before it reports the error, and the move can
/// never land later on a key whose holder believes its old lease. The key
/// stays on the old etcd lease, which still renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_to_another_ttl_whose_request_was_lost_is_fenced_off() {
    let server = owned_etcd();
    let proxy = lease_testkit::Proxy::start(server.port()).await;
    let p = EtcdProvider::new(
        EtcdConfig::new([format!("http://127.0.0.1:{}", proxy.port())]).timeouts(TIMEOUT, TIMEOUT),
    )
    .unwrap();
    let name = unique("fenced-extend");
    let k = LeaseKey::new(&name).unwrap();
    let lease = until_ok(|| p.try_acquire(&k, TTL))
        .await
        .into_lease()
        .expect("a free key");
    let lease_api::backend::LeaseHandle::EtcdLease(old_id) = lease.handle() else {
        panic!("an etcd lease: {lease:?}");
    };
    let mut raw =
        etcd_client::Client::connect([format!("http://127.0.0.1:{}", server.port())], None)
            .await
            .unwrap();
    let found = raw
        .get("lease/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let kv = found
        .kvs()
        .iter()
        .find(|kv| kv.key().ends_with(name.as_bytes()))
        .expect("the lease's key");
    let (store_key, before) = (kv.key().to_vec(), kv.mod_revision());
    // The key as a transaction's compare carries it (field 3): a read
    // (field 1) does not match, the move's transaction does.
    let mut pattern = vec![0x1a, u8::try_from(store_key.len()).unwrap()];
    pattern.extend_from_slice(&store_key);
    proxy.lose_request_to(&pattern);
    let extended = p.extend(&lease, TTL * 2).await;
    assert!(proxy.reply_lost(), "the move's request was never seen");
    let err = extended.expect_err("the move never reached etcd");
    assert!(err.is_transient(), "{err:?}");
    let now = raw.get(store_key, None).await.unwrap();
    let kv = now.kvs().first().expect("the key is still held");
    assert!(
        kv.mod_revision() > before,
        "the revision the lost move was guarded on is still current: it could land later"
    );
    assert_eq!(kv.lease(), old_id, "the key left the old etcd lease");
    p.extend(&lease, lease.ttl())
        .await
        .expect("the old etcd lease still carries the key");
}

/// A lease rebuilt from its parts in another process (as `lease extend`
/// does) with a TTL etcd never granted: the extend is a keep-alive, which
/// renews the etcd lease to what etcd granted, and the lease it returns says
/// that, not the rebuilt TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_of_a_rebuilt_lease_reports_what_etcd_granted() {
    let holder = shared("rebuilt-extend");
    let elsewhere = shared("rebuilt-extend");
    let mut raw = etcd_client::Client::connect([store_url("LEASE_TEST_ETCD_URL")], None)
        .await
        .unwrap();
    let k = LeaseKey::new(unique("rebuilt-extend")).unwrap();
    let held = holder
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let rebuilt = lease_api::Lease::new(
        k.clone(),
        held.token(),
        held.owner(),
        TTL * 3,
        tokio::time::Instant::now(),
    )
    .with_handle(held.handle());
    let extended = elsewhere.extend(&rebuilt, TTL * 3).await.unwrap();
    let id = match extended.handle() {
        lease_api::backend::LeaseHandle::EtcdLease(id) => id,
        other => panic!("not an etcd lease: {other}"),
    };
    let left = raw.lease_time_to_live(id, None).await.unwrap().ttl();
    let believed = extended
        .valid_until()
        .into_std()
        .saturating_duration_since(Instant::now());
    assert!(
        Duration::from_secs(u64::try_from(left).unwrap_or(0) + 1) >= believed,
        "etcd keeps the key {left} s more, the extended lease says it is valid {believed:?} more"
    );
    assert_eq!(extended.ttl(), TTL, "the TTL etcd granted");
    holder.release(&held).await.unwrap();
}

/// An extend to another TTL dropped while its move is in flight: the move
/// lands unseen, and the key goes back to the etcd lease the holder's `Lease`
/// names, which the holder still renews (without it, the key would sit on
/// the new, shorter etcd lease while the holder believes the old validity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_dropped_during_its_move_puts_the_key_back() {
    // Long enough that the drop, half a delay after the grant shows, comes
    // after the client sent the move and before etcd got it, with room on
    // both sides for a loaded machine.
    const DELAY: Duration = Duration::from_millis(1500);
    let server = owned_etcd();
    let proxy = lease_testkit::Proxy::start(server.port()).await;
    let p = EtcdProvider::new(
        EtcdConfig::new([format!("http://127.0.0.1:{}", proxy.port())])
            .timeouts(DELAY * 4, DELAY * 4),
    )
    .unwrap();
    let mut raw =
        etcd_client::Client::connect([format!("http://127.0.0.1:{}", server.port())], None)
            .await
            .unwrap();
    let k = LeaseKey::new(unique("dropped-move")).unwrap();
    let lease = p
        .try_acquire(&k, TTL * 2)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let old_id = match lease.handle() {
        lease_api::backend::LeaseHandle::EtcdLease(id) => id,
        other => panic!("not an etcd lease: {other}"),
    };
    let etcd_key = raw
        .get("lease/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .kvs()
        .iter()
        .find(|kv| kv.lease() == old_id)
        .map(|kv| kv.key().to_vec())
        .expect("the key on the holder's etcd lease");
    let mut events = raw.watch(etcd_key.clone(), None).await.unwrap();
    proxy.delay_requests(DELAY);
    let mut extend = Box::pin(p.extend(&lease, TTL));
    // The grant has landed once etcd lists a second etcd lease; the move is
    // sent right after it and reaches etcd one delay later: drop it halfway.
    let dropped = tokio::select! {
        answer = &mut extend => panic!("the extend answered before the drop: {answer:?}"),
        () = async {
            while raw.leases().await.unwrap().leases().len() < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tokio::time::sleep(DELAY / 2).await;
        } => true,
    };
    assert!(dropped);
    drop(extend);
    // The key moves to the new etcd lease, then back to the holder's.
    let mut leases_seen = Vec::new();
    while leases_seen.last() != Some(&old_id) || leases_seen.len() < 2 {
        let msg = tokio::time::timeout(TTL, events.message())
            .await
            .expect("the key did not go back to the holder's etcd lease")
            .unwrap()
            .unwrap();
        for e in msg.events() {
            if let Some(kv) = e.kv() {
                leases_seen.push(kv.lease());
            }
        }
    }
    assert!(
        leases_seen.iter().any(|id| *id != old_id),
        "the move never landed, the case did not happen: {leases_seen:?}"
    );
    proxy.delay_requests(Duration::ZERO);
    let renewed = p
        .extend(&lease, lease.ttl())
        .await
        .expect("the holder still renews its key");
    p.release(&renewed).await.unwrap();
}

//! Failover of a 3-member etcd cluster (its own, started for this test):
//! the leader is killed while a lease is held and a waiter waits, and the
//! providers must keep what `Capabilities::failover` declares.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_api::LeaseProvider;
use lease_conformance::failover::leader_loss;
use lease_etcd::{EtcdConfig, EtcdProvider};
use lease_testkit::cluster::{EtcdCluster, Topology};
use lease_testkit::unique;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_keeps_the_lease_the_waiter_and_the_token_order() {
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(3))
        .await
        .unwrap();
    let ns = unique("failover");
    let provider = || -> Arc<dyn LeaseProvider> {
        Arc::new(EtcdProvider::new(EtcdConfig::new(cluster.endpoints()).namespace(&ns)).unwrap())
    };
    let (holder, waiter) = (provider(), provider());
    let cluster = Arc::new(Mutex::new(cluster));
    let c = Arc::clone(&cluster);
    let run = leader_loss(holder, waiter, move || {
        let mut c = c.lock().unwrap();
        let leader = c.wait_leader(Duration::from_secs(10));
        eprintln!("killing the leader, member {leader}");
        c.members_mut()[leader].kill();
    })
    .await
    .unwrap_or_else(|e| panic!("etcd failover: {e}"));
    eprintln!("etcd failover: {run:?}");
    // A new leader serves; the killed member comes back on its own data.
    let mut c = cluster.lock().unwrap();
    let dead = c.members().iter().position(|m| !m.is_running()).unwrap();
    c.members_mut()[dead].start_again();
    c.wait_healthy(Duration::from_secs(60));
}

/// The leader cut off from the other members in the packet filter, both
/// ways, while every client still reaches it (the split-brain case): it
/// steps down, the others elect a leader, and the providers, given every
/// member, keep what they declare. A client pinned to the isolated member
/// gets no write acknowledged (the isolation is real: without it the write
/// commits at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolating_the_leader_keeps_the_lease_the_waiter_and_the_token_order() {
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start_splittable(3))
        .await
        .unwrap();
    let endpoints = cluster.endpoints();
    let ns = unique("isolated");
    let provider = || -> Arc<dyn LeaseProvider> {
        Arc::new(EtcdProvider::new(EtcdConfig::new(endpoints.clone()).namespace(&ns)).unwrap())
    };
    let (holder, waiter) = (provider(), provider());
    let cluster = Arc::new(Mutex::new(cluster));
    let isolated = Arc::new(Mutex::new(None));
    let (c, cut) = (Arc::clone(&cluster), Arc::clone(&isolated));
    let run = leader_loss(holder, waiter, move || {
        let c = c.lock().unwrap();
        let leader = c.wait_leader(Duration::from_secs(10));
        eprintln!("isolating the leader, member {leader}");
        c.isolate_member(leader);
        *cut.lock().unwrap() = Some(leader);
    })
    .await
    .unwrap_or_else(|e| panic!("etcd leader isolated: {e}"));
    eprintln!("etcd leader isolated: {run:?}");
    let alone = isolated
        .lock()
        .unwrap()
        .expect("the scenario isolated the leader");
    // Clients still reach it: the cut is between members only.
    let port = cluster.lock().unwrap().members()[alone].port();
    let answer = tokio::task::spawn_blocking(move || {
        lease_testkit::tcp_exchange(port, b"GET /version HTTP/1.0\r\n\r\n")
    })
    .await
    .unwrap();
    assert!(
        answer.as_deref().is_ok_and(|a| a.contains(" 200 ")),
        "a client no longer reaches the isolated member: {answer:?}"
    );
    let pinned = EtcdProvider::new(
        EtcdConfig::new([endpoints[alone].clone()])
            .namespace(&ns)
            .timeouts(Duration::from_secs(1), Duration::from_secs(2)),
    )
    .unwrap();
    let key = lease_api::LeaseKey::new("pinned").unwrap();
    for _ in 0..3 {
        let got = pinned.try_acquire(&key, Duration::from_secs(30)).await;
        assert!(
            got.as_ref().is_err_and(lease_api::LeaseError::is_transient),
            "the isolated member acknowledged a write: {got:?}"
        );
    }
    let c = Arc::clone(&cluster);
    tokio::task::spawn_blocking(move || {
        let c = c.lock().unwrap();
        let leader = c.wait_leader(Duration::from_secs(10));
        assert_ne!(leader, alone, "the isolated member still leads");
        c.rejoin_member(alone);
        c.wait_healthy(Duration::from_secs(60));
    })
    .await
    .unwrap();
}

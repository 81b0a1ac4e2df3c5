//! Failover of a 3-server ZooKeeper ensemble (its own, started for this
//! test): the leader is killed while a lease is held and a waiter waits,
//! and the providers must keep what `Capabilities::failover` declares.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_api::LeaseProvider;
use lease_conformance::failover::leader_loss;
use lease_testkit::cluster::{Topology, ZkEnsemble};
use lease_testkit::unique;
use lease_zk::{ZkConfig, ZkProvider};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_keeps_the_lease_the_waiter_and_the_token_order() {
    let ensemble = tokio::task::spawn_blocking(|| ZkEnsemble::start(3))
        .await
        .unwrap();
    let ns = unique("failover");
    // A 15 s session: leases survive an election of up to 5 s (a third of it).
    let provider = || -> Arc<dyn LeaseProvider> {
        Arc::new(
            ZkProvider::new(
                ZkConfig::new(ensemble.connect_string())
                    .namespace(&ns)
                    .session_timeout(Duration::from_secs(15)),
            )
            .unwrap(),
        )
    };
    let (holder, waiter) = (provider(), provider());
    let ensemble = Arc::new(Mutex::new(ensemble));
    let e = Arc::clone(&ensemble);
    let run = leader_loss(holder, waiter, move || {
        let mut e = e.lock().unwrap();
        let leader = e.wait_leader(Duration::from_secs(10));
        eprintln!("killing the leader, server {}", leader + 1);
        e.members_mut()[leader].kill();
    })
    .await
    .unwrap_or_else(|e| panic!("ZooKeeper failover: {e}"));
    eprintln!("ZooKeeper failover: {run:?}");
    let mut e = ensemble.lock().unwrap();
    let dead = e.members().iter().position(|m| !m.is_running()).unwrap();
    e.members_mut()[dead].start_again();
    e.wait_healthy(Duration::from_secs(60));
}

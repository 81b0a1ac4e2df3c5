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

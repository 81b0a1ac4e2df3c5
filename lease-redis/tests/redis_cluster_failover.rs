//! Failover in a Redis Cluster of three primaries with a replica each: the
//! primary serving the held key's slot is killed (kill -9) while a lease is
//! held and a waiter waits; the cluster promotes its replica, and the
//! providers must keep what `Capabilities::failover` declares.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_api::LeaseProvider;
use lease_conformance::failover::leader_loss;
use lease_redis::{RedisConfig, RedisProvider};
use lease_testkit::cluster::{RedisCluster, Topology};
use lease_testkit::unique;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_slot_primary_keeps_the_lease_the_waiter_and_the_token_order() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 2))
        .await
        .unwrap();
    let ns = unique("failover");
    let provider = || -> Arc<dyn LeaseProvider> {
        Arc::new(
            RedisProvider::new(
                RedisConfig::new(cluster.url())
                    .namespace(&ns)
                    .timeouts(Duration::from_millis(500), Duration::from_millis(500)),
            )
            .unwrap(),
        )
    };
    let (holder, waiter) = (provider(), provider());
    // The scenario holds `failover-held`: its Redis key shares the slot of
    // the hash tag `{ns|failover-held}`.
    let held_key = format!("{{{ns}|failover-held}}:lease");
    let cluster = Arc::new(Mutex::new(cluster));
    let c = Arc::clone(&cluster);
    let run = leader_loss(holder, waiter, move || {
        let mut c = c.lock().unwrap();
        let primary = c
            .primary_of(&held_key)
            .expect("a primary serves the key's slot");
        eprintln!("killing the primary of {held_key}'s slot, node {primary}");
        c.members_mut()[primary].kill();
    })
    .await
    .unwrap_or_else(|e| panic!("Redis Cluster failover: {e:?}"));
    eprintln!("Redis Cluster failover: {run:?}");
    tokio::task::spawn_blocking(move || {
        let mut c = cluster.lock().unwrap();
        let dead = c.members().iter().position(|m| !m.is_running()).unwrap();
        c.members_mut()[dead].start_again();
        c.wait_healthy(Duration::from_secs(60));
    })
    .await
    .unwrap();
}

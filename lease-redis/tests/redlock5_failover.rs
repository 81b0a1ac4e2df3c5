//! Redlock's failover is the loss of a minority of its nodes: two of five
//! are killed (kill -9) while a lease is held and a waiter waits, and the
//! providers must keep what `Capabilities::failover` declares. Then the two
//! come back on their own data (AOF, `appendfsync always`) and tokens must
//! still grow.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_api::{LeaseKey, LeaseProvider};
use lease_conformance::failover::leader_loss;
use lease_redis::{RedlockConfig, RedlockProvider};
use lease_testkit::cluster::{RedisNodes, Topology};
use lease_testkit::{unique, until_ok};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_two_of_five_nodes_keeps_the_lease_the_waiter_and_the_token_order() {
    let nodes = tokio::task::spawn_blocking(|| RedisNodes::start(5))
        .await
        .unwrap();
    let ns = unique("failover");
    let provider = || -> Arc<dyn LeaseProvider> {
        Arc::new(RedlockProvider::new(RedlockConfig::new(nodes.urls()).namespace(&ns)).unwrap())
    };
    let (holder, waiter) = (provider(), provider());
    let nodes = Arc::new(Mutex::new(nodes));
    let n = Arc::clone(&nodes);
    let run = leader_loss(Arc::clone(&holder), waiter, move || {
        let mut n = n.lock().unwrap();
        n.members_mut()[0].kill();
        n.members_mut()[3].kill();
    })
    .await
    .unwrap_or_else(|e| panic!("Redlock failover: {e}"));
    eprintln!("Redlock, 2 of 5 nodes lost: {run:?}");

    // The two come back with their counters; a token issued now exceeds all.
    {
        let mut n = nodes.lock().unwrap();
        n.members_mut()[0].start_again();
        n.members_mut()[3].start_again();
    }
    let k = LeaseKey::new("failover-held").unwrap();
    let ttl = holder.capabilities().practical_ttl(Duration::from_secs(4));
    let again = until_ok(|| holder.try_acquire(&k, ttl))
        .await
        .into_lease()
        .expect("the key is free");
    assert!(
        again.token() > run.tokens.1,
        "{} after {}",
        again.token(),
        run.tokens.1
    );
    holder.release(&again).await.unwrap();
}

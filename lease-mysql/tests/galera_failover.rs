//! Failover on a three-node MariaDB Galera cluster of this test's own: the
//! node the provider uses is killed (kill -9), and the same provider moves
//! on to another node within the recovery its probe declared. The lease
//! held through it survives (its row is on every node) and tokens keep
//! growing; the killed node rejoins.

use std::time::{Duration, Instant};

use lease_api::{FailoverTokens, LeaseKey, LeaseProvider};
use lease_mysql::{MysqlConfig, MysqlProvider};
use lease_testkit::cluster::{GaleraCluster, Topology};
use lease_testkit::until_ok;

const TTL: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_moves_on_when_its_node_is_killed() {
    let mut cluster = GaleraCluster::start(3);
    let timeout = Duration::from_millis(800);
    let p = MysqlProvider::new(MysqlConfig::new(cluster.url()).timeouts(timeout, timeout)).unwrap();
    let caps = until_ok(|| p.probe()).await;
    let failover = caps
        .failover
        .clone()
        .expect("a Galera node declares its failover");
    assert!(
        matches!(failover.tokens, FailoverTokens::Increasing(_)),
        "{failover:?}"
    );
    assert!(failover.lease_survives);
    let key = LeaseKey::new("galera-failover").unwrap();
    let lease = p
        .try_acquire(&key, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    // The provider uses the first node: kill it.
    cluster.members_mut()[0].kill();
    let killed = Instant::now();
    // Unavailable or timed out (the surviving nodes hold commits until they
    // agree the node is gone) until then.
    let renewed = loop {
        match p.extend(&lease, TTL).await {
            Ok(l) => break l,
            Err(e) if e.is_transient() && killed.elapsed() < Duration::from_secs(60) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the provider did not move on: {e:?}"),
        }
    };
    let took = killed.elapsed();
    assert!(
        took <= failover.recovery,
        "the provider served again {took:?} after its node died; it declares {:?}",
        failover.recovery
    );
    assert_eq!(
        renewed.token(),
        lease.token(),
        "the lease survived the failover"
    );
    // Still held, by the same lease, seen through another node.
    let other =
        MysqlProvider::new(MysqlConfig::new(cluster.url()).timeouts(timeout, timeout)).unwrap();
    assert!(
        other
            .try_acquire(&key, TTL)
            .await
            .unwrap()
            .into_lease()
            .is_none()
    );
    p.release(&renewed).await.unwrap();
    let next = other
        .try_acquire(&key, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    assert!(
        next.token() > lease.token(),
        "tokens went back after the failover"
    );
    // The killed node rejoins by state transfer and sees the same row.
    cluster.members_mut()[0].start_again();
    cluster.wait_healthy(Duration::from_secs(90));
    other.release(&next).await.unwrap();
    eprintln!("the provider served again {took:?} after its node was killed");
}

//! Failover driven by Patroni, the agent most PostgreSQL HA deployments
//! run: two members in synchronous mode, their state in an etcd of their
//! own. The primary's host dies (kill -9 of its agent and its PostgreSQL);
//! Patroni promotes the synchronous standby once the leader key lapses, and
//! the provider, given both hosts, finds the new primary by itself. The
//! lease held through it survives, tokens keep growing, and the old primary
//! rejoins as a standby.

use std::time::{Duration, Instant};

use lease_api::{FailoverTokens, LeaseKey, LeaseProvider};
use lease_postgres::{PostgresConfig, PostgresProvider};
use lease_testkit::cluster::{PATRONI_TTL_SECS, PatroniCluster, Topology};
use lease_testkit::{unique, until_ok};

const TTL: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patroni_promotes_the_synchronous_standby_and_the_lease_survives() {
    let mut cluster = tokio::task::spawn_blocking(|| PatroniCluster::start(2))
        .await
        .unwrap();
    let timeout = Duration::from_millis(800);
    let p = PostgresProvider::new(
        PostgresConfig::new(cluster.url())
            .namespace(unique("patroni"))
            .max_connections(4)
            .timeouts(timeout, timeout),
    )
    .unwrap();
    // Patroni's synchronous mode, as the primary shows it: declared.
    let caps = until_ok(|| p.probe()).await;
    let failover = caps
        .failover
        .clone()
        .expect("several hosts declare a failover");
    assert!(
        matches!(failover.tokens, FailoverTokens::Increasing(_)),
        "Patroni's synchronous mode: {failover:?}"
    );
    assert!(failover.lease_survives);
    let key = LeaseKey::new("patroni-held").unwrap();
    let counted = LeaseKey::new("patroni-counted").unwrap();
    let before = until_ok(|| p.try_acquire(&counted, TTL))
        .await
        .into_lease()
        .unwrap();
    p.release(&before).await.unwrap();
    let lease = p
        .try_acquire(&key, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();

    let primary = cluster.wait_leader(Duration::from_secs(10));
    cluster.kill(primary);
    let killed = Instant::now();
    // The leader key lapses after Patroni's TTL; the standby is promoted
    // and the provider connects to it.
    let renewed = loop {
        match p.extend(&lease, TTL).await {
            Ok(l) => break l,
            Err(e) if e.is_transient() && killed.elapsed() < Duration::from_secs(120) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!(
                "the provider never served again: {e:?}\nthe standby's agent:\n{}",
                cluster.members()[1 - primary].log_tail()
            ),
        }
    };
    let took = killed.elapsed();
    // Patroni's detection (its TTL, plus a loop or two and the promotion)
    // and then what the provider declares from the promotion on.
    let bound = Duration::from_secs(PATRONI_TTL_SECS * 3) + failover.recovery;
    eprintln!("served again {took:?} after the primary's host died (bound {bound:?})");
    assert!(
        took <= bound,
        "served again only after {took:?}; bound {bound:?}"
    );
    assert!(
        cluster.leader().is_some_and(|l| l != primary),
        "a standby was promoted"
    );
    // The lease survived (synchronous replication): same token, renewed.
    assert_eq!(renewed.token(), lease.token());
    assert!(p.inspect(&key).await.unwrap().is_some());
    // Tokens keep growing past everything handed out before.
    let after = until_ok(|| p.try_acquire(&counted, TTL))
        .await
        .into_lease()
        .unwrap();
    assert!(after.token() > before.token());
    p.release(&after).await.unwrap();
    p.release(&renewed).await.unwrap();

    // The old primary's host comes back: it rejoins as a standby.
    tokio::task::spawn_blocking(move || {
        cluster.restart(primary);
        cluster.wait_streaming(primary, Duration::from_secs(120));
        cluster.wait_healthy(Duration::from_secs(60));
    })
    .await
    .unwrap();
}

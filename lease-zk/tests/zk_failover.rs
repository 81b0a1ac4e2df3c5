//! Failover of a 3-server ZooKeeper ensemble (its own, started for this
//! test): the leader is killed while a lease is held and a waiter waits,
//! and the providers must keep what `Capabilities::failover` declares.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_api::{LeaseKey, LeaseProvider};
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

/// A provider on a follower must not report a lease another client already
/// released (or miss one it acquired) because that follower has not applied
/// the change yet: `inspect` syncs first. The follower is frozen while the
/// leader commits the change with the other follower, and the read is queued
/// on it before it thaws, so it races the follower catching up. Without the
/// sync the read is served from the stale state most of the time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_on_a_lagging_follower_sees_what_the_leader_committed() {
    let ensemble = tokio::task::spawn_blocking(|| ZkEnsemble::start(3))
        .await
        .unwrap();
    let leader = ensemble.wait_leader(Duration::from_secs(30));
    let follower = (leader + 1) % 3;
    let ns = unique("lagging");
    let on = |i: usize| {
        ZkProvider::new(
            ZkConfig::new(format!("127.0.0.1:{}", ensemble.members()[i].port()))
                .namespace(&ns)
                .session_timeout(Duration::from_secs(15)),
        )
        .unwrap()
    };
    let (writer, reader) = (on(leader), on(follower));
    // Both sessions up before the follower is first frozen.
    let warm = LeaseKey::new("warm").unwrap();
    writer.inspect(&warm).await.unwrap();
    reader.inspect(&warm).await.unwrap();
    let ttl = writer.capabilities().practical_ttl(Duration::from_secs(30));
    // Queues a read on the frozen follower, thaws it, and returns what the
    // read saw.
    let read_across_thaw = |reader: &ZkProvider, key: &LeaseKey| {
        let (reader, key) = (reader.clone(), key.clone());
        let read = tokio::spawn(async move { reader.inspect(&key).await });
        let ensemble = &ensemble;
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            ensemble.members()[follower].thaw();
            read.await.unwrap().unwrap()
        }
    };
    for round in 0..5 {
        let key = LeaseKey::new(format!("k{round}")).unwrap();
        // Acquired while the follower is frozen: the read must see it.
        ensemble.members()[follower].freeze();
        let lease = writer
            .try_acquire(&key, ttl)
            .await
            .unwrap()
            .into_lease()
            .expect("a fresh key is free");
        let seen = read_across_thaw(&reader, &key).await;
        assert_eq!(
            seen.map(|i| i.token),
            Some(lease.token()),
            "round {round}: the follower's read missed an acquire the leader committed"
        );
        // Released while the follower is frozen: the read must not see it.
        ensemble.members()[follower].freeze();
        writer.release(&lease).await.unwrap();
        let seen = read_across_thaw(&reader, &key).await;
        assert!(
            seen.is_none(),
            "round {round}: the follower's read showed a lease the leader had released: {seen:?}"
        );
    }
    // A release by another client (the slow path, which reads the holder
    // first) on the lagging follower must find the lease the leader has.
    for round in 0..5 {
        let key = LeaseKey::new(format!("r{round}")).unwrap();
        ensemble.members()[follower].freeze();
        let lease = writer
            .try_acquire(&key, ttl)
            .await
            .unwrap()
            .into_lease()
            .expect("a fresh key is free");
        let release = tokio::spawn({
            let (reader, lease) = (reader.clone(), lease.clone());
            async move { reader.release(&lease).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        ensemble.members()[follower].thaw();
        let released = release.await.unwrap();
        assert!(
            released.is_ok(),
            "round {round}: a release on the follower missed the lease the leader committed: {released:?}"
        );
        assert!(
            writer.inspect(&key).await.unwrap().is_none(),
            "round {round}"
        );
    }
}

/// The leader cut off from the other servers in the packet filter, both
/// ways, while every client still reaches it (the split-brain case): it
/// gives up leading without a quorum, the others elect a leader, and the
/// providers, given every server, keep what they declare. A client pinned
/// to the isolated server gets no write acknowledged (the isolation is
/// real: without it the write commits at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolating_the_leader_keeps_the_lease_the_waiter_and_the_token_order() {
    let ensemble = tokio::task::spawn_blocking(|| ZkEnsemble::start_splittable(3))
        .await
        .unwrap();
    let servers: Vec<String> = ensemble
        .members()
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port()))
        .collect();
    let ns = unique("isolated");
    let provider = || -> Arc<dyn LeaseProvider> {
        Arc::new(
            ZkProvider::new(
                ZkConfig::new(servers.join(","))
                    .namespace(&ns)
                    .session_timeout(Duration::from_secs(15)),
            )
            .unwrap(),
        )
    };
    let (holder, waiter) = (provider(), provider());
    let ensemble = Arc::new(Mutex::new(ensemble));
    let isolated = Arc::new(Mutex::new(None));
    let (e, cut) = (Arc::clone(&ensemble), Arc::clone(&isolated));
    let run = leader_loss(holder, waiter, move || {
        let e = e.lock().unwrap();
        let leader = e.wait_leader(Duration::from_secs(10));
        eprintln!("isolating the leader, server {}", leader + 1);
        e.isolate_member(leader);
        *cut.lock().unwrap() = Some(leader);
    })
    .await
    .unwrap_or_else(|e| panic!("ZooKeeper leader isolated: {e}"));
    eprintln!("ZooKeeper leader isolated: {run:?}");
    let alone = isolated
        .lock()
        .unwrap()
        .expect("the scenario isolated the leader");
    // Clients still reach it (it answers, though it serves no session
    // without a quorum): the cut is between servers only.
    let port = ensemble.lock().unwrap().members()[alone].port();
    let answer = tokio::task::spawn_blocking(move || lease_testkit::tcp_exchange(port, b"srvr"))
        .await
        .unwrap();
    assert!(
        answer.as_deref().is_ok_and(|a| !a.trim().is_empty()),
        "a client no longer reaches the isolated server: {answer:?}"
    );
    let pinned = ZkProvider::new(
        ZkConfig::new(servers[alone].clone())
            .namespace(&ns)
            .session_timeout(Duration::from_secs(4)),
    )
    .unwrap();
    let key = LeaseKey::new("pinned").unwrap();
    for _ in 0..3 {
        let got = tokio::time::timeout(
            Duration::from_secs(10),
            pinned.try_acquire(&key, Duration::from_secs(30)),
        )
        .await;
        assert!(
            !matches!(got, Ok(Ok(_))),
            "the isolated server acknowledged a write: {got:?}"
        );
    }
    let e = Arc::clone(&ensemble);
    tokio::task::spawn_blocking(move || {
        let e = e.lock().unwrap();
        let leader = e.wait_leader(Duration::from_secs(10));
        assert_ne!(leader, alone, "the isolated server still leads");
        e.rejoin_member(alone);
        e.wait_healthy(Duration::from_secs(60));
    })
    .await
    .unwrap();
}

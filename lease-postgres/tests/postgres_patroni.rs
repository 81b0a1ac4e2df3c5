//! Failover driven by Patroni, the agent most PostgreSQL HA deployments
//! run: two members in synchronous mode, their state in an etcd of their
//! own. The primary's host dies (kill -9 of its agent and its PostgreSQL);
//! Patroni promotes the synchronous standby once the leader key lapses, and
//! the provider, given both hosts, finds the new primary by itself. The
//! lease held through it survives, tokens keep growing, and the old primary
//! rejoins as a standby.

use std::time::{Duration, Instant};

use lease_api::{Failover, FailoverTokens, Lease, LeaseKey, LeaseProvider};
use lease_postgres::{PostgresConfig, PostgresProvider};
use lease_testkit::cluster::{PATRONI_TTL_SECS, PatroniCluster, Topology};
use lease_testkit::{unique, until_ok};

const TTL: Duration = Duration::from_secs(120);

/// Renews `lease` until the provider serves again (the standby promoted),
/// for up to 120 s after `since`; only transient errors are waited out.
async fn renew_on_the_standby(
    p: &PostgresProvider,
    lease: &Lease,
    cluster: &PatroniCluster,
    standby: usize,
    since: Instant,
) -> Lease {
    loop {
        match p.extend(lease, TTL).await {
            Ok(l) => return l,
            Err(e) if e.is_transient() && since.elapsed() < Duration::from_secs(120) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!(
                "the provider never served again: {e:?}\nthe standby's agent:\n{}",
                cluster.members()[standby].log_tail()
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patroni_promotes_the_synchronous_standby_and_the_lease_survives() {
    let mut cluster = tokio::task::spawn_blocking(|| PatroniCluster::start(2))
        .await
        .unwrap();
    let timeout = Duration::from_millis(800);
    let namespace = unique("patroni");
    let config = PostgresConfig::new(cluster.url())
        .namespace(namespace)
        .max_connections(4)
        .timeouts(timeout, timeout);
    // One reads Patroni's settings, one knows PostgreSQL's alone.
    let p = PostgresProvider::new(config.clone().patroni(cluster.rest_addrs())).unwrap();
    let plain = PostgresProvider::new(config.clone()).unwrap();
    // A REST API that does not answer: Patroni's defaults (ttl 30 s,
    // loop_wait 10 s, retry_timeout 10 s) are assumed.
    let unanswered = PostgresProvider::new(config.patroni(["127.0.0.1:1"])).unwrap();
    let assumed = until_ok(|| unanswered.probe())
        .await
        .failover
        .expect("several hosts");
    assert!(
        assumed.recovery >= Duration::from_secs(50),
        "Patroni's defaults: {assumed:?}"
    );
    // Patroni's synchronous mode: declared, and its detection time counted.
    let caps = until_ok(|| p.probe()).await;
    let failover = caps
        .failover
        .clone()
        .expect("several hosts declare a failover");
    assert!(
        matches!(&failover.tokens, FailoverTokens::Increasing(why) if why.contains("sync key")),
        "Patroni's synchronous mode: {failover:?}"
    );
    assert!(failover.lease_survives);
    assert!(
        failover.recovery >= Duration::from_secs(PATRONI_TTL_SECS),
        "the declared recovery counts Patroni's ttl: {failover:?}"
    );
    // The cluster's primary_start_timeout is 0: a recovery from Patroni's
    // default (300 s) would mean the setting was not read.
    assert!(
        failover.recovery < Duration::from_secs(60),
        "the declared recovery follows the cluster's primary_start_timeout: {failover:?}"
    );
    let plain_recovery = until_ok(|| plain.probe())
        .await
        .failover
        .expect("several hosts")
        .recovery;
    assert!(plain_recovery < failover.recovery);
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
    let renewed = renew_on_the_standby(&p, &lease, &cluster, 1 - primary, killed).await;
    let took = killed.elapsed();
    // What the provider declares: Patroni's detection and promotion, then
    // finding the new primary (plus the test's own 100 ms retries).
    let bound = failover.recovery + Duration::from_secs(2);
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
    // One member left: Patroni cleared synchronous_standby_names, so
    // PostgreSQL's settings alone now say a promotion may lose commits; but
    // Patroni promotes no standby that is not in sync, and the provider
    // that reads its settings still declares increasing tokens.
    // (Patroni clears it a loop or more after the promotion.)
    let promoted = Instant::now();
    loop {
        let plain_now = until_ok(|| plain.probe())
            .await
            .failover
            .expect("several hosts");
        if matches!(plain_now.tokens, FailoverTokens::MayRepeat(_)) {
            break;
        }
        assert!(
            promoted.elapsed() < Duration::from_secs(30),
            "PostgreSQL's settings alone, one member left, 30 s on: {plain_now:?}\n{}",
            cluster.members()[1 - primary].log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let now = until_ok(|| p.probe())
        .await
        .failover
        .expect("several hosts");
    assert!(
        matches!(now.tokens, FailoverTokens::Increasing(_)),
        "Patroni's settings, one member left: {now:?}"
    );

    // The old primary's host comes back: it rejoins as a standby.
    tokio::task::spawn_blocking(move || {
        cluster.restart(primary);
        cluster.wait_streaming(primary, Duration::from_secs(120));
        cluster.wait_healthy(Duration::from_secs(60));
    })
    .await
    .unwrap();
}

/// The split-brain case: the primary is cut off from its standby and from
/// etcd while clients still reach it. Its commits wait for the synchronous
/// standby it no longer reaches, and its agent, unable to renew the leader
/// key, demotes it; the standby is promoted once the key lapses. A client
/// pinned to the isolated primary therefore gets no write acknowledged
/// (with asynchronous standbys it would, beside the new primary), while a
/// client given both hosts moves to the new primary, where the lease held
/// before the cut is still held and tokens keep growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_primary_acknowledges_no_write_and_the_standby_takes_over() {
    let cluster = tokio::task::spawn_blocking(|| PatroniCluster::start(2))
        .await
        .unwrap();
    let timeout = Duration::from_millis(800);
    let namespace = unique("patroni-isolated");
    let p = PostgresProvider::new(
        PostgresConfig::new(cluster.url())
            .namespace(namespace.clone())
            .max_connections(4)
            .timeouts(timeout, timeout),
    )
    .unwrap();
    let primary = cluster.wait_leader(Duration::from_secs(10));
    // A client that knows only the primary's address.
    let pinned = PostgresProvider::new(
        PostgresConfig::new(format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            cluster.members()[primary].port()
        ))
        .namespace(namespace)
        .max_connections(4)
        .timeouts(timeout, timeout)
        .patroni(cluster.rest_addrs()),
    )
    .unwrap();
    // One address (as behind HAProxy or a virtual address) with Patroni
    // named: a failover is declared, from Patroni's settings.
    let declared = until_ok(|| pinned.probe())
        .await
        .failover
        .expect("one host with Patroni named declares a failover");
    assert!(
        matches!(&declared.tokens, FailoverTokens::Increasing(why) if why.contains("sync key")),
        "{declared:?}"
    );
    let key = LeaseKey::new("isolated-held").unwrap();
    let counted = LeaseKey::new("isolated-counted").unwrap();
    let before = until_ok(|| p.try_acquire(&counted, TTL))
        .await
        .into_lease()
        .unwrap();
    p.release(&before).await.unwrap();
    let lease = until_ok(|| pinned.try_acquire(&key, TTL))
        .await
        .into_lease()
        .unwrap();

    cluster.isolate(primary);
    let cut = Instant::now();
    // The pinned client keeps trying to write on the isolated primary
    // until the cut heals: fresh keys, and renewals of the held lease.
    let healed = std::sync::Arc::new(tokio::sync::Notify::new());
    let pinned_writes = tokio::spawn({
        let healed = std::sync::Arc::clone(&healed);
        let lease = lease.clone();
        async move {
            let mut acknowledged = Vec::new();
            let mut tries = 0u32;
            loop {
                tries += 1;
                let fresh = LeaseKey::new(format!("isolated-fresh-{tries}")).unwrap();
                if let Ok(grant) = pinned.try_acquire(&fresh, TTL).await {
                    acknowledged.push(format!("{fresh:?}: {grant:?}"));
                }
                if let Ok(l) = pinned.extend(&lease, TTL).await {
                    acknowledged.push(format!("extend: {l:?}"));
                }
                tokio::select! {
                    () = healed.notified() => return (tries, acknowledged),
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
        }
    });
    // The standby is promoted once the leader key lapses; the client with
    // both hosts finds it and renews the lease there.
    let renewed = renew_on_the_standby(&p, &lease, &cluster, 1 - primary, cut).await;
    eprintln!(
        "served by the promoted standby {:?} after the cut",
        cut.elapsed()
    );
    assert_eq!(
        cluster.leader(),
        Some(1 - primary),
        "the standby was promoted and the isolated primary demoted\nthe isolated primary's agent:\n{}\nthe standby's agent:\n{}",
        cluster.members()[primary].log_tail(),
        cluster.members()[1 - primary].log_tail()
    );
    assert_eq!(renewed.token(), lease.token(), "the lease survived");
    let other = until_ok(|| p.try_acquire(&key, TTL)).await;
    assert!(
        other.into_lease().is_none(),
        "the held lease is still held on the new primary"
    );
    let after = until_ok(|| p.try_acquire(&counted, TTL))
        .await
        .into_lease()
        .unwrap();
    assert!(after.token() > before.token());
    // A few more attempts on the isolated (now demoted) member, then heal.
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.rejoin(primary);
    healed.notify_one();
    let (tries, acknowledged) = pinned_writes.await.unwrap();
    assert!(
        acknowledged.is_empty(),
        "the isolated primary acknowledged writes beside the new primary ({} of {tries} rounds): {acknowledged:?}",
        acknowledged.len()
    );
    assert!(tries >= 5, "the pinned client tried only {tries} rounds");
    p.release(&after).await.unwrap();
    p.release(&renewed).await.unwrap();
    // The old primary rejoins as a standby of the new one.
    tokio::task::spawn_blocking(move || {
        cluster.wait_streaming(primary, Duration::from_secs(120));
        cluster.wait_healthy(Duration::from_secs(60));
    })
    .await
    .unwrap();
}

/// What the probe declares follows the cluster's live settings, read from
/// the first REST API that answers:
/// - one that accepts and never answers, listed first, costs one response
///   timeout, and the next one's settings are read (not Patroni's
///   defaults);
/// - `synchronous_mode` switched off: `MayRepeat`, naming the lag Patroni
///   allows an asynchronous standby;
/// - `pause: true` (maintenance mode): no bound, since Patroni then
///   promotes nobody by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_declaration_follows_patronis_settings_past_a_silent_rest_api() {
    let cluster = tokio::task::spawn_blocking(|| PatroniCluster::start(2))
        .await
        .unwrap();
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole_addr = hole.local_addr().unwrap().to_string();
    let _held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = hole.accept().await {
            open.push(socket);
        }
    });
    let timeout = Duration::from_millis(800);
    let mut rest = vec![hole_addr];
    rest.extend(cluster.rest_addrs());
    let p = PostgresProvider::new(
        PostgresConfig::new(cluster.url())
            .namespace(unique("patroni-settings"))
            .timeouts(timeout, timeout)
            .patroni(rest),
    )
    .unwrap();
    let warm = LeaseKey::new("warm").unwrap();
    until_ok(|| p.inspect(&warm)).await;
    let started = Instant::now();
    let first = p.probe().await.unwrap().failover.unwrap();
    let took = started.elapsed();
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(10),
        "the silent address costs one response timeout, not the probe: {took:?}"
    );
    assert!(
        matches!(&first.tokens, FailoverTokens::Increasing(why) if why.contains("sync key")),
        "the answering API's synchronous_mode, not Patroni's defaults: {first:?}"
    );
    assert!(
        first.recovery < Duration::from_secs(50),
        "the cluster's ttl, not Patroni's defaults: {first:?}"
    );

    let c = tokio::task::spawn_blocking(move || {
        cluster.patch_config(r#"{"synchronous_mode": false}"#);
        cluster
    })
    .await
    .unwrap();
    let asynchronous = until_declared(&p, |f| {
        matches!(&f.tokens, FailoverTokens::MayRepeat(why) if why.contains("maximum_lag_on_failover"))
    })
    .await;
    assert!(asynchronous.recovery < Duration::from_secs(50));

    let _c = tokio::task::spawn_blocking(move || {
        c.patch_config(r#"{"pause": true}"#);
        c
    })
    .await
    .unwrap();
    let paused = until_declared(&p, |f| f.recovery == Duration::MAX).await;
    assert!(
        matches!(&paused.tokens, FailoverTokens::MayRepeat(why) if why.contains("paused")),
        "{paused:?}"
    );
}

/// Probes `p` until its failover declaration passes `ok`, for up to 30 s.
async fn until_declared(p: &PostgresProvider, ok: impl Fn(&Failover) -> bool) -> Failover {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let f = p.probe().await.unwrap().failover.unwrap();
        if ok(&f) {
            return f;
        }
        assert!(Instant::now() < deadline, "still declared: {f:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

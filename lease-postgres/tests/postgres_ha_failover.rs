//! Failover of a PostgreSQL primary with a streaming standby (each test
//! starts its own): the primary is killed (kill -9) and the standby
//! promoted, as a failover agent would, while a lease is held and a waiter
//! waits. The providers were given both hosts and must find the new primary
//! by themselves. With a synchronous standby every token and lease survive;
//! with an asynchronous one the capabilities say tokens may repeat.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_api::{FailoverTokens, LeaseKey, LeaseProvider};
use lease_conformance::failover::leader_loss;
use lease_postgres::{PostgresConfig, PostgresProvider};
use lease_testkit::cluster::{PostgresHa, Topology};
use lease_testkit::{unique, until_ok};

fn provider(url: &str, ns: &str) -> PostgresProvider {
    PostgresProvider::new(
        PostgresConfig::new(url)
            .namespace(ns)
            .max_connections(4)
            .timeouts(Duration::from_millis(500), Duration::from_millis(1000)),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_primary_and_promoting_the_standby_keeps_the_lease_the_waiter_and_the_tokens() {
    let ha = tokio::task::spawn_blocking(|| PostgresHa::start(true))
        .await
        .unwrap();
    let ns = unique("failover");
    let (holder, waiter): (Arc<dyn LeaseProvider>, Arc<dyn LeaseProvider>) = (
        Arc::new(provider(&ha.url(), &ns)),
        Arc::new(provider(&ha.url(), &ns)),
    );
    let ha = Arc::new(Mutex::new(ha));
    let h = Arc::clone(&ha);
    let run = leader_loss(holder, waiter, move || {
        let mut h = h.lock().unwrap();
        let primary = h.wait_leader(Duration::from_secs(10));
        eprintln!("killing the primary, member {primary}, and promoting the standby");
        h.members_mut()[primary].kill();
        h.promote(1 - primary);
    })
    .await
    .unwrap_or_else(|e| panic!("PostgreSQL failover: {e}"));
    eprintln!("PostgreSQL failover: {run:?}");
}

/// Kills the primary, thaws the standby and promotes it.
async fn fail_over(ha: PostgresHa, primary: usize) -> PostgresHa {
    tokio::task::spawn_blocking(move || {
        let mut ha = ha;
        ha.members_mut()[primary].kill();
        ha.members()[1 - primary].thaw();
        ha.promote(1 - primary);
        ha
    })
    .await
    .unwrap()
}

/// A synchronous standby cut off (frozen, its WAL sender ended): an acquire
/// waits for it and gives up, handing out nothing, and after the promotion
/// every token exceeds every token handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_synchronous_standby_cut_off_nothing_is_handed_out_that_a_promotion_could_reissue()
{
    let ha = tokio::task::spawn_blocking(|| PostgresHa::start(true))
        .await
        .unwrap();
    let p = provider(&ha.url(), &unique("sync-cut"));
    let caps = p.probe().await.unwrap();
    assert!(
        matches!(
            caps.failover.as_ref().map(|f| &f.tokens),
            Some(FailoverTokens::Increasing(_))
        ),
        "{caps:?}"
    );
    let ttl = caps.practical_ttl(Duration::from_secs(10));
    let k = LeaseKey::new("counted").unwrap();
    let mut handed_out = lease_api::FencingToken(0);
    for _ in 0..3 {
        let lease = until_ok(|| p.try_acquire(&k, ttl))
            .await
            .into_lease()
            .unwrap();
        handed_out = handed_out.max(lease.token());
        p.release(&lease).await.unwrap();
    }
    let primary = ha.cut_replication();
    let refused = p.try_acquire(&k, ttl).await;
    assert!(
        matches!(&refused, Err(e) if e.is_transient()),
        "an acquire no standby has: {refused:?}"
    );
    let _ha = fail_over(ha, primary).await;
    let again = until_ok(|| p.try_acquire(&k, ttl))
        .await
        .into_lease()
        .expect("the key is free after the promotion");
    assert!(
        again.token() > handed_out,
        "token {} after the promotion, {handed_out} handed out before",
        again.token()
    );
}

/// The same with an asynchronous standby: the capabilities say a promotion
/// may hand out a token again, and it does; the provider still follows the
/// promotion by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_asynchronous_standby_a_promotion_reissues_a_token_as_declared() {
    let ha = tokio::task::spawn_blocking(|| PostgresHa::start(false))
        .await
        .unwrap();
    let p = provider(&ha.url(), &unique("async"));
    let caps = p.probe().await.unwrap();
    assert!(
        matches!(
            caps.failover.as_ref().map(|f| &f.tokens),
            Some(FailoverTokens::MayRepeat(_))
        ),
        "{caps:?}"
    );
    let ttl = caps.practical_ttl(Duration::from_secs(10));
    let k = LeaseKey::new("counted").unwrap();
    let first = until_ok(|| p.try_acquire(&k, ttl))
        .await
        .into_lease()
        .unwrap();
    p.release(&first).await.unwrap();
    let ha = tokio::task::spawn_blocking(move || {
        ha.wait_replayed(Duration::from_secs(10));
        ha
    })
    .await
    .unwrap();
    let primary = ha.cut_replication();
    let unreplicated = p.try_acquire(&k, ttl).await.unwrap().into_lease().unwrap();
    assert!(unreplicated.token() > first.token());
    let _ha = fail_over(ha, primary).await;
    let again = until_ok(|| p.try_acquire(&k, ttl))
        .await
        .into_lease()
        .expect("the unreplicated lease is gone with the primary");
    assert!(
        again.token() <= unreplicated.token(),
        "token {} after the promotion did not repeat {}",
        again.token(),
        unreplicated.token()
    );
}

/// The hosts in any order, and a primary that stops answering: a provider
/// given the standby first passes over it, and one whose primary is frozen
/// (SIGSTOP: connections accepted, never answered) moves to the promoted
/// standby by itself, though each attempt on the frozen host is cut short
/// by the call's own deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_listed_first_and_a_frozen_primary_are_passed_over() {
    let ha = tokio::task::spawn_blocking(|| PostgresHa::start(true))
        .await
        .unwrap();
    let primary = ha.wait_leader(Duration::from_secs(10));
    let standby = 1 - primary;
    let port = |i: usize| ha.members()[i].port();
    let standby_first = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres",
        port(standby),
        port(primary)
    );
    let primary_first = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres",
        port(primary),
        port(standby)
    );
    let ns = unique("order");
    let a = provider(&standby_first, &ns);
    let caps = a.probe().await.unwrap();
    assert!(
        matches!(
            caps.failover.as_ref().map(|f| &f.tokens),
            Some(FailoverTokens::Increasing(_))
        ),
        "the probe ran on the primary: {caps:?}"
    );
    let k = LeaseKey::new("ordered").unwrap();
    let ttl = caps.practical_ttl(Duration::from_secs(10));
    let lease = a.try_acquire(&k, ttl).await.unwrap().into_lease().unwrap();
    a.release(&lease).await.unwrap();

    // Connections already open to the primary, and a connect timeout longer
    // than the response timeout: each call's own deadline cuts the attempt
    // on the frozen host short, so only stepping past a host on that
    // cancellation gets anywhere.
    let b = PostgresProvider::new(
        PostgresConfig::new(&primary_first)
            .namespace(&ns)
            .timeouts(Duration::from_secs(5), Duration::from_secs(2)),
    )
    .unwrap();
    let lease = b.try_acquire(&k, ttl).await.unwrap().into_lease().unwrap();
    b.release(&lease).await.unwrap();
    ha.members()[primary].freeze();
    let ha = tokio::task::spawn_blocking(move || {
        ha.promote(standby);
        ha
    })
    .await
    .unwrap();
    // A call that reaches the frozen host times out (transient); the next
    // ones must move on.
    let started = std::time::Instant::now();
    let again = loop {
        match b.try_acquire(&k, ttl).await {
            Ok(got) => break got.into_lease().unwrap(),
            Err(e) if e.is_transient() && started.elapsed() < Duration::from_secs(30) => {
                eprintln!("while the primary is frozen: {e}");
            }
            Err(e) => panic!("no recovery past the frozen primary: {e}"),
        }
    };
    eprintln!(
        "serving again {:?} after the promotion, past a frozen primary",
        started.elapsed()
    );
    assert!(again.token() > lease.token());
    ha.members()[primary].thaw();
}

//! The advisory-lock mode on a real MariaDB: look-alike keys are different
//! locks, and a holder's session that the server ends frees the key at once
//! (the waiter wakes in the lock's queue) while the holder learns it at its
//! next renewal.

use std::time::{Duration, Instant};

use lease_api::{AcquireOptions, LeaseError, LeaseKey, LeaseProvider, acquire};
use lease_mysql::{AdvisoryProvider, MysqlConfig};
use lease_testkit::{store_url, unique};
use sqlx::Connection;

const TTL: Duration = Duration::from_secs(30);

fn provider(namespace: &str) -> AdvisoryProvider {
    AdvisoryProvider::new(MysqlConfig::new(store_url("LEASE_TEST_MYSQL_URL")).namespace(namespace))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn look_alike_keys_are_different_locks() {
    let p = provider(&unique("advisory_alike"));
    let long = "é".repeat(256);
    let mut held = Vec::new();
    for name in ["a", "A", "a ", "á", "a\u{301}", long.as_str()] {
        let key = LeaseKey::new(name).unwrap();
        let lease = p
            .try_acquire(&key, TTL)
            .await
            .unwrap()
            .into_lease()
            .unwrap_or_else(|| panic!("{name:?} shares a lock with another key"));
        held.push(lease);
    }
    for lease in held {
        p.release(&lease).await.unwrap();
    }
}

/// The server ends the holder's session (`KILL`, as a restart, an operator
/// or a reset connection would): a waiter holds the key within a second,
/// long before the holder's 30 s TTL, and the holder's next renewal is
/// `Lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_the_server_ends_frees_the_key_at_once() {
    let ns = unique("advisory_killed");
    let holder = provider(&ns);
    let waiter = provider(&ns);
    let key = LeaseKey::new("killed").unwrap();
    let lease = holder
        .try_acquire(&key, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let (k, w) = (key.clone(), std::sync::Arc::new(waiter));
    let waiting = tokio::spawn(async move {
        let got = acquire(&w, &k, AcquireOptions::ttl(TTL).wait(TTL)).await;
        (got, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut admin = sqlx::MySqlConnection::connect(&store_url("LEASE_TEST_MYSQL_URL"))
        .await
        .unwrap();
    let id: Option<u64> = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED)")
        .bind(holder.lock_name(&key))
        .fetch_one(&mut admin)
        .await
        .unwrap();
    let id = id.expect("the holder's session holds the lock");
    let killed = Instant::now();
    sqlx::query(&format!("KILL CONNECTION {id}"))
        .execute(&mut admin)
        .await
        .unwrap();
    let (got, at) = waiting.await.unwrap();
    let next = got.unwrap().expect("the waiter got the key");
    let took = at - killed;
    assert!(took < Duration::from_secs(2), "the waiter took {took:?}");
    assert!(next.token() > lease.token());
    let renewal = holder.extend(&lease, TTL).await;
    assert!(
        matches!(renewal, Err(LeaseError::Lost { .. })),
        "{renewal:?}"
    );
}

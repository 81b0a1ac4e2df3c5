//! PostgreSQL sets of keys (C18) where the one statement meets a concurrent
//! transaction: the all-or-nothing guard, not the snapshot, keeps the set
//! whole, and a row another transaction has locked never makes the set
//! statement wait while it holds the set's other rows.

use std::sync::Arc;
use std::time::Duration;

use lease_api::{AcquireOptions, LeaseKey, LeaseProvider, TryAcquireAll, acquire_all, release_all};
use lease_postgres::{PostgresConfig, PostgresProvider};
use lease_testkit::{store_url, unique};

const TTL: Duration = Duration::from_secs(30);

/// A concurrent acquirer takes one key of the set, its row new, after the
/// set statement's snapshot (which saw no row) and commits while the
/// statement waits for that insert. ON CONFLICT's recheck then leaves the row alone, so the
/// statement won fewer rows than keys: it must undo the rows it did take and
/// answer the held key, never hand out half a set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_taken_during_the_set_statement_leaves_the_set_untaken() {
    let url = store_url("LEASE_TEST_POSTGRES_URL");
    let table = unique("sets");
    let ns = unique("race");
    let p = PostgresProvider::new(
        PostgresConfig::new(url.clone())
            .table("public", &table)
            .namespace(&ns),
    )
    .unwrap();
    let (a, b) = (LeaseKey::new("a").unwrap(), LeaseKey::new("b").unwrap());
    let before = p.try_acquire(&a, TTL).await.unwrap().into_lease().unwrap();
    p.release(&before).await.unwrap();

    // Another acquirer's first take of "b", not yet committed.
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let mut other = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO \"public\".\"{table}\" (namespace, key, owner, token, expires_at)
         VALUES ($1, 'b', 'ffffffffffffffffffffffffffffffff', 1, clock_timestamp() + interval '30 seconds')"
    ))
    .bind(&ns)
    .execute(&mut *other)
    .await
    .unwrap();

    let set = tokio::spawn({
        let (p, a, b) = (p.clone(), a.clone(), b.clone());
        async move { p.try_acquire_all(&[a, b], TTL).await }
    });
    // The set statement saw no "b" and now waits for the insert.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !set.is_finished(),
        "the set statement did not wait for the row lock"
    );
    other.commit().await.unwrap();

    match set.await.unwrap().unwrap() {
        TryAcquireAll::Held { key, .. } => assert_eq!(key, b),
        TryAcquireAll::Acquired(l) => panic!("took a set with a key another holder has: {l:?}"),
    }
    assert!(
        p.inspect(&a).await.unwrap().is_none(),
        "half the set was left held"
    );
    // The undone take of "a" used no token: the next one follows the last.
    let next = p.try_acquire(&a, TTL).await.unwrap().into_lease().unwrap();
    assert_eq!(next.token().get(), before.token().get() + 1);
    p.release(&next).await.unwrap();
}

/// A lease expired while its holder's fenced transaction still runs: that
/// transaction keeps the row locked (FOR SHARE), so no acquire may take the
/// key until it ends. A set with that key answers it as held at once, rather
/// than waiting for the lock while holding its other rows locked: an acquire
/// of another key of the set goes through meanwhile. The set is taken once
/// the fenced transaction ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_locked_by_a_fenced_transaction_is_held_for_the_set_not_waited_on() {
    let ns = unique("fenced-set");
    let p = PostgresProvider::new(
        PostgresConfig::new(store_url("LEASE_TEST_POSTGRES_URL")).namespace(&ns),
    )
    .unwrap();
    let (a, b) = (LeaseKey::new("a").unwrap(), LeaseKey::new("b").unwrap());
    let short = Duration::from_millis(300);
    let old = p
        .try_acquire(&b, short)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let fenced = p.begin_fenced(&old).await.unwrap();
    tokio::time::sleep(short + Duration::from_millis(200)).await;

    let started = std::time::Instant::now();
    match p
        .try_acquire_all(&[a.clone(), b.clone()], TTL)
        .await
        .unwrap()
    {
        TryAcquireAll::Held { key, remaining } => {
            assert_eq!(key, b);
            assert!(
                remaining.is_some_and(|r| r <= Duration::from_millis(100)),
                "{remaining:?}"
            );
        }
        TryAcquireAll::Acquired(_) => panic!("took a key under an open fenced transaction"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the set waited {:?} for the locked row",
        started.elapsed()
    );
    // "a" was neither taken nor left locked.
    let alone = p.try_acquire(&a, TTL).await.unwrap().into_lease().unwrap();
    p.release(&alone).await.unwrap();

    let waiting = tokio::spawn({
        let (p, a, b) = (Arc::new(p.clone()), a.clone(), b.clone());
        async move {
            let options = AcquireOptions::ttl(TTL).wait(Duration::from_secs(20));
            acquire_all(&p, &[a, b], options).await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the set was taken under the fenced transaction"
    );
    fenced.commit().await.unwrap();
    let set = waiting
        .await
        .unwrap()
        .unwrap()
        .expect("the set once the transaction ended");
    assert!(set[1].token() > old.token());
    release_all(&p, &set).await.unwrap();
}

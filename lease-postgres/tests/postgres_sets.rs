//! PostgreSQL sets of keys (C18) where the one statement meets a concurrent
//! commit: the all-or-nothing guard, not the snapshot, keeps the set whole.

use std::time::Duration;

use lease_api::{LeaseKey, LeaseProvider, TryAcquireAll};
use lease_postgres::{PostgresConfig, PostgresProvider};
use lease_testkit::{store_url, unique};

const TTL: Duration = Duration::from_secs(30);

/// A concurrent acquirer takes one row of the set after the set statement's
/// snapshot (which saw it free) and commits while the statement waits for
/// that row's lock. ON CONFLICT's recheck then leaves the row alone, so the
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
    // Rows for both keys exist, free.
    for k in [&a, &b] {
        let l = p.try_acquire(k, TTL).await.unwrap().into_lease().unwrap();
        p.release(&l).await.unwrap();
    }
    let before = p.try_acquire(&a, TTL).await.unwrap().into_lease().unwrap();
    p.release(&before).await.unwrap();

    // Another acquirer's statement on "b", not yet committed: it holds the row lock.
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let mut other = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "UPDATE \"public\".\"{table}\" SET owner = 'ffffffffffffffffffffffffffffffff', token = token + 1,
                expires_at = clock_timestamp() + interval '30 seconds'
          WHERE namespace = $1 AND key = 'b'"
    ))
    .bind(&ns)
    .execute(&mut *other)
    .await
    .unwrap();

    let set = tokio::spawn({
        let (p, a, b) = (p.clone(), a.clone(), b.clone());
        async move { p.try_acquire_all(&[a, b], TTL).await }
    });
    // The set statement saw "b" free and now waits for its lock.
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

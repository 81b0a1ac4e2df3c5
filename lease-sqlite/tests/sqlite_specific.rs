//! SQLite-specific behaviour: tokens outlive rows and providers, a lease of
//! an earlier boot is expired, and a file that cannot be opened is
//! `Unavailable`.

use std::time::Duration;

use lease_api::{LeaseError, LeaseKey, LeaseProvider};
use lease_sqlite::{SqliteConfig, SqliteProvider};

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_growing_after_the_rows_are_deleted_and_the_file_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("leases.db");
    let k = LeaseKey::new("tokens").unwrap();
    let first = {
        let p = SqliteProvider::new(SqliteConfig::new(&db).namespace("t-a")).unwrap();
        let l = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
        p.release(&l).await.unwrap();
        // Every row of the namespace goes; the counter stays.
        assert_eq!(p.purge_namespaces("t-").await.unwrap(), 1);
        l.token()
    };
    let p = SqliteProvider::new(SqliteConfig::new(&db).namespace("t-a")).unwrap();
    let again = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
    assert!(again.token() > first, "{} after {}", again.token(), first);
}

/// CLOCK_MONOTONIC restarts at boot: a row written in an earlier boot is
/// expired whatever its expiry number says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_an_earlier_boot_is_expired() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("leases.db");
    let p = SqliteProvider::new(SqliteConfig::new(&db)).unwrap();
    let k = LeaseKey::new("boot").unwrap();
    let held = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
    // Pretend the row was written before a reboot, with a far-away expiry.
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    sqlx::query(
        "UPDATE lease_leases SET boot = 'an-earlier-boot', expires_at = 9223372036854775000",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert!(p.inspect(&k).await.unwrap().is_none());
    let next = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
    assert!(next.token() > held.token());
    // The old holder cannot touch the new lease.
    assert!(matches!(
        p.extend(&held, TTL).await,
        Err(LeaseError::Lost { .. })
    ));
    p.release(&next).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_cannot_be_opened_is_unavailable_and_urls_parse() {
    let p = SqliteProvider::new(
        SqliteConfig::new("/nonexistent-lease-dir/leases.db")
            .busy_timeout(Duration::from_millis(300)),
    )
    .unwrap();
    let err = p
        .try_acquire(&LeaseKey::new("k").unwrap(), TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, LeaseError::Unavailable { .. }), "{err:?}");
    let c: SqliteConfig = "sqlite:///var/lib/lease/leases.db".parse().unwrap();
    assert_eq!(c.path, std::path::PathBuf::from("/var/lib/lease/leases.db"));
    assert!("sqlite://".parse::<SqliteConfig>().is_err());
    assert!("redis://x".parse::<SqliteConfig>().is_err());
}

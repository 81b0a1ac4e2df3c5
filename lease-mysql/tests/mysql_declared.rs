//! What the MySQL provider declares, shown on live servers: token
//! durability from the server's flush setting, waiting polled at the
//! declared interval, and a read-only server (a demoted node) reported as
//! an outage that changes nothing, to an account that may not create
//! tables (so the lease table is created only when missing).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_api::{
    AcquireOptions, LeaseError, LeaseKey, LeaseProvider, Notifications, TokenDurability, acquire,
};
use lease_mysql::{MysqlConfig, MysqlProvider};
use lease_testkit::{owned_mysql, store_url, unique, until_ok};

const TTL: Duration = Duration::from_secs(30);

/// `innodb_flush_log_at_trx_commit` 1 declares tokens durable; 2 (the log
/// written at commit, flushed once a second) declares them volatile, as a
/// crash can lose the last second of commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_durability_follows_the_servers_flush_setting() {
    let shared = MysqlProvider::from_url(&store_url("LEASE_TEST_MYSQL_URL")).unwrap();
    let caps = until_ok(|| shared.probe()).await;
    assert!(
        matches!(caps.durable_tokens, TokenDurability::Durable(_)),
        "{:?}",
        caps.durable_tokens
    );
    let lazy = owned_mysql(&["--innodb-flush-log-at-trx-commit=2"]);
    let p =
        MysqlProvider::from_url(&format!("mysql://root@127.0.0.1:{}/lease", lazy.port())).unwrap();
    let caps = until_ok(|| p.probe()).await;
    assert!(
        matches!(&caps.durable_tokens, TokenDurability::Volatile(why) if why.contains("is 2")),
        "{:?}",
        caps.durable_tokens
    );
    // The provider's own capabilities say so after the probe.
    assert!(matches!(
        p.capabilities().durable_tokens,
        TokenDurability::Volatile(_)
    ));
}

/// A waiter reads its key's row every poll interval: released, the key is
/// taken by the waiter within that interval (plus a generous slack), not
/// after the holder's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_takes_a_released_key_within_the_declared_poll_interval() {
    let every = Duration::from_millis(400);
    let p = Arc::new(
        MysqlProvider::new(
            MysqlConfig::new(store_url("LEASE_TEST_MYSQL_URL"))
                .namespace(unique("polled"))
                .poll_interval(every),
        )
        .unwrap(),
    );
    assert_eq!(p.capabilities().notifications, Notifications::Polled(every));
    let key = LeaseKey::new("polled").unwrap();
    let held = p
        .try_acquire(&key, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let waiter = tokio::spawn({
        let (p, key) = (Arc::clone(&p), key.clone());
        async move {
            let lease = acquire(&p, &key, AcquireOptions::ttl(TTL).wait(TTL))
                .await
                .unwrap()
                .expect("the waiter got the key");
            (Instant::now(), lease)
        }
    });
    // Let the waiter start watching (it reads the row first).
    tokio::time::sleep(every * 2).await;
    let released = Instant::now();
    p.release(&held).await.unwrap();
    let (got_at, lease) = waiter.await.unwrap();
    let took = got_at.duration_since(released);
    assert!(
        took <= every + Duration::from_millis(1500),
        "the waiter took the key {took:?} after its release; it polls every {every:?}"
    );
    assert!(lease.token() > held.token());
    p.release(&lease).await.unwrap();
}

/// A server turned read-only (as a demoted node is) refuses writes with
/// 1290: the provider calls it an outage (`Unavailable`, worth retrying),
/// never a lost lease or a plain error, and nothing changes; writable again,
/// it serves. The account may read and write rows but not create tables:
/// the lease table, made by an administrator, is used as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_an_outage_that_changes_nothing() {
    let server = owned_mysql(&[]);
    let root = MysqlProvider::from_url(&format!("mysql://root@127.0.0.1:{}/lease", server.port()))
        .unwrap();
    // The administrator's first use makes the table.
    root.migrate().await.unwrap();
    let admin = root.pool().unwrap();
    for sql in [
        "CREATE USER 'app'@'127.0.0.1' IDENTIFIED BY 'pw'",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON lease.* TO 'app'@'127.0.0.1'",
    ] {
        sqlx::query(sql).execute(admin).await.unwrap();
    }
    let p = MysqlProvider::new(
        MysqlConfig::new(format!("mysql://app:pw@127.0.0.1:{}/lease", server.port()))
            .namespace(unique("read-only")),
    )
    .unwrap();
    let key = LeaseKey::new("held").unwrap();
    let held = p
        .try_acquire(&key, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    sqlx::query("SET GLOBAL read_only = 1")
        .execute(admin)
        .await
        .unwrap();
    let other = LeaseKey::new("other").unwrap();
    let err = p.try_acquire(&other, TTL).await.unwrap_err();
    assert!(
        matches!(err, LeaseError::Unavailable { .. }),
        "an acquire on a read-only server: {err:?}"
    );
    let err = p.extend(&held, TTL).await.unwrap_err();
    assert!(
        matches!(err, LeaseError::Unavailable { .. }),
        "a renewal on a read-only server: {err:?}"
    );
    sqlx::query("SET GLOBAL read_only = 0")
        .execute(admin)
        .await
        .unwrap();
    assert!(
        p.inspect(&other).await.unwrap().is_none(),
        "a refused acquire took the key"
    );
    let renewed = p.extend(&held, TTL).await.unwrap();
    assert_eq!(renewed.token(), held.token());
    let taken = p
        .try_acquire(&other, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    p.release(&taken).await.unwrap();
    p.release(&renewed).await.unwrap();
}

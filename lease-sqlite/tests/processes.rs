//! Many processes on one file: the leases hold between processes, not only
//! between the tasks of one. The test binary runs itself as the workers.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_api::{AcquireOptions, LeaseKey, LeaseProvider, acquire};
use lease_sqlite::{SqliteConfig, SqliteProvider};

const ROLE: &str = "LEASE_SQLITE_TEST_ROLE";
const DB: &str = "LEASE_SQLITE_TEST_DB";

fn spawn(role: &str, db: &Path, test: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(ROLE, role)
        .env(DB, db)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn provider(db: &Path) -> Arc<dyn LeaseProvider> {
    Arc::new(
        SqliteProvider::new(SqliteConfig::new(db).busy_timeout(Duration::from_secs(30))).unwrap(),
    )
}

/// Runs `work` on the database this worker process was given.
fn as_worker<F, Fut>(work: F)
where
    F: FnOnce(PathBuf) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let db = PathBuf::from(std::env::var(DB).unwrap());
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(work(db));
}

fn counter_file(db: &Path) -> PathBuf {
    db.with_extension("counter")
}

/// The worker: 25 rounds of read, increment, write on a plain file, each
/// under the lease. Without mutual exclusion between processes, increments
/// are lost.
#[test]
fn counter_worker() {
    if std::env::var(ROLE).as_deref() != Ok("counter") {
        return;
    }
    as_worker(|db| async move {
        let p = provider(&db);
        let key = LeaseKey::new("counter").unwrap();
        let options = AcquireOptions::ttl(Duration::from_secs(10)).wait(Duration::from_secs(120));
        for _ in 0..25 {
            let lease = acquire(&p, &key, options).await.unwrap().unwrap();
            let file = counter_file(&db);
            let n: u64 = std::fs::read_to_string(&file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            // Widen the window a lost update needs.
            tokio::time::sleep(Duration::from_millis(1)).await;
            std::fs::write(&file, (n + 1).to_string()).unwrap();
            p.release(&lease).await.unwrap();
        }
    });
}

#[test]
fn sixteen_processes_keep_a_counter_exact() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("leases.db");
    let children: Vec<Child> = (0..16)
        .map(|_| spawn("counter", &db, "counter_worker"))
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a worker failed");
    }
    let n = std::fs::read_to_string(counter_file(&db)).unwrap();
    assert_eq!(
        n.trim(),
        "400",
        "16 processes x 25 increments under the lease"
    );
}

/// The holder: takes the key, says so, and waits to be killed.
#[test]
fn holder_worker() {
    if std::env::var(ROLE).as_deref() != Ok("holder") {
        return;
    }
    as_worker(|db| async move {
        let p = provider(&db);
        let key = LeaseKey::new("crash").unwrap();
        let lease = p
            .try_acquire(&key, Duration::from_secs(2))
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        // Written aside and renamed: the test polls for the marker and must
        // never read it half-written.
        let aside = db.with_extension("held.tmp");
        std::fs::write(&aside, lease.token().to_string()).unwrap();
        std::fs::rename(&aside, db.with_extension("held")).unwrap();
        tokio::time::sleep(Duration::from_secs(600)).await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_lease_ends_by_its_ttl() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("leases.db");
    let mut holder = spawn("holder", &db, "holder_worker");
    let marker = db.with_extension("held");
    let started = Instant::now();
    while !marker.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the holder never took the key"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let their_token: u64 = std::fs::read_to_string(&marker)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    holder.kill().unwrap(); // SIGKILL: no release, no cleanup
    holder.wait().unwrap();
    let killed = Instant::now();
    let p = provider(&db);
    let key = LeaseKey::new("crash").unwrap();
    // Still held: a dead holder's lease runs to its TTL.
    assert!(
        !p.try_acquire(&key, Duration::from_secs(2))
            .await
            .unwrap()
            .is_acquired()
    );
    let lease = acquire(
        &p,
        &key,
        AcquireOptions::ttl(Duration::from_secs(2)).wait(Duration::from_secs(10)),
    )
    .await
    .unwrap()
    .expect("the key is free once the dead holder's TTL ran out");
    let waited = killed.elapsed();
    assert!(
        waited < Duration::from_secs(2) + Duration::from_millis(1500),
        "took {waited:?}"
    );
    assert!(lease.token().get() > their_token);
    p.release(&lease).await.unwrap();
}

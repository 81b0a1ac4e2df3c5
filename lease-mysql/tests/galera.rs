//! A three-node MariaDB Galera cluster started for this binary: the whole
//! conformance suite through a URL that names every node, and the advisory
//! mode refused there (named locks are local to one node), and claims.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use lease_api::{LeaseError, LeaseKey, LeaseProvider};
use lease_conformance::{ProviderFactory, conformance_tests};
use lease_mysql::{AdvisoryProvider, MysqlConfig, MysqlProvider};
use lease_testkit::cluster::GaleraCluster;

fn cluster() -> &'static GaleraCluster {
    static CLUSTER: OnceLock<GaleraCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| GaleraCluster::start(3))
}

struct GaleraFactory;

#[async_trait]
impl ProviderFactory for GaleraFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let config = MysqlConfig::new(cluster().url())
            .namespace(namespace)
            .max_connections(4);
        Ok(Arc::new(MysqlProvider::new(config)?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let config = MysqlConfig::new("mysql://root@127.0.0.1:1,127.0.0.1:2/lease")
            .timeouts(Duration::from_millis(500), Duration::from_millis(500));
        Ok(Arc::new(MysqlProvider::new(config)?))
    }

    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(3)
    }
}

conformance_tests!(galera_conformance, GaleraFactory);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_advisory_mode_refuses_a_galera_node() {
    let p = AdvisoryProvider::new(MysqlConfig::new(cluster().url())).unwrap();
    let err = p
        .try_acquire(
            &LeaseKey::new("galera-advisory").unwrap(),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LeaseError::Config(_)), "{err}");
}

/// Row locks are local to a node and not certified, so a fenced
/// transaction could not hold off a takeover through another node: refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn begin_fenced_is_refused_on_galera() {
    let p = MysqlProvider::new(MysqlConfig::new(cluster().url())).unwrap();
    let key = LeaseKey::new("galera-fenced").unwrap();
    let lease = p
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let err = p.begin_fenced(&lease).await.unwrap_err();
    assert!(matches!(err, LeaseError::Config(_)), "{err}");
    p.release(&lease).await.unwrap();
}

/// Two providers given the cluster's host list (both stay on the node that
/// answers, where `SKIP LOCKED` and row locks order their claims) drain one
/// job queue with 8 workers, and race for slots: every job is done exactly
/// once, and every slot has one winner. The columns, index and counter are
/// made by total-order DDL on every node. (Claims made through two nodes at
/// once are not shown safe: one CI run reported a worker's own claim stale
/// at completion, cause not yet known.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_through_the_host_list_are_exactly_once() {
    use futures_util::future::join_all;
    use lease_mysql::{JobQueue, OnceClaims, QueueConfig};
    use std::sync::atomic::{AtomicU8, Ordering};

    const JOBS: usize = 1_000;
    // One namespace for both providers: the same slots.
    let namespace = lease_testkit::unique("galera-claims");
    let nodes: Vec<MysqlProvider> = (0..2)
        .map(|_| {
            MysqlProvider::new(
                MysqlConfig::new(cluster().url())
                    .namespace(&namespace)
                    .max_connections(6),
            )
            .unwrap()
        })
        .collect();
    let table = lease_testkit::unique("galera_jobs").replace('-', "_");
    let pool = nodes[0].pool().unwrap();
    sqlx::query(&format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY)"))
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {table} SELECT seq FROM seq_1_to_{JOBS}"
    ))
    .execute(pool)
    .await
    .unwrap();
    let queues: Vec<Arc<JobQueue>> = nodes
        .iter()
        .map(|p| Arc::new(JobQueue::new(p, QueueConfig::new(&table)).unwrap()))
        .collect();
    // The columns, the index and the counter: DDL in total order, once.
    queues[0].migrate().await.unwrap();
    let seen: Arc<Vec<AtomicU8>> = Arc::new((0..=JOBS).map(|_| AtomicU8::new(0)).collect());
    let workers = (0..8).map(|w| {
        let (queue, seen) = (Arc::clone(&queues[w % 2]), Arc::clone(&seen));
        tokio::spawn(async move {
            loop {
                let claim = queue.claim_next(20).await.unwrap();
                if claim.is_empty() {
                    return;
                }
                for id in claim.ids() {
                    seen[usize::try_from(*id).unwrap()].fetch_add(1, Ordering::Relaxed);
                }
                let outcome = queue.complete(&claim, claim.ids()).await.unwrap();
                assert!(outcome.all_done(), "{:?}", outcome.stale);
            }
        })
    });
    for w in join_all(workers).await {
        w.unwrap();
    }
    let twice: Vec<usize> = (1..=JOBS)
        .filter(|i| seen[*i].load(Ordering::Relaxed) != 1)
        .take(10)
        .collect();
    assert!(twice.is_empty(), "jobs not done exactly once: {twice:?}");

    let claims: Vec<OnceClaims> = nodes.iter().map(OnceClaims::new).collect();
    claims[0].migrate().await.unwrap();
    for slot in ["2026-12-07T02:00", "2026-12-07T03:00", "2026-12-07T04:00"] {
        let won = join_all((0..8).map(|r| {
            let claims = claims[r % 2].clone();
            async move { claims.claim_once("galera-cron", slot, None).await.unwrap() }
        }))
        .await;
        let winners = won.iter().flatten().count();
        assert_eq!(winners, 1, "{slot}: {won:?}");
    }
}

/// A node that accepts connections and never answers (a black hole: no
/// greeting, no reset) first in the host list: an operation given up on
/// while it waits there moves the provider past it, so it serves from the
/// next node within the recovery its probe declares, and stays there.
/// (Without the step past, every operation would start at the hole and
/// time out there, for ever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_node_in_the_host_list_is_passed_over() {
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole_port = hole.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = hole.accept().await {
            open.push(socket);
        }
    });
    let url = cluster().url();
    let (head, rest) = url.split_once('@').unwrap();
    let url = format!("{head}@127.0.0.1:{hole_port},{rest}");
    // The connect timeout is longer than the response timeout: only the
    // operation's own deadline ever ends an attempt on the hole.
    let timeout = Duration::from_millis(800);
    let p = MysqlProvider::new(
        MysqlConfig::new(url)
            .namespace(lease_testkit::unique("galera-hole"))
            .timeouts(Duration::from_secs(3), timeout),
    )
    .unwrap();
    let key = LeaseKey::new("black-hole").unwrap();
    let started = std::time::Instant::now();
    let lease = loop {
        match p.try_acquire(&key, Duration::from_secs(30)).await {
            Ok(acquired) => break acquired.into_lease().unwrap(),
            Err(e) if e.is_transient() && started.elapsed() < Duration::from_secs(30) => {}
            Err(e) => panic!("never served past the black hole: {e:?}"),
        }
    };
    let took = started.elapsed();
    let recovery = p
        .probe()
        .await
        .unwrap()
        .failover
        .expect("a Galera node declares its failover")
        .recovery;
    assert!(
        took <= recovery,
        "served after {took:?}, past the declared recovery {recovery:?}"
    );
    // Later operations stay on the node that answered.
    let again = std::time::Instant::now();
    p.extend(&lease, Duration::from_secs(30)).await.unwrap();
    p.release(&lease).await.unwrap();
    assert!(again.elapsed() < timeout, "{:?}", again.elapsed());
    held.abort();
}

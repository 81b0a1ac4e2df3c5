//! A three-node MariaDB Galera cluster started for this binary: the whole
//! conformance suite through a URL that names every node, and the advisory
//! mode refused there (named locks are local to one node).

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

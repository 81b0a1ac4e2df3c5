//! The whole conformance suite against a real etcd from `scripts/stores`,
//! and against a 3-member cluster started for this binary alone
//! (`lease_testkit::cluster`), every provider given all three endpoints.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use lease_api::{LeaseError, LeaseProvider};
use lease_conformance::{ProviderFactory, conformance_tests};
use lease_etcd::{EtcdConfig, EtcdProvider};
use lease_testkit::cluster::EtcdCluster;
use lease_testkit::store_url;

struct EtcdFactory(Vec<String>);

impl EtcdFactory {
    fn new() -> Self {
        EtcdFactory(
            store_url("LEASE_TEST_ETCD_URL")
                .split(',')
                .map(str::to_owned)
                .collect(),
        )
    }
}

#[async_trait]
impl ProviderFactory for EtcdFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        Ok(Arc::new(EtcdProvider::new(
            EtcdConfig::new(self.0.clone()).namespace(namespace),
        )?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let config = EtcdConfig::new(["http://127.0.0.1:1"])
            .timeouts(Duration::from_millis(500), Duration::from_millis(500));
        Ok(Arc::new(EtcdProvider::new(config)?))
    }

    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(3)
    }
}

fn cluster() -> &'static EtcdCluster {
    static CLUSTER: OnceLock<EtcdCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| EtcdCluster::start(3))
}

conformance_tests!(etcd_conformance, EtcdFactory::new());
conformance_tests!(etcd_cluster_conformance, EtcdFactory(cluster().endpoints()));

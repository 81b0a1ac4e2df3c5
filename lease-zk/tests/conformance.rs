//! The whole conformance suite against a real ZooKeeper from `scripts/stores`,
//! and against a 3-server ensemble started for this binary alone
//! (`lease_testkit::cluster`), every provider given the whole connect string.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use lease_api::{LeaseError, LeaseProvider};
use lease_conformance::{ProviderFactory, conformance_tests};
use lease_testkit::cluster::ZkEnsemble;
use lease_testkit::store_url;
use lease_zk::{ZkConfig, ZkProvider};

struct ZkFactory(String);

impl ZkFactory {
    fn new() -> Self {
        ZkFactory(store_url("LEASE_TEST_ZK_URL"))
    }
}

#[async_trait]
impl ProviderFactory for ZkFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        Ok(Arc::new(ZkProvider::new(
            ZkConfig::new(&self.0).namespace(namespace),
        )?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let config = ZkConfig::new("127.0.0.1:1")
            .timeouts(Duration::from_millis(500), Duration::from_millis(500));
        Ok(Arc::new(ZkProvider::new(config)?))
    }

    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(3)
    }
}

fn ensemble() -> &'static ZkEnsemble {
    static ENSEMBLE: OnceLock<ZkEnsemble> = OnceLock::new();
    ENSEMBLE.get_or_init(|| ZkEnsemble::start(3))
}

conformance_tests!(zk_conformance, ZkFactory::new());
conformance_tests!(
    zk_ensemble_conformance,
    ZkFactory(ensemble().connect_string())
);

//! The whole conformance suite against a 3-server ZooKeeper ensemble started
//! for this suite alone (`lease_testkit::cluster`), with every provider given
//! the whole connect string.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use lease_api::{LeaseError, LeaseProvider};
use lease_conformance::{ProviderFactory, conformance_tests};
use lease_testkit::cluster::ZkEnsemble;
use lease_zk::{ZkConfig, ZkProvider};

fn ensemble() -> &'static ZkEnsemble {
    static ENSEMBLE: OnceLock<ZkEnsemble> = OnceLock::new();
    ENSEMBLE.get_or_init(|| ZkEnsemble::start(3))
}

struct EnsembleFactory(String);

#[async_trait]
impl ProviderFactory for EnsembleFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        Ok(Arc::new(ZkProvider::new(
            ZkConfig::new(&self.0).namespace(namespace),
        )?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let config = ZkConfig::new("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
            .timeouts(Duration::from_millis(500), Duration::from_millis(500));
        Ok(Arc::new(ZkProvider::new(config)?))
    }

    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(3)
    }
}

conformance_tests!(
    zk_ensemble_conformance,
    EnsembleFactory(ensemble().connect_string())
);

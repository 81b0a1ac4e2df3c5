//! The whole conformance suite against five independent Redis nodes
//! (Redlock's usual deployment) started for this suite alone
//! (`lease_testkit::cluster`), with AOF and `appendfsync always` on each.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use lease_api::{LeaseError, LeaseProvider};
use lease_conformance::{ProviderFactory, conformance_tests};
use lease_redis::{RedlockConfig, RedlockProvider};
use lease_testkit::cluster::RedisNodes;

fn nodes() -> &'static RedisNodes {
    static NODES: OnceLock<RedisNodes> = OnceLock::new();
    NODES.get_or_init(|| RedisNodes::start(5))
}

struct Redlock5Factory(Vec<String>);

#[async_trait]
impl ProviderFactory for Redlock5Factory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        Ok(Arc::new(RedlockProvider::new(
            RedlockConfig::new(self.0.clone()).namespace(namespace),
        )?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let down: Vec<String> = (1..=5).map(|p| format!("redis://127.0.0.1:{p}")).collect();
        let config = RedlockConfig::new(down)
            .timeouts(Duration::from_millis(500), Duration::from_millis(500));
        Ok(Arc::new(RedlockProvider::new(config)?))
    }

    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(2)
    }
}

conformance_tests!(redlock5_conformance, Redlock5Factory(nodes().urls()));

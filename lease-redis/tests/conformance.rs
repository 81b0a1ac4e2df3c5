//! The whole conformance suite against one real Redis and against three
//! independent Redis nodes (Redlock), from `scripts/stores`, and against five
//! Redlock nodes, a Sentinel-monitored primary with two replicas and a
//! Redis Cluster of three primaries with a replica each, started for this
//! binary alone.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use lease_api::{LeaseError, LeaseProvider};
use lease_conformance::{ProviderFactory, conformance_tests};
use lease_redis::{RedisConfig, RedisProvider, RedlockConfig, RedlockProvider};
use lease_testkit::cluster::{RedisCluster, RedisNodes, RedisSentinel};
use lease_testkit::store_url;

/// A loopback port nothing listens on.
const DOWN_URL: &str = "redis://127.0.0.1:1";

struct RedisFactory(String);

impl RedisFactory {
    fn new() -> Self {
        RedisFactory(store_url("LEASE_TEST_REDIS_URL"))
    }
}

#[async_trait]
impl ProviderFactory for RedisFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        Ok(Arc::new(RedisProvider::new(
            RedisConfig::new(&self.0).namespace(namespace),
        )?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let down = if self.0.starts_with("redis+sentinel://") {
            "redis+sentinel://127.0.0.1:1,127.0.0.1:2/lease"
        } else if self.0.starts_with("redis+cluster://") {
            "redis+cluster://127.0.0.1:1,127.0.0.1:2"
        } else {
            DOWN_URL
        };
        let config =
            RedisConfig::new(down).timeouts(Duration::from_millis(500), Duration::from_millis(500));
        Ok(Arc::new(RedisProvider::new(config)?))
    }

    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(2)
    }
}

struct RedlockFactory(Vec<String>);

impl RedlockFactory {
    fn new() -> Self {
        let urls = store_url("LEASE_TEST_REDLOCK_URLS");
        RedlockFactory(urls.split(',').map(str::to_owned).collect())
    }
}

#[async_trait]
impl ProviderFactory for RedlockFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        Ok(Arc::new(RedlockProvider::new(
            RedlockConfig::new(self.0.clone()).namespace(namespace),
        )?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let config = RedlockConfig::new([DOWN_URL, "redis://127.0.0.1:2", "redis://127.0.0.1:3"])
            .timeouts(Duration::from_millis(500), Duration::from_millis(500));
        Ok(Arc::new(RedlockProvider::new(config)?))
    }

    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(2)
    }
}

conformance_tests!(redis_conformance, RedisFactory::new());
conformance_tests!(redlock_conformance, RedlockFactory::new());

/// Five independent nodes, Redlock's usual deployment, started for this
/// binary alone, each with AOF and `appendfsync always`.
fn five_nodes() -> &'static RedisNodes {
    static NODES: OnceLock<RedisNodes> = OnceLock::new();
    NODES.get_or_init(|| RedisNodes::start(5))
}

conformance_tests!(redlock5_conformance, RedlockFactory(five_nodes().urls()));

/// A primary with two replicas under three Sentinels, started for this binary
/// alone; every acquire and extend waits for one replica (the default).
fn sentinel() -> &'static RedisSentinel {
    static TOPOLOGY: OnceLock<RedisSentinel> = OnceLock::new();
    TOPOLOGY.get_or_init(|| RedisSentinel::start(2, 3))
}

conformance_tests!(redis_sentinel_conformance, RedisFactory(sentinel().url()));

/// Three primaries with a replica each, started for this binary alone;
/// every acquire and extend waits for the slot's replica (the default).
fn cluster() -> &'static RedisCluster {
    static TOPOLOGY: OnceLock<RedisCluster> = OnceLock::new();
    TOPOLOGY.get_or_init(|| RedisCluster::start(3, 1))
}

conformance_tests!(redis_cluster_conformance, RedisFactory(cluster().url()));

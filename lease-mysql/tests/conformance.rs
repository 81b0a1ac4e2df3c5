//! The whole conformance suite against a real MariaDB from `scripts/stores`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_api::{LeaseError, LeaseProvider};
use lease_conformance::{ProviderFactory, conformance_tests};
use lease_mysql::{AdvisoryProvider, MysqlConfig, MysqlProvider};
use lease_testkit::store_url;

struct MysqlFactory(String);

#[async_trait]
impl ProviderFactory for MysqlFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let config = MysqlConfig::new(&self.0)
            .namespace(namespace)
            .max_connections(4);
        Ok(Arc::new(MysqlProvider::new(config)?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let config = MysqlConfig::new("mysql://lease@127.0.0.1:1/lease")
            .timeouts(Duration::from_millis(500), Duration::from_millis(500));
        Ok(Arc::new(MysqlProvider::new(config)?))
    }

    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(2)
    }
}

conformance_tests!(
    mysql_conformance,
    MysqlFactory(store_url("LEASE_TEST_MYSQL_URL"))
);

/// The advisory-lock mode: leases as named locks (`GET_LOCK`), each on its
/// own session, with the TTL as the session's `wait_timeout`.
struct AdvisoryFactory(String);

#[async_trait]
impl ProviderFactory for AdvisoryFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let config = MysqlConfig::new(&self.0)
            .namespace(namespace)
            .max_connections(4);
        Ok(Arc::new(AdvisoryProvider::new(config)?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let config = MysqlConfig::new("mysql://lease@127.0.0.1:1/lease")
            .timeouts(Duration::from_millis(500), Duration::from_millis(500));
        Ok(Arc::new(AdvisoryProvider::new(config)?))
    }

    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(2)
    }
}

conformance_tests!(
    mysql_advisory_conformance,
    AdvisoryFactory(store_url("LEASE_TEST_MYSQL_URL"))
);

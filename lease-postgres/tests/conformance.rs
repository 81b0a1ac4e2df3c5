//! The whole conformance suite against a real PostgreSQL from `scripts/stores`,
//! and against a primary with a synchronous streaming standby started for
//! this binary alone (a two-host URL).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use lease_api::{LeaseError, LeaseProvider};
use lease_conformance::{ProviderFactory, conformance_tests};
use lease_postgres::{AdvisoryProvider, PostgresConfig, PostgresProvider};
use lease_testkit::cluster::PostgresHa;
use lease_testkit::store_url;

struct PostgresFactory(String);

impl PostgresFactory {
    fn new() -> Self {
        PostgresFactory(store_url("LEASE_TEST_POSTGRES_URL"))
    }
}

#[async_trait]
impl ProviderFactory for PostgresFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let config = PostgresConfig::new(&self.0)
            .namespace(namespace)
            .max_connections(4);
        Ok(Arc::new(PostgresProvider::new(config)?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let down = if self.0.contains(',') {
            "postgres://postgres@127.0.0.1:1,127.0.0.1:2/postgres"
        } else {
            "postgres://postgres@127.0.0.1:1/postgres"
        };
        let config = PostgresConfig::new(down)
            .timeouts(Duration::from_millis(500), Duration::from_millis(500));
        Ok(Arc::new(PostgresProvider::new(config)?))
    }

    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(2)
    }
}

conformance_tests!(postgres_conformance, PostgresFactory::new());

/// A primary whose commits wait for its standby, started for this binary.
fn primary_and_standby() -> &'static PostgresHa {
    static TOPOLOGY: OnceLock<PostgresHa> = OnceLock::new();
    TOPOLOGY.get_or_init(|| PostgresHa::start(true))
}

conformance_tests!(
    postgres_ha_conformance,
    PostgresFactory(primary_and_standby().url())
);

/// The advisory-lock mode: leases as session advisory locks, each on its own
/// session, with the TTL as the session's `idle_session_timeout`.
struct AdvisoryFactory(String);

#[async_trait]
impl ProviderFactory for AdvisoryFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let config = PostgresConfig::new(&self.0)
            .namespace(namespace)
            .max_connections(4);
        Ok(Arc::new(AdvisoryProvider::new(config)?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let config = PostgresConfig::new("postgres://postgres@127.0.0.1:1/postgres")
            .timeouts(Duration::from_millis(500), Duration::from_millis(500));
        Ok(Arc::new(AdvisoryProvider::new(config)?))
    }

    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(2)
    }
}

conformance_tests!(
    postgres_advisory_conformance,
    AdvisoryFactory(store_url("LEASE_TEST_POSTGRES_URL"))
);

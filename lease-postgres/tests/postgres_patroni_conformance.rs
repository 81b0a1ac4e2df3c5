//! The whole conformance suite on a PostgreSQL cluster managed by Patroni:
//! two members in synchronous mode, reached through a URL that names both,
//! the providers reading Patroni's settings from its REST API. The cluster
//! belongs to the one test below and ends with it (its postmasters run in
//! sessions of their own, so a cluster left in a `static` would outlive the
//! test binary); its own binary keeps other clusters' start-up and failovers
//! off its timings.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_api::{LeaseError, LeaseProvider};
use lease_conformance::{CASES, ProviderFactory, run_all};
use lease_postgres::{PostgresConfig, PostgresProvider};
use lease_testkit::cluster::PatroniCluster;

struct PatroniFactory {
    url: String,
    rest: Vec<String>,
}

#[async_trait]
impl ProviderFactory for PatroniFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let config = PostgresConfig::new(&self.url)
            .namespace(namespace)
            .max_connections(4)
            .patroni(self.rest.clone());
        Ok(Arc::new(PostgresProvider::new(config)?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let config = PostgresConfig::new("postgres://postgres@127.0.0.1:1,127.0.0.1:2/postgres")
            .timeouts(Duration::from_millis(500), Duration::from_millis(500))
            .patroni(["127.0.0.1:1"]);
        Ok(Arc::new(PostgresProvider::new(config)?))
    }

    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(2)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_conformance_case_passes_on_a_patroni_cluster() {
    let cluster = tokio::task::spawn_blocking(|| PatroniCluster::start(2))
        .await
        .unwrap();
    let factory = PatroniFactory {
        url: cluster.url(),
        rest: cluster.rest_addrs(),
    };
    let report = run_all(Arc::new(factory)).await;
    assert_eq!(report.cases.len(), CASES.len());
    let failed: Vec<_> = report
        .cases
        .iter()
        .filter(|c| c.failure.is_some())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} cases failed on Patroni: {failed:#?}",
        failed.len(),
        report.cases.len()
    );
    let slowest = report.cases.iter().max_by_key(|c| c.elapsed);
    eprintln!(
        "{} cases passed on Patroni; the slowest: {:?}",
        report.cases.len(),
        slowest.map(|c| (c.name, c.elapsed))
    );
}

//! The whole conformance suite against one SQLite file in a temporary directory.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use lease_api::{LeaseError, LeaseProvider};
use lease_conformance::{ProviderFactory, conformance_tests};
use lease_sqlite::{SqliteConfig, SqliteProvider};

/// One database file for the whole run, as the processes of a host share one.
fn database() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temporary directory"))
        .path()
        .join("leases.db")
}

struct SqliteFactory;

#[async_trait]
impl ProviderFactory for SqliteFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        Ok(Arc::new(SqliteProvider::new(
            SqliteConfig::new(database()).namespace(namespace),
        )?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        // A directory that does not exist: the file cannot be opened.
        Ok(Arc::new(SqliteProvider::new(
            SqliteConfig::new("/nonexistent-lease-dir/leases.db")
                .busy_timeout(Duration::from_millis(500)),
        )?))
    }

    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(3)
    }
}

conformance_tests!(sqlite_conformance, SqliteFactory);

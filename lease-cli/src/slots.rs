//! `--once-per`: the once-per-slot claims of the configured SQL store
//! (PostgreSQL or MySQL/MariaDB), behind one face.

use std::time::Duration;

use leases::claims::{OnceClaim, SlotHolder};
use leases::lease_mysql::{MysqlConfig, MysqlProvider};
use leases::lease_postgres::{PostgresConfig, PostgresProvider};
use leases::{LeaseError, LeaseKey, Store, StoreConfig, lease_mysql, lease_postgres};

use crate::exit::{EXIT_NOT_ACQUIRED, describe, error_code};

/// The once-per-slot claims of a PostgreSQL or MySQL store.
pub(crate) enum SlotClaims {
    Postgres(lease_postgres::OnceClaims),
    Mysql(lease_mysql::OnceClaims),
}

impl SlotClaims {
    /// The claims of the configured store, in its namespace: on PostgreSQL
    /// in the lease table's schema, on MySQL in the URL's database.
    pub(crate) fn for_store(config: &StoreConfig) -> Result<Self, LeaseError> {
        match config.parsed()? {
            Store::Postgres {
                url, schema, table, ..
            } => {
                let provider = PostgresProvider::new(
                    PostgresConfig::new(url)
                        .namespace(&config.namespace)
                        .table(&schema, table)
                        .timeouts(config.connect_timeout, config.request_timeout),
                )?;
                Ok(SlotClaims::Postgres(lease_postgres::OnceClaims::in_table(
                    &provider,
                    &schema,
                    lease_postgres::CLAIMS_TABLE,
                )?))
            }
            Store::Mysql { url, .. } => {
                let provider = MysqlProvider::new(
                    MysqlConfig::new(url)
                        .namespace(&config.namespace)
                        .timeouts(config.connect_timeout, config.request_timeout),
                )?;
                Ok(SlotClaims::Mysql(lease_mysql::OnceClaims::new(&provider)))
            }
            other => Err(LeaseError::Config(format!(
                "--once-per claims slots in PostgreSQL or MySQL; the store is {}",
                other.kind()
            ))),
        }
    }

    async fn claim_once(
        &self,
        resource: &str,
        slot: &str,
        keep: Option<Duration>,
    ) -> Result<Option<OnceClaim>, LeaseError> {
        match self {
            SlotClaims::Postgres(c) => c.claim_once(resource, slot, keep).await,
            SlotClaims::Mysql(c) => c.claim_once(resource, slot, keep).await,
        }
    }

    async fn holder(&self, resource: &str, slot: &str) -> Result<Option<SlotHolder>, LeaseError> {
        match self {
            SlotClaims::Postgres(c) => c.holder(resource, slot).await,
            SlotClaims::Mysql(c) => c.holder(resource, slot).await,
        }
    }

    /// Gives `claim` back when its command never started.
    pub(crate) async fn unclaim(
        &self,
        resource: &str,
        slot: &str,
        claim: &OnceClaim,
    ) -> Result<bool, LeaseError> {
        match self {
            SlotClaims::Postgres(c) => c.unclaim(resource, slot, claim).await,
            SlotClaims::Mysql(c) => c.unclaim(resource, slot, claim).await,
        }
    }
}

/// Claims `slot` of `key` once the lease is held: `Err` with the exit code
/// and message when another run has it (or the claim failed).
pub(crate) async fn claim_slot(
    claims: &SlotClaims,
    key: &LeaseKey,
    slot: &str,
    keep: Option<Duration>,
) -> Result<OnceClaim, (u8, String)> {
    match claims.claim_once(key.as_str(), slot, keep).await {
        Ok(Some(claim)) => Ok(claim),
        Ok(None) => {
            let by = match claims.holder(key.as_str(), slot).await {
                Ok(Some(h)) => format!(
                    " by {} (token {}, {} ago)",
                    h.holder.as_deref().unwrap_or("another run"),
                    h.token,
                    humantime::format_duration(Duration::from_secs(h.age.as_secs()))
                ),
                _ => String::new(),
            };
            Err((
                EXIT_NOT_ACQUIRED,
                format!("slot {slot:?} of {key} was claimed already{by}; not running"),
            ))
        }
        Err(e) => Err((error_code(&e), describe(&e))),
    }
}

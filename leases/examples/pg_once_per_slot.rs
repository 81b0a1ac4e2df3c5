//! Distributed cron on PostgreSQL: four instances fire every slot, some of
//! them late; `claim_once` lets exactly one run each slot, however late the
//! others come (a lease would be free again once the winner finished).
//!
//! ```sh
//! LEASE_POSTGRES_URL=postgres://u@host/db cargo run -p leases --example pg_once_per_slot
//! ```

use std::time::Duration;

use leases::lease_postgres::{OnceClaims, PostgresConfig, PostgresProvider};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("LEASE_POSTGRES_URL")
        .or_else(|_| std::env::var("LEASE_TEST_POSTGRES_URL"))
        .map_err(|_| "set LEASE_POSTGRES_URL=postgres://user@host/db")?;
    let namespace = format!("example-cron-{}", std::process::id());
    let provider = PostgresProvider::new(PostgresConfig::new(url).namespace(namespace))?;
    let claims = OnceClaims::new(&provider);
    for slot in ["2026-12-04T02:00", "2026-12-04T03:00", "2026-12-04T04:00"] {
        let instances = (0..4u64).map(|i| {
            let claims = claims.clone();
            async move {
                // Instance i fires i × 150 ms late; the job itself takes 50 ms.
                tokio::time::sleep(Duration::from_millis(i * 150)).await;
                match claims.claim_once("nightly-report", slot, None).await? {
                    Some(claim) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        println!(
                            "{slot}: instance {i} ran the report (token {})",
                            claim.token
                        );
                        Ok::<_, leases::LeaseError>(1)
                    }
                    None => Ok(0),
                }
            }
        });
        let ran: u32 = futures_util::future::try_join_all(instances)
            .await?
            .into_iter()
            .sum();
        if ran != 1 {
            return Err(format!("{slot} ran {ran} times").into());
        }
    }
    println!("each slot ran once");
    Ok(())
}

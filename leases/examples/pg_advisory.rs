//! PostgreSQL advisory locks as leases: the lease lives on a database
//! session of its own, so when its holder's session ends (here: an operator
//! runs `pg_terminate_backend`, as a crash would) the key is free at once,
//! the holder's guard fires its lost signal at its next renewal, and the
//! next holder's fencing token is greater.
//!
//! ```sh
//! LEASE_POSTGRES_URL=postgres://u@host/db cargo run -p leases --example pg_advisory
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use leases::lease_postgres::{AdvisoryProvider, PostgresConfig};
use leases::{LeaseGuard, LeaseKey, LeaseProvider};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("LEASE_POSTGRES_URL")
        .or_else(|_| std::env::var("LEASE_TEST_POSTGRES_URL"))
        .map_err(|_| "set LEASE_POSTGRES_URL=postgres://user@host/db")?;
    let namespace = format!("example-advisory-{}", std::process::id());
    let make = || AdvisoryProvider::new(PostgresConfig::new(&url).namespace(&namespace));
    let (holder, next) = (Arc::new(make()?), make()?);
    let key = LeaseKey::new("ledger/2026-12")?;
    let ttl = Duration::from_secs(6);
    let lease = holder
        .try_acquire(&key, ttl)
        .await?
        .into_lease()
        .ok_or("the key is held")?;
    println!(
        "holding {key} as advisory lock {} with token {}",
        holder.lock_id(&key),
        lease.token()
    );
    let owner = lease.owner().to_hex();
    let guard = LeaseGuard::new(Arc::clone(&holder) as Arc<dyn LeaseProvider>, lease);

    // An operator (or a crash) ends the holder's session.
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await?;
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(format!("lease-advisory {owner}"))
    .fetch_all(&mut admin)
    .await?;
    let at = Instant::now();
    println!("ended the holder's session: {ended:?}");

    let reason = guard.lost().await;
    println!("the guard fired after {:?}: {reason}", at.elapsed());
    let taken = next
        .try_acquire(&key, ttl)
        .await?
        .into_lease()
        .ok_or("the key should be free")?;
    println!(
        "the next holder got token {} (was {})",
        taken.token(),
        guard.token()
    );
    next.release(&taken).await?;
    Ok(())
}

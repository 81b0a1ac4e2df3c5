//! Workers that already share PostgreSQL drain a job table with
//! `FOR UPDATE SKIP LOCKED` claims: no lock service, no waiting on each
//! other, each job done once. One worker dies mid-batch; its jobs come back
//! after the visibility timeout and another worker does them.
//!
//! ```sh
//! LEASE_POSTGRES_URL=postgres://u@host/db cargo run -p leases --example pg_job_queue
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leases::lease_postgres::{JobQueue, PostgresProvider, QueueConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("LEASE_POSTGRES_URL")
        .or_else(|_| std::env::var("LEASE_TEST_POSTGRES_URL"))
        .map_err(|_| "set LEASE_POSTGRES_URL=postgres://user@host/db")?;
    let provider = PostgresProvider::from_url(&url)?;
    let pool = provider.pool()?;
    let table = format!("example_jobs_{}", std::process::id());
    sqlx::query(&format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY, amount_cents bigint NOT NULL)"
    ))
    .execute(pool)
    .await?;
    sqlx::query(&format!(
        "INSERT INTO {table} SELECT g, g * 100 FROM generate_series(1, 1000) g"
    ))
    .execute(pool)
    .await?;
    let queue = Arc::new(JobQueue::new(
        &provider,
        QueueConfig::new(&table).visibility(Duration::from_secs(2)),
    )?);

    // A worker claims ten jobs and dies before completing them.
    let doomed = queue.claim_next(10).await?;
    println!("a worker claimed jobs {:?} and crashed", doomed.ids());
    drop(doomed);

    let done = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (queue, done) = (Arc::clone(&queue), Arc::clone(&done));
            tokio::spawn(async move {
                let mut idle_rounds = 0;
                while idle_rounds < 40 {
                    let claim = queue.claim_next(50).await?;
                    if claim.is_empty() {
                        // The crashed worker's rows are still claimed: wait.
                        idle_rounds += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                    idle_rounds = 0;
                    // ... do the work for claim.ids(), fenced by claim.token() ...
                    let outcome = queue.complete(&claim, claim.ids()).await?;
                    done.fetch_add(outcome.done.len(), Ordering::Relaxed);
                    if claim.ids().contains(&1) {
                        println!(
                            "worker {w} picked up the crashed worker's jobs (token {})",
                            claim.token()
                        );
                    }
                }
                Ok::<_, leases::LeaseError>(())
            })
        })
        .collect();
    for w in workers {
        w.await??;
    }
    let left: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(pool)
        .await?;
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(pool)
        .await?;
    println!("{} jobs done, {left} left", done.load(Ordering::Relaxed));
    if left != 0 || done.load(Ordering::Relaxed) != 1000 {
        return Err("not every job was done exactly once".into());
    }
    Ok(())
}

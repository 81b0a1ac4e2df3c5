//! Eight workers share three export slots: never more than three run at
//! once, each slot is a lease with its own fencing token, and a worker
//! waits (woken by the store) for a slot to come free.
//!
//! ```sh
//! cargo run -p leases --example semaphore                      # in-memory
//! LEASE_STORE=postgres://u@host/db cargo run -p leases --example semaphore
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leases::StoreConfig;
use leases::recipes::Semaphore;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = if std::env::var_os("LEASE_STORE").is_some() {
        StoreConfig::from_env()?
    } else {
        StoreConfig::new("memory://")
    };
    let provider = config.build()?;
    let ttl = provider
        .capabilities()
        .practical_ttl(Duration::from_secs(30));
    let slots = Semaphore::new(provider, "example/export-slots", 3)?;
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (slots, running, most) = (slots.clone(), Arc::clone(&running), Arc::clone(&most));
            tokio::spawn(async move {
                let permit = slots
                    .acquire(ttl, Duration::from_secs(30))
                    .await?
                    .ok_or("no slot within 30 s")?;
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                println!(
                    "worker {w}: exporting in slot {} (token {}, {now} running)",
                    permit.slot(),
                    permit.lease().token()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                slots.release(&permit).await?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
        })
        .collect();
    for w in workers {
        w.await?.map_err(|e| e.to_string())?;
    }
    let most = most.load(Ordering::SeqCst);
    println!("at most {most} exports ran at once");
    if most > 3 {
        return Err("more than three exports ran at once".into());
    }
    Ok(())
}

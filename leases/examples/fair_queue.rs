//! Six workers line up for one settlement batch with fair waiting: each
//! joins the store's queue of waiters, is woken only when the worker ahead
//! of it leaves, and gets the key in the order it arrived. The example
//! checks that order and exits non-zero otherwise. A store without a queue
//! of waiters (Redlock, SQLite, PostgreSQL's advisory mode) says so.
//!
//! ```sh
//! cargo run -p leases --example fair_queue                      # in-memory
//! LEASE_STORE=redis://127.0.0.1:6379 cargo run -p leases --example fair_queue
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leases::{AcquireOptions, LeaseKey, StoreConfig, TryAcquire, acquire};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = if std::env::var_os("LEASE_STORE").is_some() {
        StoreConfig::from_env()?
    } else {
        StoreConfig::new("memory://")
    };
    let provider = config.build()?;
    let caps = provider.capabilities();
    if !caps.fair_waiting {
        println!(
            "{} has no queue of waiters: fair waiting is not offered",
            caps.backend
        );
        return Ok(());
    }
    let ttl = caps.practical_ttl(Duration::from_secs(30));
    let key = LeaseKey::new(format!("example/settlement-{}", std::process::id()))?;
    // Someone holds the batch while the workers arrive.
    let TryAcquire::Acquired(first) = provider.try_acquire(&key, ttl).await? else {
        return Err("the batch was held already".into());
    };
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for w in 0..6 {
        let (provider, key, served) = (provider.clone(), key.clone(), Arc::clone(&served));
        workers.push(tokio::spawn(async move {
            let options = AcquireOptions::ttl(ttl)
                .wait(Duration::from_secs(30))
                .fair();
            let lease = acquire(&provider, &key, options)
                .await?
                .ok_or("no turn within 30 s")?;
            println!("worker {w}: settling with token {}", lease.token());
            served.lock().map_err(|_| "poisoned")?.push(w);
            tokio::time::sleep(Duration::from_millis(20)).await;
            provider.release(&lease).await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
        // Let worker w take its ticket before the next one arrives (one or
        // two round trips; generous for a loaded machine).
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    provider.release(&first).await?;
    for w in workers {
        w.await?.map_err(|e| e.to_string())?;
    }
    let served = served.lock().map_err(|_| "poisoned")?.clone();
    println!("served in the order {served:?}");
    if served != (0..6).collect::<Vec<_>>() {
        return Err("the workers were not served in the order they arrived".into());
    }
    Ok(())
}

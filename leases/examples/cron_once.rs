//! Several instances fire the same job on the same schedule; each slot runs
//! exactly once. A short job keeps the key for a minimum hold, so instances
//! that fire a little late in the same slot find it taken, and the hold ends
//! before the next slot starts.
//!
//! ```sh
//! cargo run -p leases --example cron_once                      # in-memory
//! LEASE_STORE=postgres://u@host/db cargo run -p leases --example cron_once
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leases::{LeaseKey, MemoryStore, RunOptions, RunOutcome, StoreConfig, run_with_lease};
use tokio::time::Instant;

const INSTANCES: usize = 4;
const SLOTS: u32 = 3;
const SLOT: Duration = Duration::from_millis(1500);
/// Instances fire up to this late (clock skew, scheduling).
const MAX_LATE: Duration = Duration::from_millis(300);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let from_env = std::env::var_os("LEASE_STORE").is_some();
    let memory = MemoryStore::new();
    let config = if from_env {
        StoreConfig::from_env()?
    } else {
        StoreConfig::new("memory://")
    };
    // Hold the key for most of the slot: longer than any instance is late,
    // shorter than the slot, so the next slot finds it free.
    let min_hold = SLOT - MAX_LATE;
    let key = LeaseKey::new("cron-once-demo/nightly-report")?;
    let runs: Arc<Mutex<BTreeMap<u32, Vec<usize>>>> = Arc::default();
    let start = Instant::now() + Duration::from_millis(200);
    let mut tasks = Vec::new();
    for instance in 0..INSTANCES {
        // Each instance is its own process in real life: its own provider.
        let provider: Arc<dyn leases::LeaseProvider> = if from_env {
            config.build()?
        } else {
            Arc::new(memory.provider(&config.namespace)?)
        };
        let (key, runs) = (key.clone(), Arc::clone(&runs));
        tasks.push(tokio::spawn(async move {
            for slot in 0..SLOTS {
                // Instance i fires i * MAX_LATE / INSTANCES late.
                let late = MAX_LATE * instance as u32 / INSTANCES as u32;
                tokio::time::sleep_until(start + SLOT * slot + late).await;
                let ttl = provider
                    .capabilities()
                    .practical_ttl(Duration::from_secs(5));
                let options = RunOptions::default().min_hold(min_hold);
                let runs = Arc::clone(&runs);
                let outcome = run_with_lease(
                    Arc::clone(&provider),
                    &key,
                    ttl,
                    options,
                    |ctx| async move {
                        println!(
                            "slot {slot}: instance {instance} runs the report (token {})",
                            ctx.token
                        );
                        runs.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .entry(slot)
                            .or_default()
                            .push(instance);
                    },
                )
                .await?;
                if matches!(outcome, RunOutcome::NotAcquired) {
                    println!("slot {slot}: instance {instance} skips, the slot is taken");
                }
            }
            Ok::<_, leases::LeaseError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let runs = runs.lock().unwrap_or_else(|e| e.into_inner());
    let once = (0..SLOTS).all(|s| runs.get(&s).is_some_and(|r| r.len() == 1));
    println!("\nruns per slot: {runs:?}");
    if !once {
        return Err("a slot did not run exactly once".into());
    }
    println!("every slot ran exactly once");
    Ok(())
}

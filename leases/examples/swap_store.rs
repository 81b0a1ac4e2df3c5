//! The same worker code on any store: the store comes from configuration.
//!
//! ```sh
//! cargo run -p leases --example swap_store                                   # in-memory
//! LEASE_STORE=redis://127.0.0.1:6379 cargo run -p leases --example swap_store
//! cargo run -p leases --example swap_store -- lease.toml                     # a TOML file
//! ```
//!
//! A TOML file holds `store = "..."`, and optionally `namespace`,
//! `default_ttl`, `connect_timeout`, `request_timeout` ("30s", "1m 30s").

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leases::{LeaseKey, LeaseProvider, RunOptions, RunOutcome, StoreConfig, run_with_lease};

/// The worker knows nothing about the store: it gets a provider.
async fn worker(
    name: String,
    provider: Arc<dyn LeaseProvider>,
    done: Arc<Mutex<Vec<String>>>,
    ttl: Duration,
) -> leases::Result<()> {
    for job in ["invoice-run", "ledger-close", "export"] {
        let key = LeaseKey::new(format!("swap-store-demo/{job}"))?;
        let options = RunOptions::default().wait(Duration::from_millis(50));
        let outcome = run_with_lease(Arc::clone(&provider), &key, ttl, options, |ctx| {
            let done = Arc::clone(&done);
            let name = name.clone();
            async move {
                let mut done = done.lock().unwrap_or_else(|e| e.into_inner());
                if done.iter().any(|d| d.starts_with(job)) {
                    return false;
                }
                done.push(format!("{job} by {name} (token {})", ctx.token));
                true
            }
        })
        .await?;
        match outcome {
            RunOutcome::Completed { value: true, token } => {
                println!("{name}: ran {job} under token {token}")
            }
            RunOutcome::Completed { value: false, .. } => {
                println!("{name}: {job} was already done")
            }
            RunOutcome::NotAcquired => println!("{name}: {job} is being run by someone else"),
            RunOutcome::Lost { reason, .. } => {
                println!("{name}: lost the lease on {job}: {reason}")
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = match std::env::args().nth(1) {
        Some(path) => StoreConfig::from_toml_file(path)?,
        None if std::env::var_os("LEASE_STORE").is_some() => StoreConfig::from_env()?,
        None => StoreConfig::new("memory://"),
    };
    let provider = config.build()?;
    println!(
        "store {} ({}), namespace {:?}",
        leases::redact(&config.store),
        provider.capabilities().backend,
        config.namespace,
    );
    let ttl = provider.capabilities().practical_ttl(config.default_ttl);
    let done = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = ["ana", "ben", "cy"]
        .into_iter()
        .map(|name| {
            tokio::spawn(worker(
                name.to_string(),
                Arc::clone(&provider),
                Arc::clone(&done),
                ttl,
            ))
        })
        .collect();
    for w in workers {
        w.await??;
    }
    let done = done.lock().unwrap_or_else(|e| e.into_inner());
    println!("done: {}", done.join("; "));
    // Durability is probed from the server on first use (Redis AOF settings,
    // PostgreSQL fsync), so it is read after the work, not before.
    let durable = match &provider.capabilities().durable_tokens {
        leases::TokenDurability::Durable(why) => format!("yes ({why})"),
        leases::TokenDurability::Volatile(why) => format!("no ({why})"),
        leases::TokenDurability::Unknown(why) => format!("unknown ({why})"),
        _ => "not declared".to_string(),
    };
    println!("tokens survive a store restart: {durable}");
    Ok(())
}

//! Three replicas of a scheduler elect a leader; the leader works a short
//! term and steps down, and another takes over at once (woken by the
//! store's notification). Every replica hears each change.
//!
//! ```sh
//! cargo run -p leases --example leader_election                     # in-memory
//! LEASE_STORE=redis://127.0.0.1:6379 cargo run -p leases --example leader_election
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leases::StoreConfig;
use leases::recipes::{Callbacks, Election};
use tokio_util::sync::CancellationToken;

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
        .practical_ttl(Duration::from_secs(10));
    let stop = CancellationToken::new();
    let terms = Arc::new(AtomicUsize::new(0));
    let mut replicas = Vec::new();
    for name in ["sched-a", "sched-b", "sched-c"] {
        let election = Election::new(Arc::clone(&provider), "example/scheduler", ttl)?;
        let terms = Arc::clone(&terms);
        let callbacks = Callbacks {
            on_started_leading: Box::new(move |token| {
                terms.fetch_add(1, Ordering::SeqCst);
                println!("{name}: leading with token {token}");
                // Lead for a while (real work would go here, passing the
                // token with every write), then step down.
                Box::pin(tokio::time::sleep(Duration::from_millis(300)))
            }),
            on_stopped_leading: Box::new(move || println!("{name}: stepped down")),
            on_new_leader: Box::new(move |leader| {
                if let Some(l) = leader {
                    println!("{name}: sees the leader's token {}", l.token);
                }
            }),
        };
        let stop = stop.clone();
        replicas.push(tokio::spawn(
            async move { election.run(stop, callbacks).await },
        ));
    }
    while terms.load(Ordering::SeqCst) < 4 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    for r in replicas {
        r.await??;
    }
    println!(
        "{} terms, one leader at a time",
        terms.load(Ordering::SeqCst)
    );
    Ok(())
}

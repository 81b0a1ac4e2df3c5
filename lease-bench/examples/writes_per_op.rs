//! Runs `ROUNDS` acquire + release rounds on one store, for counting the
//! client's socket writes per operation from outside:
//!
//! ```sh
//! strace -f -c -e trace=write,writev,sendto,sendmsg \
//!     target/debug/examples/writes_per_op postgres://postgres@127.0.0.1:15432/postgres 2000
//! ```
//!
//! A warm-up round runs first (connections, prepared statements, the probe),
//! and the program prints when the measured rounds start and end, so that the
//! set-up can be told apart. Divide the write count by `2 × rounds`.

use std::time::Duration;

use lease::{LeaseKey, LeaseProvider, StoreConfig};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let store = args
        .next()
        .ok_or("usage: writes_per_op <store url> [rounds]")?;
    let rounds: u32 = args.next().map(|r| r.parse()).transpose()?.unwrap_or(1000);
    let provider = StoreConfig::new(store).build()?;
    let key = LeaseKey::new(format!("writes-per-op-{}", std::process::id()))?;
    let ttl = provider
        .capabilities()
        .practical_ttl(Duration::from_secs(10));
    for _ in 0..3 {
        round(&*provider, &key, ttl).await?;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    eprintln!("measuring {rounds} rounds");
    let started = std::time::Instant::now();
    for _ in 0..rounds {
        round(&*provider, &key, ttl).await?;
    }
    eprintln!(
        "done: {:.0} µs per round",
        started.elapsed().as_secs_f64() * 1e6 / f64::from(rounds)
    );
    Ok(())
}

/// One acquire and one release.
async fn round(
    provider: &dyn LeaseProvider,
    key: &LeaseKey,
    ttl: Duration,
) -> Result<(), Box<dyn std::error::Error>> {
    let lease = provider
        .try_acquire(key, ttl)
        .await?
        .into_lease()
        .ok_or("the key is held")?;
    provider.release(&lease).await?;
    Ok(())
}

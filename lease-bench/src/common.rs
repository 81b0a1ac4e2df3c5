//! What the benchmark's modules share: error conversion, the peer-lock
//! trait and its handoff loop, the SQLite directory. A leaf module.

use std::time::Duration;

use async_trait::async_trait;
use leases::{LeaseError, Result};

/// The environment variable that hands the across-processes contenders
/// their parent's SQLite directory.
pub const DIR_ENV: &str = "LEASE_BENCH_SQLITE_DIR";

pub(crate) fn err(e: impl std::fmt::Display) -> LeaseError {
    LeaseError::protocol(e.to_string())
}

/// Measures `rounds` handoffs: `$hold` takes the key, `$waiter()` (spawned)
/// waits for it and returns when it holds it, `$release` frees it at t0.
macro_rules! handoff_rounds {
    ($rounds:expr, $hold:block, $waiter:expr, $release:block) => {{
        let mut out = Vec::new();
        for _ in 0..$rounds {
            $hold;
            let task = tokio::spawn($waiter());
            tokio::time::sleep(Duration::from_millis(30)).await;
            let t0 = Instant::now();
            $release;
            out.push(task.await.map_err(err)?? - t0);
        }
        out
    }};
}
pub(crate) use handoff_rounds;

#[async_trait]
pub trait Peer: Send {
    fn name(&self) -> &'static str;
    async fn lock(&mut self, key: &str) -> Result<()>;
    async fn unlock(&mut self, key: &str) -> Result<()>;
    /// Rounds of: hold, a second client blocks waiting, release at t0, the
    /// waiter holds at t1; returns t1 - t0 per round.
    async fn handoff(&mut self, key: &str, rounds: usize) -> Result<Vec<Duration>>;
}

/// This process's directory for the SQLite benchmark database and the
/// flock files (under the system temporary directory), or its parent's when
/// it is one of the across-processes contenders.
pub fn sqlite_dir() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::var_os(DIR_ENV).map_or_else(
            || std::env::temp_dir().join(format!("lease-bench-sqlite-{}", std::process::id())),
            std::path::PathBuf::from,
        );
        // A failure shows up as the store's own error on first use.
        let _ = std::fs::create_dir_all(&dir);
        dir
    })
    .clone()
}

/// The raw floor of a store: the same kind of store commands, issued
/// directly with the same client crate.
#[async_trait]
pub trait Raw: Send {
    fn name(&self) -> &'static str;
    async fn acquire(&mut self, key: &str, ttl: Duration) -> Result<()>;
    async fn extend(&mut self, key: &str, ttl: Duration) -> Result<()>;
    async fn release(&mut self, key: &str) -> Result<()>;
    /// The handoff floor: rounds of hold, a second client waits on the
    /// store's own notification, release at t0, the waiter holds at t1;
    /// t1 - t0 per round. `None` where there is no single-store floor.
    async fn handoff(&mut self, _key: &str, _rounds: usize) -> Result<Option<Vec<Duration>>> {
        Ok(None)
    }
}

//! Contention in one process: tasks looping on a few keys, counting
//! acquisitions and the longest wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leases::{AcquireOptions, LeaseProvider, Result as LeaseResult, acquire};
use tokio::time::Instant;

use crate::results::Contention;
use crate::stores::key;

pub(crate) async fn contention(
    p: &Arc<dyn LeaseProvider>,
    prefix: &str,
    keys: usize,
    ttl: Duration,
    run_for: Duration,
) -> LeaseResult<Contention> {
    let tasks = 64;
    let started = Instant::now();
    let (count, longest_us) = contend(p, prefix, 0..tasks, keys, ttl, started + run_for).await;
    Ok(Contention {
        tasks,
        processes: 1,
        keys,
        acquisitions_per_sec: count as f64
            / started.elapsed().as_secs_f64().max(run_for.as_secs_f64()),
        longest_wait_ms: longest_us as f64 / 1000.0,
    })
}

/// Tasks numbered `tasks` each loop until `deadline`: wait for key
/// `task % keys`, hold it, release it. Returns the acquisitions and the
/// longest wait in microseconds.
pub(crate) async fn contend(
    p: &Arc<dyn LeaseProvider>,
    prefix: &str,
    tasks: std::ops::Range<usize>,
    keys: usize,
    ttl: Duration,
    deadline: Instant,
) -> (u64, u64) {
    let count = Arc::new(AtomicU64::new(0));
    let longest = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for t in tasks {
        let (p, count, longest) = (Arc::clone(p), Arc::clone(&count), Arc::clone(&longest));
        let k = key(prefix, t % keys.max(1));
        handles.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let started = Instant::now();
                let left = deadline.saturating_duration_since(started);
                match acquire(&p, &k, AcquireOptions::ttl(ttl).wait(left)).await {
                    Ok(Some(l)) => {
                        let waited = started.elapsed();
                        longest.fetch_max(
                            u64::try_from(waited.as_micros()).unwrap_or(u64::MAX),
                            Ordering::Relaxed,
                        );
                        count.fetch_add(1, Ordering::Relaxed);
                        let _ = p.release(&l).await;
                    }
                    Ok(None) => break,
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        }));
    }
    for h in handles {
        let _ = h.await;
    }
    (
        count.load(Ordering::Relaxed),
        longest.load(Ordering::Relaxed),
    )
}

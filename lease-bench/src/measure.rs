//! What the benchmark counts with: store calls through a counting hook, and
//! this process's CPU time and peak RSS.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use leases::backend::{Hook, Layered, Op};
use leases::{LeaseProvider, Result as LeaseResult};

/// Counts store calls that go through it: renewals, and tries (the herd a
/// release wakes, in the fairness section). A hook on [`Layered`].
#[derive(Debug, Default)]
pub(crate) struct Counting {
    pub(crate) extends: AtomicU64,
    pub(crate) tries: AtomicU64,
}

/// A provider whose store calls are counted.
pub(crate) type Counted = Layered<dyn LeaseProvider, Counting>;

impl Counting {
    pub(crate) fn new(inner: Arc<dyn LeaseProvider>) -> Counted {
        Layered::with_hook(inner, Counting::default())
    }
}

impl Hook for Counting {
    async fn before(&self, op: &Op<'_>) -> LeaseResult<()> {
        match op {
            Op::TryAcquire { .. } => {
                self.tries.fetch_add(1, Ordering::Relaxed);
            }
            Op::Extend { .. } | Op::ExtendMany { .. } => {
                self.extends.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        Ok(())
    }
}

pub(crate) fn proc_cpu_seconds() -> f64 {
    // utime + stime in clock ticks (100 per second on Linux).
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
            let u: f64 = after.get(11)?.parse().ok()?;
            let k: f64 = after.get(12)?.parse().ok()?;
            Some((u + k) / 100.0)
        })
        .unwrap_or(0.0)
}

pub(crate) fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib / 1024.0)
        })
        .unwrap_or(0.0)
}

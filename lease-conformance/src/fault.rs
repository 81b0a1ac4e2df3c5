//! Fault injection over any provider: hooks on [`Layered`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use lease_api::backend::{Hook, Layered, Op};
use lease_api::{LeaseError, LeaseProvider, Result};

/// Cuts the link to the store on demand. While [`cut`](Self::cut), every
/// call fails with `Unavailable`, as if the network between this holder and
/// the store were partitioned; so do the calls of the session store and the
/// queue of waiters the provider handed out. The store itself keeps running,
/// so other holders see the lease expire and take over: the setting of the
/// "holder pauses past its TTL" and "holder is cut off" failures.
///
/// A hook: [`Partition::new`] layers it over a provider, and
/// [`hook()`](Layered::hook) reaches it to cut and heal the link.
#[derive(Debug, Default)]
pub struct Partition {
    cut: AtomicBool,
}

impl Partition {
    /// Wraps `inner`, connected.
    pub fn new(inner: Arc<dyn LeaseProvider>) -> Arc<Layered<dyn LeaseProvider, Partition>> {
        Arc::new(Layered::with_hook(inner, Partition::default()))
    }

    /// Cuts (`true`) or heals (`false`) the link.
    pub fn cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }
}

impl Hook for Partition {
    async fn before(&self, _: &Op<'_>) -> Result<()> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(LeaseError::Unavailable {
                message: "the link to the store is cut (injected partition)".into(),
                source: None,
            });
        }
        Ok(())
    }
}

/// Counts a provider's `try_acquire` calls, and can make
/// [`watch`](LeaseProvider::watch) fail (a lost pub/sub permission, a
/// notification channel that cannot be set up).
///
/// A hook: [`Instrumented::new`] layers it over a provider, and
/// [`hook()`](Layered::hook) reaches it.
#[derive(Debug, Default)]
pub struct Instrumented {
    fail_watch: AtomicBool,
    try_acquires: AtomicU64,
}

impl Instrumented {
    /// Wraps `inner`, passing everything through.
    pub fn new(inner: Arc<dyn LeaseProvider>) -> Arc<Layered<dyn LeaseProvider, Instrumented>> {
        Arc::new(Layered::with_hook(inner, Instrumented::default()))
    }

    /// Makes `watch` fail with `Unavailable` (`true`) or pass through (`false`).
    pub fn fail_watch(&self, fail: bool) {
        self.fail_watch.store(fail, Ordering::SeqCst);
    }

    /// How many `try_acquire` calls went through so far.
    pub fn try_acquires(&self) -> u64 {
        self.try_acquires.load(Ordering::SeqCst)
    }
}

impl Hook for Instrumented {
    async fn before(&self, op: &Op<'_>) -> Result<()> {
        match op {
            Op::TryAcquire { .. } => {
                self.try_acquires.fetch_add(1, Ordering::SeqCst);
            }
            Op::Watch { .. } if self.fail_watch.load(Ordering::SeqCst) => {
                return Err(LeaseError::Unavailable {
                    message: "watching is refused (injected)".into(),
                    source: None,
                });
            }
            _ => {}
        }
        Ok(())
    }
}

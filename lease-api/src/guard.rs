//! `LeaseGuard`: keeps a lease alive while a job runs and says when it is lost (C11).

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::held::{HeldLease, LostReason, Shared, lock};
use crate::time::deadline_after;
use crate::{Lease, LeaseError, LeaseProvider, Result};

/// How a [`LeaseGuard`] renews. Start from `GuardConfig::default()` and change
/// what you need:
///
/// ```
/// use std::time::Duration;
/// use lease_api::GuardConfig;
///
/// let config = GuardConfig::default().renew_every(Duration::from_secs(2)).keep_on_drop(true);
/// assert_eq!(config.renew_every, Some(Duration::from_secs(2)));
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct GuardConfig {
    /// Renew this long after the last successful renewal was sent.
    /// Default: a third of the lease's local validity window (for most
    /// providers a third of the TTL; shorter where validity is capped, as on
    /// ZooKeeper by the session timeout).
    pub renew_every: Option<Duration>,
    /// After a failed renewal (store unreachable), retry after this long.
    /// Default: a tenth of the validity window, between 10 ms and 1 s.
    pub retry_every: Option<Duration>,
    /// Fire the lost signal this long **before** local validity ends when
    /// renewals keep failing, so the job has this long to stop while the lease
    /// is still surely held. Default: a tenth of the validity window, at most
    /// 1 s; never more than half the window.
    pub lost_margin: Option<Duration>,
    /// Do not release the lease when the guard is dropped without
    /// [`LeaseGuard::release`]; let it run out instead. Default: release.
    pub keep_on_drop: bool,
}

impl GuardConfig {
    /// Sets [`renew_every`](Self::renew_every).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// Sets [`retry_every`](Self::retry_every).
    pub fn retry_every(mut self, every: Duration) -> Self {
        self.retry_every = Some(every);
        self
    }

    /// Sets [`lost_margin`](Self::lost_margin).
    pub fn lost_margin(mut self, margin: Duration) -> Self {
        self.lost_margin = Some(margin);
        self
    }

    /// Sets [`keep_on_drop`](Self::keep_on_drop).
    pub fn keep_on_drop(mut self, keep: bool) -> Self {
        self.keep_on_drop = keep;
        self
    }
}

/// Holds a lease: renews it in the background and fires a lost signal the job
/// can select on (C11).
///
/// Renewal runs every `TTL/3` by default (never later than half the validity
/// window). A failed renewal is retried until the lease's local validity
/// ([`Lease::valid_until`]) is [`GuardConfig::lost_margin`] away; then, or at once
/// when the store says the lease is gone, the lost signal fires: always before
/// local validity ends, never after. If the renewal task ends for any other
/// reason (a panic, a runtime shutting down) the signal fires too. A renewal
/// failure is never only logged.
/// Release explicitly with [`release`](Self::release); dropping the guard releases
/// on a best-effort basis in the background.
///
/// ```
/// # async fn demo() -> lease_api::Result<()> {
/// use std::{sync::Arc, time::Duration};
/// use lease_api::{LeaseGuard, LeaseKey, LeaseProvider, MemoryProvider};
///
/// let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
/// let key = LeaseKey::new("report")?;
/// let lease = provider.try_acquire(&key, Duration::from_secs(10)).await?
///     .into_lease().expect("free key");
/// let guard = LeaseGuard::new(provider, lease);
/// tokio::select! {
///     reason = guard.lost() => println!("stop writing: {reason}"),
///     _ = tokio::time::sleep(Duration::from_millis(10)) => println!("work done"),
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LeaseGuard {
    provider: Arc<dyn LeaseProvider>,
    held: HeldLease,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    keep_on_drop: bool,
}

impl LeaseGuard {
    /// Starts guarding `lease` with the default configuration.
    pub fn new(provider: Arc<dyn LeaseProvider>, lease: Lease) -> Self {
        Self::with_config(provider, lease, GuardConfig::default())
    }

    /// Starts guarding `lease`. Must be called inside a tokio runtime.
    pub fn with_config(
        provider: Arc<dyn LeaseProvider>,
        lease: Lease,
        config: GuardConfig,
    ) -> Self {
        // The window in which the lease is surely held: the TTL, or less where
        // the provider caps local validity (ZooKeeper: the session timeout).
        let window = lease
            .valid_until()
            .saturating_duration_since(lease.sent_at());
        let lost_margin = config
            .lost_margin
            .unwrap_or((window / 10).min(Duration::from_secs(1)))
            .min(window / 2);
        // A renewal must be sent while the lease is surely held, with time for
        // a retry: never later than half of what is left after the margin.
        let renew_every = config
            .renew_every
            .unwrap_or(window / 3)
            .min(window.saturating_sub(lost_margin) / 2)
            .max(Duration::from_millis(1));
        let retry_every = config
            .retry_every
            .unwrap_or((window / 10).clamp(Duration::from_millis(10), Duration::from_secs(1)))
            .max(Duration::from_millis(1));
        let shared = Arc::new(Shared::new(lease));
        let stop = CancellationToken::new();
        let task = tokio::spawn(renew_loop(
            Arc::clone(&provider),
            Arc::clone(&shared),
            stop.clone(),
            Timing {
                renew_every,
                retry_every,
                lost_margin,
            },
        ));
        LeaseGuard {
            provider,
            held: HeldLease::new(shared),
            stop,
            task: Some(task),
            keep_on_drop: config.keep_on_drop,
        }
    }

    async fn stop_renewing(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            // The loop ends at its next await point; a panic in it is reported
            // as lost, never propagated.
            if task.await.is_err() {
                self.held
                    .shared
                    .fire(LostReason::Expired("the renewal task failed".into()));
            }
        }
    }

    /// Stops renewing and releases the lease in the store.
    ///
    /// # Errors
    /// `NotHeld` if the lease was already lost; `Unavailable` if the store is
    /// down (the lease then runs out by its TTL).
    pub async fn release(mut self) -> Result<()> {
        self.stop_renewing().await;
        self.keep_on_drop = true;
        let lease = self.lease();
        self.provider.release(&lease).await
    }

    /// Stops renewing without releasing and returns the lease, which then runs
    /// out by its TTL unless someone extends or releases it.
    pub async fn detach(mut self) -> Lease {
        self.stop_renewing().await;
        self.keep_on_drop = true;
        self.lease()
    }
}

/// A guard reads as the lease it holds: `guard.token()`, `guard.lost()`,
/// `guard.lease()` and the rest are [`HeldLease`]'s.
impl Deref for LeaseGuard {
    type Target = HeldLease;

    fn deref(&self) -> &HeldLease {
        &self.held
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.stop.cancel();
        if self.keep_on_drop || self.is_lost() {
            return;
        }
        let lease = self.lease();
        let provider = Arc::clone(&self.provider);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(e) = provider.release(&lease).await {
                        tracing::debug!(key = %lease.key(), error = %e, "best-effort release on drop failed");
                    }
                });
            }
            Err(_) => tracing::warn!(
                key = %lease.key(),
                "lease guard dropped outside a tokio runtime; the lease runs out by its TTL"
            ),
        }
    }
}

#[derive(Clone, Copy)]
struct Timing {
    renew_every: Duration,
    retry_every: Duration,
    lost_margin: Duration,
}

/// Fires the lost signal when the renewal task ends for any reason other than
/// being stopped: a panic, an abort, a runtime shutting down. Without it a dead
/// task would leave `is_lost()` false while nobody renews.
struct FireUnlessStopped {
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl Drop for FireUnlessStopped {
    fn drop(&mut self) {
        if !self.stop.is_cancelled() {
            self.shared.fire(LostReason::Expired(
                "the renewal task ended without being stopped".into(),
            ));
        }
    }
}

async fn renew_loop(
    provider: Arc<dyn LeaseProvider>,
    shared: Arc<Shared>,
    stop: CancellationToken,
    timing: Timing,
) {
    let _fire = FireUnlessStopped {
        shared: Arc::clone(&shared),
        stop: stop.clone(),
    };
    // The instant the lost signal must fire by: ahead of local validity by the margin.
    let fire_at = |lease: &Lease| {
        lease
            .valid_until()
            .checked_sub(timing.lost_margin)
            .unwrap_or_else(|| lease.valid_until())
    };
    let backend = provider.capabilities().backend;
    let fire = |reason: LostReason| {
        let label = match &reason {
            LostReason::Revoked => "revoked",
            LostReason::Expired(_) => "expired",
            LostReason::Closed => "closed",
        };
        crate::record::record_lost(backend, label);
        shared.fire(reason);
    };
    loop {
        let (sent_at, deadline) = {
            let l = lock(&shared.lease);
            (l.sent_at(), fire_at(&l))
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = sleep_until(deadline_after(sent_at, timing.renew_every).min(deadline)) => {}
        }
        let mut last_error: Option<LeaseError> = None;
        loop {
            let current = lock(&shared.lease).clone();
            let deadline = fire_at(&current);
            let expired = |last_error: Option<LeaseError>| {
                LostReason::Expired(last_error.map_or_else(
                    || "the store did not answer before local validity ended".to_string(),
                    |e| e.to_string(),
                ))
            };
            if Instant::now() >= deadline {
                fire(expired(last_error));
                return;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = sleep_until(deadline) => {
                    fire(expired(last_error));
                    return;
                }
                result = provider.extend(&current, current.ttl()) => match result {
                    Ok(renewed) => {
                        crate::record::record_renewal(backend, true);
                        *lock(&shared.lease) = renewed;
                        break;
                    }
                    Err(e) if e.is_not_held() => {
                        fire(LostReason::Revoked);
                        return;
                    }
                    Err(e) => {
                        crate::record::record_renewal(backend, false);
                        tracing::warn!(key = %current.key(), error = %e, "lease renewal failed; retrying until local validity ends");
                        last_error = Some(e);
                        let retry_at = deadline_after(Instant::now(), timing.retry_every).min(deadline);
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = sleep_until(retry_at) => {}
                        }
                    }
                }
            }
        }
    }
}

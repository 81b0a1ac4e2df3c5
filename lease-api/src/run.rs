//! Run a job under a lease: cancelled when the lease is lost, with a minimum hold.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    AcquireOptions, FencingToken, GuardConfig, LeaseGuard, LeaseKey, LeaseProvider, LostReason,
    Result, acquire,
};

/// Options for [`run_with_lease`]: start from `RunOptions::default()`.
///
/// ```
/// use std::time::Duration;
/// use lease_api::RunOptions;
///
/// let options = RunOptions::default().wait(Duration::from_secs(1)).min_hold(Duration::from_secs(50));
/// assert_eq!(options.min_hold, Duration::from_secs(50));
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct RunOptions {
    /// How long to wait for the key if it is held. Default: do not wait.
    pub wait: Duration,
    /// Keep the key held at least this long after it was acquired, even if the
    /// job ends sooner, so that late instances of a once-per-slot job (cron) find
    /// it taken. Where leases end only by TTL, the remainder is left to run out in
    /// the store and the call returns at once. Where the store ties leases to
    /// the holder's session ([`Capabilities::holder_session`](crate::Capabilities::holder_session),
    /// ZooKeeper), the lease would end with the process, so the call keeps
    /// renewing until the hold ends, then releases. Default: release as soon as
    /// the job ends.
    pub min_hold: Duration,
    /// How the lease is renewed while the job runs.
    pub guard: GuardConfig,
}

impl RunOptions {
    /// Sets [`wait`](Self::wait).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Sets [`min_hold`](Self::min_hold).
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.min_hold = min_hold;
        self
    }

    /// Sets [`guard`](Self::guard).
    pub fn guard(mut self, guard: GuardConfig) -> Self {
        self.guard = guard;
        self
    }
}

/// What the job gets: the key, its fencing token, and the lost signal.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LeaseContext {
    /// The leased key.
    pub key: LeaseKey,
    /// The fencing token to pass to every write the job makes.
    pub token: FencingToken,
    /// Cancelled when the lease is lost (the job's future is then dropped too).
    pub lost: CancellationToken,
}

/// How [`run_with_lease`] ended.
#[derive(Debug)]
pub enum RunOutcome<T> {
    /// The job ran to the end while the lease was held.
    Completed {
        /// The job's result.
        value: T,
        /// The token it ran under.
        token: FencingToken,
    },
    /// The key stayed held by someone else for the whole wait; the job did not run.
    NotAcquired,
    /// The lease was lost while the job ran; the job was cancelled.
    Lost {
        /// Why.
        reason: LostReason,
        /// The token it ran under.
        token: FencingToken,
    },
}

/// Acquires `key` (waiting up to `options.wait`), runs `job` while a guard renews
/// the lease, and cancels the job (drops its future) the moment the lease is lost.
///
/// When the job ends the lease is released, or, with `options.min_hold`, cut to
/// end exactly `min_hold` after acquisition.
///
/// ```
/// # async fn demo() -> lease_api::Result<()> {
/// use std::{sync::Arc, time::Duration};
/// use lease_api::{run_with_lease, LeaseKey, MemoryProvider, RunOptions, RunOutcome};
///
/// let provider = Arc::new(MemoryProvider::new());
/// let key = LeaseKey::new("nightly-report")?;
/// let outcome = run_with_lease(provider, &key, Duration::from_secs(30), RunOptions::default(),
///     |ctx| async move { format!("report written under token {}", ctx.token) }).await?;
/// assert!(matches!(outcome, RunOutcome::Completed { .. }));
/// # Ok(()) }
/// ```
///
/// # Errors
/// Invalid key or TTL, or the store being unavailable while acquiring. Failures
/// after the job ran (release) are logged, not returned: the job's result matters more.
pub async fn run_with_lease<F, Fut, T>(
    provider: Arc<dyn LeaseProvider>,
    key: &LeaseKey,
    ttl: Duration,
    options: RunOptions,
    job: F,
) -> Result<RunOutcome<T>>
where
    F: FnOnce(LeaseContext) -> Fut,
    Fut: Future<Output = T>,
{
    let Some(lease) = acquire(&provider, key, AcquireOptions::ttl(ttl).wait(options.wait)).await?
    else {
        return Ok(RunOutcome::NotAcquired);
    };
    let acquired_at = lease.sent_at();
    let token = lease.token();
    let guard = LeaseGuard::with_config(Arc::clone(&provider), lease, options.guard);
    let ctx = LeaseContext {
        key: key.clone(),
        token,
        lost: guard.lost_token(),
    };
    let value = tokio::select! {
        biased;
        reason = guard.lost() => return Ok(RunOutcome::Lost { reason, token }),
        value = job(ctx) => value,
    };
    if guard.is_lost() {
        let reason = guard.lost_reason().unwrap_or(LostReason::Revoked);
        return Ok(RunOutcome::Lost { reason, token });
    }
    end_after_min_hold(&provider, guard, acquired_at, options.min_hold).await;
    Ok(RunOutcome::Completed { value, token })
}

/// Ends a guarded lease after its job: released at once, or kept until
/// `acquired_at + min_hold`. Where leases end only by TTL the remainder is
/// left to the store (one extend, then this returns); where they end with the
/// holder's session ([`Capabilities::holder_session`](crate::Capabilities::holder_session))
/// this keeps renewing until the hold ends, then releases. Failures are logged:
/// the job has already run. This is what [`run_with_lease`] does after the job,
/// for callers (like the `lease` command) that run the job themselves.
pub async fn end_after_min_hold(
    provider: &Arc<dyn LeaseProvider>,
    guard: LeaseGuard,
    acquired_at: Instant,
    min_hold: Duration,
) {
    let key = guard.key();
    let hold_until = crate::time::deadline_after(acquired_at, min_hold);
    let now = Instant::now();
    if hold_until > now && provider.capabilities().holder_session.is_some() {
        // The lease ends with our session: stay and renew until the hold ends.
        tokio::select! {
            reason = guard.lost() => {
                tracing::warn!(key = %key, %reason, "lease lost during the minimum hold");
                return;
            }
            _ = tokio::time::sleep_until(hold_until) => {}
        }
        if let Err(e) = guard.release().await {
            tracing::warn!(key = %key, error = %e, "release after the minimum hold failed; the lease runs out by its TTL");
        }
    } else if hold_until > now {
        let lease = guard.detach().await;
        let rest = provider.capabilities().practical_ttl(hold_until - now);
        if let Err(e) = provider.extend(&lease, rest).await {
            tracing::warn!(key = %key, error = %e, "could not set the minimum hold; the lease runs out by its TTL");
        }
    } else if let Err(e) = guard.release().await {
        tracing::warn!(key = %key, error = %e, "release after the job failed; the lease runs out by its TTL");
    }
}

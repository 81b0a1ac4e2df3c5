//! The failover scenario every replicated topology runs: the leader or
//! primary is lost while a lease is held and a waiter waits, and the
//! provider must keep what its [`Failover`](lease_api::Failover) declaration
//! promises, by itself, on the same provider objects.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_api::{
    AcquireOptions, FailoverTokens, FencingToken, LeaseError, LeaseGuard, LeaseKey, LeaseProvider,
    acquire,
};

/// What one run of [`leader_loss`] measured, for the test to print.
#[derive(Debug, Clone)]
pub struct FailoverRun {
    /// The lease's TTL.
    pub ttl: Duration,
    /// Whether the holder still held its lease after the failover.
    pub lease_survived: bool,
    /// How long the holder's release took, retried while the store was
    /// unavailable (where the lease survived).
    pub release_took: Duration,
    /// From the holder's release (or its loss) to the waiter holding the key.
    pub waiter_got_key_after: Duration,
    /// The largest token issued before the loss, and the waiter's token.
    pub tokens: (FencingToken, FencingToken),
}

fn fail(what: impl Into<String>) -> LeaseError {
    LeaseError::protocol(what.into())
}

/// Retries `f` on transient errors until `limit`; the time it took.
async fn until_served<T, F, Fut>(limit: Duration, mut f: F) -> Result<(T, Duration), LeaseError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, LeaseError>>,
{
    let start = Instant::now();
    loop {
        match f().await {
            Ok(v) => return Ok((v, start.elapsed())),
            Err(e) if e.is_transient() && start.elapsed() < limit => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Runs the scenario:
///
/// 1. `holder` and `waiter` (two providers of one topology, in one
///    namespace) take and release a few keys: the tokens before.
/// 2. `holder` takes the key under a [`LeaseGuard`]; `waiter` waits for it.
/// 3. `lose_leader` kills (or freezes) the leader or primary.
/// 4. Where the declaration says leases survive, the guard must stay unlost
///    for one and a half TTLs (a TTL of twice the recovery bound) and the waiter must not get the key meanwhile; then the
///    guard releases, on the same provider, retried only while the store is
///    unavailable and within the declared recovery bound. Where leases do
///    not survive, the guard must report the loss within the bound.
/// 5. The waiter must hold the key within the declared recovery bound of
///    the release (its watch must survive the failover, or be set up again).
/// 6. Where tokens are declared increasing, the waiter's token must exceed
///    every token issued before the loss.
///
/// # Errors
/// A description of the first promise broken.
pub async fn leader_loss(
    holder: Arc<dyn LeaseProvider>,
    waiter: Arc<dyn LeaseProvider>,
    lose_leader: impl FnOnce() + Send + 'static,
) -> Result<FailoverRun, LeaseError> {
    let caps = holder.capabilities().clone();
    let declared = caps
        .failover
        .clone()
        .ok_or_else(|| fail(format!("{} declares no failover behaviour", caps.backend)))?;
    let recovery = declared.recovery;
    // Long enough that renewals can resume before it runs out.
    let ttl = caps.practical_ttl((recovery * 2).max(Duration::from_secs(4)));
    let key = |s: &str| LeaseKey::new(format!("failover-{s}"));

    // 1. Tokens before.
    let mut before = FencingToken(0);
    for i in 0..5 {
        let k = key(&format!("before-{i}"))?;
        let (got, _) = until_served(recovery, || holder.try_acquire(&k, ttl)).await?;
        let lease = got
            .into_lease()
            .ok_or_else(|| fail("a fresh key was held"))?;
        before = before.max(lease.token());
        holder.release(&lease).await?;
    }

    // 2. A held lease and a waiter.
    let k = key("held")?;
    let lease = holder
        .try_acquire(&k, ttl)
        .await?
        .into_lease()
        .ok_or_else(|| fail("a fresh key was held"))?;
    before = before.max(lease.token());
    let guard = LeaseGuard::new(Arc::clone(&holder), lease);
    let (w, wk) = (Arc::clone(&waiter), k.clone());
    let wait_limit = ttl * 4 + recovery * 3 + Duration::from_secs(30);
    let waiting = tokio::spawn(async move {
        let got = acquire(&w, &wk, AcquireOptions::ttl(ttl).wait(wait_limit)).await;
        (got, Instant::now())
    });
    // Let the waiter see the key held and set up its watch.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // 3. The loss.
    tokio::task::spawn_blocking(lose_leader)
        .await
        .map_err(|e| fail(format!("losing the leader failed: {e}")))?;
    let lost_at = Instant::now();

    // 4. The lease across the failover.
    let released_at;
    let lease_survived;
    let mut release_took = Duration::ZERO;
    if declared.lease_survives {
        // Past the TTL: the lease is held only if renewals resumed.
        let watch_for = ttl + ttl / 2;
        if let Ok(reason) = tokio::time::timeout(watch_for, guard.lost()).await {
            return Err(fail(format!(
                "the capabilities say a lease survives a failover, but the guard reported it lost {:?} after the loss: {reason:?}",
                lost_at.elapsed()
            )));
        }
        if waiting.is_finished() {
            return Err(fail(
                "the waiter got the key while its holder still held it",
            ));
        }
        lease_survived = true;
        let lease = guard.lease();
        guard.release().await.or_else(|e| {
            // The guard gives up on one failed call; the release is retried
            // below on the same provider.
            if e.is_transient() { Ok(()) } else { Err(e) }
        })?;
        let ((), took) = until_served(recovery, || async {
            match holder.release(&lease).await {
                Ok(()) | Err(LeaseError::NotHeld { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })
        .await?;
        release_took = took;
        released_at = Instant::now();
    } else {
        let limit = recovery + ttl;
        if tokio::time::timeout(limit, guard.lost()).await.is_err() {
            return Err(fail(format!(
                "the capabilities say a lease does not survive a failover, but the guard did not report the loss within {limit:?}"
            )));
        }
        lease_survived = false;
        released_at = Instant::now();
    }

    // 5. The waiter.
    let bound = recovery + caps.expiry_slack + if lease_survived { Duration::ZERO } else { ttl };
    let (got, at) = tokio::time::timeout(bound + Duration::from_secs(5), waiting)
        .await
        .map_err(|_| {
            fail(format!(
                "the waiter did not get the key within {:?} of its release (declared recovery bound {recovery:?})",
                bound + Duration::from_secs(5)
            ))
        })?
        .map_err(|e| fail(format!("the waiter task failed: {e}")))?;
    let next = got?.ok_or_else(|| fail("the waiter gave up"))?;
    let waiter_got_key_after = at.saturating_duration_since(released_at);
    if waiter_got_key_after > bound {
        return Err(fail(format!(
            "the waiter got the key {waiter_got_key_after:?} after the release, past the declared bound {bound:?}"
        )));
    }

    // 6. Tokens.
    if matches!(declared.tokens, FailoverTokens::Increasing(_)) && next.token() <= before {
        return Err(fail(format!(
            "tokens are declared increasing across a failover, but the waiter got {} after {before} was issued",
            next.token()
        )));
    }
    let _ = until_served(recovery, || waiter.release(&next)).await;
    Ok(FailoverRun {
        ttl,
        lease_survived,
        release_took,
        waiter_got_key_after,
        tokens: (before, next.token()),
    })
}

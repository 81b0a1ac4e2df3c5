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
    /// From the loss of the leader to the first acquire of a fresh key that
    /// the store answered (asserted within the declared recovery bound).
    pub serving_again_after: Duration,
    /// From the holder's release being sent (or its loss) to the waiter
    /// holding the key.
    pub waiter_got_key_after: Duration,
    /// The largest token issued before the loss, and the waiter's token.
    pub tokens: (FencingToken, FencingToken),
}

/// A task aborted when this is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A declared recovery this long means no failover happens by itself.
const NO_AUTOMATIC_FAILOVER: Duration = Duration::from_secs(24 * 3600);

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

/// How soon after a release a waiter must hold the key: a notification's
/// latency, generous for a loaded 2-core machine, and far below the
/// holder's remaining TTL that a waiter without a working watch waits for.
pub const NOTIFIED_WITHIN: Duration = Duration::from_secs(2);

/// Runs the scenario:
///
/// 1. `holder` and `waiter` (two providers of one topology, in one
///    namespace) take and release a few keys: the tokens before.
/// 2. `holder` takes the key under a [`LeaseGuard`]; `waiter` waits for it.
/// 3. `lose_leader` kills (or freezes) the leader or primary.
/// 4. The holder's provider must acquire a fresh key within the declared
///    recovery bound of the loss (retried while the store is unavailable).
/// 5. Where the declaration says leases survive, the guard must stay unlost
///    for one and a half TTLs (a TTL of twice the recovery bound) and the
///    waiter must not get the key meanwhile; then the guard releases. Where
///    leases do not survive, the guard must report the loss.
/// 6. The waiter must hold the key within [`NOTIFIED_WITHIN`] (plus the
///    expiry slack) of the release being sent: by a notification, so its
///    watch survived the failover or was set up again. A waiter without one
///    polls at the holder's remaining TTL, far later.
/// 7. Where tokens are declared increasing, the waiter's token must exceed
///    every token issued before the loss.
///
/// # Errors
/// A description of the first promise broken.
#[allow(clippy::too_many_lines)]
pub async fn leader_loss(
    holder: Arc<dyn LeaseProvider>,
    waiter: Arc<dyn LeaseProvider>,
    lose_leader: impl FnOnce() + Send + 'static,
) -> Result<FailoverRun, LeaseError> {
    let key = |s: &str| LeaseKey::new(format!("failover-{s}"));
    // A first call, so a provider whose declarations depend on what the
    // server granted (ZooKeeper's session timeout) has them.
    let warm = key("warm")?;
    until_served(Duration::from_secs(30), || holder.inspect(&warm)).await?;
    until_served(Duration::from_secs(30), || waiter.inspect(&warm)).await?;
    let caps = holder.capabilities().clone();
    let declared = caps
        .failover
        .clone()
        .ok_or_else(|| fail(format!("{} declares no failover behaviour", caps.backend)))?;
    let recovery = declared.recovery;
    // A cluster that promotes nobody by itself (Patroni paused) declares no
    // bound: no failover to wait for, and no sum below would fit.
    if recovery >= NO_AUTOMATIC_FAILOVER {
        return Err(fail(format!(
            "{} declares no automatic failover (recovery {recovery:?}): {}",
            caps.backend,
            match &declared.tokens {
                lease_api::FailoverTokens::Increasing(why)
                | lease_api::FailoverTokens::MayRepeat(why) => why.as_str(),
                _ => "",
            }
        )));
    }
    // Long enough that renewals can resume before it runs out.
    let ttl = caps.practical_ttl((recovery * 2).max(Duration::from_secs(4)));

    // 1. Tokens before, of the key the scenario holds (tokens grow per key).
    let k = key("held")?;
    let mut before = FencingToken(0);
    for _ in 0..5 {
        let (got, _) = until_served(recovery, || holder.try_acquire(&k, ttl)).await?;
        let lease = got
            .into_lease()
            .ok_or_else(|| fail("a fresh key was held"))?;
        before = before.max(lease.token());
        holder.release(&lease).await?;
    }

    // 2. A held lease and a waiter.
    let lease = holder
        .try_acquire(&k, ttl)
        .await?
        .into_lease()
        .ok_or_else(|| fail("a fresh key was held"))?;
    before = before.max(lease.token());
    let guard = LeaseGuard::new(Arc::clone(&holder), lease);
    let (w, wk) = (Arc::clone(&waiter), k.clone());
    let wait_limit = ttl * 4 + recovery * 3 + Duration::from_secs(30);
    // Aborted when the scenario ends early, so a failed run leaves no waiter
    // behind to load the machine (or a retry on a new topology).
    let mut waiting = AbortOnDrop(tokio::spawn(async move {
        let got = acquire(&w, &wk, AcquireOptions::ttl(ttl).wait(wait_limit)).await;
        (got, Instant::now())
    }));
    // Let the waiter see the key held and set up its watch.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // 3. The loss.
    tokio::task::spawn_blocking(lose_leader)
        .await
        .map_err(|e| fail(format!("losing the leader failed: {e}")))?;
    let lost_at = Instant::now();

    // 4. Serving again, measured from the loss.
    let fresh = key("fresh")?;
    let (got, serving_again_after) =
        until_served(recovery * 2, || holder.try_acquire(&fresh, ttl)).await?;
    if serving_again_after > recovery + Duration::from_secs(1) {
        return Err(fail(format!(
            "the provider served again {serving_again_after:?} after the loss, past the declared recovery bound {recovery:?}"
        )));
    }
    if let Some(l) = got.into_lease() {
        let _ = holder.release(&l).await;
    }

    // 5. The lease across the failover.
    let released_at;
    let lease_survived;
    if declared.lease_survives {
        // Past the TTL: the lease is held only if renewals resumed.
        let watch_for = ttl + ttl / 2;
        if let Ok(reason) = tokio::time::timeout(watch_for, guard.lost()).await {
            return Err(fail(format!(
                "the capabilities say a lease survives a failover, but the guard reported it lost {:?} after the loss: {reason:?}",
                lost_at.elapsed()
            )));
        }
        if waiting.0.is_finished() {
            return Err(fail(
                "the waiter got the key while its holder still held it",
            ));
        }
        lease_survived = true;
        // The store serves again (step 4): one release, no retries.
        released_at = Instant::now();
        guard.release().await?;
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

    // 6. The waiter, woken by a notification.
    let bound = if lease_survived {
        NOTIFIED_WITHIN + caps.expiry_slack
    } else {
        // A lost lease is freed by its TTL in the store, not by a release.
        recovery + ttl + caps.expiry_slack
    };
    let (got, at) = tokio::time::timeout(bound + Duration::from_secs(5), &mut waiting.0)
        .await
        .map_err(|_| {
            fail(format!(
                "the waiter did not get the key within {:?} of its release: its watch did not survive the failover",
                bound + Duration::from_secs(5)
            ))
        })?
        .map_err(|e| fail(format!("the waiter task failed: {e}")))?;
    let next = got?.ok_or_else(|| fail("the waiter gave up"))?;
    if at < released_at {
        return Err(fail("the waiter got the key before its holder released it"));
    }
    let waiter_got_key_after = at - released_at;
    if waiter_got_key_after > bound {
        return Err(fail(format!(
            "the waiter got the key {waiter_got_key_after:?} after the release, past the declared bound {bound:?}"
        )));
    }

    // 7. Tokens.
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
        serving_again_after,
        waiter_got_key_after,
        tokens: (before, next.token()),
    })
}

//! C16: sessions, many leases renewed by one loop.

use super::*;
use lease_api::{LeaseSession, SessionConfig, SessionLease};

async fn open(p: &Arc<dyn LeaseProvider>, ttl: Duration) -> Result<LeaseSession, CaseError> {
    Ok(LeaseSession::open(Arc::clone(p), SessionConfig::ttl(ttl)).await?)
}

async fn take(
    session: &LeaseSession,
    ctx: &Ctx,
    what: &str,
    n: usize,
) -> Result<Vec<SessionLease>, CaseError> {
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let key = ctx.key(&format!("{what}/{i}"))?;
        match session.try_acquire(&key).await? {
            Some(l) => held.push(l),
            None => return Err(CaseError(format!("free key {key:?} was held"))),
        }
    }
    Ok(held)
}

pub(super) async fn session_renews_many_leases(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let other = ctx.provider().await?;
    let ttl = renewing_ttl(&*p);
    let session = open(&p, ttl).await?;
    let n = 40;
    let held = take(&session, &ctx, "many", n).await?;
    // Each lease has its own token, from its own key's sequence (C8).
    for l in &held {
        check!(
            other.inspect(&l.key()).await?.map(|i| i.token) == Some(l.token()),
            "the store shows another token than the session's on {:?}",
            l.key()
        );
    }
    // Held across several TTLs, by the session's renewals alone.
    let until = Instant::now() + ttl * 3 + p.capabilities().expiry_slack;
    while Instant::now() < until {
        sleep(ttl / 2).await;
        for l in &held {
            check!(
                !l.is_lost(),
                "lease {:?} lost: {:?}",
                l.key(),
                l.lost_reason()
            );
        }
        for l in held.iter().step_by(7) {
            must_be_held(&*other, &l.key(), ttl).await?;
        }
    }
    for l in &held {
        check!(
            other.inspect(&l.key()).await?.map(|i| i.token) == Some(l.token()),
            "the store does not show the session's lease on {:?}",
            l.key()
        );
    }
    let stats = session.stats();
    check!(
        stats.rounds >= 2,
        "the session renewed {} times",
        stats.rounds
    );
    let per_round = n.div_ceil(session.batch_limit().max(1)) as u64;
    check!(
        stats.renew_calls <= stats.rounds * per_round,
        "{} renewal calls in {} rounds for {n} leases (batch limit {})",
        stats.renew_calls,
        stats.rounds,
        session.batch_limit()
    );
    let keys: Vec<_> = held.iter().map(|l| l.key()).collect();
    // Closing releases every lease still held, and tells each one.
    session.close().await;
    for l in &held {
        check!(
            l.lost_reason() == Some(LostReason::Closed),
            "lease {:?} after close: {:?}",
            l.key(),
            l.lost_reason()
        );
    }
    for key in &keys {
        check!(
            other.inspect(key).await?.is_none(),
            "closing the session left {key:?} held"
        );
    }
    Ok(())
}

pub(super) async fn session_key_lost_alone(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let other = ctx.provider().await?;
    let ttl = renewing_ttl(&*p);
    let session = open(&p, ttl).await?;
    let held = take(&session, &ctx, "alone", 5).await?;
    // The store ends one lease behind the session's back and someone else
    // takes the key, as after a takeover.
    let gone = &held[2];
    p.release(&gone.lease()).await?;
    let next = must_acquire(&*other, &gone.key(), long_ttl(&*other)).await?;
    check!(next.token() > gone.token(), "takeover token did not grow");
    let reason = tokio::time::timeout(ttl + TOLERANCE, gone.lost())
        .await
        .map_err(|_| CaseError("the lease taken over never fired its lost signal".into()))?;
    check!(reason == LostReason::Revoked, "reason {reason:?}");
    // The session's other leases go on.
    sleep(ttl).await;
    for l in held.iter().filter(|l| l.key() != gone.key()) {
        check!(
            !l.is_lost(),
            "lease {:?} lost with its neighbour: {:?}",
            l.key(),
            l.lost_reason()
        );
        must_be_held(&*other, &l.key(), ttl).await?;
    }
    check!(
        other.inspect(&gone.key()).await?.map(|i| i.token) == Some(next.token()),
        "the new holder lost the key"
    );
    other.release(&next).await?;
    session.close().await;
    Ok(())
}

pub(super) async fn session_outage_fires_every_lease_by_validity(ctx: Ctx) -> CaseResult {
    let link = Partition::new(ctx.provider().await?);
    let as_provider: Arc<dyn LeaseProvider> = link.clone();
    let other = ctx.provider().await?;
    let ttl = short_ttl(&*other);
    // Half the TTL as the margin (the most a session takes): the case is about
    // firing by local validity at all, and a loaded machine can run the renewal
    // task 100 ms late, past the default margin of a short TTL (a tenth).
    let session = LeaseSession::open(
        Arc::clone(&as_provider),
        SessionConfig::ttl(ttl).lost_margin(ttl / 2),
    )
    .await?;
    let held = take(&session, &ctx, "outage", 8).await?;
    link.hook().cut(true);
    for l in &held {
        let reason = tokio::time::timeout(ttl + TOLERANCE, l.lost())
            .await
            .map_err(|_| CaseError(format!("lease {:?} never fired lost", l.key())))?;
        // Judged by when it fired, not by when this task got to run again
        // after (a starved test task sees it late).
        let fired = l
            .lost_at()
            .ok_or_else(|| CaseError("lost resolved with no firing instant".into()))?;
        let valid_until = l.lease().valid_until();
        check!(
            fired < valid_until,
            "lost fired {:?} after local validity of {:?} (seen {:?} after)",
            fired - valid_until,
            l.key(),
            Instant::now().saturating_duration_since(valid_until)
        );
        check!(
            matches!(reason, LostReason::Expired(_)),
            "reason {reason:?}"
        );
    }
    check!(
        session.stats().lost == held.len() as u64,
        "lost count {}",
        session.stats().lost
    );
    // The store agrees: the keys are taken over once they expire (or, where
    // a store session keeps them, once that session is closed or expires).
    let first = held[0].key();
    let first_token = held[0].token();
    drop(held);
    session.close().await;
    let Some(next) = acquire(
        &other,
        &first,
        AcquireOptions::ttl(ttl).wait(expiry_bound(&*other, ttl) + session_bound(&*other)),
    )
    .await?
    else {
        return Err(CaseError(
            "the cut-off session's lease was not taken over".into(),
        ));
    };
    check!(next.token() > first_token, "takeover token did not grow");
    link.hook().cut(false);
    other.release(&next).await?;
    Ok(())
}

pub(super) async fn session_release_keeps_the_others(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let other = ctx.provider().await?;
    let ttl = renewing_ttl(&*p);
    let session = open(&p, ttl).await?;
    let mut held = take(&session, &ctx, "release", 4).await?;
    let released = held.remove(1);
    let key = released.key();
    released.release().await?;
    let next = must_acquire(&*other, &key, ttl).await?;
    other.release(&next).await?;
    check!(session.stats().held == 3, "held {}", session.stats().held);
    sleep(ttl * 2).await;
    for l in &held {
        check!(
            !l.is_lost(),
            "lease {:?} lost after a neighbour's release: {:?}",
            l.key(),
            l.lost_reason()
        );
        must_be_held(&*other, &l.key(), ttl).await?;
    }
    session.close().await;
    Ok(())
}

/// How long a store-side session (ZooKeeper's) may keep a cut-off holder's
/// nodes after its lease's TTL: the declared holder session, if any.
fn session_bound(p: &dyn LeaseProvider) -> Duration {
    p.capabilities().holder_session.unwrap_or(Duration::ZERO)
}

//! C10, C11: local validity, the guard and the minimum hold.

use super::*;

pub(super) async fn guard_renews_past_several_ttls(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let other = ctx.provider().await?;
    let key = ctx.key("guard")?;
    let ttl = renewing_ttl(&*p);
    let lease = must_acquire(&*p, &key, ttl).await?;
    let token = lease.token();
    let guard = LeaseGuard::new(Arc::clone(&p), lease);
    let until = Instant::now() + ttl * 3 + p.capabilities().expiry_slack;
    while Instant::now() < until {
        sleep(ttl / 2).await;
        check!(
            !guard.is_lost(),
            "guard lost its lease: {:?}",
            guard.lost_reason()
        );
        must_be_held(&*other, &key, ttl).await?;
    }
    check!(guard.token() == token, "renewal changed the token");
    check!(
        other.inspect(&key).await?.map(|i| i.token) == Some(token),
        "another holder appeared"
    );
    guard.release().await?;
    check!(
        other.inspect(&key).await?.is_none(),
        "guard release left the key held"
    );
    Ok(())
}

pub(super) async fn guard_fires_lost_signal_by_local_validity(ctx: Ctx) -> CaseResult {
    let link = Partition::new(ctx.provider().await?);
    let other = ctx.provider().await?;
    let key = ctx.key("cut-off")?;
    let ttl = short_ttl(&*other);
    let lease = must_acquire(&*link, &key, ttl).await?;
    let valid_until = lease.valid_until();
    // A margin of half the TTL: the guard's timer may wake late on a loaded
    // machine (the default margin, a tenth, is 50 ms here); firing at or
    // after validity, or never, still fails.
    let guard = LeaseGuard::with_config(
        link.clone(),
        lease.clone(),
        GuardConfig::default().lost_margin(ttl / 2),
    );
    link.hook().cut(true);
    let reason = tokio::time::timeout(ttl + TOLERANCE, guard.lost())
        .await
        .map_err(|_| CaseError("the guard never fired its lost signal".into()))?;
    // The guard fires ahead of validity by its margin, never at or after it.
    // Judged by when it fired, not by when this task got to run again after.
    let fired = guard
        .lost_at()
        .ok_or_else(|| CaseError("lost resolved with no firing instant".into()))?;
    check!(
        fired < valid_until,
        "lost fired {:?} after local validity (seen {:?} after)",
        fired - valid_until,
        Instant::now().saturating_duration_since(valid_until)
    );
    check!(
        matches!(reason, LostReason::Expired(_)),
        "reason {reason:?}"
    );
    // The store agrees: another holder takes over, with a larger token.
    let Some(next) = acquire(
        &other,
        &key,
        AcquireOptions::ttl(ttl).wait(expiry_bound(&*other, ttl)),
    )
    .await?
    else {
        return Err(CaseError(
            "the cut-off holder's lease was not taken over".into(),
        ));
    };
    check!(next.token() > lease.token(), "takeover token did not grow");
    link.hook().cut(false);
    match guard.release().await {
        Err(LeaseError::NotHeld { .. }) => {}
        other => {
            return Err(CaseError(format!(
                "the cut-off holder's release gave {other:?}"
            )));
        }
    }
    check!(
        other.inspect(&key).await?.map(|i| i.token) == Some(next.token()),
        "stale guard touched the new holder"
    );
    other.release(&next).await?;
    Ok(())
}

pub(super) async fn min_hold_keeps_key_after_a_short_job(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let other = ctx.provider().await?;
    let key = ctx.key("min-hold")?;
    let ttl = renewing_ttl(&*p);
    let min_hold = ttl * 3;
    let started = Instant::now();
    let options = RunOptions::default().min_hold(min_hold);
    let outcome = run_with_lease(Arc::clone(&p), &key, ttl, options, |_| async {}).await?;
    let RunOutcome::Completed { token, .. } = outcome else {
        return Err(CaseError(format!("the job did not complete: {outcome:?}")));
    };
    // The holder process goes away (a cron run that ends): session-bound
    // leases must not go with it before the hold ends.
    drop(p);
    let hold_until = started + min_hold;
    while Instant::now() + Duration::from_millis(100) < hold_until {
        if let TryAcquire::Acquired(l) = other.try_acquire(&key, ttl).await? {
            return Err(CaseError(format!(
                "another holder got the key {:?} before the minimum hold of {min_hold:?} ended (token {})",
                hold_until - Instant::now(),
                l.token()
            )));
        }
        sleep(Duration::from_millis(100)).await;
    }
    let wait = expiry_bound(&*other, ttl) * 2;
    let Some(next) = acquire(&other, &key, AcquireOptions::ttl(ttl).wait(wait)).await? else {
        return Err(CaseError(format!(
            "the key stayed held {wait:?} past the minimum hold"
        )));
    };
    check!(next.token() > token, "token did not grow after the hold");
    other.release(&next).await?;
    Ok(())
}

pub(super) async fn local_validity_never_exceeds_sent_plus_ttl(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let key = ctx.key("validity")?;
    let ttl = long_ttl(&*p);
    let before = Instant::now();
    let l = must_acquire(&*p, &key, ttl).await?;
    let after = Instant::now();
    check!(
        l.sent_at() >= before && l.sent_at() <= after,
        "sent_at is outside the call"
    );
    check!(
        l.valid_until() <= l.sent_at() + l.ttl(),
        "valid_until after sent + TTL"
    );
    check!(
        l.valid_until() < after + l.ttl(),
        "valid_until after return + TTL"
    );
    check!(l.is_valid(), "a fresh lease is not valid");
    let before = Instant::now();
    let e = p.extend(&l, ttl).await?;
    check!(
        e.sent_at() >= before && e.valid_until() <= e.sent_at() + e.ttl(),
        "extend validity beyond sent + TTL"
    );
    // The store's expiry is not before local validity.
    let asked = Instant::now();
    let info = p
        .inspect(&key)
        .await?
        .ok_or_else(|| CaseError("held key shows no holder".into()))?;
    let gran = p.capabilities().ttl_granularity;
    check!(
        asked + info.remaining + gran >= e.valid_until(),
        "the store expires the lease before local validity"
    );
    p.release(&e).await?;
    Ok(())
}

//! C5, C6, C7: owners, extend and release.

use super::*;

pub(super) async fn release_frees_key_at_once(ctx: Ctx) -> CaseResult {
    let p1 = ctx.provider().await?;
    let p2 = ctx.provider().await?;
    let key = ctx.key("release")?;
    let ttl = long_ttl(&*p1);
    let a = must_acquire(&*p1, &key, ttl).await?;
    p1.release(&a).await?;
    let b = must_acquire(&*p2, &key, ttl).await?;
    p2.release(&b).await?;
    Ok(())
}

pub(super) async fn double_release_is_not_held(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let key = ctx.key("double")?;
    let a = must_acquire(&*p, &key, long_ttl(&*p)).await?;
    p.release(&a).await?;
    match p.release(&a).await {
        Err(LeaseError::NotHeld { key: k, token }) => {
            check!(
                k == key && token == a.token(),
                "NotHeld names {k:?}/{token}"
            );
            Ok(())
        }
        other => Err(CaseError(format!(
            "second release gave {other:?}, expected NotHeld"
        ))),
    }
}

pub(super) async fn release_of_expired_lease_is_not_held(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let other = ctx.provider().await?;
    let key = ctx.key("expired-release")?;
    let ttl = short_ttl(&*p);
    let lease = must_acquire(&*p, &key, ttl).await?;
    sleep_until(lease.sent_at() + expiry_bound(&*p, ttl)).await;
    match p.release(&lease).await {
        Err(LeaseError::NotHeld { .. }) => {}
        other => {
            return Err(CaseError(format!(
                "release of an expired lease gave {other:?}, expected NotHeld"
            )));
        }
    }
    let next = must_acquire(&*other, &key, ttl).await?;
    check!(
        next.token() > lease.token(),
        "token did not grow after expiry"
    );
    other.release(&next).await?;
    Ok(())
}

pub(super) async fn stale_release_after_takeover_keeps_new_holder(ctx: Ctx) -> CaseResult {
    let key = ctx.key("stale-release")?;
    let t = takeover(&ctx, &key).await?;
    match t.old_provider.release(&t.old).await {
        Err(LeaseError::NotHeld { .. }) => {}
        other => {
            return Err(CaseError(format!(
                "stale release gave {other:?}, expected NotHeld"
            )));
        }
    }
    let info = t.new_provider.inspect(&key).await?;
    check!(
        info.as_ref().map(|i| i.token) == Some(t.new.token()),
        "after a stale release the key shows {info:?}"
    );
    must_be_held(&*t.old_provider, &key, short_ttl(&*t.old_provider)).await?;
    t.new_provider.release(&t.new).await?;
    Ok(())
}

pub(super) async fn forged_owner_touches_nothing(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let key = ctx.key("forged-owner")?;
    let ttl = long_ttl(&*p);
    let mut l = must_acquire(&*p, &key, ttl).await?;
    // A token of two digits or more, so that one with its leading digits
    // (a prefix of the stored owner-and-token, short of the separator) can
    // be forged too.
    while l.token().get() < 10 {
        p.release(&l).await?;
        l = must_acquire(&*p, &key, ttl).await?;
    }
    let rebuilt_with = |owner: lease_api::backend::OwnerId, token: lease_api::FencingToken| {
        lease_api::Lease::new(key.clone(), token, owner, ttl, Instant::now())
            .with_handle(l.handle())
            .with_holder(Arc::from("somebody else@elsewhere:1"))
    };
    let rebuilt = |owner: lease_api::backend::OwnerId| rebuilt_with(owner, l.token());
    // Another owner with the holder's token, and the holder's owner with
    // another token, or with one whose digits start the holder's token (a
    // store that compares a prefix must stop at the separator): every
    // mutating step compares both (C5).
    let wrong_token = lease_api::FencingToken(l.token().get().wrapping_add(1));
    for (what, forged) in [
        (
            "another owner",
            rebuilt(lease_api::backend::OwnerId::random()),
        ),
        ("another token", rebuilt_with(l.owner(), wrong_token)),
        (
            "a token that is a prefix of the holder's",
            rebuilt_with(l.owner(), lease_api::FencingToken(l.token().get() / 10)),
        ),
    ] {
        match p.extend(&forged, ttl).await {
            Err(LeaseError::Lost { .. }) => {}
            other => return Err(CaseError(format!("extend with {what}: {other:?}"))),
        }
        match p.release(&forged).await {
            Err(LeaseError::NotHeld { .. }) => {}
            other => return Err(CaseError(format!("release with {what}: {other:?}"))),
        }
    }
    let info = p.inspect(&key).await?;
    check!(
        info.as_ref().map(|i| i.token) == Some(l.token()),
        "after the forged calls inspect shows {info:?}"
    );
    // What `lease release` does in another process: the owner and token it was
    // given, with its own holder label.
    p.release(&rebuilt(l.owner())).await?;
    check!(
        p.inspect(&key).await?.is_none(),
        "the rebuilt lease's release left the key held"
    );
    Ok(())
}

pub(super) async fn extend_pushes_expiry_past_original_ttl(ctx: Ctx) -> CaseResult {
    let p1 = ctx.provider().await?;
    let p2 = ctx.provider().await?;
    let key = ctx.key("extend")?;
    // Not the short TTL: at 500 ms a loaded machine's stall between the
    // acquire and the extend could run the lease out first.
    let ttl = renewing_ttl(&*p1);
    let a = must_acquire(&*p1, &key, ttl).await?;
    let acquired = Instant::now();
    // Well inside the TTL (the lease was stamped before `acquired`): an
    // extend that lands after it rightly finds the lease gone.
    sleep(ttl / 4).await;
    let longer = p1.capabilities().practical_ttl(ttl * 3);
    let b = p1.extend(&a, longer).await?;
    check!(
        b.ttl() == longer,
        "extend granted {:?}, asked {longer:?}",
        b.ttl()
    );
    check!(
        b.valid_until() > a.valid_until(),
        "extend did not move local validity"
    );
    // Past the original expiry (plus slack), well before the extended one.
    sleep_until(acquired + ttl + p1.capabilities().expiry_slack + Duration::from_millis(200)).await;
    must_be_held(&*p2, &key, ttl).await?;
    let info = p2.inspect(&key).await?;
    check!(
        info.map(|i| i.token) == Some(a.token()),
        "the extended lease is not the holder"
    );
    p1.release(&b).await?;
    Ok(())
}

pub(super) async fn extend_after_expiry_fails(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let key = ctx.key("late-extend")?;
    let ttl = short_ttl(&*p);
    let a = must_acquire(&*p, &key, ttl).await?;
    let acquired = Instant::now();
    // Wait until the store must have expired it; then make sure it did.
    let deadline = acquired + expiry_bound(&*p, ttl);
    sleep_until(acquired + ttl + p.capabilities().expiry_slack).await;
    while p.inspect(&key).await?.is_some() {
        check!(
            Instant::now() < deadline,
            "the lease did not expire within TTL + slack"
        );
        sleep(Duration::from_millis(20)).await;
    }
    match p.extend(&a, ttl).await {
        Err(LeaseError::Lost { key: k, token }) => {
            check!(k == key && token == a.token(), "Lost names {k:?}/{token}");
        }
        other => {
            return Err(CaseError(format!(
                "extend after expiry gave {other:?}, expected Lost"
            )));
        }
    }
    check!(
        p.inspect(&key).await?.is_none(),
        "a failed extend brought the lease back"
    );
    Ok(())
}

pub(super) async fn stale_extend_after_takeover_fails(ctx: Ctx) -> CaseResult {
    let key = ctx.key("stale-extend")?;
    let t = takeover(&ctx, &key).await?;
    match t
        .old_provider
        .extend(&t.old, short_ttl(&*t.old_provider))
        .await
    {
        Err(LeaseError::Lost { .. }) => {}
        other => {
            return Err(CaseError(format!(
                "stale extend gave {other:?}, expected Lost"
            )));
        }
    }
    let info = t.new_provider.inspect(&key).await?;
    check!(
        info.map(|i| i.token) == Some(t.new.token()),
        "the stale extend touched the new holder"
    );
    let renewed = t
        .new_provider
        .extend(&t.new, short_ttl(&*t.new_provider))
        .await?;
    t.new_provider.release(&renewed).await?;
    Ok(())
}

pub(super) async fn extend_keeps_token(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let key = ctx.key("extend-token")?;
    let ttl = long_ttl(&*p);
    let a = must_acquire(&*p, &key, ttl).await?;
    let b = p.extend(&a, ttl).await?;
    let c = p.extend(&b, ttl).await?;
    check!(
        a.token() == b.token() && b.token() == c.token(),
        "tokens {} {} {}",
        a.token(),
        b.token(),
        c.token()
    );
    check!(a.owner() == c.owner(), "extend changed the owner");
    // The older copy of the same lease is still this owner's lease.
    let d = p.extend(&a, ttl).await?;
    p.release(&d).await?;
    Ok(())
}

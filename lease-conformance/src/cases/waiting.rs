//! C9: waiting for a held key.

use super::*;

pub(super) async fn waiter_wakes_promptly_on_release(ctx: Ctx) -> CaseResult {
    let holder = ctx.provider().await?;
    let waiter = ctx.provider().await?;
    let key = ctx.key("handoff")?;
    let ttl = long_ttl(&*holder);
    let held = must_acquire(&*holder, &key, ttl).await?;
    let (k, w) = (key.clone(), Arc::clone(&waiter));
    let task =
        tokio::spawn(async move { acquire(&w, &k, AcquireOptions::ttl(ttl).wait(ttl)).await });
    // Give the waiter time to block; if it was slower, it simply finds the key free.
    sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    holder.release(&held).await?;
    let got = task
        .await
        .map_err(|e| CaseError(format!("waiter task failed: {e}")))??;
    let took = released.elapsed();
    let Some(l) = got else {
        return Err(CaseError(
            "the waiter gave up although the key was released".into(),
        ));
    };
    let bound = (ttl / 4).min(Duration::from_secs(3));
    check!(
        took < bound,
        "the waiter took {took:?} after release (holder TTL {ttl:?})"
    );
    check!(l.token() > held.token(), "token did not grow on handoff");
    waiter.release(&l).await?;
    Ok(())
}

pub(super) async fn waiter_times_out_while_held(ctx: Ctx) -> CaseResult {
    let holder = ctx.provider().await?;
    let waiter = ctx.provider().await?;
    let key = ctx.key("busy")?;
    let ttl = long_ttl(&*holder);
    let held = must_acquire(&*holder, &key, ttl).await?;
    let wait = Duration::from_millis(700);
    let started = Instant::now();
    let got = acquire(&waiter, &key, AcquireOptions::ttl(ttl).wait(wait)).await?;
    let took = started.elapsed();
    check!(got.is_none(), "the waiter acquired a held key");
    check!(
        took >= wait,
        "gave up after {took:?}, before its wait of {wait:?}"
    );
    check!(
        took < wait + TOLERANCE,
        "gave up only after {took:?} (wait {wait:?})"
    );
    holder.release(&held).await?;
    Ok(())
}

pub(super) async fn waiter_gets_key_after_crashed_holder_expires(ctx: Ctx) -> CaseResult {
    let crashed = ctx.provider().await?;
    let waiter = ctx.provider().await?;
    let key = ctx.key("crash")?;
    let ttl = short_ttl(&*crashed);
    let sent = Instant::now();
    let lease = must_acquire(&*crashed, &key, ttl).await?;
    // The holder crashes: no release, no renewal.
    drop(lease);
    drop(crashed);
    let wait = expiry_bound(&*waiter, ttl) * 2;
    let got = acquire(&waiter, &key, AcquireOptions::ttl(ttl).wait(wait)).await?;
    let at = Instant::now();
    let Some(l) = got else {
        return Err(CaseError(format!(
            "a crashed holder's lease did not free the key within {wait:?}"
        )));
    };
    // Where leases are bound to the holder's session (ZooKeeper), the store may
    // free a crashed holder's key as soon as its session ends, before the TTL.
    if waiter.capabilities().holder_session.is_none() {
        check!(
            at >= sent + ttl,
            "the waiter got the key {:?} before the TTL ended",
            sent + ttl - at
        );
    }
    waiter.release(&l).await?;
    Ok(())
}

pub(super) async fn dropped_wait_leaks_no_lease(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let checker = ctx.provider().await?;
    let ttl = long_ttl(&*p);
    // Drop waiting acquires on a held key, then release: nothing may be left.
    let key = ctx.key("held")?;
    let held = must_acquire(&*p, &key, ttl).await?;
    for _ in 0..5 {
        let _ = tokio::time::timeout(
            Duration::from_millis(30),
            acquire(&p, &key, AcquireOptions::ttl(ttl).wait(ttl)),
        )
        .await;
    }
    p.release(&held).await?;
    // Drop acquires of free keys at many points of their flight.
    let mut keys = Vec::new();
    for i in 0..24u64 {
        let k = ctx.key(&format!("free-{i}"))?;
        let cut = Duration::from_micros(i * 250);
        if let Ok(Ok(Some(l))) =
            tokio::time::timeout(cut, acquire(&p, &k, AcquireOptions::ttl(ttl))).await
        {
            p.release(&l).await?;
        }
        keys.push(k);
    }
    keys.push(key);
    // A leak would hold a key for the long TTL; a released one is free promptly.
    for k in &keys {
        let Some(l) = acquire(
            &checker,
            k,
            AcquireOptions::ttl(ttl).wait(Duration::from_secs(5)),
        )
        .await?
        else {
            return Err(CaseError(format!(
                "a dropped acquire leaked a lease on {k:?}"
            )));
        };
        checker.release(&l).await?;
    }
    Ok(())
}

pub(super) async fn waiter_gets_free_key_when_watch_fails(ctx: Ctx) -> CaseResult {
    let waiter = Instrumented::new(ctx.provider().await?);
    waiter.hook().fail_watch(true);
    let w: Arc<dyn LeaseProvider> = waiter.clone();
    let holder = ctx.provider().await?;
    let key = ctx.key("no-watch")?;
    let ttl = short_ttl(&*holder);
    let wait = expiry_bound(&*holder, ttl) * 2;
    // Connected first: the bound is on the acquire, not on a cold start.
    w.inspect(&key).await?;
    let started = Instant::now();
    let Some(free) = acquire(&w, &key, AcquireOptions::ttl(ttl).wait(wait)).await? else {
        return Err(CaseError(
            "a free key was not acquired while watching fails".into(),
        ));
    };
    check!(
        started.elapsed() < TOLERANCE,
        "a free key took {:?} while watching fails",
        started.elapsed()
    );
    w.release(&free).await?;
    // Held: the waiter falls back to the holder's TTL.
    let held = must_acquire(&*holder, &key, ttl).await?;
    let Some(next) = acquire(&w, &key, AcquireOptions::ttl(ttl).wait(wait)).await? else {
        return Err(CaseError(format!(
            "the waiter did not get the key within {wait:?} after the holder's TTL {ttl:?} while watching fails"
        )));
    };
    check!(next.token() > held.token(), "token did not grow");
    w.release(&next).await?;
    Ok(())
}

pub(super) async fn waiter_store_calls_are_bounded(ctx: Ctx) -> CaseResult {
    let holder = ctx.provider().await?;
    let waiter = Instrumented::new(ctx.provider().await?);
    let w: Arc<dyn LeaseProvider> = waiter.clone();
    // A key held for long: a short wait makes a handful of calls, not a poll loop.
    let key = ctx.key("long-held")?;
    let long = long_ttl(&*holder);
    let held = must_acquire(&*holder, &key, long).await?;
    let got = acquire(
        &w,
        &key,
        AcquireOptions::ttl(long).wait(Duration::from_millis(1500)),
    )
    .await?;
    check!(got.is_none(), "the waiter acquired a held key");
    let calls = waiter.hook().try_acquires();
    check!(
        calls <= 4,
        "{calls} try_acquire calls in a 1.5 s wait on a key held for {long:?}"
    );
    holder.release(&held).await?;
    // A holder that stops renewing: the waiter waits through the holder's last
    // second (where stores that count whole seconds report 0) without spinning.
    let key = ctx.key("expiring")?;
    let ttl = holder
        .capabilities()
        .practical_ttl(Duration::from_millis(1500));
    let _crashed = must_acquire(&*holder, &key, ttl).await?;
    let before = waiter.hook().try_acquires();
    let started = Instant::now();
    let Some(l) = acquire(
        &w,
        &key,
        AcquireOptions::ttl(ttl).wait(expiry_bound(&*holder, ttl) * 2),
    )
    .await?
    else {
        return Err(CaseError("the waiter did not get an expired key".into()));
    };
    let calls = waiter.hook().try_acquires() - before;
    let secs = started.elapsed().as_secs_f64();
    let bound = 6 + (secs * 4.0) as u64;
    check!(
        calls <= bound,
        "{calls} try_acquire calls in {secs:.2} s waiting for a lease of {ttl:?} to expire (bound {bound})"
    );
    w.release(&l).await?;
    Ok(())
}

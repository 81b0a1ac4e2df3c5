//! C2, C3, C4: acquiring, TTLs and expiry.

use super::*;

pub(super) async fn acquire_free_key(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let key = ctx.key("free")?;
    let ttl = short_ttl(&*p);
    let a = must_acquire(&*p, &key, ttl).await?;
    check!(a.key() == &key, "lease key {:?} is not {:?}", a.key(), key);
    check!(
        a.ttl() == p.capabilities().grant_ttl(ttl)?,
        "granted TTL {:?} for {ttl:?}",
        a.ttl()
    );
    check!(
        a.token().get() > 0,
        "token must be positive, got {}",
        a.token()
    );
    p.release(&a).await?;
    let b = must_acquire(&*p, &key, ttl).await?;
    check!(
        a.owner() != b.owner(),
        "two leases share owner id {}",
        a.owner()
    );
    p.release(&b).await?;
    Ok(())
}

pub(super) async fn held_key_refuses_second_acquirer(ctx: Ctx) -> CaseResult {
    let p1 = ctx.provider().await?;
    let p2 = ctx.provider().await?;
    let key = ctx.key("held")?;
    let ttl = long_ttl(&*p1);
    let lease = must_acquire(&*p1, &key, ttl).await?;
    match p2.try_acquire(&key, ttl).await? {
        TryAcquire::Held { remaining } => {
            if let Some(r) = remaining {
                check!(
                    r <= ttl + p1.capabilities().ttl_granularity,
                    "held remaining {r:?} exceeds TTL {ttl:?}"
                );
            }
        }
        TryAcquire::Acquired(l) => {
            return Err(CaseError(format!(
                "second provider got token {}",
                l.token()
            )));
        }
    }
    // Leases are not reentrant: the same provider is refused too.
    must_be_held(&*p1, &key, ttl).await?;
    p1.release(&lease).await?;
    Ok(())
}

pub(super) async fn concurrent_acquirers_exactly_one_wins(ctx: Ctx) -> CaseResult {
    const CONTENDERS: usize = 16;
    const ROUNDS: usize = 20;
    let providers: Vec<Arc<dyn LeaseProvider>> = join_all((0..CONTENDERS).map(|_| ctx.provider()))
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let ttl = long_ttl(&*providers[0]);
    for round in 0..ROUNDS {
        let key = ctx.key(&format!("round-{round}"))?;
        let barrier = Arc::new(Barrier::new(CONTENDERS));
        let tasks = providers.iter().map(|p| {
            let (p, key, barrier) = (Arc::clone(p), key.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                p.try_acquire(&key, ttl).await.map(|o| (p, o))
            })
        });
        let mut winners = Vec::new();
        for t in join_all(tasks).await {
            let (p, outcome) =
                t.map_err(|e| CaseError(format!("contender task failed: {e}")))??;
            if let TryAcquire::Acquired(l) = outcome {
                winners.push((p, l));
            }
        }
        check!(
            winners.len() == 1,
            "round {round}: {} of {CONTENDERS} contenders won",
            winners.len()
        );
        for (p, l) in winners {
            p.release(&l).await?;
        }
    }
    Ok(())
}

pub(super) async fn concurrent_takeover_of_expired_lease_has_one_winner(ctx: Ctx) -> CaseResult {
    const CONTENDERS: usize = 16;
    let mut providers = Vec::with_capacity(CONTENDERS);
    for _ in 0..CONTENDERS {
        providers.push(ctx.provider().await?);
    }
    let first = ctx.provider().await?;
    let ttl = short_ttl(&*first);
    let long = long_ttl(&*first);
    for round in 0..3 {
        let key = ctx.key(&format!("takeover-{round}"))?;
        let old = must_acquire(&*first, &key, ttl).await?;
        // Past the TTL and the declared slack, every contender may take it over.
        sleep_until(old.sent_at() + expiry_bound(&*first, ttl)).await;
        let barrier = Arc::new(Barrier::new(CONTENDERS));
        let tries = providers.iter().map(|p| {
            let (p, key, barrier) = (Arc::clone(p), key.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                p.try_acquire(&key, long).await
            })
        });
        let mut winners = Vec::new();
        for r in join_all(tries).await {
            let outcome = r.map_err(|e| CaseError(format!("contender panicked: {e}")))??;
            if let TryAcquire::Acquired(l) = outcome {
                winners.push(l);
            }
        }
        check!(
            winners.len() == 1,
            "round {round}: {} contenders took over one expired lease (tokens {:?})",
            winners.len(),
            winners.iter().map(Lease::token).collect::<Vec<_>>()
        );
        check!(
            winners[0].token() > old.token(),
            "takeover token did not grow"
        );
        // Any provider of the store may release a lease it is handed.
        first.release(&winners[0]).await?;
    }
    Ok(())
}

pub(super) async fn expired_lease_is_taken_over_in_time(ctx: Ctx) -> CaseResult {
    let p1 = ctx.provider().await?;
    let p2 = ctx.provider().await?;
    let key = ctx.key("expiry")?;
    // Warm both providers up (connections, table creation) so that the timed
    // part measures the store, not first-use set-up.
    p1.inspect(&key).await?;
    p2.inspect(&key).await?;
    // The looks below judge only when one completes within the TTL: so the
    // TTL is at least eight times what a look at a held key takes now (a
    // loaded machine, or a backend whose try opens a session, gets a longer
    // one; what is checked stays the same).
    let probe = ctx.key("expiry-probe")?;
    let held = must_acquire(&*p1, &probe, short_ttl(&*p1)).await?;
    let started = Instant::now();
    let look = p2.try_acquire(&probe, short_ttl(&*p1)).await;
    let one_look = started.elapsed();
    p1.release(&held).await?;
    check!(
        matches!(look, Ok(TryAcquire::Held { .. })),
        "a held key was not refused: {look:?}"
    );
    let ttl = p1
        .capabilities()
        .practical_ttl(Duration::from_millis(500).max(one_look * 8));
    let sent = Instant::now();
    let a = must_acquire(&*p1, &key, ttl).await?;
    let acked = Instant::now();
    // Before the TTL (measured from when we sent the acquire) it must be held.
    // An attempt is conclusive only if it completed before sent + TTL; on a
    // loaded machine a late attempt may legitimately find it expired.
    let mut conclusive = 0;
    let mut early_takeover = None;
    // Three looks, the first early, so a loaded machine still gets one in.
    for at in [ttl / 4, ttl / 2, ttl - ttl / 4] {
        sleep_until(sent + at).await;
        let outcome = p2.try_acquire(&key, ttl).await?;
        let done = Instant::now();
        if let TryAcquire::Acquired(l) = outcome {
            check!(
                done >= sent + ttl,
                "taken over {:?} before the TTL ended (token {})",
                sent + ttl - done,
                l.token()
            );
            early_takeover = Some(l);
            break;
        }
        if done < sent + ttl {
            conclusive += 1;
        }
    }
    check!(
        conclusive > 0,
        "no check completed before the TTL ended; the machine is too slow to judge"
    );
    // After TTL + slack another acquirer gets it.
    let bound = acked + expiry_bound(&*p1, ttl);
    let b = match early_takeover {
        Some(l) => l,
        None => {
            let wait = bound.saturating_duration_since(Instant::now());
            let Some(b) = acquire(&p2, &key, AcquireOptions::ttl(ttl).wait(wait)).await? else {
                return Err(CaseError(format!(
                    "not taken over within TTL {ttl:?} + slack + tolerance"
                )));
            };
            b
        }
    };
    check!(
        Instant::now() <= bound,
        "taken over only {:?} after the bound",
        Instant::now() - bound
    );
    check!(b.token() > a.token(), "takeover token did not grow");
    p2.release(&b).await?;
    Ok(())
}

pub(super) async fn invalid_ttls_are_rejected(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let caps = p.capabilities().clone();
    let key = ctx.key("ttl")?;
    let mut bad = vec![Duration::ZERO, caps.max_ttl + Duration::from_secs(1)];
    if caps.min_ttl > Duration::from_millis(1) {
        bad.push(caps.min_ttl - Duration::from_millis(1));
    }
    for ttl in &bad {
        match p.try_acquire(&key, *ttl).await {
            Err(LeaseError::InvalidTtl { ttl: t, .. }) => {
                check!(t == *ttl, "error names {t:?}, not {ttl:?}")
            }
            other => {
                return Err(CaseError(format!(
                    "try_acquire with TTL {ttl:?} gave {other:?}"
                )));
            }
        }
        check!(
            p.inspect(&key).await?.is_none(),
            "an invalid TTL left a lease behind"
        );
    }
    let l = must_acquire(&*p, &key, long_ttl(&*p)).await?;
    for ttl in &bad {
        match p.extend(&l, *ttl).await {
            Err(LeaseError::InvalidTtl { .. }) => {}
            other => return Err(CaseError(format!("extend with TTL {ttl:?} gave {other:?}"))),
        }
    }
    check!(
        p.inspect(&key).await?.map(|i| i.token) == Some(l.token()),
        "an invalid extend changed the lease"
    );
    p.release(&l).await?;
    Ok(())
}

pub(super) async fn granted_ttl_follows_capabilities(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let caps = p.capabilities().clone();
    check!(
        caps.min_ttl > Duration::ZERO && caps.min_ttl <= caps.max_ttl,
        "bad declared TTL range"
    );
    check!(
        caps.ttl_granularity > Duration::ZERO,
        "declared granularity is zero"
    );
    let key = ctx.key("granted")?;
    // An odd TTL a little above a practical one, so rounding shows, and long
    // enough that the lease outlives the extend below even on a slow machine.
    let odd = caps.practical_ttl(Duration::from_millis(400))
        + caps.ttl_granularity / 2
        + Duration::from_micros(300);
    let expected = caps.grant_ttl(odd)?;
    check!(expected >= odd, "grant_ttl rounded down");
    check!(
        expected.as_nanos() % caps.ttl_granularity.as_nanos() == 0
            || caps.ttl_granularity.as_nanos() <= 1,
        "grant_ttl result {expected:?} is not a multiple of {:?}",
        caps.ttl_granularity
    );
    let l = must_acquire(&*p, &key, odd).await?;
    check!(
        l.ttl() == expected,
        "granted {:?} for {odd:?}, capabilities say {expected:?}",
        l.ttl()
    );
    let e = p.extend(&l, odd).await?;
    check!(
        e.ttl() == expected,
        "extend granted {:?}, capabilities say {expected:?}",
        e.ttl()
    );
    let min = must_acquire(&*p, &ctx.key("min")?, caps.min_ttl).await?;
    check!(
        min.ttl() >= caps.min_ttl,
        "minimum TTL granted as {:?}",
        min.ttl()
    );
    // These leases may be as short as the minimum TTL and already gone.
    for l in [&e, &min] {
        match p.release(l).await {
            Ok(()) | Err(LeaseError::NotHeld { .. }) => {}
            Err(other) => return Err(other.into()),
        }
    }
    Ok(())
}

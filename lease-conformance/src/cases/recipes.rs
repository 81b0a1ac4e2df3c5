//! The coordination recipes built on the contract: semaphores.

use std::sync::atomic::{AtomicUsize, Ordering};

use lease_api::backend::Ticket;
use lease_api::recipes::Semaphore;

use super::*;

/// 32 contenders on 4 providers share a 4-permit semaphore, two holds each:
/// never more than 4 hold a permit at once, every contender gets its turns,
/// and each permit's tokens grow.
pub(super) async fn semaphore_never_exceeds_permits(ctx: Ctx) -> CaseResult {
    const PERMITS: usize = 4;
    const CONTENDERS: usize = 32;
    const ROUNDS: usize = 2;
    let mut providers = Vec::new();
    for _ in 0..4 {
        providers.push(ctx.provider().await?);
    }
    let name = ctx.key("semaphore")?;
    let ttl = long_ttl(&*providers[0]);
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(vec![Vec::new(); PERMITS]));
    let tasks = (0..CONTENDERS).map(|i| {
        let sem = Semaphore::new(
            Arc::clone(&providers[i % providers.len()]),
            name.as_str(),
            PERMITS,
        );
        let (holding, most, tokens) =
            (Arc::clone(&holding), Arc::clone(&most), Arc::clone(&tokens));
        tokio::spawn(async move {
            let sem = sem?;
            for _ in 0..ROUNDS {
                let Some(permit) = sem.acquire(ttl, Duration::from_secs(60)).await? else {
                    return Err(CaseError("a contender waited 60 s for a permit".into()));
                };
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokens.lock().unwrap_or_else(|p| p.into_inner())[permit.slot()]
                    .push(permit.lease().token());
                sleep(Duration::from_millis(10)).await;
                holding.fetch_sub(1, Ordering::SeqCst);
                sem.release(&permit).await?;
            }
            Ok::<_, CaseError>(())
        })
    });
    for t in join_all(tasks).await {
        t.map_err(|e| CaseError(format!("contender panicked: {e}")))??;
    }
    let most = most.load(Ordering::SeqCst);
    check!(
        most <= PERMITS,
        "{most} contenders held a permit at once (permits: {PERMITS})"
    );
    check!(
        most >= 2,
        "never more than {most} holder at once: the permits were not shared out"
    );
    let tokens = tokens.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let total: usize = tokens.iter().map(Vec::len).sum();
    check!(
        total == CONTENDERS * ROUNDS,
        "{total} holds instead of {}",
        CONTENDERS * ROUNDS
    );
    for (slot, t) in tokens.iter().enumerate() {
        check!(
            t.windows(2).all(|w| w[0] < w[1]),
            "permit {slot}'s tokens did not grow in the order it was held: {t:?}"
        );
    }
    Ok(())
}

/// A holder of every permit crashes: a waiter gets a permit once a crashed
/// lease expires (or its session ends, where leases end with it), never
/// before the TTL otherwise.
pub(super) async fn semaphore_permit_of_crashed_holder_returns(ctx: Ctx) -> CaseResult {
    let crashed = ctx.provider().await?;
    let waiter = ctx.provider().await?;
    let name = ctx.key("crashed-permits")?;
    // Long enough that both permits still run when the third try ends (a
    // loaded machine's few round trips); short enough to wait out.
    let ttl = renewing_ttl(&*crashed);
    let sem = Semaphore::new(Arc::clone(&crashed), name.as_str(), 2)?;
    let sent = Instant::now();
    let a = sem.try_acquire(ttl).await?;
    let b = sem.try_acquire(ttl).await?;
    check!(
        a.is_some() && b.is_some(),
        "two free permits were not both taken"
    );
    check!(
        sem.try_acquire(ttl).await?.is_none(),
        "a third permit of two was handed out"
    );
    drop((a, b, sem));
    drop(crashed);
    let other = Semaphore::new(Arc::clone(&waiter), name.as_str(), 2)?;
    // Where leases end with the session, a session that was not closed
    // cleanly ends when the store times it out.
    let session = waiter.capabilities().holder_session.unwrap_or_default();
    let wait = expiry_bound(&*waiter, ttl) * 2 + session;
    let Some(permit) = other.acquire(long_ttl(&*waiter), wait).await? else {
        return Err(CaseError(format!(
            "no permit came back within {wait:?} after its holder crashed"
        )));
    };
    let at = Instant::now();
    if waiter.capabilities().holder_session.is_none() {
        check!(
            at >= sent + ttl,
            "a crashed holder's permit was handed out {:?} before its TTL ended",
            sent + ttl - at
        );
    }
    other.release(&permit).await?;
    Ok(())
}

/// Three campaigners on their own providers lead two terms each while a
/// follower observes: one leader at a time, every term seen by the follower
/// in token order, and each resignation hands over at once (by the store's
/// notification, not the 30 s TTL).
pub(super) async fn election_has_one_leader_and_followers_see_each_term(ctx: Ctx) -> CaseResult {
    use futures_util::StreamExt;
    use lease_api::recipes::Election;
    const CAMPAIGNERS: usize = 3;
    const TERMS: usize = 2;
    let name = ctx.key("election")?;
    let watcher = ctx.provider().await?;
    let ttl = long_ttl(&*watcher);
    let observer = Election::new(Arc::clone(&watcher), name.as_str(), ttl)?;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let observing = {
        let seen = Arc::clone(&seen);
        let stream = observer.observe();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(change) = stream.next().await {
                if let Ok(Some(leader)) = change {
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(leader.token);
                }
            }
        })
    };
    let leading = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    // (token, started, resigned) per term.
    let terms = Arc::new(std::sync::Mutex::new(Vec::new()));
    // Redlock's follower may skip a term (see below): there a term lasts
    // 400 ms; elsewhere it also lasts until the follower reported it (a
    // loaded machine may stall the follower longer than 400 ms, and every
    // term must still be seen: the follower only has to see it eventually).
    let every_term = watcher.capabilities().expiry_clock != lease_api::ExpiryClock::QuorumOfServers;
    let mut tasks = Vec::new();
    for _ in 0..CAMPAIGNERS {
        let election = Election::new(ctx.provider().await?, name.as_str(), ttl)?;
        let (leading, most, terms) = (Arc::clone(&leading), Arc::clone(&most), Arc::clone(&terms));
        let seen = Arc::clone(&seen);
        tasks.push(tokio::spawn(async move {
            for _ in 0..TERMS {
                let Some(term) = election.campaign_for(Duration::from_secs(60)).await? else {
                    return Err(CaseError("a campaigner waited 60 s to lead".into()));
                };
                let started = Instant::now();
                let now = leading.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                sleep(Duration::from_millis(400)).await;
                let give_up = Instant::now() + Duration::from_secs(10);
                while every_term
                    && Instant::now() < give_up
                    && !seen
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .contains(&term.token())
                {
                    sleep(Duration::from_millis(10)).await;
                }
                check!(!term.is_lost(), "a leader lost its term while renewing");
                leading.fetch_sub(1, Ordering::SeqCst);
                let token = term.token();
                let resigned = Instant::now();
                term.resign().await?;
                terms
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((token, started, resigned));
            }
            Ok::<_, CaseError>(())
        }));
    }
    for t in join_all(tasks).await {
        t.map_err(|e| CaseError(format!("campaigner panicked: {e}")))??;
    }
    // The follower looks once more after the last resignation.
    sleep(Duration::from_millis(300)).await;
    observing.abort();
    let most = most.load(Ordering::SeqCst);
    check!(most == 1, "{most} campaigners led at once");
    let mut terms = terms.lock().unwrap_or_else(|p| p.into_inner()).clone();
    terms.sort_by_key(|t| t.1);
    check!(
        terms.len() == CAMPAIGNERS * TERMS,
        "{} terms instead of {}",
        terms.len(),
        CAMPAIGNERS * TERMS
    );
    for pair in terms.windows(2) {
        let ((t0, _, resigned), (t1, started, _)) = (pair[0], pair[1]);
        check!(t1 > t0, "term tokens went from {t0} to {t1}");
        let gap = started.saturating_duration_since(resigned);
        check!(
            gap < HANDED_OVER_WITHIN,
            "the next term started {gap:?} after a resignation (TTL {ttl:?}): resigning did not wake the followers"
        );
    }
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let all: Vec<_> = terms.iter().map(|t| t.0).collect();
    if watcher.capabilities().expiry_clock == lease_api::ExpiryClock::QuorumOfServers {
        // Redlock's inspect reads every node, not one atomic state: under
        // contention it reports acquisitions still in flight (a majority
        // taken by an attempt that then gives up, counters not yet raised),
        // so what a follower sees is neither every term nor in order. Only
        // that it sees leaders is checked there; the rest of the case holds.
        check!(
            !seen.is_empty(),
            "the follower saw no leader; the campaigners led {all:?}"
        );
    } else {
        check!(
            seen == all,
            "the follower saw terms {seen:?}, the campaigners led {all:?}"
        );
    }
    Ok(())
}

/// Whether the provider declares fair waiting; one that does not must
/// refuse a fair acquire with a clear error (and offer no queue).
fn declares_fair(p: &dyn LeaseProvider) -> bool {
    p.capabilities().fair_waiting
}

async fn refuses_fair(p: &Arc<dyn LeaseProvider>, key: &LeaseKey) -> CaseResult {
    check!(
        p.wait_queue().is_none(),
        "{} offers a queue of waiters but does not declare fair_waiting",
        p.capabilities().backend
    );
    let options = AcquireOptions::ttl(long_ttl(&**p))
        .wait(Duration::from_secs(1))
        .fair();
    match acquire(p, key, options).await {
        Err(LeaseError::Config(_)) => Ok(()),
        other => Err(CaseError(format!(
            "a fair acquire on a backend without fair waiting answered {other:?}, not a Config error"
        ))),
    }
}

/// Waits until the queue of `key` shows a ticket at its end that is none
/// of `known` (the waiter just started has joined) and returns it.
async fn await_joined(
    p: &dyn LeaseProvider,
    key: &LeaseKey,
    known: &[u64],
) -> Result<u64, CaseError> {
    let Some(queue) = p.wait_queue() else {
        return Err(CaseError("no queue of waiters".into()));
    };
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let probe = queue.join(key, long_ttl(p), Ticket::random_mark()).await?;
        let place = queue.place(&probe).await;
        queue.leave(&probe).await?;
        if let lease_api::backend::Place::Behind { ahead, .. } = place?
            && !known.contains(&ahead.seq())
        {
            return Ok(ahead.seq());
        }
        check!(
            Instant::now() < give_up,
            "a fair waiter did not show in the queue within 20 s"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// Six fair waiters on their own providers queue up one after another
/// behind a holder: they get the key in the order they arrived, and each
/// holder's token is greater than the last.
pub(super) async fn fair_waiters_are_served_in_arrival_order(ctx: Ctx) -> CaseResult {
    const WAITERS: usize = 6;
    let holder = ctx.provider().await?;
    let key = ctx.key("fair-order")?;
    if !declares_fair(&*holder) {
        return refuses_fair(&holder, &key).await;
    }
    let ttl = long_ttl(&*holder);
    let first = must_acquire(&*holder, &key, ttl).await?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut seen = Vec::new();
    for i in 0..WAITERS {
        let p = ctx.provider().await?;
        let (k, order) = (key.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let key = k;
            let options = AcquireOptions::ttl(ttl)
                .wait(Duration::from_secs(60))
                .fair();
            let Some(lease) = acquire(&p, &key, options).await? else {
                return Err(CaseError(format!("fair waiter {i} waited 60 s")));
            };
            order
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((i, lease.token()));
            sleep(Duration::from_millis(20)).await;
            p.release(&lease).await?;
            Ok::<_, CaseError>(())
        }));
        let seq = await_joined(&*holder, &key, &seen).await?;
        seen.push(seq);
    }
    holder.release(&first).await?;
    for t in join_all(tasks).await {
        t.map_err(|e| CaseError(format!("fair waiter panicked: {e}")))??;
    }
    let order = order.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let served: Vec<usize> = order.iter().map(|o| o.0).collect();
    check!(
        served == (0..WAITERS).collect::<Vec<_>>(),
        "fair waiters were served in the order {served:?}, not the order they arrived"
    );
    check!(
        order.windows(2).all(|w| w[0].1 < w[1].1) && order[0].1 > first.token(),
        "tokens did not grow in the order the key was held: {order:?}"
    );
    Ok(())
}

/// Fair read/write waiters (C17 with C19): behind a writer, two readers, a
/// writer and a reader queue in that order (in the read/write lease's own
/// line) and are served in it. Writer preference alone would serve the
/// waiting writer first; arrival order lets the two readers in together,
/// then the writer once both left, and the last reader only after the writer.
pub(super) async fn fair_read_write_waiters_are_served_in_arrival_order(ctx: Ctx) -> CaseResult {
    let holder = ctx.provider().await?;
    let key = ctx.key("rw-fair-order")?;
    let ttl = long_ttl(&*holder);
    let fair = AcquireOptions::ttl(ttl)
        .wait(Duration::from_secs(60))
        .fair();
    if !holder.capabilities().shared_leases {
        // The C19 cases check the refusal.
        return Ok(());
    }
    if !declares_fair(&*holder) {
        let quick = fair.wait(Duration::from_secs(1));
        return match lease_api::acquire_read(&holder, &key, quick).await {
            Err(LeaseError::Config(_)) => Ok(()),
            other => Err(CaseError(format!(
                "a fair read on a backend without fair waiting answered {other:?}, not a Config error"
            ))),
        };
    }
    let first = match holder.try_acquire_write(&key, ttl, None).await? {
        TryAcquire::Acquired(l) => l,
        TryAcquire::Held { .. } => {
            return Err(CaseError("a fresh key's writer was refused".into()));
        }
    };
    let line = lease_api::backend::read_write_queue_key(&key);
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut seen = Vec::new();
    for (i, writes) in [false, false, true, false].into_iter().enumerate() {
        let p = ctx.provider().await?;
        let (k, order) = (key.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let got = if writes {
                lease_api::acquire_write(&p, &k, fair).await?
            } else {
                lease_api::acquire_read(&p, &k, fair).await?
            };
            let Some(lease) = got else {
                return Err(CaseError(format!("fair waiter {i} waited 60 s")));
            };
            check!(
                lease.kind().is_read() != writes,
                "fair waiter {i} got a {:?} lease",
                lease.kind()
            );
            let events = || order.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let log = |i| order.lock().unwrap_or_else(|p| p.into_inner()).push(i);
            log(i);
            if i == 0 {
                // The first reader holds until the second is in beside it
                // (20 s at most: a reader kept out until it let go shows).
                let give_up = Instant::now() + Duration::from_secs(20);
                while !events().contains(&1) && Instant::now() < give_up {
                    sleep(Duration::from_millis(20)).await;
                }
            }
            sleep(Duration::from_millis(300)).await;
            log(i);
            p.release(&lease).await?;
            Ok::<_, CaseError>(())
        }));
        let seq = await_joined(&*holder, &line, &seen).await?;
        seen.push(seq);
    }
    holder.release(&first).await?;
    for t in join_all(tasks).await {
        t.map_err(|e| CaseError(format!("fair waiter panicked: {e}")))??;
    }
    let events: Vec<usize> = order.lock().unwrap_or_else(|p| p.into_inner()).clone();
    // Each index once as it got the key and once as it let go: the readers
    // 0 and 1 in together, then the writer alone, then reader 3.
    let together = |pair: &[usize]| {
        let mut v = pair.to_vec();
        v.sort_unstable();
        v == [0, 1]
    };
    check!(
        events.len() == 8
            && together(&events[0..2])
            && together(&events[2..4])
            && events[4..] == [2, 2, 3, 3],
        "fair read/write waiters held in the order {events:?}, not readers 0 and 1 \
         together, then writer 2 alone, then reader 3"
    );
    Ok(())
}

/// A fair waiter whose process died (its ticket neither refreshed nor
/// removed) holds the line up until its ticket's TTL (or session) ends, not
/// forever; one whose wait ran out leaves the line at once.
pub(super) async fn fair_queue_skips_dead_and_departed_waiters(ctx: Ctx) -> CaseResult {
    let waiter = ctx.provider().await?;
    let key = ctx.key("fair-dead")?;
    if !declares_fair(&*waiter) {
        return refuses_fair(&waiter, &key).await;
    }
    // Behind a first waiter, one waiter's wait runs out and another's
    // future is dropped: both leave the line at once, so the waiter behind
    // them gets the key as soon as the first one is done with it.
    let holder = ctx.provider().await?;
    let ttl = long_ttl(&*waiter);
    let lease = must_acquire(&*holder, &key, long_ttl(&*holder)).await?;
    let fair = move |wait: Duration| AcquireOptions::ttl(ttl).wait(wait).fair();
    let first = {
        let (p, k) = (Arc::clone(&waiter), key.clone());
        tokio::spawn(async move {
            let lease = acquire(&p, &k, fair(Duration::from_secs(60))).await?;
            if let Some(l) = &lease {
                p.release(l).await?;
            }
            Ok::<_, LeaseError>(lease.is_some())
        })
    };
    let mut seen = vec![await_joined(&*waiter, &key, &[]).await?];
    let gave_up = {
        let (p, k) = (ctx.provider().await?, key.clone());
        tokio::spawn(async move { acquire(&p, &k, fair(Duration::from_secs(3))).await })
    };
    seen.push(await_joined(&*waiter, &key, &seen).await?);
    let dropped = {
        let (p, k) = (ctx.provider().await?, key.clone());
        tokio::spawn(async move {
            tokio::time::timeout(
                Duration::from_secs(3),
                acquire(&p, &k, fair(Duration::from_secs(60))),
            )
            .await
        })
    };
    seen.push(await_joined(&*waiter, &key, &seen).await?);
    check!(
        matches!(gave_up.await, Ok(Ok(None))),
        "a fair waiter whose wait ran out did not answer None"
    );
    check!(
        matches!(dropped.await, Ok(Err(_))),
        "a dropped fair acquire finished"
    );
    let behind = {
        let (p, k) = (ctx.provider().await?, key.clone());
        tokio::spawn(async move {
            let lease = acquire(&p, &k, fair(Duration::from_secs(60))).await?;
            let at = Instant::now();
            if let Some(l) = &lease {
                p.release(l).await?;
            }
            Ok::<_, LeaseError>(lease.map(|_| at))
        })
    };
    await_joined(&*waiter, &key, &seen).await?;
    holder.release(&lease).await?;
    let released = Instant::now();
    check!(
        matches!(first.await, Ok(Ok(true))),
        "the first fair waiter did not get the released key"
    );
    let Ok(Ok(Some(at))) = behind.await else {
        return Err(CaseError(
            "the fair waiter behind those that left never got the key".into(),
        ));
    };
    check!(
        at.duration_since(released) < TOLERANCE,
        "the fair waiter behind those that left got the key {:?} after its release: their tickets stayed in line",
        at.duration_since(released)
    );

    // A waiter that died: its ticket stays until its TTL.
    let crashed = ctx.provider().await?;
    let ttl = short_ttl(&*crashed);
    let Some(queue) = crashed.wait_queue() else {
        return Err(CaseError("no queue of waiters".into()));
    };
    let joined = Instant::now();
    let _ticket = queue.join(&key, ttl, Ticket::random_mark()).await?;
    drop(crashed);
    let session = waiter.capabilities().holder_session.unwrap_or_default();
    let wait = expiry_bound(&*waiter, ttl) * 2 + session;
    let options = AcquireOptions::ttl(long_ttl(&*waiter)).wait(wait).fair();
    let Some(lease) = acquire(&waiter, &key, options).await? else {
        return Err(CaseError(format!(
            "a fair waiter behind a dead one did not get the free key within {wait:?}"
        )));
    };
    let at = Instant::now();
    if waiter.capabilities().holder_session.is_none() {
        check!(
            at >= joined + ttl,
            "a dead waiter's ticket was passed over {:?} before its TTL ended",
            joined + ttl - at
        );
    }
    waiter.release(&lease).await?;
    Ok(())
}

/// A leader cut off from the store (as a paused process is) loses its term
/// to a follower once its lease ends, not before, and the resource's fence
/// refuses the old leader's late write while it admits the new leader's.
pub(super) async fn election_paused_leader_is_fenced(ctx: Ctx) -> CaseResult {
    use lease_api::recipes::Election;
    let link = Partition::new(ctx.provider().await?);
    let follower = ctx.provider().await?;
    let name = ctx.key("election-fenced")?;
    let ttl = short_ttl(&*follower);
    let old = Election::new(link.clone(), name.as_str(), ttl)?;
    let asked = Instant::now();
    let Some(term) = old.campaign_for(Duration::from_secs(10)).await? else {
        return Err(CaseError("nobody led a free election".into()));
    };
    let gate = FenceGate::new();
    check!(
        gate.admit(old.key(), term.token()).is_ok(),
        "the fence refused the first leader"
    );
    link.hook().cut(true);
    let next = Election::new(Arc::clone(&follower), name.as_str(), ttl)?;
    let session = follower.capabilities().holder_session.unwrap_or_default();
    let wait = expiry_bound(&*follower, ttl) * 2 + session;
    let Some(new_term) = next.campaign_for(wait).await? else {
        return Err(CaseError(format!(
            "the follower did not lead within {wait:?} of the leader being cut off"
        )));
    };
    let led = Instant::now();
    if follower.capabilities().holder_session.is_none() {
        // The old term's lease was granted after `asked`: it ran at least
        // until `asked + ttl` (less a little for rate differences of clocks).
        let earliest = asked + ttl - Duration::from_millis(50);
        check!(
            led >= earliest,
            "the follower led {:?} before the cut-off leader's lease could end",
            earliest - led
        );
    }
    check!(
        new_term.token() > term.token(),
        "the new term's token {} is not above the old one's {}",
        new_term.token(),
        term.token()
    );
    check!(
        gate.admit(next.key(), new_term.token()).is_ok(),
        "the fence refused the new leader"
    );
    check!(
        gate.admit(old.key(), term.token()).is_err(),
        "the fence admitted the cut-off leader's late write after the new leader's"
    );
    link.hook().cut(false);
    new_term.resign().await?;
    drop(term);
    Ok(())
}

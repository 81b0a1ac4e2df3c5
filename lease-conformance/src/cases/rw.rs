//! C19: read/write leases: readers share a key, a writer excludes everyone,
//! a waiting writer keeps new readers out, tokens follow the writer rule.

use lease_api::{LeaseKind, RwInfo, acquire_read, acquire_write};

use super::*;

/// A provider without read/write leases must say so clearly; the case then
/// has nothing more to check.
async fn refuses_rw(p: &Arc<dyn LeaseProvider>, key: &LeaseKey) -> Result<bool, CaseError> {
    if p.capabilities().shared_leases {
        return Ok(false);
    }
    let ttl = long_ttl(&**p);
    check!(
        matches!(
            p.try_acquire_read(key, ttl).await,
            Err(LeaseError::Config(_))
        ),
        "a provider without shared_leases did not refuse a reader with Config"
    );
    check!(
        matches!(
            acquire_write(p, key, AcquireOptions::ttl(ttl)).await,
            Err(LeaseError::Config(_))
        ),
        "a provider without shared_leases did not refuse a writer with Config"
    );
    Ok(true)
}

async fn must_read(
    p: &dyn LeaseProvider,
    key: &LeaseKey,
    ttl: Duration,
) -> Result<Lease, CaseError> {
    match p.try_acquire_read(key, ttl).await? {
        TryAcquire::Acquired(l) => {
            check!(l.kind().is_read(), "a reader's lease is {:?}", l.kind());
            Ok(l)
        }
        TryAcquire::Held { .. } => Err(CaseError(format!("a reader was refused {key:?}"))),
    }
}

async fn must_write(
    p: &dyn LeaseProvider,
    key: &LeaseKey,
    ttl: Duration,
) -> Result<Lease, CaseError> {
    match p.try_acquire_write(key, ttl, None).await? {
        TryAcquire::Acquired(l) => {
            check!(
                l.kind() == LeaseKind::Write,
                "a writer's lease is {:?}",
                l.kind()
            );
            Ok(l)
        }
        TryAcquire::Held { .. } => Err(CaseError(format!("a writer was refused {key:?}"))),
    }
}

fn epoch(l: &Lease) -> FencingToken {
    match l.kind() {
        LeaseKind::Read { writer_epoch } => writer_epoch,
        _ => FencingToken(0),
    }
}

async fn info(p: &dyn LeaseProvider, key: &LeaseKey) -> Result<RwInfo, CaseError> {
    Ok(p.inspect_rw(key).await?)
}

/// What `p` sees of `key` once `want` holds, looking again for a while: a
/// replicated store's member may serve a read before it applied another
/// client's last write (ZooKeeper orders reads per session only).
async fn info_until(
    p: &dyn LeaseProvider,
    key: &LeaseKey,
    want: impl Fn(&RwInfo) -> bool,
) -> Result<RwInfo, CaseError> {
    let until = Instant::now() + TOLERANCE;
    loop {
        let seen = info(p, key).await?;
        if want(&seen) || Instant::now() >= until {
            return Ok(seen);
        }
        sleep(Duration::from_millis(20)).await;
    }
}

pub(super) async fn rw_readers_share_and_a_writer_excludes(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let key = ctx.key("rw")?;
    if refuses_rw(&p, &key).await? {
        return Ok(());
    }
    let others = [ctx.provider().await?, ctx.provider().await?];
    let ttl = long_ttl(&*p);
    let mut readers = vec![must_read(&*p, &key, ttl).await?];
    for o in &others {
        readers.push(must_read(&**o, &key, ttl).await?);
    }
    let seen = info_until(&*p, &key, |i| i.readers.len() == 3).await?;
    check!(
        seen.readers.len() == 3 && seen.writer.is_none(),
        "inspect_rw shows {seen:?}"
    );
    check!(
        !others[0]
            .try_acquire_write(&key, ttl, None)
            .await?
            .is_acquired(),
        "a writer got the key beside three readers"
    );
    // The plain lease of the same key name is another object.
    let plain = must_acquire(&*others[1], &key, ttl).await?;
    others[1].release(&plain).await?;
    for (r, prov) in readers.iter().zip([&p, &others[0], &others[1]]) {
        prov.release(r).await?;
    }
    let w = must_write(&*others[0], &key, ttl).await?;
    check!(
        !p.try_acquire_read(&key, ttl).await?.is_acquired(),
        "a reader got the key beside a writer"
    );
    check!(
        !p.try_acquire_write(&key, ttl, None).await?.is_acquired(),
        "a second writer got the key"
    );
    let held_alone =
        |i: &RwInfo| i.writer.as_ref().map(|x| x.token) == Some(w.token()) && i.readers.is_empty();
    let seen = info_until(&*p, &key, held_alone).await?;
    check!(
        held_alone(&seen),
        "inspect_rw shows {seen:?} while writer {} holds",
        w.token()
    );
    others[0].release(&w).await?;
    let r = must_read(&*p, &key, ttl).await?;
    p.release(&r).await?;
    Ok(())
}

pub(super) async fn rw_tokens_follow_the_writer_rule(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let key = ctx.key("rw")?;
    if refuses_rw(&p, &key).await? {
        return Ok(());
    }
    let ttl = long_ttl(&*p);
    let r1 = must_read(&*p, &key, ttl).await?;
    let r1b = must_read(&*p, &key, ttl).await?;
    p.release(&r1).await?;
    p.release(&r1b).await?;
    let w1 = must_write(&*p, &key, ttl).await?;
    check!(
        w1.token() > r1.token() && w1.token() > r1b.token(),
        "writer token {} is not above the earlier readers' {} and {}",
        w1.token(),
        r1.token(),
        r1b.token()
    );
    p.release(&w1).await?;
    let r2 = must_read(&*p, &key, ttl).await?;
    check!(
        epoch(&r2) == w1.token(),
        "a reader after writer {} carries epoch {}",
        w1.token(),
        epoch(&r2)
    );
    check!(
        r2.token() > w1.token(),
        "reader token {} is not above writer {}",
        r2.token(),
        w1.token()
    );
    p.release(&r2).await?;
    let w2 = must_write(&*p, &key, ttl).await?;
    check!(
        w2.token() > r2.token(),
        "writer token {} is not above reader {}",
        w2.token(),
        r2.token()
    );
    // The gate: a reader from before writer 2 is refused once it wrote; one after it reads.
    let gate = FenceGate::new();
    gate.write(&key, w2.token(), || ())
        .map_err(|e| CaseError(format!("writer refused by the gate: {e}")))?;
    check!(
        gate.read(&key, r2.token(), epoch(&r2), || ()).is_err(),
        "the gate let a reader from before the newest writer read"
    );
    p.release(&w2).await?;
    let r3 = must_read(&*p, &key, ttl).await?;
    check!(
        gate.read(&key, r3.token(), epoch(&r3), || ()).is_ok(),
        "the gate refused a reader after the writer"
    );
    // ... and once that reader read, writer 2 (paused past its lease, say) may not write.
    check!(
        gate.write(&key, w2.token(), || ()).is_err(),
        "the gate let a writer from before a reader that read write"
    );
    p.release(&r3).await?;
    Ok(())
}

pub(super) async fn rw_waiting_writer_keeps_new_readers_out(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let key = ctx.key("rw")?;
    if refuses_rw(&p, &key).await? {
        return Ok(());
    }
    let writer_p = ctx.provider().await?;
    let ttl = long_ttl(&*p);
    let r1 = must_read(&*p, &key, ttl).await?;
    let writer = {
        let (w, k) = (Arc::clone(&writer_p), key.clone());
        tokio::spawn(async move {
            let got = acquire_write(&w, &k, AcquireOptions::ttl(ttl).wait(ttl)).await;
            (got, Instant::now())
        })
    };
    let until = Instant::now() + TOLERANCE * 4;
    while info(&*p, &key).await?.writers_waiting == 0 {
        check!(
            Instant::now() < until,
            "the waiting writer was never recorded"
        );
        sleep(Duration::from_millis(10)).await;
    }
    // A stream of readers cannot starve the writer: the next one is refused.
    check!(
        !p.try_acquire_read(&key, ttl).await?.is_acquired(),
        "a new reader got in while a writer waits"
    );
    let released = Instant::now();
    p.release(&r1).await?;
    let (got, at) = writer
        .await
        .map_err(|e| CaseError(format!("writer task: {e}")))?;
    let Some(w) = got? else {
        return Err(CaseError("the waiting writer never got the key".into()));
    };
    check!(
        at - released < HANDED_OVER_WITHIN,
        "the writer got the key {:?} after the last reader left (its TTL is {ttl:?})",
        at - released
    );
    check!(
        info_until(&*p, &key, |i| i.writers_waiting == 0)
            .await?
            .writers_waiting
            == 0,
        "the served writer is still recorded as waiting"
    );
    writer_p.release(&w).await?;
    // A writer that gives up withdraws its record: readers get in at once.
    let r2 = must_read(&*p, &key, ttl).await?;
    let gave_up = acquire_write(
        &writer_p,
        &key,
        AcquireOptions::ttl(ttl).wait(Duration::from_millis(200)),
    )
    .await?;
    check!(gave_up.is_none(), "a writer got the key beside a reader");
    let until = Instant::now() + TOLERANCE;
    loop {
        match p.try_acquire_read(&key, ttl).await? {
            TryAcquire::Acquired(r3) => {
                p.release(&r3).await?;
                break;
            }
            TryAcquire::Held { .. } => {
                check!(
                    Instant::now() < until,
                    "a writer that gave up still keeps readers out"
                );
                sleep(Duration::from_millis(10)).await;
            }
        }
    }
    p.release(&r2).await?;
    Ok(())
}

pub(super) async fn rw_crashed_reader_expires_for_the_writer(ctx: Ctx) -> CaseResult {
    let crashed = ctx.provider().await?;
    let key = ctx.key("rw")?;
    if refuses_rw(&crashed, &key).await? {
        return Ok(());
    }
    let p = ctx.provider().await?;
    let ttl = short_ttl(&*crashed);
    let r = must_read(&*crashed, &key, ttl).await?;
    let live = must_read(&*p, &key, long_ttl(&*p)).await?;
    p.release(&live).await?;
    let wait = expiry_bound(&*crashed, ttl) * 2;
    let started = Instant::now();
    let Some(w) = acquire_write(&p, &key, AcquireOptions::ttl(long_ttl(&*p)).wait(wait)).await?
    else {
        return Err(CaseError(format!(
            "a crashed reader (TTL {ttl:?}) held the writer out for {wait:?}"
        )));
    };
    check!(
        Instant::now()
            >= r.sent_at()
                + ttl.saturating_sub(p.capabilities().expiry_slack + Duration::from_millis(50)),
        "the writer got the key {:?} after the reader's acquire, before its TTL {ttl:?}",
        started - r.sent_at()
    );
    check!(
        w.token() > r.token(),
        "writer token {} is not above the crashed reader's {}",
        w.token(),
        r.token()
    );
    p.release(&w).await?;
    Ok(())
}

pub(super) async fn rw_leases_renew_and_stale_handles_touch_nothing(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let key = ctx.key("rw")?;
    if refuses_rw(&p, &key).await? {
        return Ok(());
    }
    let ttl = renewing_ttl(&*p);
    let r = must_read(&*p, &key, ttl).await?;
    // A reader's handle passed as a writer's (and the other way) touches nothing.
    let as_writer = r.clone().with_kind(LeaseKind::Write);
    check!(
        p.release(&as_writer).await.is_err(),
        "a reader released as a writer"
    );
    check!(
        p.extend(&as_writer, ttl).await.is_err(),
        "a reader extended as a writer"
    );
    let as_plain = r.clone().with_kind(LeaseKind::Exclusive);
    check!(
        p.release(&as_plain).await.is_err(),
        "a reader released as a plain lease"
    );
    // Renewed by a guard across three TTLs.
    let guard = LeaseGuard::new(Arc::clone(&p), r.clone());
    sleep(ttl * 3).await;
    check!(
        !guard.is_lost(),
        "a reader's guard lost it: {:?}",
        guard.lost_reason()
    );
    let seen = info(&*p, &key).await?;
    check!(
        seen.readers.iter().any(|i| i.token == r.token()),
        "the renewed reader is gone after three TTLs: {seen:?}"
    );
    match p.try_acquire_write(&key, ttl, None).await?.into_lease() {
        None => guard.release().await?,
        Some(w) => {
            // Only a reader whose renewal came too late (a stalled machine)
            // can have run out on the store: then its guard must say it lost
            // the lease, by the end of the validity it had.
            let told = tokio::time::timeout(ttl, guard.lost()).await.is_ok();
            check!(told, "a writer got the key beside a renewed reader");
            drop(guard);
            p.release(&w).await?;
        }
    }
    let w = must_write(&*p, &key, long_ttl(&*p)).await?;
    let as_reader = w.clone().with_kind(LeaseKind::Read {
        writer_epoch: FencingToken(0),
    });
    check!(
        p.release(&as_reader).await.is_err(),
        "a writer released as a reader"
    );
    p.release(&w).await?;
    Ok(())
}

pub(super) async fn rw_dropped_waits_leave_nothing(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let key = ctx.key("rw")?;
    if refuses_rw(&p, &key).await? {
        return Ok(());
    }
    let ttl = long_ttl(&*p);
    let r = must_read(&*p, &key, ttl).await?;
    // Writers dropped while they wait: their records must go with them.
    for _ in 0..3 {
        let _ = tokio::time::timeout(
            Duration::from_millis(50),
            acquire_write(&p, &key, AcquireOptions::ttl(ttl).wait(ttl)),
        )
        .await;
    }
    // Within a moment, not at once: an attempt in flight when its writer was
    // dropped may record the writer again after the drop's withdrawal, and
    // withdraws it when it lands (until then the count can read 0 while a
    // record is on its way).
    let until = Instant::now() + TOLERANCE;
    let r2 = loop {
        match p.try_acquire_read(&key, ttl).await? {
            TryAcquire::Acquired(l) => break l,
            TryAcquire::Held { .. } => {
                check!(
                    Instant::now() < until,
                    "dropped writers still keep readers out ({} recorded as waiting)",
                    info(&*p, &key).await?.writers_waiting
                );
                sleep(Duration::from_millis(10)).await;
            }
        }
    };
    p.release(&r).await?;
    p.release(&r2).await?;
    // Readers and writers dropped at many points of their flight leave no lease.
    for i in 0..12u64 {
        let cut = Duration::from_micros(i * 300);
        if let Ok(Ok(Some(l))) =
            tokio::time::timeout(cut, acquire_read(&p, &key, AcquireOptions::ttl(ttl))).await
        {
            p.release(&l).await?;
        }
        if let Ok(Ok(Some(l))) =
            tokio::time::timeout(cut, acquire_write(&p, &key, AcquireOptions::ttl(ttl))).await
        {
            p.release(&l).await?;
        }
    }
    let Some(w) = acquire_write(
        &p,
        &key,
        AcquireOptions::ttl(ttl).wait(Duration::from_secs(5)),
    )
    .await?
    else {
        return Err(CaseError(
            "a dropped acquire left a read/write lease behind".into(),
        ));
    };
    p.release(&w).await?;
    Ok(())
}

pub(super) async fn rw_concurrent_readers_and_writers_never_overlap(ctx: Ctx) -> CaseResult {
    const TASKS: usize = 12;
    const ROUNDS: usize = 6;
    let p0 = ctx.provider().await?;
    let key = ctx.key("rw")?;
    if refuses_rw(&p0, &key).await? {
        return Ok(());
    }
    let providers: Vec<Arc<dyn LeaseProvider>> = join_all((0..TASKS).map(|_| ctx.provider()))
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let ttl = long_ttl(&*p0);
    // (readers, writers) holding now, as the tasks see it.
    let holding = Arc::new(std::sync::Mutex::new((0usize, 0usize)));
    let writer_tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let barrier = Arc::new(Barrier::new(TASKS));
    let tasks = providers.into_iter().enumerate().map(|(id, p)| {
        let (key, holding, writer_tokens, barrier) = (
            key.clone(),
            Arc::clone(&holding),
            Arc::clone(&writer_tokens),
            Arc::clone(&barrier),
        );
        tokio::spawn(async move {
            barrier.wait().await;
            for round in 0..ROUNDS {
                let write = (id + round) % 3 == 0;
                let options = AcquireOptions::ttl(ttl).wait(Duration::from_secs(60));
                let got = if write {
                    acquire_write(&p, &key, options).await?
                } else {
                    acquire_read(&p, &key, options).await?
                };
                let Some(lease) = got else {
                    return Err(CaseError(format!(
                        "task {id} round {round}: nothing within 60 s"
                    )));
                };
                {
                    let mut h = holding.lock().unwrap_or_else(|e| e.into_inner());
                    if write {
                        if h.0 > 0 || h.1 > 0 {
                            return Err(CaseError(format!(
                                "a writer got in beside {} readers and {} writers",
                                h.0, h.1
                            )));
                        }
                        h.1 += 1;
                        writer_tokens
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(lease.token());
                    } else {
                        if h.1 > 0 {
                            return Err(CaseError("a reader got in beside a writer".into()));
                        }
                        h.0 += 1;
                    }
                }
                sleep(Duration::from_millis(2)).await;
                {
                    let mut h = holding.lock().unwrap_or_else(|e| e.into_inner());
                    if write {
                        h.1 -= 1;
                    } else {
                        h.0 -= 1;
                    }
                }
                p.release(&lease).await?;
            }
            Ok::<(), CaseError>(())
        })
    });
    for t in join_all(tasks).await {
        t.map_err(|e| CaseError(format!("a task failed: {e}")))??;
    }
    let tokens = writer_tokens
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    check!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "writer tokens in the order writers held the key do not grow: {tokens:?}"
    );
    Ok(())
}

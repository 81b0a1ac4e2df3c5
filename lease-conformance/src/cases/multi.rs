//! C18: sets of keys, taken whole or not at all.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use lease_api::{LeaseSetGuard, TryAcquireAll, acquire_all, release_all};
use rand::seq::SliceRandom;

use super::*;

async fn must_acquire_all(
    p: &dyn LeaseProvider,
    keys: &[LeaseKey],
    ttl: Duration,
) -> Result<Vec<Lease>, CaseError> {
    match p.try_acquire_all(keys, ttl).await? {
        TryAcquireAll::Acquired(leases) => Ok(leases),
        TryAcquireAll::Held { key, .. } => Err(CaseError(format!(
            "expected to take the free set, but {key:?} is held"
        ))),
    }
}

async fn is_free(p: &dyn LeaseProvider, key: &LeaseKey) -> Result<bool, CaseError> {
    Ok(p.inspect(key).await?.is_none())
}

pub(super) async fn multi_key_takes_every_key_or_none(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let other = ctx.provider().await?;
    let ttl = long_ttl(&*p);
    let keys: Vec<LeaseKey> = ["c", "a", "b"]
        .iter()
        .map(|k| ctx.key(k))
        .collect::<Result<_, _>>()?;
    // An earlier lease on one key: the set's token for it must be above it.
    let earlier = must_acquire(&*p, &keys[1], ttl).await?;
    p.release(&earlier).await?;
    let set = must_acquire_all(&*p, &keys, ttl).await?;
    check!(
        set.len() == keys.len(),
        "{} leases for {} keys",
        set.len(),
        keys.len()
    );
    for (lease, key) in set.iter().zip(&keys) {
        check!(
            lease.key() == key,
            "lease for {:?} where {key:?} was asked",
            lease.key()
        );
        let info = other.inspect(key).await?;
        check!(
            info.as_ref().map(|i| i.token) == Some(lease.token()),
            "{key:?} is not held with the set's token {}: {info:?}",
            lease.token()
        );
    }
    check!(
        set[1].token() > earlier.token(),
        "the set's token {} for {:?} is not above the earlier {}",
        set[1].token(),
        keys[1],
        earlier.token()
    );
    let mut owners: Vec<_> = set.iter().map(|l| l.owner()).collect();
    owners.dedup();
    check!(
        owners.len() == set.len(),
        "leases of a set share an owner id"
    );
    // Any key of it held refuses a second set, which leaves its other keys free.
    for (i, held) in keys.iter().enumerate() {
        let free_a = ctx.key(&format!("0-free-{i}"))?; // sorts before every key of the set
        let free_z = ctx.key(&format!("zz-free-{i}"))?;
        let second = [free_a.clone(), held.clone(), free_z.clone()];
        match other.try_acquire_all(&second, ttl).await? {
            TryAcquireAll::Held { key, .. } => {
                check!(
                    &key == held,
                    "the second set reports {key:?} held, not {held:?}"
                )
            }
            TryAcquireAll::Acquired(l) => {
                return Err(CaseError(format!(
                    "a second set took {held:?} while the first holds it (token {})",
                    l[1].token()
                )));
            }
        }
        for k in [&free_a, &free_z] {
            check!(
                is_free(&*p, k).await?,
                "a refused set left {k:?} held (nothing may be half held)"
            );
        }
    }
    release_all(&*p, &set).await?;
    for key in &keys {
        check!(
            is_free(&*other, key).await?,
            "{key:?} still held after release_all"
        );
    }
    Ok(())
}

pub(super) async fn multi_key_bad_sets_change_nothing(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let ttl = long_ttl(&*p);
    let a = ctx.key("a")?;
    let b = ctx.key("b")?;
    let max = p.capabilities().multi_key.max_keys;
    let too_many: Vec<LeaseKey> = (0..=max)
        .map(|i| ctx.key(&format!("many-{i}")))
        .collect::<Result<_, _>>()?;
    let cases: [(&str, Vec<LeaseKey>, Duration); 4] = [
        ("an empty set", vec![], ttl),
        (
            "a key named twice",
            vec![a.clone(), b.clone(), a.clone()],
            ttl,
        ),
        ("one key more than max_keys", too_many.clone(), ttl),
        ("a zero TTL", vec![a.clone(), b.clone()], Duration::ZERO),
    ];
    for (what, keys, ttl) in cases {
        match p.try_acquire_all(&keys, ttl).await {
            Err(LeaseError::Config(_)) if ttl > Duration::ZERO => {}
            Err(LeaseError::InvalidTtl { .. }) if ttl == Duration::ZERO => {}
            other => {
                return Err(CaseError(format!(
                    "{what}: expected a clear error, got {:?}",
                    other.map(|o| o.is_acquired())
                )));
            }
        }
        let options = AcquireOptions::ttl(ttl).wait(Duration::from_secs(1));
        check!(
            acquire_all(&p, &keys, options).await.is_err(),
            "{what}: acquire_all did not refuse it"
        );
    }
    for k in too_many.iter().chain([&a, &b]) {
        check!(is_free(&*p, k).await?, "a refused set left {k:?} held");
    }
    // A fair wait is for one key: refused for a set.
    let fair = AcquireOptions::ttl(ttl).fair();
    check!(
        matches!(
            acquire_all(&p, std::slice::from_ref(&a), fair).await,
            Err(LeaseError::Config(_))
        ),
        "a fair acquire_all is not refused"
    );
    Ok(())
}

pub(super) async fn multi_key_sets_never_deadlock_or_overlap(ctx: Ctx) -> CaseResult {
    const TASKS: usize = 16;
    const ROUNDS: usize = 4;
    const KEYS: usize = 6;
    let providers: Vec<Arc<dyn LeaseProvider>> = join_all((0..TASKS).map(|_| ctx.provider()))
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let keys: Vec<LeaseKey> = (0..KEYS)
        .map(|i| ctx.key(&format!("k{i}")))
        .collect::<Result<_, _>>()?;
    let ttl = long_ttl(&*providers[0]);
    // Who holds each key, as the tasks see it: two at once is an overlap.
    let holders: Arc<Mutex<HashMap<LeaseKey, usize>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(TASKS));
    let tasks = providers.into_iter().enumerate().map(|(id, p)| {
        let (keys, holders, barrier) = (keys.clone(), Arc::clone(&holders), Arc::clone(&barrier));
        tokio::spawn(async move {
            barrier.wait().await;
            for round in 0..ROUNDS {
                // Three of the keys, in a random order: overlapping sets.
                let set: Vec<LeaseKey> = {
                    let mut rng = rand::rng();
                    let mut set = keys.clone();
                    set.shuffle(&mut rng);
                    set.truncate(3);
                    set
                };
                let options = AcquireOptions::ttl(ttl).wait(Duration::from_secs(60));
                let Some(leases) = acquire_all(&p, &set, options).await? else {
                    return Err(CaseError(format!(
                        "task {id} round {round}: no set within 60 s (a deadlock?)"
                    )));
                };
                {
                    let mut h = holders.lock().unwrap_or_else(|e| e.into_inner());
                    for k in &set {
                        if let Some(other) = h.insert(k.clone(), id) {
                            return Err(CaseError(format!(
                                "task {id} got {k:?} while task {other} held it"
                            )));
                        }
                    }
                }
                tokio::task::yield_now().await;
                {
                    let mut h = holders.lock().unwrap_or_else(|e| e.into_inner());
                    for k in &set {
                        h.remove(k);
                    }
                }
                release_all(&*p, &leases).await?;
            }
            Ok::<(), CaseError>(())
        })
    });
    for t in join_all(tasks).await {
        t.map_err(|e| CaseError(format!("a task failed: {e}")))??;
    }
    Ok(())
}

pub(super) async fn dropped_multi_acquire_leaks_no_key(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let checker = ctx.provider().await?;
    let ttl = long_ttl(&*p);
    let mut keys = Vec::new();
    // Drop acquires of free sets at many points of their flight.
    for i in 0..16u64 {
        let set = [
            ctx.key(&format!("{i}-a"))?,
            ctx.key(&format!("{i}-b"))?,
            ctx.key(&format!("{i}-c"))?,
        ];
        let cut = Duration::from_micros(i * 400);
        if let Ok(Ok(Some(leases))) =
            tokio::time::timeout(cut, acquire_all(&p, &set, AcquireOptions::ttl(ttl))).await
        {
            release_all(&*p, &leases).await?;
        }
        keys.extend(set);
    }
    // And waiting ones, dropped while a key of the set is held.
    let held_key = ctx.key("held")?;
    let held = must_acquire(&*p, &held_key, ttl).await?;
    for i in 0..4 {
        let set = [ctx.key(&format!("w{i}"))?, held_key.clone()];
        let options = AcquireOptions::ttl(ttl).wait(ttl);
        let _ =
            tokio::time::timeout(Duration::from_millis(30), acquire_all(&p, &set, options)).await;
        keys.push(set[0].clone());
    }
    p.release(&held).await?;
    keys.push(held_key);
    // A leak holds a key for the long TTL; a given-back one is free promptly.
    for k in &keys {
        let Some(l) = acquire(
            &checker,
            k,
            AcquireOptions::ttl(ttl).wait(Duration::from_secs(5)),
        )
        .await?
        else {
            return Err(CaseError(format!("a dropped acquire_all leaked {k:?}")));
        };
        checker.release(&l).await?;
    }
    Ok(())
}

pub(super) async fn atomic_multi_key_is_never_seen_half_held(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let observer = ctx.provider().await?;
    let ttl = long_ttl(&*p);
    // "a..." sorts before "z...": taken key by key, "a" is held for a moment.
    let first = ctx.key("a")?;
    let last = ctx.key("z")?;
    let held = must_acquire(&*observer, &last, ttl).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (observer, first, stop) = (Arc::clone(&observer), first.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut seen = 0u32;
            let mut looks = 0u32;
            while !stop.load(Ordering::Relaxed) {
                looks += 1;
                if observer.inspect(&first).await?.is_some() {
                    seen += 1;
                }
            }
            Ok::<(u32, u32), CaseError>((seen, looks))
        })
    };
    let started = Instant::now();
    let mut tries = 0u32;
    while tries < 400 && started.elapsed() < Duration::from_secs(4) {
        tries += 1;
        match p
            .try_acquire_all(&[first.clone(), last.clone()], ttl)
            .await?
        {
            TryAcquireAll::Held { .. } => {}
            TryAcquireAll::Acquired(_) => {
                return Err(CaseError("a set took a key another provider holds".into()));
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (seen, looks) = watcher
        .await
        .map_err(|e| CaseError(format!("the observer failed: {e}")))??;
    observer.release(&held).await?;
    if p.capabilities().multi_key.atomic {
        check!(
            seen == 0,
            "declared atomic, yet {seen} of {looks} looks during {tries} refused sets saw {first:?} held"
        );
    }
    check!(
        is_free(&*p, &first).await?,
        "a refused set left {first:?} held"
    );
    Ok(())
}

pub(super) async fn lease_set_renews_and_is_lost_together(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let other = ctx.provider().await?;
    let ttl = renewing_ttl(&*p);
    let keys = [ctx.key("a")?, ctx.key("b")?];
    let Some(leases) = acquire_all(&p, &keys, AcquireOptions::ttl(ttl)).await? else {
        return Err(CaseError("a free set was not acquired".into()));
    };
    let tokens: Vec<_> = leases.iter().map(Lease::token).collect();
    let guard = LeaseSetGuard::new(Arc::clone(&p), leases.clone());
    // Held across three TTLs: renewed together.
    let until = Instant::now() + ttl * 3;
    while Instant::now() < until {
        for (key, token) in keys.iter().zip(&tokens) {
            let info = other.inspect(key).await?;
            check!(
                info.as_ref().map(|i| i.token) == Some(*token),
                "{key:?} not held with its token {token} while the guard renews: {info:?}"
            );
        }
        check!(
            !guard.is_lost(),
            "lost while renewing: {:?}",
            guard.lost_reason()
        );
        sleep(ttl / 4).await;
    }
    // One key ends behind the guard's back: the whole set is lost, and the
    // other key is given back long before its TTL.
    p.release(&guard.leases()[1]).await?;
    let lost = tokio::time::timeout(ttl * 2 + TOLERANCE, guard.lost()).await;
    check!(
        matches!(lost, Ok(LostReason::Revoked)),
        "the set was not lost when one of its keys ended: {lost:?}"
    );
    let Some(a) = acquire(
        &other,
        &keys[0],
        AcquireOptions::ttl(long_ttl(&*other)).wait(TOLERANCE),
    )
    .await?
    else {
        return Err(CaseError(
            "the rest of a lost set was not given back".into(),
        ));
    };
    other.release(&a).await?;
    drop(guard);
    Ok(())
}

pub(super) async fn multi_key_takes_over_expired_keys(ctx: Ctx) -> CaseResult {
    let crashed = ctx.provider().await?;
    let p = ctx.provider().await?;
    let ttl = short_ttl(&*crashed);
    let keys = [ctx.key("a")?, ctx.key("b")?, ctx.key("c")?];
    // `p` connected (and its table made) before the clock of the short
    // leases below starts: its first call must come while they still run.
    p.inspect(&keys[1]).await?;
    // Two keys of the set held by holders that stop renewing (a crash).
    let old_a = must_acquire(&*crashed, &keys[0], ttl).await?;
    let old_c = must_acquire(&*crashed, &keys[2], ttl).await?;
    let long = long_ttl(&*p);
    match p.try_acquire_all(&keys, long).await? {
        TryAcquireAll::Held { key, .. } => check!(
            key == keys[0] || key == keys[2],
            "the set reports {key:?} held, which nobody holds"
        ),
        TryAcquireAll::Acquired(_) => {
            return Err(CaseError("a set took keys whose leases still run".into()));
        }
    }
    let wait = expiry_bound(&*crashed, ttl) * 2;
    let Some(set) = acquire_all(&p, &keys, AcquireOptions::ttl(long).wait(wait)).await? else {
        return Err(CaseError(format!(
            "the set was not taken within {wait:?} of its holders' TTL {ttl:?}"
        )));
    };
    check!(
        set[0].token() > old_a.token() && set[2].token() > old_c.token(),
        "takeover tokens {} and {} are not above the expired {} and {}",
        set[0].token(),
        set[2].token(),
        old_a.token(),
        old_c.token()
    );
    release_all(&*p, &set).await?;
    Ok(())
}

//! The cases. Each one proves a clause of the contract; names are stable API.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use lease_api::{
    AcquireOptions, FenceGate, GuardConfig, Lease, LeaseError, LeaseGuard, LeaseKey, LeaseProvider,
    LostReason, MAX_KEY_BYTES, RunOptions, RunOutcome, TryAcquire, acquire, run_with_lease,
};
use tokio::sync::Barrier;
use tokio::time::{Instant, sleep, sleep_until};

use crate::{Case, CaseError, CaseResult, Ctx, Instrumented, Partition, check};

/// Room for scheduling delays on a loaded machine, on top of declared slack.
const TOLERANCE: Duration = Duration::from_millis(1500);

fn short_ttl(p: &dyn LeaseProvider) -> Duration {
    p.capabilities().practical_ttl(Duration::from_millis(500))
}

fn long_ttl(p: &dyn LeaseProvider) -> Duration {
    p.capabilities().practical_ttl(Duration::from_secs(30))
}

/// How long after an acquire completed the store may still hold the lease.
fn expiry_bound(p: &dyn LeaseProvider, ttl: Duration) -> Duration {
    ttl + p.capabilities().expiry_slack + TOLERANCE
}

async fn must_acquire(
    p: &dyn LeaseProvider,
    key: &LeaseKey,
    ttl: Duration,
) -> Result<Lease, CaseError> {
    match p.try_acquire(key, ttl).await? {
        TryAcquire::Acquired(l) => Ok(l),
        TryAcquire::Held { remaining } => Err(CaseError(format!(
            "expected to acquire free key {key:?}, but it is held (remaining {remaining:?})"
        ))),
    }
}

async fn must_be_held(p: &dyn LeaseProvider, key: &LeaseKey, ttl: Duration) -> CaseResult {
    match p.try_acquire(key, ttl).await? {
        TryAcquire::Held { .. } => Ok(()),
        TryAcquire::Acquired(l) => Err(CaseError(format!(
            "key {key:?} should be held, but a second acquirer got token {}",
            l.token()
        ))),
    }
}

/// `old` acquires with a short TTL and stops renewing; `new` (another provider)
/// takes the key over once it expires.
struct Takeover {
    old_provider: Arc<dyn LeaseProvider>,
    old: Lease,
    new_provider: Arc<dyn LeaseProvider>,
    new: Lease,
}

async fn takeover(ctx: &Ctx, key: &LeaseKey) -> Result<Takeover, CaseError> {
    let old_provider = ctx.provider().await?;
    let new_provider = ctx.provider().await?;
    let ttl = short_ttl(&*old_provider);
    let old = must_acquire(&*old_provider, key, ttl).await?;
    let wait = expiry_bound(&*old_provider, ttl);
    let Some(new) = acquire(&new_provider, key, AcquireOptions::ttl(ttl).wait(wait)).await? else {
        return Err(CaseError(format!(
            "an expired lease (TTL {ttl:?}) was not taken over within {wait:?}"
        )));
    };
    check!(
        new.token() > old.token(),
        "takeover token {} is not above {}",
        new.token(),
        old.token()
    );
    Ok(Takeover {
        old_provider,
        old,
        new_provider,
        new,
    })
}

macro_rules! cases {
    ($($name:ident, $clause:literal, $about:literal;)*) => {
        /// Every case of the suite, in the order of the contract.
        pub static CASES: &[Case] = &[
            $(Case { name: stringify!($name), clause: $clause, about: $about, run: |ctx| Box::pin($name(ctx)) },)*
        ];
    };
}

cases! {
    acquire_free_key, "C2", "a free key is acquired with the granted TTL, a token and a fresh owner id";
    held_key_refuses_second_acquirer, "C2", "a held key refuses a second acquirer, from another provider and from the same one";
    concurrent_acquirers_exactly_one_wins, "C2", "16 contenders on their own providers, 20 rounds: exactly one wins each round";
    concurrent_takeover_of_expired_lease_has_one_winner, "C2", "16 contenders on an expired lease, 3 rounds: exactly one takes it over each round";
    release_frees_key_at_once, "C7", "after release another provider acquires at once";
    double_release_is_not_held, "C7", "a second release of the same lease is NotHeld";
    release_of_expired_lease_is_not_held, "C7", "releasing a lease that expired, with nobody taking the key, is NotHeld and leaves the key free";
    stale_release_after_takeover_keeps_new_holder, "C5", "a stale release after expiry and takeover is NotHeld and the new holder keeps its lease";
    forged_owner_touches_nothing, "C5", "a lease with the holder's token but another owner id cannot extend or release; one rebuilt with the right owner and token (another holder label) can";
    extend_pushes_expiry_past_original_ttl, "C6", "extend pushes expiry to store-now + ttl, past the original TTL";
    extend_after_expiry_fails, "C6", "extending an expired lease is Lost even if nobody took the key";
    stale_extend_after_takeover_fails, "C5", "a stale extend after takeover is Lost and leaves the new holder alone";
    expired_lease_is_taken_over_in_time, "C4", "an unrenewed lease is held until its TTL and free within TTL + declared slack";
    tokens_increase_after_release, "C8", "tokens strictly increase on re-acquire after release";
    tokens_increase_on_takeover, "C8", "tokens strictly increase on takeover after expiry";
    tokens_increase_across_instances, "C8", "tokens strictly increase across provider instances";
    extend_keeps_token, "C6", "extend keeps the token and the owner";
    keys_are_independent, "C1", "leases on different keys, including prefixes of each other, are independent";
    namespaces_are_isolated, "C1", "providers in different namespaces never see each other's leases";
    unusual_keys_work_and_stay_distinct, "C1", "slashes, dots, glob and brace characters, quotes, whitespace, emoji, 512-byte keys and escaping look-alikes are distinct keys";
    unusual_namespaces_work_and_stay_distinct, "C1", "namespaces with /, %, |, spaces and unicode are isolated, also from keys that spell the same path";
    invalid_keys_are_rejected, "C1", "empty, over-long and NUL keys are InvalidKey";
    invalid_ttls_are_rejected, "C3", "zero, below-minimum and above-maximum TTLs are InvalidTtl and change nothing";
    granted_ttl_follows_capabilities, "C3", "the granted TTL is the request rounded up to the declared granularity";
    inspect_reports_holder_and_free_key, "C13", "inspect reports the holder's token and remaining TTL, and nothing for a free key";
    holder_label_is_recorded_and_kept_by_extend, "C13", "inspect shows the holder label the lease recorded (this process's user@host:pid), also after extends with the same and another TTL";
    waiter_wakes_promptly_on_release, "C9", "a waiter gets the key promptly after release, long before the holder's TTL";
    waiter_times_out_while_held, "C9", "a waiter gives up when its wait runs out while the key stays held";
    waiter_gets_key_after_crashed_holder_expires, "C9", "a waiter gets the key once a crashed holder's lease expires";
    dropped_wait_leaks_no_lease, "C9", "acquires dropped at any point leave no lease behind";
    waiter_gets_free_key_when_watch_fails, "C9", "a waiter whose watch cannot be set up gets a free key at once, and a held one when it expires";
    waiter_store_calls_are_bounded, "C9", "a waiter makes few store calls while a key is held, also in the holder's last second";
    guard_renews_past_several_ttls, "C11", "a guard keeps its lease across several TTLs";
    guard_fires_lost_signal_by_local_validity, "C11", "a cut-off holder's guard fires lost before local validity ends, and the key is then taken over";
    min_hold_keeps_key_after_a_short_job, "C11", "run_with_lease's minimum hold keeps the key from others until it ends, also where leases end with the session";
    local_validity_never_exceeds_sent_plus_ttl, "C10", "local validity is before send time + granted TTL and before the store's expiry";
    fence_gate_rejects_older_holder, "C12", "the fence gate admits the newer holder and rejects the older one's late write";
    unreachable_store_is_unavailable, "C14", "a store that is down gives Unavailable within the provider's timeout";
}

async fn acquire_free_key(ctx: Ctx) -> CaseResult {
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

async fn held_key_refuses_second_acquirer(ctx: Ctx) -> CaseResult {
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

async fn concurrent_acquirers_exactly_one_wins(ctx: Ctx) -> CaseResult {
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

async fn release_frees_key_at_once(ctx: Ctx) -> CaseResult {
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

async fn double_release_is_not_held(ctx: Ctx) -> CaseResult {
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

async fn stale_release_after_takeover_keeps_new_holder(ctx: Ctx) -> CaseResult {
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

async fn extend_pushes_expiry_past_original_ttl(ctx: Ctx) -> CaseResult {
    let p1 = ctx.provider().await?;
    let p2 = ctx.provider().await?;
    let key = ctx.key("extend")?;
    let ttl = short_ttl(&*p1);
    let a = must_acquire(&*p1, &key, ttl).await?;
    let acquired = Instant::now();
    sleep(ttl / 2).await;
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

async fn extend_after_expiry_fails(ctx: Ctx) -> CaseResult {
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

async fn stale_extend_after_takeover_fails(ctx: Ctx) -> CaseResult {
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

async fn expired_lease_is_taken_over_in_time(ctx: Ctx) -> CaseResult {
    let p1 = ctx.provider().await?;
    let p2 = ctx.provider().await?;
    let key = ctx.key("expiry")?;
    let ttl = short_ttl(&*p1);
    // Warm both providers up (connections, table creation) so that the timed
    // part measures the store, not first-use set-up.
    p1.inspect(&key).await?;
    p2.inspect(&key).await?;
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

async fn tokens_increase_after_release(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let key = ctx.key("reacquire")?;
    let ttl = long_ttl(&*p);
    let mut last = None;
    for _ in 0..5 {
        let l = must_acquire(&*p, &key, ttl).await?;
        if let Some(prev) = last {
            check!(l.token() > prev, "token {} after {prev}", l.token());
        }
        last = Some(l.token());
        p.release(&l).await?;
    }
    Ok(())
}

async fn tokens_increase_on_takeover(ctx: Ctx) -> CaseResult {
    let key = ctx.key("takeover-token")?;
    let t = takeover(&ctx, &key).await?;
    check!(
        t.new.token() > t.old.token(),
        "token {} after {}",
        t.new.token(),
        t.old.token()
    );
    t.new_provider.release(&t.new).await?;
    Ok(())
}

async fn tokens_increase_across_instances(ctx: Ctx) -> CaseResult {
    let providers: Vec<_> = join_all((0..4).map(|_| ctx.provider()))
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let key = ctx.key("instances")?;
    let ttl = long_ttl(&*providers[0]);
    let mut last = None;
    for round in 0..3 {
        for (i, p) in providers.iter().enumerate() {
            let l = must_acquire(&**p, &key, ttl).await?;
            if let Some(prev) = last {
                check!(
                    l.token() > prev,
                    "round {round}, instance {i}: token {} after {prev}",
                    l.token()
                );
            }
            last = Some(l.token());
            p.release(&l).await?;
        }
    }
    Ok(())
}

async fn extend_keeps_token(ctx: Ctx) -> CaseResult {
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

async fn keys_are_independent(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let ttl = long_ttl(&*p);
    let keys = [
        ctx.key("a")?,
        ctx.key("ab")?,
        ctx.key("a/b")?,
        ctx.key("b")?,
    ];
    let mut leases = Vec::new();
    for k in &keys {
        leases.push(must_acquire(&*p, k, ttl).await?);
    }
    p.release(&leases[0]).await?;
    for (k, l) in keys.iter().zip(&leases).skip(1) {
        let info = p.inspect(k).await?;
        check!(
            info.map(|i| i.token) == Some(l.token()),
            "releasing {:?} changed {k:?}",
            keys[0]
        );
    }
    check!(
        p.inspect(&keys[0]).await?.is_none(),
        "released key still shows a holder"
    );
    for l in &leases[1..] {
        p.release(l).await?;
    }
    Ok(())
}

async fn namespaces_are_isolated(ctx: Ctx) -> CaseResult {
    let a = ctx.provider_in("a").await?;
    let b = ctx.provider_in("b").await?;
    let ab = ctx.provider_in("a:b").await?;
    let key = ctx.key("shared-name")?;
    let ttl = long_ttl(&*a);
    let la = must_acquire(&*a, &key, ttl).await?;
    let lb = must_acquire(&*b, &key, ttl).await?;
    let lab = must_acquire(&*ab, &key, ttl).await?;
    check!(
        a.inspect(&key).await?.map(|i| i.token) == Some(la.token()),
        "namespace a sees another holder"
    );
    a.release(&la).await?;
    check!(
        b.inspect(&key).await?.map(|i| i.token) == Some(lb.token()),
        "release in a freed b"
    );
    match b.release(&la).await {
        Err(LeaseError::NotHeld { .. }) => {}
        other => {
            return Err(CaseError(format!(
                "a lease from namespace a released in b: {other:?}"
            )));
        }
    }
    b.release(&lb).await?;
    ab.release(&lab).await?;
    Ok(())
}

async fn unusual_keys_work_and_stay_distinct(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let ttl = long_ttl(&*p);
    let names = [
        "/",
        "//",
        "a/b",
        "a%2Fb",
        "a\\/b",
        "a_b",
        "a b",
        "a\tb",
        "a\nb",
        ".",
        "..",
        "../x",
        "%2E%2E",
        "*",
        "?",
        "[ab]",
        "{x}",
        "{",
        "}",
        "a{b}c",
        "'",
        "\"",
        "`",
        "' OR 1=1 --",
        "%",
        "_",
        "\\",
        " ",
        "  ",
        "é",
        "e\u{301}",
        "🔒",
        "zookeeper",
        "A",
        "a",
        "a:b",
        "a::b",
        "a|b",
        "a.b",
    ];
    let mut keys: Vec<LeaseKey> = names.iter().map(|n| ctx.key(n)).collect::<Result<_, _>>()?;
    // Keys that are entirely unusual, without the case prefix.
    keys.push(LeaseKey::new(format!("{}\u{1F600}", ctx.prefix))?);
    // Two keys of exactly 512 bytes that differ only in their last byte.
    let base = format!("{}/", ctx.prefix);
    let fill = MAX_KEY_BYTES - base.len() - 1;
    keys.push(LeaseKey::new(format!(
        "{base}{}x",
        "é".repeat(fill / 2) + &"y".repeat(fill % 2)
    ))?);
    keys.push(LeaseKey::new(format!(
        "{base}{}z",
        "é".repeat(fill / 2) + &"y".repeat(fill % 2)
    ))?);
    check!(
        keys[keys.len() - 1].as_str().len() == MAX_KEY_BYTES,
        "test bug: not a 512-byte key"
    );
    let mut leases = Vec::new();
    for k in &keys {
        match p.try_acquire(k, ttl).await? {
            TryAcquire::Acquired(l) => leases.push(l),
            TryAcquire::Held { .. } => {
                return Err(CaseError(format!("key {k:?} collided with an earlier key")));
            }
        }
    }
    for l in &leases {
        let info = p.inspect(l.key()).await?;
        check!(
            info.map(|i| i.token) == Some(l.token()),
            "inspect of {:?} shows another lease",
            l.key()
        );
    }
    for l in &leases {
        p.release(l).await?;
        check!(
            p.inspect(l.key()).await?.is_none(),
            "{:?} still held after release",
            l.key()
        );
    }
    Ok(())
}

async fn invalid_keys_are_rejected(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    for bad in [
        String::new(),
        "k".repeat(MAX_KEY_BYTES + 1),
        "nul\0inside".into(),
        "\0".into(),
    ] {
        match LeaseKey::new(&bad) {
            Err(LeaseError::InvalidKey { reason }) => check!(!reason.is_empty(), "empty reason"),
            other => return Err(CaseError(format!("key {bad:?} gave {other:?}"))),
        }
    }
    // The longest valid key works end to end.
    let edge = LeaseKey::new(format!(
        "{}{}",
        ctx.prefix,
        "k".repeat(MAX_KEY_BYTES - ctx.prefix.len())
    ))?;
    let l = must_acquire(&*p, &edge, long_ttl(&*p)).await?;
    p.release(&l).await?;
    Ok(())
}

async fn invalid_ttls_are_rejected(ctx: Ctx) -> CaseResult {
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

async fn granted_ttl_follows_capabilities(ctx: Ctx) -> CaseResult {
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

async fn inspect_reports_holder_and_free_key(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let other = ctx.provider().await?;
    let key = ctx.key("inspect")?;
    check!(
        p.inspect(&key).await?.is_none(),
        "a never-used key shows a holder"
    );
    let ttl = long_ttl(&*p);
    let l = must_acquire(&*p, &key, ttl).await?;
    let info = other
        .inspect(&key)
        .await?
        .ok_or_else(|| CaseError("held key shows no holder".into()))?;
    check!(
        info.token == l.token(),
        "inspect token {} != {}",
        info.token,
        l.token()
    );
    let gran = p.capabilities().ttl_granularity;
    check!(
        info.remaining <= ttl + gran,
        "remaining {:?} above TTL {ttl:?}",
        info.remaining
    );
    check!(
        info.remaining + gran + TOLERANCE >= ttl,
        "remaining {:?} far below TTL {ttl:?}",
        info.remaining
    );
    if let Some(owner) = info.owner {
        check!(owner == l.owner(), "inspect owner differs");
    }
    check!(
        info.holder.as_deref() == Some(l.holder()),
        "inspect holder {:?} != the lease's {:?}",
        info.holder,
        l.holder()
    );
    // Inspect changes nothing: still held, same token.
    must_be_held(&*other, &key, ttl).await?;
    p.release(&l).await?;
    check!(
        other.inspect(&key).await?.is_none(),
        "released key shows a holder"
    );
    Ok(())
}

async fn forged_owner_touches_nothing(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let key = ctx.key("forged-owner")?;
    let ttl = long_ttl(&*p);
    let l = must_acquire(&*p, &key, ttl).await?;
    let rebuilt = |owner: lease_api::OwnerId| {
        lease_api::Lease::new(key.clone(), l.token(), owner, ttl, Instant::now())
            .with_handle(l.handle())
            .with_holder(Arc::from("somebody else@elsewhere:1"))
    };
    let forged = rebuilt(lease_api::OwnerId::random());
    match p.extend(&forged, ttl).await {
        Err(LeaseError::Lost { .. }) => {}
        other => return Err(CaseError(format!("forged extend: {other:?}"))),
    }
    match p.release(&forged).await {
        Err(LeaseError::NotHeld { .. }) => {}
        other => return Err(CaseError(format!("forged release: {other:?}"))),
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

async fn holder_label_is_recorded_and_kept_by_extend(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let other = ctx.provider().await?;
    let key = ctx.key("holder-label")?;
    let ttl = long_ttl(&*p);
    let l = must_acquire(&*p, &key, ttl).await?;
    let label = lease_api::holder();
    check!(
        l.holder() == &*label,
        "the lease says holder {:?}, the process is {label:?}",
        l.holder()
    );
    let shown = |info: Option<lease_api::LeaseInfo>| info.and_then(|i| i.holder);
    let seen = shown(other.inspect(&key).await?);
    check!(
        seen.as_deref() == Some(&*label),
        "inspect shows holder {seen:?}, expected {label:?}"
    );
    // The same TTL (etcd: a keep-alive) and another one (etcd: a new etcd
    // lease; ZooKeeper and Redlock rewrite the holder's record).
    let gran = p
        .capabilities()
        .ttl_granularity
        .max(Duration::from_millis(1));
    let l = p.extend(&l, ttl).await?;
    let l = p.extend(&l, ttl + gran).await?;
    check!(
        l.holder() == &*label,
        "extend changed the lease's holder label"
    );
    let seen = shown(other.inspect(&key).await?);
    check!(
        seen.as_deref() == Some(&*label),
        "after extends inspect shows holder {seen:?}, expected {label:?}"
    );
    p.release(&l).await?;
    Ok(())
}

async fn waiter_wakes_promptly_on_release(ctx: Ctx) -> CaseResult {
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

async fn waiter_times_out_while_held(ctx: Ctx) -> CaseResult {
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

async fn waiter_gets_key_after_crashed_holder_expires(ctx: Ctx) -> CaseResult {
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

async fn dropped_wait_leaks_no_lease(ctx: Ctx) -> CaseResult {
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

async fn guard_renews_past_several_ttls(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let other = ctx.provider().await?;
    let key = ctx.key("guard")?;
    let ttl = short_ttl(&*p);
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

async fn guard_fires_lost_signal_by_local_validity(ctx: Ctx) -> CaseResult {
    let link = Partition::new(ctx.provider().await?);
    let other = ctx.provider().await?;
    let key = ctx.key("cut-off")?;
    let ttl = short_ttl(&*other);
    let lease = must_acquire(&*link, &key, ttl).await?;
    let valid_until = lease.valid_until();
    let guard = LeaseGuard::with_config(link.clone(), lease.clone(), GuardConfig::default());
    link.cut(true);
    let reason = tokio::time::timeout(ttl + TOLERANCE, guard.lost())
        .await
        .map_err(|_| CaseError("the guard never fired its lost signal".into()))?;
    let fired = Instant::now();
    // The guard fires ahead of validity by its margin, never at or after it.
    check!(
        fired < valid_until,
        "lost fired {:?} after local validity",
        fired - valid_until
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
    link.cut(false);
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

async fn local_validity_never_exceeds_sent_plus_ttl(ctx: Ctx) -> CaseResult {
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

async fn fence_gate_rejects_older_holder(ctx: Ctx) -> CaseResult {
    let key = ctx.key("fence")?;
    let t = takeover(&ctx, &key).await?;
    let gate = FenceGate::new();
    check!(
        gate.admit(&key, t.old.token()).is_ok(),
        "the first holder's write was refused"
    );
    check!(
        gate.admit(&key, t.new.token()).is_ok(),
        "the new holder's write was refused"
    );
    match gate.admit(&key, t.old.token()) {
        Err(stale) => check!(stale.highest == t.new.token(), "gate reports {stale}"),
        Ok(()) => {
            return Err(CaseError(
                "the stale holder's late write was admitted".into(),
            ));
        }
    }
    t.new_provider.release(&t.new).await?;
    Ok(())
}

async fn unreachable_store_is_unavailable(ctx: Ctx) -> CaseResult {
    let bound = ctx.factory.unavailable_within() + TOLERANCE;
    let started = Instant::now();
    let p = match tokio::time::timeout(bound, ctx.factory.unreachable()).await {
        Err(_) => {
            return Err(CaseError(format!(
                "building a provider for a down store hung past {bound:?}"
            )));
        }
        Ok(Err(e @ LeaseError::Unavailable { .. })) => {
            // Refusing to build against a down store is a fine answer too.
            check!(
                started.elapsed() < bound,
                "took {:?}: {e}",
                started.elapsed()
            );
            return Ok(());
        }
        Ok(r) => r?,
    };
    let key = ctx.key("down")?;
    let ttl = long_ttl(&*p);
    let started = Instant::now();
    match tokio::time::timeout(bound, p.try_acquire(&key, ttl)).await {
        Err(_) => {
            return Err(CaseError(format!(
                "try_acquire on a down store hung past {bound:?}"
            )));
        }
        Ok(Err(LeaseError::Unavailable { .. })) => {}
        Ok(other) => {
            return Err(CaseError(format!(
                "try_acquire on a down store gave {other:?}"
            )));
        }
    }
    check!(
        started.elapsed() < bound,
        "failing took {:?}",
        started.elapsed()
    );
    match tokio::time::timeout(bound, p.inspect(&key)).await {
        Err(_) => Err(CaseError(format!(
            "inspect on a down store hung past {bound:?}"
        ))),
        Ok(Err(LeaseError::Unavailable { .. })) => Ok(()),
        Ok(other) => Err(CaseError(format!("inspect on a down store gave {other:?}"))),
    }
}

async fn release_of_expired_lease_is_not_held(ctx: Ctx) -> CaseResult {
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

async fn concurrent_takeover_of_expired_lease_has_one_winner(ctx: Ctx) -> CaseResult {
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

async fn unusual_namespaces_work_and_stay_distinct(ctx: Ctx) -> CaseResult {
    // Pairs that a naive "namespace/key" or "namespace|key" join would merge.
    let pairs = [
        ("a/b", "c", "a", "b/c"),
        ("a|b", "c", "a", "b|c"),
        ("a%2Fb", "c", "a/b", "c"),
        ("a b", "c d", "a", "b c d"),
        ("ünï🔒", "k", "ünï", "🔒/k"),
        ("a:b", "c", "a", "b:c"),
    ];
    for (ns1, k1, ns2, k2) in pairs {
        let p1 = ctx.provider_in(ns1).await?;
        let p2 = ctx.provider_in(ns2).await?;
        let (key1, key2) = (LeaseKey::new(k1)?, LeaseKey::new(k2)?);
        let ttl = long_ttl(&*p1);
        let l1 = must_acquire(&*p1, &key1, ttl).await?;
        let l2 = must_acquire(&*p2, &key2, ttl).await.map_err(|e| {
            CaseError(format!(
                "({ns1:?}, {k1:?}) and ({ns2:?}, {k2:?}) collide: {e}"
            ))
        })?;
        // The same namespace still sees its own lease.
        let p1b = ctx.provider_in(ns1).await?;
        must_be_held(&*p1b, &key1, ttl).await?;
        check!(
            p1b.inspect(&key1).await?.map(|i| i.token) == Some(l1.token()),
            "namespace {ns1:?} does not see its own lease"
        );
        p1.release(&l1).await?;
        p2.release(&l2).await?;
    }
    Ok(())
}

async fn waiter_gets_free_key_when_watch_fails(ctx: Ctx) -> CaseResult {
    let waiter = Instrumented::new(ctx.provider().await?);
    waiter.fail_watch(true);
    let w: Arc<dyn LeaseProvider> = waiter.clone();
    let holder = ctx.provider().await?;
    let key = ctx.key("no-watch")?;
    let ttl = short_ttl(&*holder);
    let wait = expiry_bound(&*holder, ttl) * 2;
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

async fn waiter_store_calls_are_bounded(ctx: Ctx) -> CaseResult {
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
    let calls = waiter.try_acquires();
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
    let before = waiter.try_acquires();
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
    let calls = waiter.try_acquires() - before;
    let secs = started.elapsed().as_secs_f64();
    let bound = 6 + (secs * 4.0) as u64;
    check!(
        calls <= bound,
        "{calls} try_acquire calls in {secs:.2} s waiting for a lease of {ttl:?} to expire (bound {bound})"
    );
    w.release(&l).await?;
    Ok(())
}

async fn min_hold_keeps_key_after_a_short_job(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let other = ctx.provider().await?;
    let key = ctx.key("min-hold")?;
    let ttl = short_ttl(&*p);
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

//! The generic helpers (acquire, guard, run-under-lease) on the in-memory
//! provider, mostly with paused tokio time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use lease_api::backend::{DEFAULT_MAX_TTL, Hook, Layered, Op};
use lease_api::*;
use tokio::time::{Instant, sleep};

/// A hook over a real provider that makes `extend` fail on demand, the way a
/// store that went away or a takeover would.
#[derive(Debug, Default)]
struct FailingExtend {
    mode: AtomicU8, // PASS, DOWN, REVOKED or PANIC
    /// try_acquire: PASS, DOWN (Unavailable) or REFUSED (a permanent Backend error).
    acquire_mode: AtomicU8,
    watch_fails: AtomicBool,
    /// The next watch fails (transiently), the ones after work.
    watch_fails_once: AtomicBool,
}

const PASS: u8 = 0;
const DOWN: u8 = 1;
const REVOKED: u8 = 2;
const PANIC: u8 = 3;
const REFUSED: u8 = 4;

impl FailingExtend {
    /// The in-memory provider, passing everything through until told otherwise.
    fn new() -> Arc<Layered<MemoryProvider, FailingExtend>> {
        Arc::new(Layered::with_hook(
            Arc::new(MemoryProvider::new()),
            FailingExtend::default(),
        ))
    }
}

fn injected_outage() -> LeaseError {
    LeaseError::Unavailable {
        message: "injected outage".into(),
        source: None,
    }
}

impl Hook for FailingExtend {
    async fn before(&self, op: &Op<'_>) -> Result<()> {
        match *op {
            Op::TryAcquire { .. } => match self.acquire_mode.load(Ordering::SeqCst) {
                DOWN => Err(injected_outage()),
                REFUSED => Err(LeaseError::protocol("NOPERM injected: not allowed")),
                _ => Ok(()),
            },
            Op::Extend { lease, .. } => match self.mode.load(Ordering::SeqCst) {
                DOWN => Err(injected_outage()),
                PANIC => panic!("injected panic in extend"),
                REVOKED => Err(LeaseError::Lost {
                    key: lease.key().clone(),
                    token: lease.token(),
                }),
                _ => Ok(()),
            },
            Op::Watch { .. }
                if self.watch_fails.load(Ordering::SeqCst)
                    || self.watch_fails_once.swap(false, Ordering::SeqCst) =>
            {
                Err(injected_outage())
            }
            _ => Ok(()),
        }
    }
}

fn key(s: &str) -> LeaseKey {
    LeaseKey::new(s).unwrap()
}

const TTL: Duration = Duration::from_secs(3);

#[tokio::test(start_paused = true)]
async fn guard_renews_past_several_ttls() {
    let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
    let k = key("renewed");
    let lease = provider
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let token = lease.token();
    let guard = LeaseGuard::new(Arc::clone(&provider), lease);
    sleep(TTL * 5).await;
    assert!(!guard.is_lost());
    let info = provider.inspect(&k).await.unwrap().expect("still held");
    assert_eq!(info.token, token);
    assert!(
        info.remaining > TTL / 2,
        "renewed recently: {:?}",
        info.remaining
    );
    assert!(!provider.try_acquire(&k, TTL).await.unwrap().is_acquired());
    guard.release().await.unwrap();
    assert!(provider.inspect(&k).await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn guard_fires_lost_no_later_than_local_validity_when_store_is_down() {
    let provider = FailingExtend::new();
    let k = key("outage");
    let lease = provider
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let valid_until = lease.valid_until();
    let start = lease.sent_at();
    let guard = LeaseGuard::new(provider.clone(), lease);
    provider.hook().mode.store(DOWN, Ordering::SeqCst);
    let reason = guard.lost().await;
    let fired_at = Instant::now();
    // The default margin: a tenth of the validity window (at most 1 s); tokio
    // timers have millisecond resolution.
    let margin = (valid_until - start) / 10 - Duration::from_millis(1);
    assert!(
        fired_at + margin <= valid_until,
        "fired {:?} before validity ended; the margin is {margin:?}",
        valid_until.saturating_duration_since(fired_at)
    );
    assert!(
        fired_at + TTL / 3 > valid_until,
        "fired long before validity ended"
    );
    assert!(
        matches!(&reason, LostReason::Expired(e) if e.contains("injected outage")),
        "{reason:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn guard_fires_lost_at_once_when_store_says_revoked() {
    let provider = FailingExtend::new();
    let k = key("revoked");
    let lease = provider
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let guard = LeaseGuard::new(provider.clone(), lease.clone());
    provider.hook().mode.store(REVOKED, Ordering::SeqCst);
    let started = Instant::now();
    assert_eq!(guard.lost().await, LostReason::Revoked);
    // At the first renewal (TTL/3), well before validity.
    assert!(Instant::now() - started <= TTL / 3 + Duration::from_millis(1));
    assert!(guard.lost_token().is_cancelled());
    assert!(matches!(
        guard.release().await,
        Ok(()) | Err(LeaseError::NotHeld { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn guard_survives_a_short_outage() {
    let provider = FailingExtend::new();
    let k = key("blip");
    let lease = provider
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let guard = LeaseGuard::new(provider.clone(), lease);
    provider.hook().mode.store(DOWN, Ordering::SeqCst);
    sleep(TTL / 2).await; // one renewal failed, local validity not yet over
    provider.hook().mode.store(PASS, Ordering::SeqCst);
    sleep(TTL * 3).await;
    assert!(!guard.is_lost(), "{:?}", guard.lost_reason());
    guard.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn dropping_a_guard_releases_the_lease() {
    let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
    let k = key("dropped-guard");
    let lease = provider
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    drop(LeaseGuard::new(Arc::clone(&provider), lease));
    sleep(Duration::from_millis(1)).await;
    assert!(provider.inspect(&k).await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn run_with_lease_cancels_the_job_when_the_lease_is_lost() {
    let provider = FailingExtend::new();
    let k = key("job");
    let dropped = Arc::new(AtomicBool::new(false));
    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let flag = Arc::clone(&dropped);
    let p = Arc::clone(&provider);
    let outcome = run_with_lease(
        provider.clone(),
        &k,
        TTL,
        RunOptions::default(),
        |ctx| async move {
            let _marker = SetOnDrop(flag);
            p.hook().mode.store(DOWN, Ordering::SeqCst);
            // A job that would run forever; only the lost signal ends it.
            sleep(Duration::from_secs(3600)).await;
            ctx.token
        },
    )
    .await
    .unwrap();
    assert!(
        matches!(
            outcome,
            RunOutcome::Lost {
                reason: LostReason::Expired(_),
                ..
            }
        ),
        "{outcome:?}"
    );
    assert!(dropped.load(Ordering::SeqCst), "the job future was dropped");
}

#[tokio::test(start_paused = true)]
async fn run_with_lease_releases_after_the_job_and_reports_not_acquired() {
    let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
    let k = key("once");
    let out = run_with_lease(
        Arc::clone(&provider),
        &k,
        TTL,
        RunOptions::default(),
        |ctx| async move { ctx.token.get() * 10 },
    )
    .await
    .unwrap();
    let RunOutcome::Completed { value, token } = out else {
        panic!("{out:?}")
    };
    assert_eq!(value, token.get() * 10);
    assert!(
        provider.inspect(&k).await.unwrap().is_none(),
        "released after the job"
    );

    let held = provider
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let out = run_with_lease(
        Arc::clone(&provider),
        &k,
        TTL,
        RunOptions::default(),
        |_| async { unreachable!() },
    )
    .await
    .unwrap();
    assert!(matches!(out, RunOutcome::NotAcquired));
    provider.release(&held).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn minimum_hold_keeps_the_key_after_a_short_job() {
    let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
    let k = key("cron-slot");
    let started = Instant::now();
    let min_hold = Duration::from_secs(60);
    let options = RunOptions::default().min_hold(min_hold);
    let out = run_with_lease(
        Arc::clone(&provider),
        &k,
        Duration::from_secs(10),
        options,
        |_| async {
            sleep(Duration::from_secs(1)).await;
        },
    )
    .await
    .unwrap();
    assert!(matches!(out, RunOutcome::Completed { .. }));
    // A late instance of the same slot finds the key held...
    sleep(Duration::from_secs(30)).await;
    assert!(!provider.try_acquire(&k, TTL).await.unwrap().is_acquired());
    let info = provider.inspect(&k).await.unwrap().unwrap();
    let until = Instant::now() + info.remaining;
    assert!(until >= started + min_hold && until <= started + min_hold + Duration::from_millis(5));
    // ...and the next slot finds it free, with no process kept alive for it.
    sleep_until_after(started + min_hold).await;
    assert!(provider.try_acquire(&k, TTL).await.unwrap().is_acquired());
}

async fn sleep_until_after(t: Instant) {
    tokio::time::sleep_until(t + Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn waiter_is_woken_by_release_not_by_ttl() {
    let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
    let k = key("handoff");
    let holder = provider
        .try_acquire(&k, Duration::from_secs(60))
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let p = Arc::clone(&provider);
    let k2 = k.clone();
    let waiter = tokio::spawn(async move {
        acquire(
            &p,
            &k2,
            AcquireOptions::ttl(TTL).wait(Duration::from_secs(30)),
        )
        .await
    });
    sleep(Duration::from_millis(100)).await;
    let released_at = Instant::now();
    provider.release(&holder).await.unwrap();
    let lease = waiter.await.unwrap().unwrap().expect("woken by release");
    assert!(Instant::now() - released_at < Duration::from_millis(10));
    assert!(lease.token() > holder.token());
}

#[tokio::test(start_paused = true)]
async fn waiter_gives_up_at_its_limit() {
    let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
    let k = key("busy");
    let _holder = provider
        .try_acquire(&k, Duration::from_secs(60))
        .await
        .unwrap();
    let started = Instant::now();
    let got = acquire(
        &provider,
        &k,
        AcquireOptions::ttl(TTL).wait(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    assert!(got.is_none());
    let waited = Instant::now() - started;
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_millis(2100),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn invalid_keys_and_ttls_are_clear_errors() {
    let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
    let k = key("k");
    for ttl in [Duration::ZERO, DEFAULT_MAX_TTL + Duration::from_secs(1)] {
        let err = provider.try_acquire(&k, ttl).await.unwrap_err();
        assert!(matches!(err, LeaseError::InvalidTtl { .. }), "{err}");
        assert!(err.to_string().contains("TTL"), "{err}");
    }
    let lease = provider
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    assert!(matches!(
        provider.extend(&lease, Duration::ZERO).await,
        Err(LeaseError::InvalidTtl { .. })
    ));
    // The bad call changed nothing.
    assert_eq!(
        provider.inspect(&k).await.unwrap().unwrap().token,
        lease.token()
    );
    assert!(matches!(
        LeaseKey::new(""),
        Err(LeaseError::InvalidKey { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn stale_holder_cannot_touch_the_next_holder() {
    let provider = MemoryProvider::new();
    let k = key("stale");
    let old = provider
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    sleep(TTL).await;
    let new = provider
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    assert!(new.token() > old.token());
    assert!(matches!(
        provider.release(&old).await,
        Err(LeaseError::NotHeld { .. })
    ));
    assert!(matches!(
        provider.extend(&old, TTL).await,
        Err(LeaseError::Lost { .. })
    ));
    assert_eq!(
        provider.inspect(&k).await.unwrap().unwrap().token,
        new.token()
    );
    provider.release(&new).await.unwrap();
    assert!(matches!(
        provider.release(&new).await,
        Err(LeaseError::NotHeld { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn waiting_rides_out_a_store_blip_but_no_wait_reports_it() {
    let provider = Arc::new(MemoryProvider::new());
    let k = key("blip-wait");
    provider.store().set_down(true);
    let err = acquire(&provider, &k, AcquireOptions::ttl(TTL))
        .await
        .unwrap_err();
    assert!(matches!(err, LeaseError::Unavailable { .. }), "{err}");
    let p = Arc::clone(&provider);
    let k2 = k.clone();
    let waiter = tokio::spawn(async move {
        acquire(
            &p,
            &k2,
            AcquireOptions::ttl(TTL).wait(Duration::from_secs(10)),
        )
        .await
    });
    sleep(Duration::from_secs(2)).await;
    provider.store().set_down(false);
    let lease = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("acquired once the store came back");
    assert!(Instant::now() < lease.sent_at() + Duration::from_secs(2));
    // A wait that ends during the outage reports the outage, not "held".
    provider.store().set_down(true);
    let err = acquire(
        &provider,
        &key("other"),
        AcquireOptions::ttl(TTL).wait(Duration::from_secs(1)),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, LeaseError::Unavailable { .. }), "{err}");
}

#[tokio::test(start_paused = true)]
async fn guard_with_renew_interval_beyond_the_ttl_still_keeps_the_lease() {
    let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
    let k = key("renew-every-too-long");
    let lease = provider
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let config = GuardConfig::default().renew_every(TTL * 2);
    let guard = LeaseGuard::with_config(Arc::clone(&provider), lease, config);
    sleep(TTL * 5).await;
    assert!(!guard.is_lost(), "{:?}", guard.lost_reason());
    assert!(!provider.try_acquire(&k, TTL).await.unwrap().is_acquired());
    guard.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn guard_fires_lost_when_its_renewal_task_dies() {
    let provider = FailingExtend::new();
    let k = key("renewal-panics");
    let lease = provider
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let valid_until = lease.valid_until();
    let guard = LeaseGuard::new(provider.clone(), lease);
    provider.hook().mode.store(PANIC, Ordering::SeqCst);
    let reason = tokio::time::timeout_at(valid_until, guard.lost())
        .await
        .expect("lost must fire before local validity ends when the renewal task dies");
    assert!(guard.is_lost());
    assert!(matches!(reason, LostReason::Expired(_)), "{reason:?}");
}

#[tokio::test(start_paused = true)]
async fn huge_durations_never_panic() {
    let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
    let k = key("huge");
    // Wait forever for a free key, and for a key released later.
    let lease = acquire(&provider, &k, AcquireOptions::ttl(TTL).wait(Duration::MAX))
        .await
        .unwrap()
        .unwrap();
    let p2 = Arc::clone(&provider);
    let k2 = k.clone();
    let waiter = tokio::spawn(async move {
        acquire(&p2, &k2, AcquireOptions::ttl(TTL).wait(Duration::MAX)).await
    });
    sleep(Duration::from_millis(100)).await;
    provider.release(&lease).await.unwrap();
    let second = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("acquired after release");
    // A guard with every interval at its maximum.
    let config = GuardConfig::default()
        .renew_every(Duration::MAX)
        .retry_every(Duration::MAX)
        .lost_margin(Duration::MAX)
        .keep_on_drop(false);
    let guard = LeaseGuard::with_config(Arc::clone(&provider), second, config);
    sleep(TTL * 3).await;
    assert!(!guard.is_lost(), "{:?}", guard.lost_reason());
    guard.release().await.unwrap();
    // A minimum hold beyond any TTL: held as long as the store allows, no panic.
    let options = RunOptions::default().min_hold(Duration::MAX);
    let outcome = run_with_lease(Arc::clone(&provider), &k, TTL, options, |_| async {})
        .await
        .unwrap();
    assert!(matches!(outcome, RunOutcome::Completed { .. }));
    assert!(!provider.try_acquire(&k, TTL).await.unwrap().is_acquired());
}

#[tokio::test(start_paused = true)]
async fn acquire_fails_fast_on_a_permanent_error_and_retries_a_transient_one() {
    let provider = FailingExtend::new();
    let k = key("permanent");
    provider
        .hook()
        .acquire_mode
        .store(REFUSED, Ordering::SeqCst);
    let started = Instant::now();
    let err = acquire(
        &provider,
        &k,
        AcquireOptions::ttl(TTL).wait(Duration::from_secs(60)),
    )
    .await
    .unwrap_err();
    assert!(!err.is_transient(), "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(1),
        "retried a permanent error for {:?}",
        started.elapsed()
    );
    provider.hook().acquire_mode.store(DOWN, Ordering::SeqCst);
    let started = Instant::now();
    let err = acquire(
        &provider,
        &k,
        AcquireOptions::ttl(TTL).wait(Duration::from_secs(5)),
    )
    .await
    .unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "gave up on a transient error after {:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn acquire_gets_the_key_when_watching_fails() {
    let provider = FailingExtend::new();
    provider.hook().watch_fails.store(true, Ordering::SeqCst);
    let k = key("no-watch");
    let lease = acquire(
        &provider,
        &k,
        AcquireOptions::ttl(TTL).wait(Duration::from_secs(2)),
    )
    .await
    .unwrap()
    .expect("a free key");
    // Held by someone else: the waiter falls back to the holder's TTL.
    let p2 = Arc::clone(&provider);
    let k2 = k.clone();
    let started = Instant::now();
    let waiter =
        tokio::spawn(
            async move { acquire(&p2, &k2, AcquireOptions::ttl(TTL).wait(TTL * 2)).await },
        );
    let second = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("acquired once the first lease expired");
    assert!(second.token() > lease.token());
    assert!(
        started.elapsed() <= TTL + Duration::from_millis(50),
        "{:?}",
        started.elapsed()
    );
}

/// The watch's set-up fails once for a reason that passes (the subscriber's
/// connection cut while it subscribed, as `CLIENT KILL` can do): the waiter
/// sets the watch up again soon, so a release right after is seen instead of
/// slept through until the holder's TTL.
#[tokio::test(start_paused = true)]
async fn waiter_sets_up_a_watch_again_after_a_transient_failure() {
    let provider = FailingExtend::new();
    let k = key("watch-blip");
    let long = Duration::from_secs(60);
    let held = provider
        .try_acquire(&k, long)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    provider
        .hook()
        .watch_fails_once
        .store(true, Ordering::SeqCst);
    let w: Arc<dyn LeaseProvider> = provider.clone();
    let k2 = k.clone();
    let waiter =
        tokio::spawn(async move { acquire(&w, &k2, AcquireOptions::ttl(TTL).wait(long)).await });
    sleep(Duration::from_millis(50)).await;
    assert!(
        !provider.hook().watch_fails_once.load(Ordering::SeqCst),
        "the waiter tried to watch"
    );
    let released = Instant::now();
    provider.release(&held).await.unwrap();
    let got = waiter.await.unwrap().unwrap().expect("acquired");
    assert!(
        released.elapsed() <= Duration::from_millis(500),
        "the waiter took {:?} after the release (holder's TTL {long:?})",
        released.elapsed()
    );
    assert!(got.token() > held.token());
}

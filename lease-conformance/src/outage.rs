//! The outage scenarios every store with a server runs: a crash and restart
//! (unavailable within the declared time, the same provider recovers, tokens
//! keep growing where declared durable), a restart under a waiter, and the
//! waiter's notification connection killed by the server.
//!
//! A store's tests implement [`Outage`] on a private server (never the
//! shared one: the cases stop it) and expand the cases with
//! [`outage_tests!`](crate::outage_tests):
//!
//! ```ignore
//! lease_conformance::outage_tests!(redis_outage, PrivateRedis::start(), notifications);
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lease_api::{AcquireOptions, LeaseError, LeaseKey, LeaseProvider, acquire};

use crate::{CaseError, CaseResult, ProviderFactory};

/// The server process behind an [`Outage`] factory.
pub trait Server: Send + Sync {
    /// Kills it as a crash (SIGKILL, no shutdown): what was committed must
    /// survive as the store declares.
    fn crash(&self);

    /// Stops it cleanly.
    fn stop(&self);

    /// Starts it again on the same address and data; returns once it
    /// accepts connections.
    fn start_again(&self);
}

/// A store the suite may crash, restart and cut connections of: a
/// [`ProviderFactory`] over a server of its own.
#[async_trait]
pub trait Outage: ProviderFactory {
    /// The server the cases crash, stop and start again.
    fn server(&self) -> &dyn Server;

    /// Kills, on the server, the connections that carry release
    /// notifications to waiters (PostgreSQL's LISTEN, Redis's subscribers);
    /// how many it killed. `None` where notifications share the client's
    /// one connection, which [`crash`](Self::crash) already covers.
    async fn kill_notification_connections(&self) -> Option<usize> {
        None
    }

    /// Whether the server was started so that tokens survive a crash: the
    /// provider must declare exactly that (from its probe of the server).
    fn durable(&self) -> bool {
        true
    }

    /// Whether a call to the crashed server may fail as `Timeout` (the
    /// client's request deadline ran out while it reconnects) rather than
    /// `Unavailable`. Default: only `Unavailable`.
    fn may_time_out(&self) -> bool {
        false
    }
}

/// How soon after a release a waiter must hold the key in these cases, far
/// below the TTL a waiter without a working notification waits for.
pub const WOKEN_WITHIN: Duration = Duration::from_secs(5);

fn ensure(ok: bool, what: impl FnOnce() -> String) -> CaseResult {
    if ok { Ok(()) } else { Err(CaseError(what())) }
}

/// Retries `f` while the store recovers (30 s at most).
async fn until_ok<T, F, Fut>(mut f: F) -> Result<T, CaseError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LeaseError>>,
{
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(_) if Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(CaseError(format!("the provider did not recover: {e}"))),
        }
    }
}

/// Whether `answer` is what a call to a server that is down must give.
fn down<T>(answer: &lease_api::Result<T>, may_time_out: bool) -> bool {
    match answer {
        Err(LeaseError::Unavailable { .. }) => true,
        Err(LeaseError::Timeout { .. }) => may_time_out,
        _ => false,
    }
}

fn key(name: &str) -> Result<LeaseKey, CaseError> {
    Ok(LeaseKey::new(format!(
        "{name}-{}",
        lease_api::backend::OwnerId::random().to_hex()
    ))?)
}

fn ttl(p: &dyn LeaseProvider) -> Duration {
    p.capabilities().practical_ttl(Duration::from_secs(30))
}

async fn namespace_provider<F: Outage>(f: &F) -> Result<Arc<dyn LeaseProvider>, CaseError> {
    let ns = format!("outage-{}", lease_api::backend::OwnerId::random().to_hex());
    Ok(f.provider(&ns).await?)
}

/// The waiter's lease: it must have got the key within [`WOKEN_WITHIN`] of
/// `released`, with a token above the holder's.
async fn woken(
    waiting: tokio::task::JoinHandle<lease_api::Result<Option<lease_api::Lease>>>,
    released: Instant,
    holder: lease_api::FencingToken,
    ttl: Duration,
) -> Result<lease_api::Lease, CaseError> {
    let got = waiting
        .await
        .map_err(|e| CaseError(format!("the waiter panicked: {e}")))??
        .ok_or_else(|| CaseError("the waiter did not get the key".into()))?;
    let took = released.elapsed();
    ensure(took < WOKEN_WITHIN, || {
        format!("the waiter took {took:?} after the release (TTL {ttl:?})")
    })?;
    ensure(got.token() > holder, || {
        format!("the waiter's token {} after {holder}", got.token())
    })?;
    Ok(got)
}

/// Spawns `acquire` of `key` on `p`, waiting up to `wait`.
fn waiter(
    p: &Arc<dyn LeaseProvider>,
    key: &LeaseKey,
    ttl: Duration,
    wait: Duration,
) -> tokio::task::JoinHandle<lease_api::Result<Option<lease_api::Lease>>> {
    let (p, key) = (Arc::clone(p), key.clone());
    tokio::spawn(async move { acquire(&p, &key, AcquireOptions::ttl(ttl).wait(wait)).await })
}

/// A crash: while the server is down every call fails as unavailable within
/// [`ProviderFactory::unavailable_within`] (three times over, acquire and
/// inspect); the same provider, not rebuilt, works again once it is back,
/// and the acquires that failed meanwhile left no lease behind;
/// where the provider declares tokens durable (and it must declare what the
/// server was started with) they keep growing across the crash; and waiting
/// works again (a waiter is woken within [`WOKEN_WITHIN`] of a release).
///
/// # Errors
/// A description of the first promise broken.
pub async fn crash_and_restart<F: Outage>(f: &F) -> CaseResult {
    let p = namespace_provider(f).await?;
    let k = key("crash")?;
    let ttl = ttl(&*p);
    let mut last = 0;
    for _ in 0..3 {
        // A fresh server may still be electing itself leader.
        let lease = until_ok(|| p.try_acquire(&k, ttl))
            .await?
            .into_lease()
            .ok_or_else(|| CaseError("a fresh key was held".into()))?;
        p.release(&lease).await?;
        last = lease.token().get();
    }
    let durable = p.capabilities().durable_tokens.is_durable();
    ensure(durable == f.durable(), || {
        format!(
            "the server was started {}durable, the provider declares {:?}",
            if f.durable() { "" } else { "not " },
            p.capabilities().durable_tokens
        )
    })?;

    f.server().crash();
    for _ in 0..3 {
        let started = Instant::now();
        let err = p.try_acquire(&k, ttl).await;
        ensure(down(&err, f.may_time_out()), || {
            format!("an acquire on a crashed server: {err:?}")
        })?;
        ensure(started.elapsed() < f.unavailable_within(), || {
            format!(
                "an acquire on a crashed server took {:?}, more than {:?}",
                started.elapsed(),
                f.unavailable_within()
            )
        })?;
        let inspected = p.inspect(&k).await;
        ensure(down(&inspected, f.may_time_out()), || {
            format!("an inspect on a crashed server: {inspected:?}")
        })?;
    }

    f.server().start_again();
    // Waits for the server with a call that changes nothing, and no acquire
    // that failed during the outage may have left a lease behind.
    let seen = until_ok(|| p.inspect(&k)).await?;
    ensure(seen.is_none(), || {
        format!("after a release, a crash and failed acquires the key shows {seen:?}")
    })?;
    let holder = until_ok(|| p.try_acquire(&k, ttl))
        .await?
        .into_lease()
        .ok_or_else(|| CaseError("the key was held after the restart".into()))?;
    if durable {
        ensure(holder.token().get() > last, || {
            format!("token {} after {last} across a crash", holder.token())
        })?;
    }
    // Waiting works again too: the notification connection reconnects.
    let waiting = waiter(&p, &k, ttl, Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    p.release(&holder).await?;
    let got = woken(waiting, released, holder.token(), ttl).await?;
    p.release(&got).await?;
    Ok(())
}

/// A clean restart while a waiter waits: the holder's lease survives, the
/// holder releases once the server is back (retried while it reconnects),
/// and the waiter, whose notification connection broke, gets the key within
/// [`WOKEN_WITHIN`] of that release, not at the holder's TTL: a release in the
/// reconnect gap is not missed.
///
/// # Errors
/// A description of the first promise broken.
pub async fn a_waiter_outlives_a_restart<F: Outage>(f: &F) -> CaseResult {
    let p = namespace_provider(f).await?;
    let k = key("restart-waiter")?;
    let ttl = ttl(&*p);
    let holder = until_ok(|| p.try_acquire(&k, ttl))
        .await?
        .into_lease()
        .ok_or_else(|| CaseError("a fresh key was held".into()))?;
    let waiting = waiter(&p, &k, ttl, ttl + Duration::from_secs(10));
    // Let the waiter see the key held and set up its watch.
    tokio::time::sleep(Duration::from_millis(300)).await;
    f.server().stop();
    f.server().start_again();
    until_ok(|| p.release(&holder)).await?;
    let released = Instant::now();
    let got = woken(waiting, released, holder.token(), ttl).await?;
    p.release(&got).await?;
    Ok(())
}

/// The server kills the waiter's notification connection while it waits
/// (`pg_terminate_backend`, `CLIENT KILL TYPE pubsub`), and the holder
/// releases at once, while it may still be reconnecting: the waiter gets the
/// key within [`WOKEN_WITHIN`], far below the TTL. Holder and waiter are
/// providers of their own.
///
/// # Errors
/// A description of the first promise broken, or that the store has no
/// notification connection to kill.
pub async fn a_waiter_whose_notifications_are_killed_gets_the_key_promptly<F: Outage>(
    f: &F,
) -> CaseResult {
    let ns = format!("outage-{}", lease_api::backend::OwnerId::random().to_hex());
    let holder_p = f.provider(&ns).await?;
    let waiter_p = f.provider(&ns).await?;
    let k = key("killed-notifications")?;
    let ttl = ttl(&*holder_p);
    let holder = until_ok(|| holder_p.try_acquire(&k, ttl))
        .await?
        .into_lease()
        .ok_or_else(|| CaseError("a fresh key was held".into()))?;
    let waiting = waiter(&waiter_p, &k, ttl, ttl);
    // Until the waiter's notification connection shows up, and is killed.
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let Some(killed) = f.kill_notification_connections().await else {
            return Err(CaseError(
                "the store has no notification connection to kill".into(),
            ));
        };
        if killed > 0 {
            break;
        }
        ensure(Instant::now() < give_up, || {
            "no notification connection showed up".into()
        })?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holder_p.release(&holder).await?;
    let released = Instant::now();
    let got = woken(waiting, released, holder.token(), ttl).await?;
    waiter_p.release(&got).await?;
    Ok(())
}

/// Expands to `mod $module` with one test per outage case, on the
/// [`Outage`] factory `$factory` (built once per test: each case has a
/// server of its own). With `notifications`, also the case that kills the
/// notification connections.
#[macro_export]
macro_rules! outage_tests {
    ($module:ident, $factory:expr $(, $notifications:ident)?) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            $crate::__outage_case!(crash_and_restart, $factory);
            $crate::__outage_case!(a_waiter_outlives_a_restart, $factory);
            $($crate::__outage_case!(
                $notifications a_waiter_whose_notifications_are_killed_gets_the_key_promptly,
                $factory
            );)?
        }
    };
}

/// One test of [`outage_tests!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __outage_case {
    (notifications $case:ident, $factory:expr) => {
        $crate::__outage_case!($case, $factory);
    };
    ($case:ident, $factory:expr) => {
        #[$crate::__tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let factory = $factory;
            if let Err(e) = $crate::outage::$case(&factory).await {
                panic!("outage case {} failed: {e}", stringify!($case));
            }
        }
    };
}

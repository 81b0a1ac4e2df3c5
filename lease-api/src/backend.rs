//! Writing a backend: what a [`LeaseProvider`](crate::LeaseProvider)
//! implementation needs and a user of leases does not (the crate root holds
//! the user side).
//!
//! # The six required methods
//!
//! A provider answers who it is ([`capabilities`](crate::LeaseProvider::capabilities),
//! [`namespace`](crate::LeaseProvider::namespace)) and does four things, each
//! one atomic step in its store: take a free or expired key
//! ([`try_acquire`](crate::LeaseProvider::try_acquire)), extend a lease it
//! still holds ([`extend`](crate::LeaseProvider::extend)), give it back
//! ([`release`](crate::LeaseProvider::release)) and say who holds a key
//! ([`inspect`](crate::LeaseProvider::inspect)). The skeleton below is a
//! complete (single-process, unfenced-across-restarts) provider over a map;
//! a real one replaces the map with its store's one-step operations and
//! judges expiry on the store's clock, never the client's.
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::Mutex;
//! use std::time::Duration;
//!
//! use async_trait::async_trait;
//! use lease_api::backend::OwnerId;
//! use lease_api::{
//!     Capabilities, ExpiryClock, FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey,
//!     LeaseProvider, Notifications, Result, TryAcquire,
//! };
//! use tokio::time::Instant;
//!
//! #[derive(Debug)]
//! struct MapProvider {
//!     caps: Capabilities,
//!     // key -> (owner, token, expiry); `tokens` only grows, so tokens are fenced.
//!     held: Mutex<HashMap<LeaseKey, (OwnerId, u64, Instant)>>,
//!     tokens: Mutex<u64>,
//! }
//!
//! impl MapProvider {
//!     fn new() -> Self {
//!         MapProvider {
//!             caps: Capabilities::new("map", ExpiryClock::ProcessMonotonic, Notifications::TimedRetryOnly),
//!             held: Mutex::new(HashMap::new()),
//!             tokens: Mutex::new(0),
//!         }
//!     }
//!     fn map(&self) -> Result<std::sync::MutexGuard<'_, HashMap<LeaseKey, (OwnerId, u64, Instant)>>> {
//!         self.held.lock().map_err(|_| LeaseError::protocol("map poisoned"))
//!     }
//! }
//!
//! #[async_trait]
//! impl LeaseProvider for MapProvider {
//!     fn capabilities(&self) -> &Capabilities {
//!         &self.caps
//!     }
//!
//!     fn namespace(&self) -> &str {
//!         "default"
//!     }
//!
//!     async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
//!         let sent_at = Instant::now(); // before the store step: validity is never overstated
//!         let mut map = self.map()?;
//!         if let Some((_, _, expires)) = map.get(key) {
//!             if *expires > Instant::now() {
//!                 return Ok(TryAcquire::Held { remaining: Some(*expires - Instant::now()) });
//!             }
//!         }
//!         let mut tokens = self.tokens.lock().map_err(|_| LeaseError::protocol("poisoned"))?;
//!         *tokens += 1;
//!         let owner = OwnerId::random();
//!         map.insert(key.clone(), (owner, *tokens, Instant::now() + ttl));
//!         Ok(TryAcquire::Acquired(Lease::new(key.clone(), FencingToken(*tokens), owner, ttl, sent_at)))
//!     }
//!
//!     async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
//!         let sent_at = Instant::now();
//!         let mut map = self.map()?;
//!         match map.get_mut(lease.key()) {
//!             Some((owner, _, expires)) if *owner == lease.owner() && *expires > Instant::now() => {
//!                 *expires = Instant::now() + ttl;
//!                 Ok(lease.renewed(ttl, sent_at))
//!             }
//!             _ => Err(LeaseError::lost(lease)),
//!         }
//!     }
//!
//!     async fn release(&self, lease: &Lease) -> Result<()> {
//!         let mut map = self.map()?;
//!         match map.get(lease.key()) {
//!             Some((owner, _, expires)) if *owner == lease.owner() && *expires > Instant::now() => {
//!                 map.remove(lease.key());
//!                 Ok(())
//!             }
//!             _ => Err(LeaseError::not_held(lease)),
//!         }
//!     }
//!
//!     async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
//!         let map = self.map()?;
//!         Ok(map.get(key).and_then(|(owner, token, expires)| {
//!             let left = expires.checked_duration_since(Instant::now())?;
//!             Some(LeaseInfo::new(FencingToken(*token), left, Some(*owner), None))
//!         }))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<()> {
//! let p = MapProvider::new();
//! let key = LeaseKey::new("job")?;
//! let lease = p.try_acquire(&key, Duration::from_secs(5)).await?.into_lease().expect("free");
//! assert!(p.try_acquire(&key, Duration::from_secs(5)).await?.into_lease().is_none());
//! p.release(&lease).await?;
//! # Ok(())
//! # }
//! ```
//!
//! Run the conformance suite on it (`lease_conformance::conformance_tests!`
//! with a `ProviderFactory`): the cases of clauses C1..C12 apply to every
//! provider. Declare in [`Capabilities`](crate::Capabilities) only what a
//! case shows; a declaration that a probe of the live server can decide (a
//! server-side limit, a synchronous standby) comes from the probe
//! ([`ProbedCapabilities`]).
//!
//! # What the defaulted methods turn on
//!
//! | to offer | implement | declare | conformance cases it must then pass |
//! | --- | --- | --- | --- |
//! | waiting on notifications, not polls (C9) | [`watch`](crate::LeaseProvider::watch) returning a [`KeyWatch`] ([`WatchHub`] and [`NotifyWatch`] for a pub/sub store) | [`Notifications`](crate::Notifications) other than `TimedRetryOnly` | `waiter_wakes_promptly_on_release`, `waiter_gets_free_key_when_watch_fails`, `waiter_store_calls_are_bounded` |
//! | a watch that reports the key's state (one store step after a wake-up) | [`watch_reports_state`](crate::LeaseProvider::watch_reports_state) returning true | - | the C9 cases above |
//! | a watch that starts only when it waits, for the key to be free | [`watch_is_lazy`](crate::LeaseProvider::watch_is_lazy) returning true (observers then look again now and then) | - | `election_has_one_leader_and_followers_see_each_term` |
//! | batched renewal for sessions (C16) | [`extend_many`](crate::LeaseProvider::extend_many) in one store step, [`batch_limit`](crate::LeaseProvider::batch_limit) | - | `session_renews_many_leases`, `session_key_lost_alone`, `session_release_keeps_the_others`, `session_outage_fires_every_lease_by_validity` |
//! | the store's own session (one etcd lease, one ZooKeeper session) | [`session_store`](crate::LeaseProvider::session_store) returning a [`SessionStore`] | `Capabilities::holder_session` where the session's end frees the keys | the C16 cases above |
//! | fair FIFO waiting (C17) | [`wait_queue`](crate::LeaseProvider::wait_queue) returning a [`WaitQueue`] (tickets are number and mark: [`Ticket`]) | `Capabilities::fair_waiting` | `fair_waiters_are_served_in_arrival_order`, `fair_queue_skips_dead_and_departed_waiters` |
//! | clean shutdown of background work | [`flush`](crate::LeaseProvider::flush) | - | `dropped_wait_leaks_no_lease` |
//!
//! A wrapper around another provider (metrics, fault injection, counters) is
//! a [`Hook`] on [`Layered`], which forwards every method once; never a
//! hand-written `impl LeaseProvider` that forwards some methods and leaves
//! the others to their defaults.

pub use crate::caps::{DEFAULT_MAX_KEYS, DEFAULT_MAX_TTL, MultiKey, ProbedCapabilities};
pub use crate::error::BoxError;
pub use crate::holder::{MAX_HOLDER_BYTES, validate_holder};
pub use crate::hook::{Answer, Hook, Op, Outcome};
pub use crate::hosts::{HostAttempt, HostCursor, HostWalk, split_host_list};
pub use crate::hub::WatchHub;
pub use crate::key::{MAX_KEY_BYTES, validate_key_set, validate_namespace, validate_purge_prefix};

/// The key of the queue ([`WaitQueue`]) in which fair
/// waiters of `key`'s read/write lease stand (C17 with C19): apart from the
/// plain lease's fair waiters, and longer than [`MAX_KEY_BYTES`], so no
/// caller's key names it. A backend stores it as any key.
pub fn read_write_queue_key(key: &crate::LeaseKey) -> crate::LeaseKey {
    key.read_write_queue()
}
pub use crate::layered::Layered;
pub use crate::lease::{LeaseHandle, OwnerId, drift_margin};
pub use crate::memory::DEFAULT_NAMESPACE;
pub use crate::observe::ObserveHook;
pub use crate::provider::acquire_in_key_order;
pub use crate::queue::{MAX_TICKET_TTL, Place, Ticket, WaitQueue};

/// The rules of a queue of waiters kept by TTL and mark, as pure functions
/// (what the in-memory provider runs, Redis's and PostgreSQL's scripts state,
/// and the `lease-model` checker explores).
pub mod queue_rules {
    pub use crate::queue_rules::*;
}

/// The rules of a read/write lease, as pure functions (what the in-memory
/// provider runs, the other backends' scripts state, and the `lease-model`
/// checker explores).
pub mod rw_rules {
    pub use crate::rw_rules::*;
}
pub use crate::session_config::Timing as SessionTiming;
pub use crate::session_store::SessionStore;
pub use crate::sql_names::validate_sql_identifier;
pub use crate::time::{deadline_after, deadline_in};
pub use crate::watch::{KeyWatch, MAX_BLIND_WAIT, NotifyWatch, ReadyWatch, SleepWatch};

use std::future::Future;
use std::time::Duration;

use crate::LeaseError;

/// Bounds one store call by `limit`: the call's own error goes through
/// `map_err`, and running out of time is [`LeaseError::Timeout`] naming
/// `operation`. Every provider bounds its calls with this, so a store that
/// stops answering is reported the same way on every backend.
///
/// # Errors
/// `map_err` of the call's error, or `Timeout` after `limit`.
pub async fn bounded<T, E>(
    operation: &'static str,
    limit: Duration,
    call: impl Future<Output = Result<T, E>>,
    map_err: impl FnOnce(E) -> LeaseError,
) -> crate::Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(r) => r.map_err(map_err),
        Err(_) => Err(LeaseError::timeout(operation, limit)),
    }
}

/// Runs `attempt` until it succeeds or `give_up` has passed, waiting 100 ms
/// after the first failure and twice as long after each next one, up to 5 s:
/// background work that must happen once the store answers again, such as
/// the cancel of an acquire that had no answer.
///
/// # Errors
/// The last try's error, once `give_up` has passed.
pub async fn retry_until<T, F, Fut>(
    give_up: tokio::time::Instant,
    mut attempt: F,
) -> crate::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = crate::Result<T>>,
{
    let mut backoff = Duration::from_millis(100);
    loop {
        match attempt().await {
            Ok(t) => return Ok(t),
            Err(e) if tokio::time::Instant::now() >= give_up => return Err(e),
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Looks with `look` until it answers `true`, waiting `first` after the first
/// look and twice as long after each next one, up to a second: the wait for
/// something that ends soon, such as a server session being ended. A look's
/// error ends it with that error.
///
/// # Errors
/// A look's error, or [`LeaseError::Timeout`] naming `what` once `give_up`
/// has passed without a `true`.
pub async fn poll_until<F, Fut>(
    what: &'static str,
    first: Duration,
    give_up: tokio::time::Instant,
    mut look: F,
) -> crate::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = crate::Result<bool>>,
{
    let start = tokio::time::Instant::now();
    let mut wait = first;
    while !look().await? {
        if tokio::time::Instant::now() >= give_up {
            return Err(LeaseError::timeout(what, start.elapsed()));
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(1));
    }
    Ok(())
}

/// Waits, up to `limit`, until `tracker` runs no task: a provider's
/// [`flush`](crate::LeaseProvider::flush) over its background clean-ups,
/// including those spawned meanwhile. It neither closes nor reopens the
/// tracker, so flushes running at once each end when the work does (with
/// close, wait and reopen, one flush's reopen kept another's wait from ever
/// ending before its limit).
pub async fn drain(tracker: &tokio_util::task::TaskTracker, limit: Duration) {
    let _ = tokio::time::timeout(limit, async {
        while !tracker.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Spawns `work` on `tracker`, on the calling thread's runtime, from code
/// that cannot await (a `Drop`). Outside a runtime nothing is spawned and it
/// returns `false`, for the caller to say what is left undone.
pub fn spawn_tracked<F>(tracker: &tokio_util::task::TaskTracker, work: F) -> bool
where
    F: Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            tracker.spawn_on(work, &runtime);
            true
        }
        Err(_) => false,
    }
}

/// True when `e`, or an error that caused it, is a TLS handshake refusal: a
/// server certificate that is not trusted or does not name the host, or a
/// server that refused our client certificate. Clients often keep rustls's
/// error behind a type-erased wrapper, so this reads rustls's own wording
/// along the `source()` chain. Such a failure is a matter of configuration
/// ([`LeaseError::Denied`]), not of reachability.
pub fn is_tls_refusal(e: &(dyn std::error::Error + 'static)) -> bool {
    const MARKS: [&str; 5] = [
        "invalid peer certificate",
        "received fatal alert",
        "peer is incompatible",
        "peer sent no certificates",
        "certificate verify failed",
    ];
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let text = err.to_string();
        if MARKS.iter().any(|m| text.contains(m)) {
            return true;
        }
        cur = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn poll_until_doubles_its_wait_and_gives_up_at_the_deadline() {
        let start = tokio::time::Instant::now();
        let looks = AtomicU32::new(0);
        let done = poll_until(
            "x",
            Duration::from_millis(20),
            start + Duration::from_secs(60),
            || async { Ok(looks.fetch_add(1, Ordering::SeqCst) == 2) },
        )
        .await;
        assert!(done.is_ok());
        assert_eq!(start.elapsed(), Duration::from_millis(60));

        let start = tokio::time::Instant::now();
        let never = poll_until(
            "x",
            Duration::from_millis(20),
            start + Duration::from_secs(5),
            || async { Ok(false) },
        )
        .await;
        assert!(
            matches!(never, Err(LeaseError::Timeout { .. })),
            "{never:?}"
        );
        assert!(start.elapsed() >= Duration::from_secs(5));
        assert!(start.elapsed() < Duration::from_secs(7));
    }

    #[tokio::test(start_paused = true)]
    async fn drains_at_once_each_end_with_the_work_or_their_limit() {
        let tracker = tokio_util::task::TaskTracker::new();
        tracker.spawn(tokio::time::sleep(Duration::from_millis(300)));
        let start = tokio::time::Instant::now();
        // One flush gives up at 100 ms; the other must still end with the
        // work, at 300 ms, not at its own 10 s limit.
        let (_, long) = tokio::join!(drain(&tracker, Duration::from_millis(100)), async {
            drain(&tracker, Duration::from_secs(10)).await;
            start.elapsed()
        });
        assert!(
            long >= Duration::from_millis(300) && long < Duration::from_millis(400),
            "{long:?}"
        );
        tracker.spawn(tokio::time::sleep(Duration::from_secs(60)));
        let start = tokio::time::Instant::now();
        drain(&tracker, Duration::from_secs(1)).await;
        assert!(start.elapsed() < Duration::from_millis(1100));
        // Still open: later work is tracked as before.
        assert!(!tracker.is_closed());
    }

    #[tokio::test(start_paused = true)]
    async fn retry_until_backs_off_and_stops_at_the_deadline() {
        let start = tokio::time::Instant::now();
        let tries = AtomicU32::new(0);
        let got = retry_until(start + Duration::from_secs(60), || async {
            match tries.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err(LeaseError::timeout("x", Duration::ZERO)),
                _ => Ok(7),
            }
        })
        .await;
        assert_eq!(got.ok(), Some(7));
        assert_eq!(tries.load(Ordering::SeqCst), 3);
        assert_eq!(start.elapsed(), Duration::from_millis(300));

        let start = tokio::time::Instant::now();
        let tries = AtomicU32::new(0);
        let got: crate::Result<()> = retry_until(start + Duration::from_secs(20), || async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(LeaseError::timeout("x", Duration::ZERO))
        })
        .await;
        assert!(got.is_err());
        // 0.1 + 0.2 + 0.4 + 0.8 + 1.6 + 3.2 + 5 + 5 + 5 s: past 20 s.
        assert_eq!(tries.load(Ordering::SeqCst), 10);
        assert!(start.elapsed() >= Duration::from_secs(20));
        assert!(start.elapsed() < Duration::from_secs(26));
    }
}

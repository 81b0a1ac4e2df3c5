//! The cases. Each one proves a clause of the contract; names are stable API.

/// Fails the case with a message unless the condition holds.
macro_rules! check {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::CaseError(format!("{} (at {}:{})", format!($($msg)+), file!(), line!())));
        }
    };
}

mod acquire;
mod errors;
mod guard;
mod inspect;
mod keys;
mod multi;
mod ownership;
mod recipes;
mod rw;
mod session;
mod tokens;
mod waiting;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use lease_api::backend::MAX_KEY_BYTES;
use lease_api::{
    AcquireOptions, FenceGate, FencingToken, GuardConfig, Lease, LeaseError, LeaseGuard, LeaseKey,
    LeaseProvider, LostReason, RunOptions, RunOutcome, TryAcquire, acquire, run_with_lease,
};
use tokio::sync::Barrier;
use tokio::time::{Instant, sleep, sleep_until};

use crate::{CaseError, CaseResult, Ctx, Instrumented, Partition};

/// Room for scheduling delays on a loaded machine, on top of declared slack.
const TOLERANCE: Duration = Duration::from_millis(1500);

/// How soon a waiter must hold a key handed over by a notification (a
/// resignation, the last reader leaving) in the cases whose leases last the
/// long TTL and whose waiters sleep until the holder's TTL without one:
/// generous for a loaded machine, far below the 30 s such a waiter waits.
/// Not for fair waiters: they wake at each refresh of their ticket (about
/// every 3 s) and their tickets live 10 s at most.
const HANDED_OVER_WITHIN: Duration = Duration::from_secs(5);

fn short_ttl(p: &dyn LeaseProvider) -> Duration {
    p.capabilities().practical_ttl(Duration::from_millis(500))
}

/// The TTL of the cases where a guard or a session must keep a lease across
/// several TTLs: long enough that a loaded machine's stalls (a busy core, a
/// store's pause) do not end a lease between two renewals (at 500 ms, each
/// renewal had under 300 ms to land), short enough that a case spans several.
fn renewing_ttl(p: &dyn LeaseProvider) -> Duration {
    p.capabilities().practical_ttl(Duration::from_secs(2))
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
    // The new holder's lease is long: the checks that follow must see it
    // still held however slowly a loaded machine runs them.
    let new_ttl = long_ttl(&*new_provider);
    let Some(new) = acquire(&new_provider, key, AcquireOptions::ttl(new_ttl).wait(wait)).await?
    else {
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

use acquire::*;
use errors::*;
use guard::*;
use inspect::*;
use keys::*;
use multi::*;
use ownership::*;
use recipes::*;
use rw::*;
use session::*;
use tokens::*;
use waiting::*;

// Every case of the suite, in the order of the contract; the list itself is
// `__case_list!` in the crate root, shared with `conformance_tests!`.
crate::__case_list!(static);

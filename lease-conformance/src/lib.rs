//! # lease-conformance: one suite that proves a provider keeps the lease contract
//!
//! Every `lease` backend runs these cases, and so can you against your own
//! deployment: they are the contract's table of contents (clauses C1..C19, as
//! listed in the [`lease_api`] crate docs). Each case is a named entry of [`CASES`],
//! with the clause it proves and one sentence on what it checks;
//! the names are stable public API.
//!
//! ## Run it against an adapter
//!
//! Implement [`ProviderFactory`] (a fresh, independent provider per call, in the
//! namespace asked for, plus one pointed at a store that is down), then expand one
//! `#[tokio::test]` per case:
//!
//! ```
//! use lease_conformance::{conformance_tests, MemoryFactory};
//! conformance_tests!(memory_conformance, MemoryFactory::new());
//! ```
//!
//! `cargo test` then lists `memory_conformance::acquire_free_key ... ok` and so on.
//! Every case reads TTLs and slack from the provider's [`Capabilities`](lease_api::Capabilities),
//! uses its own random namespace and key prefix, and can run concurrently with
//! the others against one server.
//!
//! ## Outages and failovers
//!
//! A factory over a server of its own can also implement [`Outage`] (crash,
//! stop, start again, kill the connections that carry notifications) and
//! expand the [`outage`] cases with [`outage_tests!`]: unavailability within
//! the declared time, recovery of the same provider, tokens across a crash,
//! and waiters that outlive a restart or a killed connection. Replicated
//! topologies run [`failover::leader_loss`] against their declaration.
//!
//! ## Run it against your deployment
//!
//! [`run_all`] runs every case and returns a [`Report`] (pass/fail and time per
//! case), which the `lease conformance` command prints as a table.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cases;
pub mod failover;
mod fault;
mod memory;
pub mod outage;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lease_api::{LeaseError, LeaseKey, LeaseProvider};

pub use cases::CASES;
pub use fault::{Instrumented, Partition};
pub use memory::MemoryFactory;
pub use outage::{Outage, Server};

#[doc(hidden)]
pub use tokio as __tokio;

/// Makes providers for the suite.
#[async_trait]
pub trait ProviderFactory: Send + Sync + 'static {
    /// A new, independent provider (its own connection or client where the
    /// backend has one) working in `namespace`.
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError>;

    /// A provider configured for a store that is down or unreachable (for
    /// example a closed loopback port), with a short timeout.
    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError>;

    /// How long an operation on [`unreachable`](Self::unreachable) may take to
    /// fail. Default: 10 s.
    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(10)
    }

    /// Removes what the suite left in `namespace` (expired entries, counters).
    /// Default: nothing to remove.
    async fn cleanup(&self, namespace: &str) -> Result<(), LeaseError> {
        let _ = namespace;
        Ok(())
    }
}

/// Why a case failed.
#[derive(Debug, Clone)]
pub struct CaseError(pub String);

impl fmt::Display for CaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CaseError {}

impl From<LeaseError> for CaseError {
    fn from(e: LeaseError) -> Self {
        let mut msg = format!("unexpected lease error: {e}");
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(&format!(": {s}"));
            src = s.source();
        }
        CaseError(msg)
    }
}

/// The result type of a case.
pub type CaseResult = Result<(), CaseError>;

type CaseFn = fn(Ctx) -> Pin<Box<dyn Future<Output = CaseResult> + Send>>;

/// One named case of the suite.
#[derive(Clone, Copy)]
pub struct Case {
    /// The stable name (also the test function's name).
    pub name: &'static str,
    /// The contract clause(s) it proves.
    pub clause: &'static str,
    /// What it checks, in one sentence.
    pub about: &'static str,
    run: CaseFn,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("clause", &self.clause)
            .finish()
    }
}

/// What a case gets: the factory, its own namespace and key prefix.
#[derive(Clone)]
pub struct Ctx {
    factory: Arc<dyn ProviderFactory>,
    namespace: String,
    prefix: String,
}

impl Ctx {
    fn new(factory: Arc<dyn ProviderFactory>, case: &str) -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        Ctx {
            factory,
            namespace: format!("lease-conformance-{}", &id[..12]),
            prefix: format!("{case}-{}", &id[12..20]),
        }
    }

    /// A new provider in this case's namespace.
    pub async fn provider(&self) -> Result<Arc<dyn LeaseProvider>, CaseError> {
        Ok(self.factory.provider(&self.namespace).await?)
    }

    /// A new provider in another namespace derived from this case's.
    pub async fn provider_in(&self, suffix: &str) -> Result<Arc<dyn LeaseProvider>, CaseError> {
        Ok(self
            .factory
            .provider(&format!("{}-{suffix}", self.namespace))
            .await?)
    }

    /// A key unique to this case run: the case's random prefix, `/`, `name`.
    pub fn key(&self, name: &str) -> Result<LeaseKey, CaseError> {
        Ok(LeaseKey::new(format!("{}/{name}", self.prefix))?)
    }

    /// The factory the case runs on.
    pub fn factory(&self) -> &Arc<dyn ProviderFactory> {
        &self.factory
    }
}

/// One case's outcome in a [`Report`].
#[derive(Debug, Clone)]
pub struct CaseReport {
    /// The case name.
    pub name: &'static str,
    /// The clause it proves.
    pub clause: &'static str,
    /// `None` if it passed, else why it failed.
    pub failure: Option<String>,
    /// How long it took.
    pub elapsed: Duration,
}

/// The outcome of [`run_all`].
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// One entry per case, in [`CASES`] order.
    pub cases: Vec<CaseReport>,
}

impl Report {
    /// True if every case passed.
    pub fn passed(&self) -> bool {
        self.cases.iter().all(|c| c.failure.is_none())
    }

    /// How many cases failed.
    pub fn failures(&self) -> usize {
        self.cases.iter().filter(|c| c.failure.is_some()).count()
    }
}

/// Looks a case up by name.
pub fn case(name: &str) -> Option<&'static Case> {
    CASES.iter().find(|c| c.name == name)
}

/// Runs one case; the error says what broke.
///
/// # Errors
/// The case's failure, or an unknown case name.
pub async fn run_case(factory: Arc<dyn ProviderFactory>, name: &str) -> CaseResult {
    let Some(case) = case(name) else {
        return Err(CaseError(format!("no conformance case named {name:?}")));
    };
    let ctx = Ctx::new(Arc::clone(&factory), case.name);
    let namespace = ctx.namespace.clone();
    let result = (case.run)(ctx).await;
    // Cleanup is best effort; a failure here must not hide the case's result.
    let _ = factory.cleanup(&namespace).await;
    result
}

/// How many cases [`run_all`] runs at once: some cases open 17 connections or
/// sessions, and servers cap connections per client address (ZooKeeper's
/// `maxClientCnxns` is 60 by default).
pub const CONCURRENT_CASES: usize = 3;

/// Runs the cases, [`CONCURRENT_CASES`] at a time, and reports pass/fail and
/// time per case.
pub async fn run_all(factory: Arc<dyn ProviderFactory>) -> Report {
    let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_CASES));
    let runs = CASES.iter().map(|case| {
        let factory = Arc::clone(&factory);
        let slots = Arc::clone(&slots);
        async move {
            let _slot = slots.acquire_owned().await;
            let started = Instant::now();
            let handle = tokio::spawn(run_case(factory, case.name));
            let failure = match handle.await {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.0),
                Err(e) => Some(format!("the case panicked: {e}")),
            };
            CaseReport {
                name: case.name,
                clause: case.clause,
                failure,
                elapsed: started.elapsed(),
            }
        }
    });
    Report {
        cases: futures_util::future::join_all(runs).await,
    }
}

/// For the [`conformance_tests!`] macro: runs a case and panics with its failure.
#[doc(hidden)]
pub async fn __run_test<F: ProviderFactory>(factory: F, name: &str) {
    if let Err(e) = run_case(Arc::new(factory), name).await {
        panic!("conformance case {name} failed: {e}");
    }
}

/// Expands to `mod $module` with one `#[tokio::test]` per conformance case.
///
/// `$factory` is an expression evaluated inside each test (names in the calling
/// module are in scope) that yields a [`ProviderFactory`].
#[macro_export]
macro_rules! conformance_tests {
    ($module:ident, $factory:expr) => {
        $crate::__case_list!(tests $module, $factory);
    };
}

/// The one list of cases: name, clause, what it proves. `static` expands it to
/// [`CASES`]; `tests` to the test module of [`conformance_tests!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __case_list {
    ($($mode:tt)*) => {
        $crate::__case_expand! {
            [$($mode)*]
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
            unreachable_store_is_unavailable, "C14", "a store that is down gives Unavailable (or Timeout) within the provider's timeout";
            session_renews_many_leases, "C16", "a session holds 40 leases across several TTLs with one renewal call per batch, and close releases them";
            session_key_lost_alone, "C16", "a key of a session ended in the store and taken over fires that lease's lost signal only";
            session_outage_fires_every_lease_by_validity, "C16", "when the session's store is cut off, every lease fires lost before its local validity ends";
            semaphore_never_exceeds_permits, "C2", "32 contenders on a 4-permit semaphore: never more than 4 hold a permit at once, and each permit's tokens grow";
            semaphore_permit_of_crashed_holder_returns, "C4", "the permits of a crashed holder come back when their leases expire, not before";
            fair_waiters_are_served_in_arrival_order, "C17", "six fair waiters queued behind a holder get the key in the order they arrived (a backend without fair waiting refuses a fair acquire)";
            fair_read_write_waiters_are_served_in_arrival_order, "C17", "fair read/write waiters (reader, reader, writer, reader) queued behind a writer in their own line are served in arrival order, not by writer preference: the first two readers together, the writer alone, then the last reader";
            fair_queue_skips_dead_and_departed_waiters, "C17", "a fair waiter that gave up leaves the line at once; one that died holds it up until its ticket's TTL (or session) ends";
            election_paused_leader_is_fenced, "C12", "a leader cut off from the store loses its term to a follower once its lease ends, and the fence refuses its late write after the new leader's";
            election_has_one_leader_and_followers_see_each_term, "C2", "3 campaigners lead 2 terms each: one leader at a time, a follower sees every term in token order, and a resignation hands over at once";
            session_release_keeps_the_others, "C16", "releasing one lease of a session frees its key and keeps the others held";
            multi_key_takes_every_key_or_none, "C18", "a set of keys is taken whole, each key with its own token above the key's earlier ones; a set with any key held takes none";
            multi_key_takes_over_expired_keys, "C18", "a set with keys whose holders crashed is refused while their leases run and taken over once they expired, with larger tokens";
            multi_key_bad_sets_change_nothing, "C18", "an empty set, a key named twice, more keys than max_keys, a zero TTL and a fair wait are clear errors that take nothing";
            multi_key_sets_never_deadlock_or_overlap, "C18", "16 tasks take overlapping 3-key sets in random order, 4 rounds each: every one finishes and no key has two holders";
            dropped_multi_acquire_leaks_no_key, "C18", "acquire_all futures dropped at any point, waiting or not, leave no key held";
            atomic_multi_key_is_never_seen_half_held, "C18", "a provider declaring atomic sets is never seen holding part of a set that another holder's key refuses";
            lease_set_renews_and_is_lost_together, "C18", "a LeaseSetGuard renews its keys across three TTLs; when one key ends, the set is lost and the other key given back";
            rw_readers_share_and_a_writer_excludes, "C19", "three readers share a key, a writer is refused beside them and holds it alone after (the plain lease of the same name is another object); a provider without read/write leases refuses them with Config";
            rw_tokens_follow_the_writer_rule, "C19", "a writer's token is above every earlier reader's and writer's; a reader carries the last writer's token, and the fence gate refuses a reader from before a newer writer";
            rw_waiting_writer_keeps_new_readers_out, "C19", "a waiting writer refuses new readers, gets the key promptly when the last reader leaves, and withdraws its record when it gives up";
            rw_crashed_reader_expires_for_the_writer, "C19", "a crashed reader holds a waiting writer out until its TTL, not longer, and the writer's token is above it";
            rw_leases_renew_and_stale_handles_touch_nothing, "C19", "a guard renews a reader across three TTLs; a reader's handle passed as a writer's or a plain lease's (and a writer's as a reader's) touches nothing";
            rw_concurrent_readers_and_writers_never_overlap, "C19", "12 tasks read and write one key, 6 rounds each, waiting: a writer never holds beside anyone, and writers' tokens grow in the order they held";
            rw_dropped_waits_leave_nothing, "C19", "dropped waiting writers leave no record keeping readers out, and dropped acquires leave no lease";
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __case_expand {
    ([static] $($name:ident, $clause:literal, $about:literal;)*) => {
        /// Every case of the suite, in the order of the contract.
        pub static CASES: &[$crate::Case] = &[
            $($crate::Case { name: stringify!($name), clause: $clause, about: $about, run: |ctx| Box::pin($name(ctx)) },)*
        ];
    };
    ([tests $module:ident, $factory:expr] $($name:ident, $clause:literal, $about:literal;)*) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[$crate::__tokio::test(flavor = "multi_thread", worker_threads = 2, crate = "lease_conformance::__tokio")]
                async fn $name() {
                    $crate::__run_test($factory, stringify!($name)).await;
                }
            )*
        }
    };
}

//! # lease-api: the distributed-lease contract
//!
//! Several instances of a service compete for one resource (a settlement batch,
//! a file, a cron slice); a **lease** lets exactly one of them work on it until
//! the lease's TTL runs out. This crate is the contract every `lease` backend
//! (Redis, Redlock, PostgreSQL, etcd, ZooKeeper) implements, plus everything that
//! works over any backend:
//!
//! - [`LeaseKey`], [`FencingToken`], [`Lease`], [`Capabilities`], [`LeaseError`]:
//!   the vocabulary of the contract (clauses C1..C19, [below](#the-contract)).
//! - [`LeaseProvider`]: the object-safe trait a backend implements; one atomic
//!   store step per method.
//! - [`acquire`]: wait for a key with a time limit, woken by the store's
//!   notifications, cancel-safe.
//! - [`LeaseGuard`]: renews in the background and fires a lost signal the job
//!   selects on; [`run_with_lease`] runs a job under a lease and cancels it when
//!   the lease is lost, with an optional minimum hold for once-per-slot jobs.
//! - [`LeaseSession`]: many leases of one process renewed by one loop in
//!   batched store calls, each with its own token and lost signal.
//! - [`acquire_all`] and [`LeaseSetGuard`]: every key of a set or none, renewed
//!   and lost together (C18).
//! - [`acquire_read`] and [`acquire_write`]: read/write leases, any number of
//!   readers or one writer, with writer preference (C19).
//! - [`FenceGate`]: the resource side of fencing: it refuses writes carrying a
//!   token older than one it has already seen, and reads from before a newer writer.
//! - [`MemoryProvider`]: the whole contract in one process, on tokio time; the
//!   embedded default and the reference for every other backend.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use lease_api::{acquire, AcquireOptions, FenceGate, LeaseGuard, LeaseKey, LeaseProvider, MemoryProvider};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lease_api::Result<()> {
//! let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
//! let key = LeaseKey::new("settlement/2026-12-02")?;
//!
//! // Wait up to one second for the key, hold it with a 10 s TTL.
//! let options = AcquireOptions::ttl(Duration::from_secs(10)).wait(Duration::from_secs(1));
//! let lease = acquire(&provider, &key, options)
//!     .await?
//!     .expect("nobody else holds it");
//! let guard = LeaseGuard::new(Arc::clone(&provider), lease);
//!
//! // The protected resource checks the token of every write.
//! let gate = FenceGate::new();
//! tokio::select! {
//!     reason = guard.lost() => eprintln!("lease lost ({reason}); stop now"),
//!     written = async { gate.write(&key, guard.token(), || "row written") } => {
//!         assert_eq!(written.unwrap(), "row written");
//!     }
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # The contract
//!
//! Every provider keeps these clauses; `lease-conformance` has a named case for
//! each, and runs against every backend.
//!
//! - **C1 keys and namespaces.** A key is 1 to [`MAX_KEY_BYTES`](backend::MAX_KEY_BYTES) bytes without
//!   NUL; any other byte is allowed and distinct. Providers in different
//!   namespaces never see each other's keys.
//! - **C2 atomic acquire.** [`LeaseProvider::try_acquire`] takes a free or
//!   expired key in one atomic store step: of concurrent contenders exactly one wins.
//! - **C3 TTL limits.** A zero TTL, or one outside the provider's declared
//!   limits, is [`LeaseError::InvalidTtl`] and changes nothing; a granted TTL is
//!   rounded up to the declared granularity.
//! - **C4 expiry on the store's clock.** An unrenewed lease stays held until
//!   its TTL and is free within TTL + the declared `expiry_slack`, as the store's
//!   clock (declared in [`ExpiryClock`]) counts, never the client's.
//! - **C5 owners.** Every lease has a fresh random 128-bit [`OwnerId`](backend::OwnerId); extend
//!   and release act only when both owner and token match, so a stale or forged
//!   lease never touches the next holder's.
//! - **C6 extend.** Pushes expiry to store-now + TTL and keeps the token; a
//!   lease no longer held is [`LeaseError::Lost`], even if nobody took the key.
//! - **C7 release.** Frees the key at once and wakes waiters; a lease not held
//!   is [`LeaseError::NotHeld`] and the current holder is untouched.
//! - **C8 fencing tokens.** Every acquisition of a key gets a strictly larger
//!   [`FencingToken`], across releases, expiries and provider instances.
//! - **C9 waiting.** [`acquire`] waits on the store's notifications (the watch
//!   is registered before the try), retries by the holder's TTL when a
//!   notification is lost, and leaks no lease when its future is dropped.
//! - **C10 local validity.** [`Lease::valid_until`] is never later than the
//!   send time of the request plus the granted TTL.
//! - **C11 the guard.** [`LeaseGuard`] renews in the background and fires its
//!   lost signal before local validity ends; [`run_with_lease`] cancels the job
//!   then, and keeps an optional minimum hold.
//! - **C12 fencing at the resource.** [`FenceGate`] refuses a write whose token
//!   is older than one it has seen.
//! - **C13 inspect.** [`LeaseProvider::inspect`] reports the holder's token,
//!   remaining TTL, owner and label, and changes nothing.
//! - **C14 errors.** Every failure is a [`LeaseError`]; only `Unavailable` and
//!   `Timeout` are transient.
//! - **C15 capabilities.** [`Capabilities`] declare what differs between stores
//!   (TTL limits, slack, clocks, durability, notifications, sessions), probed
//!   from the live server where it can tell.
//! - **C16 sessions.** A [`LeaseSession`] renews all its leases in batched
//!   store calls ([`LeaseProvider::extend_many`], or the store's own session
//!   from [`LeaseProvider::session_store`]); a key the store ends fires that
//!   lease's lost signal only, and when the whole session cannot renew, every
//!   lease fires by its own local validity.
//! - **C17 fair waiting.** With [`AcquireOptions::fair`], waiters queue in
//!   the store ([`LeaseProvider::wait_queue`], a [`WaitQueue`](backend::WaitQueue)) and get the key
//!   in arrival order; each is woken only when the [`Ticket`](backend::Ticket) ahead of it
//!   leaves, and a dead waiter's ticket ends with its TTL or session. Declared
//!   by [`Capabilities::fair_waiting`]; a backend without it refuses a fair
//!   acquire with [`LeaseError::Config`].
//! - **C18 sets of keys.** [`LeaseProvider::try_acquire_all`] takes every key
//!   of a set or none, each key with its own token (C8); [`acquire_all`] waits
//!   for a set, never deadlocks against overlapping sets named in any order,
//!   and gives back a set won by a dropped future; [`LeaseSetGuard`] renews a
//!   set together and loses it together. Where the store can decide the set in
//!   one atomic step it does, and says so in
//!   [`Capabilities::multi_key`]; elsewhere the keys are taken in key order
//!   and given back on a miss. An empty set, a key named twice or too many
//!   keys is [`LeaseError::Config`] and changes nothing.
//! - **C19 read/write leases.** [`acquire_read`] and [`acquire_write`] take a
//!   key's read/write lease (a store object beside its plain lease): any
//!   number of readers or one writer, each a [`Lease`] of its own
//!   [`LeaseKind`] with a TTL, renewed and released as any lease. A waiting
//!   writer keeps new readers out; a crashed reader holds writers out only
//!   until its TTL. Every writer's token is above every earlier reader's and
//!   writer's of the key, and a reader carries the last writer's token, so
//!   [`FenceGate::read`] refuses a reader from before a newer writer.
//!   Declared by [`Capabilities::shared_leases`]; a provider without them
//!   refuses with [`LeaseError::Config`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod acquire;
mod attempt;
pub mod backend;
mod caps;
pub mod claims;
mod election;
mod error;
mod fair;
mod fence;
mod guard;
mod held;
mod holder;
mod hook;
mod hosts;
mod hub;
mod key;
mod layered;
mod lease;
mod memory;
mod memory_rw;
mod multi;
mod observe;
mod provider;
mod queue;
mod queue_rules;
mod record;
mod run;
mod rw;
mod rw_rules;
mod rw_wait;
mod semaphore;
mod session;
mod session_adapters;
mod session_config;
mod session_lease;
mod session_renew;
mod session_state;
mod session_store;
mod set_guard;
mod sql_names;
mod time;
mod wait;
mod watch;

pub mod recipes;

pub use acquire::{AcquireOptions, acquire};
pub use caps::{
    Capabilities, ExpiryClock, Failover, FailoverExtension, FailoverTokens, Notifications,
    TokenDurability,
};
pub use error::{LeaseError, Result};
pub use fence::{FenceGate, StaleToken};
pub use guard::{GuardConfig, LeaseGuard};
pub use held::{HeldLease, LostReason};
pub use holder::{holder, set_holder};
pub use key::LeaseKey;
pub use lease::{FencingToken, Lease, LeaseInfo, LeaseKind, RwInfo, TryAcquire, TryAcquireAll};
pub use memory::{MemoryProvider, MemoryStore};
pub use multi::{acquire_all, release_all};
pub use observe::Observed;
pub use provider::LeaseProvider;
pub use run::{LeaseContext, RunOptions, RunOutcome, end_after_min_hold, run_with_lease};
pub use rw::{acquire_read, acquire_write};
pub use session::{LeaseSession, SessionStats};
pub use session_config::SessionConfig;
pub use session_lease::SessionLease;
pub use set_guard::LeaseSetGuard;

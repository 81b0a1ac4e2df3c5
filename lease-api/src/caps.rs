//! What a provider declares about itself (contract clause C15).

use std::time::Duration;

use crate::LeaseError;

/// The largest TTL any built-in provider accepts: 7 days. A lease is meant to be
/// renewed; a longer TTL is almost always a forgotten unit.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Whether fencing tokens keep growing across a restart of the store.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenDurability {
    /// Tokens survive restarts; the text says why.
    Durable(String),
    /// Tokens may go back after a restart; the text says why.
    Volatile(String),
    /// The provider could not find out; the text says what it would depend on.
    Unknown(String),
}

impl TokenDurability {
    /// True only for [`TokenDurability::Durable`].
    pub fn is_durable(&self) -> bool {
        matches!(self, TokenDurability::Durable(_))
    }
}

/// Which clock decides that a lease has expired (C4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExpiryClock {
    /// The monotonic clock of this process (the in-memory provider).
    ProcessMonotonic,
    /// The store server's own expiry clock (Redis key expiry, the database clock).
    StoreServer,
    /// The lease clock of the consensus leader (etcd).
    ConsensusLeader,
    /// The wall clock of the ZooKeeper server that served the write (node mtime).
    ServerWallClock,
    /// Each node's own clock; a majority decides (Redlock).
    QuorumOfServers,
    /// The host's monotonic clock (`CLOCK_MONOTONIC`), which every process on
    /// one machine shares (SQLite): leases work between the processes of one
    /// host only.
    HostMonotonic,
}

impl ExpiryClock {
    /// True when the clock that decides expiry is a server's wall clock, so a
    /// jump of that clock (an NTP step, a VM resumed from a snapshot, an
    /// operator's `date -s`) moves every lease's expiry with it: a forward
    /// jump ends leases early, and a holder's local validity can then overlap
    /// the next holder's. Redis and PostgreSQL expire on the server's wall
    /// clock, ZooKeeper compares node mtimes, and Redlock trusts each node's
    /// clock (Kleppmann's objection); etcd's lessor, SQLite's
    /// `CLOCK_MONOTONIC` and the in-memory provider do not follow the wall
    /// clock. Fencing tokens still order the holders when it happens.
    pub fn follows_wall_clock(self) -> bool {
        match self {
            ExpiryClock::StoreServer
            | ExpiryClock::ServerWallClock
            | ExpiryClock::QuorumOfServers => true,
            ExpiryClock::ProcessMonotonic
            | ExpiryClock::ConsensusLeader
            | ExpiryClock::HostMonotonic => false,
        }
    }
}

/// How a provider learns that a key became free (C9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notifications {
    /// The store pushes a notification (pub/sub, NOTIFY, watch); the text names it.
    Native(&'static str),
    /// No notifications: waiters retry when the holder's TTL runs out.
    TimedRetryOnly,
    /// No notifications: each waiter reads its key's state at this interval
    /// (a cheap read by primary key, not an acquire attempt) and tries again
    /// when the key is free, so a release reaches a waiter within about one
    /// interval (MySQL and MariaDB, which cannot push).
    Polled(std::time::Duration),
}

/// The declared properties of a provider (C15). The conformance suite reads these
/// instead of guessing.
///
/// Backends build theirs with [`Capabilities::new`] and the `with_*` methods;
/// the struct is `#[non_exhaustive]` so that a new declaration is not a breaking
/// change.
///
/// ```
/// use std::time::Duration;
/// use lease_api::{Capabilities, ExpiryClock, Notifications, TokenDurability};
///
/// let caps = Capabilities::new("mystore", ExpiryClock::StoreServer, Notifications::TimedRetryOnly)
///     .with_ttl_limits(Duration::from_secs(1), Duration::from_secs(3600))
///     .with_ttl_granularity(Duration::from_secs(1))
///     .with_durable_tokens(TokenDurability::Durable("a replicated log".into()));
/// assert_eq!(caps.grant_ttl(Duration::from_millis(1500)).unwrap(), Duration::from_secs(2));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// A short backend name (`memory`, `redis`, `redlock`, `postgres`, `etcd`, `zookeeper`).
    pub backend: &'static str,
    /// The smallest TTL accepted.
    pub min_ttl: Duration,
    /// The largest TTL accepted.
    pub max_ttl: Duration,
    /// TTLs are rounded up to a multiple of this.
    pub ttl_granularity: Duration,
    /// How long after its TTL an expired lease may still refuse a new acquirer.
    pub expiry_slack: Duration,
    /// Whether tokens survive a store restart.
    pub durable_tokens: TokenDurability,
    /// How waiters are woken.
    pub notifications: Notifications,
    /// Which clock decides expiry.
    pub expiry_clock: ExpiryClock,
    /// Leases also end when the holder's session with the store ends
    /// (ZooKeeper's ephemeral nodes): a crashed holder's key may then be free
    /// before its TTL. The value is the session timeout; providers keep local
    /// validity within it, so a holder cut off from the store learns of the loss
    /// in time. Zero (PostgreSQL's advisory-lock mode) declares that the store
    /// may end a session without its holder's knowledge (a server restart, an
    /// operator ending it) and free its keys at once: the holder learns at its
    /// next renewal, and only fencing tokens order the two holders meanwhile.
    /// `None`: leases end only by TTL or release.
    pub holder_session: Option<Duration>,
    /// Whether the store keeps a queue of waiters per key, so that
    /// [`AcquireOptions::fair`](crate::AcquireOptions::fair) serves waiters in
    /// arrival order and wakes only the next one (C17); the provider's
    /// [`wait_queue`](crate::LeaseProvider::wait_queue) is then `Some`.
    pub fair_waiting: bool,
    /// How much longer than its TTL (plus [`expiry_slack`](Self::expiry_slack))
    /// an unrenewed lease may stay held when the store fails over, as a
    /// multiple of the lease's TTL plus a fixed time. etcd's new leader grants
    /// every lease its full TTL again after an election, so a crashed holder's
    /// key can stay held for up to another TTL plus the election timeout.
    /// `None`: a failover does not lengthen leases (or the store has none).
    pub failover_extension: Option<FailoverExtension>,
    /// What a failover of a replicated store does to leases and tokens: a
    /// leader or primary lost and another taking over. `None`: the provider
    /// talks to one server, where a failover is a restart
    /// ([`durable_tokens`](Self::durable_tokens) covers it).
    pub failover: Option<Failover>,
    /// How [`try_acquire_all`](crate::LeaseProvider::try_acquire_all) takes a
    /// set of keys (C18): in one atomic store step, or one key after another
    /// in key order with the taken ones given back on a miss; and how many
    /// keys one set may have.
    pub multi_key: MultiKey,
    /// Whether the provider has read/write leases (C19):
    /// [`try_acquire_read`](crate::LeaseProvider::try_acquire_read) and
    /// [`try_acquire_write`](crate::LeaseProvider::try_acquire_write). Without
    /// them both answer [`LeaseError::Config`].
    pub shared_leases: bool,
}

/// How a provider takes a set of keys at once (C18).
///
/// Either way the caller gets every key or none, and no two callers can
/// deadlock. The difference is what others see meanwhile: an atomic set is
/// never seen half held, while a set taken key by key holds its first keys
/// for a moment before it finds a later one held and gives them back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MultiKey {
    /// Whether the whole set is decided in one atomic store step.
    pub atomic: bool,
    /// The most keys one set may have: a larger set is refused with
    /// [`LeaseError::Config`] and changes nothing.
    pub max_keys: usize,
}

/// The most keys in one set, unless a provider declares fewer.
pub const DEFAULT_MAX_KEYS: usize = 64;

impl MultiKey {
    /// One key after another in key order, given back on a miss: what
    /// every provider can do over single-key acquires.
    pub fn in_key_order() -> Self {
        MultiKey {
            atomic: false,
            max_keys: DEFAULT_MAX_KEYS,
        }
    }

    /// The whole set in one atomic store step, up to `max_keys` keys.
    pub fn atomic(max_keys: usize) -> Self {
        MultiKey {
            atomic: true,
            max_keys,
        }
    }
}

/// What survives a failover of a replicated store (see
/// [`Capabilities::failover`]). The failover tests of each topology assert it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Failover {
    /// Whether every token handed out after a failover is greater than every
    /// token handed out before it.
    pub tokens: FailoverTokens,
    /// Whether a lease held when the failover starts is still held by its
    /// holder afterwards (renewals resume against the new leader), rather
    /// than lost, when its TTL is longer than [`recovery`](Self::recovery).
    pub lease_survives: bool,
    /// How long after the leader or primary is lost the provider serves
    /// again, by itself, on the same provider object: a waiter gets a key
    /// released after the failover within this bound of the loss.
    pub recovery: Duration,
}

/// Whether tokens keep growing across a failover.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailoverTokens {
    /// Tokens issued after a failover exceed every earlier one; the text says
    /// why (for example: the counter is committed on a majority before the
    /// token is returned).
    Increasing(String),
    /// A failover may hand out a token again; the text says when.
    MayRepeat(String),
}

impl Failover {
    /// A declaration: `tokens`, whether leases survive, and the recovery bound.
    pub fn new(tokens: FailoverTokens, lease_survives: bool, recovery: Duration) -> Self {
        Failover {
            tokens,
            lease_survives,
            recovery,
        }
    }
}

/// How far a store failover can push a lease's expiry past its TTL (see
/// [`Capabilities::failover_extension`]): `ttl_multiple × TTL + fixed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailoverExtension {
    /// Whole TTLs added (etcd: 1, the lease restarts at the new leader).
    pub ttl_multiple: u32,
    /// A fixed time added (etcd: the election timeout).
    pub fixed: Duration,
}

impl FailoverExtension {
    /// `ttl_multiple` whole TTLs plus `fixed`.
    pub fn new(ttl_multiple: u32, fixed: Duration) -> Self {
        FailoverExtension {
            ttl_multiple,
            fixed,
        }
    }

    /// The longest a lease of `ttl` may outlive its TTL across one failover.
    pub fn bound(&self, ttl: Duration) -> Duration {
        ttl.saturating_mul(self.ttl_multiple)
            .saturating_add(self.fixed)
    }
}

impl Capabilities {
    /// The declarations of `backend`, whose expiry is decided by `expiry_clock`
    /// and whose waiters are woken by `notifications`. The rest starts at the
    /// most modest claim: TTLs from 1 ms to [`DEFAULT_MAX_TTL`] in 1 ms steps,
    /// no expiry slack, token durability unknown, no holder session and no
    /// failover extension; the `with_*` methods declare more.
    pub fn new(
        backend: &'static str,
        expiry_clock: ExpiryClock,
        notifications: Notifications,
    ) -> Self {
        Capabilities {
            backend,
            min_ttl: Duration::from_millis(1),
            max_ttl: DEFAULT_MAX_TTL,
            ttl_granularity: Duration::from_millis(1),
            expiry_slack: Duration::ZERO,
            durable_tokens: TokenDurability::Unknown("not declared".into()),
            notifications,
            expiry_clock,
            holder_session: None,
            fair_waiting: false,
            failover_extension: None,
            failover: None,
            multi_key: MultiKey::in_key_order(),
            shared_leases: false,
        }
    }

    /// Sets the smallest and largest TTL accepted.
    pub fn with_ttl_limits(mut self, min: Duration, max: Duration) -> Self {
        self.min_ttl = min;
        self.max_ttl = max;
        self
    }

    /// Sets the step TTLs are rounded up to.
    pub fn with_ttl_granularity(mut self, granularity: Duration) -> Self {
        self.ttl_granularity = granularity;
        self
    }

    /// Sets how long past its TTL an expired lease may still refuse others.
    pub fn with_expiry_slack(mut self, slack: Duration) -> Self {
        self.expiry_slack = slack;
        self
    }

    /// Sets whether tokens survive a store restart.
    pub fn with_durable_tokens(mut self, durable_tokens: TokenDurability) -> Self {
        self.durable_tokens = durable_tokens;
        self
    }

    /// Declares that leases end with the holder's session, whose timeout is
    /// `timeout` (see [`holder_session`](Self::holder_session)).
    pub fn with_holder_session(mut self, timeout: Option<Duration>) -> Self {
        self.holder_session = timeout;
        self
    }

    /// Declares a queue of waiters per key (see
    /// [`fair_waiting`](Self::fair_waiting)).
    pub fn with_fair_waiting(mut self, fair: bool) -> Self {
        self.fair_waiting = fair;
        self
    }

    /// Declares how far a failover may lengthen a lease (see
    /// [`failover_extension`](Self::failover_extension)).
    pub fn with_failover_extension(mut self, extension: Option<FailoverExtension>) -> Self {
        self.failover_extension = extension;
        self
    }

    /// Declares how a set of keys is taken at once (see
    /// [`multi_key`](Self::multi_key)).
    pub fn with_multi_key(mut self, multi_key: MultiKey) -> Self {
        self.multi_key = multi_key;
        self
    }

    /// Declares read/write leases (see [`shared_leases`](Self::shared_leases)).
    pub fn with_shared_leases(mut self, shared: bool) -> Self {
        self.shared_leases = shared;
        self
    }

    /// Declares what survives a failover (see [`failover`](Self::failover)).
    pub fn with_failover(mut self, failover: Option<Failover>) -> Self {
        self.failover = failover;
        self
    }

    /// Checks `ttl` against this provider's limits and returns the TTL that will
    /// be granted: rounded up to [`ttl_granularity`](Self::ttl_granularity).
    ///
    /// # Errors
    /// [`LeaseError::InvalidTtl`] for zero, below-minimum or above-maximum TTLs.
    pub fn grant_ttl(&self, ttl: Duration) -> Result<Duration, LeaseError> {
        let invalid = |reason: String| Err(LeaseError::InvalidTtl { ttl, reason });
        if ttl.is_zero() {
            return invalid("a TTL must be greater than zero".into());
        }
        if ttl > self.max_ttl {
            return invalid(format!(
                "{} allows at most {:?}",
                self.backend, self.max_ttl
            ));
        }
        if ttl < self.min_ttl {
            return invalid(format!(
                "{} needs at least {:?}",
                self.backend, self.min_ttl
            ));
        }
        Ok(round_up(ttl, self.ttl_granularity).min(self.max_ttl))
    }

    /// A TTL fit for tests and demos: `wanted` raised to the minimum and rounded
    /// to the granularity.
    pub fn practical_ttl(&self, wanted: Duration) -> Duration {
        round_up(wanted.max(self.min_ttl), self.ttl_granularity).min(self.max_ttl)
    }
}

fn round_up(ttl: Duration, granularity: Duration) -> Duration {
    let g = granularity.as_nanos();
    if g <= 1 {
        return ttl;
    }
    let n = ttl.as_nanos();
    let rounded = n.div_ceil(g).saturating_mul(g);
    let secs = u64::try_from(rounded / 1_000_000_000).unwrap_or(u64::MAX);
    // The remainder is below 10^9, so it fits in u32.
    let nanos = (rounded % 1_000_000_000) as u32;
    Duration::new(secs, nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_clock_expiry_is_named_per_clock() {
        for c in [
            ExpiryClock::StoreServer,
            ExpiryClock::ServerWallClock,
            ExpiryClock::QuorumOfServers,
        ] {
            assert!(c.follows_wall_clock(), "{c:?}");
        }
        for c in [
            ExpiryClock::ProcessMonotonic,
            ExpiryClock::ConsensusLeader,
            ExpiryClock::HostMonotonic,
        ] {
            assert!(!c.follows_wall_clock(), "{c:?}");
        }
    }

    fn caps(min: u64, gran: u64) -> Capabilities {
        Capabilities {
            backend: "test",
            min_ttl: Duration::from_millis(min),
            max_ttl: DEFAULT_MAX_TTL,
            ttl_granularity: Duration::from_millis(gran),
            expiry_slack: Duration::ZERO,
            durable_tokens: TokenDurability::Volatile("test".into()),
            notifications: Notifications::TimedRetryOnly,
            expiry_clock: ExpiryClock::ProcessMonotonic,
            holder_session: None,
            fair_waiting: false,
            failover_extension: None,
            failover: None,
            multi_key: MultiKey::in_key_order(),
            shared_leases: false,
        }
    }

    #[test]
    fn ttl_is_rounded_up_to_granularity() {
        let c = caps(2000, 1000);
        assert_eq!(
            c.grant_ttl(Duration::from_millis(2001)).unwrap(),
            Duration::from_secs(3)
        );
        assert_eq!(
            c.grant_ttl(Duration::from_secs(2)).unwrap(),
            Duration::from_secs(2)
        );
        assert_eq!(
            c.practical_ttl(Duration::from_millis(10)),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn probed_capabilities_start_once_retry_after_failure_and_record() {
        let p = ProbedCapabilities::new(caps(10, 1));
        assert!(p.begin());
        assert!(!p.begin(), "only one probe at a time");
        p.failed();
        assert!(p.begin(), "a failed probe may run again");
        assert!(!p.get().durable_tokens.is_durable());
        let c = p.record(TokenDurability::Durable("fsync on".into()));
        assert!(c.durable_tokens.is_durable() && p.get().durable_tokens.is_durable());
        assert_eq!(p.get().min_ttl, Duration::from_millis(10));
        assert!(!p.begin(), "nothing left to probe");
        // A later probe's answer is returned as found, though `get` keeps
        // the first.
        let again = p.record(TokenDurability::Volatile("fsync off now".into()));
        assert!(!again.durable_tokens.is_durable());
        assert!(p.get().durable_tokens.is_durable());
    }

    #[test]
    fn bad_ttls_are_refused_with_reasons() {
        let c = caps(2000, 1000);
        for bad in [
            Duration::ZERO,
            Duration::from_millis(1500),
            DEFAULT_MAX_TTL + Duration::from_secs(1),
        ] {
            match c.grant_ttl(bad) {
                Err(LeaseError::InvalidTtl { ttl, reason }) => {
                    assert_eq!(ttl, bad);
                    assert!(!reason.is_empty());
                }
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }
}

/// Capabilities whose token durability a provider learns from its server once,
/// in the background on first use (Redis: AOF settings; PostgreSQL: `fsync`).
///
/// Until the probe answers, [`get`](Self::get) returns the base capabilities
/// (durability `Unknown`). A failed probe may be started again.
#[derive(Debug)]
pub struct ProbedCapabilities {
    base: Capabilities,
    probed: std::sync::OnceLock<Capabilities>,
    started: std::sync::atomic::AtomicBool,
}

impl ProbedCapabilities {
    /// Starts from `base`.
    pub fn new(base: Capabilities) -> Self {
        ProbedCapabilities {
            base,
            probed: std::sync::OnceLock::new(),
            started: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The probed capabilities, or the base ones until the probe answered.
    pub fn get(&self) -> &Capabilities {
        self.probed.get().unwrap_or(&self.base)
    }

    /// True exactly once (until [`failed`](Self::failed)): the caller should
    /// start the probe now.
    pub fn begin(&self) -> bool {
        self.probed.get().is_none() && !self.started.swap(true, std::sync::atomic::Ordering::SeqCst)
    }

    /// The probe failed; the next [`begin`](Self::begin) starts another.
    pub fn failed(&self) {
        self.started
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Records what the probe found and returns the resulting capabilities.
    pub fn record(&self, durable_tokens: TokenDurability) -> Capabilities {
        self.record_with(|c| Capabilities {
            durable_tokens,
            ..c
        })
    }

    /// Records the base capabilities as `probed` changes them (for probes
    /// that learn more than durability) and returns the result: what this
    /// probe found. [`get`](Self::get) keeps the first answer recorded (it
    /// hands out a reference for the provider's life), so a later probe's
    /// answer (a failover changed the replication settings) is this return
    /// value, never silently the first one.
    pub fn record_with(&self, probed: impl FnOnce(Capabilities) -> Capabilities) -> Capabilities {
        let fresh = probed(self.base.clone());
        let _ = self.probed.set(fresh.clone());
        fresh
    }
}

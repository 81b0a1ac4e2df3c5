//! Tokens, owner ids, leases and what `inspect` reports.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::LeaseKey;

/// A fencing token: a number issued with every lease that strictly increases
/// across every acquisition of a key (C8).
///
/// Hand it to the resource the lease protects; the resource refuses writes whose
/// token is lower than the highest it has seen (see [`FenceGate`](crate::FenceGate)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<u64> for FencingToken {
    fn from(v: u64) -> Self {
        FencingToken(v)
    }
}

/// A random 128-bit owner id, fresh for every lease (C5).
///
/// Providers store it beside the token; `extend` and `release` act only when both
/// match, so a stale holder can never touch the next holder's lease.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(u128);

impl OwnerId {
    /// A new random owner id (UUID v4: 122 random bits from a thread-local
    /// generator seeded by the OS, without a system call per id).
    pub fn random() -> Self {
        OwnerId(uuid::Uuid::new_v4().as_u128())
    }

    /// The id as 32 lowercase hex digits, the form providers store.
    pub fn to_hex(self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut hex = String::with_capacity(48);
        for i in (0..32).rev() {
            hex.push(char::from(DIGITS[((self.0 >> (i * 4)) & 0xf) as usize]));
        }
        hex
    }

    /// Parses the 32-hex-digit form written by [`OwnerId::to_hex`].
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 32 {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(OwnerId)
    }

    /// The id as a number.
    pub fn as_u128(self) -> u128 {
        self.0
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerId({:032x})", self.0)
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// The safety margin subtracted from the granted TTL for local validity (C10):
/// 1% of the TTL plus 2 ms, for clock-rate drift between client and store.
pub fn drift_margin(ttl: Duration) -> Duration {
    (ttl / 100).saturating_add(Duration::from_millis(2))
}

/// A backend's own reference to a lease, kept with it so that `extend` and
/// `release` address the same store object the acquire created. Typed per
/// backend, so nothing is narrowed or sign-folded on the way.
///
/// Its text form (`none`, `etcd:<lease id>`, `zk:<version>`) is what the `lease`
/// command prints as `LEASE_HANDLE` and parses back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeaseHandle {
    /// The backend keeps nothing beside key, owner and token (memory, Redis,
    /// Redlock, PostgreSQL).
    #[default]
    None,
    /// The etcd lease the key is attached to.
    EtcdLease(i64),
    /// The etcd lease of a [`LeaseSession`](crate::LeaseSession) the key is
    /// attached to with the session's other keys: a release deletes the key
    /// and leaves the etcd lease to the session.
    EtcdSession(i64),
    /// The version of the ZooKeeper key node when the lease was created; extend
    /// and release check it in the same transaction.
    ZkKeyVersion(i32),
}

impl fmt::Display for LeaseHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseHandle::None => f.write_str("none"),
            LeaseHandle::EtcdLease(id) => write!(f, "etcd:{id}"),
            LeaseHandle::EtcdSession(id) => write!(f, "etcd-session:{id}"),
            LeaseHandle::ZkKeyVersion(v) => write!(f, "zk:{v}"),
        }
    }
}

impl std::str::FromStr for LeaseHandle {
    type Err = crate::LeaseError;

    /// Parses the text form written by `Display`; an empty string is `None`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            crate::LeaseError::Config(format!(
                "lease handle {s:?} is not `none`, `etcd:<lease id>`, `etcd-session:<lease id>` or `zk:<version>`"
            ))
        };
        match s.split_once(':') {
            None if s.is_empty() || s == "none" => Ok(LeaseHandle::None),
            Some(("etcd", id)) => id.parse().map(LeaseHandle::EtcdLease).map_err(|_| bad()),
            Some(("etcd-session", id)) => {
                id.parse().map(LeaseHandle::EtcdSession).map_err(|_| bad())
            }
            Some(("zk", v)) => v.parse().map(LeaseHandle::ZkKeyVersion).map_err(|_| bad()),
            _ => Err(bad()),
        }
    }
}

/// What a lease holds its key as (C19): alone, the plain lease; or as one of
/// a read/write lease's readers or its writer, a store object of its own
/// beside the plain lease of the same key name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LeaseKind {
    /// A plain lease: one holder, from [`LeaseProvider::try_acquire`](crate::LeaseProvider::try_acquire).
    #[default]
    Exclusive,
    /// One of any number of readers of a read/write lease.
    Read {
        /// The token of the last writer that held the key before this
        /// reader came (zero: none yet). A resource refuses the reader once a
        /// newer writer has written ([`FenceGate::read`](crate::FenceGate::read)).
        writer_epoch: FencingToken,
    },
    /// The one writer of a read/write lease: no reader holds the key meanwhile.
    Write,
}

impl LeaseKind {
    /// True for a reader.
    pub fn is_read(self) -> bool {
        matches!(self, LeaseKind::Read { .. })
    }
}

/// One holder's claim on a key until its expiry.
///
/// A lease is plain data: it holds no connection and does not renew itself. Use a
/// [`LeaseGuard`](crate::LeaseGuard) to keep it alive while a job runs.
#[derive(Clone, Debug)]
pub struct Lease {
    key: LeaseKey,
    token: FencingToken,
    owner: OwnerId,
    ttl: Duration,
    sent_at: Instant,
    valid_until: Instant,
    handle: LeaseHandle,
    holder: Arc<str>,
    kind: LeaseKind,
}

impl Lease {
    /// Builds a lease; for providers. `sent_at` is when the acquire (or extend)
    /// request was sent; local validity is `sent_at + ttl - drift_margin(ttl)`.
    /// Its holder label is this process's [`holder`](crate::holder()); a
    /// provider that stored another one says so with [`with_holder`](Self::with_holder).
    pub fn new(
        key: LeaseKey,
        token: FencingToken,
        owner: OwnerId,
        ttl: Duration,
        sent_at: Instant,
    ) -> Self {
        let valid_until =
            crate::time::deadline_after(sent_at, ttl.saturating_sub(drift_margin(ttl)));
        Lease {
            key,
            token,
            owner,
            ttl,
            sent_at,
            valid_until,
            handle: LeaseHandle::None,
            holder: crate::holder(),
            kind: LeaseKind::Exclusive,
        }
    }

    /// The same lease after an extend sent at `sent_at` that granted `ttl`:
    /// key, token, owner, handle and holder are kept, local validity is new.
    pub fn renewed(&self, ttl: Duration, sent_at: Instant) -> Self {
        Lease {
            ttl,
            sent_at,
            valid_until: crate::time::deadline_after(
                sent_at,
                ttl.saturating_sub(drift_margin(ttl)),
            ),
            ..self.clone()
        }
    }

    /// Sets the holder label the store recorded for this lease.
    pub fn with_holder(mut self, holder: Arc<str>) -> Self {
        self.holder = holder;
        self
    }

    /// Attaches the backend's own reference to the lease (an etcd lease id, a
    /// ZooKeeper node version).
    pub fn with_handle(mut self, handle: LeaseHandle) -> Self {
        self.handle = handle;
        self
    }

    /// Marks the lease as a reader or writer of a read/write lease.
    pub fn with_kind(mut self, kind: LeaseKind) -> Self {
        self.kind = kind;
        self
    }

    /// Narrows local validity further (Redlock subtracts the time the quorum took).
    pub fn with_valid_until(mut self, valid_until: Instant) -> Self {
        self.valid_until = self.valid_until.min(valid_until);
        self
    }

    /// The leased key.
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }

    /// The fencing token of this lease.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The random owner id of this lease.
    pub fn owner(&self) -> OwnerId {
        self.owner
    }

    /// The TTL the store granted (after rounding to its granularity).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the request that granted (or last extended) this lease was sent.
    pub fn sent_at(&self) -> Instant {
        self.sent_at
    }

    /// The instant before which the lease is surely still held (C10): never
    /// later than [`sent_at`](Self::sent_at) + [`ttl`](Self::ttl).
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// How long the lease is surely still held from now; zero once past.
    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// True while local validity has not run out. Needs no I/O.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }

    /// The backend's reference set by [`with_handle`](Self::with_handle);
    /// [`LeaseHandle::None`] for backends that need none.
    pub fn handle(&self) -> LeaseHandle {
        self.handle
    }

    /// Who holds this lease, as recorded in the store (see [`holder`](crate::holder())).
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Whether this is a plain lease, a reader or a writer (C19).
    pub fn kind(&self) -> LeaseKind {
        self.kind
    }
}

/// What [`LeaseProvider::inspect_rw`](crate::LeaseProvider::inspect_rw)
/// reports about a read/write lease (C19).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwInfo {
    /// The writer, if one holds the key.
    pub writer: Option<LeaseInfo>,
    /// The live readers.
    pub readers: Vec<LeaseInfo>,
    /// How many writers wait (each keeps new readers out until it is served
    /// or its wait ends).
    pub writers_waiting: usize,
    /// The token of the last writer that held the key (zero: none yet): what
    /// a reader taking the key now carries as its writer epoch.
    pub writer_epoch: FencingToken,
}

/// What `inspect` reports about a held key (C13).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseInfo {
    /// The holder's fencing token.
    pub token: FencingToken,
    /// How long until the store expires the lease, as the store sees it now.
    pub remaining: Duration,
    /// The holder's owner id, where the store keeps it readable.
    pub owner: Option<OwnerId>,
    /// The holder's label (by default `user@host:pid`), when it recorded one;
    /// leases written by a version without labels have none.
    pub holder: Option<String>,
}

impl LeaseInfo {
    /// A holder with `token` whose lease the store ends in `remaining`; its
    /// owner id and label where the store keeps them.
    pub fn new(
        token: FencingToken,
        remaining: Duration,
        owner: Option<OwnerId>,
        holder: Option<String>,
    ) -> Self {
        LeaseInfo {
            token,
            remaining,
            owner,
            holder,
        }
    }
}

/// The answer of `try_acquire`.
#[derive(Clone, Debug)]
pub enum TryAcquire {
    /// The key was free (or expired) and is now ours.
    Acquired(Lease),
    /// Someone else holds the key.
    Held {
        /// How long the current holder's lease still runs, when the store said.
        remaining: Option<Duration>,
    },
}

impl TryAcquire {
    /// The lease, if acquired.
    pub fn into_lease(self) -> Option<Lease> {
        match self {
            TryAcquire::Acquired(l) => Some(l),
            TryAcquire::Held { .. } => None,
        }
    }

    /// True if acquired.
    pub fn is_acquired(&self) -> bool {
        matches!(self, TryAcquire::Acquired(_))
    }
}

/// What [`LeaseProvider::try_acquire_all`](crate::LeaseProvider::try_acquire_all)
/// found: every key of the set taken, or none (C18).
#[derive(Clone, Debug)]
pub enum TryAcquireAll {
    /// Every key was free (or expired) and is now ours: one lease per key, in
    /// the order the keys were asked for, each with its own fencing token.
    Acquired(Vec<Lease>),
    /// Someone else holds `key`, so no key of the set was taken (or every key
    /// taken on the way was given back).
    Held {
        /// A key of the set that another holder has.
        key: LeaseKey,
        /// How long that holder's lease still runs, when the store said.
        remaining: Option<Duration>,
    },
}

impl TryAcquireAll {
    /// The leases, if every key was acquired.
    pub fn into_leases(self) -> Option<Vec<Lease>> {
        match self {
            TryAcquireAll::Acquired(l) => Some(l),
            TryAcquireAll::Held { .. } => None,
        }
    }

    /// True if every key was acquired.
    pub fn is_acquired(&self) -> bool {
        matches!(self, TryAcquireAll::Acquired(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_ids_roundtrip_and_differ() {
        let a = OwnerId::random();
        let b = OwnerId::random();
        assert_ne!(a, b);
        assert_eq!(OwnerId::from_hex(&a.to_hex()), Some(a));
        assert_eq!(OwnerId::from_hex("xyz"), None);
        // Zero-padded, lowercase, most significant digit first.
        let small = OwnerId(0xab);
        assert_eq!(small.to_hex(), format!("{:032x}", 0xabu128));
        assert_eq!(OwnerId(u128::MAX).to_hex(), "f".repeat(32));
        assert_eq!(a.to_hex(), format!("{:032x}", a.0));
    }

    #[test]
    fn handles_roundtrip_through_text_without_loss() {
        for h in [
            LeaseHandle::None,
            LeaseHandle::EtcdLease(i64::MAX),
            LeaseHandle::EtcdLease(-7),
            LeaseHandle::EtcdSession(42),
            LeaseHandle::ZkKeyVersion(i32::MIN),
            LeaseHandle::ZkKeyVersion(0),
        ] {
            assert_eq!(h.to_string().parse::<LeaseHandle>().unwrap(), h);
        }
        assert_eq!("".parse::<LeaseHandle>().unwrap(), LeaseHandle::None);
        for bad in ["0", "etcd:", "zk:99999999999", "redis:1", "etcd:1x"] {
            assert!(bad.parse::<LeaseHandle>().is_err(), "{bad}");
        }
    }

    #[test]
    fn tokens_order_and_display() {
        assert!(FencingToken(2) > FencingToken(1));
        assert_eq!(FencingToken(42).to_string(), "42");
    }

    #[tokio::test(start_paused = true)]
    async fn local_validity_is_before_sent_plus_ttl() {
        let sent = Instant::now();
        let ttl = Duration::from_secs(10);
        let l = Lease::new(
            LeaseKey::new("k").unwrap(),
            FencingToken(1),
            OwnerId::random(),
            ttl,
            sent,
        );
        assert!(l.valid_until() < sent + ttl);
        assert_eq!(l.valid_until(), sent + ttl - Duration::from_millis(102));
        assert!(l.is_valid());
        tokio::time::advance(ttl).await;
        assert!(!l.is_valid());
        assert_eq!(l.remaining(), Duration::ZERO);
    }
}

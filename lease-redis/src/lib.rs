//! # lease-redis: leases on Redis, one node or a Redlock majority
//!
//! Two providers of the [`lease_api`] contract:
//!
//! - [`RedisProvider`]: one Redis server. Each operation is **one Lua script**,
//!   so one round trip: acquire is "if the key is absent, INCR the fence counter
//!   and `SET owner:token PX ttl`"; extend and release compare the owner before
//!   acting; release PUBLISHes the key so waiters wake at once.
//! - [`RedlockProvider`]: N >= 3 independent Redis servers; a lease is held when a
//!   majority accepted it within its validity (TTL minus the time the round took
//!   minus a drift margin).
//!
//! ```no_run
//! # async fn demo() -> lease_api::Result<()> {
//! use std::time::Duration;
//! use lease_api::{LeaseKey, LeaseProvider};
//! use lease_redis::{RedisConfig, RedisProvider};
//!
//! let provider = RedisProvider::new(RedisConfig::new("redis://127.0.0.1:6379").namespace("billing"))?;
//! let key = LeaseKey::new("settlement/2026-12-02")?;
//! if let Some(lease) = provider.try_acquire(&key, Duration::from_secs(30)).await?.into_lease() {
//!     println!("holding {key} with fencing token {}", lease.token());
//!     provider.release(&lease).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! ## TLS and authentication
//!
//! `rediss://user:password@host:port/db` connects over TLS (rustls) and
//! verifies the server's certificate against the system's roots
//! (`SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured), or against a private CA
//! given as `?ca=/path/to/ca.pem`. `user:password` is a Redis 6+ ACL user
//! (`:password` alone is the default user's `requirepass`). A wrong password, a
//! disabled user, a missing ACL permission or a certificate that fails
//! verification is [`LeaseError::Denied`](lease_api::LeaseError::Denied), never
//! `Unavailable`, so nothing retries it. Passwords never appear in `Debug`,
//! errors or logs: the provider shows the server as `scheme://host:port`.
//!
//! ## Key layout
//!
//! A lease on `key` in namespace `ns` is the string key `{ns|key}:lease` holding
//! `<owner>:<token>` with a PX expiry, and its fence counter is `{ns|key}:fence`
//! (no expiry, so tokens keep growing after release and expiry). Both share the
//! hash tag `{ns|key}`, so they live in one Redis Cluster slot and one script may
//! touch both. `%`, `{`, `}` and `|` are percent-encoded inside the tag, so no key
//! can end the tag early and no two keys collide. Releases are announced on the
//! channel `lease-released|ns` with the key as message.
//!
//! The counter is one small key per lease key ever used. It is the price of
//! tokens that never go back; delete counters only for keys you will never use again.
//!
//! ## Expiry and tokens
//!
//! Expiry is the server's own key expiry (PX), never the client's clock. Tokens
//! survive a restart only if the fence counters do: with AOF and `appendfsync
//! always`. [`RedisProvider::probe`] (run by itself in the background on first
//! use) reads the server's configuration and the capabilities say which it is.
//! Managed Redis that refuses `CONFIG GET` is reported as unknown.
//!
//! ## Sentinel
//!
//! `redis+sentinel://[user:password@]s1:26379,s2:26379,s3:26379/<master-name>[/<db>][?wait=N]`
//! makes [`RedisProvider`] follow the primary that the Sentinels name, across
//! failovers, on the same provider object. The credentials are the data
//! nodes'; the Sentinels are asked without them. Redis replicates
//! asynchronously, so a replica promoted after a crash may lack the last
//! leases and counter increments: two holders, and a token handed out
//! twice. So every acquire and extend is followed, in one pipeline on one
//! connection, by `WAIT N` (N = `wait`, default 1); when fewer replicas
//! acknowledge within half the response timeout, the acquire is refused
//! (`Unavailable`) and its lease given back, and the extend is refused, so
//! the holder keeps counting on the previous, replicated expiry.
//! `Capabilities::failover` declares tokens increasing only when `wait`
//! covers every replica the primary has (the probe counts them): Sentinel
//! ranks replicas by `replica-priority` before replication offset, and a
//! failover while the old primary still runs can make a replica that
//! acknowledged writes drop them in a full resync. With fewer it declares
//! `MayRepeat`, and a lease survives when the promoted replica keeps `wait`
//! replicas of its own. The recovery bound follows from the Sentinels'
//! `down-after-milliseconds`, read before the first call answers.
//!
//! ## Cluster
//!
//! `redis+cluster://[user:password@]n1:7000,n2:7001,...[?wait=N]` talks to a
//! Redis Cluster; any nodes will do as seeds. A lease key, its fence counter
//! and its tombstones share one hash tag, so they live in one slot and one
//! script touches them all; a batched extend runs one script per lease,
//! concurrently. Each acquire and extend waits for `wait` replicas of its
//! shard (default 1), as under Sentinel. Releases are announced with a plain
//! PUBLISH, which reaches every node, and the subscriber listens on any one
//! (the next seed after a failure). The probe reads `cluster-node-timeout`
//! and the replicas per shard; see `Capabilities::failover` for what that
//! promises. `purge_namespaces` is refused on a cluster (SCAN covers one
//! node).
//!
//! ## One node, Redlock, or another backend?
//!
//! - **One node** is the fastest choice and right when Redis is already a
//!   dependency you trust to stay up. Its weak spot is failover: Redis replication
//!   is asynchronous, so a replica promoted after a crash may not have the lease
//!   (two holders) and may not have the last counter increments (tokens repeat).
//! - **Redlock** survives the loss of a minority of nodes without that failover
//!   hole, at the price of N servers and a round to each. Martin Kleppmann's
//!   critique still applies: Redlock's safety rests on bounded process pauses,
//!   network delays and clock drift; a holder paused by GC past its TTL, or a
//!   node whose clock jumps, can let two holders believe they hold the lease.
//!   No lock service can prevent that alone. What closes the gap is **fencing**:
//!   every write carries the lease's token and the resource refuses a token lower
//!   than one it has seen, so the paused holder's late write fails. That is why
//!   our Redlock issues tokens that strictly increase across different
//!   majorities (below), which classic Redlock does not.
//! - **PostgreSQL or etcd** when you need tokens that survive anything the store
//!   survives, or (PostgreSQL) a lease check inside the same transaction as the
//!   write.
//!
//! ## Redlock tokens
//!
//! A per-node INCR alone is not monotonic across majorities: nodes A, B may
//! issue 7 while B, C issue 5 later. So acquire takes two steps. Step one runs the
//! single-node acquire script on every node; the token is the highest counter
//! among the nodes that granted it. Step two, on those nodes and while the lease
//! is held there, raises each node's counter to that token. Any later majority
//! shares at least one node with this one, whose counter is now >= our token, so
//! its token is larger. The lease counts as acquired only when a majority
//! completed both steps within its validity. Step two is skipped when every
//! node of the majority returned the same counter: each is then already at the
//! token, which is the steady state of healthy nodes (they all count every
//! acquisition), so acquire is usually one round. A unit test checks
//! monotonicity over every sequence of majorities, late grants, partial raises
//! and rounds that ran out of time, on 3 and 5 nodes. A node that restarts without its
//! counters breaks this, as it breaks Redlock's mutual exclusion: keep AOF with
//! `appendfsync always`, or keep a restarted node out for longer than the
//! longest TTL.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod address;
mod keys;
mod node;
mod redlock;
mod rw_scripts;
mod scripts;
mod sentinel;
mod single;
mod time;

pub use redlock::{RedlockConfig, RedlockProvider};

/// The Lua scripts of one acquire and one release, for `lease-bench`'s
/// *protocol* floor: this crate's store work run on a raw client, to tell
/// the cost of the protocol from the cost of the client; and Redlock's
/// decisions (the majority, the token of a won round), which the
/// `lease-model` checker explores. Not a stable API.
#[doc(hidden)]
pub mod protocol {
    pub use crate::redlock::{TokenStep, quorum, token_step};

    /// KEYS: lease, fence, cancel tombstone. ARGV: owner hex, TTL in
    /// milliseconds, holder label. Returns `{won, token or PTTL, holder}`.
    pub fn acquire() -> &'static redis::Script {
        &crate::scripts::ACQUIRE
    }

    /// KEYS: lease. ARGV: `<owner hex>:<token>`, release channel, key.
    /// Returns 1 when released.
    pub fn release() -> &'static redis::Script {
        &crate::scripts::RELEASE
    }
}
pub use single::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT, RedisConfig, RedisProvider};

//! # lease-zk: leases on ZooKeeper
//!
//! [`ZkProvider`] keeps each lease as an **ephemeral** node, so a crashed process
//! frees its leases when its session ends, uses the node's **czxid** as the
//! fencing token, and judges TTL expiry on **ZooKeeper's clock**.
//!
//! ```no_run
//! # async fn demo() -> lease_api::Result<()> {
//! use std::time::Duration;
//! use lease_api::{LeaseKey, LeaseProvider};
//! use lease_zk::{ZkConfig, ZkProvider};
//!
//! let provider = ZkProvider::new(ZkConfig::new("zk1:2181,zk2:2181,zk3:2181").chroot("/apps").namespace("billing"))?;
//! let key = LeaseKey::new("settlement/2026-12-02")?;
//! if let Some(lease) = provider.try_acquire(&key, Duration::from_secs(10)).await?.into_lease() {
//!     println!("holding {key} with fencing token {}", lease.token());
//!     provider.release(&lease).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! ## Authentication and ACLs
//!
//! [`ZkConfig::digest`] (or `zk://user:password@hosts/chroot` in the `lease`
//! facade) logs the session in with ZooKeeper's `digest` scheme, and every node
//! the provider creates (the `/lease` root, namespace, key and holder nodes,
//! and the chroot) then carries an ACL that gives that identity all rights and
//! everyone else only reading: another identity can read who holds a key but
//! cannot delete a holder node or create keys in the namespace, and gets
//! [`LeaseError::Denied`](lease_api::LeaseError::Denied). Without a digest the
//! nodes are open to anyone, as before. Nodes created earlier keep their ACL.
//!
//! ## Node layout
//!
//! ```text
//! [chroot]/lease/<namespace>              persistent; also the clock probe
//! [chroot]/lease/<namespace>/<key>        persistent; its version is the acquisition epoch
//! [chroot]/lease/<namespace>/<key>/holder ephemeral; data "<owner>:<ttl ms>"; czxid = token
//! ```
//!
//! Namespace and key are each encoded into ONE path segment: every byte but
//! ASCII letters, digits, `-` and `_` is percent-encoded, so `/`, `.`, `..` and
//! `zookeeper` are ordinary keys and no two keys share a node. The persistent key
//! node stays after release (one small node per key ever used).
//!
//! ## Tokens
//!
//! The holder node's czxid: the id of the transaction that created it. zxids are
//! global, strictly increasing and carry the leader epoch in their high bits, so
//! tokens grow across every acquisition, client, leader change and restart.
//!
//! ## Expiry clock
//!
//! ZooKeeper has no TTL for ephemeral nodes, and its container TTLs are far too
//! coarse. So a lease is expired when `now >= mtime + ttl` where `mtime` is the
//! holder node's modification time (set by the leader when it committed the last
//! acquire or extend) and `now` is the mtime of a probe write to the namespace
//! node, also set by the leader. No client clock takes part in the judgement
//! itself. One probe serves every caller of a provider for up to a second:
//! `inspect`, expiry judgements and waiter wake-ups use that sample advanced by
//! the local monotonic clock. The sample was taken before its answer arrived,
//! so the estimate is a lower bound of the server's clock: a takeover is never
//! early and at most one round trip late, and `inspect` writes at most one
//! probe per second per provider instead of one per call. `extend` of a lease
//! past its local validity takes a fresh probe and refuses a lease the server
//! considers expired. The check is made when the request leaves: a request held
//! up past the lease's end (a pause between the check and the send) can still
//! extend or release a lease that expired meanwhile, on either path, but never
//! one somebody acquired since (the epoch check refuses that). Taking over an
//! expired holder is one multi: delete the holder at the version that was judged
//! expired, create ours, bump the key node's version. If leadership moves between
//! the two writes, the judgement uses two servers' wall clocks; keep ZooKeeper
//! hosts in NTP sync (the declared slack covers millisecond rounding only).
//!
//! A follower answers reads from what it has applied so far, which can lag
//! a release or an acquire another client has already seen acknowledged.
//! `inspect`, and a release by a client other than the acquiring one, send
//! a `sync` for the holder node just before their read. A session's
//! requests are answered in order, so the read waits for the follower to
//! catch up with the leader, at no extra client round trip. `sync` is not
//! acknowledged by a quorum: across a leader change, a follower still
//! following the old leader can answer from its older state
//! (ZOOKEEPER-1675). Such a read is only informational for `inspect`; a
//! release that misjudges the holder this way answers `NotHeld` and
//! deletes nothing it should not, since its delete checks versions.
//!
//! ## Extend and release
//!
//! Every acquisition bumps the persistent key node's version (the epoch, kept in
//! the lease) and makes, beside the ephemeral holder node, an empty ephemeral
//! marker named after the owner id. A lease this provider acquired, on the
//! session it still talks through, and still valid by our clock, is extended
//! with one multi `check(key node, epoch) + check(marker) + setData(holder)`
//! and released with one `check(key node, epoch) + delete(marker) +
//! delete(holder)`: one round trip each. The provider remembers what it
//! issued (key, owner, token, epoch, session), so a lease rebuilt with
//! another owner or token, or one from another provider, never takes this
//! path. The marker is there for `purge_namespaces`: it deletes key nodes, so
//! epochs start again and a new holder's can equal an old holder's; the old
//! holder's marker is gone (a purge deletes markers before holder nodes), so
//! its one-multi extend fails as lost and its release as not held, never
//! touching the new holder's node. Any other lease is read first: extend
//! checks owner, czxid, session and expiry, then runs
//! `check(key node, epoch) + setData(holder, version)`; release checks owner
//! and czxid, then runs
//! `check(key node, epoch) + delete(holder, version)` and removes the marker
//! after; release of a lease that already expired still deletes the node
//! (waiters wake at once) but reports `NotHeld`, like every backend. A holder
//! node deleted and recreated by a takeover always comes with a new epoch, so
//! a stale holder can never touch it, even when node versions happen to
//! match; its left-over marker is removed when it learns the lease is gone,
//! or with its session.
//!
//! ## Sessions
//!
//! A lease lives on the provider's session. When the session expires (the holder
//! was cut off longer than the session timeout), ZooKeeper deletes the holder
//! node and another process can take the key at once. The server clamps the
//! requested timeout to its `minSessionTimeout`..`maxSessionTimeout`, so the
//! provider uses the timeout the server **granted** (also what
//! `capabilities().holder_session` reports once connected), never the one it
//! asked for. Local validity therefore never extends past two thirds of the
//! granted session timeout after the last acquire or extend was sent (the point where ZooKeeper's own clients consider a
//! silent session in doubt), and guards renew within that window: a cut-off
//! holder's lost signal fires before the server can expire its session. While
//! the connection is down (session still alive) calls fail with `Unavailable`
//! at once instead of being queued and sent after the reconnect. The provider
//! opens a new session once the old one expired.
//!
//! ## Waiting
//!
//! Waiters set an exists watch on the holder node before trying; its deletion
//! (release, takeover or session end) wakes them, with a timed retry at the
//! holder's remaining TTL as fallback.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cleanup;
mod config;
mod issued;
mod multi;
mod ops;
mod plan;
mod provider;
mod queue;
mod rw;
mod session;
#[cfg(test)]
mod takeover_tests;
mod watch;

/// What each of the provider's multis checks and changes, as data (the
/// steps the provider writes into ZooKeeper's multi), for the `lease-model`
/// checker, which runs the same steps on its own tree. Not a stable API.
#[doc(hidden)]
pub mod protocol {
    pub use crate::plan::{Judged, Step, claim, extend, forget, release};
}

pub use config::ZkConfig;
pub use provider::ZkProvider;

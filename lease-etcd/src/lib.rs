//! # lease-etcd: leases on etcd, with revision fencing tokens
//!
//! [`EtcdProvider`] maps each lease to an etcd key attached to an etcd lease.
//! etcd's revisions are durable, global and monotonic, which makes the key's
//! **create revision** a ready-made fencing token.
//!
//! ```no_run
//! # async fn demo() -> lease_api::Result<()> {
//! use std::time::Duration;
//! use lease_api::{LeaseKey, LeaseProvider};
//! use lease_etcd::{EtcdConfig, EtcdProvider};
//!
//! let provider = EtcdProvider::new(EtcdConfig::new(["http://127.0.0.1:2379"]).namespace("billing"))?;
//! let key = LeaseKey::new("settlement/2026-12-02")?;
//! if let Some(lease) = provider.try_acquire(&key, Duration::from_secs(10)).await?.into_lease() {
//!     println!("holding {key} with fencing token {}", lease.token());
//!     provider.release(&lease).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! ## TLS and authentication
//!
//! `https://` endpoints use rustls: [`EtcdTls`] names the CA of the servers'
//! certificates (the system's roots otherwise) and a client certificate for
//! servers started with `--client-cert-auth`; [`EtcdConfig::credentials`] logs
//! in as an etcd user (`auth enable`). The `lease` facade reads all of it from
//! `etcds://user:password@h1:p,h2:p?ca=/ca.pem&cert=/client.pem&key=/client.key`.
//! A wrong password, a user without permission on the `lease/` prefix or a
//! server certificate that fails verification is
//! [`LeaseError::Denied`](lease_api::LeaseError::Denied). One refusal cannot be
//! told apart from a network failure: under TLS 1.3 a server that rejects a
//! missing client certificate does so after the handshake, so the client sees a
//! closed connection and reports `Unavailable`.
//!
//! ## How it works
//!
//! - **Key layout**: `lease/<namespace>/<key>`, the namespace percent-encoded so it
//!   holds no `/`. Every operation and every watch uses the exact key, never a
//!   prefix, so `a` and `ab` (or `a/b`) are different leases that never wake each
//!   other's waiters. The value is the holder's owner id, `:` and its holder
//!   label (`user@host:pid` by default).
//! - **Acquire** (two round trips): grant an etcd lease with the TTL, then one
//!   transaction `if create_revision(key) == 0 then put(key, owner, lease) else
//!   get(key)`. When the key was held, the unused etcd lease is kept as the
//!   key's spare (one per key; an earlier one is revoked): the next try on the
//!   key, typically the one a watch's wake-up makes, sends its transaction on
//!   the spare together with a keep-alive of it, one round trip instead of a
//!   grant and then a transaction. Its validity starts before both were sent
//!   once the keep-alive answered (a lease etcd renewed was alive all along,
//!   so the key put on it cannot have expired in between); if the keep-alive
//!   fails, the spare's grant bounds it. A spare with less than a quarter of
//!   its TTL left, or for another TTL, is revoked instead of used, and an
//!   unused one runs out by its TTL with nothing attached. A key the provider saw held
//!   (and has not seen deleted by a watch) is first read, one cheap round trip,
//!   so repeated looks at a held key grant no etcd leases. etcd reports a
//!   holder's remaining TTL in whole seconds rounded down; the provider rounds
//!   up, so a waiter in the holder's last second sleeps to its end (or the
//!   deletion's watch event) instead of retrying at once.
//! - **Failover**: a new leader restarts every etcd lease at its full TTL, so
//!   across a leader change an unrenewed lease can outlive its TTL by another
//!   TTL plus the election timeout; `Capabilities::failover_extension` says so.
//! - **Token** = the key's create revision, which etcd assigns from one global,
//!   durable counter: tokens grow across every acquisition, every client and
//!   every restart of the cluster.
//! - **Extend** with the same TTL is one keep-alive (opening etcd-client's
//!   keep-alive stream sends it and waits for etcd's answer), then a read that the key is
//!   still ours and still on that etcd lease; with another TTL, a new etcd
//!   lease is granted and attached by a transaction guarded on the key's create
//!   revision and owner (the put keeps the value), then the old one is revoked.
//!   An extend dropped while that move is in flight is settled in the
//!   background, retried until the caller's validity ends: the move is fenced
//!   off, and if it landed, the key goes back to the etcd lease the caller's
//!   `Lease` still names. etcd unreachable for that whole time leaves it
//!   unsettled (a warning says so), and a move to a shorter TTL can then end
//!   the key before the caller's validity.
//!   The move is also guarded on the key's mod revision (read first: one more
//!   round trip, only when the TTL changes). When its answer is lost, a no-op
//!   put guarded on that revision fences it off, or finds that it landed; so a
//!   lost move never lands later, unseen. If etcd does not answer the fence
//!   either, the new etcd lease is never revoked under a key it may carry, and
//!   the extend reports the lease lost when the new TTL is shorter than what
//!   the holder believes it still has.
//! - **Release** is a transaction guarded the same way that deletes the key.
//!   The etcd lease, now without a key, becomes the key's spare instead of
//!   being revoked: the next try on the key needs no grant, and no revoke
//!   queues in etcd beside a woken waiter's transaction. Only an etcd lease
//!   the key was deleted from, and that this provider granted and renewed
//!   itself, becomes a spare, with the TTL and renewal time the provider
//!   noted (never those of the `Lease` handed to `release`, which may have
//!   been rebuilt or be a copy from before an extend); any other is revoked.
//!   An unused spare runs out by its TTL. Keys you attach to the lease's etcd
//!   lease yourself are therefore not removed by the release.
//! - **Waiting** watches the exact key for its deletion (release or expiry).
//!   The waiter tries first and watches only a held key: the watch starts at
//!   the revision after the answer that showed the key held, so etcd replays a
//!   deletion that came in between (a key never seen held is read once as the
//!   watch starts). A woken waiter's next step is then its try alone, one
//!   round trip with the spare, where a new watch before each try took two.
//! - **Fencing inside etcd**: [`EtcdProvider::txn_if_held`] runs your operations
//!   in a transaction that only succeeds while the lease is held, and
//!   [`EtcdProvider::held_compares`] gives the comparisons for your own
//!   transactions.
//!
//! ## TTLs
//!
//! etcd lease TTLs are whole seconds, and the server refuses anything below its
//! minimum (1.5 x the election timeout, so 2 s with defaults). Requested TTLs
//! are rounded up to whole seconds; the lease reports the TTL etcd granted.
//!
//! ## Leader changes
//!
//! Lease expiry is clocked by the leader. When leadership moves, etcd extends
//! every lease by the remaining election time rather than expiring it early:
//! a lease can outlive its TTL a little (declared as expiry slack), never end
//! early. Keep-alives and transactions during an election fail with
//! `Unavailable`; the guard retries them until local validity ends.
//!
//! ## When to prefer etcd
//!
//! When the platform already runs etcd (Kubernetes operators, infrastructure
//! tooling) and you want tokens that survive anything the cluster survives, with
//! linearizable writes. It is slower per acquire than Redis and has a 2 s
//! minimum TTL; it is not the store for thousands of short leases per second.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod acquire;
mod config;
mod issued;
mod moves;
mod multi;
mod ops;
mod provider;
mod queue;
mod rw;
mod session;
mod watch;

pub use config::{EtcdConfig, EtcdTls};
pub use provider::EtcdProvider;
#[doc(hidden)]
pub use provider::SessionHook;

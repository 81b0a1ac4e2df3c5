//! # lease-postgres: leases in a PostgreSQL table
//!
//! [`PostgresProvider`] keeps one row per key and times every lease by the
//! **database clock** (`clock_timestamp()`), never the client's. For teams that
//! already run PostgreSQL and would rather not run another store, and for
//! money-moving work: [`PostgresProvider::begin_fenced`] checks the lease inside the
//! same transaction as the business write.
//!
//! ```no_run
//! # async fn demo() -> lease_api::Result<()> {
//! use std::time::Duration;
//! use lease_api::{LeaseKey, LeaseProvider};
//! use lease_postgres::{PostgresConfig, PostgresProvider};
//!
//! let provider = PostgresProvider::new(
//!     PostgresConfig::new("postgres://app@127.0.0.1/app").namespace("billing"),
//! )?;
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
//! TLS follows libpq's URL parameters: `sslmode=verify-full&sslrootcert=/path/ca.pem`
//! verifies the server's certificate and host name against a private CA
//! (rustls; without `sslrootcert`, the system's roots). Passwords (SCRAM or md5)
//! go in the URL or the `password` parameter. A wrong password, a login the
//! server's pg_hba refuses (for example a plain connection where only TLS is
//! allowed), a missing privilege or a failed certificate check is
//! [`LeaseError::Denied`](lease_api::LeaseError::Denied), never `Unavailable`.
//! The provider shows the server as `postgres://host:port`, never the URL.
//!
//! ## A primary with standbys
//!
//! `postgres://user@h1:5432,h2:5432/db` names several hosts, as libpq's
//! multi-host URLs do. Each new connection asks `SELECT pg_is_in_recovery()`
//! and is used only on the primary (libpq's `target_session_attrs=read-write`);
//! a host that is down, a standby, or silent past the connect timeout is
//! passed over. After a promotion, statements on the old primary fail (it is
//! gone) or are refused (`25006`, it was demoted); either closes the
//! connection, and the next one finds the new primary. The LISTEN connection
//! and the pool follow. PostgreSQL promotes nothing by itself: Patroni,
//! repmgr or a managed service does, and the provider follows.
//!
//! What a promotion keeps depends on the primary's settings, which the probe
//! reads before the first call answers: with `synchronous_standby_names` set
//! and `synchronous_commit` `on`, `remote_write` or `remote_apply`, every
//! commit, each token's among them, is on a standby before it returns, so
//! `Capabilities::failover` declares tokens increasing and leases
//! surviving. Otherwise a promotion can lose the last commits, and it
//! declares `MayRepeat`. One trap is closed here: a `statement_timeout` that
//! fires while a commit waits for the synchronous standby makes PostgreSQL
//! report the commit as done (with only a WARNING) though no standby has it.
//! So with several hosts the server's statement limit is twice the response
//! timeout, and the client gives up (handing out nothing) first.
//!
//! ## Table layout
//!
//! ```sql
//! CREATE TABLE "public"."lease_leases" (
//!     namespace  text        NOT NULL,
//!     key        text        NOT NULL,
//!     owner      text        NULL,      -- 32 hex digits; NULL once released
//!     token      bigint      NOT NULL,  -- grows by one per acquisition, kept on release
//!     expires_at timestamptz NULL,      -- database clock
//!     holder     text        NULL,      -- who holds it, for people (`user@host:pid`)
//!     PRIMARY KEY (namespace, key)
//! );
//! ```
//!
//! A table made by an earlier version gains the `holder` column the next time
//! the migration runs (`ADD COLUMN IF NOT EXISTS`, on first use or by
//! [`PostgresProvider::migrate`]).
//!
//! Schema and table names are configurable and validated as identifiers; every
//! value is a bind parameter. The table is created on first use (under an
//! advisory lock, so many processes may start at once), or by
//! [`PostgresProvider::migrate`] when `create_table` is off.
//!
//! ## One statement per operation
//!
//! - acquire: `INSERT .. ON CONFLICT (namespace, key) DO UPDATE .. WHERE the row is
//!   released or expired RETURNING token`, in a CTE that also reports the holder's
//!   remaining time when it did not win; at most one of any number of concurrent
//!   callers wins, because the conflicting row is locked by the upsert.
//! - extend / release: an `UPDATE` guarded by namespace, key, owner, token and
//!   `expires_at > clock_timestamp()`; release also calls `pg_notify` in the
//!   same statement. Released rows keep their token, so tokens keep growing.
//! - inspect: a `SELECT` of live rows.
//!
//! These run on connections of their own, not sqlx's pool: the pool pings every
//! connection it takes back, a second round trip per operation. A connection
//! whose statement was cut off by the response timeout is closed, and the
//! server ends the statement too (`statement_timeout`, set to the response
//! timeout at connect). Whichever limit fires first, the caller gets
//! `Timeout`. The server's limit counts from the statement's arrival, after
//! the client's started, so an acquire left without its answer is also
//! cancelled in the background: the server session it was sent on is ended,
//! and once it has gone whatever the acquire won is released (see
//! `LeaseProvider::flush`). No late acquire leaves a lease nobody holds.
//! Behind PgBouncer, use session mode (waiting listens on a session, and the
//! cancel ends the session a statement ran on), and list `options` in
//! `ignore_startup_parameters` (sqlx already needs `extra_float_digits`
//! there); the server-side limit is then lost.
//!
//! ## Expiry clock
//!
//! `clock_timestamp()` is the database server's wall clock at the moment the
//! statement runs (not the transaction start). Clients' clocks never matter. If
//! the server's clock is stepped, leases expire early or late by that step:
//! run NTP with slewing on database hosts.
//!
//! ## Waiting
//!
//! Release sends `NOTIFY` on a per-table channel with the namespace and key as
//! payload. Each provider keeps one `LISTEN` connection shared by all its waiters;
//! if it drops, every waiter retries once and the listener reconnects. Waiters also
//! retry when the holder's remaining TTL runs out, so a lost notification costs
//! latency, never correctness.
//!
//! ## Fenced transactions
//!
//! [`PostgresProvider::begin_fenced`] starts a transaction and locks the lease row
//! `FOR SHARE` after checking owner, token and expiry. A takeover has to update
//! that row, so it waits until the transaction ends: the business write commits
//! only while the lease is held, and a stale holder's transaction is refused before
//! it writes anything. This is stronger than a token check at the resource because
//! the check and the write are one atomic commit.
//!
//! ## Advisory-lock mode
//!
//! [`AdvisoryProvider`] holds each lease as a session advisory lock
//! (`pg_try_advisory_lock`) on a session of its own, with a per-key token row
//! for fencing and the session's `idle_session_timeout` as the TTL on the
//! database clock. The lease ends with its session: a killed holder frees the
//! key at once, without waiting for the TTL. In the `lease` crate's URLs:
//! `postgres://...?lease_mode=advisory`. Its costs (a session per held lease,
//! PostgreSQL 14 or later) and the chance of two keys sharing a lock id are
//! on its page; docs/CHOOSING.md compares it with the table mode.
//!
//! ## Job queues and once-per-slot claims
//!
//! Where the work is rows in the same database, a lock service is not the
//! best tool. [`JobQueue`] claims the next rows of your own table with
//! `FOR UPDATE SKIP LOCKED`, with an owner, a fencing token and a visibility
//! timeout on the database clock, and completes them inside your transaction
//! if you like ([`JobQueue::complete_in`]), so a job's effect commits once.
//! [`OnceClaims`] gives each (resource, slot) to exactly one caller, forever
//! or for a retention: distributed cron. docs/CHOOSING.md in the repository
//! compares them with leases.
//!
//! ## When to prefer this backend
//!
//! When PostgreSQL is already there; when tokens must survive restarts (they are
//! rows; the capabilities say so after probing `fsync` and `synchronous_commit`);
//! when the protected resource is in the same database. Each operation costs a
//! statement, one round trip, on a connection of its own (about a millisecond on
//! a LAN); for thousands of short leases per second prefer Redis.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod advisory;
mod config;
mod conns;
mod hosts;
mod multi;
mod once;
mod ops;
mod orphans;
mod patroni;
mod probe;
mod provider;
mod queue;
mod rw;
mod rw_sql;
mod sql;
mod waiters;
mod watch;

pub use advisory::{ADVISORY_TABLE, AdvisoryProvider};
pub use config::PostgresConfig;
pub use once::{CLAIMS_TABLE, OnceClaim, OnceClaims, SlotHolder};
pub use provider::PostgresProvider;
pub use queue::{Claim, Completion, JobQueue, Outcome, QueueConfig};

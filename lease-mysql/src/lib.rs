//! # lease-mysql: leases in a MySQL or MariaDB table
//!
//! [`MysqlProvider`] keeps one row per key and times every lease by the
//! **database clock** (`UTC_TIMESTAMP(6)`), never the client's. For teams
//! whose services already share MySQL or MariaDB and would rather not run
//! another store; [`MysqlProvider::begin_fenced`] checks the lease inside the
//! same transaction as the business write.
//!
//! ```no_run
//! # async fn demo() -> lease_api::Result<()> {
//! use std::time::Duration;
//! use lease_api::{LeaseKey, LeaseProvider};
//! use lease_mysql::{MysqlConfig, MysqlProvider};
//!
//! let provider = MysqlProvider::new(
//!     MysqlConfig::new("mysql://app:secret@127.0.0.1:3306/app").namespace("billing"),
//! )?;
//! let key = LeaseKey::new("settlement/2026-12-07")?;
//! if let Some(lease) = provider.try_acquire(&key, Duration::from_secs(30)).await?.into_lease() {
//!     println!("holding {key} with fencing token {}", lease.token());
//!     provider.release(&lease).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! ## Table layout
//!
//! ```sql
//! CREATE TABLE `lease_leases` (
//!     namespace  VARBINARY(255)   NOT NULL,
//!     k          VARBINARY(1024)  NOT NULL,
//!     owner      VARBINARY(32)    NULL,      -- 32 hex digits; NULL once released
//!     token      BIGINT UNSIGNED  NOT NULL,  -- grows by one per acquisition, kept on release
//!     expires_at DATETIME(6)      NULL,      -- UTC, database clock
//!     holder     VARBINARY(255)   NULL,      -- who holds it, for people (`user@host:pid`)
//!     PRIMARY KEY (namespace, k)
//! ) ENGINE=InnoDB;
//! ```
//!
//! Keys and namespaces are **binary** columns: they compare byte for byte,
//! so `a`, `A`, `a ` (a trailing space) and `á` are four keys, whatever the
//! server's default collation would fold or pad. The table name is validated
//! as an identifier and lives in the URL's database; every value is a bind
//! parameter. The table is created on first use, or by
//! [`MysqlProvider::migrate`] when `create_table` is off.
//!
//! ## One statement per operation
//!
//! - acquire: `INSERT .. ON DUPLICATE KEY UPDATE` whose assignments take the
//!   row only when it is released or expired. The row is locked by the
//!   statement, so at most one of any number of concurrent callers wins. The
//!   winner learns its token from the same answer: the statement sets
//!   `LAST_INSERT_ID()` to the new token, or to the holder's remaining time
//!   when the key was held, and
//!   the server sends it back with the row count. A caller that lost gets
//!   the holder's remaining time in the same place (see the source's
//!   `sql::WON`): one round trip either way.
//! - extend / release: an `UPDATE` guarded by namespace, key, owner, token
//!   and `expires_at > UTC_TIMESTAMP(6)`. Released rows keep their token, so
//!   tokens keep growing.
//! - inspect: a `SELECT` of the live row.
//!
//! These run on connections of their own, not sqlx's pool (which pings each
//! connection it takes back, a second round trip). Every connection sets
//! `STRICT_ALL_TABLES` (a value that does not fit is an error, never cut),
//! an InnoDB lock wait within the response timeout, and on MariaDB
//! `max_statement_time`, so the server ends a statement the client gave up
//! on. Those limits count from the statement's arrival, after the client's
//! timer started (and MySQL has no statement limit for writes), so an
//! acquire left without its answer is also cancelled in the background: the
//! session it was sent on is killed, and once it has gone whatever the
//! acquire won is released (see `LeaseProvider::flush`). No late acquire
//! leaves a lease nobody holds. [`MysqlProvider::migrate`] refuses
//! a server on which the session is not strict.
//!
//! ## Expiry clock
//!
//! `UTC_TIMESTAMP(6)` is the database server's wall clock, read once per
//! statement, in UTC whatever `@@time_zone` says (expiry times are
//! `DATETIME(6)` in UTC, never converted). Clients' clocks never matter. If
//! the server's clock is stepped (an NTP step, `date -s`), leases expire
//! early or late by that step: run NTP with slewing on database hosts.
//! `ExpiryClock::StoreServer` declares this.
//!
//! ## Waiting
//!
//! MySQL and MariaDB have no LISTEN/NOTIFY. A waiter reads its key's row (a
//! primary-key read, no lock) every poll interval (default 50 ms) and makes
//! an acquire attempt only when the row says the key is free, so a release
//! reaches a waiter within about one interval and a long wait makes few
//! acquire attempts. `Notifications::Polled` declares it.
//!
//! ## TLS and authentication
//!
//! TLS follows sqlx's URL parameters: `ssl-mode=verify_identity&ssl-ca=/path/ca.pem`
//! verifies the server's certificate and host name (rustls). A wrong
//! password, a missing privilege or a failed certificate check is
//! [`LeaseError::Denied`](lease_api::LeaseError::Denied), never
//! `Unavailable`. The provider shows the server as `mysql://host:port`,
//! never the URL.
//!
//! ## Fencing tokens and durability
//!
//! Tokens are InnoDB rows. The probe reads `innodb_flush_log_at_trx_commit`:
//! at 1 every commit is on disk before it returns and tokens are declared
//! durable; otherwise a crash can lose the last second of commits, and the
//! declaration says so.
//!
//! ## Several hosts: Galera
//!
//! `mysql://user@h1:3306,h2:3306,h3:3306/db` names the nodes of a Galera
//! cluster. The provider stays on the node that answered last (so every
//! client's writes meet on one node, where row locks order them), and moves
//! on when a node does not answer or leaves the primary component. A
//! certification conflict surfaces at commit as a deadlock error (1213):
//! the statement was rolled back, nothing changed, and the provider asks
//! again. The probe declares the failover: tokens keep growing and a held
//! lease survives, since every commit is certified by every node before it
//! returns; the recovery bound includes the cluster's `evs.suspect_timeout`.
//!
//! Three things differ from a single server:
//! - several hosts must be one Galera cluster's nodes: a list of servers
//!   without Galera (a primary and its asynchronous replicas) is refused
//!   with `Config`, since a replica behind its primary would hand tokens
//!   out again;
//! - [`MysqlProvider::begin_fenced`] is refused: a row lock holds off
//!   writers on its own node only, and is not part of certification;
//! - expiry is decided by the clock of the node that runs the statement,
//!   and two clients may be on two nodes (after a failover): the nodes'
//!   clock skew adds to the expiry slack. Keep the nodes under NTP.
//!
//! ## Job queues and once-per-slot claims
//!
//! Where the work is rows in the same database, a lock service is not the
//! best tool. [`JobQueue`] claims the next rows of your own table with
//! `FOR UPDATE SKIP LOCKED` (MariaDB 10.6+, MySQL 8), with an owner, a
//! fencing token and a visibility timeout on the database clock, and
//! completes them inside your transaction if you like
//! ([`JobQueue::complete_in`]), so a job's effect commits once.
//! [`OnceClaims`] gives each (resource, slot) to exactly one caller, forever
//! or for a retention: distributed cron. Both are the same API as
//! `lease-postgres`'s, with these differences:
//!
//! - MySQL has no sequences: tokens come from a one-row counter table
//!   (`<table>_lease_token`), bumped inside the claim's transaction after
//!   the rows are locked and held until it commits, so a later claim always
//!   has a greater token. The table name may be at most 52 bytes.
//!   Tokens of deleted rows are not remembered elsewhere: do not edit the
//!   counter, or restore it from an older dump (a missing counter row is
//!   refused, and `migrate` seeds it again from the greatest token left).
//! - MySQL has no `UPDATE .. RETURNING`: a claim is two round trips (lock
//!   the rows; draw, mark, read back and commit in one batch), and
//!   complete, extend and release lock the rows still the claim's, list
//!   them and change exactly those, in one batch.
//! - InnoDB locks every row a locking read reads before it sorts, so an
//!   `ORDER BY .. LIMIT .. FOR UPDATE` that needs a sort would lock every
//!   eligible row. Claims in key order scan the index of pending rows and
//!   stop at the limit; a queue with an `order` of its own reads the next
//!   keys in that order without locks and then locks them by key, a round
//!   trip more per window.
//! - On Galera, keep every worker on one node (a host list does this: every
//!   provider stays on the node that answers). Claims made through two
//!   nodes at once are not shown safe: `SKIP LOCKED` sees one node's locks,
//!   and a CI run reported a worker's own claim stale at completion.
//! - On MySQL (not MariaDB) a claim the client gave up on is not ended by
//!   the server and may still commit: its rows come back after the
//!   visibility timeout, and a once-claim whose caller saw an error may
//!   have been won ([`OnceClaims::holder`] shows by whom).
//! - [`JobQueue::complete_in`] takes your [`sqlx::Transaction`], so it
//!   always runs inside one.
//!
//! ## Servers
//!
//! The tests run MariaDB 10.11 and Galera 4 (Debian's packages). MySQL 8
//! speaks the same statements (`VALUES()` in `ON DUPLICATE KEY UPDATE` is
//! deprecated there, with a warning) but is not tested here: Debian ships
//! no MySQL server. On MySQL a statement cut off by the client is not ended
//! by the server (`max_statement_time` is MariaDB's).
//!
//! ## Not yet here
//!
//! Read/write leases, fair waiting and atomic multi-key sets are declared
//! absent (`Config` errors; sets are taken key by key, in key order), and
//! so is a store session (`session_store`): a `LeaseSession` renews with
//! `extend_many`, two statements per batch of up to 1,000 leases.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod advisory;
#[macro_use]
mod batch;
mod config;
mod conns;
mod counter;
mod error;
mod hosts;
mod multi;
mod once;
mod ops;
mod orphans;
mod provider;
mod queue;
mod sql;
mod watch;

pub use advisory::{ADVISORY_TABLE, AdvisoryProvider};
pub use config::MysqlConfig;
pub use once::{CLAIMS_TABLE, OnceClaim, OnceClaims, SlotHolder};
pub use provider::MysqlProvider;
pub use queue::{Claim, Completion, JobQueue, Outcome, QueueConfig};

//! # lease-sqlite: leases for every process on one host
//!
//! A [`LeaseProvider`](lease_api::LeaseProvider) over one SQLite file. Every
//! process on the host that opens the file shares its leases: cron jobs,
//! workers started by systemd, the `lease` command. It is what `flock(1)` is
//! used for, plus what `flock` lacks: a TTL, a fencing token and a lost
//! signal, and no silent lapse on NFS (keep the file on a local disk; SQLite's
//! own locking is not safe on network file systems either).
//!
//! Use it for one host. For more than one host, move to a networked store
//! (Redis, PostgreSQL, etcd, ZooKeeper): nothing else changes.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lease_api::Result<()> {
//! use std::time::Duration;
//! use lease_api::{LeaseKey, LeaseProvider};
//! use lease_sqlite::{SqliteConfig, SqliteProvider};
//!
//! let dir = std::env::temp_dir().join(format!("lease-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).expect("a temporary directory");
//! let provider = SqliteProvider::new(SqliteConfig::new(dir.join("leases.db")))?;
//! let key = LeaseKey::new("nightly-report")?;
//! let lease = provider.try_acquire(&key, Duration::from_secs(30)).await?
//!     .into_lease().expect("a free key");
//! println!("token {}", lease.token());
//! provider.release(&lease).await?;
//! # Ok(()) }
//! ```
//!
//! # Where the guarantees come from
//!
//! - **Atomic steps (C2, C5-C7).** Every write is one `BEGIN IMMEDIATE`
//!   transaction: it takes SQLite's write lock first, then reads the clock,
//!   decides and writes, so no other process acts in between. WAL mode lets
//!   readers (`inspect`) run meanwhile. A busy database is waited for (the
//!   busy timeout), then retried, then reported as `Unavailable`.
//! - **Expiry on the host's monotonic clock (C4).** Expiry times are
//!   milliseconds of `CLOCK_MONOTONIC`, which every process on the host
//!   shares and which wall-clock steps (NTP, an operator's `date -s`) cannot
//!   move. Why not `CLOCK_BOOTTIME`, which also counts suspend: a holder's
//!   local validity (C10) is counted on tokio's clock, which is
//!   `CLOCK_MONOTONIC`; if the store counted suspended time and the holder
//!   did not, a lease would expire in the store while its holder still
//!   believed it valid after a resume. On the same clock both stop together.
//!   The clock restarts at boot, so every row records the boot id
//!   (`/proc/sys/kernel/random/boot_id`); a lease of an earlier boot is
//!   expired, whatever its numbers say; without a readable boot id the
//!   provider refuses to start. `ExpiryClock::HostMonotonic` declares
//!   this: one host, one kernel, one time namespace (processes in another
//!   time namespace or a sandboxed kernel such as gVisor do not share the
//!   clock, and must not share the file).
//! - **Tokens (C8).** One counter for the whole file, raised in the acquire's
//!   transaction: tokens keep growing across releases, restarts and even a
//!   deleted lease row. The file is written with `synchronous=FULL`, so a
//!   committed token survives a power cut.
//! - **Waiting (C9).** A release touches one of 1,024 notification files in
//!   a directory next to the database (`<file>-notify/`), chosen by a hash of
//!   namespace and key; waiters watch the directory with inotify and try
//!   again when their key's file is written. The latency is the kernel's
//!   event delivery (microseconds); the holder's TTL is the fallback if an
//!   event is missed (or inotify is not available).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod multi;
mod ops;
mod provider;
mod rw;
mod schema;

pub use provider::{SqliteConfig, SqliteProvider};

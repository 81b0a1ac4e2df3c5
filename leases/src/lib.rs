//! # lease: distributed leases with fencing tokens, on the store you choose
//!
//! One API for leases over Redis, Redlock, PostgreSQL, etcd, ZooKeeper and an
//! in-memory store; pick the store per deployment by configuration. This crate
//! re-exports the whole contract from [`lease_api`] and builds an
//! `Arc<dyn LeaseProvider>` from a URL or a [`StoreConfig`] (TOML file,
//! environment variables or code).
//!
//! ```
//! use std::time::Duration;
//! use leases::{LeaseKey, RunOptions, RunOutcome, run_with_lease};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> leases::Result<()> {
//! // In production: leases::StoreConfig::from_env()?.build()?
//! let provider = leases::connect("memory://")?;
//! let key = LeaseKey::new("nightly-report")?;
//! let outcome = run_with_lease(provider, &key, Duration::from_secs(30), RunOptions::default(), |ctx| async move {
//!     format!("report written under token {}", ctx.token)
//! })
//! .await?;
//! assert!(matches!(outcome, RunOutcome::Completed { .. }));
//! # Ok(()) }
//! ```
//!
//! ## Cargo features
//!
//! One per backend: `redis` (also Redlock), `postgres`, `mysql` (also
//! MariaDB), `zk` and `sqlite` are on by default; `etcd` is opt-in because
//! etcd's client needs `protoc` to build (inside this repository
//! `scripts/protoc` supplies it); `full` turns on all of them. The in-memory
//! provider is always there. A URL whose backend is compiled out gives an error
//! naming the feature to enable. The `lease` command lives in its own crate,
//! `lease-cli`, so a library user never compiles clap or the conformance suite.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod build;
mod config;
mod store;
mod urls;

pub use build::memory;
pub use config::{StoreConfig, connect, parse_duration};
pub use lease_api::*;
pub use store::{EtcdAccess, Store, URL_FORMS};
pub use urls::redact;

#[cfg(feature = "etcd")]
pub use lease_etcd;
#[cfg(feature = "mysql")]
pub use lease_mysql;
#[cfg(feature = "postgres")]
pub use lease_postgres;
#[cfg(feature = "redis")]
pub use lease_redis;
#[cfg(feature = "sqlite")]
pub use lease_sqlite;
#[cfg(feature = "zk")]
pub use lease_zk;

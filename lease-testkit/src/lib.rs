//! Test support for the `lease` adapters.
//!
//! - [`store_url`]: the address of a shared store started by `scripts/stores up`,
//!   read from a `LEASE_TEST_*` variable. An unset variable FAILS the test with a
//!   message that says how to start the stores; it never skips.
//! - [`OwnedProcess`]: a private store process on a free loopback port that a test
//!   may stop, restart and kill without touching other tests' servers.
//!
//! ```
//! let port = lease_testkit::free_port();
//! assert!(port > 0);
//! ```

mod assertions;
pub mod cluster;
mod env;
mod etcd;
mod mysql;
mod names;
mod ports;
mod postgres;
mod process;
mod proxy;
mod ready;
mod redis;
mod restartable;
mod tempdir;
mod tls;
mod zk;

pub use assertions::{
    assert_a_join_lost_as_the_wait_ends_leaves_no_ticket, assert_a_lost_join_answer_costs_no_wait,
    assert_denied, assert_handoff_is_notified, assert_line_empty, until_ok,
};
pub use env::{HOW_TO_START, pg_bindir, store_url};
pub use etcd::{etcdctl_tls, owned_etcd, owned_etcd_tls};
pub use mysql::{owned_mysql, owned_mysql_tls};
pub use names::unique;
pub use ports::{free_port, free_port_and};
pub use postgres::{owned_postgres, owned_postgres_tls};
pub use process::{OwnedProcess, spawn_lasting};
pub use proxy::Proxy;
pub use ready::{Readiness, tcp_exchange};
pub use redis::{owned_redis, owned_redis_tls, owned_redis_with};
pub use restartable::Restartable;
pub use tempdir::TempDir;
pub use tls::TestCa;
pub use zk::{owned_zk, owned_zk_with_max_session};

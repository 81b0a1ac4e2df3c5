//! Replicated stores on loopback, each member an [`OwnedProcess`](crate::OwnedProcess) on its own
//! free ports with its own data directory: an etcd cluster, a ZooKeeper
//! ensemble, N independent Redis nodes for Redlock, a Redis primary with
//! replicas under Sentinel, a PostgreSQL primary with a streaming standby,
//! PostgreSQL members managed by Patroni, and a MariaDB Galera cluster. A test (or
//! `scripts/clusters`) starts one, and may stop, kill -9, freeze, thaw and
//! restart any member on its own data, and ask which member leads.
//!
//! Every member dies with the process that started it ([`crate::spawn_lasting`]),
//! so a suite may keep its cluster in a `static` for all its cases.

mod etcd;
mod galera;
mod links;
mod members;
mod netsplit;
mod patroni;
mod postgres;
mod redis_cluster;
mod redis_nodes;
mod redis_sentinel;
mod topology;
mod zk;

pub use etcd::EtcdCluster;
pub use galera::{GALERA_PROVIDER, GaleraCluster};
pub use netsplit::Netsplit;
pub use patroni::{PATRONI_TTL_SECS, PatroniCluster, patroni_bin};
pub use postgres::PostgresHa;
pub use redis_cluster::{CLUSTER_NODE_TIMEOUT, RedisCluster};
pub use redis_nodes::RedisNodes;
pub use redis_sentinel::{RedisSentinel, SENTINEL_DOWN_AFTER, SENTINEL_MASTER};
pub use topology::Topology;
pub use zk::ZkEnsemble;

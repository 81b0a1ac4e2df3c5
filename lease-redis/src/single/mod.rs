//! `RedisProvider`: leases on one Redis server (or a Sentinel- or
//! Cluster-managed one). The provider, its node and the helpers every
//! operation uses.

use std::sync::Arc;
use std::time::Duration;

use lease_api::backend::{
    DEFAULT_MAX_KEYS, MultiKey, OwnerId, ProbedCapabilities, validate_namespace,
};
use lease_api::{ExpiryClock, LeaseError, LeaseKey, Result};

use crate::keys::{encode, redis_keys, release_channel};
use crate::node::Node;
pub(crate) use crate::time::{Timeouts, millis};

mod batch;
mod config;
mod multi;
mod ops;
mod probe;
mod queue;
mod rw;
mod value;

pub(crate) use batch::ExtendBatch;
pub use config::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT, RedisConfig};
use probe::{CLUSTER_DEFAULT_NODE_TIMEOUT, replicated_capabilities};
pub(crate) use probe::{base_capabilities, check_eviction};
pub(crate) use value::parse_value;

struct Inner {
    node: Node,
    /// Under Sentinel: how many replicas must acknowledge each acquire and
    /// extend before it counts (0: none, a single server).
    wait_replicas: u32,
    allow_eviction: bool,
    /// Under Sentinel or on a Cluster, the first call waits for the probe:
    /// the failover declaration depends on the live settings.
    sentinel_probed: tokio::sync::OnceCell<()>,
    /// The eviction check, made once before the first acquire.
    eviction_checked: tokio::sync::OnceCell<()>,
    /// Cancels of timed-out acquires still running (see `flush`).
    cleanups: tokio_util::task::TaskTracker,
    namespace: String,
    ns_encoded: String,
    channel: String,
    hub: Arc<lease_api::backend::WatchHub>,
    caps: ProbedCapabilities,
}

/// Leases on one Redis server.
///
/// Acquire, extend, release and inspect are each one Lua script (one round trip,
/// EVALSHA after the first call). All clones share one multiplexed connection that
/// reconnects by itself, and one pub/sub connection for waiters (opened on the
/// first wait). See the crate docs for the key layout and guarantees.
#[derive(Clone)]
pub struct RedisProvider {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisProvider")
            .field("server", &self.inner.node.display)
            .field("namespace", &self.inner.namespace)
            .finish_non_exhaustive()
    }
}

impl RedisProvider {
    /// Sets up a provider. Connecting happens on first use, so this does not
    /// fail when the server is down; operations then return `Unavailable`.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for a malformed URL or namespace.
    pub fn new(config: RedisConfig) -> Result<Self> {
        validate_namespace(&config.namespace)?;
        let node = Node::new(
            &config.url,
            Timeouts {
                connect: config.connect_timeout,
                response: config.response_timeout,
            },
        )?;
        let ns_encoded = encode(&config.namespace);
        let wait_replicas = node.wait_replicas();
        let call = config.connect_timeout + config.response_timeout;
        let base = if node.sentinel().is_some() {
            replicated_capabilities(
                "redis-sentinel",
                wait_replicas,
                crate::sentinel::DEFAULT_DOWN_AFTER,
                call,
            )
        } else if node.is_cluster() {
            replicated_capabilities(
                "redis-cluster",
                wait_replicas,
                CLUSTER_DEFAULT_NODE_TIMEOUT * 2,
                call,
            )
        } else {
            base_capabilities("redis", ExpiryClock::StoreServer)
        };
        // One script takes a whole set where every key may be in it: not on
        // a Cluster, where each key has a slot of its own.
        let base = if node.is_cluster() {
            base
        } else {
            base.with_multi_key(MultiKey::atomic(DEFAULT_MAX_KEYS))
        };
        let base = base.with_shared_leases(true);
        Ok(RedisProvider {
            inner: Arc::new(Inner {
                node,
                wait_replicas,
                sentinel_probed: tokio::sync::OnceCell::new(),
                allow_eviction: config.allow_eviction,
                eviction_checked: tokio::sync::OnceCell::new(),
                cleanups: tokio_util::task::TaskTracker::new(),
                channel: release_channel(&ns_encoded),
                ns_encoded,
                namespace: config.namespace,
                hub: Arc::default(),
                caps: ProbedCapabilities::new(base.with_fair_waiting(true)),
            }),
        })
    }

    /// A provider for `url` with the default namespace and timeouts.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for a malformed URL.
    pub fn from_url(url: &str) -> Result<Self> {
        Self::new(RedisConfig::new(url))
    }

    fn keys(&self, key: &LeaseKey) -> (String, String) {
        redis_keys(&self.inner.ns_encoded, key.as_str())
    }

    /// Deletes every lease, fence counter and tombstone of every namespace
    /// whose name starts with `prefix`, whoever holds them, and returns how
    /// many Redis keys went. Tokens of those keys start again afterwards: only
    /// for namespaces nobody uses any more, such as a finished
    /// `lease conformance` run's.
    ///
    /// # Errors
    /// `Config` for an empty prefix; `Unavailable` when the server is down.
    pub async fn purge_namespaces(&self, prefix: &str) -> Result<u64> {
        lease_api::backend::validate_purge_prefix(prefix)?;
        self.inner
            .node
            .delete_matching(&crate::keys::namespace_pattern(prefix))
            .await
    }

    /// Refuses a server that may evict keys, unless allowed: checked once,
    /// before the first acquire (one extra round trip per provider).
    async fn check_eviction(&self) -> Result<()> {
        self.inner
            .eviction_checked
            .get_or_try_init(|| check_eviction(&self.inner.node, self.inner.allow_eviction))
            .await
            .map(|_| ())
    }

    /// An acquire or extend that fewer replicas acknowledged than required.
    fn unreplicated(&self, acked: u32) -> LeaseError {
        // A primary without its replicas may be one that was demoted while
        // frozen and thawed since: the next call looks for the primary again.
        self.inner.node.forget_connection();
        LeaseError::unavailable(
            format!(
                "Redis at {}: {acked} of the {} replica(s) required acknowledged the write within {:?}",
                self.inner.node.display,
                self.inner.wait_replicas,
                self.inner.node.timeouts().response / 2
            ),
            std::io::Error::other("too few replicas"),
        )
    }

    /// After an acquire whose outcome is unknown (it timed out, maybe queued
    /// in a stalled server), make sure it leaves no lease behind.
    fn cancel_in_background(
        &self,
        lease_key: String,
        owner: OwnerId,
        ttl: Duration,
        key: &LeaseKey,
    ) {
        let this = self.clone();
        let key = key.as_str().to_owned();
        self.inner.cleanups.spawn(async move {
            this.inner
                .node
                .cancel_until_done(&lease_key, &owner.to_hex(), ttl, &this.inner.channel, &key)
                .await;
        });
    }
}

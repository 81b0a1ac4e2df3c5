//! `RedlockConfig`: the nodes of a Redlock and its timeouts.

use std::time::Duration;

use lease_api::backend::DEFAULT_NAMESPACE;

use crate::single::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT};

/// How to reach the independent Redis nodes of a Redlock.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RedlockConfig {
    /// One URL per node; at least 3, best an odd number. The nodes must be
    /// independent servers (not replicas of each other).
    pub urls: Vec<String>,
    /// The namespace; providers in different namespaces never see each other.
    pub namespace: String,
    /// How long to wait for a TCP connection to one node.
    pub connect_timeout: Duration,
    /// How long to wait for one node's answer. Keep it well below the TTLs you
    /// use: a slow node only delays the round until this timeout.
    pub response_timeout: Duration,
    /// Accept nodes whose `maxmemory-policy` may evict keys (see
    /// [`RedisConfig::allow_eviction`](crate::RedisConfig::allow_eviction)).
    pub allow_eviction: bool,
}

impl RedlockConfig {
    /// A configuration for `urls` with the default namespace and timeouts.
    pub fn new<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedlockConfig {
            urls: urls.into_iter().map(Into::into).collect(),
            namespace: DEFAULT_NAMESPACE.into(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            allow_eviction: false,
        }
    }

    /// Accepts (or refuses, the default) nodes that may evict keys.
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets both timeouts.
    pub fn timeouts(mut self, connect: Duration, response: Duration) -> Self {
        self.connect_timeout = connect;
        self.response_timeout = response;
        self
    }
}

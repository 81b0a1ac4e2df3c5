//! `RedisConfig`: how to reach one Redis server, and the default timeouts.

use std::time::Duration;

use lease_api::backend::DEFAULT_NAMESPACE;

/// The default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The default response timeout.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// How to reach one Redis server.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RedisConfig {
    /// `redis://[user:password@]host[:port][/db]` (or `rediss://` with the
    /// redis crate's TLS features enabled).
    pub url: String,
    /// The namespace; providers in different namespaces never see each other.
    pub namespace: String,
    /// How long to wait for a TCP connection.
    pub connect_timeout: Duration,
    /// How long to wait for an answer.
    pub response_timeout: Duration,
    /// Accept a server whose `maxmemory-policy` may evict keys. By default
    /// such a server is refused: eviction can drop a live lease (two holders)
    /// or a fence counter (tokens go back). With this set, the provider works
    /// and declares tokens volatile.
    pub allow_eviction: bool,
}

impl RedisConfig {
    /// A configuration for `url` with the default namespace and timeouts.
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            namespace: DEFAULT_NAMESPACE.into(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            allow_eviction: false,
        }
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

    /// Accepts (or refuses, the default) a server that may evict keys; see
    /// [`RedisConfig::allow_eviction`].
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }
}

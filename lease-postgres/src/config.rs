//! `PostgresConfig`: how to reach PostgreSQL and where the lease table lives.

use std::time::Duration;

use lease_api::backend::DEFAULT_NAMESPACE;

/// How to reach PostgreSQL and where the lease table lives.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PostgresConfig {
    /// `postgres://user:password@host:port/database` (also `postgresql://`).
    pub url: String,
    /// The namespace; providers in different namespaces never see each other.
    pub namespace: String,
    /// The schema of the lease table. Default `public`.
    pub schema: String,
    /// The lease table. Default `lease_leases`.
    pub table: String,
    /// How long to wait for a connection (from the pool or a new one).
    pub connect_timeout: Duration,
    /// How long to wait for a statement's answer.
    pub response_timeout: Duration,
    /// How many connections lease statements may use at once (default 10).
    /// The pool for LISTEN, the migration, the probe and fenced transactions
    /// has the same limit; it is used far less, so it seldom holds more than one
    /// or two.
    pub max_connections: u32,
    /// Create the table on first use. Default true; turn off when schemas are
    /// managed elsewhere and call [`PostgresProvider::migrate`](crate::PostgresProvider::migrate) there instead.
    pub create_table: bool,
    /// Patroni's REST API (`host:port`, plain HTTP), one or more members'.
    /// When set, the probe reads the cluster's failover settings there
    /// (`GET /config`: `ttl`, `loop_wait`, `synchronous_mode`,
    /// `maximum_lag_on_failover`), and the declared failover follows them.
    /// Default none: the declaration comes from PostgreSQL's settings alone.
    pub patroni: Vec<String>,
}

impl PostgresConfig {
    /// A configuration for `url` with defaults for everything else.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresConfig {
            url: url.into(),
            namespace: DEFAULT_NAMESPACE.into(),
            schema: "public".into(),
            table: "lease_leases".into(),
            connect_timeout: Duration::from_secs(3),
            response_timeout: Duration::from_secs(3),
            max_connections: 10,
            create_table: true,
            patroni: Vec::new(),
        }
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets schema and table.
    pub fn table(mut self, schema: impl Into<String>, table: impl Into<String>) -> Self {
        self.schema = schema.into();
        self.table = table.into();
        self
    }

    /// Sets both timeouts.
    pub fn timeouts(mut self, connect: Duration, response: Duration) -> Self {
        self.connect_timeout = connect;
        self.response_timeout = response;
        self
    }

    /// Sets the pool size.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Reads the failover settings from Patroni's REST API at `addrs`
    /// (`host:port` each; the first that answers), so that
    /// [`Capabilities::failover`](lease_api::Capabilities::failover) declares
    /// Patroni's detection time and promotion rule.
    pub fn patroni<S: Into<String>>(mut self, addrs: impl IntoIterator<Item = S>) -> Self {
        self.patroni = addrs.into_iter().map(Into::into).collect();
        self
    }

    /// Creates the table on first use (the default), or leaves it to
    /// [`PostgresProvider::migrate`](crate::PostgresProvider::migrate) run elsewhere.
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }
}

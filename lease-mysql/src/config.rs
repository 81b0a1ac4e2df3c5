//! `MysqlConfig`: how to reach MySQL or MariaDB and where the lease table lives.

use std::time::Duration;

use lease_api::backend::DEFAULT_NAMESPACE;

/// How to reach MySQL or MariaDB and where the lease table lives. `Debug`
/// shows the URL with its password replaced by `***`.
#[derive(Clone)]
#[non_exhaustive]
pub struct MysqlConfig {
    /// `mysql://user:password@host:port/database` (also `mariadb://`), with
    /// sqlx's parameters: `ssl-mode=verify_identity&ssl-ca=/path/ca.pem` for
    /// TLS that checks the server's certificate and host name.
    pub url: String,
    /// The namespace; providers in different namespaces never see each other.
    pub namespace: String,
    /// The lease table, in the URL's database. Default `lease_leases`.
    pub table: String,
    /// How long to wait for a connection.
    pub connect_timeout: Duration,
    /// How long to wait for a statement's answer. The server is told the same
    /// limit (MariaDB's `max_statement_time`, InnoDB's lock wait timeout),
    /// and an acquire the client gave up on is cancelled, so it leaves no
    /// lease behind.
    pub response_timeout: Duration,
    /// How many connections lease statements may use at once (default 10).
    pub max_connections: u32,
    /// How often a waiter reads its key's row while the key is held (default
    /// 50 ms): MySQL has no notifications (see the crate docs).
    pub poll_interval: Duration,
    /// Create the table on first use. Default true; turn off when schemas are
    /// managed elsewhere and call [`MysqlProvider::migrate`](crate::MysqlProvider::migrate) there instead.
    pub create_table: bool,
}

impl std::fmt::Debug for MysqlConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlConfig")
            .field("url", &redacted(&self.url))
            .field("namespace", &self.namespace)
            .field("table", &self.table)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("max_connections", &self.max_connections)
            .field("poll_interval", &self.poll_interval)
            .field("create_table", &self.create_table)
            .finish()
    }
}

/// `url` with the password of its user info replaced by `***`.
pub(crate) fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<not a URL>".into();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{hosts}{tail}")
        }
        None => url.to_owned(),
    }
}

impl MysqlConfig {
    /// A configuration for `url` with defaults for everything else.
    pub fn new(url: impl Into<String>) -> Self {
        MysqlConfig {
            url: url.into(),
            namespace: DEFAULT_NAMESPACE.into(),
            table: "lease_leases".into(),
            connect_timeout: Duration::from_secs(3),
            response_timeout: Duration::from_secs(3),
            max_connections: 10,
            poll_interval: Duration::from_millis(50),
            create_table: true,
        }
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets the table (in the URL's database).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Sets both timeouts.
    pub fn timeouts(mut self, connect: Duration, response: Duration) -> Self {
        self.connect_timeout = connect;
        self.response_timeout = response;
        self
    }

    /// Sets how many connections lease statements may use.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Sets how often waiters read a held key's row (at least 5 ms).
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every.max(Duration::from_millis(5));
        self
    }

    /// Creates the table on first use (the default), or leaves it to
    /// [`MysqlProvider::migrate`](crate::MysqlProvider::migrate) run elsewhere.
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_password() {
        let shown = format!(
            "{:?}",
            MysqlConfig::new("mysql://app:s3cret@h1:1,h2:2/db?x=1")
        );
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            shown.contains("mysql://app:***@h1:1,h2:2/db?x=1"),
            "{shown}"
        );
    }
}

//! Choosing a store by configuration: URLs, a serde struct, TOML, environment.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lease_api::backend::DEFAULT_NAMESPACE;
use lease_api::{LeaseError, LeaseProvider, MemoryProvider, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The store URL forms this crate understands.
pub const URL_FORMS: &str = "memory://, redis://host:port[/db], rediss://...[?ca=/path/ca.pem], \
redis+sentinel://host1:port,host2:port/<master-name>[/db][?wait=N], \
redis+cluster://host1:port,host2:port[?wait=N], redlock://host1:port,host2:port,host3:port, postgres://user@host/db[?lease_table=schema.table][&lease_mode=advisory], \
etcd://host1:port[,host2:port] (etcds:// for TLS), zk://host1:port[,host2:port][/chroot], \
sqlite:///path/to/leases.db";

/// A parsed store URL. `Debug` and `Display` show it with passwords redacted.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Store {
    /// `memory://`: the in-memory provider; every `memory://` provider of a
    /// process shares one store (it cannot coordinate two processes).
    Memory,
    /// `redis://` or `rediss://`: one Redis server; `redis+sentinel://`: the
    /// primary that Sentinel names, followed across failovers;
    /// `redis+cluster://`: a Redis Cluster.
    Redis(String),
    /// `redlock://h1,h2,h3`: independent Redis nodes (as `redis://` URLs).
    Redlock(Vec<String>),
    /// `postgres://` or `postgresql://`.
    Postgres {
        /// The connection URL without the `lease_*` parameters.
        url: String,
        /// The schema of the lease table.
        schema: String,
        /// The lease table (with `advisory`, the token table).
        table: String,
        /// `lease_mode=advisory`: leases are session advisory locks
        /// ([`lease_postgres::AdvisoryProvider`]), not rows.
        advisory: bool,
    },
    /// `etcd://h1,h2` or `etcds://[user:password@]h1,h2[?ca=..&cert=..&key=..]`.
    Etcd {
        /// Endpoints as `http://` (or `https://` from `etcds://`).
        endpoints: Vec<String>,
        /// User, password and TLS files.
        access: EtcdAccess,
    },
    /// `sqlite:///path/to/leases.db`: one file every process on this host
    /// shares.
    Sqlite(String),
    /// `zk://h1,h2/chroot`.
    Zk {
        /// `host:port` list.
        hosts: String,
        /// Optional chroot.
        chroot: Option<String>,
        /// A `digest` identity (user, password) from `zk://user:password@...`:
        /// nodes are then writable by it only.
        digest: Option<(String, String)>,
    },
}

fn config_err(msg: impl Into<String>) -> LeaseError {
    LeaseError::Config(msg.into())
}

/// How to authenticate to etcd: from the `etcds://` URL's user info and its
/// `ca`, `cert` and `key` parameters (PEM file paths). `Debug` hides the password.
#[derive(Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdAccess {
    /// The etcd user.
    pub user: Option<String>,
    /// The user's password.
    pub password: Option<String>,
    /// The CA of the servers' certificates; the system's roots when `None`.
    pub ca: Option<String>,
    /// A client certificate, for servers with `--client-cert-auth`.
    pub cert: Option<String>,
    /// The client certificate's key.
    pub key: Option<String>,
}

impl std::fmt::Debug for EtcdAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAccess")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("ca", &self.ca)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish()
    }
}

/// Decodes `%XX` escapes (user info and parameters in URLs).
fn percent_decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let byte = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| config_err("a bad %-escape in the store URL"))?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| config_err("the store URL's %-escapes are not UTF-8"))
}

/// Parses `etcd://` and `etcds://` after the scheme.
fn parse_etcd(scheme: &str, rest: &str) -> Result<Store> {
    let tls = scheme.eq_ignore_ascii_case("etcds");
    let (authority, query) = rest.split_once('?').unwrap_or((rest, ""));
    let authority = authority.trim_end_matches('/');
    let (userinfo, list) = match authority.rsplit_once('@') {
        Some((u, l)) => (Some(u), l),
        None => (None, authority),
    };
    let mut access = EtcdAccess::default();
    if let Some(u) = userinfo {
        let (user, password) = u
            .split_once(':')
            .ok_or_else(|| config_err(format!("{scheme}:// credentials are user:password@")))?;
        access.user = Some(percent_decode(user)?);
        access.password = Some(percent_decode(password)?);
    }
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match k {
            "ca" => &mut access.ca,
            "cert" => &mut access.cert,
            "key" => &mut access.key,
            other => {
                return Err(config_err(format!(
                    "{scheme}:// has the unknown parameter {other:?} (known: ca, cert, key)"
                )));
            }
        };
        if !tls {
            return Err(config_err(format!(
                "{scheme}:// {k}= is for TLS; use etcds://"
            )));
        }
        *slot = Some(percent_decode(v)?);
    }
    if access.cert.is_some() != access.key.is_some() {
        return Err(config_err(format!(
            "{scheme}:// needs cert= and key= together"
        )));
    }
    let proto = if tls { "https" } else { "http" };
    Ok(Store::Etcd {
        endpoints: crate::urls::host_list(scheme, list, false)?
            .into_iter()
            .map(|h| format!("{proto}://{}", h.raw))
            .collect(),
        access,
    })
}

#[cfg(feature = "zk")]
fn zk_config(
    hosts: &str,
    chroot: &Option<String>,
    digest: &Option<(String, String)>,
) -> lease_zk::ZkConfig {
    let mut config = lease_zk::ZkConfig::new(hosts);
    if let Some(c) = chroot {
        config = config.chroot(c);
    }
    if let Some((user, password)) = digest {
        config = config.digest(user, password);
    }
    config
}

#[cfg(feature = "etcd")]
fn etcd_config(endpoints: &[String], access: &EtcdAccess) -> lease_etcd::EtcdConfig {
    let mut tls = lease_etcd::EtcdTls::default();
    if let Some(ca) = &access.ca {
        tls = tls.ca(ca);
    }
    if let (Some(cert), Some(key)) = (&access.cert, &access.key) {
        tls = tls.identity(cert, key);
    }
    let mut config = lease_etcd::EtcdConfig::new(endpoints.to_vec()).tls(tls);
    if let (Some(user), Some(password)) = (&access.user, &access.password) {
        config = config.credentials(user, password);
    }
    config
}

/// The query parameters sqlx understands in a PostgreSQL URL, plus ours.
const POSTGRES_PARAMS: &[&str] = &[
    "lease_table",
    "lease_mode",
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({self})")
    }
}

impl std::fmt::Display for Store {
    /// The store as a URL, passwords redacted.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let strip = |u: &str| {
            u.split_once("://")
                .map_or(u.to_owned(), |(_, rest)| rest.to_owned())
        };
        let shown = match self {
            Store::Memory => "memory://".to_owned(),
            Store::Sqlite(path) => format!("sqlite://{path}"),
            Store::Redis(url) => url.clone(),
            Store::Redlock(nodes) => format!(
                "redlock://{}",
                nodes.iter().map(|n| strip(n)).collect::<Vec<_>>().join(",")
            ),
            Store::Postgres {
                url,
                schema,
                table,
                advisory,
            } => {
                let sep = if url.contains('?') { '&' } else { '?' };
                let mode = if *advisory {
                    "&lease_mode=advisory"
                } else {
                    ""
                };
                format!("{url}{sep}lease_table={schema}.{table}{mode}")
            }
            Store::Etcd { endpoints, access } => {
                let scheme = if endpoints.iter().any(|e| e.starts_with("https://")) {
                    "etcds"
                } else {
                    "etcd"
                };
                let user = access
                    .user
                    .as_ref()
                    .map(|u| format!("{u}:***@"))
                    .unwrap_or_default();
                format!(
                    "{scheme}://{user}{}",
                    endpoints
                        .iter()
                        .map(|e| strip(e))
                        .collect::<Vec<_>>()
                        .join(",")
                )
            }
            Store::Zk {
                hosts,
                chroot,
                digest,
            } => {
                let user = digest
                    .as_ref()
                    .map(|(u, _)| format!("{u}:***@"))
                    .unwrap_or_default();
                format!("zk://{user}{hosts}{}", chroot.as_deref().unwrap_or(""))
            }
        };
        f.write_str(&crate::redact(&shown))
    }
}

impl Store {
    /// Parses a store URL (see [`URL_FORMS`]).
    ///
    /// # Errors
    /// [`LeaseError::Config`] naming what to fix: a missing or unknown scheme,
    /// a malformed host list, too few Redlock nodes, a bad table name.
    pub fn parse(url: &str) -> Result<Store> {
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once("://") else {
            // Not echoed: without `://` there is no telling where a password is.
            return Err(config_err(format!(
                "the store URL has no scheme (scheme://...); use one of: {URL_FORMS}"
            )));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "memory" => {
                if !rest.is_empty() {
                    return Err(config_err(format!(
                        "memory:// takes nothing after the scheme, got {:?}",
                        crate::redact(url)
                    )));
                }
                Ok(Store::Memory)
            }
            "redis+cluster" => {
                crate::urls::host_list(
                    "redis+cluster",
                    rest.split(['/', '?']).next().unwrap_or(rest),
                    true,
                )?;
                Ok(Store::Redis(url.to_owned()))
            }
            "redis+sentinel" => {
                if !rest.contains('/') {
                    return Err(config_err(format!(
                        "redis+sentinel:// needs the master name: redis+sentinel://host:port,host:port/<master-name>, got {:?}",
                        crate::redact(url)
                    )));
                }
                Ok(Store::Redis(url.to_owned()))
            }
            "redis" | "rediss" => {
                let parsed = crate::urls::single(url, &["protocol", "ca"])?;
                let db = parsed.path().trim_matches('/');
                if !db.is_empty() && db.parse::<u32>().is_err() {
                    return Err(config_err(format!(
                        "{scheme}:// path must be a database number, got {db:?}"
                    )));
                }
                Ok(Store::Redis(url.to_owned()))
            }
            "redlock" => {
                let nodes = crate::urls::host_list("redlock", rest, true)?;
                if nodes.len() < 3 {
                    return Err(config_err(format!(
                        "redlock:// needs at least 3 independent Redis nodes, got {}",
                        nodes.len()
                    )));
                }
                Ok(Store::Redlock(
                    nodes
                        .into_iter()
                        .map(|h| format!("redis://{}", h.raw))
                        .collect(),
                ))
            }
            "postgres" | "postgresql" => {
                crate::urls::single(url, POSTGRES_PARAMS)?;
                let (base, query) = url.split_once('?').unwrap_or((url, ""));
                let mut keep = Vec::new();
                let (mut schema, mut table) = ("public".to_owned(), None);
                let mut advisory = false;
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    match pair.split_once('=') {
                        Some(("lease_table", v)) => match v.split_once('.') {
                            Some((s, t)) => (schema, table) = (s.to_owned(), Some(t.to_owned())),
                            None => table = Some(v.to_owned()),
                        },
                        Some(("lease_mode", "advisory")) => advisory = true,
                        Some(("lease_mode", "table")) => advisory = false,
                        Some(("lease_mode", other)) => {
                            return Err(config_err(format!(
                                "lease_mode is `table` (rows, the default) or `advisory` (session advisory locks), not {other:?}"
                            )));
                        }
                        _ => keep.push(pair),
                    }
                }
                let table = table.unwrap_or_else(|| {
                    if advisory {
                        // lease_postgres::ADVISORY_TABLE, spelled here so
                        // parsing works without the `postgres` feature.
                        "lease_advisory".to_owned()
                    } else {
                        "lease_leases".to_owned()
                    }
                });
                let url = if keep.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", keep.join("&"))
                };
                Ok(Store::Postgres {
                    url,
                    schema,
                    table,
                    advisory,
                })
            }
            "etcd" | "etcds" => parse_etcd(scheme, rest),
            "sqlite" => {
                if rest.is_empty() || rest.contains('?') {
                    return Err(config_err(format!(
                        "sqlite:// takes a file path and nothing else, e.g. sqlite:///var/lib/lease/leases.db; got {:?}",
                        crate::redact(url)
                    )));
                }
                Ok(Store::Sqlite(rest.to_owned()))
            }
            "zk" | "zookeeper" => {
                let (list, chroot) = match rest.find('/') {
                    Some(i) if i + 1 < rest.len() => {
                        (&rest[..i], Some(rest[i..].trim_end_matches('/').to_owned()))
                    }
                    Some(i) => (&rest[..i], None),
                    None => (rest, None),
                };
                if chroot.as_deref().is_some_and(|c| c.contains(['?', '#'])) {
                    return Err(config_err(format!(
                        "{scheme}:// takes no parameters, got {:?}",
                        crate::redact(url)
                    )));
                }
                let (userinfo, list) = match list.rsplit_once('@') {
                    Some((u, l)) => (Some(u), l),
                    None => (None, list),
                };
                let digest = match userinfo {
                    Some(u) => {
                        let (user, password) = u.split_once(':').ok_or_else(|| {
                            config_err(format!("{scheme}:// credentials are user:password@"))
                        })?;
                        Some((percent_decode(user)?, percent_decode(password)?))
                    }
                    None => None,
                };
                let hosts = crate::urls::host_list(scheme, list, false)?;
                Ok(Store::Zk {
                    hosts: hosts
                        .into_iter()
                        .map(|h| h.raw)
                        .collect::<Vec<_>>()
                        .join(","),
                    chroot,
                    digest,
                })
            }
            other => Err(config_err(format!(
                "unknown store scheme {other:?}; use one of: {URL_FORMS}"
            ))),
        }
    }

    /// The same kind of store, pointed at a loopback port nothing listens on:
    /// what the conformance suite uses to check outage handling.
    pub fn unreachable(&self) -> Store {
        match self {
            Store::Memory => Store::Memory,
            Store::Sqlite(_) => Store::Sqlite("/nonexistent-lease-dir/leases.db".into()),
            Store::Redis(_) => Store::Redis("redis://127.0.0.1:1".into()),
            Store::Redlock(_) => Store::Redlock(vec![
                "redis://127.0.0.1:1".into(),
                "redis://127.0.0.1:2".into(),
                "redis://127.0.0.1:3".into(),
            ]),
            Store::Postgres {
                schema,
                table,
                advisory,
                ..
            } => Store::Postgres {
                url: "postgres://lease@127.0.0.1:1/lease".into(),
                schema: schema.clone(),
                table: table.clone(),
                advisory: *advisory,
            },
            Store::Etcd { .. } => Store::Etcd {
                endpoints: vec!["http://127.0.0.1:1".into()],
                access: EtcdAccess::default(),
            },
            Store::Zk { .. } => Store::Zk {
                hosts: "127.0.0.1:1".into(),
                chroot: None,
                digest: None,
            },
        }
    }

    /// The backend's short name.
    pub fn kind(&self) -> &'static str {
        match self {
            Store::Memory => "memory",
            Store::Sqlite(_) => "sqlite",
            Store::Redis(_) => "redis",
            Store::Redlock(_) => "redlock",
            Store::Postgres {
                advisory: false, ..
            } => "postgres",
            Store::Postgres { advisory: true, .. } => "postgres-advisory",
            Store::Etcd { .. } => "etcd",
            Store::Zk { .. } => "zookeeper",
        }
    }

    /// Builds a provider. Connections are made on first use, so this does not
    /// fail when the store is down.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for invalid settings or a backend whose cargo
    /// feature is off.
    pub fn build(
        &self,
        namespace: &str,
        connect: Duration,
        request: Duration,
    ) -> Result<Arc<dyn LeaseProvider>> {
        // Every store call in a `lease.store` span (and metrics, with the
        // `metrics` feature).
        let provider = self.build_unobserved(namespace, connect, request)?;
        Ok(Arc::new(lease_api::Observed::new(provider)))
    }

    fn build_unobserved(
        &self,
        namespace: &str,
        connect: Duration,
        request: Duration,
    ) -> Result<Arc<dyn LeaseProvider>> {
        lease_api::backend::validate_namespace(namespace)?;
        let _ = (connect, request);
        match self {
            Store::Memory => Ok(Arc::new(process_store().provider(namespace)?)),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(path) => Ok(Arc::new(lease_sqlite::SqliteProvider::new(
                lease_sqlite::SqliteConfig::new(path)
                    .namespace(namespace)
                    .busy_timeout(request),
            )?)),
            #[cfg(feature = "redis")]
            Store::Redis(url) => Ok(Arc::new(lease_redis::RedisProvider::new(
                lease_redis::RedisConfig::new(url)
                    .namespace(namespace)
                    .timeouts(connect, request),
            )?)),
            #[cfg(feature = "redis")]
            Store::Redlock(urls) => Ok(Arc::new(lease_redis::RedlockProvider::new(
                lease_redis::RedlockConfig::new(urls.clone())
                    .namespace(namespace)
                    .timeouts(connect, request),
            )?)),
            #[cfg(feature = "postgres")]
            Store::Postgres {
                url,
                schema,
                table,
                advisory,
            } => {
                let config = lease_postgres::PostgresConfig::new(url)
                    .namespace(namespace)
                    .table(schema, table)
                    .timeouts(connect, request);
                if *advisory {
                    Ok(Arc::new(lease_postgres::AdvisoryProvider::new(config)?))
                } else {
                    Ok(Arc::new(lease_postgres::PostgresProvider::new(config)?))
                }
            }
            #[cfg(feature = "etcd")]
            Store::Etcd { endpoints, access } => Ok(Arc::new(lease_etcd::EtcdProvider::new(
                etcd_config(endpoints, access)
                    .namespace(namespace)
                    .timeouts(connect, request),
            )?)),
            #[cfg(feature = "zk")]
            Store::Zk {
                hosts,
                chroot,
                digest,
            } => Ok(Arc::new(lease_zk::ZkProvider::new(
                zk_config(hosts, chroot, digest)
                    .namespace(namespace)
                    .timeouts(connect, request),
            )?)),
            #[allow(unreachable_patterns)]
            other => Err(config_err(format!(
                "{}:// stores need the {:?} cargo feature of the `lease` crate; enable it: lease = {{ features = [{:?}] }}",
                other.kind(),
                feature_of(other),
                feature_of(other)
            ))),
        }
    }
}

impl Store {
    /// Deletes every lease record of every namespace whose name starts with
    /// `prefix` in this store, whoever holds them, and returns how many store
    /// records went (see each backend's `purge_namespaces`). For namespaces
    /// nobody uses any more: `lease conformance` cleans up after itself with it.
    ///
    /// # Errors
    /// `Config` for an empty prefix or a backend whose feature is off;
    /// `Unavailable` when the store is down.
    pub async fn purge_namespaces(
        &self,
        prefix: &str,
        connect: Duration,
        request: Duration,
    ) -> Result<u64> {
        lease_api::backend::validate_purge_prefix(prefix)?;
        let _ = (connect, request);
        match self {
            Store::Memory => process_store().purge_namespaces(prefix),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(path) => {
                lease_sqlite::SqliteProvider::new(
                    lease_sqlite::SqliteConfig::new(path).busy_timeout(request),
                )?
                .purge_namespaces(prefix)
                .await
            }
            #[cfg(feature = "redis")]
            Store::Redis(url) => {
                lease_redis::RedisProvider::new(
                    lease_redis::RedisConfig::new(url).timeouts(connect, request),
                )?
                .purge_namespaces(prefix)
                .await
            }
            #[cfg(feature = "redis")]
            Store::Redlock(urls) => {
                lease_redis::RedlockProvider::new(
                    lease_redis::RedlockConfig::new(urls.clone()).timeouts(connect, request),
                )?
                .purge_namespaces(prefix)
                .await
            }
            #[cfg(feature = "postgres")]
            Store::Postgres {
                url, schema, table, ..
            } => {
                // The token rows of either mode are purged the same way.
                lease_postgres::PostgresProvider::new(
                    lease_postgres::PostgresConfig::new(url)
                        .table(schema, table)
                        .timeouts(connect, request),
                )?
                .purge_namespaces(prefix)
                .await
            }
            #[cfg(feature = "etcd")]
            Store::Etcd { endpoints, access } => {
                lease_etcd::EtcdProvider::new(
                    etcd_config(endpoints, access).timeouts(connect, request),
                )?
                .purge_namespaces(prefix)
                .await
            }
            #[cfg(feature = "zk")]
            Store::Zk {
                hosts,
                chroot,
                digest,
            } => {
                lease_zk::ZkProvider::new(
                    zk_config(hosts, chroot, digest).timeouts(connect, request),
                )?
                .purge_namespaces(prefix)
                .await
            }
            #[allow(unreachable_patterns)]
            other => Err(config_err(format!(
                "{}:// stores need the {:?} cargo feature of the `lease` crate",
                other.kind(),
                feature_of(other)
            ))),
        }
    }
}

#[allow(dead_code)]
fn feature_of(store: &Store) -> &'static str {
    match store {
        Store::Memory => "memory",
        Store::Sqlite(_) => "sqlite",
        Store::Redis(_) | Store::Redlock(_) => "redis",
        Store::Postgres { .. } => "postgres",
        Store::Etcd { .. } => "etcd",
        Store::Zk { .. } => "zk",
    }
}

/// Everything needed to build a provider, with durations in human form
/// (`30s`, `1m 30s`, `250ms`). Load it from TOML, from the environment, or
/// build it in code.
///
/// ```
/// let config = leases::StoreConfig::from_toml_str(r#"
///     store = "memory://"
///     namespace = "billing"
///     default_ttl = "30s"
/// "#)?;
/// let provider = config.build()?;
/// assert_eq!(provider.namespace(), "billing");
/// # Ok::<(), leases::LeaseError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StoreConfig {
    /// The store URL (see [`URL_FORMS`]).
    pub store: String,
    /// The namespace. Default `lease`.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The TTL used when none is given. Default 30 s.
    #[serde(default = "default_ttl", with = "human")]
    pub default_ttl: Duration,
    /// How long to wait for a connection. Default 2 s.
    #[serde(default = "default_connect", with = "human")]
    pub connect_timeout: Duration,
    /// How long to wait for one request. Default 3 s.
    #[serde(default = "default_request", with = "human")]
    pub request_timeout: Duration,
}

fn default_namespace() -> String {
    DEFAULT_NAMESPACE.into()
}
fn default_ttl() -> Duration {
    Duration::from_secs(30)
}
fn default_connect() -> Duration {
    Duration::from_secs(2)
}
fn default_request() -> Duration {
    Duration::from_secs(3)
}

mod human {
    use super::*;

    pub(super) fn serialize<S: Serializer>(
        d: &Duration,
        s: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(|e| {
            serde::de::Error::custom(format!(
                "{text:?} is not a duration like 30s or 1m 30s: {e}"
            ))
        })
    }
}

/// Parses a human duration (`30s`, `1m 30s`, `250ms`).
///
/// # Errors
/// [`LeaseError::Config`] naming the bad text.
pub fn parse_duration(what: &str, text: &str) -> Result<Duration> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        config_err(format!(
            "{what} {text:?} is not a duration like 30s or 1m 30s: {e}"
        ))
    })
}

impl std::fmt::Debug for StoreConfig {
    /// Like the derived form, with the store URL's passwords redacted.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("store", &crate::redact(&self.store))
            .field("namespace", &self.namespace)
            .field("default_ttl", &self.default_ttl)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

impl StoreConfig {
    /// A configuration for `store` with defaults for the rest.
    pub fn new(store: impl Into<String>) -> Self {
        StoreConfig {
            store: store.into(),
            namespace: default_namespace(),
            default_ttl: default_ttl(),
            connect_timeout: default_connect(),
            request_timeout: default_request(),
        }
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets the TTL used when none is given.
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// Sets the connect and request timeouts.
    pub fn timeouts(mut self, connect: Duration, request: Duration) -> Self {
        self.connect_timeout = connect;
        self.request_timeout = request;
        self
    }

    /// Reads TOML text with the fields of this struct.
    ///
    /// # Errors
    /// [`LeaseError::Config`] with the parser's message (unknown fields, bad durations).
    pub fn from_toml_str(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| config_err(format!("invalid lease configuration: {e}")))
    }

    /// Reads a TOML file.
    ///
    /// # Errors
    /// [`LeaseError::Config`] when the file cannot be read or parsed.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            config_err(format!(
                "cannot read lease configuration {}: {e}",
                path.display()
            ))
        })?;
        Self::from_toml_str(&text)
    }

    /// Reads `LEASE_STORE` (required), `LEASE_NAMESPACE`, `LEASE_DEFAULT_TTL`,
    /// `LEASE_CONNECT_TIMEOUT` and `LEASE_REQUEST_TIMEOUT`.
    ///
    /// # Errors
    /// [`LeaseError::Config`] when `LEASE_STORE` is unset or a value is malformed.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Like [`from_env`](Self::from_env) with another source of variables.
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let store = get("LEASE_STORE")
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                config_err(format!(
                    "LEASE_STORE is not set; set it to a store URL: {URL_FORMS}"
                ))
            })?;
        let mut c = StoreConfig::new(store);
        if let Some(ns) = get("LEASE_NAMESPACE") {
            c.namespace = ns;
        }
        for (var, field) in [
            ("LEASE_DEFAULT_TTL", &mut c.default_ttl),
            ("LEASE_CONNECT_TIMEOUT", &mut c.connect_timeout),
            ("LEASE_REQUEST_TIMEOUT", &mut c.request_timeout),
        ] {
            if let Some(v) = get(var) {
                *field = parse_duration(var, &v)?;
            }
        }
        Ok(c)
    }

    /// The parsed store URL.
    ///
    /// # Errors
    /// As [`Store::parse`].
    pub fn parsed(&self) -> Result<Store> {
        Store::parse(&self.store)
    }

    /// Builds the provider.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for a bad URL, namespace or missing feature.
    pub fn build(&self) -> Result<Arc<dyn LeaseProvider>> {
        self.parsed()?
            .build(&self.namespace, self.connect_timeout, self.request_timeout)
    }
}

/// Builds a provider from a store URL with the default namespace and timeouts.
///
/// ```
/// let provider = leases::connect("memory://")?;
/// assert_eq!(provider.capabilities().backend, "memory");
/// # Ok::<(), leases::LeaseError>(())
/// ```
///
/// # Errors
/// As [`StoreConfig::build`].
pub fn connect(url: &str) -> Result<Arc<dyn LeaseProvider>> {
    StoreConfig::new(url).build()
}

/// The one in-memory store of this process, shared by every provider that
/// `memory://` builds: two connects see each other's leases, like two clients of
/// one server, and tokens keep growing across them.
fn process_store() -> &'static lease_api::MemoryStore {
    static STORE: std::sync::OnceLock<lease_api::MemoryStore> = std::sync::OnceLock::new();
    STORE.get_or_init(lease_api::MemoryStore::new)
}

/// A provider on a fresh in-memory store of its own (unlike `memory://`, which
/// is the process's one store): for tests that want isolation.
pub fn memory() -> Arc<dyn LeaseProvider> {
    Arc::new(MemoryProvider::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheme_parses() {
        assert_eq!(Store::parse("memory://").unwrap(), Store::Memory);
        assert_eq!(
            Store::parse("redis://127.0.0.1:6379/2").unwrap(),
            Store::Redis("redis://127.0.0.1:6379/2".into())
        );
        assert_eq!(
            Store::parse("rediss://h:6380").unwrap(),
            Store::Redis("rediss://h:6380".into())
        );
        assert_eq!(
            Store::parse("redis+cluster://a:7000,b:7001?wait=1").unwrap(),
            Store::Redis("redis+cluster://a:7000,b:7001?wait=1".into())
        );
        assert!(Store::parse("redis+cluster://").is_err());
        assert_eq!(
            Store::parse("redis+sentinel://a:26379,b:26379/lease").unwrap(),
            Store::Redis("redis+sentinel://a:26379,b:26379/lease".into())
        );
        assert_eq!(
            Store::parse("redlock://a:1,b:2,c:3").unwrap(),
            Store::Redlock(vec![
                "redis://a:1".into(),
                "redis://b:2".into(),
                "redis://c:3".into()
            ])
        );
        assert_eq!(
            Store::parse("postgres://u@h/db?sslmode=disable&lease_table=locks.leases").unwrap(),
            Store::Postgres {
                url: "postgres://u@h/db?sslmode=disable".into(),
                schema: "locks".into(),
                table: "leases".into(),
                advisory: false,
            }
        );
        assert_eq!(
            Store::parse("postgresql://u@h/db").unwrap(),
            Store::Postgres {
                url: "postgresql://u@h/db".into(),
                schema: "public".into(),
                table: "lease_leases".into(),
                advisory: false,
            }
        );
        assert_eq!(
            Store::parse("postgres://u@h/db?lease_mode=advisory").unwrap(),
            Store::Postgres {
                url: "postgres://u@h/db".into(),
                schema: "public".into(),
                table: "lease_advisory".into(),
                advisory: true,
            }
        );
        let err = Store::parse("postgres://u@h/db?lease_mode=locks").unwrap_err();
        assert!(err.to_string().contains("lease_mode"), "{err}");
        assert_eq!(
            Store::parse("etcd://a:2379,b:2379").unwrap(),
            Store::Etcd {
                endpoints: vec!["http://a:2379".into(), "http://b:2379".into()],
                access: EtcdAccess::default()
            }
        );
        assert_eq!(
            Store::parse("etcds://a:2379").unwrap(),
            Store::Etcd {
                endpoints: vec!["https://a:2379".into()],
                access: EtcdAccess::default()
            }
        );
        assert_eq!(
            Store::parse("zk://a:2181,b:2181/apps/lease").unwrap(),
            Store::Zk {
                digest: None,
                hosts: "a:2181,b:2181".into(),
                chroot: Some("/apps/lease".into())
            }
        );
        assert_eq!(
            Store::parse("zk://a:2181").unwrap(),
            Store::Zk {
                digest: None,
                hosts: "a:2181".into(),
                chroot: None
            }
        );
    }

    #[test]
    fn etcd_urls_carry_credentials_and_tls_files_and_show_no_password() {
        let store =
            Store::parse("etcds://app:p%40ss@a:1,b:2?ca=/ca.pem&cert=/c.pem&key=/k.pem").unwrap();
        let Store::Etcd { endpoints, access } = &store else {
            panic!("{store:?}");
        };
        assert_eq!(endpoints, &["https://a:1", "https://b:2"]);
        assert_eq!(access.user.as_deref(), Some("app"));
        assert_eq!(access.password.as_deref(), Some("p@ss"));
        assert_eq!(
            (
                access.ca.as_deref(),
                access.cert.as_deref(),
                access.key.as_deref()
            ),
            (Some("/ca.pem"), Some("/c.pem"), Some("/k.pem"))
        );
        for shown in [format!("{store}"), format!("{store:?}")] {
            assert!(
                !shown.contains("p@ss") && !shown.contains("p%40ss"),
                "{shown}"
            );
            assert!(shown.contains("app:***@"), "{shown}");
        }
    }

    #[test]
    fn zk_urls_carry_a_digest_identity_and_show_no_password() {
        let store = Store::parse("zk://app:s%2Fcret@a:1,b:2/apps").unwrap();
        assert_eq!(
            store,
            Store::Zk {
                hosts: "a:1,b:2".into(),
                chroot: Some("/apps".into()),
                digest: Some(("app".into(), "s/cret".into())),
            }
        );
        assert_eq!(store.to_string(), "zk://app:***@a:1,b:2/apps");
    }

    #[test]
    fn bad_urls_say_what_to_fix() {
        let cases = [
            ("127.0.0.1:6379", "no scheme"),
            ("mongodb://x", "unknown store scheme"),
            ("redlock://a:1,b:2", "at least 3"),
            ("redlock://a:1,,c:3", "host:port"),
            ("etcd://", "host:port"),
            ("redis://", "has no host"),
            ("etcd://a:99999", "is not host:port"),
            ("etcd://a", "needs a port"),
            ("zk://a:1,a:1/x", "twice"),
            ("redlock://a:1,b:2,A:1", "twice"),
            (
                "postgres://u@h/db?lease_tabel=x",
                "unknown parameter \"lease_tabel\"",
            ),
            ("redis://h:1?db=3", "unknown parameter"),
            ("zk://u@a:1", "user:password@"),
            ("etcd://a:1?ca=/x", "is for TLS"),
            ("etcds://a:1?cert=/c", "together"),
            ("etcds://a:1?tls=1", "unknown parameter"),
            ("memory://x", "takes nothing"),
        ];
        for (url, expected) in cases {
            let err = Store::parse(url).unwrap_err().to_string();
            assert!(err.contains(expected), "{url}: {err}");
        }
        let err = StoreConfig::new("postgres://u@h/db?lease_table=bad-name")
            .build()
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid table"), "{err}");
        let err = StoreConfig::new("memory://")
            .namespace("")
            .build()
            .unwrap_err();
        assert!(matches!(err, LeaseError::Config(_)));
    }

    #[test]
    fn toml_and_env_configs_load_with_human_durations() {
        let c = StoreConfig::from_toml_str(
            "store = \"redis://127.0.0.1:6379\"\nnamespace = \"billing\"\ndefault_ttl = \"1m 30s\"\nrequest_timeout = \"250ms\"\n",
        )
        .unwrap();
        assert_eq!(c.default_ttl, Duration::from_secs(90));
        assert_eq!(c.request_timeout, Duration::from_millis(250));
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        // Round trip through TOML.
        let back = StoreConfig::from_toml_str(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        let err = StoreConfig::from_toml_str("store = \"memory://\"\ndefault_ttl = \"soon\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("soon"), "{err}");
        let err = StoreConfig::from_toml_str("store = \"memory://\"\nttl = \"1s\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field"), "{err}");

        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let c = StoreConfig::from_lookup(env(&[
            ("LEASE_STORE", "memory://"),
            ("LEASE_DEFAULT_TTL", "45s"),
            ("LEASE_NAMESPACE", "jobs"),
        ]))
        .unwrap();
        assert_eq!(
            (c.default_ttl, c.namespace.as_str()),
            (Duration::from_secs(45), "jobs")
        );
        let err = StoreConfig::from_lookup(env(&[])).unwrap_err().to_string();
        assert!(err.contains("LEASE_STORE is not set"), "{err}");
        let err = StoreConfig::from_lookup(env(&[
            ("LEASE_STORE", "memory://"),
            ("LEASE_CONNECT_TIMEOUT", "x"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(err.contains("LEASE_CONNECT_TIMEOUT"), "{err}");
    }

    #[test]
    fn every_built_in_backend_builds_without_a_server() {
        for url in [
            "memory://",
            "redis://127.0.0.1:1",
            "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
            "postgres://u@127.0.0.1:1/db",
            "postgres://u@127.0.0.1:1/db?lease_mode=advisory",
            "etcd://127.0.0.1:1",
            "zk://127.0.0.1:1/chroot",
        ] {
            let store = Store::parse(url).unwrap();
            let p = store.build("ns", Duration::from_secs(1), Duration::from_secs(1));
            if cfg!(all(
                feature = "redis",
                feature = "postgres",
                feature = "etcd",
                feature = "zk"
            )) {
                let p = p.unwrap_or_else(|e| panic!("{url}: {e}"));
                assert_eq!(p.capabilities().backend, store.kind());
            } else if let Err(e) = p {
                assert!(e.to_string().contains("cargo feature"), "{url}: {e}");
            }
        }
    }

    #[tokio::test]
    async fn memory_urls_share_one_store_per_process() {
        let key = lease_api::LeaseKey::new("one-store-per-process").unwrap();
        let a = connect("memory://").unwrap();
        let b = connect("memory://").unwrap();
        let ttl = Duration::from_secs(30);
        let first = a
            .try_acquire(&key, ttl)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        assert!(
            !b.try_acquire(&key, ttl).await.unwrap().is_acquired(),
            "a second memory:// connect must see the first one's lease"
        );
        a.release(&first).await.unwrap();
        let second = b
            .try_acquire(&key, ttl)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        assert!(
            second.token() > first.token(),
            "tokens grow across connects"
        );
        b.release(&second).await.unwrap();
    }
}

//! The facade's URL parsing: a store URL parsed into a [`Store`] (every
//! scheme, its credentials and parameters), and the URL shown back with
//! passwords redacted.

use lease_api::{LeaseError, Result};

/// The store URL forms this crate understands.
pub const URL_FORMS: &str = "memory://, redis://host:port[/db], rediss://...[?ca=/path/ca.pem], \
redis+sentinel://host1:port,host2:port/<master-name>[/db][?wait=N], \
redis+cluster://host1:port,host2:port[?wait=N], redlock://host1:port,host2:port,host3:port, postgres://user@host[:port][,host:port...]/db[?lease_table=schema.table][&lease_mode=advisory][&lease_patroni=host:port,...], \
mysql://user@host[:port][,host:port...]/db[?lease_table=table][&lease_mode=advisory] (also mariadb://), \
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
        /// `lease_patroni=host:port[,host:port...]`: Patroni's REST APIs,
        /// where the failover probe reads the cluster's settings
        /// (`PostgresConfig::patroni`).
        patroni: Vec<String>,
    },
    /// `mysql://` or `mariadb://`: MySQL or MariaDB.
    Mysql {
        /// The connection URL without the `lease_*` parameters.
        url: String,
        /// The lease table, in the URL's database (with `advisory`, the
        /// token table).
        table: String,
        /// `lease_mode=advisory`: leases are named locks (`GET_LOCK`,
        /// [`lease_mysql::AdvisoryProvider`]), not rows.
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

/// The query parameters sqlx understands in a PostgreSQL URL, plus ours.
const POSTGRES_PARAMS: &[&str] = &[
    "lease_table",
    "lease_mode",
    "lease_patroni",
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

/// The query parameters sqlx understands in a MySQL URL, plus ours.
const MYSQL_PARAMS: &[&str] = &[
    "lease_table",
    "lease_mode",
    "ssl-mode",
    "ssl-ca",
    "ssl-cert",
    "ssl-key",
    "statement-cache-capacity",
    "charset",
    "collation",
    "socket",
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
                patroni,
            } => {
                let sep = if url.contains('?') { '&' } else { '?' };
                let mode = if *advisory {
                    "&lease_mode=advisory"
                } else {
                    ""
                };
                let patroni = if patroni.is_empty() {
                    String::new()
                } else {
                    format!("&lease_patroni={}", patroni.join(","))
                };
                format!("{url}{sep}lease_table={schema}.{table}{mode}{patroni}")
            }
            Store::Mysql {
                url,
                table,
                advisory,
            } => {
                let sep = if url.contains('?') { '&' } else { '?' };
                let mode = if *advisory {
                    "&lease_mode=advisory"
                } else {
                    ""
                };
                format!("{url}{sep}lease_table={table}{mode}")
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
                crate::urls::sql_url(scheme, url, rest, POSTGRES_PARAMS)?;
                let (base, query) = url.split_once('?').unwrap_or((url, ""));
                let mut keep = Vec::new();
                let (mut schema, mut table) = ("public".to_owned(), None);
                let mut advisory = false;
                let mut patroni = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    match pair.split_once('=') {
                        Some(("lease_table", v)) => match v.split_once('.') {
                            Some((s, t)) => (schema, table) = (s.to_owned(), Some(t.to_owned())),
                            None => table = Some(v.to_owned()),
                        },
                        Some(("lease_patroni", v)) => {
                            patroni = v
                                .split(',')
                                .filter(|a| !a.is_empty())
                                .map(str::to_owned)
                                .collect();
                        }
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
                    patroni,
                })
            }
            "mysql" | "mariadb" => {
                crate::urls::sql_url(scheme, url, rest, MYSQL_PARAMS)?;
                let (base, query) = url.split_once('?').unwrap_or((url, ""));
                let mut keep = Vec::new();
                let mut table = None;
                let mut advisory = false;
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    match pair.split_once('=') {
                        Some(("lease_table", v)) => table = Some(v.to_owned()),
                        Some(("lease_mode", "advisory")) => advisory = true,
                        Some(("lease_mode", "table")) => advisory = false,
                        Some(("lease_mode", other)) => {
                            return Err(config_err(format!(
                                "lease_mode is `table` (rows, the default) or `advisory` (named locks), not {other:?}"
                            )));
                        }
                        _ => keep.push(pair),
                    }
                }
                // lease_mysql::ADVISORY_TABLE, spelled here so parsing
                // works without the `mysql` feature.
                let table = table.unwrap_or_else(|| {
                    if advisory {
                        "lease_advisory"
                    } else {
                        "lease_leases"
                    }
                    .to_owned()
                });
                let url = if keep.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", keep.join("&"))
                };
                Ok(Store::Mysql {
                    url,
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
                patroni: Vec::new(),
            },
            Store::Mysql {
                table, advisory, ..
            } => Store::Mysql {
                url: "mysql://lease@127.0.0.1:1/lease".into(),
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
            Store::Mysql {
                advisory: false, ..
            } => "mysql",
            Store::Mysql { advisory: true, .. } => "mysql-advisory",
            Store::Etcd { .. } => "etcd",
            Store::Zk { .. } => "zookeeper",
        }
    }
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
                patroni: Vec::new(),
            }
        );
        assert_eq!(
            Store::parse("mariadb://u:pw@h:3307/db?ssl-mode=verify_identity&lease_table=locks")
                .unwrap(),
            Store::Mysql {
                url: "mariadb://u:pw@h:3307/db?ssl-mode=verify_identity".into(),
                table: "locks".into(),
                advisory: false,
            }
        );
        assert_eq!(
            Store::parse("mysql://u@h/db?lease_mode=advisory").unwrap(),
            Store::Mysql {
                url: "mysql://u@h/db".into(),
                table: "lease_advisory".into(),
                advisory: true,
            }
        );
        assert!(Store::parse("mysql://u@h/db?lease_mode=rows").is_err());
        assert_eq!(
            Store::parse("mysql://u:pw@h/db").unwrap().to_string(),
            "mysql://u:***@h/db?lease_table=lease_leases"
        );
        assert!(Store::parse("mysql://u@h/db?lease_tabel=x").is_err());
        assert_eq!(
            Store::parse("mysql://u:pw@a:1,b:2,c:3/db")
                .unwrap()
                .to_string(),
            "mysql://u:***@a:1,b:2,c:3/db?lease_table=lease_leases"
        );
        assert!(Store::parse("mysql://u@a:1,a:1/db").is_err());
        assert!(Store::parse("mysql://u@a:1,b:2/db?lease_tabel=x").is_err());
        assert_eq!(
            Store::parse("postgres://u@h1:5432,h2:5432/db?lease_patroni=h1:8008,h2:8008").unwrap(),
            Store::Postgres {
                url: "postgres://u@h1:5432,h2:5432/db".into(),
                schema: "public".into(),
                table: "lease_leases".into(),
                advisory: false,
                patroni: vec!["h1:8008".into(), "h2:8008".into()],
            }
        );
        assert_eq!(
            Store::parse("postgresql://u@h/db").unwrap(),
            Store::Postgres {
                url: "postgresql://u@h/db".into(),
                schema: "public".into(),
                table: "lease_leases".into(),
                advisory: false,
                patroni: Vec::new(),
            }
        );
        assert_eq!(
            Store::parse("postgres://u@h/db?lease_mode=advisory").unwrap(),
            Store::Postgres {
                url: "postgres://u@h/db".into(),
                schema: "public".into(),
                table: "lease_advisory".into(),
                advisory: true,
                patroni: Vec::new(),
            }
        );
        // Several hosts (a primary and its standbys): each a host[:port]
        // (without one, the default port).
        assert!(Store::parse("postgres://u@pg1,pg2:5433/db").is_ok());
        assert_eq!(
            Store::parse("postgres://u@h1:5432,h2:5433/db?lease_mode=advisory").unwrap(),
            Store::Postgres {
                url: "postgres://u@h1:5432,h2:5433/db".into(),
                schema: "public".into(),
                table: "lease_advisory".into(),
                advisory: true,
                patroni: Vec::new(),
            }
        );
        for bad in [
            "postgres://u@h1:5432,,h2:1/db",
            "postgres://u@h1:5432,h1:5432/db",
            "postgres://u@h1:,h2/db",
        ] {
            assert!(
                matches!(Store::parse(bad), Err(LeaseError::Config(_))),
                "{bad}"
            );
        }
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
}

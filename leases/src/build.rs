//! Building providers from a parsed [`Store`]: one per backend (behind its
//! cargo feature), purges of old namespaces, and the process's in-memory store.

use std::sync::Arc;
use std::time::Duration;

use lease_api::{LeaseError, LeaseProvider, MemoryProvider, Result};

#[cfg(feature = "etcd")]
use crate::store::EtcdAccess;
use crate::store::Store;

fn config_err(msg: impl Into<String>) -> LeaseError {
    LeaseError::Config(msg.into())
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

impl Store {
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
                patroni,
            } => {
                let config = lease_postgres::PostgresConfig::new(url)
                    .namespace(namespace)
                    .table(schema, table)
                    .timeouts(connect, request)
                    .patroni(patroni.clone());
                if *advisory {
                    Ok(Arc::new(lease_postgres::AdvisoryProvider::new(config)?))
                } else {
                    Ok(Arc::new(lease_postgres::PostgresProvider::new(config)?))
                }
            }
            #[cfg(feature = "mysql")]
            Store::Mysql {
                url,
                table,
                advisory,
            } => {
                let config = lease_mysql::MysqlConfig::new(url)
                    .namespace(namespace)
                    .table(table)
                    .timeouts(connect, request);
                if *advisory {
                    Ok(Arc::new(lease_mysql::AdvisoryProvider::new(config)?))
                } else {
                    Ok(Arc::new(lease_mysql::MysqlProvider::new(config)?))
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
            #[cfg(feature = "mysql")]
            Store::Mysql { url, table, .. } => {
                // The token rows of either mode are purged the same way.
                lease_mysql::MysqlProvider::new(
                    lease_mysql::MysqlConfig::new(url)
                        .table(table)
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
        Store::Mysql { .. } => "mysql",
        Store::Etcd { .. } => "etcd",
        Store::Zk { .. } => "zk",
    }
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

    use crate::config::connect;

    #[test]
    fn every_built_in_backend_builds_without_a_server() {
        for url in [
            "memory://",
            "redis://127.0.0.1:1",
            "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
            "postgres://u@127.0.0.1:1/db",
            "postgres://u@127.0.0.1:1/db?lease_mode=advisory",
            "mysql://u@127.0.0.1:1/db",
            "mariadb://u:pw@127.0.0.1:1/db?lease_table=locks",
            "mysql://u@127.0.0.1:1/db?lease_mode=advisory",
            "etcd://127.0.0.1:1",
            "zk://127.0.0.1:1/chroot",
        ] {
            let store = Store::parse(url).unwrap();
            let p = store.build("ns", Duration::from_secs(1), Duration::from_secs(1));
            if cfg!(all(
                feature = "redis",
                feature = "postgres",
                feature = "mysql",
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

//! The real peer crates, linked and run in this process (feature `peers`):
//! rslock for Redis and Redlock, distributed-lock-postgres for PostgreSQL,
//! distributed-lock-mysql for MySQL/MariaDB.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use distributed_lock_core::{DistributedLock, LockHandle, LockProvider};
use distributed_lock_mysql::MySqlLockProvider;
use distributed_lock_mysql::handle::MySqlLockHandle;
use distributed_lock_postgres::PostgresLockProvider;
use distributed_lock_postgres::handle::PostgresLockHandle;
use leases::LeaseError;
use tokio::time::Instant;

use leases::Result;

use crate::common::{Peer, err, handoff_rounds};

const PEER_TTL: Duration = Duration::from_secs(30);

/// rslock's `LockManager`: Redlock over one or more nodes, no notifications
/// (a waiter retries after a random delay of up to its retry delay).
pub struct RsLock {
    manager: rslock::LockManager,
    waiter: rslock::LockManager,
    held: HashMap<String, rslock::Lock>,
}

impl RsLock {
    pub fn new(urls: &[String]) -> Self {
        let manager = || {
            let mut m = rslock::LockManager::new(urls.to_vec());
            // Waiting is `acquire_no_guard`, a loop of `lock`; each `lock`
            // makes this many tries, the crate's defaults.
            m.set_retry(3, Duration::from_millis(200));
            m
        };
        RsLock {
            manager: manager(),
            waiter: manager(),
            held: HashMap::new(),
        }
    }
}

#[async_trait]
impl Peer for RsLock {
    fn name(&self) -> &'static str {
        "rslock 0.10 (LockManager::lock / unlock; waiting retries after up to 200 ms)"
    }
    async fn lock(&mut self, key: &str) -> Result<()> {
        let lock = self
            .manager
            .lock(key.as_bytes(), PEER_TTL)
            .await
            .map_err(err)?;
        self.held.insert(key.to_owned(), lock);
        Ok(())
    }
    async fn unlock(&mut self, key: &str) -> Result<()> {
        if let Some(lock) = self.held.remove(key) {
            self.manager.unlock(&lock).await;
        }
        Ok(())
    }
    async fn handoff(&mut self, key: &str, rounds: usize) -> Result<Vec<Duration>> {
        let (waiter, k) = (self.waiter.clone(), key.to_owned());
        let wait = move || {
            let (waiter, k) = (waiter.clone(), k.clone());
            async move {
                let lock = waiter
                    .acquire_no_guard(k.as_bytes(), PEER_TTL)
                    .await
                    .map_err(err)?;
                let t1 = Instant::now();
                waiter.unlock(&lock).await;
                Ok::<_, LeaseError>(t1)
            }
        };
        Ok(handoff_rounds!(rounds, { self.lock(key).await? }, wait, {
            self.unlock(key).await?
        }))
    }
}

/// distributed-lock-postgres: session-level advisory locks on a pooled
/// connection; a waiter blocks in `pg_advisory_lock` on the server.
pub struct DistributedLockPg {
    provider: PostgresLockProvider,
    held: HashMap<String, PostgresLockHandle>,
}

impl DistributedLockPg {
    pub async fn new(url: &str) -> Result<Self> {
        Ok(DistributedLockPg {
            provider: PostgresLockProvider::new(url).await.map_err(err)?,
            held: HashMap::new(),
        })
    }
}

#[async_trait]
impl Peer for DistributedLockPg {
    fn name(&self) -> &'static str {
        "distributed-lock-postgres 0.2 (try_acquire / release: session advisory lock)"
    }
    async fn lock(&mut self, key: &str) -> Result<()> {
        let handle = self
            .provider
            .create_lock(key)
            .try_acquire()
            .await
            .map_err(err)?
            .ok_or_else(|| err("held"))?;
        self.held.insert(key.to_owned(), handle);
        Ok(())
    }
    async fn unlock(&mut self, key: &str) -> Result<()> {
        if let Some(h) = self.held.remove(key) {
            h.release().await.map_err(err)?;
        }
        Ok(())
    }
    async fn handoff(&mut self, key: &str, rounds: usize) -> Result<Vec<Duration>> {
        let lock = std::sync::Arc::new(self.provider.create_lock(key));
        let wait = move || {
            let lock = std::sync::Arc::clone(&lock);
            async move {
                let handle = lock.acquire(Some(PEER_TTL)).await.map_err(err)?;
                let t1 = Instant::now();
                handle.release().await.map_err(err)?;
                Ok::<_, LeaseError>(t1)
            }
        };
        Ok(handoff_rounds!(rounds, { self.lock(key).await? }, wait, {
            self.unlock(key).await?
        }))
    }
}

/// distributed-lock-mysql: `GET_LOCK` on a session of its pool; a waiter
/// blocks in `GET_LOCK` on the server.
pub struct DistributedLockMysql {
    provider: MySqlLockProvider,
    held: HashMap<String, MySqlLockHandle>,
}

impl DistributedLockMysql {
    pub async fn new(url: &str) -> Result<Self> {
        let url = url.replacen("mariadb://", "mysql://", 1);
        Ok(DistributedLockMysql {
            provider: MySqlLockProvider::new(url).await.map_err(err)?,
            held: HashMap::new(),
        })
    }
}

#[async_trait]
impl Peer for DistributedLockMysql {
    fn name(&self) -> &'static str {
        "distributed-lock-mysql 0.2 (try_acquire / release: GET_LOCK)"
    }
    async fn lock(&mut self, key: &str) -> Result<()> {
        let handle = self
            .provider
            .create_lock(key)
            .try_acquire()
            .await
            .map_err(err)?
            .ok_or_else(|| err("held"))?;
        self.held.insert(key.to_owned(), handle);
        Ok(())
    }
    async fn unlock(&mut self, key: &str) -> Result<()> {
        if let Some(h) = self.held.remove(key) {
            h.release().await.map_err(err)?;
        }
        Ok(())
    }
    async fn handoff(&mut self, key: &str, rounds: usize) -> Result<Vec<Duration>> {
        let lock = std::sync::Arc::new(self.provider.create_lock(key));
        let wait = move || {
            let lock = std::sync::Arc::clone(&lock);
            async move {
                let handle = lock.acquire(Some(PEER_TTL)).await.map_err(err)?;
                let t1 = Instant::now();
                handle.release().await.map_err(err)?;
                Ok::<_, LeaseError>(t1)
            }
        };
        Ok(handoff_rounds!(rounds, { self.lock(key).await? }, wait, {
            self.unlock(key).await?
        }))
    }
}

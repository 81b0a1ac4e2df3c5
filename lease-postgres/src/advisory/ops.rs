//! The lease operations of `AdvisoryProvider`: acquire, extend, release,
//! inspect and watch, each on a session of its own.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::{KeyWatch, OwnerId};
use lease_api::{
    Capabilities, FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseProvider, Result,
    TryAcquire,
};
use sqlx::Row;
use tokio::time::Instant;

use super::watch::LockWatch;
use super::{AdvisoryProvider, Pinned, before_14, idle_ms, lock};
use crate::provider::{from_micros, micros, token_i64};
use crate::sql::payload;

#[async_trait]
impl LeaseProvider for AdvisoryProvider {
    fn capabilities(&self) -> &Capabilities {
        self.inner.base.capabilities()
    }

    fn namespace(&self) -> &str {
        self.inner.base.namespace()
    }

    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        self.inner.base.ready().await?;
        self.sweep();
        let owner = OwnerId::random();
        let holder = lease_api::holder();
        let lock_id = self.lock_id(key);
        let sent_at = Instant::now();
        let sql = &self.inner.sql;
        let namespace = self.inner.base.namespace();
        // The session goes out of the future with its answer: a session that
        // took the lock must not be dropped by a cancelled call unseen (it is
        // closed then, which frees the lock).
        let (conn, row) = self
            .inner
            .base
            .bounded("acquire", async {
                let _attempt = self
                    .inner
                    .attempts
                    .acquire()
                    .await
                    .map_err(|_| sqlx::Error::PoolClosed)?;
                let mut conn = self.session().await?;
                let row = sqlx::query(&sql.acquire)
                    .bind(namespace)
                    .bind(key.as_str())
                    .bind(lock_id)
                    .bind(owner.to_hex())
                    .bind(micros(ttl))
                    .bind(&*holder)
                    .bind(idle_ms(ttl))
                    .fetch_one(&mut conn)
                    .await
                    .map_err(before_14)?;
                Ok((conn, row))
            })
            .await?;
        let decode = |e: sqlx::Error| self.inner.base.map_err(e);
        let won: bool = row.try_get(0).map_err(decode)?;
        if !won {
            self.park(conn);
            let remaining: Option<i64> = row.try_get(2).map_err(decode)?;
            return Ok(TryAcquire::Held {
                remaining: remaining.map(from_micros),
            });
        }
        let token: i64 = row.try_get(1).map_err(decode)?;
        let token = u64::try_from(token)
            .map_err(|_| LeaseError::protocol(format!("negative token {token}")))?;
        let pid: i32 = row.try_get(3).map_err(decode)?;
        let lease =
            Lease::new(key.clone(), FencingToken(token), owner, ttl, sent_at).with_holder(holder);
        let pinned = Arc::new(Pinned {
            conn: tokio::sync::Mutex::new(Some(conn)),
            pid,
            valid_until: Mutex::new(lease.valid_until()),
        });
        lock(&self.inner.held).insert((key.as_str().to_owned(), token), (owner, pinned));
        Ok(TryAcquire::Acquired(lease))
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        let token = token_i64(lease.token())?;
        let Some(pinned) = self.pinned(lease) else {
            return Err(LeaseError::lost(lease));
        };
        let mut slot = pinned.conn.lock().await;
        let sent_at = Instant::now();
        let renewed = match slot.as_mut() {
            Some(conn) if sent_at < pinned.valid_until() => {
                let sql = &self.inner.sql.extend;
                let done = tokio::time::timeout(
                    self.inner.base.response_timeout(),
                    sqlx::query(sql)
                        .bind(self.inner.base.namespace())
                        .bind(lease.key().as_str())
                        .bind(lease.owner().to_hex())
                        .bind(token)
                        .bind(micros(ttl))
                        .bind(idle_ms(ttl))
                        .bind(pinned.pid)
                        .fetch_one(conn),
                )
                .await;
                match done {
                    Ok(Ok(row)) if row.try_get::<i64, _>(0).unwrap_or(0) == 1 => {
                        Some(lease.renewed(ttl, sent_at))
                    }
                    Ok(Ok(_)) => None,
                    Ok(Err(e)) => {
                        tracing::debug!(key = %lease.key(), error = %e, "the lease's session failed; the lease is lost");
                        None
                    }
                    Err(_) => {
                        tracing::debug!(key = %lease.key(), "the lease's session did not answer in time; closing it, which ends the lease");
                        None
                    }
                }
            }
            _ => None,
        };
        match renewed {
            Some(l) => {
                *lock(&pinned.valid_until) = l.valid_until();
                Ok(l)
            }
            None => {
                // Whatever broke, the session cannot be trusted to hold the
                // lock: closing it makes sure it does not.
                slot.take();
                drop(slot);
                self.forget(lease, &pinned);
                Err(LeaseError::lost(lease))
            }
        }
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let token = token_i64(lease.token())?;
        let Some(pinned) = self.pinned(lease) else {
            return self.release_elsewhere(lease, token).await;
        };
        let mut slot = pinned.conn.lock().await;
        let conn = slot.take();
        drop(slot);
        self.forget(lease, &pinned);
        let Some(mut conn) = conn else {
            return Err(LeaseError::not_held(lease));
        };
        if Instant::now() >= pinned.valid_until() {
            // Expired: the server ends (or ended) the session; closing it
            // here frees the lock now if it has not.
            return Err(LeaseError::not_held(lease));
        }
        let namespace = self.inner.base.namespace();
        let sql = &self.inner.sql.release;
        let answer = self
            .inner
            .base
            .bounded("release", async {
                let row = sqlx::query(sql)
                    .bind(namespace)
                    .bind(lease.key().as_str())
                    .bind(lease.owner().to_hex())
                    .bind(token)
                    .bind(self.lock_id(lease.key()))
                    .bind(self.inner.base.channel())
                    .bind(payload(namespace, lease.key().as_str()))
                    .bind(pinned.pid)
                    .fetch_optional(&mut conn)
                    .await?;
                Ok((conn, row))
            })
            .await?;
        match answer {
            (conn, Some(row)) if row.try_get::<bool, _>(0).unwrap_or(false) => {
                self.park(conn);
                Ok(())
            }
            // The row was not ours any more (purged), or the lock was not
            // held: the session is dropped, and with it anything it held.
            _ => Err(LeaseError::not_held(lease)),
        }
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        crate::provider::in_runtime()?;
        let sql = &self.inner.sql.inspect;
        let lock_id = self.lock_id(key);
        let namespace = self.inner.base.namespace();
        let row = self
            .inner
            .base
            .bounded("inspect", async {
                let mut conn = self.session().await?;
                let r = sqlx::query(sql)
                    .bind(namespace)
                    .bind(key.as_str())
                    .bind(lock_id)
                    .fetch_optional(&mut conn)
                    .await;
                match r {
                    Ok(row) => {
                        self.park(conn);
                        Ok(row)
                    }
                    // No table yet: nothing was ever held.
                    Err(sqlx::Error::Database(e))
                        if matches!(e.code().as_deref(), Some("42P01" | "3F000")) =>
                    {
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            })
            .await?;
        row.map(|r| self.inner.base.lease_info(&r)).transpose()
    }

    /// Waits in PostgreSQL's own lock queue: the watch's session asks for
    /// the lock (blocking, up to the wait) and gives it back the moment it
    /// gets it. So a waiter wakes when the holder releases **and** when the
    /// holder's session ends for any reason (a killed process, a
    /// terminated backend, the TTL), which no NOTIFY could announce.
    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        Ok(Box::new(LockWatch {
            provider: self.clone(),
            lock_id: self.lock_id(key),
        }))
    }

    /// The watch asks for the lock itself when it waits, so a key that is
    /// free by then is seen at once.
    fn watch_reports_state(&self) -> bool {
        true
    }

    /// The watch joins the lock queue only when it waits, and wakes only
    /// when the lock is free: a handover before that is not seen.
    fn watch_is_lazy(&self) -> bool {
        true
    }
}

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
use super::{AdvisoryProvider, Pinned, lock};
use crate::provider::{from_micros, micros};

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
        self.ready().await?;
        self.sweep();
        let owner = OwnerId::random();
        let holder = lease_api::holder();
        let name = self.lock_name(key);
        let sent_at = Instant::now();
        let sql = &self.inner.sql;
        let namespace = self.inner.base.namespace();
        // The session goes out of the future with its answer: a session that
        // took the lock and is dropped by a cancelled call is closed, which
        // frees the lock.
        let (session, done) = self
            .inner
            .base
            .bounded("acquire", async {
                let _attempt = self
                    .inner
                    .attempts
                    .acquire()
                    .await
                    .map_err(|_| sqlx::Error::PoolClosed)?;
                let mut session = self.session().await?;
                session.expire_after(ttl).await?;
                let done = sqlx::query(&sql.acquire)
                    .bind(namespace.as_bytes())
                    .bind(key.as_str().as_bytes())
                    .bind(owner.to_hex())
                    .bind(micros(ttl))
                    .bind(holder.as_bytes())
                    .bind(&name)
                    .execute(&mut session.conn)
                    .await?;
                Ok((session, done))
            })
            .await?;
        if done.rows_affected() == 0 {
            // GET_LOCK found the key held: how long for, as recorded.
            let mut session = session;
            let remaining: Option<i64> = self
                .inner
                .base
                .bounded(
                    "acquire",
                    sqlx::query_scalar(&sql.held_for)
                        .bind(namespace.as_bytes())
                        .bind(key.as_str().as_bytes())
                        .fetch_optional(&mut session.conn),
                )
                .await?;
            self.park(session);
            return Ok(TryAcquire::Held {
                remaining: remaining.map(from_micros),
            });
        }
        let token = done.last_insert_id();
        let lease =
            Lease::new(key.clone(), FencingToken(token), owner, ttl, sent_at).with_holder(holder);
        let pinned = Arc::new(Pinned {
            conn: tokio::sync::Mutex::new(Some(session)),
            valid_until: Mutex::new(lease.valid_until()),
        });
        lock(&self.inner.held).insert((key.as_str().to_owned(), token), (owner, pinned));
        Ok(TryAcquire::Acquired(lease))
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        let Some(pinned) = self.pinned(lease) else {
            return Err(LeaseError::lost(lease));
        };
        let mut slot = pinned.conn.lock().await;
        let sent_at = Instant::now();
        let renewed = match slot.as_mut() {
            Some(session) if sent_at < pinned.valid_until() => {
                let done = tokio::time::timeout(self.inner.base.response_timeout(), async {
                    session.expire_after(ttl).await?;
                    sqlx::query(&self.inner.sql.extend)
                        .bind(micros(ttl))
                        .bind(self.inner.base.namespace().as_bytes())
                        .bind(lease.key().as_str().as_bytes())
                        .bind(lease.owner().to_hex())
                        .bind(lease.token().get())
                        .bind(self.lock_name(lease.key()))
                        .execute(&mut session.conn)
                        .await
                })
                .await;
                match done {
                    Ok(Ok(d)) if d.rows_affected() == 1 => Some(lease.renewed(ttl, sent_at)),
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
        let Some(pinned) = self.pinned(lease) else {
            return self.release_elsewhere(lease).await;
        };
        let mut slot = pinned.conn.lock().await;
        let session = slot.take();
        drop(slot);
        self.forget(lease, &pinned);
        let Some(mut session) = session else {
            return Err(LeaseError::not_held(lease));
        };
        if Instant::now() >= pinned.valid_until() {
            // Expired: the server closes (or closed) the session; dropping
            // it here frees the lock now if it has not.
            return Err(LeaseError::not_held(lease));
        }
        let name = self.lock_name(lease.key());
        let sql = &self.inner.sql.release;
        let (session, done) = self
            .inner
            .base
            .bounded("release", async {
                let done = sqlx::query(sql)
                    .bind(&name)
                    .bind(self.inner.base.namespace().as_bytes())
                    .bind(lease.key().as_str().as_bytes())
                    .bind(lease.owner().to_hex())
                    .bind(lease.token().get())
                    .bind(&name)
                    .execute(&mut session.conn)
                    .await?;
                Ok((session, done))
            })
            .await?;
        if done.rows_affected() == 1 {
            self.park(session);
            Ok(())
        } else {
            // The lock was not this session's any more: the session is
            // dropped, and with it anything it held.
            Err(LeaseError::not_held(lease))
        }
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        crate::provider::in_runtime()?;
        let row = self
            .inner
            .base
            .bounded("inspect", async {
                let r = sqlx::query(&self.inner.sql.inspect)
                    .bind(self.inner.base.namespace().as_bytes())
                    .bind(key.as_str().as_bytes())
                    .bind(self.lock_name(key))
                    .fetch_optional(
                        self.inner
                            .base
                            .pool()
                            .map_err(|e| sqlx::Error::Configuration(e.into()))?,
                    )
                    .await;
                match r {
                    // No table yet: nothing was ever held.
                    Err(e) if crate::provider::error_number(&e) == Some(1146) => Ok(None),
                    r => r,
                }
            })
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let decode = |e: sqlx::Error| self.inner.base.map_err(e);
        let token: u64 = row.try_get(0).map_err(decode)?;
        let owner: Option<Vec<u8>> = row.try_get(1).map_err(decode)?;
        let remaining: i64 = row.try_get(2).map_err(decode)?;
        let holder: Option<Vec<u8>> = row.try_get(3).map_err(decode)?;
        Ok(Some(LeaseInfo::new(
            FencingToken(token),
            from_micros(remaining),
            owner
                .as_deref()
                .and_then(|o| std::str::from_utf8(o).ok())
                .and_then(OwnerId::from_hex),
            holder.map(|h| String::from_utf8_lossy(&h).into_owned()),
        )))
    }

    /// Waits in the named lock's own queue: the watch's session asks for
    /// the lock (blocking, up to the wait) and gives it back the moment it
    /// gets it. So a waiter wakes when the holder releases **and** when the
    /// holder's session ends for any reason (a killed process, `KILL`, the
    /// TTL), which nothing else would announce.
    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        Ok(Box::new(LockWatch {
            provider: self.clone(),
            name: self.lock_name(key),
        }))
    }

    /// The watch asks for the lock itself when it waits, so a key that is
    /// free by then is seen at once.
    fn watch_reports_state(&self) -> bool {
        true
    }

    /// The watch joins the lock's queue only when it waits, and wakes only
    /// when the lock is free: a handover before that is not seen.
    fn watch_is_lazy(&self) -> bool {
        true
    }
}

impl AdvisoryProvider {
    /// Releases a lease held by another provider or process: its session
    /// is ended (`KILL`, which needs the same user or the privilege to end
    /// others' sessions) and its row cleared.
    async fn release_elsewhere(&self, lease: &Lease) -> Result<()> {
        self.ready().await?;
        let sql = &self.inner.sql;
        let ns = self.inner.base.namespace().as_bytes();
        let key = lease.key().as_str().as_bytes();
        let killed = self
            .inner
            .base
            .bounded("release", async {
                // One transaction holding the token row: a newer acquire
                // (whose session may be the one the stale lease's lock was
                // on, reused) cannot commit its token between the check and
                // the KILL; it waits, and fails with the killed session.
                let mut session = self.session().await?;
                sqlx::query("BEGIN").execute(&mut session.conn).await?;
                let id: Option<Option<u64>> = sqlx::query_scalar(&sql.holder_of)
                    .bind(self.lock_name(lease.key()))
                    .bind(ns)
                    .bind(key)
                    .bind(lease.owner().to_hex())
                    .bind(lease.token().get())
                    .fetch_optional(&mut session.conn)
                    .await?;
                let Some(Some(id)) = id else {
                    sqlx::query("ROLLBACK").execute(&mut session.conn).await?;
                    self.park(session);
                    return Ok(false);
                };
                sqlx::query(&format!("KILL CONNECTION {id}"))
                    .execute(&mut session.conn)
                    .await?;
                sqlx::query(&sql.clear)
                    .bind(ns)
                    .bind(key)
                    .bind(lease.owner().to_hex())
                    .bind(lease.token().get())
                    .execute(&mut session.conn)
                    .await?;
                sqlx::query("COMMIT").execute(&mut session.conn).await?;
                self.park(session);
                Ok(true)
            })
            .await?;
        if killed {
            Ok(())
        } else {
            Err(LeaseError::not_held(lease))
        }
    }
}

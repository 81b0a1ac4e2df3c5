//! The lease operations of `SqliteProvider`: each one write transaction
//! (or a read), queued behind this provider's other writes.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::{KeyWatch, NotifyWatch, OwnerId};
use lease_api::{
    Capabilities, FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseKind, LeaseProvider,
    Result, RwInfo, TryAcquire, TryAcquireAll,
};
use sqlx::Row;
use tokio::time::Instant;

use crate::provider::{BATCH, EXTEND, RELEASE, SqliteProvider, host_now_ms, millis, token_i64};

#[async_trait]
impl LeaseProvider for SqliteProvider {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    fn namespace(&self) -> &str {
        &self.inner.config.namespace
    }

    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        let ttl = self.inner.caps.grant_ttl(ttl)?;
        // A key this provider found held is answered by a read, which runs
        // beside other processes' writes (WAL): a herd of waiters woken by
        // one release does not queue for the write lock only to find the key
        // taken. A stale read can only say "held", and the caller's watch,
        // set up before this call, sees the release that made it stale. A
        // key not seen held goes straight to the write: one transaction.
        let seen = {
            let now = Instant::now();
            let mut seen = self.seen_held();
            seen.retain(|_, until| *until > now);
            seen.contains_key(key.as_str())
        };
        if seen {
            if let Some(info) = self.inspect(key).await? {
                return Ok(TryAcquire::Held {
                    remaining: Some(info.remaining),
                });
            }
            self.seen_held().remove(key.as_str());
        }
        let seen_key = key.as_str().to_owned();
        let key = key.clone();
        let sent_at = Instant::now();
        let answer = self
            .write(move |this| async move {
                let owner = OwnerId::random();
                let holder = lease_api::holder();
                let mut tx = this.begin().await?;
                // The write lock is held: the clock is read after it was granted.
                let now = host_now_ms()?;
                if let Some(remaining) = this.held_for(&mut tx, &key, now).await? {
                    tx.rollback().await.map_err(|e| this.map_err(e))?;
                    return Ok(TryAcquire::Held {
                        remaining: Some(Duration::from_millis(
                            u64::try_from(remaining).unwrap_or(0),
                        )),
                    });
                }
                let token = this
                    .claim_row(&mut tx, &key, (owner, &holder), (now, ttl))
                    .await?;
                tx.commit().await.map_err(|e| this.map_err(e))?;
                Ok(TryAcquire::Acquired(
                    Lease::new(key, token, owner, ttl, sent_at).with_holder(holder),
                ))
            })
            .await;
        if let Ok(TryAcquire::Held {
            remaining: Some(remaining),
        }) = &answer
        {
            self.seen_held()
                .insert(seen_key, Instant::now() + *remaining);
        }
        answer
    }

    /// The whole set in one write transaction.
    async fn try_acquire_all(&self, keys: &[LeaseKey], ttl: Duration) -> Result<TryAcquireAll> {
        self.acquire_set(keys, ttl).await
    }

    async fn try_acquire_read(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.take_rw(key, ttl, None).await
    }

    async fn try_acquire_write(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        waiting: Option<OwnerId>,
    ) -> Result<TryAcquire> {
        self.take_rw(key, ttl, Some(waiting)).await
    }

    async fn withdraw_writer(&self, key: &LeaseKey, waiting: OwnerId) -> Result<()> {
        self.withdraw(key, waiting).await
    }

    async fn inspect_rw(&self, key: &LeaseKey) -> Result<RwInfo> {
        self.inspect_rw_lease(key).await
    }

    async fn watch_rw(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        // The key's bucket wakes on any release in it, plain or read/write.
        self.watch(key).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        if let Some(answer) = self.touch_rw(lease, Some(ttl)).await {
            return answer?.ok_or_else(|| LeaseError::protocol("an extend returned no lease"));
        }
        let ttl = self.inner.caps.grant_ttl(ttl)?;
        let mut answers = self.extend_all(vec![(lease.clone(), ttl)]).await?;
        answers
            .pop()
            .unwrap_or_else(|| Err(LeaseError::protocol("an extend returned no answer")))
    }

    /// Every lease of the batch in one transaction (one fsync).
    async fn extend_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        // Readers and writers live in rows of their own: each on its own.
        if leases.iter().any(|l| l.kind() != LeaseKind::Exclusive) {
            let mut out = Vec::with_capacity(leases.len());
            for l in leases {
                out.push(self.extend(l, l.ttl()).await);
            }
            return Ok(out);
        }
        let mut out = Vec::with_capacity(leases.len());
        let mut valid = Vec::new();
        let mut slots = Vec::with_capacity(leases.len());
        for l in leases {
            match self.inner.caps.grant_ttl(l.ttl()) {
                Ok(ttl) => {
                    slots.push(None);
                    valid.push((l.clone(), ttl));
                }
                Err(e) => slots.push(Some(e)),
            }
        }
        let mut answers = self.extend_all(valid).await?.into_iter();
        for slot in slots {
            out.push(match slot {
                Some(e) => Err(e),
                None => answers.next().unwrap_or_else(|| {
                    Err(LeaseError::protocol("a batched extend lost an answer"))
                }),
            });
        }
        Ok(out)
    }

    fn batch_limit(&self) -> usize {
        BATCH
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        if let Some(answer) = self.touch_rw(lease, None).await {
            return answer.map(|_| ());
        }
        let sent = lease.clone();
        let released = self
            .write(move |this| async move {
                let mut tx = this.begin().await?;
                let now = host_now_ms()?;
                let done = sqlx::query(RELEASE)
                    .bind(&this.inner.config.namespace)
                    .bind(sent.key().as_str())
                    .bind(sent.owner().to_hex())
                    .bind(token_i64(sent.token()))
                    .bind(&this.inner.boot)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| this.map_err(e))?;
                tx.commit().await.map_err(|e| this.map_err(e))?;
                Ok(done.rows_affected() == 1)
            })
            .await?;
        if released {
            self.announce(lease.key());
            Ok(())
        } else {
            Err(LeaseError::not_held(lease))
        }
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        self.ready().await?;
        let row = sqlx::query(
            "SELECT owner, expires_at, boot, token, holder FROM lease_leases WHERE namespace = ?1 AND key = ?2",
        )
        .bind(&self.inner.config.namespace)
        .bind(key.as_str())
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(|e| self.map_err(e))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let now = host_now_ms()?;
        let state = Some((row.get(0), row.get(1), row.get(2)));
        let Some(remaining) = self.lease_row_live(&state, now) else {
            return Ok(None);
        };
        let owner: Option<String> = row.get(0);
        let token: i64 = row.get(3);
        Ok(Some(LeaseInfo::new(
            FencingToken(u64::try_from(token).unwrap_or(0)),
            Duration::from_millis(u64::try_from(remaining).unwrap_or(0)),
            owner.as_deref().and_then(OwnerId::from_hex),
            row.get(4),
        )))
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        self.ensure_watcher().await?;
        let bucket = self
            .inner
            .released
            .get(self.bucket(key))
            .ok_or_else(|| LeaseError::protocol("a notification bucket out of range"))?;
        Ok(Box::new(NotifyWatch::new(Arc::clone(bucket))))
    }
}

impl SqliteProvider {
    /// Extends each `(lease, ttl)` in one transaction; one answer each.
    async fn extend_all(&self, leases: Vec<(Lease, Duration)>) -> Result<Vec<Result<Lease>>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let sent_at = Instant::now();
        let sent = leases.clone();
        let done: Vec<bool> = self
            .write(move |this| async move {
                let mut tx = this.begin().await?;
                let now = host_now_ms()?;
                let mut done = Vec::with_capacity(sent.len());
                for (lease, ttl) in &sent {
                    let r = sqlx::query(EXTEND)
                        .bind(now.saturating_add(millis(*ttl)))
                        .bind(&this.inner.config.namespace)
                        .bind(lease.key().as_str())
                        .bind(lease.owner().to_hex())
                        .bind(token_i64(lease.token()))
                        .bind(&this.inner.boot)
                        .bind(now)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| this.map_err(e))?;
                    done.push(r.rows_affected() == 1);
                }
                tx.commit().await.map_err(|e| this.map_err(e))?;
                Ok(done)
            })
            .await?;
        Ok(leases
            .iter()
            .zip(done)
            .map(|((lease, ttl), ok)| {
                if ok {
                    Ok(lease.renewed(*ttl, sent_at))
                } else {
                    Err(LeaseError::lost(lease))
                }
            })
            .collect())
    }
}

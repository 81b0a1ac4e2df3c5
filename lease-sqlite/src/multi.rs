//! A set of keys in one write transaction (C18): every key or none, decided
//! under SQLite's write lock, each key with its own token.

use std::sync::Arc;
use std::time::Duration;

use lease_api::backend::{OwnerId, validate_key_set};
use lease_api::{FencingToken, Lease, LeaseError, LeaseKey, Result, TryAcquireAll};
use sqlx::Row;
use tokio::time::Instant;

use crate::provider::{SqliteProvider, host_now_ms, millis};

impl SqliteProvider {
    pub(crate) async fn acquire_set(
        &self,
        keys: &[LeaseKey],
        ttl: Duration,
    ) -> Result<TryAcquireAll> {
        validate_key_set(keys, self.inner.caps.multi_key.max_keys)?;
        let ttl = self.inner.caps.grant_ttl(ttl)?;
        let keys = keys.to_vec();
        let sent_at = Instant::now();
        self.write(move |this| async move {
            let holder = lease_api::holder();
            let ns = this.inner.config.namespace.clone();
            let mut tx = this.begin().await?;
            // The write lock is held: the clock is read after it was granted.
            let now = host_now_ms()?;
            for key in &keys {
                let row: Option<(Option<String>, Option<i64>, Option<String>)> = sqlx::query(
                    "SELECT owner, expires_at, boot FROM lease_leases WHERE namespace = ?1 AND key = ?2",
                )
                .bind(&ns)
                .bind(key.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| this.map_err(e))?
                .map(|r| (r.get(0), r.get(1), r.get(2)));
                if let Some(remaining) = this.lease_row_live(&row, now) {
                    tx.rollback().await.map_err(|e| this.map_err(e))?;
                    return Ok(TryAcquireAll::Held {
                        key: key.clone(),
                        remaining: Some(Duration::from_millis(
                            u64::try_from(remaining).unwrap_or(0),
                        )),
                    });
                }
            }
            let mut leases = Vec::with_capacity(keys.len());
            for key in keys {
                let owner = OwnerId::random();
                let token: i64 = sqlx::query(
                    "UPDATE lease_tokens SET last = last + 1 WHERE id = 1 RETURNING last",
                )
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| this.map_err(e))?
                .get(0);
                sqlx::query(
                    "INSERT INTO lease_leases (namespace, key, owner, token, expires_at, boot, holder)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                     ON CONFLICT (namespace, key) DO UPDATE SET owner = excluded.owner,
                        token = excluded.token, expires_at = excluded.expires_at,
                        boot = excluded.boot, holder = excluded.holder",
                )
                .bind(&ns)
                .bind(key.as_str())
                .bind(owner.to_hex())
                .bind(token)
                .bind(now.saturating_add(millis(ttl)))
                .bind(&this.inner.boot)
                .bind(&*holder)
                .execute(&mut *tx)
                .await
                .map_err(|e| this.map_err(e))?;
                let token = u64::try_from(token)
                    .map_err(|_| LeaseError::protocol(format!("negative token {token}")))?;
                leases.push(
                    Lease::new(key, FencingToken(token), owner, ttl, sent_at)
                        .with_holder(Arc::clone(&holder)),
                );
            }
            tx.commit().await.map_err(|e| this.map_err(e))?;
            Ok(TryAcquireAll::Acquired(leases))
        })
        .await
    }
}

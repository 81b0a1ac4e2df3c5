//! A set of keys in one write transaction (C18): every key or none, decided
//! under SQLite's write lock, each key with its own token.

use std::sync::Arc;
use std::time::Duration;

use lease_api::backend::{OwnerId, validate_key_set};
use lease_api::{Lease, LeaseKey, Result, TryAcquireAll};
use tokio::time::Instant;

use crate::provider::{SqliteProvider, host_now_ms};

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
            let mut tx = this.begin().await?;
            // The write lock is held: the clock is read after it was granted.
            let now = host_now_ms()?;
            for key in &keys {
                if let Some(remaining) = this.held_for(&mut tx, key, now).await? {
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
                let token = this
                    .claim_row(&mut tx, &key, (owner, &holder), (now, ttl))
                    .await?;
                leases.push(
                    Lease::new(key, token, owner, ttl, sent_at).with_holder(Arc::clone(&holder)),
                );
            }
            tx.commit().await.map_err(|e| this.map_err(e))?;
            Ok(TryAcquireAll::Acquired(leases))
        })
        .await
    }
}

//! Read/write leases in the SQLite file (C19): rows of `lease_rw` (the
//! writer, the readers and the waiting writers of a key, each with its
//! expiry on this boot's monotonic clock) and the last writer's token in
//! `lease_rw_epochs`; every operation one write transaction.

use std::time::Duration;

use lease_api::backend::OwnerId;
use lease_api::{
    FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseKind, Result, RwInfo, TryAcquire,
};
use sqlx::Row;
use tokio::time::Instant;

use crate::provider::{SqliteProvider, host_now_ms, millis, token_i64};

/// A row is live until its expiry, on this boot only (the clock is this
/// boot's monotonic one).
const LIVE: &str = "expires_at > ?3 AND boot = ?4";

fn role(lease: &Lease) -> Option<&'static str> {
    match lease.kind() {
        LeaseKind::Write => Some("w"),
        LeaseKind::Read { .. } => Some("r"),
        LeaseKind::Exclusive => None,
    }
}

fn ms(n: i64) -> Duration {
    Duration::from_millis(u64::try_from(n).unwrap_or(0))
}

fn token(n: i64) -> Result<FencingToken> {
    u64::try_from(n)
        .map(FencingToken)
        .map_err(|_| LeaseError::protocol(format!("negative token {n}")))
}

impl SqliteProvider {
    /// Takes the key as a reader (`waiting` is `None`) or as its writer
    /// (`Some`: the waiting writer's id, if it waits), in one transaction.
    pub(crate) async fn take_rw(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        writer: Option<Option<OwnerId>>,
    ) -> Result<TryAcquire> {
        let ttl = self.inner.caps.grant_ttl(ttl)?;
        let key = key.clone();
        let sent_at = Instant::now();
        self.write(move |this| async move {
            let ns = this.inner.config.namespace.clone();
            let boot = this.inner.boot.clone();
            let mut tx = this.begin().await?;
            let now = host_now_ms()?;
            let err = |e| this.map_err(e);
            sqlx::query("DELETE FROM lease_rw WHERE namespace = ?1 AND key = ?2 AND NOT (expires_at > ?3 AND boot = ?4)")
                .bind(&ns).bind(key.as_str()).bind(now).bind(&boot)
                .execute(&mut *tx).await.map_err(err)?;
            let rows = sqlx::query(&format!(
                "SELECT role, max(expires_at), min(expires_at) FROM lease_rw
                  WHERE namespace = ?1 AND key = ?2 AND {LIVE} GROUP BY role"
            ))
            .bind(&ns).bind(key.as_str()).bind(now).bind(&boot)
            .fetch_all(&mut *tx).await.map_err(err)?;
            let (mut writer_until, mut reader_until, mut waiting_until) = (None, None, None);
            for r in rows {
                let (role, max, min): (String, i64, i64) = (r.get(0), r.get(1), r.get(2));
                match role.as_str() {
                    "w" => writer_until = Some(max),
                    "r" => reader_until = Some(max),
                    _ => waiting_until = Some(min),
                }
            }
            let refused = match writer {
                None => writer_until.or(waiting_until),
                Some(_) => writer_until.max(reader_until),
            };
            if let Some(until) = refused {
                if let Some(Some(id)) = writer {
                    sqlx::query(
                        "INSERT OR REPLACE INTO lease_rw (namespace, key, role, owner, token, expires_at, boot)
                         VALUES (?1, ?2, 'q', ?3, 0, ?4, ?5)",
                    )
                    .bind(&ns).bind(key.as_str()).bind(id.to_hex())
                    .bind(now.saturating_add(millis(ttl))).bind(&boot)
                    .execute(&mut *tx).await.map_err(err)?;
                    tx.commit().await.map_err(err)?;
                } else {
                    tx.rollback().await.map_err(err)?;
                }
                return Ok(TryAcquire::Held {
                    remaining: Some(ms(until - now)),
                });
            }
            let tok: i64 = sqlx::query("UPDATE lease_tokens SET last = last + 1 WHERE id = 1 RETURNING last")
                .fetch_one(&mut *tx).await.map_err(err)?.get(0);
            let owner = OwnerId::random();
            let holder = lease_api::holder();
            let role = if writer.is_some() { "w" } else { "r" };
            sqlx::query(
                "INSERT INTO lease_rw (namespace, key, role, owner, token, expires_at, boot, holder)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .bind(&ns).bind(key.as_str()).bind(role).bind(owner.to_hex()).bind(tok)
            .bind(now.saturating_add(millis(ttl))).bind(&boot).bind(&*holder)
            .execute(&mut *tx).await.map_err(err)?;
            let kind = if let Some(waiting) = writer {
                if let Some(id) = waiting {
                    sqlx::query("DELETE FROM lease_rw WHERE namespace = ?1 AND key = ?2 AND role = 'q' AND owner = ?3")
                        .bind(&ns).bind(key.as_str()).bind(id.to_hex())
                        .execute(&mut *tx).await.map_err(err)?;
                }
                sqlx::query(
                    "INSERT INTO lease_rw_epochs (namespace, key, epoch) VALUES (?1, ?2, ?3)
                     ON CONFLICT (namespace, key) DO UPDATE SET epoch = excluded.epoch",
                )
                .bind(&ns).bind(key.as_str()).bind(tok)
                .execute(&mut *tx).await.map_err(err)?;
                LeaseKind::Write
            } else {
                let epoch: Option<i64> = sqlx::query("SELECT epoch FROM lease_rw_epochs WHERE namespace = ?1 AND key = ?2")
                    .bind(&ns).bind(key.as_str())
                    .fetch_optional(&mut *tx).await.map_err(err)?
                    .map(|r| r.get(0));
                LeaseKind::Read { writer_epoch: token(epoch.unwrap_or(0))? }
            };
            tx.commit().await.map_err(err)?;
            Ok(TryAcquire::Acquired(
                Lease::new(key, token(tok)?, owner, ttl, sent_at)
                    .with_holder(holder)
                    .with_kind(kind),
            ))
        })
        .await
    }

    /// Extend (`Some(ttl)`) or release (`None`) of a reader or writer;
    /// `None` for a plain lease.
    pub(crate) async fn touch_rw(
        &self,
        lease: &Lease,
        ttl: Option<Duration>,
    ) -> Option<Result<Option<Lease>>> {
        let role = role(lease)?;
        Some(
            async {
                let ttl = ttl.map(|t| self.inner.caps.grant_ttl(t)).transpose()?;
                let sent = lease.clone();
                let sent_at = Instant::now();
                let done = self
                    .write(move |this| async move {
                        let mut tx = this.begin().await?;
                        let now = host_now_ms()?;
                        let cond = format!(
                            "namespace = ?1 AND key = ?2 AND {LIVE} AND role = ?5 AND owner = ?6 AND token = ?7"
                        );
                        let sql = match ttl {
                            Some(_) => format!("UPDATE lease_rw SET expires_at = ?8 WHERE {cond}"),
                            None => format!("DELETE FROM lease_rw WHERE {cond}"),
                        };
                        let done = sqlx::query(&sql)
                            .bind(&this.inner.config.namespace)
                            .bind(sent.key().as_str())
                            .bind(now)
                            .bind(&this.inner.boot)
                            .bind(role)
                            .bind(sent.owner().to_hex())
                            .bind(token_i64(sent.token()))
                            .bind(now.saturating_add(ttl.map_or(0, millis)))
                            .execute(&mut *tx)
                            .await
                            .map_err(|e| this.map_err(e))?;
                        tx.commit().await.map_err(|e| this.map_err(e))?;
                        Ok(done.rows_affected() == 1)
                    })
                    .await?;
                match (done, ttl) {
                    (true, Some(ttl)) => Ok(Some(lease.renewed(ttl, sent_at))),
                    (true, None) => {
                        self.announce(lease.key());
                        Ok(None)
                    }
                    (false, Some(_)) => Err(LeaseError::lost(lease)),
                    (false, None) => Err(LeaseError::not_held(lease)),
                }
            }
            .await,
        )
    }

    pub(crate) async fn withdraw(&self, key: &LeaseKey, waiting: OwnerId) -> Result<()> {
        let k = key.clone();
        let gone = self
            .write(move |this| async move {
                let mut tx = this.begin().await?;
                let done = sqlx::query(
                    "DELETE FROM lease_rw WHERE namespace = ?1 AND key = ?2 AND role = 'q' AND owner = ?3",
                )
                .bind(&this.inner.config.namespace)
                .bind(k.as_str())
                .bind(waiting.to_hex())
                .execute(&mut *tx)
                .await
                .map_err(|e| this.map_err(e))?;
                tx.commit().await.map_err(|e| this.map_err(e))?;
                Ok(done.rows_affected() > 0)
            })
            .await?;
        if gone {
            self.announce(key);
        }
        Ok(())
    }

    pub(crate) async fn inspect_rw_lease(&self, key: &LeaseKey) -> Result<RwInfo> {
        self.ready().await?;
        let now = host_now_ms()?;
        let ns = &self.inner.config.namespace;
        let rows = sqlx::query(&format!(
            "SELECT role, owner, token, expires_at, holder FROM lease_rw
              WHERE namespace = ?1 AND key = ?2 AND {LIVE}"
        ))
        .bind(ns)
        .bind(key.as_str())
        .bind(now)
        .bind(&self.inner.boot)
        .fetch_all(&self.inner.pool)
        .await
        .map_err(|e| self.map_err(e))?;
        let epoch: Option<i64> =
            sqlx::query("SELECT epoch FROM lease_rw_epochs WHERE namespace = ?1 AND key = ?2")
                .bind(ns)
                .bind(key.as_str())
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(|e| self.map_err(e))?
                .map(|r| r.get(0));
        let mut info = RwInfo::default();
        info.writer_epoch = token(epoch.unwrap_or(0))?;
        for r in rows {
            let role: String = r.get(0);
            let owner: String = r.get(1);
            let expires: i64 = r.get(3);
            let held = LeaseInfo::new(
                token(r.get(2))?,
                ms(expires - now),
                OwnerId::from_hex(&owner),
                r.get(4),
            );
            match role.as_str() {
                "w" => info.writer = Some(held),
                "r" => info.readers.push(held),
                _ => info.writers_waiting += 1,
            }
        }
        info.readers.sort_by_key(|r| r.token);
        Ok(info)
    }
}

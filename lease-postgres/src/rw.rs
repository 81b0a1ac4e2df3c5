//! Read/write leases on PostgreSQL (C19): one statement per operation on the
//! key's row in `<table>_rw` (see `rw_sql`).

use std::time::Duration;

use lease_api::backend::OwnerId;
use lease_api::{
    FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseKind, LeaseProvider, Result, RwInfo,
    TryAcquire,
};
use sqlx::Row;
use tokio::time::Instant;

use crate::orphans::{Flight, Wins};
use crate::provider::{PostgresProvider, from_micros, micros, token_i64};
use crate::sql::rw_payload;

fn token(n: i64) -> Result<FencingToken> {
    u64::try_from(n)
        .map(FencingToken)
        .map_err(|_| LeaseError::protocol(format!("negative token {n}")))
}

/// The answer of a read or write statement: taken, the token, the last
/// writer's token (reads only), and the remaining µs of what refused it.
type Taken = (bool, Option<i64>, i64, Option<i64>);

impl PostgresProvider {
    /// The wake-up name of a key's read/write lease, for this provider's hub.
    pub(crate) fn rw_wake(&self, key: &LeaseKey) -> String {
        rw_payload(&self.inner.namespace, key.as_str())
    }

    async fn take(
        &self,
        what: &'static str,
        statement: &str,
        key: &LeaseKey,
        (owner, ttl, waiting): (OwnerId, Duration, Option<&str>),
    ) -> Result<Taken> {
        let holder = lease_api::holder();
        let owner_hex = owner.to_hex();
        let (key_str, owner_str) = (key.as_str(), owner_hex.as_str());
        let wins = match waiting {
            None => Wins::Reader {
                key: key_str,
                owner: owner_str,
            },
            Some(_) => Wins::Writer {
                key: key_str,
                owner: owner_str,
            },
        };
        let flight = Flight::new(self, statement, wins);
        self.bounded(what, async {
            let mut c = self.inner.conns.checkout().await?;
            flight.sent(c.session());
            let mut q = sqlx::query(statement)
                .bind(&self.inner.namespace)
                .bind(key.as_str())
                .bind(owner_str)
                .bind(micros(ttl))
                .bind(&*holder);
            if let Some(w) = waiting {
                q = q.bind(w);
            }
            let r = q.fetch_one(c.conn()).await;
            flight.answered(&r);
            c.done(&r);
            let row = r?;
            let epoch = if waiting.is_none() {
                row.try_get(2)?
            } else {
                0
            };
            let remaining = row.try_get(if waiting.is_none() { 3 } else { 2 })?;
            let taken: Taken = (row.try_get(0)?, row.try_get(1)?, epoch, remaining);
            if taken.1.is_some_and(|t| t < 0) || epoch < 0 {
                return Err(sqlx::Error::Protocol(format!(
                    "negative token in {taken:?}"
                )));
            }
            // Read (the tokens as the caller takes them): the caller has it.
            // An answer that cannot be read drops the flight unsettled, and
            // what it may have won is released.
            flight.settled();
            Ok(taken)
        })
        .await
    }

    pub(crate) async fn read(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        self.ready().await?;
        let owner = OwnerId::random();
        let sent_at = Instant::now();
        let sql = &self.inner.sql.rw.read;
        let (taken, tok, epoch, remaining) = self
            .take("acquire_read", sql, key, (owner, ttl, None))
            .await?;
        let (true, Some(tok)) = (taken, tok) else {
            return Ok(TryAcquire::Held {
                remaining: remaining.map(from_micros),
            });
        };
        Ok(TryAcquire::Acquired(
            Lease::new(key.clone(), token(tok)?, owner, ttl, sent_at).with_kind(LeaseKind::Read {
                writer_epoch: token(epoch)?,
            }),
        ))
    }

    pub(crate) async fn write(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        waiting: Option<OwnerId>,
    ) -> Result<TryAcquire> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        self.ready().await?;
        let owner = OwnerId::random();
        let waiting = waiting.map(OwnerId::to_hex).unwrap_or_default();
        let sent_at = Instant::now();
        let sql = &self.inner.sql.rw.write;
        let (taken, tok, _, remaining) = self
            .take("acquire_write", sql, key, (owner, ttl, Some(&waiting)))
            .await?;
        let (true, Some(tok)) = (taken, tok) else {
            return Ok(TryAcquire::Held {
                remaining: remaining.map(from_micros),
            });
        };
        Ok(TryAcquire::Acquired(
            Lease::new(key.clone(), token(tok)?, owner, ttl, sent_at).with_kind(LeaseKind::Write),
        ))
    }

    /// Extend of a reader or writer; `None` for a plain lease.
    pub(crate) async fn extend_rw(&self, lease: &Lease, ttl: Duration) -> Option<Result<Lease>> {
        let sql = match lease.kind() {
            LeaseKind::Exclusive => return None,
            LeaseKind::Write => &self.inner.sql.rw.extend_writer,
            LeaseKind::Read { .. } => &self.inner.sql.rw.extend_reader,
        };
        Some(
            async {
                let ttl = self.capabilities().grant_ttl(ttl)?;
                self.ready().await?;
                let tok = token_i64(lease.token())?;
                let sent_at = Instant::now();
                let done = self
                    .bounded("extend", async {
                        let mut c = self.inner.conns.checkout().await?;
                        let r = sqlx::query(sql)
                            .bind(&self.inner.namespace)
                            .bind(lease.key().as_str())
                            .bind(lease.owner().to_hex())
                            .bind(tok)
                            .bind(micros(ttl))
                            .execute(c.conn())
                            .await;
                        c.done(&r);
                        r
                    })
                    .await?;
                if done.rows_affected() == 1 {
                    Ok(lease.renewed(ttl, sent_at))
                } else {
                    Err(LeaseError::lost(lease))
                }
            }
            .await,
        )
    }

    /// Release of a reader or writer; `None` for a plain lease.
    pub(crate) async fn release_rw(&self, lease: &Lease) -> Option<Result<()>> {
        let sql = match lease.kind() {
            LeaseKind::Exclusive => return None,
            LeaseKind::Write => &self.inner.sql.rw.release_writer,
            LeaseKind::Read { .. } => &self.inner.sql.rw.release_reader,
        };
        Some(
            async {
                self.ready().await?;
                let tok = token_i64(lease.token())?;
                let released = self
                    .bounded("release", async {
                        let mut c = self.inner.conns.checkout().await?;
                        let r = sqlx::query(sql)
                            .bind(&self.inner.namespace)
                            .bind(lease.key().as_str())
                            .bind(lease.owner().to_hex())
                            .bind(tok)
                            .bind(&self.inner.sql.channel)
                            .bind(self.rw_wake(lease.key()))
                            .fetch_optional(c.conn())
                            .await;
                        c.done(&r);
                        r
                    })
                    .await?;
                match released {
                    Some(_) => Ok(()),
                    None => Err(LeaseError::not_held(lease)),
                }
            }
            .await,
        )
    }

    pub(crate) async fn withdraw(&self, key: &LeaseKey, waiting: OwnerId) -> Result<()> {
        self.ready().await?;
        self.bounded("withdraw_writer", async {
            let mut c = self.inner.conns.checkout().await?;
            let r = sqlx::query(&self.inner.sql.rw.withdraw)
                .bind(&self.inner.namespace)
                .bind(key.as_str())
                .bind(waiting.to_hex())
                .bind(&self.inner.sql.channel)
                .bind(self.rw_wake(key))
                .fetch_optional(c.conn())
                .await;
            c.done(&r);
            r
        })
        .await?;
        Ok(())
    }

    pub(crate) async fn inspect_rw_lease(&self, key: &LeaseKey) -> Result<RwInfo> {
        self.ready().await?;
        let rows = self
            .bounded("inspect_rw", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query(&self.inner.sql.rw.inspect)
                    .bind(&self.inner.namespace)
                    .bind(key.as_str())
                    .fetch_all(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        let mut info = RwInfo::default();
        let decode = |e: sqlx::Error| self.map_err(e);
        for row in rows {
            let role: String = row.try_get(0).map_err(decode)?;
            let who: Option<String> = row.try_get(1).map_err(decode)?;
            let n: i64 = row.try_get(2).map_err(decode)?;
            let remaining = from_micros(row.try_get::<i64, _>(3).map_err(decode)?);
            let label: Option<String> = row.try_get(4).map_err(decode)?;
            let owner = who.as_deref().and_then(OwnerId::from_hex);
            match role.as_str() {
                "e" => info.writer_epoch = token(n)?,
                "w" => info.writer = Some(LeaseInfo::new(token(n)?, remaining, owner, label)),
                "r" => info
                    .readers
                    .push(LeaseInfo::new(token(n)?, remaining, owner, label)),
                _ => info.writers_waiting += 1,
            }
        }
        info.readers.sort_by_key(|r| r.token);
        Ok(info)
    }
}

//! The lease operations of `PostgresProvider`: acquire, extend, release,
//! inspect and watch, one statement each.

use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::{KeyWatch, OwnerId, WaitQueue};
use lease_api::{
    Capabilities, FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseKind, LeaseProvider,
    Result, RwInfo, TryAcquire, TryAcquireAll,
};
use sqlx::Row;
use tokio::time::Instant;

use crate::orphans::{Flight, Wins};
use crate::provider::{PostgresProvider, from_micros, in_runtime, micros, token_i64};
use crate::sql::payload;

#[async_trait]
impl LeaseProvider for PostgresProvider {
    fn capabilities(&self) -> &Capabilities {
        self.inner.caps.get()
    }

    fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        self.ready().await?;
        let owner = OwnerId::random();
        let holder = lease_api::holder();
        let sent_at = Instant::now();
        let (keys, owners) = ([key.as_str()], [owner.to_hex()]);
        let flight = Flight::new(
            self,
            &self.inner.sql.acquire,
            Wins::Plain {
                keys: &keys,
                owners: &owners,
            },
        );
        let row = self
            .bounded("acquire", async {
                let mut c = self.inner.conns.checkout().await?;
                flight.sent(c.session());
                let r = sqlx::query(&self.inner.sql.acquire)
                    .bind(&self.inner.namespace)
                    .bind(key.as_str())
                    .bind(&owners[0])
                    .bind(micros(ttl))
                    .bind(&*holder)
                    .fetch_optional(c.conn())
                    .await;
                flight.answered(&r);
                c.done(&r);
                r
            })
            .await?;
        let Some(row) = row else {
            // A concurrent acquirer inserted the row after our snapshot and won.
            flight.settled();
            return Ok(TryAcquire::Held { remaining: None });
        };
        // An answer that cannot be read drops the flight unsettled: what it
        // may have won is released.
        let decode = |e: sqlx::Error| self.map_err(e);
        let won: bool = row.try_get(0).map_err(decode)?;
        let token: i64 = row.try_get(1).map_err(decode)?;
        let answer = if won {
            let token = u64::try_from(token)
                .map_err(|_| LeaseError::protocol(format!("negative token {token}")))?;
            TryAcquire::Acquired(
                Lease::new(key.clone(), FencingToken(token), owner, ttl, sent_at)
                    .with_holder(holder),
            )
        } else {
            let remaining: Option<i64> = row.try_get(2).map_err(decode)?;
            TryAcquire::Held {
                remaining: remaining.map(from_micros),
            }
        };
        flight.settled();
        Ok(answer)
    }

    /// One statement for the whole set (see `multi.rs`).
    async fn try_acquire_all(&self, keys: &[LeaseKey], ttl: Duration) -> Result<TryAcquireAll> {
        self.acquire_set(keys, ttl).await
    }

    async fn try_acquire_read(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.read(key, ttl).await
    }

    async fn try_acquire_write(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        waiting: Option<OwnerId>,
    ) -> Result<TryAcquire> {
        self.write(key, ttl, waiting).await
    }

    async fn withdraw_writer(&self, key: &LeaseKey, waiting: OwnerId) -> Result<()> {
        self.withdraw(key, waiting).await
    }

    async fn inspect_rw(&self, key: &LeaseKey) -> Result<RwInfo> {
        self.inspect_rw_lease(key).await
    }

    async fn watch_rw(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        // As `watch`: registered before the listener is checked.
        let watch = self.inner.hub.watch(&self.rw_wake(key));
        self.ensure_listener().await?;
        Ok(Box::new(watch))
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        if let Some(answer) = self.extend_rw(lease, ttl).await {
            return answer;
        }
        let ttl = self.capabilities().grant_ttl(ttl)?;
        self.ready().await?;
        let sent_at = Instant::now();
        let token = token_i64(lease.token())?;
        let done = self
            .bounded("extend", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query(&self.inner.sql.extend)
                    .bind(&self.inner.namespace)
                    .bind(lease.key().as_str())
                    .bind(lease.owner().to_hex())
                    .bind(token)
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

    /// One `UPDATE ... FROM unnest(...)` for the whole batch, owner and
    /// token compared per row.
    async fn extend_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        // Readers and writers live in their own rows: each on its own.
        if leases.iter().any(|l| l.kind() != LeaseKind::Exclusive) {
            return Ok(futures_util::future::join_all(
                leases.iter().map(|l| self.extend(l, l.ttl())),
            )
            .await);
        }
        let caps = self.capabilities();
        let ttls: Vec<Result<Duration>> = leases
            .iter()
            .map(|l| {
                let ttl = caps.grant_ttl(l.ttl())?;
                token_i64(l.token())?;
                Ok(ttl)
            })
            .collect();
        let sent: Vec<(&Lease, Duration)> = leases
            .iter()
            .zip(&ttls)
            .filter_map(|(l, t)| t.as_ref().ok().map(|t| (l, *t)))
            .collect();
        let mut extended = std::collections::HashSet::new();
        // Sent before the statement: every row's validity counts from here (C10).
        let sent_at = Instant::now();
        if !sent.is_empty() {
            self.ready().await?;
            let keys: Vec<&str> = sent.iter().map(|(l, _)| l.key().as_str()).collect();
            let owners: Vec<String> = sent.iter().map(|(l, _)| l.owner().to_hex()).collect();
            let tokens: Vec<i64> = sent
                .iter()
                .map(|(l, _)| i64::try_from(l.token().get()).unwrap_or(-1))
                .collect();
            let ttl_micros: Vec<i64> = sent.iter().map(|(_, t)| micros(*t)).collect();
            let rows = self
                .bounded("extend", async {
                    let mut c = self.inner.conns.checkout().await?;
                    let r = sqlx::query(&self.inner.sql.extend_many)
                        .bind(&self.inner.namespace)
                        .bind(&keys)
                        .bind(&owners)
                        .bind(&tokens)
                        .bind(&ttl_micros)
                        .fetch_all(c.conn())
                        .await;
                    c.done(&r);
                    r
                })
                .await?;
            for row in rows {
                let decode = |e: sqlx::Error| self.map_err(e);
                let key: String = row.try_get(0).map_err(decode)?;
                let token: i64 = row.try_get(1).map_err(decode)?;
                extended.insert((key, token));
            }
        }
        Ok(leases
            .iter()
            .zip(ttls)
            .map(|(lease, ttl)| {
                let ttl = ttl?;
                let token = i64::try_from(lease.token().get()).unwrap_or(-1);
                if extended.contains(&(lease.key().as_str().to_owned(), token)) {
                    Ok(lease.renewed(ttl, sent_at))
                } else {
                    Err(LeaseError::lost(lease))
                }
            })
            .collect())
    }

    fn batch_limit(&self) -> usize {
        1000
    }

    async fn flush(&self, limit: Duration) {
        lease_api::backend::drain(&self.inner.cleanups, limit).await;
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        if let Some(answer) = self.release_rw(lease).await {
            return answer;
        }
        self.ready().await?;
        let token = token_i64(lease.token())?;
        let released = self
            .bounded("release", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query(&self.inner.sql.release)
                    .bind(&self.inner.namespace)
                    .bind(lease.key().as_str())
                    .bind(lease.owner().to_hex())
                    .bind(token)
                    .bind(&self.inner.sql.channel)
                    .bind(payload(&self.inner.namespace, lease.key().as_str()))
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

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        // Reading never creates or alters the table (`lease status` runs no
        // DDL): a table or schema that does not exist holds no lease.
        in_runtime()?;
        self.probe_first().await;
        self.start_probe();
        let answer = async {
            let mut c = self.inner.conns.checkout().await?;
            let r = sqlx::query(&self.inner.sql.inspect)
                .bind(&self.inner.namespace)
                .bind(key.as_str())
                .fetch_optional(c.conn())
                .await;
            c.done(&r);
            match r {
                Err(sqlx::Error::Database(e))
                    if matches!(e.code().as_deref(), Some("42P01" | "3F000")) =>
                {
                    Ok(None)
                }
                r => r,
            }
        };
        let row = self.bounded("inspect", answer).await?;
        row.map(|r| self.lease_info(&r)).transpose()
    }

    fn wait_queue(&self) -> Option<&dyn WaitQueue> {
        self.capabilities()
            .fair_waiting
            .then_some(self as &dyn WaitQueue)
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        // Registered before the listener is checked: a listener that dies in
        // between wakes this watch too.
        let watch = self
            .inner
            .hub
            .watch(&payload(&self.inner.namespace, key.as_str()));
        self.ensure_listener().await?;
        Ok(Box::new(watch))
    }
}

//! The lease operations of `MysqlProvider`: acquire, extend, release,
//! inspect and watch, one statement each.

use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::{KeyWatch, OwnerId};
use lease_api::{
    Capabilities, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseProvider, Result, TryAcquire,
};
use sqlx::Row;
use tokio::time::Instant;

use crate::orphans::Flight;
use crate::provider::{MysqlProvider, from_micros, in_runtime, micros, token};
use crate::watch::PollWatch;

/// Runs one statement on a slot's connection; again (up to 50 times, the
/// caller's deadline bounding it) while the server rolled it back as a
/// deadlock (1213): many acquirers inserting one new key at once can
/// deadlock on InnoDB's insert locks, and on Galera a certification
/// conflict, or a DDL statement replicated in total order, aborts a
/// transaction the same way. A rolled-back statement changed nothing, so
/// asking again is safe.
macro_rules! statement {
    ($provider:expr, |$c:ident| $body:expr) => {
        statement!($provider, checkout ch => {
            let $c = ch.conn();
            $body.await
        })
    };
    ($provider:expr, checkout $checkout:ident => $body:expr) => {{
        let mut tries = 0u64;
        loop {
            let mut checkout = $provider.inner.conns.checkout().await?;
            let r = {
                let $checkout = &mut checkout;
                $body
            };
            checkout.done(&r);
            match r {
                Err(e) if crate::provider::error_number(&e) == Some(1213) && tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(1 + tries % 5)).await;
                }
                r => break r,
            }
        }
    }};
}

#[async_trait]
impl LeaseProvider for MysqlProvider {
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
        let owner_hex = owner.to_hex();
        let flight = Flight::new(self, &self.inner.sql.acquire, key.as_str(), &owner_hex);
        let done = self
            .bounded("acquire", async {
                statement!(self, checkout c => {
                    flight.sent(c.session());
                    let r = sqlx::query(&self.inner.sql.acquire)
                        .bind(self.inner.namespace.as_bytes())
                        .bind(key.as_str().as_bytes())
                        .bind(&owner_hex)
                        .bind(micros(ttl))
                        .bind(holder.as_bytes())
                        .execute(c.conn())
                        .await;
                    flight.answered(&r);
                    r
                })
            })
            .await?;
        // One answer says who won and, for a loser, the holder's time
        // left (see `sql::WON`).
        let id = done.last_insert_id();
        flight.settled();
        if done.rows_affected() == 2 || (done.rows_affected() == 1 && id == 1) {
            return Ok(TryAcquire::Acquired(
                Lease::new(key.clone(), token(id), owner, ttl, sent_at).with_holder(holder),
            ));
        }
        Ok(TryAcquire::Held {
            remaining: id.checked_sub(2).map(Duration::from_micros),
        })
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        self.ready().await?;
        let sent_at = Instant::now();
        let done = self
            .bounded("extend", async {
                statement!(self, |c| sqlx::query(&self.inner.sql.extend)
                    .bind(micros(ttl))
                    .bind(self.inner.namespace.as_bytes())
                    .bind(lease.key().as_str().as_bytes())
                    .bind(lease.owner().to_hex())
                    .bind(lease.token().get())
                    .execute(c))
            })
            .await?;
        // Matched rows (sqlx asks for CLIENT_FOUND_ROWS): 1 while held.
        if done.rows_affected() == 1 {
            Ok(lease.renewed(ttl, sent_at))
        } else {
            Err(LeaseError::lost(lease))
        }
    }

    /// Two statements for the whole batch (see `multi.rs`).
    async fn extend_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        self.extend_batch(leases).await
    }

    fn batch_limit(&self) -> usize {
        crate::multi::BATCH
    }

    async fn flush(&self, limit: Duration) {
        lease_api::backend::drain(&self.inner.cleanups, limit).await;
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.ready().await?;
        let done = self
            .bounded("release", async {
                statement!(self, |c| sqlx::query(&self.inner.sql.release)
                    .bind(self.inner.namespace.as_bytes())
                    .bind(lease.key().as_str().as_bytes())
                    .bind(lease.owner().to_hex())
                    .bind(lease.token().get())
                    .execute(c))
            })
            .await?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(LeaseError::not_held(lease))
        }
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        // Reading never creates or alters the table: a table that does not
        // exist (1146) holds no lease.
        in_runtime()?;
        self.start_probe();
        let row = self
            .bounded("inspect", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query(&self.inner.sql.inspect)
                    .bind(self.inner.namespace.as_bytes())
                    .bind(key.as_str().as_bytes())
                    .fetch_optional(c.conn())
                    .await;
                c.done(&r);
                match r {
                    Err(e) if crate::provider::error_number(&e) == Some(1146) => Ok(None),
                    r => r,
                }
            })
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let decode = |e: sqlx::Error| self.map_err(e);
        let token: u64 = row.try_get(0).map_err(decode)?;
        let owner: Option<Vec<u8>> = row.try_get(1).map_err(decode)?;
        let remaining: i64 = row.try_get(2).map_err(decode)?;
        let holder: Option<Vec<u8>> = row.try_get(3).map_err(decode)?;
        Ok(Some(LeaseInfo::new(
            crate::provider::token(token),
            from_micros(remaining),
            owner
                .as_deref()
                .and_then(|o| std::str::from_utf8(o).ok())
                .and_then(OwnerId::from_hex),
            holder.map(|h| String::from_utf8_lossy(&h).into_owned()),
        )))
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        let watch = PollWatch::start(self.clone(), key.clone()).await?;
        Ok(Box::new(watch))
    }

    fn watch_reports_state(&self) -> bool {
        false
    }
}

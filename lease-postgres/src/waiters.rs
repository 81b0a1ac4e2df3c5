//! Fair waiting on PostgreSQL: the `WaitQueue` of `PostgresProvider`, a
//! table of waiters beside the lease table.

use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::{KeyWatch, Place, Ticket, WaitQueue};
use lease_api::{LeaseError, LeaseKey, LeaseProvider, Result};
use sqlx::Row;

use crate::provider::{PostgresProvider, from_micros, micros};
use crate::sql::ticket_payload;

/// Fair waiting on a table beside the lease table (`<table>_waiters`): a
/// row per waiter, ordered by an identity column, with a deadline on the
/// database clock. Leaving sends a NOTIFY only the waiter behind listens
/// for; a dead waiter's row is skipped, and dropped, once its deadline
/// passed.
#[async_trait]
impl WaitQueue for PostgresProvider {
    /// A retried join renews the live ticket of its mark.
    fn retried_join_finds_its_ticket(&self) -> bool {
        true
    }

    async fn join(&self, key: &LeaseKey, ttl: Duration, mark: u64) -> Result<Ticket> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        self.ready().await?;
        let sql = &self.inner.sql.waiters;
        let pool = self.pool()?;
        let indexed = *self
            .inner
            .marks_indexed
            .get_or_try_init(|| {
                self.bounded(
                    "looking up the waiters' index",
                    sqlx::query_scalar::<_, bool>(&sql.has_mark_index).fetch_one(pool),
                )
            })
            .await?;
        let statement = if indexed {
            &sql.join
        } else {
            &sql.join_unindexed
        };
        let mut joined = None;
        for _ in 0..3 {
            joined = self
                .bounded("joining the queue", async {
                    let mut c = self.inner.conns.checkout().await?;
                    let r = sqlx::query_scalar::<_, i64>(statement)
                        .bind(&self.inner.namespace)
                        .bind(key.as_str())
                        .bind(micros(ttl))
                        .bind(mark_i64(mark))
                        .fetch_optional(c.conn())
                        .await;
                    c.done(&r);
                    r
                })
                .await?;
            if joined.is_some() {
                break;
            }
            // A dead ticket of this mark is in the way: drop it, join anew.
            self.bounded(
                "dropping a dead ticket",
                sqlx::query(&sql.drop_dead_mark)
                    .bind(&self.inner.namespace)
                    .bind(key.as_str())
                    .bind(mark_i64(mark))
                    .execute(pool),
            )
            .await?;
        }
        let seq = joined.ok_or_else(|| {
            LeaseError::protocol("a join found its mark's dead ticket three times")
        })?;
        let seq = u64::try_from(seq)
            .map_err(|_| LeaseError::protocol(format!("negative waiter number {seq}")))?;
        Ok(Ticket::new(key.clone(), seq, mark))
    }

    async fn place(&self, ticket: &Ticket) -> Result<Place> {
        self.ready().await?;
        let seq = seq_i64(ticket)?;
        let row = self
            .bounded("the queue", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query(&self.inner.sql.waiters.place)
                    .bind(&self.inner.namespace)
                    .bind(ticket.key().as_str())
                    .bind(seq)
                    .bind(mark_i64(ticket.mark()))
                    .fetch_one(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        let decode = |e: sqlx::Error| self.map_err(e);
        let own: bool = row.try_get(0).map_err(decode)?;
        let ahead: Option<i64> = row.try_get(1).map_err(decode)?;
        let remaining: Option<i64> = row.try_get(2).map_err(decode)?;
        let ahead_mark: Option<i64> = row.try_get(3).map_err(decode)?;
        Ok(match (own, ahead) {
            (false, _) => Place::Gone,
            (true, None) => Place::First,
            (true, Some(ahead)) => Place::Behind {
                ahead: Ticket::new(
                    ticket.key().clone(),
                    u64::try_from(ahead).unwrap_or(0),
                    u64::from_ne_bytes(ahead_mark.unwrap_or(0).to_ne_bytes()),
                ),
                remaining: Some(from_micros(remaining.unwrap_or(0))),
            },
        })
    }

    async fn watch_ticket(&self, ahead: &Ticket) -> Result<Box<dyn KeyWatch>> {
        // Registered and listening first, then looked at: a leave before the
        // look shows as a missing row, one after it as a notification.
        let watch = self.inner.hub.watch(&ticket_payload(
            &self.inner.namespace,
            ahead.key().as_str(),
            ahead.seq(),
        ));
        self.ensure_listener().await?;
        let seq = seq_i64(ahead)?;
        let live: bool = self
            .bounded("the queue", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query_scalar(&self.inner.sql.waiters.live)
                    .bind(&self.inner.namespace)
                    .bind(ahead.key().as_str())
                    .bind(seq)
                    .bind(mark_i64(ahead.mark()))
                    .fetch_one(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        if live {
            Ok(Box::new(watch))
        } else {
            Ok(Box::new(lease_api::backend::ReadyWatch))
        }
    }

    async fn refresh(&self, ticket: &Ticket, ttl: Duration) -> Result<bool> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        let seq = seq_i64(ticket)?;
        let done = self
            .bounded("refreshing a waiter", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query(&self.inner.sql.waiters.refresh)
                    .bind(&self.inner.namespace)
                    .bind(ticket.key().as_str())
                    .bind(seq)
                    .bind(mark_i64(ticket.mark()))
                    .bind(micros(ttl))
                    .execute(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn leave(&self, ticket: &Ticket) -> Result<()> {
        let seq = seq_i64(ticket)?;
        self.bounded("leaving the queue", async {
            let mut c = self.inner.conns.checkout().await?;
            let r = sqlx::query(&self.inner.sql.waiters.leave)
                .bind(&self.inner.namespace)
                .bind(ticket.key().as_str())
                .bind(seq)
                .bind(mark_i64(ticket.mark()))
                .bind(&self.inner.sql.channel)
                .bind(ticket_payload(
                    &self.inner.namespace,
                    ticket.key().as_str(),
                    ticket.seq(),
                ))
                .execute(c.conn())
                .await;
            c.done(&r);
            r
        })
        .await?;
        Ok(())
    }
}

/// A ticket's mark as PostgreSQL's `bigint` (the same 64 bits).
fn mark_i64(mark: u64) -> i64 {
    i64::from_ne_bytes(mark.to_ne_bytes())
}

fn seq_i64(ticket: &Ticket) -> Result<i64> {
    i64::try_from(ticket.seq())
        .map_err(|_| LeaseError::protocol(format!("waiter number {} out of range", ticket.seq())))
}

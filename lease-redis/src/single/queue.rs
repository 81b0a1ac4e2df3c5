//! Fair waiting on Redis: the `WaitQueue` of `RedisProvider`, a sorted set
//! of tickets per key.

use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::{KeyWatch, Place, Ticket, WaitQueue};
use lease_api::{LeaseKey, LeaseProvider, Result};

use super::RedisProvider;
use crate::keys::{QueueKeys, member_mark, queue_keys, ticket_member, ticket_message};
use crate::scripts::{QUEUE_JOIN, QUEUE_LEAVE, QUEUE_LIVE, QUEUE_PLACE, QUEUE_REFRESH};

impl RedisProvider {
    fn queue_keys(&self, key: &LeaseKey) -> QueueKeys {
        queue_keys(&self.keys(key).0)
    }
}

/// Fair waiting on a sorted set per key (same hash tag as the lease, so one
/// Redis Cluster slot): tickets ordered by a counter, deadlines on the
/// server's clock in a second sorted set. A waiter leaving announces it on
/// the release channel with a message only the waiter behind it listens
/// for; a dead waiter's ticket is dropped once its deadline passed.
#[async_trait]
impl WaitQueue for RedisProvider {
    /// A retried join renews the live ticket of its mark.
    fn retried_join_finds_its_ticket(&self) -> bool {
        true
    }

    async fn join(&self, key: &LeaseKey, ttl: Duration, mark: u64) -> Result<Ticket> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        let k = self.queue_keys(key);
        let ms = ttl.as_millis().to_string();
        let seq: u64 = self
            .inner
            .node
            .eval(
                &QUEUE_JOIN,
                &[&k.tickets, &k.deadlines, &k.counter, &k.marks],
                &[&format!("{mark:016x}"), &ms],
            )
            .await?;
        Ok(Ticket::new(key.clone(), seq, mark))
    }

    async fn place(&self, ticket: &Ticket) -> Result<Place> {
        let k = self.queue_keys(ticket.key());
        let (ahead, remaining, member): (i64, i64, String) = self
            .inner
            .node
            .eval(
                &QUEUE_PLACE,
                &[&k.tickets, &k.deadlines, &k.marks],
                &[&ticket_member(ticket.seq(), ticket.mark())],
            )
            .await?;
        Ok(match u64::try_from(ahead) {
            Err(_) => Place::Gone,
            Ok(0) => Place::First,
            Ok(seq) => Place::Behind {
                ahead: Ticket::new(ticket.key().clone(), seq, member_mark(&member)),
                remaining: Some(Duration::from_millis(u64::try_from(remaining).unwrap_or(0))),
            },
        })
    }

    async fn watch_ticket(&self, ahead: &Ticket) -> Result<Box<dyn KeyWatch>> {
        // Registered and subscribed first, then looked at: a leave before
        // the look shows as a missing ticket, one after it as a message.
        let member = ticket_member(ahead.seq(), ahead.mark());
        let watch = self
            .inner
            .hub
            .watch(&ticket_message(ahead.key().as_str(), &member));
        self.inner
            .node
            .subscribe(&self.inner.channel, &self.inner.hub)
            .await?;
        let k = self.queue_keys(ahead.key());
        let live: i64 = self
            .inner
            .node
            .eval(&QUEUE_LIVE, &[&k.deadlines], &[&member])
            .await?;
        if live == 1 {
            Ok(Box::new(watch))
        } else {
            Ok(Box::new(lease_api::backend::ReadyWatch))
        }
    }

    async fn refresh(&self, ticket: &Ticket, ttl: Duration) -> Result<bool> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        let k = self.queue_keys(ticket.key());
        let done: i64 = self
            .inner
            .node
            .eval(
                &QUEUE_REFRESH,
                &[&k.tickets, &k.deadlines, &k.counter, &k.marks],
                &[
                    &ticket_member(ticket.seq(), ticket.mark()),
                    &ttl.as_millis().to_string(),
                ],
            )
            .await?;
        Ok(done == 1)
    }

    async fn leave(&self, ticket: &Ticket) -> Result<()> {
        let k = self.queue_keys(ticket.key());
        let member = ticket_member(ticket.seq(), ticket.mark());
        let _: i64 = self
            .inner
            .node
            .eval(
                &QUEUE_LEAVE,
                &[&k.tickets, &k.deadlines, &k.marks],
                &[
                    &member,
                    &self.inner.channel,
                    &ticket_message(ticket.key().as_str(), &member),
                ],
            )
            .await?;
        Ok(())
    }
}

//! Fair FIFO waiting (C17): waiters served in the order they arrived, each
//! woken by its predecessor only.
//!
//! A plain [`acquire`](crate::acquire) waiter watches the key: every release
//! wakes all of them and they race, so under contention the longest wait has
//! no bound. A fair waiter first takes a [`Ticket`] in the key's queue of
//! waiters (a store-side structure: etcd keys ordered by create revision,
//! ZooKeeper sequential nodes, a Redis sorted set, a PostgreSQL table) and
//! watches only the ticket just ahead of it. The first in line alone watches
//! the key and takes it when it is freed; it then leaves the queue, which
//! wakes its successor. A waiter that dies leaves a ticket that ends with its
//! TTL (or its session), so a crashed waiter holds the line up for one TTL
//! at most.
//!
//! Fairness holds among fair waiters: a plain `acquire` or `try_acquire`
//! does not look at the queue and may take a freed key first.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::provider::{KeyWatch, LeaseProvider, MAX_BLIND_WAIT};
use crate::{Lease, LeaseError, LeaseKey, Result};

/// A waiter's place in the queue of one key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    key: LeaseKey,
    seq: u64,
    handle: i64,
}

impl Ticket {
    /// A ticket of `key` at position `seq` (increasing in arrival order), with
    /// a backend's own `handle` (an etcd lease id; zero where unused).
    pub fn new(key: LeaseKey, seq: u64, handle: i64) -> Self {
        Ticket { key, seq, handle }
    }

    /// The key this ticket waits for.
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }

    /// The ticket's place: a later arrival has a greater number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The backend's own handle of the ticket.
    pub fn handle(&self) -> i64 {
        self.handle
    }
}

/// Where a ticket stands, from [`WaitQueue::place`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Place {
    /// No live ticket is ahead: this waiter's turn.
    First,
    /// `ahead` is the live ticket just in front; it ends by itself after
    /// `remaining` unless its waiter refreshes it (`None`: when its session
    /// ends).
    Behind {
        /// The ticket just in front.
        ahead: Ticket,
        /// How long that ticket lives unless refreshed.
        remaining: Option<Duration>,
    },
    /// This ticket is no longer in the queue: it expired (its waiter did not
    /// refresh it within its TTL) or was removed.
    Gone,
}

/// A key's queue of waiters in the store, for fair waiting.
///
/// Backends that declare [`Capabilities::fair_waiting`](crate::Capabilities::fair_waiting)
/// return one from [`LeaseProvider::wait_queue`]. Each method is one atomic
/// step in the store; [`acquire`](crate::acquire) with
/// [`AcquireOptions::fair`](crate::AcquireOptions::fair) combines them.
#[async_trait]
pub trait WaitQueue: Send + Sync {
    /// Appends a waiter to `key`'s queue; its ticket lives `ttl` on the
    /// store's clock unless [`refresh`](Self::refresh)ed (or, where tickets
    /// are bound to a session, as long as the session).
    async fn join(&self, key: &LeaseKey, ttl: Duration) -> Result<Ticket>;

    /// Where `ticket` stands; tickets past their TTL do not count.
    async fn place(&self, ticket: &Ticket) -> Result<Place>;

    /// A watch that wakes when `ahead` leaves the queue. A ticket that is
    /// gone already when the watch is set up wakes it at once, so a leave
    /// between [`place`](Self::place) and this call is not missed.
    async fn watch_ticket(&self, ahead: &Ticket) -> Result<Box<dyn KeyWatch>>;

    /// Gives `ticket` another `ttl` from now. `Ok(false)`: it was gone.
    async fn refresh(&self, ticket: &Ticket, ttl: Duration) -> Result<bool>;

    /// Removes `ticket` and wakes the waiter behind it. Leaving twice is
    /// not an error.
    async fn leave(&self, ticket: &Ticket) -> Result<()>;
}

impl fmt::Debug for dyn WaitQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WaitQueue")
    }
}

/// A ticket that leaves the queue when dropped, so an abandoned or timed-out
/// fair acquire never holds the line up for its TTL.
struct Held<P: LeaseProvider + ?Sized + 'static> {
    provider: Arc<P>,
    ticket: Option<Ticket>,
}

impl<P: LeaseProvider + ?Sized + 'static> Held<P> {
    fn ticket(&self) -> Result<&Ticket> {
        self.ticket
            .as_ref()
            .ok_or_else(|| LeaseError::protocol("the fair waiter has no ticket"))
    }
}

impl<P: LeaseProvider + ?Sized + 'static> Drop for Held<P> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let provider = Arc::clone(&self.provider);
        runtime.spawn(async move {
            if let Some(queue) = provider.wait_queue()
                && let Err(e) = queue.leave(&ticket).await
            {
                tracing::debug!(key = %ticket.key(), error = %e, "could not leave the queue of waiters; the ticket ends with its TTL");
            }
        });
    }
}

/// The fair path of [`acquire`](crate::acquire): waits in the key's queue
/// until first, then waits for the key itself.
pub(crate) async fn acquire_fair<P>(
    provider: &Arc<P>,
    key: &LeaseKey,
    ttl: Duration,
    wait: Duration,
    waited: &mut Duration,
) -> Result<Option<Lease>>
where
    P: LeaseProvider + ?Sized + 'static,
{
    let caps = provider.capabilities();
    caps.grant_ttl(ttl)?;
    let Some(queue) = provider.wait_queue().filter(|_| caps.fair_waiting) else {
        return Err(LeaseError::Config(format!(
            "{} does not offer fair waiting (Capabilities::fair_waiting is false); \
             acquire without AcquireOptions::fair",
            caps.backend
        )));
    };
    let started = Instant::now();
    let deadline = crate::deadline_in(wait);
    // A ticket is refreshed a few times per TTL while its waiter waits.
    let refresh_every = (ttl / 3).max(Duration::from_millis(1));
    let mut held = Held {
        provider: Arc::clone(provider),
        ticket: Some(queue.join(key, ttl).await?),
    };
    let mut next_refresh = Instant::now() + refresh_every;
    loop {
        let ticket = held.ticket()?.clone();
        let ahead = match queue.place(&ticket).await? {
            Place::First => break,
            Place::Gone => {
                // Our ticket ran out (this process was paused or cut off for
                // a TTL): join again at the end of the line.
                tracing::debug!(key = %key, "the fair waiter's ticket expired; joining the queue again");
                held.ticket = None;
                held.ticket = Some(queue.join(key, ttl).await?);
                next_refresh = Instant::now() + refresh_every;
                continue;
            }
            Place::Behind { ahead, remaining } => (ahead, remaining),
        };
        let (ahead, remaining) = ahead;
        let mut watch = queue.watch_ticket(&ahead).await?;
        let now = Instant::now();
        if now >= deadline {
            *waited += now - started;
            if let Err(e) = queue.leave(&ticket).await {
                tracing::debug!(key = %key, error = %e, "could not leave the queue of waiters; the ticket ends with its TTL");
            }
            held.ticket = None;
            return Ok(None);
        }
        // Wake when the ticket ahead leaves, when it would expire, when ours
        // is due a refresh, or at the deadline.
        let until_expiry = remaining
            .map(|r| r.saturating_add(Duration::from_millis(1)))
            .unwrap_or(MAX_BLIND_WAIT);
        let until = (now + until_expiry)
            .min(deadline)
            .min(next_refresh.max(now));
        watch.changed(until - now).await;
        if Instant::now() >= next_refresh {
            if !queue.refresh(&ticket, ttl).await? {
                held.ticket = None;
                held.ticket = Some(queue.join(key, ttl).await?);
            }
            next_refresh = Instant::now() + refresh_every;
        }
    }
    *waited += started.elapsed();
    // First in line: wait for the key itself, the only waiter of this queue
    // that does, keeping the ticket alive meanwhile.
    let remaining_wait = deadline.saturating_duration_since(Instant::now());
    let ticket = held.ticket()?.clone();
    let keep = async {
        loop {
            tokio::time::sleep(refresh_every).await;
            match queue.refresh(&ticket, ttl).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::debug!(key = %key, "the first waiter's ticket expired while it waited for the key")
                }
                Err(e) => {
                    tracing::debug!(key = %key, error = %e, "could not refresh the fair waiter's ticket")
                }
            }
        }
    };
    let acquired = tokio::select! {
        r = crate::provider::acquire_waiting(provider, key, ttl, remaining_wait, waited) => r,
        () = keep => Err(LeaseError::protocol("the ticket refresh loop ended")),
    };
    // Leaving wakes the successor, which then watches the key. Dropped
    // halfway, the guard leaves again (leaving is idempotent).
    if let Err(e) = queue.leave(&ticket).await {
        tracing::debug!(key = %key, error = %e, "could not leave the queue of waiters; the ticket ends with its TTL");
    }
    held.ticket = None;
    acquired
}

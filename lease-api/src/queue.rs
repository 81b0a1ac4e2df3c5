//! The queue of waiters a store keeps per key for fair waiting (C17): the
//! ticket, where it stands, and the trait a backend implements.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::watch::KeyWatch;
use crate::{LeaseKey, Result};

/// A waiter's place in the queue of one key.
///
/// A ticket is its number *and* its mark: the number orders the queue, the
/// mark (random per join) tells this waiter's ticket from another that got
/// the same number after the store lost its queue (expiry, a restart
/// without persistence, a failover to a lagging replica).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    key: LeaseKey,
    seq: u64,
    mark: u64,
    handle: i64,
}

impl Ticket {
    /// A ticket of `key` at position `seq` (increasing in arrival order),
    /// made by the join marked `mark` (zero where the store does not keep
    /// marks, or for a ticket ahead whose mark is unknown).
    pub fn new(key: LeaseKey, seq: u64, mark: u64) -> Self {
        Ticket {
            key,
            seq,
            mark,
            handle: 0,
        }
    }

    /// The same ticket with a backend's own `handle` (an etcd lease id).
    #[must_use]
    pub fn with_handle(mut self, handle: i64) -> Self {
        self.handle = handle;
        self
    }

    /// The mark of the join that made this ticket.
    pub fn mark(&self) -> u64 {
        self.mark
    }

    /// A random, non-zero mark for a [`WaitQueue::join`].
    pub fn random_mark() -> u64 {
        loop {
            let (hi, lo) = uuid::Uuid::new_v4().as_u64_pair();
            if hi ^ lo != 0 {
                return hi ^ lo;
            }
        }
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
/// return one from [`LeaseProvider::wait_queue`](crate::LeaseProvider::wait_queue). Each method is one atomic
/// step in the store; [`acquire`](crate::acquire) with
/// [`AcquireOptions::fair`](crate::AcquireOptions::fair) combines them.
///
/// A ticket is found by its number and its [mark](Ticket::mark) together:
/// [`place`](Self::place), [`refresh`](Self::refresh) and
/// [`leave`](Self::leave) treat a ticket whose number the store gave again
/// to another join as gone, never as that other waiter's.
#[async_trait]
pub trait WaitQueue: Send + Sync {
    /// Appends a waiter to `key`'s queue, the join named by `mark` (random,
    /// non-zero); its ticket lives `ttl` on the store's clock unless
    /// [`refresh`](Self::refresh)ed (or, where tickets are bound to a
    /// session, as long as the session).
    ///
    /// A join whose answer was lost (the store may have made the ticket) is
    /// retried with the same mark, and must then not leave a second ticket
    /// behind: the store returns the live ticket of that mark (Redis,
    /// PostgreSQL, memory), or removed the lost one itself before the error
    /// returned (etcd revokes its lease, ZooKeeper deletes the marked node).
    async fn join(&self, key: &LeaseKey, ttl: Duration, mark: u64) -> Result<Ticket>;

    /// Whether a join retried with a lost join's mark finds the ticket that
    /// join made (Redis, PostgreSQL, memory), rather than the store having
    /// removed it by itself (etcd, ZooKeeper). A fair waiter that gives up
    /// right after a lost join clears the ticket that way only where this
    /// is true. Default: `false`.
    fn retried_join_finds_its_ticket(&self) -> bool {
        false
    }

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

/// The longest a ticket lives without a refresh, whatever the lease's TTL:
/// a waiter that died holds the line up for this long at most.
pub const MAX_TICKET_TTL: Duration = Duration::from_secs(10);

//! The rules of a queue of waiters kept by TTL and mark (C17), as pure
//! functions over one key's queue: the in-memory provider runs them under
//! its lock, Redis's scripts and PostgreSQL's statements state the same
//! rules in Lua and SQL, and the model checker (the `lease-model` crate)
//! explores them against every interleaving of joins, looks, refreshes,
//! leaves, expiries, lost answers and a store that loses its queue.
//!
//! A ticket is its number *and* its mark: after the store lost its queue
//! (and its counter), a later join can get the same number, and only the
//! mark tells that join's ticket from the lost one.

use std::collections::BTreeMap;

/// A ticket as the store keeps it, under its number.
pub trait QueuedTicket<T> {
    /// The mark of the join that made it.
    fn mark(&self) -> u64;
    /// When it ends unless refreshed, on the store's clock.
    fn expires_at(&self) -> T;
}

/// Where a ticket stands, by the numbers alone (see [`standing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Standing {
    /// No live ticket is ahead.
    First,
    /// The live ticket of this number is just ahead.
    Behind(u64),
    /// The ticket is not in the queue (expired, removed, or its number
    /// given to another join).
    Gone,
}

/// Whether a kept ticket is still live at `now`: a ticket ends at its
/// expiry, not after it.
pub fn is_live<T: Ord, W: QueuedTicket<T>>(ticket: &W, now: T) -> bool {
    ticket.expires_at() > now
}

/// Whether the ticket kept under `seq` is the one the join marked `mark`
/// made: the number alone may have been given again.
pub fn is_own<T, W: QueuedTicket<T>>(queue: &BTreeMap<u64, W>, seq: u64, mark: u64) -> bool {
    queue.get(&seq).is_some_and(|w| w.mark() == mark)
}

/// A join's answer when the queue already holds a live ticket of its mark
/// (the same join retried after its answer was lost): that ticket's number,
/// renewed rather than doubled.
pub fn rejoin_of<T: Ord + Copy, W: QueuedTicket<T>>(
    queue: &BTreeMap<u64, W>,
    mark: u64,
    now: T,
) -> Option<u64> {
    queue
        .iter()
        .find(|(_, w)| w.mark() == mark && is_live(*w, now))
        .map(|(seq, _)| *seq)
}

/// Where the ticket (`seq`, `mark`) stands in a queue whose expired tickets
/// were dropped first (so no waiter waits on a dead ticket): gone unless it
/// is its own, first with nothing ahead, else behind the nearest ticket.
pub fn standing<T, W: QueuedTicket<T>>(queue: &BTreeMap<u64, W>, seq: u64, mark: u64) -> Standing {
    if !is_own(queue, seq, mark) {
        return Standing::Gone;
    }
    match queue.range(..seq).next_back() {
        None => Standing::First,
        Some((ahead, _)) => Standing::Behind(*ahead),
    }
}

/// Whether a refresh of (`seq`, `mark`) at `now` renews a ticket: only its
/// own, and only while live (a ticket that ended stays ended; its waiter
/// joins again at the end of the line).
pub fn refreshable<T: Ord, W: QueuedTicket<T>>(
    queue: &BTreeMap<u64, W>,
    seq: u64,
    mark: u64,
    now: T,
) -> bool {
    queue
        .get(&seq)
        .is_some_and(|w| w.mark() == mark && is_live(w, now))
}

#[cfg(test)]
mod tests {
    use super::*;

    impl QueuedTicket<u32> for (u64, u32) {
        fn mark(&self) -> u64 {
            self.0
        }
        fn expires_at(&self) -> u32 {
            self.1
        }
    }

    #[test]
    fn a_number_given_again_is_not_the_old_ticket() {
        let queue: BTreeMap<u64, (u64, u32)> = [(1, (7, 10)), (2, (8, 10))].into();
        assert_eq!(standing(&queue, 1, 7), Standing::First);
        assert_eq!(standing(&queue, 2, 8), Standing::Behind(1));
        assert_eq!(standing(&queue, 2, 9), Standing::Gone);
        assert!(!refreshable(&queue, 1, 8, 0));
        assert!(refreshable(&queue, 1, 7, 9));
        assert!(!refreshable(&queue, 1, 7, 10));
        assert_eq!(rejoin_of(&queue, 8, 3), Some(2));
        assert_eq!(rejoin_of(&queue, 8, 10), None);
    }
}

//! The leases a provider acquired and still holds, for one-round-trip extend
//! and release.
//!
//! ZooKeeper's multi can check a node's version but not its data, so a single
//! multi cannot compare the owner and token the way the other backends'
//! statements do. What it can check is the key node's version (the epoch):
//! every acquire bumps it in the same multi that creates the holder node. So
//! when this provider itself issued the lease (same key, owner, token and
//! epoch) on the session it still talks through, and the lease is still valid
//! by our clock (conservative against the server's expiry), an unchanged epoch
//! proves that nobody acquired the key since its node was made. Epochs start
//! again when a purge deletes the key node, so the multi also checks the
//! owner's marker node, made with the holder node and deleted before it by a
//! purge: with both, the holder node is ours. Extend is one multi (check
//! epoch + check marker + set data) and release one multi (check epoch +
//! delete marker + delete holder). Anything else (a lease rebuilt from its
//! parts, one from another provider or namespace, one past its validity, a
//! new session) takes the path that reads the holder node and checks owner,
//! token, session and the server's clock first.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use lease_api::backend::OwnerId;
use lease_api::{FencingToken, Lease, LeaseKey};
use tokio::time::Instant;

struct Entry {
    key: LeaseKey,
    token: FencingToken,
    epoch: i32,
    session: i64,
    valid_until: Instant,
}

#[derive(Default)]
pub(crate) struct Issued {
    leases: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    by_owner: HashMap<OwnerId, Entry>,
    /// Entries past their validity are dropped when the table grows past this.
    prune_at: usize,
}

const MIN_PRUNE_AT: usize = 1024;

impl Issued {
    fn table(&self) -> MutexGuard<'_, Table> {
        // Nothing in a critical section can panic halfway; a poisoned lock
        // still holds a consistent table.
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a lease this provider just acquired on `session` at `epoch`.
    pub(crate) fn record(&self, lease: &Lease, epoch: i32, session: i64) {
        let mut t = self.table();
        if t.by_owner.len() >= t.prune_at.max(MIN_PRUNE_AT) {
            let now = Instant::now();
            t.by_owner.retain(|_, e| e.valid_until > now);
            t.prune_at = (t.by_owner.len() * 2).max(MIN_PRUNE_AT);
        }
        t.by_owner.insert(
            lease.owner(),
            Entry {
                key: lease.key().clone(),
                token: lease.token(),
                epoch,
                session,
                valid_until: lease.valid_until(),
            },
        );
    }

    /// Whether `lease` may be extended or released in one multi through the
    /// session `session` (see the module docs).
    pub(crate) fn fast_path(&self, lease: &Lease, epoch: i32, session: i64) -> bool {
        let now = Instant::now();
        self.table().by_owner.get(&lease.owner()).is_some_and(|e| {
            e.key == *lease.key()
                && e.token == lease.token()
                && e.epoch == epoch
                && e.session == session
                && now < e.valid_until.min(lease.valid_until())
        })
    }

    /// The lease was extended: valid until its new local validity.
    pub(crate) fn renewed(&self, lease: &Lease) {
        if let Some(e) = self.table().by_owner.get_mut(&lease.owner())
            && e.token == lease.token()
        {
            e.valid_until = lease.valid_until();
        }
    }

    /// The lease was released or lost: no fast path for it any more.
    /// Returns whether it was one this provider issued (same owner and
    /// token), rather than a lease rebuilt with another token.
    pub(crate) fn forget(&self, lease: &Lease) -> bool {
        let mut t = self.table();
        let ours = t
            .by_owner
            .get(&lease.owner())
            .is_some_and(|e| e.token == lease.token());
        if ours {
            t.by_owner.remove(&lease.owner());
        }
        ours
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table().by_owner.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn lease(key: &str, token: u64, ttl: Duration) -> Lease {
        Lease::new(
            LeaseKey::new(key).unwrap(),
            FencingToken(token),
            OwnerId::random(),
            ttl,
            Instant::now(),
        )
    }

    #[test]
    fn only_the_recorded_lease_on_its_session_and_epoch_takes_the_fast_path() {
        let issued = Issued::default();
        let l = lease("k", 7, Duration::from_secs(30));
        issued.record(&l, 3, 42);
        assert!(issued.fast_path(&l, 3, 42));
        assert!(!issued.fast_path(&l, 4, 42), "another epoch");
        assert!(!issued.fast_path(&l, 3, 43), "another session");
        let forged = Lease::new(
            l.key().clone(),
            l.token(),
            OwnerId::random(),
            l.ttl(),
            Instant::now(),
        );
        assert!(!issued.fast_path(&forged, 3, 42), "another owner");
        let other_key = Lease::new(
            LeaseKey::new("j").unwrap(),
            l.token(),
            l.owner(),
            l.ttl(),
            Instant::now(),
        );
        assert!(!issued.fast_path(&other_key, 3, 42), "another key");
        let other_token = Lease::new(
            l.key().clone(),
            FencingToken(8),
            l.owner(),
            l.ttl(),
            Instant::now(),
        );
        assert!(!issued.fast_path(&other_token, 3, 42), "another token");
        issued.forget(&l);
        assert!(!issued.fast_path(&l, 3, 42), "released");
    }

    #[test]
    fn expired_leases_take_the_slow_path_and_are_pruned() {
        let issued = Issued::default();
        let short = lease("short", 1, Duration::from_millis(5));
        issued.record(&short, 1, 1);
        std::thread::sleep(Duration::from_millis(20));
        assert!(!issued.fast_path(&short, 1, 1), "past its validity");
        for i in 0..MIN_PRUNE_AT as u64 + 10 {
            issued.record(&lease("many", i, Duration::from_millis(1)), 1, 1);
        }
        std::thread::sleep(Duration::from_millis(10));
        issued.record(&lease("last", 1, Duration::from_secs(30)), 1, 1);
        assert!(issued.len() <= MIN_PRUNE_AT + 11);
        for i in 0..MIN_PRUNE_AT as u64 {
            issued.record(&lease("more", i, Duration::from_secs(30)), 1, 1);
        }
        assert!(issued.len() < 2 * MIN_PRUNE_AT + 20, "{}", issued.len());
    }
}

//! `Topology`: what every replicated store on loopback offers the tests.

use std::time::{Duration, Instant};

use super::netsplit::Netsplit;
use crate::OwnedProcess;

/// What every topology offers the tests.
pub trait Topology: Send + Sync {
    /// The members, in a fixed order.
    fn members(&self) -> &[OwnedProcess];
    /// The members, to stop, kill, freeze, thaw or restart one.
    fn members_mut(&mut self) -> &mut [OwnedProcess];
    /// The index of the member that leads now, if the store has a leader
    /// and one is elected.
    fn leader(&self) -> Option<usize>;
    /// `Ok` when the running members serve as a whole (a quorum, a leader);
    /// else which member failed which check, and what it answered.
    ///
    /// # Errors
    /// The first check that failed.
    fn health(&self) -> Result<(), String>;
    /// True when [`health`](Self::health) is `Ok`.
    fn healthy(&self) -> bool {
        self.health().is_ok()
    }
    /// False for a store without a leader (Redlock's independent nodes).
    fn has_leader(&self) -> bool {
        true
    }

    /// kill -9 of member `i`, everything it runs included (a member whose
    /// server runs in a session of its own overrides this).
    fn kill_member(&mut self, i: usize) {
        self.members_mut()[i].kill();
    }

    /// SIGSTOP of member `i`, everything it runs included.
    fn freeze_member(&self, i: usize) {
        self.members()[i].freeze();
    }

    /// SIGCONT of a frozen member `i`.
    fn thaw_member(&self, i: usize) {
        self.members()[i].thaw();
    }

    /// The packet filter's cuts between the members, for a topology started
    /// splittable (each member under a uid of its own); the isolation
    /// hooks below use them.
    fn netsplit(&self) -> Option<&Netsplit> {
        None
    }

    /// True when [`isolate_member`](Self::isolate_member) cuts something:
    /// the topology's members reach each other through links it owns, or
    /// it was started splittable.
    fn can_isolate(&self) -> bool {
        self.netsplit().is_some()
    }

    /// Cuts member `i` off from the other members (and from a coordination
    /// store they share) while its clients still reach it: the split-brain
    /// case. Nothing when [`can_isolate`](Self::can_isolate) is false.
    fn isolate_member(&self, i: usize) {
        if let Some(s) = self.netsplit() {
            s.isolate(i);
        }
    }

    /// Heals what [`isolate_member`](Self::isolate_member) cut.
    fn rejoin_member(&self, i: usize) {
        if let Some(s) = self.netsplit() {
            s.rejoin(i);
        }
    }

    /// Whether the members other than `i` serve without it: another member
    /// leads, or, for a store without a leader, the others form a cluster
    /// of their own. Asked as an isolation of `i` ends, to show it lasted
    /// until the others acted.
    fn serves_without(&self, i: usize) -> bool {
        self.leader().is_some_and(|l| l != i)
    }
    /// How long an isolation must last for the others to act on it (elect
    /// another leader); zero when any length shows the case.
    fn isolation_hold(&self) -> Duration {
        Duration::ZERO
    }

    /// Waits until [`healthy`](Self::healthy).
    ///
    /// # Panics
    /// When it is not healthy within `limit`; the message shows the members' logs.
    fn wait_healthy(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while let Err(why) = self.health() {
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .members()
                    .iter()
                    .map(|m| format!("--- {} ---\n{}", m.name(), m.log_tail()))
                    .collect();
                panic!(
                    "the cluster is not healthy after {limit:?}: {why}\n{}",
                    logs.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until a member leads and returns it.
    ///
    /// # Panics
    /// When no member leads within `limit`.
    fn wait_leader(&self, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(l) = self.leader() {
                return l;
            }
            assert!(
                Instant::now() < deadline,
                "no leader elected within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

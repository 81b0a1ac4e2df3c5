//! `PostgresHa`: a PostgreSQL primary and a hot standby streaming from it.

use std::time::{Duration, Instant};

use super::members::{loopback_hosts, member_dir, psql};
use super::topology::Topology;
use crate::OwnedProcess;

/// A PostgreSQL primary and a hot standby streaming from it. PostgreSQL has
/// no failover agent of its own (production uses Patroni, repmgr or a
/// managed service): a test kills the primary and [`promote`](Self::promote)s
/// the standby, as the agent would.
#[derive(Debug)]
pub struct PostgresHa {
    members: Vec<OwnedProcess>,
    synchronous: bool,
}

impl PostgresHa {
    /// Starts a primary and one standby; with `synchronous`, every commit on
    /// the primary waits until the standby flushed it.
    ///
    /// # Panics
    /// When a server or the base backup fails, or the standby does not
    /// stream within 60 s.
    pub fn start(synchronous: bool) -> Self {
        let primary = crate::postgres::postgres_primary(synchronous);
        let standby = crate::postgres::postgres_standby(primary.port(), member_dir("pg-standby"));
        let ha = PostgresHa {
            members: vec![primary, standby],
            synchronous,
        };
        ha.wait_healthy(Duration::from_secs(60));
        ha
    }

    /// Whether commits wait for the standby.
    pub fn synchronous(&self) -> bool {
        self.synchronous
    }

    /// `postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/postgres`: every member.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@{}/postgres",
            loopback_hosts(&self.members)
        )
    }

    /// Promotes member `i` (a standby) to primary and waits until it is one.
    ///
    /// # Panics
    /// When it is not promoted within 60 s.
    pub fn promote(&self, i: usize) {
        let done = psql(self.members[i].port(), "SELECT pg_promote(true, 60)");
        assert_eq!(done.as_deref(), Some("t"), "promoting member {i} failed");
    }

    /// Freezes (SIGSTOP) every standby and then ends the primary's WAL
    /// senders, so nothing the primary commits from now on reaches a
    /// standby, not even through the kernel's socket buffers, which a frozen
    /// standby would still read once thawed. Returns the primary's index.
    /// Thaw the standbys with [`OwnedProcess::thaw`].
    ///
    /// # Panics
    /// When there is no primary, or it does not end its WAL senders.
    pub fn cut_replication(&self) -> usize {
        let primary = self.wait_leader(Duration::from_secs(10));
        for (i, m) in self.members.iter().enumerate() {
            if i != primary {
                m.freeze();
            }
        }
        let ended = psql(
            self.members[primary].port(),
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_replication",
        );
        assert!(
            ended.is_some_and(|n| n != "0"),
            "the primary did not end its WAL senders"
        );
        primary
    }

    /// Waits until every standby has replayed everything the primary wrote
    /// so far (its replay position reaches the primary's current WAL
    /// position).
    ///
    /// # Panics
    /// When they have not within `limit`.
    pub fn wait_replayed(&self, limit: Duration) {
        let primary = self.wait_leader(Duration::from_secs(10));
        let port = self.members[primary].port();
        let Some(target) = psql(port, "SELECT pg_current_wal_lsn()") else {
            panic!("the primary does not answer");
        };
        let deadline = Instant::now() + limit;
        loop {
            let behind = psql(
                port,
                &format!(
                    "SELECT count(*) FROM pg_stat_replication WHERE replay_lsn IS NULL OR replay_lsn < '{target}'"
                ),
            );
            if behind.as_deref() == Some("0") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the standbys did not replay {target} within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether member `i` runs and is a primary (not in recovery).
    fn is_primary(&self, i: usize) -> bool {
        self.members[i].is_running()
            && psql(self.members[i].port(), "SELECT pg_is_in_recovery()").as_deref() == Some("f")
    }
}

impl Topology for PostgresHa {
    fn members(&self) -> &[OwnedProcess] {
        &self.members
    }
    fn members_mut(&mut self) -> &mut [OwnedProcess] {
        &mut self.members
    }
    fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| self.is_primary(i))
    }
    /// One primary, every other running member a standby whose WAL
    /// receiver streams (`pg_stat_wal_receiver`), and the primary counting
    /// each of them as a streaming sender.
    fn health(&self) -> Result<(), String> {
        let Some(primary) = self.leader() else {
            return Err("no running member answers pg_is_in_recovery() = f".into());
        };
        let standbys: Vec<u16> = self
            .members
            .iter()
            .enumerate()
            .filter(|(i, m)| *i != primary && m.is_running())
            .map(|(_, m)| m.port())
            .collect();
        for &port in &standbys {
            let status = psql(port, "SELECT status FROM pg_stat_wal_receiver");
            if status.as_deref() != Some("streaming") {
                return Err(format!(
                    "the standby on {port}: pg_stat_wal_receiver status {status:?}"
                ));
            }
        }
        let streaming = psql(
            self.members[primary].port(),
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
        )
        .and_then(|n| n.parse::<usize>().ok());
        if streaming == Some(standbys.len()) {
            Ok(())
        } else {
            Err(format!(
                "the primary counts {streaming:?} streaming senders, not {}",
                standbys.len()
            ))
        }
    }
}

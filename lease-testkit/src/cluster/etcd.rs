//! `EtcdCluster`: an etcd cluster of N voting members.

use std::process::Command;
use std::time::Duration;

use super::members::{member_dir, output};
use super::netsplit::Netsplit;
use super::topology::Topology;
use crate::{OwnedProcess, free_port};

/// An etcd cluster of N voting members.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<OwnedProcess>,
    /// The cuts between members, for a cluster started splittable.
    split: Option<Netsplit>,
}

impl EtcdCluster {
    /// Starts `n` members (default heartbeat and election timeouts: 100 ms
    /// and 1 s) and waits until the cluster is healthy.
    ///
    /// # Panics
    /// When a member cannot start or the cluster does not form in 60 s.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, false)
    }

    /// As [`start`](Self::start), each member running as a uid of its own,
    /// so that [`isolate_member`](Topology::isolate_member) can cut it off
    /// from the others in the packet filter (both ways, its raft streams
    /// and pipelines alike) while clients still reach it.
    ///
    /// # Panics
    /// As [`start`](Self::start), and when the packet filter cannot be
    /// used (not root, no `nft`).
    pub fn start_splittable(n: usize) -> Self {
        Self::start_with(n, true)
    }

    fn start_with(n: usize, splittable: bool) -> Self {
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let split = splittable.then(|| {
            Netsplit::new(ports.iter().map(|(c, p)| vec![*c, *p]).collect())
                .unwrap_or_else(|why| panic!("a splittable etcd cluster: {why}"))
        });
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let token = crate::unique("lease-etcd-cluster");
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, (client, peer))| {
                let dir = member_dir("etcd-member");
                let client_url = format!("http://127.0.0.1:{client}");
                let peer_url = format!("http://127.0.0.1:{peer}");
                let args = [
                    "--name",
                    &format!("m{i}"),
                    "--data-dir",
                    &dir.path().join("data").display().to_string(),
                    "--listen-client-urls",
                    &client_url,
                    "--advertise-client-urls",
                    &client_url,
                    "--listen-peer-urls",
                    &peer_url,
                    "--initial-advertise-peer-urls",
                    &peer_url,
                    "--initial-cluster",
                    &initial,
                    "--initial-cluster-state",
                    "new",
                    "--initial-cluster-token",
                    &token,
                    "--log-level",
                    "warn",
                ]
                .iter()
                .map(|a| (*a).to_owned())
                .collect();
                let run_as = split.as_ref().map(|s| {
                    s.own(i, dir.path());
                    s.run_as(i)
                });
                OwnedProcess::spawn_as(&format!("etcd-m{i}"), "etcd", args, *client, dir, run_as)
            })
            .collect();
        let c = EtcdCluster { members, split };
        c.wait_healthy(Duration::from_secs(60));
        c
    }

    /// The client endpoints (`http://127.0.0.1:PORT`), one per member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.port()))
            .collect()
    }

    /// `etcdctl endpoint status` of one member: (is leader, raft term).
    fn status(&self, i: usize) -> Option<(bool, u64)> {
        let m = self.members.get(i)?;
        if !m.is_running() {
            return None;
        }
        let out = output(
            Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .arg(format!("--endpoints=http://127.0.0.1:{}", m.port()))
                .args(["--command-timeout=1s", "endpoint", "status", "-w", "simple"]),
        )?;
        // endpoint, ID, version, db size, is leader, is learner, raft term, ...
        let fields: Vec<&str> = out.trim().split(", ").collect();
        Some((fields.get(4)? == &"true", fields.get(6)?.parse().ok()?))
    }
}

impl Topology for EtcdCluster {
    fn members(&self) -> &[OwnedProcess] {
        &self.members
    }
    fn members_mut(&mut self) -> &mut [OwnedProcess] {
        &mut self.members
    }
    fn leader(&self) -> Option<usize> {
        // A member thawed after a pause may still think it leads: the one
        // with the highest raft term does.
        (0..self.members.len())
            .filter_map(|i| match self.status(i) {
                Some((true, term)) => Some((term, i)),
                _ => None,
            })
            .max()
            .map(|(_, i)| i)
    }
    fn netsplit(&self) -> Option<&Netsplit> {
        self.split.as_ref()
    }
    /// A leader cut off steps down after one election timeout (1 s; etcd
    /// checks its quorum), and the others elect one within about two more.
    fn isolation_hold(&self) -> Duration {
        Duration::from_secs(3)
    }
    /// A leader, and every running member answers a linearizable read
    /// (which goes through the leader and needs a quorum).
    fn health(&self) -> Result<(), String> {
        if self.leader().is_none() {
            return Err("no member reports itself leader (etcdctl endpoint status)".into());
        }
        for m in self.members.iter().filter(|m| m.is_running()) {
            crate::Readiness::Etcd { tls: None }
                .check(m.port(), m.dir.path())
                .map_err(|e| format!("{}: linearizable read failed: {e}", m.name()))?;
        }
        Ok(())
    }
}

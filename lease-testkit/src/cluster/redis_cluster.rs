//! `RedisCluster`: a Redis Cluster of N primaries with R replicas each.

use std::process::Command;
use std::time::Duration;

use super::members::{loopback_hosts, member_dir, redis_cli};
use super::netsplit::Netsplit;
use super::topology::Topology;
use crate::OwnedProcess;

/// A Redis Cluster of N primaries, each with R replicas, every node with
/// AOF and `appendfsync always`, `cluster-node-timeout` 1 s.
#[derive(Debug)]
pub struct RedisCluster {
    members: Vec<OwnedProcess>,
    /// The cuts between nodes, for a cluster started splittable.
    split: Option<Netsplit>,
}

/// The `cluster-node-timeout` of [`RedisCluster`].
pub const CLUSTER_NODE_TIMEOUT: Duration = Duration::from_millis(1000);

impl RedisCluster {
    /// Starts `primaries` primaries with `replicas` replicas each, forms the
    /// cluster with `redis-cli --cluster create`, and waits until every node
    /// says the cluster is ok.
    ///
    /// # Panics
    /// When a node cannot start or the cluster does not form in 60 s.
    pub fn start(primaries: usize, replicas: usize) -> Self {
        Self::start_with(primaries, replicas, false)
    }

    /// As [`start`](Self::start), each node running as a uid of its own,
    /// so that [`isolate_member`](Topology::isolate_member) can cut a node
    /// off from every other (its cluster bus and replication links, both
    /// ways) in the packet filter while clients still reach it.
    ///
    /// # Panics
    /// As [`start`](Self::start), and when the packet filter cannot be
    /// used (not root, no `nft`).
    pub fn start_splittable(primaries: usize, replicas: usize) -> Self {
        Self::start_with(primaries, replicas, true)
    }

    fn start_with(primaries: usize, replicas: usize, splittable: bool) -> Self {
        let timeout = CLUSTER_NODE_TIMEOUT.as_millis().to_string();
        // A node also listens on its cluster bus port, port + 10000.
        let ports: Vec<u16> = (0..primaries * (1 + replicas))
            .map(|_| crate::free_port_and(10000))
            .collect();
        let split = splittable.then(|| {
            Netsplit::new(ports.iter().map(|p| vec![*p, *p + 10000]).collect())
                .unwrap_or_else(|why| panic!("a splittable Redis Cluster: {why}"))
        });
        let members: Vec<OwnedProcess> = ports
            .iter()
            .enumerate()
            .map(|(i, &port)| {
                let dir = member_dir("redis-cluster");
                let run_as = split.as_ref().map(|s| {
                    s.own(i, dir.path());
                    s.run_as(i)
                });
                crate::redis::redis_on(
                    port,
                    dir,
                    true,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        &timeout,
                    ],
                    run_as,
                )
            })
            .collect();
        let addrs = loopback_hosts(&members);
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(addrs.split(','))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        let c = RedisCluster { members, split };
        c.wait_healthy(Duration::from_secs(60));
        c
    }

    /// `redis+cluster://127.0.0.1:P1,...`: every node as a seed.
    pub fn url(&self) -> String {
        format!("redis+cluster://{}", loopback_hosts(&self.members))
    }

    /// The running node that serves `redis_key`'s slot as primary now: it
    /// says so, and its cluster is `ok` in its view (a primary cut off
    /// from the majority still claims the slot, but its state is `fail`).
    pub fn primary_of(&self, redis_key: &str) -> Option<usize> {
        let any = self.members.iter().find(|m| m.is_running())?;
        let slot: u16 = redis_cli(any.port(), &["CLUSTER", "KEYSLOT", redis_key])?
            .first()?
            .trim()
            .parse()
            .ok()?;
        (0..self.members.len()).find(|&i| {
            let m = &self.members[i];
            m.is_running()
                && redis_cli(m.port(), &["ROLE"])
                    .is_some_and(|r| r.first().map(String::as_str) == Some("master"))
                && redis_cli(m.port(), &["CLUSTER", "INFO"])
                    .is_some_and(|info| info.iter().any(|l| l.trim() == "cluster_state:ok"))
                && redis_cli(m.port(), &["CLUSTER", "NODES"]).is_some_and(|lines| {
                    lines.iter().any(|l| {
                        let f: Vec<&str> = l.split_whitespace().collect();
                        f.get(2).is_some_and(|flags| flags.contains("myself"))
                            && f.iter().skip(8).any(|range| slot_in(range, slot))
                    })
                })
        })
    }
}

/// Whether `range` (`N` or `A-B` from CLUSTER NODES) holds `slot`.
fn slot_in(range: &str, slot: u16) -> bool {
    match range.split_once('-') {
        Some((a, b)) => match (a.parse::<u16>(), b.parse::<u16>()) {
            (Ok(a), Ok(b)) => (a..=b).contains(&slot),
            _ => false,
        },
        None => range.parse::<u16>() == Ok(slot),
    }
}

impl Topology for RedisCluster {
    fn members(&self) -> &[OwnedProcess] {
        &self.members
    }
    fn members_mut(&mut self) -> &mut [OwnedProcess] {
        &mut self.members
    }
    /// The primary of slot 0's shard, a stand-in for "the leader": a
    /// cluster has one per shard. Tests that lose the primary of a given
    /// key use [`RedisCluster::primary_of`].
    fn leader(&self) -> Option<usize> {
        self.primary_of("{0}")
    }
    fn netsplit(&self) -> Option<&Netsplit> {
        self.split.as_ref()
    }
    /// The other primaries mark a node they cannot reach as failed after
    /// `cluster-node-timeout` (1 s), and its replica is elected within a
    /// few seconds more; the cut-off primary stops taking writes.
    fn isolation_hold(&self) -> Duration {
        Duration::from_secs(6)
    }
    /// Every running node says `cluster_state:ok`, and every running
    /// replica's link to its primary is up.
    fn health(&self) -> Result<(), String> {
        for m in self.members.iter().filter(|m| m.is_running()) {
            let info = redis_cli(m.port(), &["CLUSTER", "INFO"]);
            if !info
                .as_ref()
                .is_some_and(|info| info.iter().any(|l| l.trim() == "cluster_state:ok"))
            {
                let state =
                    info.and_then(|i| i.into_iter().find(|l| l.starts_with("cluster_state")));
                return Err(format!(
                    "{} port {}: CLUSTER INFO shows {state:?}",
                    m.name(),
                    m.port()
                ));
            }
            let linked = redis_cli(m.port(), &["INFO", "replication"]).is_some_and(|info| {
                info.iter().any(|l| l.trim() == "role:master")
                    || info.iter().any(|l| l.trim() == "master_link_status:up")
            });
            if !linked {
                return Err(format!(
                    "{} port {}: a replica whose master_link_status is not up",
                    m.name(),
                    m.port()
                ));
            }
        }
        Ok(())
    }
}

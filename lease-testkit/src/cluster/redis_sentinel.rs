//! `RedisSentinel`: a Redis primary with replicas, watched by Sentinels.

use std::time::{Duration, Instant};

use super::members::{loopback_hosts, member_dir, redis_cli};
use super::netsplit::Netsplit;
use super::topology::Topology;
use crate::{OwnedProcess, free_port};

/// A Redis primary with replicas, watched by Sentinels (quorum: a majority of
/// them). Every data node keeps AOF with `appendfsync always`. The
/// [`members`](Topology::members) are the data nodes, which a test kills or
/// freezes; the Sentinels are kept apart and stay up.
#[derive(Debug)]
pub struct RedisSentinel {
    members: Vec<OwnedProcess>,
    sentinels: Vec<OwnedProcess>,
    /// The cuts between processes, for a topology started splittable: the
    /// data nodes first, then the Sentinels.
    split: Option<Netsplit>,
}

/// The master name the Sentinels of [`RedisSentinel`] monitor.
pub const SENTINEL_MASTER: &str = "lease";

/// How long the Sentinels of [`RedisSentinel`] wait before they call an
/// unanswering primary down (`down-after-milliseconds`).
pub const SENTINEL_DOWN_AFTER: Duration = Duration::from_millis(1000);

impl RedisSentinel {
    /// Starts a primary, `replicas` replicas and `sentinels` Sentinels
    /// (down-after 1 s, failover-timeout 5 s), and waits until every replica
    /// is in sync and every Sentinel knows the others and the replicas.
    ///
    /// # Panics
    /// When a process cannot start or the topology is not healthy in 60 s.
    pub fn start(replicas: usize, sentinels: usize) -> Self {
        Self::start_with(replicas, sentinels, false)
    }

    /// As [`start`](Self::start), every data node and Sentinel running as
    /// a uid of its own, so that [`isolate_member`](Topology::isolate_member)
    /// can cut a data node off from the other data nodes and from the
    /// Sentinels in the packet filter, both ways, while clients still reach
    /// it at the address the Sentinels handed out.
    ///
    /// # Panics
    /// As [`start`](Self::start), and when the packet filter cannot be
    /// used (not root, no `nft`).
    pub fn start_splittable(replicas: usize, sentinels: usize) -> Self {
        Self::start_with(replicas, sentinels, true)
    }

    fn start_with(replicas: usize, sentinels: usize, splittable: bool) -> Self {
        let data_ports: Vec<u16> = (0..=replicas).map(|_| free_port()).collect();
        let sentinel_ports: Vec<u16> = (0..sentinels).map(|_| free_port()).collect();
        let split = splittable.then(|| {
            Netsplit::new(
                data_ports
                    .iter()
                    .chain(&sentinel_ports)
                    .map(|p| vec![*p])
                    .collect(),
            )
            .unwrap_or_else(|why| panic!("a splittable Sentinel topology: {why}"))
        });
        // Process `i` of the split (data nodes, then Sentinels): its uid,
        // and `dir` handed to it.
        let run_as = |i: usize, dir: &crate::TempDir| {
            split.as_ref().map(|s| {
                s.own(i, dir.path());
                s.run_as(i)
            })
        };
        let primary_port = data_ports[0].to_string();
        let mut members = Vec::new();
        for (i, port) in data_ports.iter().enumerate() {
            let dir = member_dir(if i == 0 {
                "redis-primary"
            } else {
                "redis-replica"
            });
            let owner = run_as(i, &dir);
            let extra: &[&str] = if i == 0 {
                &[]
            } else {
                &["--replicaof", "127.0.0.1", &primary_port]
            };
            members.push(crate::redis::redis_on(*port, dir, true, extra, owner));
        }
        let quorum = sentinels / 2 + 1;
        let sentinels = sentinel_ports
            .iter()
            .enumerate()
            .map(|(i, &port)| {
                let dir = member_dir("redis-sentinel");
                let cfg = dir.path().join("sentinel.conf");
                std::fs::write(
                    &cfg,
                    format!(
                        "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                         sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {primary_port} {quorum}\n\
                         sentinel down-after-milliseconds {SENTINEL_MASTER} {down_after}\n\
                         sentinel failover-timeout {SENTINEL_MASTER} 5000\n\
                         sentinel parallel-syncs {SENTINEL_MASTER} 2\n",
                        dir = dir.path().display(),
                        down_after = SENTINEL_DOWN_AFTER.as_millis(),
                    ),
                )
                .expect("write sentinel.conf");
                let owner = run_as(data_ports.len() + i, &dir);
                OwnedProcess::start_as(
                    &format!("sentinel-{i}"),
                    "redis-server",
                    vec![cfg.display().to_string(), "--sentinel".into()],
                    port,
                    dir,
                    crate::Readiness::RedisPing,
                    owner,
                )
            })
            .collect();
        let s = RedisSentinel {
            members,
            sentinels,
            split,
        };
        s.wait_healthy(Duration::from_secs(60));
        s
    }

    /// `redis+sentinel://127.0.0.1:P1,.../lease`, the provider's URL.
    pub fn url(&self) -> String {
        format!(
            "redis+sentinel://{}/{SENTINEL_MASTER}",
            loopback_hosts(&self.sentinels)
        )
    }

    /// Waits until every replica has acknowledged the primary's whole
    /// replication stream (its offset equals the primary's).
    ///
    /// # Panics
    /// When they have not within `limit`.
    pub fn wait_replicated(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let caught_up = self.leader().and_then(|p| {
                let info = redis_cli(self.members[p].port(), &["INFO", "replication"])?;
                let field = |k: &str| {
                    info.iter()
                        .find_map(|l| l.trim().strip_prefix(k).map(str::to_owned))
                };
                let offset = field("master_repl_offset:")?;
                let replicas: usize = field("connected_slaves:")?.parse().ok()?;
                let synced = info
                    .iter()
                    .filter(|l| l.starts_with("slave") && l.contains(&format!("offset={offset},")))
                    .count();
                Some(replicas > 0 && synced == replicas)
            });
            if caught_up == Some(true) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the replicas did not catch up within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Freezes every replica (SIGSTOP) and then closes the primary's
    /// replication connections, so nothing the primary writes from now on
    /// reaches a replica, not even through the kernel's socket buffers,
    /// which a frozen replica would still read once thawed. Returns the
    /// primary's index. Thaw the replicas with [`OwnedProcess::thaw`].
    ///
    /// # Panics
    /// When there is no primary, or it does not close the connections.
    pub fn cut_replication(&self) -> usize {
        let primary = self.wait_leader(Duration::from_secs(10));
        for (i, m) in self.members.iter().enumerate() {
            if i != primary {
                m.freeze();
            }
        }
        let killed = redis_cli(
            self.members[primary].port(),
            &["CLIENT", "KILL", "TYPE", "replica"],
        );
        assert!(
            killed.is_some(),
            "the primary did not close its replication connections"
        );
        primary
    }

    /// The Sentinels.
    pub fn sentinels(&self) -> &[OwnedProcess] {
        &self.sentinels
    }

    /// How many failovers the Sentinels have carried out since the start:
    /// the highest `config-epoch` any of them reports for the master (each
    /// failover's leader bumps it, and it never goes down).
    pub fn failovers(&self) -> u64 {
        (0..self.sentinels.len())
            .filter_map(|i| self.sentinel_view(i))
            .filter_map(|view| {
                view.into_iter()
                    .find(|(k, _)| k == "config-epoch")
                    .and_then(|(_, v)| v.parse::<u64>().ok())
            })
            .max()
            .unwrap_or(0)
    }

    /// The port the Sentinels name as the primary, by majority.
    fn named_primary(&self) -> Option<u16> {
        let mut votes: Vec<u16> = self
            .sentinels
            .iter()
            .filter(|s| s.is_running())
            .filter_map(|s| {
                let lines = redis_cli(
                    s.port(),
                    &["SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER],
                )?;
                lines.get(1)?.trim().parse().ok()
            })
            .collect();
        votes.sort_unstable();
        let majority = self.sentinels.len() / 2 + 1;
        votes
            .chunk_by(|a, b| a == b)
            .find(|run| run.len() >= majority)
            .map(|run| run[0])
    }

    /// The `SENTINEL master` fields one Sentinel reports.
    fn sentinel_view(&self, i: usize) -> Option<Vec<(String, String)>> {
        let lines = redis_cli(
            self.sentinels.get(i)?.port(),
            &["SENTINEL", "master", SENTINEL_MASTER],
        )?;
        Some(
            lines
                .chunks(2)
                .filter_map(|kv| match kv {
                    [k, v] => Some((k.clone(), v.clone())),
                    _ => None,
                })
                .collect(),
        )
    }
}

impl Topology for RedisSentinel {
    fn members(&self) -> &[OwnedProcess] {
        &self.members
    }
    fn members_mut(&mut self) -> &mut [OwnedProcess] {
        &mut self.members
    }
    fn netsplit(&self) -> Option<&Netsplit> {
        self.split.as_ref()
    }
    /// The Sentinels call an unanswering primary down after
    /// down-after-milliseconds (1 s), agree, and promote a replica within a
    /// few seconds more.
    fn isolation_hold(&self) -> Duration {
        Duration::from_secs(6)
    }
    /// The data node the Sentinels name as primary, when it runs and says
    /// it is one.
    fn leader(&self) -> Option<usize> {
        let port = self.named_primary()?;
        let i = self
            .members
            .iter()
            .position(|m| m.port() == port && m.is_running())?;
        let role = redis_cli(port, &["ROLE"])?;
        (role.first().map(String::as_str) == Some("master")).then_some(i)
    }
    /// A primary the Sentinels agree on, every other running data node
    /// replicating from it in sync, and every Sentinel seeing the primary
    /// up, the other Sentinels and the replicas.
    fn health(&self) -> Result<(), String> {
        let Some(primary) = self.leader() else {
            return Err(
                "no data node that a majority of Sentinels names answers ROLE master".into(),
            );
        };
        let primary_port = self.members[primary].port().to_string();
        let replicas = self
            .members
            .iter()
            .enumerate()
            .filter(|(i, m)| *i != primary && m.is_running())
            .count();
        if let Some((_, m)) = self
            .members
            .iter()
            .enumerate()
            .filter(|(i, m)| *i != primary && m.is_running())
            .find(|(_, m)| {
                !redis_cli(m.port(), &["INFO", "replication"]).is_some_and(|info| {
                    info.iter()
                        .any(|l| l.trim() == format!("master_port:{primary_port}"))
                        && info.iter().any(|l| l.trim() == "master_link_status:up")
                })
            })
        {
            return Err(format!(
                "{}: INFO replication lacks master_port:{primary_port} with master_link_status:up",
                m.name()
            ));
        }
        let sentinel_ok = |i: usize| {
            self.sentinel_view(i).is_some_and(|view| {
                let get = |k: &str| {
                    view.iter()
                        .find(|(key, _)| key == k)
                        .map(|(_, v)| v.trim().to_owned())
                };
                get("flags").as_deref() == Some("master")
                    && get("port").as_deref() == Some(primary_port.as_str())
                    && get("num-other-sentinels") == Some((self.sentinels.len() - 1).to_string())
                    && get("num-slaves")
                        .and_then(|n| n.parse::<usize>().ok())
                        .is_some_and(|n| n >= replicas)
            })
        };
        match (0..self.sentinels.len()).find(|&i| !sentinel_ok(i)) {
            Some(i) => Err(format!(
                "sentinel-{i}: SENTINEL master does not show {primary_port} up as master with \
                 {} other Sentinels and {replicas} replicas: {:?}",
                self.sentinels.len() - 1,
                self.sentinel_view(i)
            )),
            None => Ok(()),
        }
    }
}

//! Replicated stores on loopback, each member an [`OwnedProcess`] on its own
//! free ports with its own data directory: an etcd cluster, a ZooKeeper
//! ensemble, N independent Redis nodes for Redlock, a Redis primary with
//! replicas under Sentinel, and a PostgreSQL primary with a streaming standby. A test (or
//! `scripts/clusters`) starts one, and may stop, kill -9, freeze, thaw and
//! restart any member on its own data, and ask which member leads.
//!
//! Every member dies with the process that started it ([`crate::spawn_lasting`]),
//! so a suite may keep its cluster in a `static` for all its cases.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::{OwnedProcess, TempDir, free_port};

/// This process's directory for member data: `lease-cluster-<pid>` in the
/// temporary directory. A suite keeps its cluster in a `static`, which is
/// never dropped, so the first call also removes the directories of
/// processes that are gone.
fn member_dir(prefix: &str) -> TempDir {
    static ROOT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let root = ROOT.get_or_init(|| {
        let tmp = std::env::temp_dir();
        if let Ok(entries) = std::fs::read_dir(&tmp) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(pid) = name
                    .strip_prefix("lease-cluster-")
                    .and_then(|p| p.parse::<i32>().ok())
                else {
                    continue;
                };
                let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                    == Err(nix::errno::Errno::ESRCH);
                if gone {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let root = tmp.join(format!("lease-cluster-{}", std::process::id()));
        std::fs::create_dir_all(&root).expect("create the cluster data directory");
        root
    });
    TempDir::new_in(root, prefix)
}

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

/// `127.0.0.1:P1,127.0.0.1:P2,...`: the ports of `processes` on loopback.
fn loopback_hosts(processes: &[OwnedProcess]) -> String {
    processes
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs a command, returning its standard output when it succeeds.
fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// An etcd cluster of N voting members.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<OwnedProcess>,
}

impl EtcdCluster {
    /// Starts `n` members (default heartbeat and election timeouts: 100 ms
    /// and 1 s) and waits until the cluster is healthy.
    ///
    /// # Panics
    /// When a member cannot start or the cluster does not form in 60 s.
    pub fn start(n: usize) -> Self {
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
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
                OwnedProcess::spawn(&format!("etcd-m{i}"), "etcd", args, *client, dir)
            })
            .collect();
        let c = EtcdCluster { members };
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

/// A ZooKeeper ensemble of N servers.
#[derive(Debug)]
pub struct ZkEnsemble {
    members: Vec<OwnedProcess>,
}

impl ZkEnsemble {
    /// Starts `n` servers (tickTime 200 ms; sessions from 400 ms to 20 s) and
    /// waits until one leads and every other follows.
    ///
    /// # Panics
    /// When a server cannot start, or the ensemble does not form in 60 s on
    /// any of three tries. Each try takes new ports: the quorum and election
    /// ports are only reserved when a server binds them, and a process of a
    /// test running alongside can take one first.
    pub fn start(n: usize) -> Self {
        let limit = Duration::from_secs(60);
        for attempt in 1..=3 {
            let e = Self::launch(n);
            let deadline = Instant::now() + limit;
            while e.health().is_err() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if e.healthy() {
                return e;
            }
            if attempt < 3 {
                eprintln!(
                    "a ZooKeeper ensemble did not form in {limit:?} (try {attempt}); starting another on new ports"
                );
            } else {
                e.wait_healthy(Duration::ZERO);
            }
        }
        unreachable!("the last try returns or panics")
    }

    fn launch(n: usize) -> Self {
        let ports: Vec<(u16, u16, u16)> = (0..n)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let servers: String = ports
            .iter()
            .enumerate()
            .map(|(i, (_, quorum, election))| {
                format!("server.{}=127.0.0.1:{quorum}:{election}\n", i + 1)
            })
            .collect();
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, (client, _, _))| {
                let dir = member_dir("zk-member");
                let data = dir.path().join("data");
                std::fs::create_dir_all(&data).expect("create the ZooKeeper data directory");
                std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("write myid");
                let cfg = dir.path().join("zoo.cfg");
                std::fs::write(
                    &cfg,
                    format!(
                        "tickTime=200\ninitLimit=20\nsyncLimit=10\ndataDir={}\nclientPort={client}\n\
                         clientPortAddress=127.0.0.1\nminSessionTimeout=400\nmaxSessionTimeout=20000\n\
                         admin.enableServer=false\n4lw.commands.whitelist=srvr,ruok\n{servers}",
                        data.display()
                    ),
                )
                .expect("write zoo.cfg");
                OwnedProcess::spawn(
                    &format!("zk-{}", i + 1),
                    crate::env::zk_server(),
                    vec!["start-foreground".into(), cfg.display().to_string()],
                    *client,
                    dir,
                )
            })
            .collect();
        ZkEnsemble { members }
    }

    /// The connect string: `127.0.0.1:P1,127.0.0.1:P2,...`.
    pub fn connect_string(&self) -> String {
        loopback_hosts(&self.members)
    }

    /// The `Mode:` line of one server's `srvr` answer (`leader`, `follower`).
    fn mode(&self, i: usize) -> Option<String> {
        use std::io::{Read, Write};
        let m = self.members.get(i)?;
        if !m.is_running() {
            return None;
        }
        let mut s = std::net::TcpStream::connect(("127.0.0.1", m.port())).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(b"srvr").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        out.lines()
            .find_map(|l| l.strip_prefix("Mode: ").map(|m| m.trim().to_owned()))
    }
}

impl Topology for ZkEnsemble {
    fn members(&self) -> &[OwnedProcess] {
        &self.members
    }
    fn members_mut(&mut self) -> &mut [OwnedProcess] {
        &mut self.members
    }
    fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| self.mode(i).as_deref() == Some("leader"))
    }
    /// One server leads and every other running one follows (`srvr`).
    fn health(&self) -> Result<(), String> {
        let modes: Vec<(String, Option<String>)> = (0..self.members.len())
            .filter(|&i| self.members[i].is_running())
            .map(|i| (self.members[i].name().to_owned(), self.mode(i)))
            .collect();
        if let Some((name, mode)) = modes
            .iter()
            .find(|(_, m)| !matches!(m.as_deref(), Some("leader" | "follower")))
        {
            return Err(format!("{name}: srvr shows mode {mode:?}"));
        }
        if modes.iter().any(|(_, m)| m.as_deref() == Some("leader")) {
            Ok(())
        } else {
            Err("no server leads (srvr)".into())
        }
    }
}

/// N independent Redis nodes (Redlock's topology), each with AOF and
/// `appendfsync always`, so a restarted node keeps its counters.
#[derive(Debug)]
pub struct RedisNodes {
    members: Vec<OwnedProcess>,
}

impl RedisNodes {
    /// Starts `n` durable nodes.
    ///
    /// # Panics
    /// When a node cannot start.
    pub fn start(n: usize) -> Self {
        RedisNodes {
            members: (0..n)
                .map(|_| crate::redis::redis_in(member_dir("redis-node"), true, &[]))
                .collect(),
        }
    }

    /// The nodes' URLs (`redis://127.0.0.1:PORT`).
    pub fn urls(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("redis://127.0.0.1:{}", m.port()))
            .collect()
    }
}

impl Topology for RedisNodes {
    fn members(&self) -> &[OwnedProcess] {
        &self.members
    }
    fn members_mut(&mut self) -> &mut [OwnedProcess] {
        &mut self.members
    }
    fn leader(&self) -> Option<usize> {
        None
    }
    fn has_leader(&self) -> bool {
        false
    }
    /// A majority of the nodes runs and answers PING.
    fn health(&self) -> Result<(), String> {
        let mut failed = Vec::new();
        let up = self
            .members
            .iter()
            .filter(|m| m.is_running())
            .filter(
                |m| match crate::Readiness::RedisPing.check(m.port(), m.dir.path()) {
                    Ok(()) => true,
                    Err(e) => {
                        failed.push(format!("{}: {e}", m.name()));
                        false
                    }
                },
            )
            .count();
        if up > self.members.len() / 2 {
            Ok(())
        } else {
            Err(format!(
                "{up} of {} nodes answer PING: {}",
                self.members.len(),
                failed.join("; ")
            ))
        }
    }
}

/// Runs one command on the Redis (or Sentinel) at `port` with `redis-cli
/// --raw`, returning its output lines.
fn redis_cli(port: u16, args: &[&str]) -> Option<Vec<String>> {
    // redis-cli has no timeout of its own: a frozen server would hang it.
    let out = output(
        Command::new("timeout")
            .args([
                "2",
                "redis-cli",
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "--raw",
            ])
            .args(args)
            .stdin(std::process::Stdio::null()),
    )?;
    Some(out.lines().map(str::to_owned).collect())
}

/// A Redis primary with replicas, watched by Sentinels (quorum: a majority of
/// them). Every data node keeps AOF with `appendfsync always`. The
/// [`members`](Topology::members) are the data nodes, which a test kills or
/// freezes; the Sentinels are kept apart and stay up.
#[derive(Debug)]
pub struct RedisSentinel {
    members: Vec<OwnedProcess>,
    sentinels: Vec<OwnedProcess>,
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
        let primary = crate::redis::redis_in(member_dir("redis-primary"), true, &[]);
        let primary_port = primary.port().to_string();
        let mut members = vec![primary];
        for _ in 0..replicas {
            members.push(crate::redis::redis_in(
                member_dir("redis-replica"),
                true,
                &["--replicaof", "127.0.0.1", &primary_port],
            ));
        }
        let quorum = sentinels / 2 + 1;
        let sentinels = (0..sentinels)
            .map(|i| {
                let dir = member_dir("redis-sentinel");
                let port = free_port();
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
                OwnedProcess::start(
                    &format!("sentinel-{i}"),
                    "redis-server",
                    vec![cfg.display().to_string(), "--sentinel".into()],
                    port,
                    dir,
                    crate::Readiness::RedisPing,
                )
            })
            .collect();
        let s = RedisSentinel { members, sentinels };
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

/// Runs one SQL statement on the PostgreSQL at `port` with `psql`, returning
/// its unaligned output (bounded: a frozen server would hang psql).
fn psql(port: u16, sql: &str) -> Option<String> {
    output(
        Command::new("timeout")
            .args(["5", "psql", "-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-tAX", "-c", sql])
            .env("PGCONNECT_TIMEOUT", "2")
            .stdin(std::process::Stdio::null()),
    )
    .map(|o| o.trim().to_owned())
}

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

/// A Redis Cluster of N primaries, each with R replicas, every node with
/// AOF and `appendfsync always`, `cluster-node-timeout` 1 s.
#[derive(Debug)]
pub struct RedisCluster {
    members: Vec<OwnedProcess>,
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
        let timeout = CLUSTER_NODE_TIMEOUT.as_millis().to_string();
        let members: Vec<OwnedProcess> = (0..primaries * (1 + replicas))
            .map(|_| {
                crate::redis::redis_in(
                    member_dir("redis-cluster"),
                    true,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        &timeout,
                    ],
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
        let c = RedisCluster { members };
        c.wait_healthy(Duration::from_secs(60));
        c
    }

    /// `redis+cluster://127.0.0.1:P1,...`: every node as a seed.
    pub fn url(&self) -> String {
        format!("redis+cluster://{}", loopback_hosts(&self.members))
    }

    /// The running node that serves `redis_key`'s slot as primary now.
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

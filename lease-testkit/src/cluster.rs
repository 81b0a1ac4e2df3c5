//! Replicated stores on loopback, each member an [`OwnedProcess`] on its own
//! free ports with its own data directory: an etcd cluster, a ZooKeeper
//! ensemble, and N independent Redis nodes for Redlock. A test (or
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
    /// True when the running members serve as a whole (a quorum, a leader).
    fn healthy(&self) -> bool;
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
        while !self.healthy() {
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .members()
                    .iter()
                    .map(|m| format!("--- {} ---\n{}", m.name(), m.log_tail()))
                    .collect();
                panic!(
                    "the cluster is not healthy after {limit:?}:\n{}",
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
    fn healthy(&self) -> bool {
        let running: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.is_running())
            .map(|m| format!("http://127.0.0.1:{}", m.port()))
            .collect();
        !running.is_empty()
            && self.leader().is_some()
            && output(
                Command::new("etcdctl")
                    .env("ETCDCTL_API", "3")
                    .arg(format!("--endpoints={}", running.join(",")))
                    .args(["--command-timeout=2s", "endpoint", "health"]),
            )
            .is_some()
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
    /// When a server cannot start or the ensemble does not form in 90 s.
    pub fn start(n: usize) -> Self {
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
                    crate::zk_server(),
                    vec!["start-foreground".into(), cfg.display().to_string()],
                    *client,
                    dir,
                )
            })
            .collect();
        let e = ZkEnsemble { members };
        e.wait_healthy(Duration::from_secs(90));
        e
    }

    /// The connect string: `127.0.0.1:P1,127.0.0.1:P2,...`.
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port()))
            .collect::<Vec<_>>()
            .join(",")
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
    fn healthy(&self) -> bool {
        let modes: Vec<Option<String>> = (0..self.members.len())
            .filter(|&i| self.members[i].is_running())
            .map(|i| self.mode(i))
            .collect();
        modes.iter().any(|m| m.as_deref() == Some("leader"))
            && modes
                .iter()
                .all(|m| matches!(m.as_deref(), Some("leader" | "follower")))
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
                .map(|_| crate::redis_in(member_dir("redis-node"), true, &[]))
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
    fn healthy(&self) -> bool {
        let up = self.members.iter().filter(|m| m.is_running()).count();
        up > self.members.len() / 2
    }
}

//! `GaleraCluster`: a MariaDB Galera cluster of N nodes (wsrep on loopback).

use std::time::{Duration, Instant};

use super::members::member_dir;
use super::netsplit::Netsplit;
use super::topology::Topology;
use crate::mysql::{install_db, mariadb, mysql_user};
use crate::{OwnedProcess, Readiness, free_port};

/// The Galera provider library (Debian's `galera-4`).
pub const GALERA_PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

/// A MariaDB Galera cluster: every node takes writes, and a commit is
/// certified by every node before it returns. Nodes find each other on
/// loopback ports of their own (group communication, IST, rsync SST); a
/// node killed and started again rejoins by state transfer. Node failure is
/// suspected after 3 s (`evs.suspect_timeout`).
#[derive(Debug)]
pub struct GaleraCluster {
    members: Vec<OwnedProcess>,
    /// The cuts between nodes, for a cluster started splittable.
    split: Option<Netsplit>,
}

impl GaleraCluster {
    /// Starts `n` nodes: the first bootstraps the cluster, the others join
    /// it by state transfer; then creates the database `lease`.
    ///
    /// # Panics
    /// When a node cannot start, or the cluster does not form in 90 s.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, false)
    }

    /// As [`start`](Self::start), each node running as a uid of its own,
    /// so that [`isolate_member`](Topology::isolate_member) can cut a node
    /// off from the others (group communication and state transfer, both
    /// ways) in the packet filter while clients still reach it.
    ///
    /// # Panics
    /// As [`start`](Self::start), and when the packet filter cannot be
    /// used (not root, no `nft`).
    pub fn start_splittable(n: usize) -> Self {
        Self::start_with(n, true)
    }

    fn start_with(n: usize, splittable: bool) -> Self {
        let ports: Vec<[u16; 4]> = (0..n)
            .map(|_| [free_port(), free_port(), free_port(), free_port()])
            .collect();
        let split = splittable.then(|| {
            Netsplit::new(ports.iter().map(|p| p.to_vec()).collect())
                .unwrap_or_else(|why| panic!("a splittable Galera cluster: {why}"))
        });
        let user = mysql_user();
        let gcomm = ports
            .iter()
            .map(|p| format!("127.0.0.1:{}", p[1]))
            .collect::<Vec<_>>()
            .join(",");
        let mut members: Vec<OwnedProcess> = ports
            .iter()
            .enumerate()
            .map(|(i, [port, group, ist, sst])| {
                let run_as = split.as_ref().map_or(user, |s| Some(s.run_as(i)));
                let dir = member_dir("galera-node");
                if let Some((uid, gid)) = run_as {
                    let _ = std::process::Command::new("chown")
                        .arg(format!("{uid}:{gid}"))
                        .arg(dir.path())
                        .status();
                }
                let data = dir.path().join("data");
                let tmpdir = install_db(&data, run_as);
                let mut args = vec![
                    "--no-defaults".to_owned(),
                    tmpdir,
                    format!("--datadir={}", data.display()),
                    format!("--port={port}"),
                    "--bind-address=127.0.0.1".into(),
                    format!("--socket={}", dir.path().join("sock").display()),
                    format!("--pid-file={}", dir.path().join("pid").display()),
                    "--skip-name-resolve".into(),
                    "--skip-log-bin".into(),
                    "--binlog-format=ROW".into(),
                    "--innodb-autoinc-lock-mode=2".into(),
                    "--innodb-buffer-pool-size=32M".into(),
                    "--innodb-flush-log-at-trx-commit=1".into(),
                    "--wsrep-on=ON".into(),
                    format!("--wsrep-provider={GALERA_PROVIDER}"),
                    "--wsrep-cluster-name=lease-test".into(),
                    format!("--wsrep-cluster-address=gcomm://{gcomm}"),
                    format!("--wsrep-node-address=127.0.0.1:{group}"),
                    format!("--wsrep-node-name=node{}", i + 1),
                    format!(
                        "--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{group};ist.recv_addr=127.0.0.1:{ist};evs.suspect_timeout=PT3S;evs.inactive_timeout=PT6S;evs.install_timeout=PT6S"
                    ),
                    "--wsrep-sst-method=rsync".into(),
                    format!("--wsrep-sst-receive-address=127.0.0.1:{sst}"),
                ];
                if i == 0 {
                    args.push("--wsrep-new-cluster".into());
                }
                OwnedProcess {
                    name: format!("galera-{}", i + 1),
                    program: "mariadbd".into(),
                    args,
                    port: *port,
                    log: dir.path().join("mariadb.log"),
                    child: None,
                    run_as: None,
                    stop_signal: "TERM",
                    readiness: Readiness::Mysql,
                    dir,
                }
                .configured(run_as, "TERM")
            })
            .collect();
        let limit = Duration::from_secs(90);
        // The first node alone forms the cluster; the others join it one
        // after the other (each joiner takes a state transfer from it).
        members[0].start_again();
        for member in members.iter_mut().skip(1) {
            member.start_again();
            let deadline = Instant::now() + limit;
            while synced(member).is_err() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        // Started again later, the first node must join, not bootstrap a
        // second cluster.
        members[0].args.retain(|a| a != "--wsrep-new-cluster");
        let cluster = GaleraCluster { members, split };
        cluster.wait_healthy(limit);
        assert!(
            mariadb(
                cluster.members[0].port(),
                "CREATE DATABASE IF NOT EXISTS lease"
            )
            .is_some(),
            "could not create the database on the Galera cluster"
        );
        cluster
    }

    /// `mysql://root@127.0.0.1:P1,127.0.0.1:P2,.../lease`: every node, the
    /// first first.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port()))
            .collect();
        format!("mysql://root@{}/lease", hosts.join(","))
    }
}

/// `Ok` when the node's state is `Synced`; else what it reported.
fn synced(m: &OwnedProcess) -> Result<usize, String> {
    let out = mariadb(
        m.port(),
        "SHOW STATUS WHERE Variable_name IN ('wsrep_local_state_comment', 'wsrep_cluster_size')",
    )
    .ok_or_else(|| format!("{}: no answer", m.name()))?;
    let get = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('\t'))
            .map(str::trim)
    };
    match (get("wsrep_local_state_comment"), get("wsrep_cluster_size")) {
        (Some("Synced"), Some(size)) => size
            .parse()
            .map_err(|_| format!("{}: cluster size {size:?}", m.name())),
        other => Err(format!("{}: {other:?}", m.name())),
    }
}

impl Topology for GaleraCluster {
    fn members(&self) -> &[OwnedProcess] {
        &self.members
    }
    fn members_mut(&mut self) -> &mut [OwnedProcess] {
        &mut self.members
    }
    /// Every node takes writes: there is no leader.
    fn leader(&self) -> Option<usize> {
        None
    }
    fn has_leader(&self) -> bool {
        false
    }
    fn netsplit(&self) -> Option<&Netsplit> {
        self.split.as_ref()
    }
    /// Some other running node is `Synced` in a cluster of every running
    /// node but `i`: the rest evicted it and went on.
    fn serves_without(&self, i: usize) -> bool {
        let others = self
            .members
            .iter()
            .enumerate()
            .filter(|(j, m)| *j != i && m.is_running())
            .count();
        self.members
            .iter()
            .enumerate()
            .filter(|(j, m)| *j != i && m.is_running())
            .any(|(_, m)| synced(m) == Ok(others))
    }
    /// The others suspect a silent node after `evs.suspect_timeout` (3 s)
    /// and evict it by `evs.inactive_timeout` (6 s).
    fn isolation_hold(&self) -> Duration {
        Duration::from_secs(10)
    }
    /// Every running node is `Synced` in one cluster of all running nodes.
    fn health(&self) -> Result<(), String> {
        let running: Vec<&OwnedProcess> = self.members.iter().filter(|m| m.is_running()).collect();
        for m in &running {
            let size = synced(m)?;
            if size != running.len() {
                return Err(format!(
                    "{}: a cluster of {size}, {} nodes run",
                    m.name(),
                    running.len()
                ));
            }
        }
        Ok(())
    }
}

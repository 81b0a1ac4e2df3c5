//! `PatroniCluster`: PostgreSQL members managed by Patroni, the failover
//! agent most PostgreSQL HA deployments run, with its state in an etcd of
//! the cluster's own and synchronous replication (`synchronous_mode`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::links::Links;
use super::members::{loopback_hosts, member_dir, psql};
use super::topology::Topology;
use crate::{OwnedProcess, Readiness, free_port, owned_etcd, pg_bindir};

/// Patroni's leader key TTL, in seconds: the primary's lock in etcd lapses
/// this long after its agent dies, and a standby may then take it. 20 is
/// the least Patroni accepts: it raises a smaller `ttl` to 20 (and says so
/// in its log), which a cluster configured with 10 showed as a 20 s
/// failover.
pub const PATRONI_TTL_SECS: u64 = 20;

/// The `patroni` program: `LEASE_TEST_PATRONI`, which `scripts/stores env`
/// points at the virtual environment `scripts/stores install` makes.
///
/// # Panics
/// When the variable is not set: run the tests through `scripts/test`, or
/// `eval "$(scripts/stores env)"` first.
pub fn patroni_bin() -> PathBuf {
    match std::env::var_os("LEASE_TEST_PATRONI") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => panic!(
            "LEASE_TEST_PATRONI is not set: `eval \"$(scripts/stores env)\"` (scripts/stores install makes Patroni's virtual environment)"
        ),
    }
}

/// PostgreSQL members managed by Patroni over an etcd of their own: one
/// primary, the others streaming standbys, one of them synchronous
/// (`synchronous_mode`: Patroni promotes only a standby that had every
/// commit). When the primary's agent dies, its leader key lapses after
/// [`PATRONI_TTL_SECS`] and a standby is promoted; a member started again
/// rejoins as a standby (rewound with `pg_rewind` when it diverged).
///
/// Clients reach each member's PostgreSQL directly ([`url`](Self::url));
/// everything between the members goes through proxies a member owns: its
/// agent's connection to etcd, and the addresses it publishes to the others
/// (its PostgreSQL, which the standbys stream from, and its REST API, which
/// they ask before a promotion). [`isolate`](Self::isolate) cuts those, so
/// the member is alone while its clients still reach it.
#[derive(Debug)]
pub struct PatroniCluster {
    members: Vec<OwnedProcess>,
    /// Each member's data directory, for its postmaster's pid.
    data: Vec<PathBuf>,
    /// Each member's REST API port.
    rest: Vec<u16>,
    /// The paths between the members.
    links: Links,
    /// The etcd holding the cluster's state.
    _etcd: OwnedProcess,
}

impl PatroniCluster {
    /// Starts `n` members (the first bootstraps, the others clone it) and
    /// waits until one leads and the others stream from it.
    ///
    /// # Panics
    /// When a member cannot start or the cluster is not healthy in 120 s.
    pub fn start(n: usize) -> Self {
        let etcd = owned_etcd();
        let patroni = patroni_bin();
        let bindir = pg_bindir();
        let scope = format!("lease-{}", free_port());
        let mut links = Links::new(n);
        let mut members = Vec::new();
        let mut data = Vec::new();
        let mut rests = Vec::new();
        for i in 0..n {
            let dir = member_dir("patroni");
            let (port, rest) = (free_port(), free_port());
            // What the others reach of this member, and its way to etcd
            // (`use_proxies`: without it Patroni asks etcd for its members'
            // addresses and connects to those, around the link).
            let (port_link, rest_link, etcd_link) = (
                links.through(i, port),
                links.through(i, rest),
                links.through(i, etcd.port()),
            );
            let data_dir = dir.path().join("data");
            let config = dir.path().join("patroni.yml");
            std::fs::write(
                &config,
                format!(
                    "scope: {scope}
name: m{i}
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest_link}
etcd3:
  hosts: 127.0.0.1:{etcd_link}
  use_proxies: true
bootstrap:
  dcs:
    ttl: {PATRONI_TTL_SECS}
    loop_wait: 1
    retry_timeout: 4
    primary_start_timeout: 0
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      parameters:
        wal_log_hints: 'on'
        fsync: 'on'
        max_connections: 300
  initdb:
  - encoding: UTF8
  pg_hba:
  - host replication replicator 127.0.0.1/32 trust
  - host all all 127.0.0.1/32 trust
  - local all all trust
postgresql:
  listen: 127.0.0.1:{port}
  connect_address: 127.0.0.1:{port_link}
  data_dir: {data}
  bin_dir: {bindir}
  pgpass: {socket}/pgpass
  authentication:
    replication: {{username: replicator, password: replicator}}
    superuser: {{username: postgres, password: postgres}}
    rewind: {{username: rewinder, password: rewinder}}
  parameters:
    unix_socket_directories: {socket}
",
                    data = data_dir.display(),
                    bindir = bindir.display(),
                    socket = dir.path().display(),
                ),
            )
            .expect("write the Patroni configuration");
            let run_as = crate::postgres::owned_by_postgres(dir.path());
            let mut member = OwnedProcess {
                name: format!("patroni-m{i}"),
                program: patroni.clone(),
                args: vec![config.display().to_string()],
                port,
                log: dir.path().join("patroni.log"),
                child: None,
                run_as: None,
                stop_signal: "TERM",
                readiness: Readiness::Listening,
                dir,
            }
            .configured(run_as, "TERM");
            // The first bootstraps alone; the others clone it.
            member.start_again();
            members.push(member);
            data.push(data_dir);
            rests.push(rest);
        }
        let cluster = PatroniCluster {
            members,
            data,
            rest: rests,
            links,
            _etcd: etcd,
        };
        cluster.wait_healthy(Duration::from_secs(120));
        cluster
    }

    /// `postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/postgres`: every
    /// member.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@{}/postgres",
            loopback_hosts(&self.members)
        )
    }

    /// Every member's REST API, `127.0.0.1:PORT` (reached directly, as
    /// clients reach PostgreSQL).
    pub fn rest_addrs(&self) -> Vec<String> {
        self.rest.iter().map(|p| format!("127.0.0.1:{p}")).collect()
    }

    /// kill -9 of member `i`: its agent and its PostgreSQL (which runs in a
    /// session of its own, so that an agent restart keeps it), as a host
    /// dies.
    ///
    /// # Panics
    /// When its PostgreSQL still accepts connections 10 s later.
    pub fn kill(&mut self, i: usize) {
        let postmaster = self.postmaster(i);
        self.members[i].kill();
        if let Some(pid) = postmaster {
            // Its children first (backends, WAL senders: they would serve a
            // moment longer), then its group, then itself.
            for child in children(pid) {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &child.to_string()])
                    .status();
            }
            signal_group(pid, "KILL");
            if is_postgres(pid) {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
        let port = self.members[i].port();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            assert!(
                Instant::now() < deadline,
                "member {i}'s PostgreSQL on port {port} still accepts connections after kill -9"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pid of member `i`'s postmaster, from its `postmaster.pid`.
    fn postmaster(&self, i: usize) -> Option<u32> {
        let text = std::fs::read_to_string(self.data[i].join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// The HTTP status of `GET path` on member `i`'s REST API (Patroni's
    /// health checks: `/primary`, `/sync`, `/replica`), if it answers.
    pub fn rest_status(&self, i: usize, path: &str) -> Option<u16> {
        use std::io::{Read, Write};
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.rest[i]));
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).ok()?;
        std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
    }

    /// Changes the cluster's dynamic configuration as `patronictl
    /// edit-config` does: `PATCH /config` with `json` on member 0's REST
    /// API. Patroni's agents apply it within a loop.
    ///
    /// # Panics
    /// When the REST API does not answer 200.
    pub fn patch_config(&self, json: &str) {
        use std::io::{Read, Write};
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.rest[0]));
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .expect("connect to Patroni's REST API");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("set a read timeout");
        write!(
            s,
            "PATCH /config HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{json}",
            json.len()
        )
        .expect("send PATCH /config");
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(
            answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
            "PATCH /config {json}: {answer}"
        );
    }

    /// Cuts member `i` off from the others and from etcd, while its clients
    /// still reach it: its agent loses the leader key (a primary demotes
    /// itself once it cannot renew it within `retry_timeout`), the standbys
    /// stop streaming from it, and none can ask it before a promotion. The
    /// paths it dials to the others' addresses stay open: a primary dials
    /// none of them (`failsafe_mode`, which would, is off), while an
    /// isolated standby can still stream from the primary.
    pub fn isolate(&self, i: usize) {
        self.links.isolate(i);
    }

    /// Heals what [`isolate`](Self::isolate) cut: the member rejoins (a
    /// former primary as a standby, rewound when it diverged).
    pub fn rejoin(&self, i: usize) {
        self.links.rejoin(i);
    }

    /// Starts a killed member again on its own data: it rejoins as a
    /// standby.
    ///
    /// # Panics
    /// When its agent does not start.
    pub fn restart(&mut self, i: usize) {
        self.members[i].start_again();
    }

    /// Whether member `i` runs and is a primary (not in recovery).
    fn is_primary(&self, i: usize) -> bool {
        self.members[i].is_running()
            && psql(self.members[i].port(), "SELECT pg_is_in_recovery()").as_deref() == Some("f")
    }

    /// Waits until member `i` is a standby streaming from the primary.
    ///
    /// # Panics
    /// When it is not within `limit`.
    pub fn wait_streaming(&self, i: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let status = psql(
                self.members[i].port(),
                "SELECT status FROM pg_stat_wal_receiver",
            );
            if status.as_deref() == Some("streaming") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "member {i} does not stream ({status:?}) after {limit:?}: {}",
                self.members[i].log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The process group of `pid`, from `/proc/PID/stat` ("pid (comm) state
/// ppid pgrp ..."; comm may hold spaces).
fn process_group(pid: &str) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

/// Whether `pid` runs `postgres`.
fn is_postgres(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "postgres")
}

/// The `postgres` processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&c| {
            std::fs::read_to_string(format!("/proc/{c}/stat"))
                .ok()
                .and_then(|stat| {
                    stat.rsplit_once(')')?
                        .1
                        .split_whitespace()
                        .nth(1)?
                        .parse::<u32>()
                        .ok()
                })
                == Some(pid)
                && is_postgres(c)
        })
        .collect()
}

/// Sends `signal` to the process group of the postmaster `pid` (its
/// backends and helpers with it). Nothing when `pid` is not a running
/// `postgres` (a `postmaster.pid` left by a kill -9 may name a pid reused
/// since), and never to this process's own group.
fn signal_group(pid: u32, signal: &str) {
    let group = process_group(&pid.to_string());
    if !is_postgres(pid) || group.is_none_or(|g| g <= 1 || Some(g) == process_group("self")) {
        return;
    }
    if let Some(g) = group {
        let _ = std::process::Command::new("kill")
            .args([&format!("-{signal}"), "--", &format!("-{g}")])
            .status();
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        // The postmasters run in sessions of their own: end them too.
        for i in 0..self.members.len() {
            if self.members[i].is_running() {
                self.kill(i);
            } else if let Some(pid) = self.postmaster(i) {
                signal_group(pid, "KILL");
            }
        }
    }
}

impl Topology for PatroniCluster {
    fn members(&self) -> &[OwnedProcess] {
        &self.members
    }
    fn members_mut(&mut self) -> &mut [OwnedProcess] {
        &mut self.members
    }
    fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| self.is_primary(i))
    }
    fn kill_member(&mut self, i: usize) {
        self.kill(i);
    }
    /// The agent and its PostgreSQL, as a frozen host.
    fn freeze_member(&self, i: usize) {
        self.members[i].freeze();
        if let Some(pid) = self.postmaster(i) {
            signal_group(pid, "STOP");
        }
    }
    fn thaw_member(&self, i: usize) {
        if let Some(pid) = self.postmaster(i) {
            signal_group(pid, "CONT");
        }
        self.members[i].thaw();
    }
    fn can_isolate(&self) -> bool {
        true
    }
    fn isolate_member(&self, i: usize) {
        self.isolate(i);
    }
    fn rejoin_member(&self, i: usize) {
        self.rejoin(i);
    }
    /// Long enough for the leader key to lapse and a standby to be
    /// promoted.
    fn isolation_hold(&self) -> Duration {
        Duration::from_secs(PATRONI_TTL_SECS + 5)
    }
    /// One primary, every other running member streaming from it, and one
    /// of them its synchronous standby.
    fn health(&self) -> Result<(), String> {
        let Some(primary) = self.leader() else {
            return Err("no running member answers pg_is_in_recovery() = f".into());
        };
        let standbys = (0..self.members.len())
            .filter(|&i| i != primary && self.members[i].is_running())
            .count();
        let sync = psql(
            self.members[primary].port(),
            "SELECT count(*) FILTER (WHERE state = 'streaming'), count(*) FILTER (WHERE sync_state = 'sync') FROM pg_stat_replication",
        );
        let want = format!("{standbys}|{}", usize::from(standbys > 0));
        if sync.as_deref() != Some(want.as_str()) {
            return Err(format!(
                "the primary reports streaming|sync {sync:?}, not {want}"
            ));
        }
        // Patroni promotes only the standby its state names synchronous
        // (`/sync` answers 200 there), which it records after PostgreSQL's
        // setting: wait for both.
        let named = (0..self.members.len())
            .filter(|&i| i != primary && self.members[i].is_running())
            .filter(|&i| self.rest_status(i, "/sync") == Some(200))
            .count();
        if named == usize::from(standbys > 0) {
            Ok(())
        } else {
            Err(format!(
                "{named} standbys are Patroni's synchronous one, not {}",
                usize::from(standbys > 0)
            ))
        }
    }
}

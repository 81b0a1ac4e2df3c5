//! `ZkEnsemble`: a ZooKeeper ensemble of N servers.

use std::time::{Duration, Instant};

use super::members::{loopback_hosts, member_dir};
use super::netsplit::Netsplit;
use super::topology::Topology;
use crate::{OwnedProcess, free_port};

/// A ZooKeeper ensemble of N servers.
#[derive(Debug)]
pub struct ZkEnsemble {
    members: Vec<OwnedProcess>,
    /// The cuts between servers, for an ensemble started splittable.
    split: Option<Netsplit>,
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
        Self::start_with(n, false)
    }

    /// As [`start`](Self::start), each server running as a uid of its own,
    /// so that [`isolate_member`](Topology::isolate_member) can cut it off
    /// from the others in the packet filter (its quorum and election
    /// connections, both ways) while clients still reach it.
    ///
    /// # Panics
    /// As [`start`](Self::start), and when the packet filter cannot be
    /// used (not root, no `nft`).
    pub fn start_splittable(n: usize) -> Self {
        Self::start_with(n, true)
    }

    fn start_with(n: usize, splittable: bool) -> Self {
        let limit = Duration::from_secs(60);
        for attempt in 1..=3 {
            let e = Self::launch(n, splittable);
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

    fn launch(n: usize, splittable: bool) -> Self {
        let ports: Vec<(u16, u16, u16)> = (0..n)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let split = splittable.then(|| {
            Netsplit::new(ports.iter().map(|(c, q, e)| vec![*c, *q, *e]).collect())
                .unwrap_or_else(|why| panic!("a splittable ZooKeeper ensemble: {why}"))
        });
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
                let run_as = split.as_ref().map(|s| {
                    s.own(i, dir.path());
                    s.run_as(i)
                });
                OwnedProcess::spawn_as(
                    &format!("zk-{}", i + 1),
                    crate::env::zk_server(),
                    vec!["start-foreground".into(), cfg.display().to_string()],
                    *client,
                    dir,
                    run_as,
                )
            })
            .collect();
        ZkEnsemble { members, split }
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
    fn netsplit(&self) -> Option<&Netsplit> {
        self.split.as_ref()
    }
    /// A leader cut off gives up after `syncLimit` ticks without a quorum
    /// of followers (2 s here), and the others elect one within a moment.
    fn isolation_hold(&self) -> Duration {
        Duration::from_secs(4)
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

//! The workload: the worker processes that compete for the key, each
//! reaching the store through proxies of its own; starting, respawning and
//! (when the run ends or fails) stopping them, and finding their logs.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, getpgid};

use crate::proxy::Proxy;

/// The hosts of a store URL, and the URL rebuilt with other hosts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hosts {
    head: String,
    /// `host:port` of each node, default ports filled in.
    pub hosts: Vec<String>,
    tail: String,
}

impl Hosts {
    /// Splits `url`; `None` when it names no host (sqlite://, memory://).
    pub fn parse(url: &str) -> Option<Hosts> {
        let (scheme, rest) = url.split_once("://")?;
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (auth, tail) = rest.split_at(end);
        let (user, hosts) = match auth.rfind('@') {
            Some(i) => auth.split_at(i + 1),
            None => ("", auth),
        };
        if hosts.is_empty() {
            return None;
        }
        let port = match scheme {
            "redis" | "rediss" | "redlock" => 6379,
            "postgres" | "postgresql" => 5432,
            "mysql" | "mariadb" => 3306,
            "etcd" | "etcds" => 2379,
            "zk" => 2181,
            _ => return None,
        };
        let hosts = hosts
            .split(',')
            .map(|h| {
                let h = h.trim();
                let bracket = h.rfind(']').unwrap_or(0);
                match h.rfind(':') {
                    Some(i) if i > bracket => h.to_string(),
                    _ => format!("{h}:{port}"),
                }
            })
            .collect();
        Some(Hosts {
            head: format!("{scheme}://{user}"),
            hosts,
            tail: tail.to_string(),
        })
    }

    /// The URL with `hosts` in place of the original ones.
    pub fn with(&self, hosts: &[SocketAddr]) -> String {
        let list: Vec<String> = hosts.iter().map(ToString::to_string).collect();
        format!("{}{}{}", self.head, list.join(","), self.tail)
    }
}

/// One worker's place: its current process and its proxies to the store.
pub(crate) struct Slot {
    /// The incarnation: how many times this worker was started again.
    inc: u32,
    /// The worker's process.
    pub(crate) child: Child,
    /// One proxy per store node, between this worker and the node.
    pub(crate) proxies: Vec<Proxy>,
    /// The store URL through the proxies.
    url: String,
}

/// Owns everything a run starts; dropping it thaws and kills what is left,
/// so a failed run never leaves a store or a worker frozen.
pub(crate) struct Run {
    /// One slot per worker.
    pub(crate) slots: Vec<Slot>,
    /// The store's processes (store-pause), thawed on drop.
    pub(crate) store_pids: Vec<i32>,
    /// The program and leading arguments that start a worker.
    pub(crate) worker_cmd: Vec<OsString>,
    /// The job's length in a short round.
    pub(crate) job: Duration,
    /// The share of rounds held beyond the TTL.
    pub(crate) long_share: f64,
    /// The share of read/write rounds taken as a reader (0: plain leases).
    pub(crate) read_share: f64,
    /// The lease namespace.
    pub(crate) namespace: String,
    /// Where the worker logs go.
    pub(crate) dir: PathBuf,
    /// The key the workers compete for.
    pub(crate) key: String,
    /// The lease TTL.
    pub(crate) ttl: Duration,
    /// The seed of the run.
    pub(crate) seed: u64,
    /// Where the sink listens.
    pub(crate) sink_addr: SocketAddr,
}

impl Drop for Run {
    fn drop(&mut self) {
        for &pid in &self.store_pids {
            signal_store(pid, Signal::SIGCONT);
        }
        for s in &mut self.slots {
            let pid = Pid::from_raw(s.child.id() as i32);
            let _ = kill(pid, Signal::SIGCONT);
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
    }
}

/// Signals a store process, or its whole process group when it leads one.
pub(crate) fn signal_store(pid: i32, sig: Signal) {
    let p = Pid::from_raw(pid);
    if getpgid(Some(p)).is_ok_and(|g| g == p) {
        let _ = killpg(p, sig);
    } else {
        let _ = kill(p, sig);
    }
}

impl Run {
    /// Starts `workers` worker processes, each with a proxy per store node in
    /// `targets`, reaching the store through its own proxies (through `store`
    /// itself when it names no host).
    pub(crate) async fn start_workers(
        &mut self,
        workers: u32,
        targets: &[SocketAddr],
        hosts: Option<&Hosts>,
        store: &str,
    ) -> Result<(), String> {
        for w in 0..workers {
            let mut proxies = Vec::new();
            for t in targets {
                proxies.push(
                    Proxy::start(*t)
                        .await
                        .map_err(|e| format!("cannot start a proxy: {e}"))?,
                );
            }
            let url = match hosts {
                Some(h) => h.with(&proxies.iter().map(Proxy::addr).collect::<Vec<_>>()),
                None => store.to_owned(),
            };
            let child = self.spawn(w, 0, &url)?;
            self.slots.push(Slot {
                inc: 0,
                child,
                proxies,
                url,
            });
        }
        Ok(())
    }

    fn spawn(&self, worker: u32, inc: u32, url: &str) -> Result<Child, String> {
        let (exe, pre) = self.worker_cmd.split_first().ok_or("no worker command")?;
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("worker-{worker}.err")))
            .map_err(|e| format!("cannot open a worker's error log: {e}"))?;
        Command::new(exe)
            .args(pre)
            .arg("--url")
            .arg(url)
            .arg("--ns")
            .arg(&self.namespace)
            .arg("--key")
            .arg(&self.key)
            .arg("--worker")
            .arg(worker.to_string())
            .arg("--inc")
            .arg(inc.to_string())
            .arg("--sink")
            .arg(self.sink_addr.to_string())
            .arg("--log")
            .arg(self.dir.join(format!("worker-{worker}-{inc}.log")))
            .arg("--ttl")
            .arg(format!("{}ms", self.ttl.as_millis()))
            .arg("--job")
            .arg(format!("{}us", self.job.as_micros()))
            .arg("--long-share")
            .arg(self.long_share.to_string())
            .arg("--seed")
            .arg(self.seed.to_string())
            .arg("--read-share")
            .arg(self.read_share.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start a worker ({}): {e}", exe.to_string_lossy()))
    }

    /// The process of `worker`.
    pub(crate) fn pid(&self, worker: u32) -> Option<Pid> {
        self.slots
            .get(worker as usize)
            .map(|s| Pid::from_raw(s.child.id() as i32))
    }

    /// Respawns workers that exited on their own (counted, not hidden).
    pub(crate) fn reap(&mut self, respawned: &mut u64) -> Result<(), String> {
        for w in 0..self.slots.len() {
            let exited = matches!(self.slots[w].child.try_wait(), Ok(Some(_)));
            if exited {
                *respawned += 1;
                self.restart(w as u32)?;
            }
        }
        Ok(())
    }

    /// Starts `worker` again as a new incarnation (after a crash).
    pub(crate) fn restart(&mut self, worker: u32) -> Result<(), String> {
        let w = worker as usize;
        let inc = self.slots[w].inc + 1;
        let url = self.slots[w].url.clone();
        let child = self.spawn(worker, inc, &url)?;
        let slot = &mut self.slots[w];
        let _ = slot.child.wait();
        slot.child = child;
        slot.inc = inc;
        Ok(())
    }
}

/// The worker logs in `dir`.
pub(crate) fn worker_logs(dir: &std::path::Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with("worker-") && name.ends_with(".log")
                })
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_found_and_replaced() {
        let h = Hosts::parse("redlock://127.0.0.1:16380,127.0.0.1:16381,localhost").expect("hosts");
        assert_eq!(
            h.hosts,
            ["127.0.0.1:16380", "127.0.0.1:16381", "localhost:6379"]
        );
        let a: Vec<SocketAddr> = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
            .iter()
            .map(|s| s.parse().expect("addr"))
            .collect();
        assert_eq!(h.with(&a), "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3");
        let pg = Hosts::parse("postgres://u:p@db:15432/x?lease_table=a.b").expect("pg");
        assert_eq!(pg.hosts, ["db:15432"]);
        assert_eq!(
            pg.with(&a[..1]),
            "postgres://u:p@127.0.0.1:1/x?lease_table=a.b"
        );
        assert_eq!(Hosts::parse("sqlite:///tmp/x.db"), None);
        assert_eq!(Hosts::parse("memory://"), None);
        assert_eq!(
            Hosts::parse("zk://h1,h2:3/chroot").expect("zk").hosts,
            ["h1:2181", "h2:3"]
        );
    }
}

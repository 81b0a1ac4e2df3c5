//! The controller: starts the sink, a proxy per (worker, store node) link and
//! K worker processes, runs the nemesis until the run ends, then checks the
//! history against what the store's capabilities declare.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leases::{StoreConfig, TokenDurability};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, getpgid};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::checker::{Counts, check};
use crate::history::{Event, Fault, mono_ns};
use crate::proxy::Proxy;
use crate::sink::Sink;

/// A fault the nemesis can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum FaultKind {
    /// No fault: the baseline (ignored next to other kinds).
    None,
    /// SIGSTOP the worker holding the key for over twice the TTL, then SIGCONT
    /// (a GC pause mid-job).
    Pause,
    /// `kill -9` the worker holding the key; a new process takes its slot.
    Crash,
    /// Black-hole every link between the holder and the store for over twice
    /// the TTL; heal by resuming (late packets) or resetting the connections.
    Partition,
    /// SIGSTOP the store's processes (`--store-pid`) for twice the TTL.
    StorePause,
    /// Black-hole a minority of the store's nodes from every worker for three
    /// TTLs (Redlock, or any store with several endpoints).
    Minority,
    /// Redis and Redlock: jump one node's clock forward by two TTLs while a
    /// holder holds, then back. On three or more nodes this is Kleppmann's
    /// Redlock scenario: another node is cut first, so the holder holds
    /// exactly a majority including the jumped node; the cut heals as the
    /// clock jumps. The jump is applied to the run's keys on that node (every
    /// expiry moves by the jump, as a real one moves them): Debian's
    /// redis-server links jemalloc, which libfaketime cannot run under
    /// (libfaketime#130).
    ClockJump,
    /// Redis and Redlock: one node loses the run's keys and counters, as a node
    /// restarted without persistence does, while a holder holds (on three or
    /// more nodes with another node cut first, as for clock-jump).
    NodeWipe,
    /// A replicated store ([`run_with_members`]): `kill -9` the leader (for
    /// Redlock, a node) while a holder holds, and restart it on its own data
    /// two TTLs later.
    LeaderKill,
    /// A replicated store ([`run_with_members`]): SIGSTOP the leader for two
    /// TTLs while a holder holds, then SIGCONT: the others elect a new
    /// leader, and the old one wakes up thinking it still leads.
    LeaderPause,
}

/// The members of a replicated store, for the nemesis's leader faults. The
/// calls block (they signal processes and ask the store who leads); the
/// run makes them off its runtime.
pub trait Members: Send {
    /// The member that leads now; for a store without a leader (Redlock),
    /// any member that runs.
    fn leader(&mut self) -> Option<usize>;
    /// `kill -9` of a member.
    fn kill(&mut self, member: usize);
    /// Starts a killed member again on its own data, and waits until the
    /// store is whole again.
    fn restart(&mut self, member: usize);
    /// SIGSTOP of a member.
    fn freeze(&mut self, member: usize);
    /// SIGCONT of a frozen member.
    fn thaw(&mut self, member: usize);
}

type SharedMembers = Arc<std::sync::Mutex<Box<dyn Members>>>;

/// Runs `f` on the members, off the runtime.
async fn on_members<T: Send + 'static>(
    members: &SharedMembers,
    f: impl FnOnce(&mut dyn Members) -> T + Send + 'static,
) -> Result<T, String> {
    let m = Arc::clone(members);
    tokio::task::spawn_blocking(move || {
        let mut guard = m.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f(guard.as_mut())
    })
    .await
    .map_err(|e| format!("a member fault failed: {e}"))
}

impl FaultKind {
    /// The name used in reports (`pause`, `store-pause`, ...).
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::None => "none",
            FaultKind::Pause => "pause",
            FaultKind::Crash => "crash",
            FaultKind::Partition => "partition",
            FaultKind::StorePause => "store-pause",
            FaultKind::Minority => "minority",
            FaultKind::ClockJump => "clock-jump",
            FaultKind::NodeWipe => "node-wipe",
            FaultKind::LeaderKill => "leader-kill",
            FaultKind::LeaderPause => "leader-pause",
        }
    }
}

/// How to run one chaos cell: the store and the [`ChaosOptions`].
#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// The store URL (any form `lease` accepts except memory://, which cannot
    /// coordinate processes).
    #[arg(long, env = "LEASE_STORE")]
    pub store: String,
    /// The lease namespace of the run's key.
    #[arg(long, default_value = "lease-chaos")]
    pub namespace: String,
    /// Everything else.
    #[command(flatten)]
    pub options: ChaosOptions,
}

/// The options of a chaos cell apart from the store (the `lease` command
/// takes the store from its own configuration).
#[derive(Clone, Debug, clap::Args)]
pub struct ChaosOptions {
    /// Worker processes competing for the key.
    #[arg(long, default_value_t = 8)]
    pub workers: u32,
    /// The lease TTL (raised to the store's smallest).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// How long the run lasts; up to twice as long while a fault asked for
    /// has not been injected yet (no holder to aim it at).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// End the run once this many leases were granted (within --duration).
    #[arg(long)]
    pub acquisitions: Option<u64>,
    /// Faults to inject, comma-separated; empty for none.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "pause,crash,partition"
    )]
    pub faults: Vec<FaultKind>,
    /// The mean time between faults.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub fault_every: Duration,
    /// The seed of the schedule (default: random, printed in the report).
    #[arg(long)]
    pub seed: Option<u64>,
    /// PIDs of the store's processes, for store-pause (their process group is
    /// signalled when they lead one).
    #[arg(long = "store-pid")]
    pub store_pids: Vec<i32>,
    /// The sink accepts every write: shows what the fence prevents.
    #[arg(long)]
    pub unfenced: bool,
    /// The share of rounds held by a renewing guard beyond the TTL.
    #[arg(long, default_value_t = 0.02)]
    pub long_share: f64,
    /// The job's length in a short round.
    #[arg(long, default_value = "2ms", value_parser = humantime::parse_duration)]
    pub job: Duration,
    /// Where the worker logs go (default: a fresh temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The outcome of one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// The backend's name, from its capabilities.
    pub backend: String,
    /// The store URL, passwords redacted.
    pub store: String,
    /// A label for the cell (the faults, or `none`).
    pub cell: String,
    /// The faults requested.
    pub faults: Vec<String>,
    /// The seed.
    pub seed: u64,
    /// Worker processes.
    pub workers: u32,
    /// The TTL used, in ms.
    pub ttl_ms: u64,
    /// How long the run took, in seconds.
    pub seconds: f64,
    /// Whether the sink fenced.
    pub fenced: bool,
    /// What the backend declares about its tokens.
    pub token_durability: String,
    /// What the checker counted.
    pub counts: Counts,
    /// Faults injected, by kind.
    pub injected: BTreeMap<String, u64>,
    /// Where the backend broke what it declares; empty when it held.
    pub violations: Vec<String>,
    /// What went wrong but is what the backend declares for the faults
    /// injected (a clock jump on a wall-clock store, a node that lost its
    /// counters on a store whose tokens are not durable).
    #[serde(default)]
    pub declared: Vec<String>,
}

impl Report {
    /// True when nothing the capabilities declare was broken.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// A short human summary.
    pub fn text(&self) -> String {
        let c = &self.counts;
        let median = c
            .recovery_ms
            .get(c.recovery_ms.len() / 2)
            .copied()
            .unwrap_or(0.0);
        let max = c.recovery_ms.last().copied().unwrap_or(0.0);
        let mut out = format!(
            "{} [{}] seed {} · {} workers · TTL {} ms · {:.1} s · {}\n\
             grants {} · writes {} ({} accepted, {} sent stale)\n\
             unsafe windows {} ({:.0} ms) · validity overlaps {} · stale admitted {} · late admitted {}\n\
             token regressions {} · lost rounds {} · duplicated rounds {} · ack mismatches {}\n\
             availability {:.1}% · recovery median {:.0} ms, max {:.0} ms, unrecovered {} · injected {:?}\n",
            self.backend,
            self.cell,
            self.seed,
            self.workers,
            self.ttl_ms,
            self.seconds,
            if self.fenced {
                "fenced sink"
            } else {
                "UNFENCED sink"
            },
            c.grants,
            c.writes,
            c.accepted,
            c.stale_sent,
            c.unsafe_windows,
            c.unsafe_ms,
            c.validity_overlaps,
            c.stale_admitted,
            c.late_admitted,
            c.token_regressions,
            c.lost_rounds,
            c.duplicated_rounds,
            c.ack_mismatches,
            c.availability * 100.0,
            median,
            max,
            c.unrecovered,
            self.injected,
        );
        for d in &self.declared {
            out.push_str(&format!("DECLARED: {d}\n"));
        }
        if self.passed() {
            out.push_str("PASS: nothing the capabilities declare was broken\n");
        } else {
            for v in &self.violations {
                out.push_str(&format!("VIOLATION: {v}\n"));
            }
        }
        out
    }
}

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

struct Slot {
    inc: u32,
    child: Child,
    proxies: Vec<Proxy>,
    url: String,
}

/// Owns everything a run starts; dropping it thaws and kills what is left,
/// so a failed run never leaves a store or a worker frozen.
struct Run {
    slots: Vec<Slot>,
    store_pids: Vec<i32>,
    worker_cmd: Vec<OsString>,
    args: ChaosOptions,
    namespace: String,
    dir: PathBuf,
    key: String,
    ttl: Duration,
    seed: u64,
    sink_addr: SocketAddr,
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

fn signal_store(pid: i32, sig: Signal) {
    let p = Pid::from_raw(pid);
    if getpgid(Some(p)).is_ok_and(|g| g == p) {
        let _ = killpg(p, sig);
    } else {
        let _ = kill(p, sig);
    }
}

impl Run {
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
            .arg(format!("{}us", self.args.job.as_micros()))
            .arg("--long-share")
            .arg(self.args.long_share.to_string())
            .arg("--seed")
            .arg(self.seed.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start a worker ({}): {e}", exe.to_string_lossy()))
    }

    fn pid(&self, worker: u32) -> Option<Pid> {
        self.slots
            .get(worker as usize)
            .map(|s| Pid::from_raw(s.child.id() as i32))
    }

    /// Respawns workers that exited on their own (counted, not hidden).
    fn reap(&mut self, respawned: &mut u64) -> Result<(), String> {
        for w in 0..self.slots.len() {
            let exited = matches!(self.slots[w].child.try_wait(), Ok(Some(_)));
            if exited {
                *respawned += 1;
                self.restart(w as u32)?;
            }
        }
        Ok(())
    }

    fn restart(&mut self, worker: u32) -> Result<(), String> {
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

/// The command that starts a worker: this executable with its hidden
/// `chaos-worker` subcommand (both `lease-chaos` and `lease` have one).
///
/// # Errors
/// When the running executable cannot be found.
pub fn self_worker_command() -> Result<Vec<OsString>, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this program to start workers: {e}"))?;
    Ok(vec![exe.into(), "chaos-worker".into()])
}

/// Runs a cell with this executable as the worker, prints the report and
/// returns the exit code: 0 held, 1 violated, `Err` when the cell could not
/// run.
///
/// # Errors
/// As [`run`].
pub async fn run_and_print(args: RunArgs) -> Result<u8, String> {
    let report = run(args, self_worker_command()?).await?;
    print!("{}", report.text());
    Ok(if report.passed() { 0 } else { 1 })
}

/// Runs one chaos cell. `worker_cmd` is the program and leading arguments
/// that start a worker (e.g. this executable and its hidden worker
/// subcommand); the worker options follow them.
///
/// # Errors
/// A bad configuration (memory://, a fault the store cannot take, no store
/// PID for store-pause), a store that cannot be reached, or a worker that
/// cannot be started.
pub async fn run(args: RunArgs, worker_cmd: Vec<OsString>) -> Result<Report, String> {
    run_inner(args, worker_cmd, None).await
}

/// Like [`run`], on a replicated store whose `members` the leader faults
/// (`leader-kill`, `leader-pause`) act on.
///
/// # Errors
/// As [`run`].
pub async fn run_with_members(
    args: RunArgs,
    worker_cmd: Vec<OsString>,
    members: Box<dyn Members>,
) -> Result<Report, String> {
    run_inner(
        args,
        worker_cmd,
        Some(Arc::new(std::sync::Mutex::new(members))),
    )
    .await
}

async fn run_inner(
    args: RunArgs,
    worker_cmd: Vec<OsString>,
    members: Option<SharedMembers>,
) -> Result<Report, String> {
    let RunArgs {
        store,
        namespace,
        options: mut args,
    } = args;
    args.faults.retain(|f| *f != FaultKind::None);
    args.faults.sort();
    args.faults.dedup();
    let parsed = leases::Store::parse(&store).map_err(|e| e.to_string())?;
    if matches!(parsed, leases::Store::Memory) {
        return Err(
            "memory:// lives inside one process and cannot coordinate worker \
                    processes; point --store at a real store"
                .into(),
        );
    }
    if args.workers < 2 {
        return Err("--workers must be at least 2: a lease needs competition".into());
    }
    let hosts = Hosts::parse(&store);
    let nodes = hosts.as_ref().map_or(0, |h| h.hosts.len());
    for f in &args.faults {
        match f {
            FaultKind::Partition | FaultKind::Minority if nodes == 0 => {
                return Err(format!(
                    "{} needs a store reached over the network; {} has no host",
                    f.name(),
                    leases::redact(&store)
                ));
            }
            FaultKind::Minority if nodes < 3 => {
                return Err("minority needs a store of at least 3 nodes".into());
            }
            FaultKind::ClockJump | FaultKind::NodeWipe
                if !(store.starts_with("redis://") || store.starts_with("redlock://")) =>
            {
                return Err(format!(
                    "{} acts on Redis nodes directly: it needs a redis:// or redlock:// store",
                    f.name()
                ));
            }
            FaultKind::LeaderKill | FaultKind::LeaderPause if members.is_none() => {
                return Err(format!(
                    "{} needs a replicated store whose members the run controls (lease_chaos::run_with_members)",
                    f.name()
                ));
            }
            FaultKind::StorePause if args.store_pids.is_empty() => {
                return Err("store-pause needs the store's PIDs (--store-pid)".into());
            }
            _ => {}
        }
    }
    let probe = StoreConfig::new(store.clone())
        .namespace(namespace.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let caps = probe.capabilities().clone();
    let ttl = caps
        .grant_ttl(args.ttl.max(caps.min_ttl))
        .map_err(|e| e.to_string())?;
    let seed = args.seed.unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            std::env::temp_dir().join(format!("lease-chaos-{seed:016x}-{}", std::process::id()))
        }
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // One log per incarnation: a line torn by kill -9 cannot swallow the
    // next incarnation's first line. Logs of an earlier run in the same
    // directory go.
    for path in worker_logs(&dir) {
        let _ = std::fs::remove_file(path);
    }
    let sink = Sink::start(!args.unfenced)
        .await
        .map_err(|e| format!("cannot start the sink: {e}"))?;
    let key = format!("chaos-{seed:016x}-{:08x}", rand::random::<u32>());
    let mut targets = Vec::new();
    if let Some(h) = &hosts {
        for hp in &h.hosts {
            let addr = tokio::net::lookup_host(hp.as_str())
                .await
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| format!("cannot resolve the store host {hp}"))?;
            targets.push(addr);
        }
    }
    let mut run = Run {
        slots: Vec::new(),
        store_pids: args.store_pids.clone(),
        worker_cmd,
        args: args.clone(),
        namespace,
        dir: dir.clone(),
        key,
        ttl,
        seed,
        sink_addr: sink.addr(),
    };
    let start = mono_ns();
    // A step of the host's wall clock is no fault of the backend's: see judge.
    let wall_clock = crate::clock::WallClockWatch::start();
    for w in 0..args.workers {
        let mut proxies = Vec::new();
        for t in &targets {
            proxies.push(
                Proxy::start(*t)
                    .await
                    .map_err(|e| format!("cannot start a proxy: {e}"))?,
            );
        }
        let url = match &hosts {
            Some(h) => h.with(&proxies.iter().map(Proxy::addr).collect::<Vec<_>>()),
            None => store.clone(),
        };
        let child = run.spawn(w, 0, &url)?;
        run.slots.push(Slot {
            inc: 0,
            child,
            proxies,
            url,
        });
    }

    let deadline = tokio::time::Instant::now() + args.duration;
    // A run whose faults could not all be aimed by the deadline (no holder
    // at the moment, on a loaded machine) goes on until each was injected,
    // up to twice its duration: a fault never injected judges nothing.
    let hard_deadline = deadline + args.duration;
    let target = args.acquisitions.unwrap_or(u64::MAX);
    // SIGINT or SIGTERM ends the run the normal way: the fault in progress
    // heals (a frozen store is thawed), workers are stopped, then an error.
    let interrupted = Arc::new(AtomicBool::new(false));
    let listener = {
        let flag = Arc::clone(&interrupted);
        tokio::spawn(async move {
            let term = async {
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                () = term => {}
            }
            flag.store(true, Ordering::SeqCst);
        })
    };
    // The acquisitions target ends a run only once every fault asked for
    // was injected (the deadline still ends it): a short run that found no
    // holder to aim a fault at would otherwise judge nothing of it.
    let wanted: Vec<&'static str> = args
        .faults
        .iter()
        .filter(|k| **k != FaultKind::None)
        .map(|k| k.name())
        .collect();
    let over = |sink: &Sink, injected: &BTreeMap<String, u64>| {
        let now = tokio::time::Instant::now();
        let all_injected = wanted.iter().all(|k| injected.contains_key(*k));
        now >= hard_deadline
            || (now >= deadline && all_injected)
            || interrupted.load(Ordering::SeqCst)
            || (sink.grants() >= target && all_injected)
    };
    let mut faults: Vec<Fault> = Vec::new();
    let mut injected: BTreeMap<String, u64> = BTreeMap::new();
    let mut respawned = 0u64;
    let mut member_failures: Vec<String> = Vec::new();
    let mut cycle: Vec<FaultKind> = Vec::new();
    while !over(&sink, &injected) {
        let gap = if args.faults.is_empty() {
            Duration::from_millis(100)
        } else {
            args.fault_every.mul_f64(rng.random_range(0.5..1.5))
        };
        let until = tokio::time::Instant::now() + gap;
        while tokio::time::Instant::now() < until && !over(&sink, &injected) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            run.reap(&mut respawned)?;
        }
        if over(&sink, &injected) || args.faults.is_empty() {
            continue;
        }
        // Each kind once per cycle, in a shuffled order: every kind is
        // injected in a short run, and the schedule still comes from the seed.
        if cycle.is_empty() {
            cycle = args.faults.clone();
            cycle.shuffle(&mut rng);
        }
        let Some(kind) = cycle.pop() else {
            continue;
        };
        let jitter = ttl.mul_f64(rng.random_range(0.0..1.0));
        let fault = match kind {
            FaultKind::None => continue,
            FaultKind::Pause | FaultKind::Crash | FaultKind::Partition => {
                // No holder to aim at right now: the kind stays due and is
                // tried again after the next gap.
                let Some(victim) = pick_holder(&sink, ttl * 2).await else {
                    cycle.push(kind);
                    continue;
                };
                let Some(pid) = run.pid(victim) else {
                    cycle.push(kind);
                    continue;
                };
                let begin = mono_ns();
                let note = match kind {
                    FaultKind::Pause => {
                        let _ = kill(pid, Signal::SIGSTOP);
                        tokio::time::sleep(ttl * 2 + jitter).await;
                        let _ = kill(pid, Signal::SIGCONT);
                        String::new()
                    }
                    FaultKind::Crash => {
                        let _ = kill(pid, Signal::SIGKILL);
                        sink.forget(victim);
                        run.restart(victim)?;
                        String::new()
                    }
                    _ => {
                        let reset = rng.random_bool(0.5);
                        for p in &run.slots[victim as usize].proxies {
                            p.hole();
                        }
                        tokio::time::sleep(ttl * 2 + jitter).await;
                        for p in &run.slots[victim as usize].proxies {
                            p.heal(reset);
                        }
                        if reset { "reset" } else { "resume" }.to_string()
                    }
                };
                let end = if kind == FaultKind::Crash {
                    begin
                } else {
                    mono_ns()
                };
                Fault {
                    kind: kind.name().into(),
                    victim: Some(victim),
                    start: begin,
                    end,
                    note,
                }
            }
            FaultKind::LeaderKill | FaultKind::LeaderPause => {
                let Some(members) = &members else {
                    continue;
                };
                // While somebody holds: the fault lands mid-lease.
                if pick_holder(&sink, ttl * 2).await.is_none() {
                    continue;
                }
                let Some(leader) = on_members(members, |m| m.leader()).await? else {
                    continue;
                };
                let begin = mono_ns();
                let hit = if kind == FaultKind::LeaderKill {
                    on_members(members, move |m| m.kill(leader)).await
                } else {
                    on_members(members, move |m| m.freeze(leader)).await
                };
                tokio::time::sleep(ttl * 2 + jitter).await;
                // Recovery from a killed leader counts from the kill, as
                // for a crashed worker; from a frozen one, from the thaw.
                let end = if kind == FaultKind::LeaderKill {
                    begin
                } else {
                    mono_ns()
                };
                let healed = if kind == FaultKind::LeaderKill {
                    on_members(members, move |m| m.restart(leader)).await
                } else {
                    on_members(members, move |m| m.thaw(leader)).await
                };
                // A member that cannot be hit or brought back ends in the
                // report, not in an aborted run.
                for r in [hit, healed] {
                    if let Err(e) = r {
                        member_failures.push(format!("{} of member {leader}: {e}", kind.name()));
                    }
                }
                Fault {
                    kind: kind.name().into(),
                    victim: None,
                    start: begin,
                    end,
                    note: format!("member {leader}"),
                }
            }
            FaultKind::StorePause => {
                let begin = mono_ns();
                for &pid in &run.store_pids {
                    signal_store(pid, Signal::SIGSTOP);
                }
                tokio::time::sleep(ttl * 2 + jitter).await;
                for &pid in &run.store_pids {
                    signal_store(pid, Signal::SIGCONT);
                }
                Fault {
                    kind: kind.name().into(),
                    victim: None,
                    start: begin,
                    end: mono_ns(),
                    note: String::new(),
                }
            }
            FaultKind::Minority => {
                let minority = (nodes - 1) / 2;
                let first = rng.random_range(0..nodes);
                let cut: Vec<usize> = (0..minority).map(|i| (first + i) % nodes).collect();
                let reset = rng.random_bool(0.5);
                let begin = mono_ns();
                for s in &run.slots {
                    for &n in &cut {
                        s.proxies[n].hole();
                    }
                }
                tokio::time::sleep(ttl * 3 + jitter).await;
                for s in &run.slots {
                    for &n in &cut {
                        s.proxies[n].heal(reset);
                    }
                }
                Fault {
                    kind: kind.name().into(),
                    victim: None,
                    start: begin,
                    end: mono_ns(),
                    note: format!("nodes {cut:?}, {}", if reset { "reset" } else { "resume" }),
                }
            }
            FaultKind::ClockJump | FaultKind::NodeWipe => {
                let node_url = |i: usize| format!("redis://{}", targets[i]);
                let k = rng.random_range(0..nodes);
                let cut = (nodes >= 3).then(|| (k + 1 + rng.random_range(0..nodes - 1)) % nodes);
                let begin = mono_ns();
                if let Some(c) = cut {
                    for s in &run.slots {
                        s.proxies[c].hole();
                    }
                }
                // A holder whose grant came after the cut holds exactly a
                // majority that includes node k.
                let holder = pick_holder_since(&sink, begin, ttl * 4).await;
                let jump = ttl * 2;
                let acted = match holder {
                    Some(_) => shift_keys(&node_url(k), &run.key, kind, -(jump.as_millis() as i64))
                        .await
                        .map_err(|e| format!("{} on node {k}: {e}", kind.name())),
                    None => Ok(0),
                };
                if let Some(c) = cut {
                    for s in &run.slots {
                        s.proxies[c].heal(true);
                    }
                }
                let touched = acted?;
                if holder.is_none() || touched == 0 {
                    // The cut happened, the jump or wipe did not: recorded
                    // as what it was.
                    if let Some(c) = cut {
                        faults.push(Fault {
                            kind: FaultKind::Minority.name().into(),
                            victim: None,
                            start: begin,
                            end: mono_ns(),
                            note: format!("node {c} (no holder for {})", kind.name()),
                        });
                    }
                    continue;
                }
                tokio::time::sleep(ttl * 2 + jitter).await;
                if kind == FaultKind::ClockJump {
                    // And back: what was set during the jump lives longer.
                    shift_keys(&node_url(k), &run.key, kind, jump.as_millis() as i64)
                        .await
                        .map_err(|e| format!("clock-jump back on node {k}: {e}"))?;
                }
                Fault {
                    kind: kind.name().into(),
                    victim: None,
                    start: begin,
                    end: mono_ns(),
                    note: format!("node {k}, cut {cut:?}, {touched} keys"),
                }
            }
        };
        *injected.entry(fault.kind.clone()).or_default() += 1;
        faults.push(fault);
    }

    // The end: workers stop at their next report to the sink.
    let end = mono_ns();
    sink.stop();
    let grace = tokio::time::Instant::now() + ttl * 6 + Duration::from_secs(10);
    loop {
        let alive = run
            .slots
            .iter_mut()
            .map(|s| matches!(s.child.try_wait(), Ok(None)))
            .filter(|alive| *alive)
            .count();
        if alive == 0 || tokio::time::Instant::now() >= grace {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Workers still alive after the grace are killed first, so no write
    // lands after the records are read.
    drop(run);
    let records = sink.records();

    let mut events = Vec::new();
    for path in worker_logs(&dir) {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        // A line cut short by kill -9 does not parse and is skipped.
        events.extend(
            text.lines()
                .filter_map(|l| serde_json::from_str::<Event>(l).ok()),
        );
    }
    let steps = wall_clock.steps();
    if !steps.is_empty() {
        injected.insert("wall-clock steps (observed)".into(), steps.len() as u64);
    }
    faults.extend(steps);
    let counts = check(&events, &records, &faults, start, end);
    listener.abort();
    if interrupted.load(Ordering::SeqCst) {
        return Err("interrupted: the faults were healed and the workers stopped".into());
    }
    let (violations, declared) = judge(&counts, &caps, &injected, !args.unfenced);
    let mut violations = violations;
    violations.extend(
        member_failures
            .into_iter()
            .map(|f| format!("the nemesis failed: {f}")),
    );
    for f in &args.faults {
        if !injected.contains_key(f.name()) {
            violations.push(format!(
                "the fault {} was never injected (no holder to aim at, or the run was too short)",
                f.name()
            ));
        }
    }
    let mut names: Vec<String> = args.faults.iter().map(|f| f.name().to_string()).collect();
    names.sort();
    names.dedup();
    if respawned > 0 {
        injected.insert("worker exits (respawned)".into(), respawned);
    }
    let report = Report {
        backend: caps.backend.to_string(),
        store: leases::redact(&store),
        cell: if names.is_empty() {
            "none".into()
        } else {
            names.join("+")
        },
        faults: names,
        seed,
        workers: args.workers,
        ttl_ms: ttl.as_millis() as u64,
        seconds: (end - start) as f64 / 1e9,
        fenced: !args.unfenced,
        token_durability: match &caps.durable_tokens {
            TokenDurability::Durable(t) => format!("durable: {t}"),
            TokenDurability::Volatile(t) => format!("volatile: {t}"),
            TokenDurability::Unknown(t) => format!("unknown: {t}"),
            other => format!("{other:?}"),
        },
        counts,
        injected,
        violations,
        declared,
    };
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(report)
}

/// The worker logs in `dir`.
fn worker_logs(dir: &std::path::Path) -> Vec<PathBuf> {
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

/// Sorts what the checker counted into violations and declared behaviour.
fn judge(
    counts: &Counts,
    caps: &leases::Capabilities,
    injected: &BTreeMap<String, u64>,
    fenced: bool,
) -> (Vec<String>, Vec<String>) {
    let jumped = injected.contains_key(FaultKind::ClockJump.name())
        && caps.expiry_clock.follows_wall_clock();
    let wiped =
        injected.contains_key(FaultKind::NodeWipe.name()) && !caps.durable_tokens.is_durable();
    // A leader lost where the capabilities say a failover may hand a token
    // out again (a Redis replica promoted without the last writes).
    let reissued = (injected.contains_key(FaultKind::LeaderKill.name())
        || injected.contains_key(FaultKind::LeaderPause.name()))
        && caps
            .failover
            .as_ref()
            .is_some_and(|f| matches!(f.tokens, leases::FailoverTokens::MayRepeat(_)));
    let wiped_or_reissued = wiped || reissued;
    let mut found = Vec::new();
    if counts.grants == 0 {
        found.push(("no lease was ever granted".to_string(), false));
    }
    // Overlaps the host's wall clock explains (it stepped forward between
    // the two grants by at least the overlap) are what a backend whose
    // expiry follows that clock declares; only the rest are the backend's.
    let stepped = if caps.expiry_clock.follows_wall_clock() {
        counts.validity_overlaps_in_wall_steps
    } else {
        0
    };
    let mut declared = Vec::new();
    if stepped > 0 {
        declared.push(format!(
            "{stepped} times two workers held a lease they were entitled to trust at once: \
             declared, expiry follows a wall clock ({:?}) and the host's stepped forward \
             between the two grants by more than the overlap",
            caps.expiry_clock
        ));
    }
    if counts.validity_overlaps > stepped {
        found.push((
            format!(
                "{} times two workers held a lease they were entitled to trust at once ({:.0} ms)",
                counts.validity_overlaps - stepped,
                counts.validity_overlap_ms
            ),
            jumped || wiped_or_reissued,
        ));
    }
    if counts.token_regressions > 0 {
        found.push((
            format!(
                "{} grants got a token not greater than an earlier grant's",
                counts.token_regressions
            ),
            wiped_or_reissued,
        ));
    }
    if fenced && counts.stale_admitted > 0 {
        found.push((
            format!(
                "the fenced sink admitted {} stale writes",
                counts.stale_admitted
            ),
            wiped_or_reissued,
        ));
    }
    if fenced && counts.duplicated_rounds > 0 {
        found.push((
            format!(
                "{} tokens were accepted from two grants",
                counts.duplicated_rounds
            ),
            wiped_or_reissued,
        ));
    }
    if fenced && counts.ack_mismatches > 0 {
        found.push((
            format!(
                "{} acknowledged writes are missing from the sink",
                counts.ack_mismatches
            ),
            false,
        ));
    }
    if counts.lost_rounds > 0 {
        // A holder whose validity was cut short writes after its successor.
        found.push((
            format!(
                "{} writes of a valid holder were refused",
                counts.lost_rounds
            ),
            jumped || wiped_or_reissued,
        ));
    }
    let why = match (jumped, wiped, reissued) {
        (true, _, _) => format!(
            "expiry follows a wall clock ({:?}) and one jumped",
            caps.expiry_clock
        ),
        (_, true, _) => format!("tokens are not durable ({:?})", caps.durable_tokens),
        (_, _, true) => format!(
            "the leader was lost and a failover may reissue tokens ({:?})",
            caps.failover.as_ref().map(|f| &f.tokens)
        ),
        _ => String::new(),
    };
    let mut violations = Vec::new();
    for (text, excused) in found {
        if excused {
            declared.push(format!("{text}: declared, {why}"));
        } else {
            violations.push(text);
        }
    }
    (violations, declared)
}

/// The worker to aim at: one in a long hold if any says so within `within`,
/// else the newest holder.
async fn pick_holder(sink: &Sink, within: Duration) -> Option<u32> {
    let until = tokio::time::Instant::now() + within;
    loop {
        let holders = sink.holders();
        if let Some(h) = holders.iter().find(|h| h.long) {
            return Some(h.id.worker);
        }
        if tokio::time::Instant::now() >= until {
            // Whoever holds now, not whoever held when the wait began.
            return sink.holders().first().map(|h| h.id.worker);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Like [`pick_holder`], for a grant reported after `since` only: one in a
/// long hold if one comes within `within`, else the newest.
async fn pick_holder_since(sink: &Sink, since: u64, within: Duration) -> Option<u32> {
    let until = tokio::time::Instant::now() + within;
    loop {
        let holders = sink.holders();
        let fresh = || holders.iter().filter(|h| h.since > since);
        if let Some(h) = fresh().find(|h| h.long) {
            return Some(h.id.worker);
        }
        if tokio::time::Instant::now() >= until {
            return fresh().next().map(|h| h.id.worker);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Moves the expiry of every key of the run on one Redis node by `delta_ms`
/// (a clock jump of `-delta_ms`: keys whose time runs out are deleted, as the
/// node would expire them), or deletes them all (`NodeWipe`). Only keys that
/// contain the run's key are touched, so a shared node's other keys are not.
/// Returns how many keys it touched.
async fn shift_keys(node: &str, key: &str, kind: FaultKind, delta_ms: i64) -> Result<i64, String> {
    const SCRIPT: &str = r"
local n = 0
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
  if ARGV[3] == 'wipe' then
    redis.call('DEL', k)
    n = n + 1
  else
    local p = redis.call('PTTL', k)
    if p > 0 then
      local np = p + tonumber(ARGV[2])
      if np <= 0 then redis.call('DEL', k) else redis.call('PEXPIRE', k, np) end
      n = n + 1
    end
  end
end
return n";
    let client = redis::Client::open(node).map_err(|e| e.to_string())?;
    let mut conn = tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .map_err(|_| "the node did not answer".to_string())?
    .map_err(|e| e.to_string())?;
    let pattern = format!("*{key}*");
    let mode = if kind == FaultKind::NodeWipe {
        "wipe"
    } else {
        "shift"
    };
    let script = redis::Script::new(SCRIPT);
    let mut invocation = script.prepare_invoke();
    invocation.arg(pattern).arg(delta_ms).arg(mode);
    let call = invocation.invoke_async(&mut conn);
    tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .map_err(|_| "the node did not answer the script".to_string())?
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token regressions after a lost leader are declared only where the
    /// failover declaration says tokens may repeat.
    /// Overlaps inside a forward step of the host's wall clock are declared
    /// only for a backend whose expiry follows a wall clock; the others stay
    /// violations.
    #[test]
    fn overlaps_in_wall_clock_steps_are_declared_only_where_expiry_follows_one() {
        let counts = Counts {
            grants: 10,
            validity_overlaps: 2,
            validity_overlap_ms: 300.0,
            validity_overlaps_in_wall_steps: 1,
            ..Counts::default()
        };
        let caps =
            |clock| leases::Capabilities::new("x", clock, leases::Notifications::TimedRetryOnly);
        let none = BTreeMap::new();
        let (violations, declared) = judge(
            &counts,
            &caps(leases::ExpiryClock::StoreServer),
            &none,
            true,
        );
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].starts_with("1 times"), "{violations:?}");
        assert_eq!(declared.len(), 1, "{declared:?}");
        let (violations, declared) = judge(
            &counts,
            &caps(leases::ExpiryClock::ConsensusLeader),
            &none,
            true,
        );
        assert!(violations[0].starts_with("2 times"), "{violations:?}");
        assert!(declared.is_empty(), "{declared:?}");
        let all_stepped = Counts {
            validity_overlaps_in_wall_steps: 2,
            ..counts
        };
        let (violations, _) = judge(
            &all_stepped,
            &caps(leases::ExpiryClock::StoreServer),
            &none,
            true,
        );
        assert!(violations.is_empty(), "{violations:?}");
    }

    #[test]
    fn regressions_after_a_leader_fault_are_declared_only_for_may_repeat() {
        let counts = Counts {
            grants: 10,
            token_regressions: 3,
            ..Counts::default()
        };
        let injected: BTreeMap<String, u64> = [("leader-pause".to_string(), 1)].into();
        let caps = |tokens| {
            leases::Capabilities::new(
                "x",
                leases::ExpiryClock::StoreServer,
                leases::Notifications::TimedRetryOnly,
            )
            .with_failover(Some(leases::Failover::new(
                tokens,
                true,
                std::time::Duration::from_secs(5),
            )))
        };
        let may = caps(leases::FailoverTokens::MayRepeat("m".into()));
        let (violations, declared) = judge(&counts, &may, &injected, true);
        assert!(violations.is_empty(), "{violations:?}");
        assert_eq!(declared.len(), 1, "{declared:?}");
        let inc = caps(leases::FailoverTokens::Increasing("i".into()));
        let (violations, _) = judge(&counts, &inc, &injected, true);
        assert_eq!(violations.len(), 1, "{violations:?}");
        let (violations, _) = judge(&counts, &may, &BTreeMap::new(), true);
        assert_eq!(violations.len(), 1, "no leader fault: {violations:?}");
    }

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

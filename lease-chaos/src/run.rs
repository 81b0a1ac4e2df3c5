//! The controller: starts the sink, a proxy per (worker, store node) link and
//! K worker processes, runs the nemesis until the run ends, then checks the
//! history against what the store's capabilities declare. This is the entry
//! points and the top-level loop; the nemesis is in `faults`, the worker
//! processes in `workload`, the verdict in `report`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leases::{StoreConfig, TokenDurability};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::checker::check;
use crate::faults::{Injection, Nemesis, SharedMembers};
use crate::history::{Event, Fault, mono_ns};
use crate::report::judge;
use crate::sink::Sink;
use crate::workload::{Run, worker_logs};

pub use crate::faults::{FaultKind, Members};
pub use crate::report::Report;
pub use crate::workload::Hosts;

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
    /// has not been injected yet (no holder to aim it at) or fewer than
    /// --min-grants leases were granted.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// End the run once this many leases were granted (within --duration;
    /// raised to --min-grants).
    #[arg(long)]
    pub acquisitions: Option<u64>,
    /// Do not end the run at --duration before this many leases were
    /// granted (it still ends at twice --duration): a backend whose smallest
    /// TTL is long, or a loaded machine, grants fewer per second, and a run
    /// with too few grants judges little.
    #[arg(long, default_value_t = 0)]
    pub min_grants: u64,
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
    /// Take the key's read/write lease (C19) in every round: as a reader with
    /// this probability (0 < share < 1), else as the writer. Readers read
    /// through the sink with their writer epoch; the checker lets readers
    /// overlap and judges the token rule. 0 (the default): plain leases.
    #[arg(long, default_value_t = 0.0)]
    pub read_share: f64,
    /// Where the worker logs go (default: a fresh temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// A line naming the run this cell belongs to (its start, the machine,
    /// the store versions, the size), kept in the report; by default the
    /// date the cell ended.
    #[arg(long, default_value = "")]
    pub run_note: String,
    /// The store's topology when it is more than one process (e.g. `etcd3`);
    /// the report's cell label starts with it.
    #[arg(long)]
    pub topology: Option<String>,
}

/// When a run ends: at the hard deadline in any case; at the deadline once
/// every fault asked for was injected and at least `min_grants` leases were
/// granted; at `target` grants once every fault was injected.
#[derive(Clone, Copy, Debug)]
struct EndRule {
    deadline: tokio::time::Instant,
    hard_deadline: tokio::time::Instant,
    target: u64,
    min_grants: u64,
}

impl EndRule {
    /// The rule of a run that starts at `start`. A run whose faults could not
    /// all be aimed by the deadline (no holder at the moment, on a loaded
    /// machine), or that has fewer than `min_grants`, goes on up to twice
    /// its `duration`: a fault never injected judges nothing. An
    /// `acquisitions` target below `min_grants` is raised to it.
    fn new(
        start: tokio::time::Instant,
        duration: Duration,
        acquisitions: Option<u64>,
        min_grants: u64,
    ) -> Self {
        EndRule {
            deadline: start + duration,
            hard_deadline: start + duration * 2,
            target: acquisitions.map_or(u64::MAX, |a| a.max(min_grants)),
            min_grants,
        }
    }

    fn over(&self, now: tokio::time::Instant, grants: u64, all_injected: bool) -> bool {
        now >= self.hard_deadline
            || (now >= self.deadline && all_injected && grants >= self.min_grants)
            || (grants >= self.target && all_injected)
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
            FaultKind::LeaderKill | FaultKind::LeaderPause | FaultKind::LeaderIsolate
                if members.is_none() =>
            {
                return Err(format!(
                    "{} needs a replicated store whose members the run controls (lease_chaos::run_with_members)",
                    f.name()
                ));
            }
            FaultKind::LeaderIsolate
                if !members.as_ref().is_some_and(|m| {
                    m.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .can_isolate()
                }) =>
            {
                return Err(
                    "leader-isolate needs members whose links to each other the run controls (Members::can_isolate)"
                        .into(),
                );
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
    // One answered call first: some declarations come from what the live
    // store says (PostgreSQL's failover, read by its probe on the first
    // call; ZooKeeper's negotiated session), and the verdict judges by them.
    let warm = leases::LeaseKey::new("chaos-warm").map_err(|e| e.to_string())?;
    let warmed = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while let Err(e) = probe.inspect(&warm).await {
        if !e.is_transient() || tokio::time::Instant::now() >= warmed {
            return Err(format!("the store does not answer: {e}"));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let caps = probe.capabilities().clone();
    if !(0.0..1.0).contains(&args.read_share) {
        return Err("--read-share must be at least 0 and below 1 (some rounds must write)".into());
    }
    if args.read_share > 0.0 && !caps.shared_leases {
        return Err(format!(
            "--read-share needs read/write leases, which {} does not offer (Capabilities::shared_leases)",
            caps.backend
        ));
    }
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
        job: args.job,
        long_share: args.long_share,
        read_share: args.read_share,
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
    run.start_workers(args.workers, &targets, hosts.as_ref(), &store)
        .await?;

    let end = EndRule::new(
        tokio::time::Instant::now(),
        args.duration,
        args.acquisitions,
        args.min_grants,
    );
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
        let all_injected = wanted.iter().all(|k| injected.contains_key(*k));
        interrupted.load(Ordering::SeqCst)
            || end.over(tokio::time::Instant::now(), sink.grants(), all_injected)
    };
    let mut faults: Vec<Fault> = Vec::new();
    let mut injected: BTreeMap<String, u64> = BTreeMap::new();
    let mut respawned = 0u64;
    let mut cycle: Vec<FaultKind> = Vec::new();
    let mut nemesis = Nemesis {
        sink: &sink,
        ttl,
        nodes,
        targets,
        members,
        member_failures: Vec::new(),
    };
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
        match nemesis.inject(&mut run, kind, jitter, &mut rng).await? {
            Injection::Injected(fault) => {
                *injected.entry(fault.kind.clone()).or_default() += 1;
                faults.push(fault);
            }
            Injection::CutOnly(fault) => faults.push(fault),
            Injection::Retry => cycle.push(kind),
            Injection::Skipped => {}
        }
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
    // What a declared fault may still cause after its heal: a lease granted
    // before it stays valid up to a TTL, its successor comes after the
    // failover, and a holder cut short writes late for up to a TTL more.
    // A store that promotes nobody by itself (Patroni paused) declares no
    // bound: no failover to excuse anything after.
    let grace = (ttl * 2).saturating_add(
        caps.failover
            .as_ref()
            .map(|f| f.recovery)
            .filter(|r| *r < std::time::Duration::from_secs(24 * 3600))
            .unwrap_or(std::time::Duration::ZERO),
    );
    let grace = u64::try_from(grace.as_nanos()).unwrap_or(u64::MAX);
    let (violations, declared) = judge(&counts, &caps, &faults, grace, !args.unfenced);
    let mut violations = violations;
    violations.extend(
        nemesis
            .member_failures
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
        cell: format!(
            "{}{}{}",
            args.topology
                .as_ref()
                .map(|t| format!("{t}: "))
                .unwrap_or_default(),
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join("+")
            },
            if args.read_share > 0.0 {
                " (read/write)"
            } else {
                ""
            }
        ),
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
        run: run_label(&args.run_note),
    };
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(report)
}

/// The cell's run: `note` when there is one (`scripts/chaos` gives the
/// run's start, machine, versions and size), else the UTC date it ended.
fn run_label(note: &str) -> String {
    if !note.is_empty() {
        return note.to_owned();
    }
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    now.get(..10).unwrap_or(&now).to_owned()
}

#[cfg(test)]
mod tests {
    use super::EndRule;
    use std::time::Duration;
    use tokio::time::Instant;

    fn rule(min_grants: u64, target: u64) -> (EndRule, Instant) {
        let start = Instant::now();
        let target = (target != u64::MAX).then_some(target);
        let rule = EndRule::new(start, Duration::from_secs(15), target, min_grants);
        (rule, start)
    }

    #[test]
    fn a_run_short_of_its_minimum_grants_goes_on_past_the_deadline() {
        let (r, start) = rule(50, u64::MAX);
        let after_deadline = start + Duration::from_secs(16);
        assert!(!r.over(after_deadline, 37, true));
        assert!(r.over(after_deadline, 50, true));
        // Still bounded: the hard deadline ends it with whatever it has.
        assert!(r.over(start + Duration::from_secs(30), 37, true));
    }

    #[test]
    fn without_a_minimum_the_deadline_ends_a_run_once_every_fault_was_injected() {
        let (r, start) = rule(0, u64::MAX);
        assert!(!r.over(start + Duration::from_secs(14), 0, true));
        assert!(r.over(start + Duration::from_secs(15), 0, true));
        assert!(!r.over(start + Duration::from_secs(15), 0, false));
    }

    #[test]
    fn the_acquisitions_target_ends_a_run_early_once_every_fault_was_injected() {
        let (r, start) = rule(50, 600);
        assert!(r.over(start + Duration::from_secs(3), 600, true));
        assert!(!r.over(start + Duration::from_secs(3), 600, false));
        assert!(!r.over(start + Duration::from_secs(3), 599, true));
    }

    #[test]
    fn an_acquisitions_target_below_the_minimum_grants_is_raised_to_it() {
        let (r, start) = rule(50, 20);
        assert!(!r.over(start + Duration::from_secs(3), 20, true));
        assert!(r.over(start + Duration::from_secs(3), 50, true));
    }
}

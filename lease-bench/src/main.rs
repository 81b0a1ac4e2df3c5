//! `lease-bench`: every backend against the raw store commands and peer lock
//! implementations, in one run, on the loopback stores of `scripts/stores`.
//!
//! Full run: `scripts/bench` (writes docs/BENCHMARKS.md, docs/benchmarks.json
//! and SVG plots). CI runs `lease-bench --smoke` so it cannot rot.

mod across;
mod claims;
mod common;
mod fairness;
#[cfg(feature = "peers")]
mod peers;
mod proxy;
mod raw;
mod report;
mod sessions;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use leases::backend::{Hook, Layered, Op};
use leases::{
    AcquireOptions, LeaseGuard, LeaseKey, LeaseProvider, Result as LeaseResult, Store, TryAcquire,
    acquire,
};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

#[derive(Parser, Clone)]
#[command(about = "Benchmark lease backends against raw store commands and peer locks")]
struct Opts {
    /// Tiny counts, for CI: proves the benchmark runs, measures nothing worth reading.
    #[arg(long)]
    smoke: bool,
    /// Where to write BENCHMARKS.md, benchmarks.json and the plots.
    #[arg(long, default_value = "docs")]
    out: PathBuf,
    /// Backends to run (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memory,redis,redlock,postgres,etcd,zk,sqlite"
    )]
    backends: Vec<String>,
    /// Runs per backend; each figure is reported as the median run with the
    /// spread over all runs (a 2-core machine is noisy).
    #[arg(long)]
    runs: Option<usize>,
    /// Internal: run one backend once in this process and write its result
    /// as JSON here (the parent runs each backend in a fresh process, so RSS
    /// and caches are per backend).
    #[arg(long, hide = true)]
    child_json: Option<PathBuf>,
    /// Internal: be one of the processes of the across-processes contention
    /// run (a JSON `across::Spec`); writes its counts to --child-json.
    #[arg(long, hide = true)]
    contend_child: Option<String>,
    /// Leave out the many-held-leases section (minutes per backend, no
    /// latency figures). Without it, the section runs in the first run only.
    #[arg(long)]
    skip_many: bool,
    /// Keep the other backends' results from the report already in --out
    /// and replace only the backends run now (the report says which rows
    /// come from which run).
    #[arg(long)]
    merge: bool,
    /// Run only the sessions section: N leases held by one `LeaseSession` per
    /// backend (writes SESSIONS.md and sessions.json; see scripts/bench-sessions).
    #[arg(long)]
    sessions: bool,
    /// Run only the database-claims section on PostgreSQL: the lease table
    /// against advisory locks, a SKIP LOCKED job queue against a lease per
    /// job, and once-per-slot claims (writes CLAIMS.md and claims.json; see
    /// scripts/bench-claims).
    #[arg(long)]
    claims: bool,
    /// Run only the fairness section: 64 tasks on one key per backend, plain
    /// waiters against fair (FIFO) waiters (writes FAIRNESS.md and
    /// fairness.json; see scripts/bench-fairness).
    #[arg(long)]
    fairness: bool,
    /// Leases per session (default 100000; 500 with --smoke).
    #[arg(long)]
    session_leases: Option<usize>,
    /// How long the session holds them, in seconds (default 300; 3 with --smoke).
    #[arg(long)]
    session_hold_secs: Option<u64>,
    /// The session's lease TTL, in seconds (default 30; 3 with --smoke, so
    /// the short hold still sees renewals).
    #[arg(long)]
    session_ttl_secs: Option<u64>,
}

/// Latency percentiles and throughput of one operation.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Stats {
    pub n: usize,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub ops_per_sec: f64,
    /// Sorted samples in microseconds, for the CDF plot (passed from the
    /// child process, left out of benchmarks.json).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples_us: Vec<f64>,
}

pub fn stats(samples: &[Duration]) -> Stats {
    let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    us.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        us.get(((us.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let total: f64 = us.iter().sum();
    Stats {
        n: us.len(),
        p50_us: pick(0.5),
        p90_us: pick(0.9),
        p99_us: pick(0.99),
        ops_per_sec: if total > 0.0 {
            us.len() as f64 / (total / 1e6)
        } else {
            0.0
        },
        samples_us: us,
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Contention {
    /// Tasks in all, spread evenly over `processes`.
    pub tasks: usize,
    /// Client processes the tasks run in (1: one process, one provider).
    #[serde(default = "one")]
    pub processes: usize,
    pub keys: usize,
    pub acquisitions_per_sec: f64,
    pub longest_wait_ms: f64,
}

fn one() -> usize {
    1
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Many {
    pub leases: usize,
    pub seconds: f64,
    pub renewals_per_sec: f64,
    pub store_calls_per_renewal_period: f64,
    pub lost: usize,
    pub cpu_seconds: f64,
    pub peak_rss_mib: f64,
}

/// Round trips per operation, counted on the wire by a proxy (see `proxy`):
/// acquire, extend, release; per node for Redlock.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RoundTrips {
    pub ours: [f64; 3],
    /// Acquire of a key never used before in this namespace.
    pub first_use: f64,
    pub raw: Option<[f64; 3]>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BackendResult {
    pub backend: String,
    pub raw_acquire_release: Option<Stats>,
    pub raw_handoff: Option<Stats>,
    pub round_trips: Option<RoundTrips>,
    /// Peak RSS of the process that ran this backend alone (MiB).
    pub peak_rss_mib: f64,
    pub acquire: Stats,
    pub release: Stats,
    pub extend: Stats,
    pub raw_name: Option<String>,
    pub raw_acquire: Option<Stats>,
    pub raw_release: Option<Stats>,
    pub raw_extend: Option<Stats>,
    pub peer_name: Option<String>,
    pub peer_acquire_release: Option<Stats>,
    pub acquire_release: Stats,
    pub handoff: Stats,
    pub peer_handoff: Option<Stats>,
    pub contention: Vec<Contention>,
    /// The same contention over the raw floor, where it can run across
    /// processes (`flock(2)` for SQLite).
    #[serde(default)]
    pub raw_contention: Vec<Contention>,
    pub many: Vec<Many>,
    /// Sections that failed, with the error; the rest of the run goes on.
    pub errors: Vec<String>,
}

/// Counts store calls that go through it: renewals, and tries (the herd a
/// release wakes, in the fairness section). A hook on [`Layered`].
#[derive(Debug, Default)]
pub(crate) struct Counting {
    pub(crate) extends: AtomicU64,
    pub(crate) tries: AtomicU64,
}

/// A provider whose store calls are counted.
pub(crate) type Counted = Layered<dyn LeaseProvider, Counting>;

impl Counting {
    pub(crate) fn new(inner: Arc<dyn LeaseProvider>) -> Counted {
        Layered::with_hook(inner, Counting::default())
    }
}

impl Hook for Counting {
    async fn before(&self, op: &Op<'_>) -> LeaseResult<()> {
        match op {
            Op::TryAcquire { .. } => {
                self.tries.fetch_add(1, Ordering::Relaxed);
            }
            Op::Extend { .. } | Op::ExtendMany { .. } => {
                self.extends.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        Ok(())
    }
}

/// A progress bar on stderr.
struct Progress {
    done: usize,
    total: usize,
}

impl Progress {
    fn step(&mut self, what: &str) {
        self.done += 1;
        let width = 30;
        let filled = (width * self.done / self.total.max(1)).min(width);
        eprint!(
            "\r[{}{}] {:>3}/{} {:<48}",
            "#".repeat(filled),
            ".".repeat(width - filled),
            self.done,
            self.total,
            what
        );
        if self.done == self.total {
            eprintln!();
        }
    }
}

fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        eprintln!("lease-bench: {var} is not set; run it through scripts/bench (or `scripts/stores up && eval \"$(scripts/stores env)\"`)");
        std::process::exit(2)
    })
}

fn store_url(backend: &str) -> String {
    match backend {
        "memory" => "memory://".into(),
        "redis" => env("LEASE_TEST_REDIS_URL"),
        "redlock" => format!(
            "redlock://{}",
            env("LEASE_TEST_REDLOCK_URLS").replace("redis://", "")
        ),
        "postgres" => env("LEASE_TEST_POSTGRES_URL"),
        "etcd" => env("LEASE_TEST_ETCD_URL").replace("http://", "etcd://"),
        "zk" => format!("zk://{}", env("LEASE_TEST_ZK_URL")),
        // A fresh file per process, beside the raw floor's lock files.
        "sqlite" => format!("sqlite://{}", raw::sqlite_dir().join("bench.db").display()),
        other => {
            eprintln!("lease-bench: unknown backend {other}");
            std::process::exit(2)
        }
    }
}

fn key(prefix: &str, i: usize) -> LeaseKey {
    // Prefix and index make a valid key; failure here is a bug in this program.
    LeaseKey::new(format!("{prefix}-{i}")).expect("valid benchmark key")
}

/// How many keys the uncontended rounds cycle through.
const REUSED_KEYS: usize = 16;

struct Sizes {
    ops: usize,
    handoffs: usize,
    contention: Duration,
    many: Vec<usize>,
    many_for: Duration,
}

async fn bench_backend(
    name: &str,
    sizes: &Sizes,
    progress: &mut Progress,
) -> LeaseResult<BackendResult> {
    let store = Store::parse(&store_url(name))?;
    let ns = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let memory = leases::MemoryStore::new();
    let build = || -> LeaseResult<Arc<dyn LeaseProvider>> {
        if store == Store::Memory {
            Ok(Arc::new(memory.provider(&ns)?))
        } else {
            store.build(&ns, Duration::from_secs(2), Duration::from_secs(5))
        }
    };
    let p = build()?;
    let ttl = p.capabilities().practical_ttl(Duration::from_secs(10));
    let mut r = BackendResult {
        backend: name.into(),
        ..BackendResult::default()
    };
    // Warm up connections, scripts, tables and the reused keys.
    for i in 0..REUSED_KEYS {
        if let Some(l) = p
            .try_acquire(&key("uncontended", i), ttl)
            .await?
            .into_lease()
        {
            p.release(&l).await?;
        }
    }

    progress.step(&format!("{name}: acquire, extend, release"));
    let (mut acq, mut ext, mut rel, mut both) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Keys are reused, as a service's resources are (a settlement batch, a
    // cron slice); each is free again when its turn comes.
    for i in 0..sizes.ops {
        let k = key("uncontended", i % REUSED_KEYS);
        let t = Instant::now();
        let lease = p
            .try_acquire(&k, ttl)
            .await?
            .into_lease()
            .ok_or_else(|| leases::LeaseError::protocol("held"))?;
        let t1 = Instant::now();
        let lease = p.extend(&lease, ttl).await?;
        let t2 = Instant::now();
        p.release(&lease).await?;
        let t3 = Instant::now();
        acq.push(t1 - t);
        ext.push(t2 - t1);
        rel.push(t3 - t2);
        both.push((t1 - t) + (t3 - t2));
    }
    r.acquire = stats(&acq);
    r.extend = stats(&ext);
    r.release = stats(&rel);
    r.acquire_release = stats(&both);

    progress.step(&format!("{name}: raw store commands"));
    if let Some(mut raw) = raw::raw_for(name, &store).await? {
        r.raw_name = Some(raw.name().into());
        let (mut acq, mut ext, mut rel) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..sizes.ops {
            let k = format!("{ns}-raw-{}", i % REUSED_KEYS);
            let t = Instant::now();
            raw.acquire(&k, ttl).await?;
            let t1 = Instant::now();
            raw.extend(&k, ttl).await?;
            let t2 = Instant::now();
            raw.release(&k).await?;
            let t3 = Instant::now();
            acq.push(t1 - t);
            ext.push(t2 - t1);
            rel.push(t3 - t2);
        }
        let both: Vec<Duration> = acq.iter().zip(&rel).map(|(a, b)| *a + *b).collect();
        r.raw_acquire = Some(stats(&acq));
        r.raw_extend = Some(stats(&ext));
        r.raw_release = Some(stats(&rel));
        r.raw_acquire_release = Some(stats(&both));
        progress.step(&format!("{name}: raw handoff"));
        r.raw_handoff = raw
            .handoff(&format!("{ns}-raw-handoff"), sizes.handoffs)
            .await?
            .map(|h| stats(&h));
    } else {
        progress.step(&format!("{name}: (no raw handoff)"));
    }

    progress.step(&format!("{name}: round trips on the wire"));
    // A file has no wire to count turns on.
    if !matches!(store, Store::Memory | Store::Sqlite(_)) {
        r.round_trips = Some(round_trips(name, &ns, ttl, sizes.ops.min(200)).await?);
    }

    progress.step(&format!("{name}: peer lock"));
    if let Some(mut peer) = raw::peer_for(name, &store).await? {
        r.peer_name = Some(peer.name().into());
        let mut both = Vec::new();
        for i in 0..sizes.ops {
            let k = format!("{ns}-peer-{}", i % REUSED_KEYS);
            let t = Instant::now();
            peer.lock(&k).await?;
            peer.unlock(&k).await?;
            both.push(t.elapsed());
        }
        r.peer_acquire_release = Some(stats(&both));
        progress.step(&format!("{name}: peer handoff"));
        r.peer_handoff = Some(stats(
            &peer
                .handoff(&format!("{ns}-peer-handoff"), sizes.handoffs)
                .await?,
        ));
    } else {
        progress.step(&format!("{name}: (no peer)"));
    }

    progress.step(&format!("{name}: handoff"));
    let waiter_p = build()?;
    let mut hand = Vec::new();
    let hk = key("handoff", 0);
    for _ in 0..sizes.handoffs {
        let held = p
            .try_acquire(&hk, ttl)
            .await?
            .into_lease()
            .ok_or_else(|| leases::LeaseError::protocol("held"))?;
        let (w, k) = (Arc::clone(&waiter_p), hk.clone());
        let waiter = tokio::spawn(async move {
            let got = acquire(
                &w,
                &k,
                AcquireOptions::ttl(ttl).wait(Duration::from_secs(30)),
            )
            .await;
            (Instant::now(), got)
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let t0 = Instant::now();
        p.release(&held).await?;
        let (t1, got) = waiter
            .await
            .map_err(|e| leases::LeaseError::protocol(e.to_string()))?;
        let lease = got?.ok_or_else(|| leases::LeaseError::protocol("waiter gave up"))?;
        hand.push(t1 - t0);
        waiter_p.release(&lease).await?;
    }
    r.handoff = stats(&hand);

    for keys in [1usize, 64] {
        progress.step(&format!("{name}: contention, 64 tasks on {keys} key(s)"));
        r.contention.push(
            contention(
                &p,
                &format!("contention-{keys}"),
                keys,
                ttl,
                sizes.contention,
            )
            .await?,
        );
    }

    if store == Store::Memory {
        // The in-memory store lives in one process.
        progress.step(&format!("{name}: (no contention across processes)"));
    } else {
        progress.step(&format!("{name}: contention, 64 tasks in 8 processes"));
        r.contention.push(
            across::contention(name, &ns, "contention-procs", 1, 8, ttl, sizes.contention).await?,
        );
        if matches!(store, Store::Sqlite(_)) {
            r.raw_contention.push(
                across::contention(
                    "flock",
                    &ns,
                    "contention-procs",
                    1,
                    8,
                    ttl,
                    sizes.contention,
                )
                .await?,
            );
        }
    }

    for &n in &sizes.many {
        progress.step(&format!("{name}: {n} held leases"));
        match many(&p, n, sizes.many_for).await {
            Ok(m) => r.many.push(m),
            Err(e) => r.errors.push(format!("{n} held leases: {e}")),
        }
    }
    r.peak_rss_mib = peak_rss_mib();
    Ok(r)
}

/// Acquire, extend and release of `n` keys each, through proxies that count
/// turns on the wire; ours and the raw floor.
async fn round_trips(name: &str, ns: &str, ttl: Duration, n: usize) -> LeaseResult<RoundTrips> {
    let (url, proxies) = proxy::proxied(&store_url(name)).await?;
    let store = Store::parse(&url)?;
    let p = store.build(
        &format!("{ns}-rt"),
        Duration::from_secs(2),
        Duration::from_secs(5),
    )?;
    let keys: Vec<LeaseKey> = (0..n).map(|i| key("rt", i)).collect();
    // Warm up: connections, scripts, statements, the table, and every key
    // (a key's first use costs more on ZooKeeper: its key node is created
    // once, see "first use" in the report).
    let mut first_use = 0.0;
    for k in &keys {
        let t = proxy::turns_per_node(&proxies);
        let got = p.try_acquire(k, ttl).await?.into_lease();
        first_use += proxy::turns_per_node(&proxies) - t;
        if let Some(l) = got {
            p.release(&l).await?;
        }
    }
    let first_use = first_use / n.max(1) as f64;
    let per_op = |before: f64| (proxy::turns_per_node(&proxies) - before) / n as f64;
    let t = proxy::turns_per_node(&proxies);
    let mut leases = Vec::with_capacity(n);
    for k in &keys {
        leases.push(
            p.try_acquire(k, ttl)
                .await?
                .into_lease()
                .ok_or_else(|| leases::LeaseError::protocol("held"))?,
        );
    }
    let acquire = per_op(t);
    let t = proxy::turns_per_node(&proxies);
    for l in &mut leases {
        *l = p.extend(l, ttl).await?;
    }
    let extend = per_op(t);
    let t = proxy::turns_per_node(&proxies);
    for l in &leases {
        p.release(l).await?;
    }
    let release = per_op(t);
    let raw = match raw::raw_for(name, &store).await? {
        Some(mut raw) => {
            let raw_keys: Vec<String> = (0..n).map(|i| format!("{ns}-rt-raw-{i}")).collect();
            for k in &raw_keys {
                raw.acquire(k, ttl).await?;
                raw.release(k).await?;
            }
            let mut out = [0.0; 3];
            for (phase, slot) in out.iter_mut().enumerate() {
                let t = proxy::turns_per_node(&proxies);
                for k in &raw_keys {
                    match phase {
                        0 => raw.acquire(k, ttl).await?,
                        1 => raw.extend(k, ttl).await?,
                        _ => raw.release(k).await?,
                    }
                }
                *slot = (proxy::turns_per_node(&proxies) - t) / n.max(1) as f64;
            }
            Some(out)
        }
        None => None,
    };
    Ok(RoundTrips {
        ours: [acquire, extend, release],
        first_use,
        raw,
    })
}

async fn contention(
    p: &Arc<dyn LeaseProvider>,
    prefix: &str,
    keys: usize,
    ttl: Duration,
    run_for: Duration,
) -> LeaseResult<Contention> {
    let tasks = 64;
    let started = Instant::now();
    let (count, longest_us) = contend(p, prefix, 0..tasks, keys, ttl, started + run_for).await;
    Ok(Contention {
        tasks,
        processes: 1,
        keys,
        acquisitions_per_sec: count as f64
            / started.elapsed().as_secs_f64().max(run_for.as_secs_f64()),
        longest_wait_ms: longest_us as f64 / 1000.0,
    })
}

/// Tasks numbered `tasks` each loop until `deadline`: wait for key
/// `task % keys`, hold it, release it. Returns the acquisitions and the
/// longest wait in microseconds.
pub(crate) async fn contend(
    p: &Arc<dyn LeaseProvider>,
    prefix: &str,
    tasks: std::ops::Range<usize>,
    keys: usize,
    ttl: Duration,
    deadline: Instant,
) -> (u64, u64) {
    let count = Arc::new(AtomicU64::new(0));
    let longest = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for t in tasks {
        let (p, count, longest) = (Arc::clone(p), Arc::clone(&count), Arc::clone(&longest));
        let k = key(prefix, t % keys.max(1));
        handles.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let started = Instant::now();
                let left = deadline.saturating_duration_since(started);
                match acquire(&p, &k, AcquireOptions::ttl(ttl).wait(left)).await {
                    Ok(Some(l)) => {
                        let waited = started.elapsed();
                        longest.fetch_max(
                            u64::try_from(waited.as_micros()).unwrap_or(u64::MAX),
                            Ordering::Relaxed,
                        );
                        count.fetch_add(1, Ordering::Relaxed);
                        let _ = p.release(&l).await;
                    }
                    Ok(None) => break,
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        }));
    }
    for h in handles {
        let _ = h.await;
    }
    (
        count.load(Ordering::Relaxed),
        longest.load(Ordering::Relaxed),
    )
}

pub(crate) fn proc_cpu_seconds() -> f64 {
    // utime + stime in clock ticks (100 per second on Linux).
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
            let u: f64 = after.get(11)?.parse().ok()?;
            let k: f64 = after.get(12)?.parse().ok()?;
            Some((u + k) / 100.0)
        })
        .unwrap_or(0.0)
}

pub(crate) fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib / 1024.0)
        })
        .unwrap_or(0.0)
}

async fn many(p: &Arc<dyn LeaseProvider>, n: usize, hold_for: Duration) -> LeaseResult<Many> {
    let counting = Arc::new(Counting::new(Arc::clone(p)));
    let ttl = p.capabilities().practical_ttl(Duration::from_secs(6));
    let mut guards = Vec::with_capacity(n);
    let mut failed = 0;
    for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
        let leases = futures_util::future::join_all(chunk.iter().map(|&i| {
            let c = Arc::clone(&counting);
            async move { c.try_acquire(&key("many", i), ttl).await }
        }))
        .await;
        for l in leases {
            match l {
                Ok(TryAcquire::Acquired(l)) => guards.push(LeaseGuard::new(
                    Arc::clone(&counting) as Arc<dyn LeaseProvider>,
                    l,
                )),
                _ => failed += 1,
            }
        }
    }
    let cpu0 = proc_cpu_seconds();
    counting.hook().extends.store(0, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(hold_for).await;
    let secs = started.elapsed().as_secs_f64();
    let renewals = counting.hook().extends.load(Ordering::Relaxed) as f64;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let cpu = proc_cpu_seconds() - cpu0;
    let period = (ttl / 3).as_secs_f64();
    for g in guards {
        let _ = g.release().await;
    }
    Ok(Many {
        leases: n - failed,
        seconds: secs,
        renewals_per_sec: renewals / secs,
        store_calls_per_renewal_period: renewals / secs * period,
        lost,
        cpu_seconds: cpu,
        peak_rss_mib: peak_rss_mib(),
    })
}

/// Runs one backend once in a fresh copy of this program and reads back its
/// result.
fn run_child<T: serde::de::DeserializeOwned>(
    backend: &str,
    smoke: bool,
    extra: &[String],
) -> Result<T, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let json = std::env::temp_dir().join(format!(
        "lease-bench-{}-{backend}.json",
        uuid::Uuid::new_v4().simple()
    ));
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--backends")
        .arg(backend)
        .arg("--child-json")
        .arg(&json);
    if smoke {
        cmd.arg("--smoke");
    }
    cmd.args(extra);
    let status = cmd.status().map_err(|e| e.to_string())?;
    let read = std::fs::read(&json);
    let _ = std::fs::remove_file(&json);
    if !status.success() {
        return Err(format!("its process ended with {status}"));
    }
    let bytes = read.map_err(|e| e.to_string())?;
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
}

/// A child's result, for the parent to read; exits on failure.
fn write_child_json<T: Serialize>(json: &std::path::Path, result: &T) {
    let written = serde_json::to_vec(result)
        .map_err(std::io::Error::other)
        .and_then(|bytes| std::fs::write(json, bytes));
    if let Err(e) = written {
        eprintln!("lease-bench: cannot write {}: {e}", json.display());
        std::process::exit(1);
    }
}

/// The sessions section alone: each backend in a fresh process.
async fn run_sessions(opts: &Opts) {
    let n = opts
        .session_leases
        .unwrap_or(if opts.smoke { 500 } else { 100_000 });
    let hold =
        Duration::from_secs(
            opts.session_hold_secs
                .unwrap_or(if opts.smoke { 4 } else { 300 }),
        );
    let ttl = Duration::from_secs(
        opts.session_ttl_secs
            .unwrap_or(if opts.smoke { 3 } else { 30 }),
    );
    if let Some(json) = &opts.child_json {
        let Some(b) = opts.backends.first() else {
            std::process::exit(2);
        };
        eprintln!("lease-bench: {b}: {n} leases in one session, held {hold:?}");
        let r = match sessions::run(b, &store_url(b), n, hold, ttl).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("lease-bench: {b} failed: {e}");
                std::process::exit(1);
            }
        };
        write_child_json(json, &r);
        return;
    }
    let extra = vec![
        "--sessions".to_string(),
        "--session-leases".to_string(),
        n.to_string(),
        "--session-hold-secs".to_string(),
        hold.as_secs().to_string(),
        "--session-ttl-secs".to_string(),
        ttl.as_secs().to_string(),
    ];
    let mut runs = Vec::new();
    let mut failed = false;
    for b in &opts.backends {
        match run_child::<sessions::SessionRun>(b, opts.smoke, &extra) {
            Ok(r) => runs.push(r),
            Err(e) => {
                eprintln!("lease-bench: {b} failed: {e}");
                failed = true;
            }
        }
    }
    if let Err(e) = sessions::write(&opts.out, &runs, opts.smoke) {
        eprintln!("lease-bench: cannot write the sessions report: {e}");
        std::process::exit(1);
    }
    eprintln!(
        "lease-bench: wrote {}",
        opts.out.join("SESSIONS.md").display()
    );
    let lost: u64 = runs.iter().map(|r| r.lost).sum();
    if failed || lost > 0 {
        eprintln!("lease-bench: {lost} lease(s) lost; see the report");
        std::process::exit(1);
    }
}

#[tokio::main]
async fn main() {
    let opts = Opts::parse();
    let sizes = if opts.smoke {
        Sizes {
            ops: 20,
            handoffs: 3,
            contention: Duration::from_millis(300),
            many: vec![20],
            many_for: Duration::from_millis(500),
        }
    } else {
        Sizes {
            ops: 2000,
            handoffs: 100,
            contention: Duration::from_secs(5),
            many: vec![1000, 10_000],
            many_for: Duration::from_secs(60),
        }
    };
    let sizes = if opts.skip_many {
        Sizes {
            many: Vec::new(),
            ..sizes
        }
    } else {
        sizes
    };
    if opts.sessions {
        run_sessions(&opts).await;
        return;
    }
    if opts.claims {
        if let Err(e) = claims::run(&store_url("postgres"), opts.smoke, &opts.out).await {
            eprintln!("lease-bench: claims: {e}");
            std::process::exit(1);
        }
        eprintln!(
            "lease-bench: wrote {}",
            opts.out.join("CLAIMS.md").display()
        );
        return;
    }
    if opts.fairness {
        if let Err(e) = fairness::run(&opts.backends, opts.smoke, &opts.out).await {
            eprintln!("lease-bench: fairness: {e}");
            std::process::exit(1);
        }
        eprintln!(
            "lease-bench: wrote {}",
            opts.out.join("FAIRNESS.md").display()
        );
        return;
    }
    if let (Some(spec), Some(json)) = (&opts.contend_child, &opts.child_json) {
        let counted = match serde_json::from_str(spec) {
            Ok(spec) => across::child(&spec).await,
            Err(e) => Err(raw::err(e)),
        };
        match counted {
            Ok(c) => write_child_json(json, &c),
            Err(e) => {
                eprintln!("lease-bench: contending process failed: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    if let Some(json) = &opts.child_json {
        // One backend, once, in this fresh process.
        let Some(b) = opts.backends.first() else {
            std::process::exit(2);
        };
        let mut progress = Progress {
            done: 0,
            total: 10 + sizes.many.len(),
        };
        let r = bench_backend(b, &sizes, &mut progress).await;
        // This process's SQLite database and lock files (its contenders,
        // children of its own, are done).
        if std::env::var_os(across::DIR_ENV).is_none() {
            let _ = std::fs::remove_dir_all(raw::sqlite_dir());
        }
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                eprintln!("\nlease-bench: {b} failed: {e}");
                std::process::exit(1);
            }
        };
        write_child_json(json, &r);
        return;
    }
    let runs = opts.runs.unwrap_or(if opts.smoke { 1 } else { 3 }).max(1);
    let load_start = report::load();
    // runs[i] holds every backend's result of run i.
    let mut all: Vec<Vec<BackendResult>> = Vec::new();
    let mut failures = Vec::new();
    for run in 0..runs {
        let mut this_run = Vec::new();
        for b in &opts.backends {
            eprintln!("lease-bench: run {}/{runs}, {b}", run + 1);
            let extra = if run > 0 || opts.skip_many {
                vec!["--skip-many".to_string()]
            } else {
                Vec::new()
            };
            match run_child::<BackendResult>(b, opts.smoke, &extra) {
                Ok(r) => this_run.push(r),
                Err(e) => {
                    eprintln!("lease-bench: {b} failed: {e}");
                    failures.push(format!("{b} (run {}): {e}", run + 1));
                }
            }
        }
        all.push(this_run);
    }
    let load_end = report::load();
    let mut backends = opts.backends.clone();
    let mut kept = None;
    if opts.merge {
        match report::merge_previous(&opts.out, &mut backends, &mut all) {
            Ok(k) => kept = Some(k),
            Err(e) => {
                eprintln!("lease-bench: cannot merge with the report in --out: {e}");
                std::process::exit(1);
            }
        }
    }
    let results = report::median_runs(&backends, &all);
    failures.extend(
        results
            .iter()
            .flat_map(|r| r.errors.iter().map(move |e| format!("{}: {e}", r.backend))),
    );
    let meta = report::Meta {
        runs,
        load_start,
        load_end,
        all: &all,
        kept,
    };
    if let Err(e) = report::write(&opts.out, &results, opts.smoke, &failures, &meta) {
        eprintln!("lease-bench: cannot write the report: {e}");
        std::process::exit(1);
    }
    eprintln!(
        "lease-bench: wrote {}",
        opts.out.join("BENCHMARKS.md").display()
    );
    if !failures.is_empty() {
        eprintln!(
            "lease-bench: {} section(s) failed; see the report",
            failures.len()
        );
        std::process::exit(1);
    }
}

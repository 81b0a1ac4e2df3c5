//! `lease-bench`: every backend against the raw store commands and peer lock
//! implementations, in one run, on the loopback stores of `scripts/stores`.
//!
//! Full run: `scripts/bench` (writes docs/BENCHMARKS.md, docs/benchmarks.json
//! and SVG plots). CI runs `lease-bench --smoke` so it cannot rot.

mod raw;
mod report;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use clap::Parser;
use lease::{
    AcquireOptions, Capabilities, Lease, LeaseGuard, LeaseInfo, LeaseKey, LeaseProvider,
    Result as LeaseResult, Store, TryAcquire, acquire,
};
use serde::Serialize;
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
        default_value = "memory,redis,redlock,postgres,etcd,zk"
    )]
    backends: Vec<String>,
}

/// Latency percentiles and throughput of one operation.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    pub n: usize,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub ops_per_sec: f64,
    /// Sorted samples in microseconds, for the CDF plot (not serialised).
    #[serde(skip)]
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

#[derive(Clone, Debug, Default, Serialize)]
pub struct Contention {
    pub tasks: usize,
    pub keys: usize,
    pub acquisitions_per_sec: f64,
    pub longest_wait_ms: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Many {
    pub leases: usize,
    pub seconds: f64,
    pub renewals_per_sec: f64,
    pub store_calls_per_renewal_period: f64,
    pub lost: usize,
    pub cpu_seconds: f64,
    pub peak_rss_mib: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct BackendResult {
    pub backend: String,
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
    pub many: Vec<Many>,
    /// Sections that failed, with the error; the rest of the run goes on.
    pub errors: Vec<String>,
}

/// Counts store calls that go through it.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn LeaseProvider>,
    extends: AtomicU64,
}

#[async_trait]
impl LeaseProvider for Counting {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    fn namespace(&self) -> &str {
        self.inner.namespace()
    }
    fn watch_reports_state(&self) -> bool {
        self.inner.watch_reports_state()
    }
    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> LeaseResult<TryAcquire> {
        self.inner.try_acquire(key, ttl).await
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> LeaseResult<Lease> {
        self.extends.fetch_add(1, Ordering::Relaxed);
        self.inner.extend(lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> LeaseResult<()> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> LeaseResult<Option<LeaseInfo>> {
        self.inner.inspect(key).await
    }
    async fn watch(&self, key: &LeaseKey) -> LeaseResult<Box<dyn lease::KeyWatch>> {
        self.inner.watch(key).await
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
    let memory = lease::MemoryStore::new();
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
    // Warm up connections, scripts, tables.
    for i in 0..20.min(sizes.ops) {
        if let Some(l) = p.try_acquire(&key("warm", i), ttl).await?.into_lease() {
            p.release(&l).await?;
        }
    }

    progress.step(&format!("{name}: acquire, extend, release"));
    let (mut acq, mut ext, mut rel, mut both) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..sizes.ops {
        let k = key("uncontended", i);
        let t = Instant::now();
        let lease = p
            .try_acquire(&k, ttl)
            .await?
            .into_lease()
            .ok_or_else(|| lease::LeaseError::protocol("held"))?;
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
            let k = format!("{ns}-raw-{i}");
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
        r.raw_acquire = Some(stats(&acq));
        r.raw_extend = Some(stats(&ext));
        r.raw_release = Some(stats(&rel));
    }

    progress.step(&format!("{name}: peer lock"));
    if let Some(mut peer) = raw::peer_for(name, &store).await? {
        r.peer_name = Some(peer.name().into());
        let mut both = Vec::new();
        for i in 0..sizes.ops {
            let k = format!("{ns}-peer-{i}");
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
            .ok_or_else(|| lease::LeaseError::protocol("held"))?;
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
            .map_err(|e| lease::LeaseError::protocol(e.to_string()))?;
        let lease = got?.ok_or_else(|| lease::LeaseError::protocol("waiter gave up"))?;
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

    for &n in &sizes.many {
        progress.step(&format!("{name}: {n} held leases"));
        match many(&p, n, sizes.many_for).await {
            Ok(m) => r.many.push(m),
            Err(e) => r.errors.push(format!("{n} held leases: {e}")),
        }
    }
    Ok(r)
}

async fn contention(
    p: &Arc<dyn LeaseProvider>,
    prefix: &str,
    keys: usize,
    ttl: Duration,
    run_for: Duration,
) -> LeaseResult<Contention> {
    let tasks = 64;
    let deadline = Instant::now() + run_for;
    let count = Arc::new(AtomicU64::new(0));
    let longest = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (p, count, longest) = (Arc::clone(p), Arc::clone(&count), Arc::clone(&longest));
        let k = key(prefix, t % keys);
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
    let started = Instant::now();
    for h in handles {
        let _ = h.await;
    }
    Ok(Contention {
        tasks,
        keys,
        acquisitions_per_sec: count.load(Ordering::Relaxed) as f64
            / started.elapsed().as_secs_f64().max(run_for.as_secs_f64()),
        longest_wait_ms: longest.load(Ordering::Relaxed) as f64 / 1000.0,
    })
}

fn proc_cpu_seconds() -> f64 {
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

fn peak_rss_mib() -> f64 {
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
    let counting = Arc::new(Counting {
        inner: Arc::clone(p),
        extends: AtomicU64::new(0),
    });
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
    counting.extends.store(0, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(hold_for).await;
    let secs = started.elapsed().as_secs_f64();
    let renewals = counting.extends.load(Ordering::Relaxed) as f64;
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
    let per_backend = 7 + sizes.many.len();
    let mut progress = Progress {
        done: 0,
        total: per_backend * opts.backends.len(),
    };
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for b in &opts.backends {
        match bench_backend(b, &sizes, &mut progress).await {
            Ok(r) => results.push(r),
            Err(e) => {
                eprintln!("\nlease-bench: {b} failed: {e}");
                failures.push(format!("{b}: {e}"));
            }
        }
    }
    failures.extend(
        results
            .iter()
            .flat_map(|r| r.errors.iter().map(move |e| format!("{}: {e}", r.backend))),
    );
    if let Err(e) = report::write(&opts.out, &results, opts.smoke, &failures) {
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

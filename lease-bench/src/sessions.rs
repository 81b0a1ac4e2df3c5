//! The sessions section: many leases held by one `LeaseSession` per backend,
//! each backend in a process of its own (peak RSS is per backend).

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use leases::{LeaseKey, LeaseProvider, LeaseSession, Result as LeaseResult, SessionConfig, Store};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::Opts;
use crate::child::{run_child, write_child_json};
use crate::measure::{peak_rss_mib, proc_cpu_seconds};
use crate::stores::store_url;

/// One backend's run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SessionRun {
    pub backend: String,
    pub asked: usize,
    pub leases: usize,
    pub failed_acquires: usize,
    pub acquire_per_sec: f64,
    pub ttl_s: f64,
    pub hold_s: f64,
    pub rounds: u64,
    pub renew_calls: u64,
    /// Renewal calls per round: each round renews every held lease, once per
    /// renewal period.
    pub calls_per_period: f64,
    /// The target: ceil(N / 1000) + 1.
    pub target_calls: u64,
    pub lost: u64,
    pub hold_cpu_seconds: f64,
    pub cpu_seconds: f64,
    pub client_peak_rss_mib: f64,
    /// RSS of the store's listening process(es) after the hold.
    pub store_rss_mib: Option<f64>,
    pub release_secs: f64,
}

/// How many acquires are in flight at once.
const ACQUIRE_CONCURRENCY: usize = 64;

pub async fn run(
    backend: &str,
    url: &str,
    n: usize,
    hold: Duration,
    ttl: Duration,
) -> LeaseResult<SessionRun> {
    let store = Store::parse(url)?;
    let ns = format!("sess-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let p: Arc<dyn LeaseProvider> = if store == Store::Memory {
        Arc::new(leases::MemoryProvider::new())
    } else {
        store.build(&ns, Duration::from_secs(2), Duration::from_secs(5))?
    };
    let ttl = p.capabilities().practical_ttl(ttl);
    let session = LeaseSession::open(Arc::clone(&p), SessionConfig::ttl(ttl)).await?;
    let cpu_start = proc_cpu_seconds();
    let started = Instant::now();
    let session_ref = &session;
    let results: Vec<_> = futures_util::stream::iter(0..n)
        .map(|i| async move {
            let key = LeaseKey::new(format!("s/{i}"))?;
            session_ref.try_acquire(&key).await
        })
        .buffer_unordered(
            std::env::var("LEASE_BENCH_ACQUIRE_CONCURRENCY")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(ACQUIRE_CONCURRENCY),
        )
        .collect()
        .await;
    let acquire_secs = started.elapsed().as_secs_f64();
    let mut held = Vec::with_capacity(n);
    let mut failed = 0;
    let mut first_error = None;
    for r in results {
        match r {
            Ok(Some(l)) => held.push(l),
            Ok(None) => failed += 1,
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    if let Some(e) = first_error {
        eprintln!("lease-bench: {backend}: {failed} acquires failed, first: {e}");
    }
    let before = session.stats();
    let cpu_hold_start = proc_cpu_seconds();
    tokio::time::sleep(hold).await;
    let after = session.stats();
    let hold_cpu = proc_cpu_seconds() - cpu_hold_start;
    let lost = held.iter().filter(|l| l.is_lost()).count() as u64;
    let store_rss = store_rss_mib(url);
    let rounds = after.rounds - before.rounds;
    let calls = after.renew_calls - before.renew_calls;
    let release_started = Instant::now();
    // Close first: it releases every lease still held (dropping the handles
    // first would release each in a background task instead).
    session.close().await;
    drop(held);
    let release_secs = release_started.elapsed().as_secs_f64();
    Ok(SessionRun {
        backend: backend.into(),
        asked: n,
        leases: n - failed,
        failed_acquires: failed,
        acquire_per_sec: (n - failed) as f64 / acquire_secs.max(1e-9),
        ttl_s: ttl.as_secs_f64(),
        hold_s: hold.as_secs_f64(),
        rounds,
        renew_calls: calls,
        calls_per_period: if rounds == 0 {
            0.0
        } else {
            calls as f64 / rounds as f64
        },
        target_calls: (n as u64).div_ceil(1000) + 1,
        lost,
        hold_cpu_seconds: hold_cpu,
        cpu_seconds: proc_cpu_seconds() - cpu_start,
        client_peak_rss_mib: peak_rss_mib(),
        store_rss_mib: store_rss,
        release_secs,
    })
}

/// The ports of a store URL (`host:port` items, comma-separated lists).
fn ports(url: &str) -> Vec<u16> {
    url.split([',', '/', '@', '?'])
        .filter_map(|part| part.rsplit_once(':')?.1.parse().ok())
        .collect()
}

/// Socket inodes listening on `port`, from /proc/net/tcp{,6}.
fn listening_inodes(port: u16) -> Vec<String> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let listening = *state == "0A";
            let on_port = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
                == Some(port);
            if listening && on_port {
                inodes.push((*inode).to_string());
            }
        }
    }
    inodes
}

/// The resident set of the processes listening on the store's ports (MiB).
fn store_rss_mib(url: &str) -> Option<f64> {
    let inodes: Vec<String> = ports(url)
        .into_iter()
        .flat_map(listening_inodes)
        .map(|i| format!("socket:[{i}]"))
        .collect();
    if inodes.is_empty() {
        return None;
    }
    let mut total = 0.0;
    let mut found = false;
    for proc_dir in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(fds) = std::fs::read_dir(proc_dir.path().join("fd")) else {
            continue;
        };
        let listens = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .map(|t| inodes.iter().any(|i| t.as_os_str() == i.as_str()))
                .unwrap_or(false)
        });
        if listens && let Some(rss) = vm_rss_mib(&proc_dir.path().join("status")) {
            total += rss;
            found = true;
        }
    }
    found.then_some(total)
}

fn vm_rss_mib(status: &Path) -> Option<f64> {
    let s = std::fs::read_to_string(status).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Writes docs/SESSIONS.md and docs/sessions.json.
pub fn write(out: &Path, runs: &[SessionRun], smoke: bool) -> std::io::Result<()> {
    std::fs::create_dir_all(out)?;
    let json = serde_json::to_vec_pretty(runs).map_err(std::io::Error::other)?;
    std::fs::write(out.join("sessions.json"), json)?;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Many leases in one session\n\nGenerated by `scripts/bench-sessions`{}. Each backend ran alone in a fresh process: `lease-bench --sessions`.\nOne `LeaseSession` per backend took N keys ({ACQUIRE_CONCURRENCY} acquires in flight), held them, then closed.\n",
        if smoke {
            " in smoke mode (tiny counts; nothing here is worth reading)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        md,
        "| backend | leases | acquires/s | TTL s | held s | lost | renewal calls per period (target) | CPU s while held | client peak RSS MiB | store RSS MiB | close s |"
    );
    let _ = writeln!(
        md,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in runs {
        let _ = writeln!(
            md,
            "| {} | {} of {} | {:.0} | {:.0} | {:.0} | {} | {:.1} (≤ {}) | {:.1} | {:.0} | {} | {:.1} |",
            r.backend,
            r.leases,
            r.asked,
            r.acquire_per_sec,
            r.ttl_s,
            r.hold_s,
            r.lost,
            r.calls_per_period,
            r.target_calls,
            r.hold_cpu_seconds,
            r.client_peak_rss_mib,
            r.store_rss_mib
                .map_or_else(|| "n/a".to_string(), |m| format!("{m:.0}")),
            r.release_secs,
        );
    }
    md.push_str(include_str!("sessions_notes.md"));
    std::fs::write(out.join("SESSIONS.md"), md)
}

/// The sessions section alone: each backend in a fresh process.
pub(crate) async fn run_sessions(opts: &Opts) {
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
        let r = match run(b, &store_url(b), n, hold, ttl).await {
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
        match run_child::<SessionRun>(b, opts.smoke, &extra) {
            Ok(r) => runs.push(r),
            Err(e) => {
                eprintln!("lease-bench: {b} failed: {e}");
                failed = true;
            }
        }
    }
    if let Err(e) = write(&opts.out, &runs, opts.smoke) {
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

//! The fairness section (`--fairness`): 64 tasks contend for one key, as
//! plain waiters (every release wakes them all, they race) and as fair
//! waiters (`AcquireOptions::fair`: a queue in the store, each woken by its
//! predecessor). Writes FAIRNESS.md and fairness.json.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use leases::{AcquireOptions, LeaseKey, LeaseProvider, Store, acquire};
use serde::Serialize;

use crate::measure::{Counted, Counting};
use tokio::time::Instant;

const TASKS: usize = 64;

/// One backend in one waiting mode.
#[derive(Debug, Serialize)]
pub struct Row {
    pub backend: String,
    pub mode: &'static str,
    pub tasks: usize,
    pub seconds: f64,
    pub acquisitions: u64,
    pub acquisitions_per_sec: f64,
    /// The longest a task waited, counting a wait the run's end cut short.
    pub longest_wait_ms: f64,
    pub p99_wait_ms: f64,
    /// Acquisitions of the task that got the fewest and of the one that got
    /// the most.
    pub fewest_per_task: u64,
    pub most_per_task: u64,
    /// `try_acquire` calls per acquisition: 1 when only the next waiter
    /// tries, far more when every release wakes a herd.
    pub tries_per_acquisition: f64,
}

/// Runs both modes on every backend and writes the report to `out`.
pub async fn run(backends: &[String], smoke: bool, out: &Path) -> Result<(), String> {
    let run_for = if smoke {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(10)
    };
    let mut rows = Vec::new();
    for b in backends {
        let store = Store::parse(&crate::stores::store_url(b)).map_err(|e| format!("{b}: {e}"))?;
        let ns = format!("fair-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let inner = store
            .build(&ns, Duration::from_secs(2), Duration::from_secs(5))
            .map_err(|e| format!("{b}: {e}"))?;
        let provider = Arc::new(Counting::new(inner));
        for fair in [false, true] {
            if fair && !provider.capabilities().fair_waiting {
                eprintln!("lease-bench: {b} offers no fair waiting");
                continue;
            }
            eprintln!(
                "lease-bench: {b}, {} waiters, {run_for:?}",
                if fair { "fair" } else { "plain" }
            );
            let row = contend(b, &provider, fair, run_for).await;
            if smoke && row.acquisitions == 0 {
                return Err(format!("{b}: no acquisition in the {} run", row.mode));
            }
            rows.push(row);
        }
    }
    write(out, &rows, smoke)
}

async fn contend(backend: &str, p: &Arc<Counted>, fair: bool, run_for: Duration) -> Row {
    let ttl = p.capabilities().practical_ttl(Duration::from_secs(10));
    let key = LeaseKey::new(format!(
        "contended-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ))
    .expect("a valid benchmark key");
    let tries_before = p.hook().tries.load(Ordering::Relaxed);
    let started = Instant::now();
    let deadline = started + run_for;
    let provider: Arc<dyn LeaseProvider> = Arc::clone(p) as Arc<dyn LeaseProvider>;
    let tasks = (0..TASKS).map(|_| {
        let (p, key) = (Arc::clone(&provider), key.clone());
        tokio::spawn(async move {
            let mut waits = Vec::new();
            let mut got = 0u64;
            while Instant::now() < deadline {
                let asked = Instant::now();
                let left = deadline.saturating_duration_since(asked);
                let mut options = AcquireOptions::ttl(ttl).wait(left);
                if fair {
                    options = options.fair();
                }
                match acquire(&p, &key, options).await {
                    Ok(Some(lease)) => {
                        waits.push(asked.elapsed());
                        got += 1;
                        let _ = p.release(&lease).await;
                    }
                    Ok(None) => {
                        // Cut short by the end of the run: still a wait.
                        waits.push(asked.elapsed());
                        break;
                    }
                    Err(e) => {
                        eprintln!("lease-bench: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            (got, waits)
        })
    });
    let mut per_task = Vec::new();
    let mut waits = Vec::new();
    for (got, w) in futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .flatten()
    {
        per_task.push(got);
        waits.extend(w);
    }
    let seconds = started.elapsed().as_secs_f64();
    let acquisitions: u64 = per_task.iter().sum();
    let tries = p.hook().tries.load(Ordering::Relaxed) - tries_before;
    waits.sort();
    let ms = |d: Option<&Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    let p99 = waits.get(waits.len().saturating_sub(1) * 99 / 100);
    Row {
        backend: backend.to_string(),
        mode: if fair { "fair" } else { "plain" },
        tasks: TASKS,
        seconds,
        acquisitions,
        acquisitions_per_sec: acquisitions as f64 / seconds.max(1e-9),
        longest_wait_ms: ms(waits.last()),
        p99_wait_ms: ms(p99),
        fewest_per_task: per_task.iter().copied().min().unwrap_or(0),
        most_per_task: per_task.iter().copied().max().unwrap_or(0),
        tries_per_acquisition: tries as f64 / (acquisitions.max(1)) as f64,
    }
}

fn write(out: &Path, rows: &[Row], smoke: bool) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
    let json = serde_json::to_string_pretty(rows).map_err(|e| e.to_string())?;
    std::fs::write(out.join("fairness.json"), json).map_err(|e| e.to_string())?;
    let mut md = String::new();
    let _ = writeln!(md, "# Fair waiting: 64 tasks on one key\n");
    if smoke {
        let _ = writeln!(
            md,
            "**Smoke run**: half a second per row; proves the section runs, measures nothing.\n"
        );
    }
    let _ = writeln!(
        md,
        "Written by `scripts/bench-fairness` (`lease-bench --fairness`). 64 tasks in one \
         process share one provider and loop for the run: acquire the key (waiting as long \
         as the run lasts), release it at once. *plain* waiters watch the key: every release \
         wakes all of them and they race. *fair* waiters (`AcquireOptions::fair`) queue in \
         the store and each is woken by its predecessor. The longest wait counts a wait the \
         end of the run cut short. *tries per acquisition* counts `try_acquire` calls: the \
         herd a release wakes.\n"
    );
    let _ = writeln!(
        md,
        "| backend | waiters | acquisitions/s | longest wait (ms) | p99 wait (ms) | fewest / most per task | tries per acquisition |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {:.0} | {:.0} | {} / {} | {:.1} |",
            r.backend,
            r.mode,
            r.acquisitions_per_sec,
            r.longest_wait_ms,
            r.p99_wait_ms,
            r.fewest_per_task,
            r.most_per_task,
            r.tries_per_acquisition
        );
    }
    std::fs::write(out.join("FAIRNESS.md"), md).map_err(|e| e.to_string())
}

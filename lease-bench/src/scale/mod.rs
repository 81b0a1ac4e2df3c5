//! The scaling section (`--scale`): throughput under concurrency. C tasks in
//! one process share one client (our provider, the raw floor's client, a peer
//! crate's client) and loop for a fixed time, each on its own key: take the
//! key, release it. For each C, each backend and each of the three: ops/s,
//! the p50 and p99 of one operation and the client CPU per operation, over
//! several runs. Writes scaling.json, scaling.svg and the scaling section of
//! BENCHMARKS.md (see scripts/bench-scale).

mod report;
mod targets;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use leases::{Result as LeaseResult, Store};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::measure::proc_cpu_seconds;
use targets::{Ours, Target, TaskKey};

/// What a scaling run measures.
pub struct Plan {
    /// The numbers of tasks, C.
    pub tasks: Vec<usize>,
    /// How long each (backend, target, C) cell runs.
    pub run_for: Duration,
    /// Runs of the whole matrix; a figure is the median run's, with the spread.
    pub runs: usize,
    pub smoke: bool,
    /// Only targets of these kinds; empty runs them all.
    pub kinds: Vec<String>,
}

/// One cell of one run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub run: usize,
    pub backend: String,
    /// `lease`, `raw` or `peer`.
    pub kind: String,
    pub what: String,
    pub tasks: usize,
    pub seconds: f64,
    /// Completed operations (the key taken and released).
    pub ops: u64,
    pub ops_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// This process's CPU time (user + system) per operation.
    pub cpu_us_per_op: f64,
    /// Operations that found the task's own key held (none are expected).
    pub held: u64,
    /// Operations that failed, and the first error's text.
    pub errors: u64,
    pub first_error: Option<String>,
}

/// Runs the matrix on `backends` and writes the report to `out`.
pub async fn run(backends: &[String], plan: &Plan, out: &Path) -> Result<(), String> {
    let load_start = crate::report::load();
    let mut rows = Vec::new();
    for run in 0..plan.runs {
        for b in backends {
            let store =
                Store::parse(&crate::stores::store_url(b)).map_err(|e| format!("{b}: {e}"))?;
            let all = targets_for(&store).await.map_err(|e| format!("{b}: {e}"))?;
            // Each C runs every target in turn, so drift over the run touches
            // all three alike.
            for &c in &plan.tasks {
                for t in &all {
                    if !plan.kinds.is_empty() && !plan.kinds.iter().any(|k| k == t.kind()) {
                        continue;
                    }
                    eprintln!(
                        "lease-bench: scale run {}/{}, {b} {} at {c} tasks",
                        run + 1,
                        plan.runs,
                        t.kind()
                    );
                    let row = measure(run, b, t, c, plan.run_for).await;
                    if let Some(e) = &row.first_error {
                        eprintln!(
                            "lease-bench: {b} {}: {} errors, first: {e}",
                            row.kind, row.errors
                        );
                    }
                    rows.push(row);
                }
            }
        }
    }
    let load_end = crate::report::load();
    let bad: Vec<String> = rows
        .iter()
        .filter(|r| r.errors > 0 || r.held > 0 || r.ops == 0)
        .map(|r| {
            format!(
                "{} {} at {} tasks: {} ops, {} held, {} errors",
                r.backend, r.kind, r.tasks, r.ops, r.held, r.errors
            )
        })
        .collect();
    report::write(
        out,
        &rows,
        &report::Meta {
            plan,
            load_start,
            load_end,
        },
    )
    .map_err(|e| format!("cannot write the report: {e}"))?;
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join("; "))
    }
}

/// Ours first, then the raw floor and the peers where the store has them.
async fn targets_for(store: &Store) -> LeaseResult<Vec<Arc<dyn Target>>> {
    let ns = format!("scale-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let provider = store.build(&ns, Duration::from_secs(2), Duration::from_secs(5))?;
    let ttl = provider
        .capabilities()
        .practical_ttl(Duration::from_secs(30));
    let mut all: Vec<Arc<dyn Target>> = vec![Arc::new(Ours {
        provider,
        ttl,
        bare: false,
    })];
    // The same provider without the observability layer (a span and a hook
    // around every call), where the adapter can be built here directly: the
    // difference is what that layer costs.
    let (connect, request) = (Duration::from_secs(2), Duration::from_secs(5));
    let bare: Option<Arc<dyn leases::LeaseProvider>> = match store {
        Store::Redis(url) => Some(Arc::new(lease_redis::RedisProvider::new(
            lease_redis::RedisConfig::new(url)
                .namespace(&ns)
                .timeouts(connect, request),
        )?)),
        Store::Redlock(urls) => Some(Arc::new(lease_redis::RedlockProvider::new(
            lease_redis::RedlockConfig::new(urls.clone())
                .namespace(&ns)
                .timeouts(connect, request),
        )?)),
        _ => None,
    };
    if let Some(provider) = bare {
        all.push(Arc::new(Ours {
            provider,
            ttl,
            bare: true,
        }));
    }
    all.extend(targets::others(store).await?);
    Ok(all)
}

/// `tasks` tasks loop on their own keys until `run_for` has passed.
async fn measure(
    run: usize,
    backend: &str,
    target: &Arc<dyn Target>,
    tasks: usize,
    run_for: Duration,
) -> Row {
    let prefix = format!(
        "scale-{}-{tasks}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let cpu_before = proc_cpu_seconds();
    let started = Instant::now();
    let deadline = started + run_for;
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let target = Arc::clone(target);
            let key = TaskKey::new(format!("{prefix}-{i}"));
            tokio::spawn(async move {
                let mut done = Task::default();
                let key = match key {
                    Ok(k) => k,
                    Err(e) => {
                        done.fail(e.to_string());
                        return done;
                    }
                };
                while Instant::now() < deadline {
                    let asked = Instant::now();
                    match target.cycle(&key).await {
                        Ok(true) => done
                            .took_us
                            .push(u32::try_from(asked.elapsed().as_micros()).unwrap_or(u32::MAX)),
                        Ok(false) => done.held += 1,
                        Err(e) => {
                            done.fail(e.to_string());
                            // A store that fails fast must not make this a busy loop.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                done
            })
        })
        .collect();
    let mut all = Task::default();
    for h in handles {
        match h.await {
            Ok(t) => all.merge(t),
            Err(e) => all.fail(format!("task: {e}")),
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = proc_cpu_seconds() - cpu_before;
    all.took_us.sort_unstable();
    let at = |q: usize| {
        let n = all.took_us.len();
        if n == 0 {
            0.0
        } else {
            f64::from(all.took_us[((n - 1) * q / 100).min(n - 1)]) / 1000.0
        }
    };
    let ops = all.took_us.len() as u64;
    Row {
        run,
        backend: backend.to_owned(),
        kind: target.kind().to_owned(),
        what: target.what().to_owned(),
        tasks,
        seconds,
        ops,
        ops_per_sec: ops as f64 / seconds.max(1e-9),
        p50_ms: at(50),
        p99_ms: at(99),
        cpu_us_per_op: cpu * 1e6 / (ops.max(1) as f64),
        held: all.held,
        errors: all.errors,
        first_error: all.first_error,
    }
}

/// What one task counted.
#[derive(Default)]
struct Task {
    took_us: Vec<u32>,
    held: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Task {
    fn fail(&mut self, e: String) {
        self.errors += 1;
        self.first_error.get_or_insert(e);
    }
    fn merge(&mut self, other: Task) {
        self.took_us.extend(other.took_us);
        self.held += other.held;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

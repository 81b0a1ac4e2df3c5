//! The database-claims section (`--claims`), on PostgreSQL and on MariaDB:
//! the lease table against the advisory-lock mode, a SKIP LOCKED job queue
//! against a lease per job, and once-per-slot claims. Writes CLAIMS.md and
//! claims.json.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use leases::{LeaseKey, LeaseProvider};
use serde::Serialize;
use tokio::time::Instant;

use crate::claims_db::{BoxErr, Db, JOB_LEASE};

/// Latency of acquire + release, uncontended.
#[derive(Debug, Serialize)]
pub struct PairRow {
    pub mode: String,
    pub ops: usize,
    pub p50_us: u64,
    pub p99_us: u64,
    pub per_sec: f64,
}

/// One way of working through a job table with many workers.
#[derive(Debug, Serialize)]
pub struct JobsRow {
    pub method: String,
    pub jobs: usize,
    pub workers: usize,
    pub seconds: f64,
    pub jobs_per_sec: f64,
    /// Store statements issued, per job.
    pub statements_per_job: f64,
    /// Every job was done by exactly one worker.
    pub exactly_once: bool,
}

/// Once-per-slot claims.
#[derive(Debug, Serialize)]
pub struct OnceRow {
    pub claims: usize,
    pub p50_us: u64,
    pub p99_us: u64,
    pub per_sec: f64,
    pub raced_slots: usize,
    pub racers: usize,
    /// Slots with exactly one winner among the racers.
    pub single_winner_slots: usize,
}

/// One store's figures.
#[derive(Debug, Serialize)]
pub struct StoreClaims {
    pub store: String,
    pub pairs: Vec<PairRow>,
    pub jobs: Vec<JobsRow>,
    pub once: OnceRow,
}

#[derive(Debug, Serialize)]
pub struct ClaimsReport {
    pub smoke: bool,
    pub stores: Vec<StoreClaims>,
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn namespace(what: &str) -> String {
    format!(
        "bench-{what}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

async fn pair(mode: &str, p: Arc<dyn LeaseProvider>, ops: usize) -> Result<PairRow, BoxErr> {
    let ttl = Duration::from_secs(30);
    let keys: Vec<LeaseKey> = (0..16)
        .map(|i| LeaseKey::new(format!("pair-{i}")))
        .collect::<Result<_, _>>()?;
    // Warm-up: connections, the table, the probe.
    for k in &keys {
        if let Some(l) = p.try_acquire(k, ttl).await?.into_lease() {
            p.release(&l).await?;
        }
    }
    let mut took = Vec::with_capacity(ops);
    let started = Instant::now();
    for i in 0..ops {
        let k = &keys[i % keys.len()];
        let t = Instant::now();
        let l = p
            .try_acquire(k, ttl)
            .await?
            .into_lease()
            .ok_or("an uncontended key was held")?;
        p.release(&l).await?;
        took.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
    }
    let secs = started.elapsed().as_secs_f64();
    took.sort_unstable();
    Ok(PairRow {
        mode: mode.into(),
        ops,
        p50_us: pct(&took, 0.5),
        p99_us: pct(&took, 0.99),
        per_sec: ops as f64 / secs,
    })
}

/// Workers claim `batch` rows at a time and complete them (deleting them).
async fn queue_run(db: &Db, jobs: usize, workers: usize, batch: usize) -> Result<JobsRow, BoxErr> {
    let table = namespace("jobs").replace('-', "_");
    db.job_table(&table, jobs).await?;
    let queue = Arc::new(
        db.queue(&namespace("queue"), &table, u32::try_from(workers)? + 2)
            .await?,
    );
    let done = Arc::new(AtomicUsize::new(0));
    let statements = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (queue, done, statements) = (
                Arc::clone(&queue),
                Arc::clone(&done),
                Arc::clone(&statements),
            );
            tokio::spawn(async move {
                while let Some(n) = queue.claim_and_complete(batch).await? {
                    statements.fetch_add(2, Ordering::Relaxed);
                    done.fetch_add(n, Ordering::Relaxed);
                }
                statements.fetch_add(1, Ordering::Relaxed);
                Ok::<_, leases::LeaseError>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let left = db.count(&table, "TRUE").await?;
    db.drop_table(&table).await?;
    Ok(JobsRow {
        method: format!("claim_next({batch}) + complete, SKIP LOCKED"),
        jobs,
        workers,
        seconds,
        jobs_per_sec: jobs as f64 / seconds,
        statements_per_job: statements.load(Ordering::Relaxed) as f64 / jobs as f64,
        exactly_once: left == 0 && done.load(Ordering::Relaxed) == jobs,
    })
}

/// Every worker walks the whole job list (from its own offset) and, for
/// each job not done yet, takes a lease on it, marks it done and releases:
/// the loop a lock service offers when workers poll one shared list.
async fn lease_per_job_run(db: &Db, jobs: usize, workers: usize) -> Result<JobsRow, BoxErr> {
    let table = namespace("jobs").replace('-', "_");
    db.job_table(&table, jobs).await?;
    let provider = db.lease_provider(&namespace("per-job"), u32::try_from(workers)? + 2)?;
    let done = Arc::new(AtomicUsize::new(0));
    let statements = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let (provider, db, table, done, statements) = (
                Arc::clone(&provider),
                db.clone(),
                table.clone(),
                Arc::clone(&done),
                Arc::clone(&statements),
            );
            tokio::spawn(async move {
                let offset = w * jobs / workers;
                for i in 0..jobs {
                    let id = i64::try_from((offset + i) % jobs + 1)?;
                    let finished = db.is_done(&table, id).await?;
                    statements.fetch_add(1, Ordering::Relaxed);
                    if finished {
                        continue;
                    }
                    let key = LeaseKey::new(format!("job-{id}"))?;
                    let lease = provider.try_acquire(&key, JOB_LEASE).await?;
                    statements.fetch_add(1, Ordering::Relaxed);
                    let Some(lease) = lease.into_lease() else {
                        continue;
                    };
                    let marked = db.mark_done(&table, id).await?;
                    provider.release(&lease).await?;
                    statements.fetch_add(2, Ordering::Relaxed);
                    done.fetch_add(usize::try_from(marked)?, Ordering::Relaxed);
                }
                Ok::<_, BoxErr>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let left = db.count(&table, "NOT done").await?;
    db.drop_table(&table).await?;
    Ok(JobsRow {
        method: "a lease per job (try_acquire, mark done, release)".into(),
        jobs,
        workers,
        seconds,
        jobs_per_sec: jobs as f64 / seconds,
        statements_per_job: statements.load(Ordering::Relaxed) as f64 / jobs as f64,
        exactly_once: left == 0 && done.load(Ordering::Relaxed) == jobs,
    })
}

async fn once_run(db: &Db, claims_n: usize, slots: usize) -> Result<OnceRow, BoxErr> {
    const RACERS: usize = 16;
    let claims = db.once(&namespace("once"), RACERS as u32 + 2).await?;
    let mut took = Vec::with_capacity(claims_n);
    let started = Instant::now();
    for i in 0..claims_n {
        let t = Instant::now();
        if !claims.claim("nightly", &format!("slot-{i}")).await? {
            return Err("a fresh slot was claimed already".into());
        }
        took.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
    }
    let secs = started.elapsed().as_secs_f64();
    took.sort_unstable();
    let mut single = 0;
    for s in 0..slots {
        let slot = format!("raced-{s}");
        let won = futures_util::future::join_all((0..RACERS).map(|_| {
            let (claims, slot) = (claims.clone(), slot.clone());
            async move { claims.claim("cron", &slot).await }
        }))
        .await;
        let mut winners = 0;
        for w in won {
            if w? {
                winners += 1;
            }
        }
        if winners == 1 {
            single += 1;
        }
    }
    Ok(OnceRow {
        claims: claims_n,
        p50_us: pct(&took, 0.5),
        p99_us: pct(&took, 0.99),
        per_sec: claims_n as f64 / secs,
        raced_slots: slots,
        racers: RACERS,
        single_winner_slots: single,
    })
}

/// One store's runs.
async fn store_run(db: &Db, smoke: bool) -> Result<StoreClaims, BoxErr> {
    let (ops, jobs, slots) = if smoke {
        (50, 500, 5)
    } else {
        (5_000, 20_000, 200)
    };
    let workers = 16;
    let store = db.name();
    eprintln!("lease-bench: claims: {store}: acquire + release, {ops} each");
    let mut pairs = Vec::new();
    for (mode, provider) in db.providers(&namespace("pair"))? {
        pairs.push(pair(&mode, provider, ops).await?);
    }
    eprintln!("lease-bench: claims: {store}: {jobs} jobs, {workers} workers");
    let per_job = jobs.min(if smoke { 200 } else { 5_000 });
    let jobs_rows = vec![
        queue_run(db, jobs, workers, 100).await?,
        queue_run(db, per_job, workers, 1).await?,
        lease_per_job_run(db, per_job, workers).await?,
    ];
    eprintln!("lease-bench: claims: {store}: once-per-slot");
    let once = once_run(db, ops, slots).await?;
    Ok(StoreClaims {
        store: store.into(),
        pairs,
        jobs: jobs_rows,
        once,
    })
}

/// Runs the section against PostgreSQL at `postgres` and MariaDB at
/// `mysql`, and writes CLAIMS.md and claims.json to `out`. Fails if any run
/// was not exactly once.
pub async fn run(postgres: &str, mysql: &str, smoke: bool, out: &Path) -> Result<(), BoxErr> {
    let mut stores = Vec::new();
    for db in [Db::postgres(postgres).await?, Db::mysql(mysql).await?] {
        stores.push(store_run(&db, smoke).await?);
    }
    let report = ClaimsReport { smoke, stores };
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("claims.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    std::fs::write(out.join("CLAIMS.md"), markdown(&report))?;
    let broken = report.stores.iter().any(|s| {
        s.jobs.iter().any(|j| !j.exactly_once) || s.once.single_winner_slots != s.once.raced_slots
    });
    if broken {
        return Err("a run did not process every job (or slot) exactly once; see CLAIMS.md".into());
    }
    Ok(())
}

fn markdown(r: &ClaimsReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Database claims on PostgreSQL and MariaDB\n");
    let _ = writeln!(
        s,
        "Written by `scripts/bench-claims` (lease-bench `--claims`, release build) against the\n\
         loopback PostgreSQL (fsync off) and MariaDB (`innodb_flush_log_at_trx_commit` 1) of\n\
         `scripts/stores` on a 2-core machine: compare the rows with each other, not with other\n\
         machines. Each figure is one run. \"Statements per job\" counts calls (a claim, a\n\
         completion, a lookup); a MariaDB claim is two round trips, a PostgreSQL claim one.{}\n",
        if r.smoke {
            " **Smoke run: tiny counts, not worth reading.**"
        } else {
            ""
        }
    );
    for store in &r.stores {
        store_markdown(&mut s, store);
    }
    s
}

fn store_markdown(s: &mut String, r: &StoreClaims) {
    let store = &r.store;
    let _ = writeln!(s, "## {store}: acquire + release, one key at a time\n");
    let _ = writeln!(s, "| mode | pairs | p50 µs | p99 µs | pairs/s |");
    let _ = writeln!(s, "| --- | --- | --- | --- | --- |");
    for p in &r.pairs {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.0} |",
            p.mode, p.ops, p.p50_us, p.p99_us, p.per_sec
        );
    }
    let _ = writeln!(s, "\n## {store}: working through a job table\n");
    let _ = writeln!(
        s,
        "| method | jobs | workers | seconds | jobs/s | statements per job | each job exactly once |"
    );
    let _ = writeln!(s, "| --- | --- | --- | --- | --- | --- | --- |");
    for j in &r.jobs {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {:.0} | {:.2} | {} |",
            j.method,
            j.jobs,
            j.workers,
            j.seconds,
            j.jobs_per_sec,
            j.statements_per_job,
            if j.exactly_once { "yes" } else { "**no**" }
        );
    }
    let o = &r.once;
    let _ = writeln!(s, "\n## {store}: once-per-slot claims\n");
    let _ = writeln!(
        s,
        "{} claims of fresh slots, one at a time: p50 {} µs, p99 {} µs, {:.0} claims/s.\n\
         {} slots raced by {} callers each: {} had exactly one winner.\n",
        o.claims, o.p50_us, o.p99_us, o.per_sec, o.raced_slots, o.racers, o.single_winner_slots
    );
}

//! `lease-bench`: every backend against the raw store commands and peer lock
//! implementations, in one run, on the loopback stores of `scripts/stores`.
//!
//! Full run: `scripts/bench` (writes docs/BENCHMARKS.md, docs/benchmarks.json
//! and SVG plots). CI runs `lease-bench --smoke` so it cannot rot.

mod across;
mod backend;
mod child;
mod claims;
mod claims_db;
mod common;
mod contention;
mod fairness;
mod measure;
#[cfg(feature = "peers")]
mod peers;
mod proxy;
mod raw;
mod raw_mysql;
mod report;
mod results;
mod scale;
mod sections;
mod sessions;
mod sets;
mod stores;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::backend::{Progress, Sizes, bench_backend};
use crate::child::{run_child, write_child_json};
use crate::results::BackendResult;
use crate::sessions::run_sessions;
use crate::stores::store_url;

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
        default_value = "memory,redis,redlock,postgres,mysql,etcd,zk,sqlite"
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
    /// Run only the database-claims section on PostgreSQL and MariaDB: the lease table
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
    /// Run only the scaling section: C tasks share one client, each looping
    /// take-and-release on its own key, for ours, the raw floor and the peer
    /// crates (writes scaling.json, scaling.svg and the scaling section of
    /// BENCHMARKS.md; see scripts/bench-scale).
    #[arg(long)]
    scale: bool,
    /// Sets of keys against one key, per backend (docs/SETS.md).
    #[arg(long)]
    sets: bool,
    /// The numbers of tasks the scaling section runs.
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    tasks: Vec<usize>,
    /// Seconds per scaling cell (default 5; 0.3 with --smoke).
    #[arg(long)]
    scale_secs: Option<f64>,
    /// Only these targets of the scaling section (`lease`, `raw`, `peer`),
    /// for profiling one of them alone; the report then has only their rows.
    #[arg(long, value_delimiter = ',')]
    scale_kinds: Vec<String>,
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
        if let Err(e) = claims::run(
            &store_url("postgres"),
            &store_url("mysql"),
            opts.smoke,
            &opts.out,
        )
        .await
        {
            eprintln!("lease-bench: claims: {e}");
            std::process::exit(1);
        }
        eprintln!(
            "lease-bench: wrote {}",
            opts.out.join("CLAIMS.md").display()
        );
        return;
    }
    if opts.sets {
        if let Err(e) = sets::run(&opts.backends, opts.smoke, &opts.out).await {
            eprintln!("lease-bench: sets: {e}");
            std::process::exit(1);
        }
        eprintln!("lease-bench: wrote {}", opts.out.join("SETS.md").display());
        return;
    }
    if opts.scale {
        let plan = scale::Plan {
            tasks: opts.tasks.iter().map(|&c| c.max(1)).collect(),
            run_for: Duration::from_secs_f64(
                opts.scale_secs
                    .unwrap_or(if opts.smoke { 0.3 } else { 5.0 })
                    .clamp(0.05, 3600.0),
            ),
            runs: opts.runs.unwrap_or(if opts.smoke { 1 } else { 3 }).max(1),
            smoke: opts.smoke,
            kinds: opts.scale_kinds.clone(),
        };
        if let Err(e) = scale::run(&opts.backends, &plan, &opts.out).await {
            eprintln!("lease-bench: scale: {e}");
            std::process::exit(1);
        }
        eprintln!(
            "lease-bench: wrote the scaling section of {}",
            opts.out.join("BENCHMARKS.md").display()
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

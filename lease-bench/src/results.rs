//! The results of a benchmark run, as the child processes hand them to the
//! parent and benchmarks.json keeps them: latency statistics, contention,
//! held leases, round trips, one backend's whole result.

use std::time::Duration;

use serde::{Deserialize, Serialize};

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

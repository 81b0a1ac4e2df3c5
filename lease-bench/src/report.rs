//! docs/BENCHMARKS.md, docs/benchmarks.json and SVG plots.

use std::fmt::Write as _;
use std::path::Path;

use crate::results::{BackendResult, Stats};

/// What the parent knows about the whole run.
pub struct Meta<'a> {
    pub runs: usize,
    pub load_start: String,
    pub load_end: String,
    /// Every run's results (run, then backend).
    pub all: &'a [Vec<BackendResult>],
    /// With `--merge`: the backends kept from the earlier report, and its date.
    pub kept: Option<(Vec<String>, String)>,
}

/// The order backends appear in, whichever run they come from.
const ORDER: [&str; 8] = [
    "memory", "redis", "redlock", "postgres", "mysql", "etcd", "zk", "sqlite",
];

/// Adds the earlier report's results (out/benchmarks.json) of every backend
/// not run now, run by run, to `all` and `backends`. Returns the kept
/// backends and the earlier report's date.
pub fn merge_previous(
    out: &Path,
    backends: &mut Vec<String>,
    all: &mut Vec<Vec<BackendResult>>,
) -> std::io::Result<(Vec<String>, String)> {
    let old: Vec<Vec<BackendResult>> =
        serde_json::from_slice(&std::fs::read(out.join("benchmarks.json"))?)
            .map_err(std::io::Error::other)?;
    let date = std::fs::read_to_string(out.join("BENCHMARKS.md"))
        .ok()
        .and_then(|md| {
            md.lines()
                .find_map(|l| l.strip_prefix("- Date: ").map(str::to_owned))
        })
        .unwrap_or_else(|| "an unknown date".into());
    let mut kept: Vec<String> = Vec::new();
    for (i, old_run) in old.into_iter().enumerate() {
        if all.len() <= i {
            all.push(Vec::new());
        }
        for r in old_run {
            if !backends.contains(&r.backend) {
                if !kept.contains(&r.backend) {
                    kept.push(r.backend.clone());
                }
                all[i].push(r);
            }
        }
    }
    backends.extend(kept.iter().cloned());
    let rank = |b: &String| ORDER.iter().position(|o| o == b).unwrap_or(ORDER.len());
    backends.sort_by_key(rank);
    for run in all.iter_mut() {
        run.sort_by_key(|r| rank(&r.backend));
    }
    Ok((kept, date))
}

/// The load averages (1, 5, 15 min) from /proc/loadavg.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// Per backend, the run whose acquire+release p50 is the median of its runs:
/// the detailed tables show that run, the spread table all of them.
pub fn median_runs(backends: &[String], all: &[Vec<BackendResult>]) -> Vec<BackendResult> {
    backends
        .iter()
        .filter_map(|b| {
            let mut runs: Vec<&BackendResult> = all
                .iter()
                .flat_map(|run| run.iter().filter(|r| &r.backend == b))
                .collect();
            runs.sort_by(|x, y| {
                x.acquire_release
                    .p50_us
                    .total_cmp(&y.acquire_release.p50_us)
            });
            runs.get(runs.len() / 2).map(|r| (*r).clone())
        })
        .collect()
}

/// "median [min-max]" of `f` over every run of `backend`, or "n/a".
fn spread(
    meta: &Meta<'_>,
    backend: &str,
    f: impl Fn(&BackendResult) -> Option<f64>,
) -> (Option<f64>, String) {
    let mut v: Vec<f64> = meta
        .all
        .iter()
        .flat_map(|run| run.iter().filter(|r| r.backend == backend))
        .filter_map(f)
        .collect();
    if v.is_empty() {
        return (None, "n/a".into());
    }
    v.sort_by(f64::total_cmp);
    let median = v[v.len() / 2];
    let (lo, hi) = (v[0], v[v.len() - 1]);
    let text = if v.len() > 1 {
        format!("{median:.0} [{lo:.0}-{hi:.0}]")
    } else {
        format!("{median:.0}")
    };
    (Some(median), text)
}

fn check(value: Option<f64>, bound: f64) -> String {
    match value {
        Some(v) if v <= bound => format!("{v:.2}x ✓"),
        Some(v) => format!("{v:.2}x ✗"),
        None => "n/a".into(),
    }
}

fn ratio(ours: &Stats, raw: Option<&Stats>) -> String {
    match raw {
        Some(r) if r.p50_us > 0.0 => format!("{:.2}x", ours.p50_us / r.p50_us),
        _ => "n/a".into(),
    }
}

fn lat(s: &Stats) -> String {
    format!("{:.0} / {:.0} / {:.0}", s.p50_us, s.p90_us, s.p99_us)
}

pub(crate) fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    format!("{cpus} cores ({model}), {mem:.0} GiB, Linux; stores on loopback")
}

pub(crate) fn today() -> String {
    std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map_or_else(|| "unknown date".into(), |s| s.trim().to_owned())
}

pub fn write(
    out: &Path,
    results: &[BackendResult],
    smoke: bool,
    failures: &[String],
    meta: &Meta<'_>,
) -> std::io::Result<()> {
    std::fs::create_dir_all(out)?;
    let strip = |r: &BackendResult| {
        let mut r = r.clone();
        for s in [
            Some(&mut r.acquire),
            Some(&mut r.release),
            Some(&mut r.extend),
            Some(&mut r.acquire_release),
            Some(&mut r.handoff),
            r.raw_acquire.as_mut(),
            r.raw_release.as_mut(),
            r.raw_extend.as_mut(),
            r.raw_acquire_release.as_mut(),
            r.raw_handoff.as_mut(),
            r.peer_acquire_release.as_mut(),
            r.peer_handoff.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            s.samples_us.clear();
        }
        r
    };
    let runs: Vec<Vec<BackendResult>> = meta
        .all
        .iter()
        .map(|run| run.iter().map(strip).collect())
        .collect();
    std::fs::write(
        out.join("benchmarks.json"),
        serde_json::to_string_pretty(&runs).map_err(std::io::Error::other)?,
    )?;
    // A merged report has no samples for the kept backends (benchmarks.json
    // leaves them out): the plots stay those of the earlier run.
    let replot = meta.kept.as_ref().is_none_or(|(kept, _)| kept.is_empty());
    if replot {
        std::fs::write(out.join("bench-latency-cdf.svg"), cdf_svg(results))?;
        std::fs::write(out.join("bench-handoff.svg"), handoff_svg(results))?;
    }

    let mut md = String::new();
    let _ = writeln!(md, "# Benchmarks\n");
    if smoke {
        let _ = writeln!(
            md,
            "> **Smoke run** (tiny counts): proves the benchmark works; the numbers mean nothing.\n"
        );
    }
    let _ = writeln!(
        md,
        "Regenerate with `scripts/bench` (starts the loopback stores, runs `cargo run --release -p lease-bench --features peers -- --out docs`).\n\n\
         - Machine: {}\n- Date: {}\n- lease {}; all latencies in microseconds (p50 / p90 / p99), one client task, uncontended unless said.\n\
         - {} run(s); each backend runs alone in a fresh process per run. The tables after the first show the median run of each backend (by acquire+release p50).\n\
         - Load average (1 / 5 / 15 min) at the start: {}; at the end: {}.\n",
        machine(),
        today(),
        env!("CARGO_PKG_VERSION"),
        meta.runs,
        meta.load_start,
        meta.load_end
    );
    if let Some((kept, date)) = &meta.kept
        && !kept.is_empty()
    {
        let _ = writeln!(
            md,
            "- Merged report: the rows of {} come from the earlier run of {date} (its load and run count); \
             the other rows were measured on the date above. Numbers of the two runs compare only roughly, \
             and the plots are the earlier run's.\n",
            kept.join(", ")
        );
    }
    let _ = writeln!(
        md,
        "![acquire latency CDF](bench-latency-cdf.svg)\n\n![handoff](bench-handoff.svg)\n"
    );
    if !failures.is_empty() {
        let _ = writeln!(
            md,
            "**Sections that failed in this run** (reported, not hidden):\n"
        );
        for f in failures {
            let _ = writeln!(md, "- {f}");
        }
        let _ = writeln!(md);
    }

    let _ = writeln!(
        md,
        "## 0. Targets, over every run: median [min-max] of the p50s, in microseconds\n"
    );
    let _ = writeln!(
        md,
        "Targets: acquire+release at most 1.2x the raw floor and at most 1.0x the peer crate; handoff at most 1.3x the raw handoff.\n"
    );
    let _ = writeln!(
        md,
        "| backend | ours acquire+release | raw | peer | ours / raw | ours / peer | ours handoff | raw handoff | peer handoff | handoff ours / raw |"
    );
    let _ = writeln!(
        md,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for r in results {
        let b = r.backend.as_str();
        let (ours, ours_t) = spread(meta, b, |r| Some(r.acquire_release.p50_us));
        let (raw, raw_t) = spread(meta, b, |r| {
            r.raw_acquire_release.as_ref().map(|s| s.p50_us)
        });
        let (peer, peer_t) = spread(meta, b, |r| {
            r.peer_acquire_release.as_ref().map(|s| s.p50_us)
        });
        let (hand, hand_t) = spread(meta, b, |r| Some(r.handoff.p50_us));
        let (raw_hand, raw_hand_t) = spread(meta, b, |r| r.raw_handoff.as_ref().map(|s| s.p50_us));
        let (_, peer_hand_t) = spread(meta, b, |r| r.peer_handoff.as_ref().map(|s| s.p50_us));
        let over = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        let _ = writeln!(
            md,
            "| {b} | {ours_t} | {raw_t} | {peer_t} | {} | {} | {hand_t} | {raw_hand_t} | {peer_hand_t} | {} |",
            check(over(ours, raw), 1.2),
            check(over(ours, peer), 1.0),
            check(over(hand, raw_hand), 1.3),
        );
    }

    let _ = writeln!(
        md,
        "\n## Round trips per operation, counted on the wire\n\n\
         A proxy in front of each store counts the times the client starts sending after the server last answered: \
         one per round trip, however the client splits its writes. Per node for Redlock. Acquire, extend, release.\n"
    );
    let _ = writeln!(
        md,
        "| backend | ours | ours, acquire of a key's first use | raw floor | peak RSS of the process (MiB) |"
    );
    let _ = writeln!(md, "| --- | --- | --- | --- | --- |");
    for r in results {
        let f = |x: [f64; 3]| format!("{:.2} / {:.2} / {:.2}", x[0], x[1], x[2]);
        let rt = r.round_trips.as_ref();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.0} |",
            r.backend,
            rt.map_or("n/a".into(), |t| f(t.ours)),
            rt.map_or("n/a".into(), |t| format!("{:.2}", t.first_use)),
            rt.and_then(|t| t.raw).map_or("n/a".into(), f),
            r.peak_rss_mib
        );
    }

    let _ = writeln!(
        md,
        "\n## 1-2. Uncontended operations, against the raw store commands\n"
    );
    let _ = writeln!(
        md,
        "| backend | acquire | extend | release | acquire+release ops/s | ours / raw (p50): acquire, extend, release | raw floor |"
    );
    let _ = writeln!(md, "| --- | --- | --- | --- | --- | --- | --- |");
    for r in results {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.0} | {}, {}, {} | {} |",
            r.backend,
            lat(&r.acquire),
            lat(&r.extend),
            lat(&r.release),
            r.acquire_release.ops_per_sec,
            ratio(&r.acquire, r.raw_acquire.as_ref()),
            ratio(&r.extend, r.raw_extend.as_ref()),
            ratio(&r.release, r.raw_release.as_ref()),
            r.raw_name.as_deref().unwrap_or("none (in-process)")
        );
    }

    let _ = writeln!(
        md,
        "\n## 3-4. Peers on the same store: acquire+release and handoff\n"
    );
    let _ = writeln!(
        md,
        "| backend | ours acquire+release | peer acquire+release | ours / peer | ours handoff | raw handoff | peer handoff | peer |"
    );
    let _ = writeln!(md, "| --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in results {
        let peer = r.peer_acquire_release.as_ref();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.backend,
            lat(&r.acquire_release),
            peer.map_or("n/a".into(), lat),
            ratio(&r.acquire_release, peer),
            lat(&r.handoff),
            r.raw_handoff.as_ref().map_or("n/a".into(), lat),
            r.peer_handoff.as_ref().map_or("n/a".into(), lat),
            r.peer_name.as_deref().unwrap_or("none")
        );
    }

    let _ = writeln!(md, "\n## 5. Contention: 64 tasks\n");
    let _ = writeln!(
        md,
        "Each task loops: wait for its key, release it at once. In one process the tasks share one provider; \
         across processes, 8 copies of the benchmark run 8 tasks each on their own providers, the way workers or cron \
         jobs on one host do. The flock(2) row is the one-host floor: the same loop over an exclusive `flock` on one \
         lock file, what `flock(1)` runs, with no TTL, token or lost signal.\n"
    );
    let _ = writeln!(
        md,
        "| backend | processes x tasks | keys | acquisitions/s | longest wait (ms) |"
    );
    let _ = writeln!(md, "| --- | --- | --- | --- | --- |");
    for r in results {
        let rows = r.contention.iter().map(|c| (r.backend.clone(), c)).chain(
            r.raw_contention
                .iter()
                .map(|c| (format!("{} floor: flock(2)", r.backend), c)),
        );
        for (name, c) in rows {
            let _ = writeln!(
                md,
                "| {name} | {} x {} | {} | {:.0} | {:.1} |",
                c.processes,
                c.tasks / c.processes.max(1),
                c.keys,
                c.acquisitions_per_sec,
                c.longest_wait_ms
            );
        }
    }
    let _ = writeln!(md, "\n## 6. Many held leases, renewed by guards\n");
    let _ = writeln!(
        md,
        "One `LeaseGuard` per lease, each renewing on its own. For many leases in one `LeaseSession` (100,000 per process, renewed in batches), see [SESSIONS.md](SESSIONS.md), written by `scripts/bench-sessions`.\n"
    );
    let _ = writeln!(
        md,
        "| backend | leases | held for (s) | renewals/s | store calls per renewal period | lost | client CPU (s) | peak RSS (MiB) |"
    );
    let _ = writeln!(md, "| --- | --- | --- | --- | --- | --- | --- | --- |");
    // Held leases run in the first run only.
    let first = meta.all.first().map_or(results, Vec::as_slice);
    for r in first {
        for m in &r.many {
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {:.0} | {} | {:.1} | {:.0} |",
                r.backend,
                m.leases,
                m.seconds,
                m.renewals_per_sec,
                m.store_calls_per_renewal_period,
                m.lost,
                m.cpu_seconds,
                m.peak_rss_mib
            );
        }
    }
    let _ = writeln!(
        md,
        "\nEach guard renews its own lease (one extend per lease per TTL/3) over the provider's shared connection or pool: \
         no connection per lease, but also no batching of renewals yet, so store calls per renewal period equal the number of \
         leases. Peak RSS is the high-water mark of the process that ran this backend alone."
    );
    if !smoke {
        // Judgement, not data: written by hand, read against the tables above.
        let _ = writeln!(md, "\n{}", include_str!("where_we_lose.md").trim_end());
    }
    // The scaling section comes from its own run (`--scale`): keep it.
    if let Some(section) = crate::sections::kept(out) {
        let _ = writeln!(md, "\n{section}");
    }
    std::fs::write(out.join("BENCHMARKS.md"), md)
}

const COLORS: [&str; 6] = [
    "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02",
];

fn cdf_svg(results: &[BackendResult]) -> String {
    let (w, h, left, bottom) = (720.0, 420.0, 60.0, 50.0);
    let max = results
        .iter()
        .filter_map(|r| r.acquire.samples_us.last().copied())
        .fold(1.0_f64, f64::max);
    let (lmin, lmax) = (1.0_f64.ln(), max.max(10.0).ln());
    let x = |us: f64| left + (us.max(1.0).ln() - lmin) / (lmax - lmin) * (w - left - 20.0);
    let y = |q: f64| (h - bottom) - q * (h - bottom - 20.0);
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\
         <rect width='100%' height='100%' fill='white'/>\
         <text x='{}' y='15' text-anchor='middle'>acquire latency CDF (log scale, microseconds)</text>",
        w / 2.0
    );
    let _ = write!(
        svg,
        "<line x1='{left}' y1='{}' x2='{}' y2='{}' stroke='black'/>",
        h - bottom,
        w - 20.0,
        h - bottom
    );
    let _ = write!(
        svg,
        "<line x1='{left}' y1='20' x2='{left}' y2='{}' stroke='black'/>",
        h - bottom
    );
    let mut tick = 1.0;
    while tick <= max * 10.0 {
        if tick >= 1.0 && tick <= max.max(10.0) {
            let _ = write!(
                svg,
                "<text x='{:.1}' y='{}' text-anchor='middle'>{tick}</text>",
                x(tick),
                h - bottom + 15.0
            );
        }
        tick *= 10.0;
    }
    for q in [0.0, 0.5, 0.9, 1.0] {
        let _ = write!(
            svg,
            "<text x='{}' y='{:.1}' text-anchor='end'>{q}</text>",
            left - 5.0,
            y(q) + 4.0
        );
    }
    for (i, r) in results.iter().enumerate() {
        let n = r.acquire.samples_us.len();
        if n == 0 {
            continue;
        }
        let points: Vec<String> = r
            .acquire
            .samples_us
            .iter()
            .enumerate()
            .step_by((n / 400).max(1))
            .map(|(k, us)| format!("{:.1},{:.1}", x(*us), y((k + 1) as f64 / n as f64)))
            .collect();
        let c = COLORS[i % COLORS.len()];
        let _ = write!(
            svg,
            "<polyline fill='none' stroke='{c}' stroke-width='2' points='{}'/>",
            points.join(" ")
        );
        let _ = write!(
            svg,
            "<text x='{}' y='{}' fill='{c}'>{}</text>",
            left + 10.0,
            35.0 + 15.0 * i as f64,
            r.backend
        );
    }
    svg.push_str("</svg>");
    svg
}

fn handoff_svg(results: &[BackendResult]) -> String {
    let (w, h, left, bottom) = (720.0, 420.0, 60.0, 60.0);
    let max = results
        .iter()
        .flat_map(|r| {
            [
                Some(r.handoff.p50_us),
                r.peer_handoff.as_ref().map(|p| p.p50_us),
            ]
        })
        .flatten()
        .fold(1.0_f64, f64::max);
    let group = (w - left - 20.0) / results.len().max(1) as f64;
    let bar = group / 3.0;
    let y = |us: f64| (h - bottom) - us / max * (h - bottom - 40.0);
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\
         <rect width='100%' height='100%' fill='white'/>\
         <text x='{}' y='15' text-anchor='middle'>handoff p50 (release to the waiter holding it), microseconds: ours (dark) vs peer (light)</text>",
        w / 2.0
    );
    let _ = write!(
        svg,
        "<line x1='{left}' y1='{}' x2='{}' y2='{}' stroke='black'/>",
        h - bottom,
        w - 20.0,
        h - bottom
    );
    for (i, r) in results.iter().enumerate() {
        let gx = left + group * i as f64 + bar / 2.0;
        let ours = r.handoff.p50_us;
        let _ = write!(
            svg,
            "<rect x='{gx:.1}' y='{:.1}' width='{bar:.1}' height='{:.1}' fill='#1b9e77'/>",
            y(ours),
            (h - bottom) - y(ours)
        );
        let _ = write!(
            svg,
            "<text x='{:.1}' y='{:.1}' text-anchor='middle'>{ours:.0}</text>",
            gx + bar / 2.0,
            y(ours) - 4.0
        );
        if let Some(p) = &r.peer_handoff {
            let px = gx + bar;
            let _ = write!(
                svg,
                "<rect x='{px:.1}' y='{:.1}' width='{bar:.1}' height='{:.1}' fill='#a6dba0'/>",
                y(p.p50_us),
                (h - bottom) - y(p.p50_us)
            );
            let _ = write!(
                svg,
                "<text x='{:.1}' y='{:.1}' text-anchor='middle'>{:.0}</text>",
                px + bar / 2.0,
                y(p.p50_us) - 4.0,
                p.p50_us
            );
        }
        let _ = write!(
            svg,
            "<text x='{:.1}' y='{}' text-anchor='middle'>{}</text>",
            gx + bar,
            h - bottom + 18.0,
            r.backend
        );
    }
    svg.push_str("</svg>");
    svg
}

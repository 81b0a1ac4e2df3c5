//! docs/BENCHMARKS.md, docs/benchmarks.json and SVG plots.

use std::fmt::Write as _;
use std::path::Path;

use crate::{BackendResult, Stats};

fn ratio(ours: &Stats, raw: Option<&Stats>) -> String {
    match raw {
        Some(r) if r.p50_us > 0.0 => format!("{:.2}x", ours.p50_us / r.p50_us),
        _ => "n/a".into(),
    }
}

fn lat(s: &Stats) -> String {
    format!("{:.0} / {:.0} / {:.0}", s.p50_us, s.p90_us, s.p99_us)
}

fn machine() -> String {
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

fn today() -> String {
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
) -> std::io::Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("benchmarks.json"),
        serde_json::to_string_pretty(results).map_err(std::io::Error::other)?,
    )?;
    std::fs::write(out.join("bench-latency-cdf.svg"), cdf_svg(results))?;
    std::fs::write(out.join("bench-handoff.svg"), handoff_svg(results))?;

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
        "Regenerate with `scripts/bench` (starts the loopback stores, runs `cargo run --release -p lease-bench -- --out docs`).\n\n\
         - Machine: {}\n- Date: {}\n- lease {}; all latencies in microseconds (p50 / p90 / p99), one client task, uncontended unless said.\n",
        machine(),
        today(),
        env!("CARGO_PKG_VERSION")
    );
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
        "## 1-2. Uncontended operations, against the raw store commands\n"
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
        "| backend | ours acquire+release | peer acquire+release | ours / peer | ours handoff | peer handoff | peer |"
    );
    let _ = writeln!(md, "| --- | --- | --- | --- | --- | --- | --- |");
    for r in results {
        let peer = r.peer_acquire_release.as_ref();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.backend,
            lat(&r.acquire_release),
            peer.map_or("n/a".into(), lat),
            ratio(&r.acquire_release, peer),
            lat(&r.handoff),
            r.peer_handoff.as_ref().map_or("n/a".into(), lat),
            r.peer_name.as_deref().unwrap_or("none")
        );
    }

    let _ = writeln!(md, "\n## 5. Contention: 64 tasks\n");
    let _ = writeln!(
        md,
        "| backend | keys | acquisitions/s | longest wait (ms) |"
    );
    let _ = writeln!(md, "| --- | --- | --- | --- |");
    for r in results {
        for c in &r.contention {
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.1} |",
                r.backend, c.keys, c.acquisitions_per_sec, c.longest_wait_ms
            );
        }
    }

    let _ = writeln!(md, "\n## 6. Many held leases, renewed by guards\n");
    let _ = writeln!(
        md,
        "| backend | leases | held for (s) | renewals/s | store calls per renewal period | lost | client CPU (s) | peak RSS (MiB) |"
    );
    let _ = writeln!(md, "| --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in results {
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
         leases. Peak RSS is the whole benchmark process's high-water mark."
    );
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

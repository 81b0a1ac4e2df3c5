//! The scaling section's report: scaling.json (every cell of every run),
//! scaling.svg (ops/s against tasks, log scales, one panel per backend) and
//! the scaling section of BENCHMARKS.md (see `crate::sections`).

use std::fmt::Write as _;
use std::path::Path;

use super::{Plan, Row};

const KINDS: [&str; 5] = ["lease", "bare", "raw", "protocol", "peer"];
const COLORS: [&str; 5] = ["#d95f02", "#e6ab02", "#1b9e77", "#66a61e", "#7570b3"];

pub(crate) struct Meta<'a> {
    pub(crate) plan: &'a Plan,
    pub(crate) load_start: String,
    pub(crate) load_end: String,
}

/// One cell over its runs: the run with the median ops/s, and the spread.
struct Cell<'a> {
    median: &'a Row,
    min: f64,
    max: f64,
    runs: usize,
}

fn cells<'a>(rows: &'a [Row]) -> Vec<Cell<'a>> {
    let mut keys: Vec<(&str, &str, usize)> = Vec::new();
    for r in rows {
        let k = (r.backend.as_str(), r.kind.as_str(), r.tasks);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .filter_map(|(b, kind, c)| {
            let mut runs: Vec<&Row> = rows
                .iter()
                .filter(|r| r.backend == b && r.kind == kind && r.tasks == c)
                .collect();
            runs.sort_by(|x, y| x.ops_per_sec.total_cmp(&y.ops_per_sec));
            let median = *runs.get(runs.len() / 2)?;
            Some(Cell {
                median,
                min: runs.first().map_or(0.0, |r| r.ops_per_sec),
                max: runs.last().map_or(0.0, |r| r.ops_per_sec),
                runs: runs.len(),
            })
        })
        .collect()
}

fn find<'a, 'b>(cells: &'b [Cell<'a>], b: &str, kind: &str, c: usize) -> Option<&'b Cell<'a>> {
    cells
        .iter()
        .find(|x| x.median.backend == b && x.median.kind == kind && x.median.tasks == c)
}

pub(crate) fn write(out: &Path, rows: &[Row], meta: &Meta<'_>) -> std::io::Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("scaling.json"),
        serde_json::to_string_pretty(rows).map_err(std::io::Error::other)?,
    )?;
    let cells = cells(rows);
    std::fs::write(out.join("scaling.svg"), svg(&cells, &meta.plan.tasks))?;
    crate::sections::put(out, &section(&cells, meta))
}

fn ms(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn section(cells: &[Cell<'_>], meta: &Meta<'_>) -> String {
    let plan = meta.plan;
    let mut md = String::new();
    let _ = writeln!(md, "## Throughput under concurrency\n");
    if plan.smoke {
        let _ = writeln!(
            md,
            "> **Smoke run**: a fraction of a second per cell; proves the section runs, the numbers mean nothing.\n"
        );
    }
    let tasks: Vec<String> = plan.tasks.iter().map(ToString::to_string).collect();
    let _ = writeln!(
        md,
        "Written by `scripts/bench-scale` (`lease-bench --scale`) on {}; {}. C tasks in one \
         process share one client and loop for {:.1} s per cell, each on its own key: take the key, \
         release it. *lease* is our provider (`try_acquire` + `release`), *bare* the same adapter \
         without the observability layer (where built), *raw* the store commands \
         that give the same guarantees on the same client crate, *protocol* (where it differs) \
         the store work of our own protocol on that raw client, *peer* the peer crate linked in \
         this process. C = {}; {} run(s); a figure is the run with the median ops/s, with the \
         spread of ops/s over all runs. CPU is this process's (user + system) per operation. Load \
         average (1, 5, 15 min) at the start: {}; at the end: {}.\n",
        crate::report::today(),
        crate::report::machine(),
        plan.run_for.as_secs_f64(),
        tasks.join(", "),
        plan.runs,
        meta.load_start,
        meta.load_end
    );
    let _ = writeln!(md, "![ops/s against tasks, log scales](scaling.svg)\n");
    let mut backends: Vec<&str> = Vec::new();
    for c in cells {
        if !backends.contains(&c.median.backend.as_str()) {
            backends.push(&c.median.backend);
        }
    }
    let _ = writeln!(md, "### Against the raw floor\n");
    let _ = writeln!(
        md,
        "| backend | C | lease ops/s | raw ops/s | lease / raw | lease / protocol | lease / bare | peer ops/s | lease p99 / raw p99 (ms) |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for b in &backends {
        for &c in &plan.tasks {
            let (Some(ours), raw, protocol, bare, peer) = (
                find(cells, b, "lease", c),
                find(cells, b, "raw", c),
                find(cells, b, "protocol", c),
                find(cells, b, "bare", c),
                find(cells, b, "peer", c),
            ) else {
                continue;
            };
            let ratio = |x: Option<&Cell<'_>>| {
                x.map_or("–".into(), |r| {
                    format!(
                        "{:.2}x",
                        ours.median.ops_per_sec / r.median.ops_per_sec.max(1e-9)
                    )
                })
            };
            let ops = |x: Option<&Cell<'_>>| {
                x.map_or("–".into(), |x| format!("{:.0}", x.median.ops_per_sec))
            };
            let _ = writeln!(
                md,
                "| {b} | {c} | {:.0} | {} | {} | {} | {} | {} | {} |",
                ours.median.ops_per_sec,
                ops(raw),
                ratio(raw),
                ratio(protocol),
                ratio(bare),
                ops(peer),
                raw.map_or(ms(ours.median.p99_ms), |r| format!(
                    "{} / {}",
                    ms(ours.median.p99_ms),
                    ms(r.median.p99_ms)
                )),
            );
        }
    }
    let _ = writeln!(md, "\n### Every cell\n");
    let _ = writeln!(
        md,
        "| backend | target | C | ops/s | spread (min – max) | p50 (ms) | p99 (ms) | CPU µs/op |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---|---:|---:|---:|");
    for b in &backends {
        for kind in KINDS {
            for &c in &plan.tasks {
                let Some(x) = find(cells, b, kind, c) else {
                    continue;
                };
                let _ = writeln!(
                    md,
                    "| {b} | {kind} | {c} | {:.0} | {:.0} – {:.0} ({} runs) | {} | {} | {:.0} |",
                    x.median.ops_per_sec,
                    x.min,
                    x.max,
                    x.runs,
                    ms(x.median.p50_ms),
                    ms(x.median.p99_ms),
                    x.median.cpu_us_per_op
                );
            }
        }
    }
    let _ = writeln!(md, "\nWhat each target runs:\n");
    for b in &backends {
        for kind in KINDS {
            if let Some(x) = cells
                .iter()
                .find(|x| x.median.backend == *b && x.median.kind == kind)
            {
                let _ = writeln!(md, "- {b}, {kind}: {}", x.median.what);
            }
        }
    }
    let _ = writeln!(md, "\n{}", include_str!("profiles.md").trim_end());
    md
}

/// One panel per backend: ops/s (log) against C (log), a line per target.
fn svg(cells: &[Cell<'_>], tasks: &[usize]) -> String {
    let mut backends: Vec<&str> = Vec::new();
    for c in cells {
        if !backends.contains(&c.median.backend.as_str()) {
            backends.push(&c.median.backend);
        }
    }
    let (pw, ph, cols) = (300.0_f64, 220.0_f64, 3_usize);
    let rows = backends.len().div_ceil(cols).max(1);
    let (w, h) = (pw * cols as f64, ph * rows as f64 + 30.0);
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='11'>\
         <rect width='100%' height='100%' fill='white'/>\
         <text x='{}' y='16' text-anchor='middle' font-size='13'>ops/s against tasks sharing one client (log scales)</text>",
        w / 2.0
    );
    for (i, (kind, color)) in KINDS.iter().zip(COLORS).enumerate() {
        let _ = write!(
            s,
            "<text x='{}' y='16' fill='{color}'>{kind}</text>",
            w - 150.0 + 45.0 * i as f64
        );
    }
    let cmin = tasks.iter().copied().min().unwrap_or(1).max(1) as f64;
    let cmax = (tasks.iter().copied().max().unwrap_or(1) as f64).max(cmin * 2.0);
    for (bi, b) in backends.iter().enumerate() {
        let (ox, oy) = (pw * (bi % cols) as f64, 30.0 + ph * (bi / cols) as f64);
        let (left, right, top, bottom) = (ox + 50.0, ox + pw - 15.0, oy + 20.0, oy + ph - 35.0);
        let mine: Vec<&Cell<'_>> = cells.iter().filter(|c| c.median.backend == *b).collect();
        let top_ops = mine.iter().map(|c| c.max).fold(10.0_f64, f64::max);
        let (lo, hi) = (
            10f64.powf(
                mine.iter()
                    .map(|c| c.min.max(1.0))
                    .fold(top_ops, f64::min)
                    .log10()
                    .floor(),
            ),
            10f64.powf(top_ops.log10().ceil()),
        );
        let x = |c: f64| left + (c.ln() - cmin.ln()) / (cmax.ln() - cmin.ln()) * (right - left);
        let y = |v: f64| {
            bottom
                - (v.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10()).max(1e-9)
                    * (bottom - top)
        };
        let _ = write!(
            s,
            "<text x='{}' y='{}' text-anchor='middle' font-weight='bold'>{b}</text>\
             <line x1='{left}' y1='{bottom}' x2='{right}' y2='{bottom}' stroke='black'/>\
             <line x1='{left}' y1='{top}' x2='{left}' y2='{bottom}' stroke='black'/>",
            (left + right) / 2.0,
            oy + 12.0
        );
        for &c in tasks {
            let _ = write!(
                s,
                "<text x='{:.1}' y='{}' text-anchor='middle'>{c}</text>",
                x(c as f64),
                bottom + 14.0
            );
        }
        let mut tick = lo;
        while tick <= hi * 1.001 {
            let _ = write!(
                s,
                "<text x='{}' y='{:.1}' text-anchor='end'>{}</text>",
                left - 4.0,
                y(tick) + 4.0,
                if tick >= 1000.0 {
                    format!("{}k", tick / 1000.0)
                } else {
                    format!("{tick}")
                }
            );
            tick *= 10.0;
        }
        for (kind, color) in KINDS.iter().zip(COLORS) {
            let points: Vec<String> = tasks
                .iter()
                .filter_map(|&c| find(cells, b, kind, c))
                .map(|c| {
                    format!(
                        "{:.1},{:.1}",
                        x(c.median.tasks as f64),
                        y(c.median.ops_per_sec)
                    )
                })
                .collect();
            if !points.is_empty() {
                let _ = write!(
                    s,
                    "<polyline fill='none' stroke='{color}' stroke-width='2' points='{}'/>",
                    points.join(" ")
                );
            }
        }
        let _ = write!(
            s,
            "<text x='{}' y='{}' text-anchor='middle'>tasks</text>",
            (left + right) / 2.0,
            bottom + 28.0
        );
    }
    s.push_str("</svg>\n");
    s
}

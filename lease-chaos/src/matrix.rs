//! Turns the reports of a matrix of runs (one JSON file per cell) into
//! `RELIABILITY.md` and one plot per backend of unsafe windows against the
//! stale writes the sink admitted.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::report::Report;

/// Reads every `*.json` report in `dir`, ordered by backend then cell.
///
/// # Errors
/// When the directory or a report cannot be read.
pub fn load(dir: &Path) -> Result<Vec<Report>, String> {
    let mut out = Vec::new();
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "json") {
            let text = std::fs::read_to_string(&p)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            let r: Report = serde_json::from_str(&text)
                .map_err(|e| format!("{} is not a chaos report: {e}", p.display()))?;
            out.push(r);
        }
    }
    out.sort_by(|a, b| (&a.backend, a.fenced, &a.cell).cmp(&(&b.backend, b.fenced, &b.cell)));
    Ok(out)
}

fn pct(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// The runs `reports` came from, oldest first (a run's label starts with
/// its date); a cell's run is named by its place here (A, B, ...).
pub fn runs(reports: &[Report]) -> Vec<&str> {
    let mut runs: Vec<&str> = reports.iter().map(|r| r.run.as_str()).collect();
    runs.sort_unstable();
    runs.dedup();
    runs
}

/// The name of the `i`-th run: A..Z, then AA, AB, ...
fn run_name(i: usize) -> String {
    let letter = |n: usize| char::from(b'A' + (n % 26) as u8);
    if i < 26 {
        letter(i).to_string()
    } else {
        format!("{}{}", letter(i / 26 - 1), letter(i))
    }
}

/// The legend of the table's run column: each run's name and label.
pub fn runs_legend(reports: &[Report]) -> String {
    let mut s = String::new();
    for (i, run) in runs(reports).iter().enumerate() {
        let label = if run.is_empty() { "not recorded" } else { run };
        let _ = writeln!(s, "- **Run {}**: {label}", run_name(i));
    }
    s
}

/// The markdown table of `reports`.
pub fn table(reports: &[Report]) -> String {
    let runs = runs(reports);
    let mut s = String::from(
        "| backend | faults | sink | grants | s | injected | unsafe windows (ms) | validity overlaps | \
         stale sent | stale admitted | late admitted | token regressions | lost / dup rounds | \
         availability | recovery p50 / max (ms) | seed | run | verdict |\n\
         |---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n",
    );
    for r in reports {
        let run = run_name(runs.iter().position(|x| *x == r.run).unwrap_or(0));
        let c = &r.counts;
        let injected: Vec<String> = r.injected.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.0} | {} | {} ({:.0}) | {} | {} | {} | {} | {} | {} / {} | {:.1}% | {:.0} / {:.0}{} | {} | {run} | {} |",
            r.backend,
            r.cell,
            if r.fenced { "fenced" } else { "**unfenced**" },
            c.grants,
            r.seconds,
            if injected.is_empty() {
                "—".to_string()
            } else {
                injected.join(", ")
            },
            c.unsafe_windows,
            c.unsafe_ms,
            c.validity_overlaps,
            c.stale_sent,
            c.stale_admitted,
            c.late_admitted,
            c.token_regressions,
            c.lost_rounds,
            c.duplicated_rounds,
            c.availability * 100.0,
            pct(&c.recovery_ms, 0.5),
            pct(&c.recovery_ms, 1.0),
            if c.unrecovered > 0 {
                format!(" ({} unrecovered)", c.unrecovered)
            } else {
                String::new()
            },
            r.seed,
            if r.passed() && r.declared.is_empty() {
                "holds".to_string()
            } else if r.passed() {
                format!("holds as declared: {}", r.declared.join("; "))
            } else {
                format!("**VIOLATED**: {}", r.violations.join("; "))
            },
        );
    }
    s
}

/// An SVG bar chart for one backend: per cell, unsafe windows (grey) next to
/// stale writes the sink admitted (red), on a log scale.
pub fn plot(backend: &str, reports: &[&Report]) -> String {
    let (w, h, left, bottom) = (120 + 90 * reports.len().max(1), 300usize, 60usize, 80usize);
    let top = 30usize;
    let max = reports
        .iter()
        .map(|r| r.counts.unsafe_windows.max(r.counts.stale_admitted))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let scale = |v: u64| -> f64 {
        if v == 0 {
            0.0
        } else {
            (1.0 + v as f64).log10() / (1.0 + max).log10() * (h - top - bottom) as f64
        }
    };
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <text x=\"{left}\" y=\"18\" font-size=\"13\">{backend}: unsafe windows (grey) vs stale writes admitted (red), log scale</text>\n\
         <line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - bottom,
        w - 20,
        h - bottom
    );
    for (i, r) in reports.iter().enumerate() {
        let x = left + 20 + i * 90;
        let base = (h - bottom) as f64;
        for (j, (v, color)) in [
            (r.counts.unsafe_windows, "#999"),
            (r.counts.stale_admitted, "#d33"),
        ]
        .iter()
        .enumerate()
        {
            let bh = scale(*v);
            let bx = x + j * 28;
            let _ = writeln!(
                s,
                "<rect x=\"{bx}\" y=\"{:.1}\" width=\"26\" height=\"{bh:.1}\" fill=\"{color}\"/>\
                 <text x=\"{}\" y=\"{:.1}\" text-anchor=\"middle\">{v}</text>",
                base - bh,
                bx + 13,
                base - bh - 3.0
            );
        }
        let label = format!("{}{}", r.cell, if r.fenced { "" } else { " (unfenced)" });
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" transform=\"rotate(-35 {} {})\">{label}</text>",
            x + 40,
            h - bottom + 16,
            x + 40,
            h - bottom + 16
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Writes one plot per backend into `dir` as `reliability-<backend>.svg`;
/// returns the file names by backend.
///
/// # Errors
/// When a plot cannot be written.
pub fn write_plots(dir: &Path, reports: &[Report]) -> Result<BTreeMap<String, String>, String> {
    let mut by: BTreeMap<String, Vec<&Report>> = BTreeMap::new();
    for r in reports {
        by.entry(r.backend.clone()).or_default().push(r);
    }
    let mut names = BTreeMap::new();
    for (backend, rs) in by {
        let name = format!("reliability-{backend}.svg");
        std::fs::write(dir.join(&name), plot(&backend, &rs))
            .map_err(|e| format!("cannot write {name}: {e}"))?;
        names.insert(backend, name);
    }
    Ok(names)
}

/// RELIABILITY.md from the cells' reports: the headline (grants, and the
/// stale writes and unsafe windows of the fenced cells), `setup`, the table,
/// the runs the cells came from, the cells still `pending` at this size, the
/// `plots` (backend to file, from [`write_plots`]) and the `notes`.
#[must_use]
pub fn document(
    reports: &[Report],
    setup: &str,
    pending: &[String],
    plots: &BTreeMap<String, String>,
    notes: &str,
) -> String {
    let failed = reports.iter().filter(|r| !r.passed()).count();
    let grants: u64 = reports.iter().map(|r| r.counts.grants).sum();
    let fenced = || reports.iter().filter(|r| r.fenced);
    let stale: u64 = fenced().map(|r| r.counts.stale_admitted).sum();
    let unsafe_windows: u64 = fenced().map(|r| r.counts.unsafe_windows).sum();
    let mut md = String::from("# Reliability: the lease workload under real faults\n\n");
    md.push_str(
        "Generated by `scripts/chaos` (lease-chaos); do not edit by hand: the notes at the end \
         come from lease-chaos/src/reliability_notes.md.\n\n",
    );
    if !setup.is_empty() {
        md.push_str(&format!("{setup}\n\n"));
    }
    md.push_str(&format!(
        "**Headline:** {} cells, {grants} leases granted under faults; the fenced sink admitted \
         **{stale}** stale writes across **{unsafe_windows}** unsafe windows; {failed} cells \
         broke what their backend declares.\n\n",
        reports.len()
    ));
    md.push_str(&table(reports));
    md.push_str(
        "\nSeeds are per cell: `lease-chaos run --seed S` with the same options replays the \
         fault schedule (timings still vary). Each cell names the run it came from:\n\n",
    );
    md.push_str(&runs_legend(reports));
    let pending: Vec<&str> = pending
        .iter()
        .map(String::as_str)
        .filter(|p| !p.is_empty())
        .collect();
    if !pending.is_empty() {
        md.push_str(&format!(
            "\n**Not run at this size yet** ({} cells): {}.\n",
            pending.len(),
            pending.join(", ")
        ));
    }
    md.push_str("\n## Plots\n\n");
    for (backend, file) in plots {
        md.push_str(&format!("![{backend}]({file})\n\n"));
    }
    md.push_str(notes);
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::Counts;

    fn report(backend: &str, cell: &str, stale: u64) -> Report {
        Report {
            backend: backend.into(),
            store: "redis://x".into(),
            cell: cell.into(),
            faults: vec![cell.into()],
            seed: 1,
            workers: 8,
            ttl_ms: 1000,
            seconds: 1.0,
            fenced: stale == 0,
            token_durability: "durable".into(),
            counts: Counts {
                grants: 10,
                unsafe_windows: 3,
                stale_admitted: stale,
                recovery_ms: vec![10.0, 20.0, 30.0],
                ..Counts::default()
            },
            injected: BTreeMap::from([("pause".to_string(), 2)]),
            violations: Vec::new(),
            declared: Vec::new(),
            run: "2026-12-07: here".into(),
        }
    }

    #[test]
    fn the_document_counts_stale_writes_of_fenced_cells_and_lists_what_is_pending() {
        let rs = vec![report("redis", "pause", 0), report("redis", "pause", 4)];
        let plots = BTreeMap::from([("redis".to_string(), "chaos-redis.svg".to_string())]);
        let md = document(
            &rs,
            "",
            &["zk-crash".into(), "etcd-none".into()],
            &plots,
            "NOTES",
        );
        // The unfenced control's 4 stale writes and 3 windows are not the
        // fence's: the headline counts the fenced cell's only.
        assert!(
            md.contains("2 cells, 20 leases granted under faults; the fenced sink admitted **0** stale writes across **3** unsafe windows; 0 cells"),
            "{md}"
        );
        assert!(
            md.contains("**Not run at this size yet** (2 cells): zk-crash, etcd-none."),
            "{md}"
        );
        assert!(md.contains("2026-12-07: here"), "{md}");
        assert!(md.contains("![redis](chaos-redis.svg)"), "{md}");
        assert!(md.ends_with("NOTES"));
        // Nothing pending (scripts/chaos passes an empty list as ""): no line.
        let whole = document(&rs, "setup line", &[String::new()], &plots, "");
        assert!(!whole.contains("Not run"), "{whole}");
        assert!(whole.contains("setup line\n\n**Headline:**"), "{whole}");
    }

    #[test]
    fn the_table_and_plot_show_each_cell() {
        let rs = vec![report("redis", "pause", 0), report("redis", "pause", 4)];
        let t = table(&rs);
        assert_eq!(t.lines().count(), 4);
        assert!(
            t.contains("| redis | pause | fenced | 10 | 1 | pause 2 | 3 (0) |"),
            "{t}"
        );
        assert!(t.contains("**unfenced**"));
        assert!(t.contains("| 20 / 30 | 1 | A | holds |"), "{t}");
        let refs: Vec<&Report> = rs.iter().collect();
        let svg = plot("redis", &refs);
        assert_eq!(svg.matches("<rect").count(), 4);
        assert!(svg.contains(">4</text>"));
    }

    #[test]
    fn each_cell_names_the_run_it_came_from() {
        let mut rs = vec![report("redis", "pause", 0), report("etcd", "crash", 0)];
        rs[1].run = "2026-12-09: there".into();
        let t = table(&rs);
        assert!(t.contains("| 1 | A | holds |"), "{t}");
        assert!(t.contains("| 1 | B | holds |"), "{t}");
        let legend = runs_legend(&rs);
        assert_eq!(
            legend,
            "- **Run A**: 2026-12-07: here\n- **Run B**: 2026-12-09: there\n"
        );
        assert_eq!(run_name(25), "Z");
        assert_eq!(run_name(26), "AA");
        assert_eq!(run_name(27), "AB");
    }
}

//! `scripts/chaos`'s bookkeeping of a matrix run in parts: which kept cell
//! reports count at the size being run, and where a run may write. Only
//! `--status` and the refusals run here; no cell runs and no store starts.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn chaos(args: &[&str]) -> Output {
    Command::new(root().join("scripts/chaos"))
        .args(args)
        .output()
        .expect("scripts/chaos runs")
}

/// A cell report as `lease-chaos run --json` writes it, as far as the
/// script reads it: the run note, which names the size.
fn kept(dir: &Path, cell: &str, run: &str) {
    std::fs::write(
        dir.join(format!("{cell}.json")),
        format!(
            "{{\n  \"backend\": \"sqlite\",\n  \"run\": \"{run}\",\n  \"violations\": []\n}}\n"
        ),
    )
    .expect("a kept report");
}

#[test]
fn a_kept_cell_counts_only_at_the_size_being_run() {
    let name = format!("script-test-{}", std::process::id());
    let cells = root().join("target/chaos-cells").join(&name);
    std::fs::create_dir_all(&cells).expect("the cells directory");
    let size = "up to 10 acquisitions, bounded by 1m";
    kept(&cells, "sqlite-none", &format!("run started here; {size}"));
    kept(
        &cells,
        "sqlite-crash",
        &format!("run started there; {size}"),
    );
    // Another size (100 acquisitions, a superstring of 10's number): runs again.
    kept(
        &cells,
        "sqlite-pause",
        "run started here; up to 100 acquisitions, bounded by 1m",
    );
    // A longer bound (1m30s, whose text starts with 1m's): runs again.
    kept(
        &cells,
        "sqlite-rw-pause-crash",
        "run started here; up to 10 acquisitions, bounded by 1m30s",
    );
    let out = format!("target/{name}");
    let args = [
        "--status",
        "--backends",
        "sqlite",
        "--acquisitions",
        "10",
        "--max-cell",
        "1m",
        "--out",
        &out,
    ];
    let status = chaos(&args);
    let _ = std::fs::remove_dir_all(&cells);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{status:?}");
    assert!(
        text.trim_end()
            .ends_with("not run yet: sqlite-pause,sqlite-rw-pause-crash,sqlite-pause-unfenced"),
        "{text}"
    );
    // With nothing kept, every sqlite cell is listed.
    let text = String::from_utf8_lossy(&chaos(&args).stdout).into_owned();
    assert!(
        text.trim_end().ends_with(
            "not run yet: sqlite-none,sqlite-pause,sqlite-crash,sqlite-rw-pause-crash,sqlite-pause-unfenced"
        ),
        "{text}"
    );
}

/// docs/ takes the full matrix only; another size without `--out` goes to
/// a directory of its own.
#[test]
fn another_size_is_refused_into_docs() {
    let refused = chaos(&["--status", "--acquisitions", "10", "--out", "docs"]);
    assert_eq!(refused.status.code(), Some(64), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("docs/ holds the full matrix only"),
        "{refused:?}"
    );
    let elsewhere = chaos(&["--status", "--acquisitions", "10"]);
    assert!(elsewhere.status.success(), "{elsewhere:?}");
    assert!(
        String::from_utf8_lossy(&elsewhere.stdout).contains("target/chaos-cells/chaos-sized"),
        "{elsewhere:?}"
    );
}

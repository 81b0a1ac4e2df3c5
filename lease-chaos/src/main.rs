//! `lease-chaos`: run one chaos cell against a store, or turn a directory of
//! cell reports into RELIABILITY.md. See the library docs and scripts/chaos.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lease_chaos::{RunArgs, WorkerArgs, matrix, run_and_print, run_worker};

#[derive(Parser)]
#[command(about = "A Jepsen-style chaos harness for lease stores")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run worker processes against a store while injecting faults, then
    /// check the history (exit 1 when the backend broke what it declares).
    Run(RunArgs),
    /// Write RELIABILITY.md and the plots from a directory of JSON reports.
    Report {
        /// The directory of `run --json` reports.
        #[arg(long)]
        dir: PathBuf,
        /// Where RELIABILITY.md and the plots go.
        #[arg(long, default_value = "docs")]
        out: PathBuf,
        /// A line on how the matrix was run (workers, TTL, faults; each
        /// cell's report names its own run: date, machine, versions).
        #[arg(long, default_value = "")]
        setup: String,
        /// Cells of the matrix with no report in `--dir` yet, comma-separated
        /// (a matrix split over several runs).
        #[arg(long, value_delimiter = ',')]
        pending: Vec<String>,
    },
    /// Internal: one worker process.
    #[command(hide = true)]
    ChaosWorker(WorkerArgs),
}

const NOTES: &str = include_str!("reliability_notes.md");

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lease-chaos: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Cmd::ChaosWorker(args) => match rt.block_on(run_worker(args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("lease-chaos worker: {e}");
                ExitCode::from(2)
            }
        },
        Cmd::Run(args) => match rt.block_on(run_and_print(args)) {
            Ok(code) => ExitCode::from(code),
            Err(e) => {
                eprintln!("lease-chaos: {e}");
                ExitCode::from(2)
            }
        },
        Cmd::Report {
            dir,
            out,
            setup,
            pending,
        } => match write_report(&dir, &out, &setup, &pending) {
            Ok(failed) => {
                if failed > 0 {
                    eprintln!("lease-chaos: {failed} cells violated their declarations");
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(e) => {
                eprintln!("lease-chaos: {e}");
                ExitCode::from(2)
            }
        },
    }
}

fn write_report(
    dir: &std::path::Path,
    out: &std::path::Path,
    setup: &str,
    pending: &[String],
) -> Result<usize, String> {
    let reports = matrix::load(dir)?;
    if reports.is_empty() {
        return Err(format!("no reports in {}", dir.display()));
    }
    std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
    let plots = matrix::write_plots(out, &reports)?;
    let md = matrix::document(&reports, setup, pending, &plots, NOTES);
    std::fs::write(out.join("RELIABILITY.md"), md).map_err(|e| e.to_string())?;
    Ok(reports.iter().filter(|r| !r.passed()).count())
}

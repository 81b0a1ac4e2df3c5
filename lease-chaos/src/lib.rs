//! `lease-chaos`: a Jepsen-style harness for lease stores.
//!
//! K worker **processes** compete for one key: acquire, do a short job, write
//! the result to a **fenced sink** with the fencing token, release; some rounds
//! hold the lease with a renewing guard for longer than the TTL. Meanwhile a
//! **nemesis**, scheduled from a seed, injects real faults: it SIGSTOPs or
//! `kill -9`s the worker holding the key, black-holes the holder's links to the
//! store through a proxy per link, freezes the store's processes, or cuts a
//! minority of a multi-node store. Every operation is logged with its invoke and
//! complete time on `CLOCK_MONOTONIC` (machine-wide), the sink records every
//! write it received, and the [`checker`] counts afterwards:
//! unsafe windows, overlapping validity, stale writes the sink admitted, token
//! regressions, lost and duplicated rounds, availability and recovery time.
//! A count that breaks what the backend's capabilities declare is a violation
//! and fails the run.
//!
//! The same run works against any deployment: `lease chaos --store URL`
//! (or this crate's `lease-chaos run`) needs no control of the servers for the
//! client-side faults (pause, crash, partition).
//!
//! ```no_run
//! # async fn demo() -> Result<(), String> {
//! use clap::Parser;
//! use lease_chaos::{RunArgs, run};
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     run: RunArgs,
//! }
//! let cli = Cli::parse_from(["x", "--store", "redis://127.0.0.1:6379", "--duration", "30s"]);
//! // Workers are this program again, started with its hidden `chaos-worker`
//! // subcommand, which calls `lease_chaos::run_worker`.
//! let report = run(cli.run, lease_chaos::self_worker_command()?).await?;
//! println!("{}", report.text());
//! assert!(report.passed());
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod checker;
pub mod clock;
mod faults;
pub mod history;
mod incident;
pub mod matrix;
pub mod proxy;
mod report;
pub mod run;
pub mod sink;
pub mod worker;
mod workload;

pub use checker::{Counts, check};
pub use faults::{FaultKind, Members};
pub use report::Report;
pub use run::{ChaosOptions, RunArgs, run, run_and_print, run_with_members, self_worker_command};
pub use worker::{WorkerArgs, run_worker};

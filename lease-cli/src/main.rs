//! `lease`: run a command under a distributed lease, inspect a key, or check a
//! store against the conformance suite.
//!
//! Exit codes (also in `lease --help`):
//! - the command's own code when it ran to the end (128 + N if killed by signal N);
//! - 64 usage or configuration error;
//! - 69 store unavailable;
//! - 75 not acquired (the key stayed held for the whole wait);
//! - 79 lease lost while the command ran (the command was stopped);
//! - 126 / 127 the command is not executable / not found (checked before any lease is taken);
//! - 129 / 130 / 143 `lease run` got SIGHUP / SIGINT / SIGTERM (command stopped, lease released);
//! - 1 `lease conformance` found a failing case; `lease status`: 0 held, 3 free.
//!
//! `lease run` starts the command through a small supervisor (`lease supervise`,
//! hidden) that owns the command's process group: if `lease` itself dies, even by
//! `kill -9`, or stops renewing, the supervisor stops the whole group no later than
//! the lease's local validity.

mod chaos;
mod cli;
mod conformance;
mod exit;
mod held;
mod run;
mod script;
mod slots;
mod status;
mod store;
mod supervise;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use leases::AcquireOptions;

use crate::cli::{Cli, Command};
use crate::exit::{EXIT_UNAVAILABLE, EXIT_USAGE, describe, fail};
use crate::store::load_config;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    if let Command::Supervise {
        fd,
        grace_ms,
        gone_grace_ms,
        valid_until_ns,
        cmd,
    } = &cli.command
    {
        return supervise::supervise(
            *fd,
            Duration::from_millis(*grace_ms),
            Duration::from_millis(gone_grace_ms.unwrap_or(*grace_ms)),
            *valid_until_ns,
            cmd,
        );
    }
    if let Command::ChaosWorker(args) = &cli.command {
        let args = args.clone();
        return match tokio::runtime::Runtime::new() {
            Ok(rt) => match rt.block_on(lease_chaos::run_worker(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(EXIT_USAGE, format!("chaos worker: {e}")),
            },
            Err(e) => fail(
                EXIT_UNAVAILABLE,
                format!("cannot start the async runtime: {e}"),
            ),
        };
    }
    if let Command::Completions { shell } = &cli.command {
        use clap::CommandFactory;
        clap_complete::generate(*shell, &mut Cli::command(), "lease", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    let default_level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            return fail(
                EXIT_UNAVAILABLE,
                format!("cannot start the async runtime: {e}"),
            );
        }
    };
    runtime.block_on(async_main(cli))
}

async fn async_main(cli: Cli) -> ExitCode {
    let config = match load_config(&cli) {
        Ok(c) => c,
        Err(e) => return fail(EXIT_USAGE, describe(&e)),
    };
    if let Some(label) = &cli.holder
        && let Err(e) = leases::set_holder(label)
    {
        return fail(
            EXIT_USAGE,
            format!("--holder / LEASE_HOLDER: {}", describe(&e)),
        );
    }
    match cli.command {
        Command::Run {
            keys,
            ttl,
            wait,
            fair,
            shared,
            writer,
            min_hold,
            grace,
            once_per,
            keep_claim,
            cmd,
        } => {
            let once = once_per.map(|slot| (slot, keep_claim));
            let mut options = AcquireOptions::ttl(ttl.unwrap_or(config.default_ttl)).wait(wait);
            if fair {
                options = options.fair();
            }
            let mode = if shared {
                run::Mode::Read
            } else if writer {
                run::Mode::Write
            } else {
                run::Mode::Plain
            };
            run::run(&config, &keys, (options, mode), min_hold, grace, once, &cmd).await
        }
        Command::Status { key, json } => status::status(&config, &key, json).await,
        Command::Conformance { json } => conformance::conformance(&config, json).await,
        Command::Chaos { options } => chaos::chaos(&config, options).await,
        Command::Acquire {
            key,
            ttl,
            wait,
            json,
        } => {
            script::script_acquire(&config, &key, ttl.unwrap_or(config.default_ttl), wait, json)
                .await
        }
        Command::Extend { lease, ttl } => {
            script::script_extend(&config, &lease, ttl.unwrap_or(config.default_ttl)).await
        }
        Command::Release { lease } => script::script_release(&config, &lease).await,
        Command::Check { key, token } => script::script_check(&config, &key, token).await,
        Command::Completions { .. } | Command::Supervise { .. } | Command::ChaosWorker(_) => {
            ExitCode::from(EXIT_USAGE)
        }
    }
}

//! `lease`: run a command under a distributed lease, inspect a key, or check a
//! store against the conformance suite.
//!
//! Exit codes (also in `lease --help`):
//! - the command's own code when it ran to the end (128 + N if killed by signal N);
//! - 64 usage or configuration error;
//! - 69 store unavailable;
//! - 75 not acquired (the key stayed held for the whole wait);
//! - 79 lease lost while the command ran (the command was stopped);
//! - 1 `lease conformance` found a failing case.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use lease::{
    GuardConfig, LeaseError, LeaseGuard, LeaseKey, LeaseProvider, Store, StoreConfig, acquire,
    parse_duration,
};
use lease_conformance::ProviderFactory;
use tokio::time::Instant;

const EXIT_USAGE: u8 = 64;
const EXIT_UNAVAILABLE: u8 = 69;
const EXIT_NOT_ACQUIRED: u8 = 75;
const EXIT_LOST: u8 = 79;

const AFTER_HELP: &str = "\
Exit codes:
  N    the command's own exit code (128+N when it was killed by signal N)
  64   usage or configuration error
  69   the store is unavailable
  75   not acquired: the key stayed held for the whole wait
  79   the lease was lost while the command ran; the command was stopped
  143  (130 for SIGINT) `lease run` itself was asked to stop: the command was
       stopped the same way and the lease released
  1    `lease conformance` found a failing case

Store URLs: memory://, redis://host:port, rediss://..., redlock://h1:p,h2:p,h3:p,
postgres://user@host/db[?lease_table=schema.table], etcd://h1:p[,h2:p], zk://h1:p[,h2:p][/chroot]";

#[derive(Parser)]
#[command(name = "lease", version, about = "Run commands under distributed leases with fencing tokens", after_help = AFTER_HELP)]
struct Cli {
    /// The store URL.
    #[arg(long, env = "LEASE_STORE", global = true)]
    store: Option<String>,
    /// A TOML configuration file (store, namespace, default_ttl, timeouts); --store wins over it.
    #[arg(long, env = "LEASE_CONFIG", global = true)]
    config: Option<std::path::PathBuf>,
    /// The namespace.
    #[arg(long, env = "LEASE_NAMESPACE", global = true)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Acquire KEY, run CMD while renewing the lease, stop CMD if the lease is lost.
    Run {
        /// The key to lease.
        #[arg(long)]
        key: String,
        /// The lease TTL (30s, 1m, ...). Default: the configuration's default_ttl.
        #[arg(long, value_parser = duration)]
        ttl: Option<Duration>,
        /// How long to wait for the key if it is held. Default: do not wait.
        #[arg(long, value_parser = duration, default_value = "0s")]
        wait: Duration,
        /// Keep the key held at least this long after acquiring it, even if CMD ends sooner.
        #[arg(long, value_parser = duration, default_value = "0s")]
        min_hold: Duration,
        /// After SIGTERM, how long CMD gets before SIGKILL.
        #[arg(long, value_parser = duration, default_value = "10s")]
        grace: Duration,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<String>,
    },
    /// Show who holds KEY: token and remaining TTL, or free.
    Status {
        /// The key.
        #[arg(long)]
        key: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run the conformance suite against the configured store (in its own namespace).
    Conformance,
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration("duration", s).map_err(|e| e.to_string())
}

fn fail(code: u8, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("lease: {msg}");
    ExitCode::from(code)
}

fn error_code(e: &LeaseError) -> u8 {
    match e {
        LeaseError::Unavailable { .. } | LeaseError::Timeout { .. } => EXIT_UNAVAILABLE,
        LeaseError::Backend { .. } => EXIT_UNAVAILABLE,
        _ => EXIT_USAGE,
    }
}

fn describe(e: &LeaseError) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(&format!(": {text}"));
        }
        src = s.source();
    }
    msg
}

fn load_config(cli: &Cli) -> Result<StoreConfig, LeaseError> {
    let mut config = match &cli.config {
        Some(path) => StoreConfig::from_toml_file(path)?,
        None => StoreConfig::new(cli.store.clone().ok_or_else(|| {
            LeaseError::Config(format!(
                "no store given: use --store URL, LEASE_STORE, or --config FILE ({})",
                lease::URL_FORMS
            ))
        })?),
    };
    if cli.config.is_some()
        && let Some(store) = &cli.store
    {
        config.store = store.clone();
    }
    if let Some(ns) = &cli.namespace {
        config.namespace = ns.clone();
    }
    Ok(config)
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
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
    match cli.command {
        Command::Run {
            key,
            ttl,
            wait,
            min_hold,
            grace,
            cmd,
        } => {
            run(
                &config,
                &key,
                ttl.unwrap_or(config.default_ttl),
                wait,
                min_hold,
                grace,
                &cmd,
            )
            .await
        }
        Command::Status { key, json } => status(&config, &key, json).await,
        Command::Conformance => conformance(&config).await,
    }
}

async fn run(
    config: &StoreConfig,
    key: &str,
    ttl: Duration,
    wait: Duration,
    min_hold: Duration,
    grace: Duration,
    cmd: &[String],
) -> ExitCode {
    let (provider, key) = match config.build().and_then(|p| Ok((p, LeaseKey::new(key)?))) {
        Ok(v) => v,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    let lease = match acquire(&provider, &key, ttl, wait).await {
        Ok(Some(lease)) => lease,
        Ok(None) => {
            return fail(
                EXIT_NOT_ACQUIRED,
                format!("{key} is held by someone else; not acquired"),
            );
        }
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    let acquired_at = lease.sent_at();
    let token = lease.token();
    let guard = LeaseGuard::with_config(Arc::clone(&provider), lease, GuardConfig::default());
    let mut child = match tokio::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .env("LEASE_KEY", key.as_str())
        .env("LEASE_TOKEN", token.to_string())
        .stdin(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            let _ = guard.release().await;
            return fail(EXIT_USAGE, format!("cannot start {:?}: {e}", cmd[0]));
        }
    };
    let status = tokio::select! {
        status = child.wait() => status,
        reason = guard.lost() => {
            eprintln!("lease: lease on {key} (token {token}) lost: {reason}; stopping the command");
            stop_child(&mut child, grace).await;
            return ExitCode::from(EXIT_LOST);
        }
        signal = termination() => {
            // Asked to stop: stop the command the same way, then give the key back.
            eprintln!("lease: got {signal}; stopping the command and releasing {key}");
            stop_child(&mut child, grace).await;
            let _ = guard.release().await;
            return ExitCode::from(128 + if signal == "SIGINT" { 2 } else { 15 });
        }
    };
    let code = match status {
        Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        Err(e) => {
            eprintln!("lease: waiting for the command failed: {e}");
            1
        }
    };
    if guard.is_lost() {
        return ExitCode::from(EXIT_LOST);
    }
    let hold_until = acquired_at + min_hold;
    let now = Instant::now();
    if hold_until > now {
        let lease = guard.detach().await;
        let rest = provider.capabilities().practical_ttl(hold_until - now);
        if let Err(e) = provider.extend(&lease, rest).await {
            eprintln!(
                "lease: could not keep {key} for the minimum hold: {}",
                describe(&e)
            );
        }
    } else if let Err(e) = guard.release().await {
        eprintln!(
            "lease: releasing {key} failed ({}); it runs out by its TTL",
            describe(&e)
        );
    }
    ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1))
}

/// Resolves with the name of the first SIGTERM or SIGINT this process gets.
async fn termination() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        },
        // Without signal handling we simply never report a signal.
        _ => std::future::pending().await,
    }
}

/// SIGTERM, then SIGKILL after `grace`.
async fn stop_child(child: &mut tokio::process::Child, grace: Duration) {
    if let Some(pid) = child.id() {
        let _ = tokio::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .await;
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

async fn status(config: &StoreConfig, key: &str, json: bool) -> ExitCode {
    let (provider, key) = match config.build().and_then(|p| Ok((p, LeaseKey::new(key)?))) {
        Ok(v) => v,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    let info = match provider.inspect(&key).await {
        Ok(i) => i,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    if json {
        let value = match &info {
            Some(i) => serde_json::json!({
                "key": key.as_str(),
                "held": true,
                "token": i.token.get(),
                "remaining_ms": u64::try_from(i.remaining.as_millis()).unwrap_or(u64::MAX),
                "owner": i.owner.map(|o| o.to_hex()),
            }),
            None => serde_json::json!({ "key": key.as_str(), "held": false }),
        };
        println!("{value}");
    } else {
        match info {
            Some(i) => println!(
                "{key}: held, token {}, {} remaining",
                i.token,
                humantime::format_duration(round_ms(i.remaining))
            ),
            None => println!("{key}: free"),
        }
    }
    ExitCode::SUCCESS
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

struct ConfiguredFactory {
    store: Store,
    config: StoreConfig,
    memory: lease::MemoryStore,
}

#[async_trait::async_trait]
impl ProviderFactory for ConfiguredFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        if self.store == Store::Memory {
            return Ok(Arc::new(self.memory.provider(namespace)?));
        }
        self.store.build(
            namespace,
            self.config.connect_timeout,
            self.config.request_timeout,
        )
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        if self.store == Store::Memory {
            let down = lease::MemoryStore::new();
            down.set_down(true);
            return Ok(Arc::new(down.provider("unreachable")?));
        }
        let short = Duration::from_millis(500);
        self.store.unreachable().build("unreachable", short, short)
    }

    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(3)
    }
}

async fn conformance(config: &StoreConfig) -> ExitCode {
    let store = match config.parsed() {
        Ok(s) => s,
        Err(e) => return fail(EXIT_USAGE, describe(&e)),
    };
    println!(
        "conformance suite against {} ({})",
        store.kind(),
        config.store
    );
    let factory = Arc::new(ConfiguredFactory {
        store,
        config: config.clone(),
        memory: lease::MemoryStore::new(),
    });
    let started = std::time::Instant::now();
    let report = lease_conformance::run_all(factory).await;
    let width = report.cases.iter().map(|c| c.name.len()).max().unwrap_or(4);
    println!(
        "{:<width$}  {:<6}  {:<6}  {:>8}",
        "case", "clause", "result", "time"
    );
    for c in &report.cases {
        let result = if c.failure.is_none() { "ok" } else { "FAILED" };
        println!(
            "{:<width$}  {:<6}  {:<6}  {:>7.2}s",
            c.name,
            c.clause,
            result,
            c.elapsed.as_secs_f64()
        );
    }
    for c in report.cases.iter().filter(|c| c.failure.is_some()) {
        println!("\n{}: {}", c.name, c.failure.as_deref().unwrap_or_default());
    }
    let passed = report.cases.len() - report.failures();
    println!(
        "\nconformance: {passed} passed, {} failed in {:.1}s",
        report.failures(),
        started.elapsed().as_secs_f64()
    );
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

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

mod supervise;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use lease_conformance::ProviderFactory;
use leases::{
    AcquireOptions, GuardConfig, LeaseError, LeaseGuard, LeaseKey, LeaseProvider, Store,
    StoreConfig, acquire, end_after_min_hold, parse_duration,
};

const EXIT_USAGE: u8 = 64;
const EXIT_UNAVAILABLE: u8 = 69;
const EXIT_NOT_ACQUIRED: u8 = 75;
const EXIT_LOST: u8 = 79;
const EXIT_NOT_EXECUTABLE: u8 = 126;
const EXIT_NOT_FOUND: u8 = 127;
const EXIT_FREE: u8 = 3;
const EXIT_SUPERVISOR: u8 = 70;
/// The store refused our credentials, certificate or permissions (EX_CONFIG).
const EXIT_DENIED: u8 = 78;
/// How long `lease` waits at exit for background clean-ups (cancels of
/// acquires that timed out but may still run).
const FLUSH_LIMIT: Duration = Duration::from_secs(5);
/// How long `lease run` waits for a killed command group to die before it
/// gives the lease up.
const KILL_WAIT: Duration = Duration::from_secs(5);

const AFTER_HELP: &str = "\
Exit codes:
  N    the command's own exit code (128+N when it was killed by signal N)
  64   usage or configuration error
  69   the store is unavailable
  75   not acquired: the key stayed held for the whole wait
  78   access denied: a wrong password, an untrusted server certificate or a
       missing permission
  79   the lease was lost while the command ran; the command was stopped
  126  the command is not executable; 127: not found (checked before acquiring)
  129, 130, 143  `lease run` got SIGHUP, SIGINT or SIGTERM: the command was
       stopped the same way and the lease released
  1    `lease conformance` found a failing case
  3    `lease status`: the key is free (0: held)

Environment: LEASE_STORE, LEASE_CONFIG, LEASE_NAMESPACE, LEASE_HOLDER, LEASE_DEFAULT_TTL,
LEASE_CONNECT_TIMEOUT, LEASE_REQUEST_TIMEOUT (durations like 30s, 1m); RUST_LOG.

Store URLs: memory://, redis://host:port, rediss://..., redlock://h1:p,h2:p,h3:p,
postgres://user@host/db[?lease_table=schema.table], etcd://h1:p[,h2:p], zk://h1:p[,h2:p][/chroot],
sqlite:///path/leases.db. With no store given: a SQLite file every process of this user
on this host shares ($XDG_STATE_HOME/lease/leases.db, ~/.local/state/lease/leases.db;
/var/lib/lease/leases.db for root; -v prints it). For more than one host, give a
networked store.";

#[derive(Parser)]
#[command(name = "lease", version, about = "Run commands under distributed leases with fencing tokens", after_help = AFTER_HELP)]
struct Cli {
    /// The store URL. Default: the per-user SQLite database (see below).
    #[arg(long, env = "LEASE_STORE", global = true)]
    store: Option<String>,
    /// A TOML configuration file (store, namespace, default_ttl, timeouts); --store wins over it.
    #[arg(long, env = "LEASE_CONFIG", global = true)]
    config: Option<std::path::PathBuf>,
    /// The namespace.
    #[arg(long, env = "LEASE_NAMESPACE", global = true)]
    namespace: Option<String>,
    /// Who takes the lease, as `status` and a refused `run` show it to others.
    /// Default: user@host:pid.
    #[arg(long, env = "LEASE_HOLDER", global = true)]
    holder: Option<String>,
    /// Log more (-v: info, -vv: debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

const RUN_HELP: &str = "\
The command runs in a process group of its own, under a supervisor: when the
lease is lost, or `lease` gets SIGTERM, SIGINT or SIGHUP, the whole group gets
SIGTERM, then SIGKILL after --grace. If `lease` itself dies (even kill -9) or
stops renewing, the supervisor stops the group no later than the lease's local
validity (at once, with SIGKILL, where the lease ends with the process's
database session: PostgreSQL with lease_mode=advisory). Processes the command leaves in its group are killed when it exits.

The command's environment gets LEASE_KEY, LEASE_HOLDER and LEASE_TOKEN (the
fencing token: pass it to every write, e.g. UPDATE ... WHERE last_token <
$LEASE_TOKEN). `lease status` and a refused run show the holder: user@host:pid
of the `lease` process, or what --holder / LEASE_HOLDER set.

Exit codes: the command's own; 64 usage; 69 store unavailable; 75 not acquired;
78 access denied (credentials, certificate, permission);
79 lease lost; 126/127 command not executable/not found; 129/130/143 signals.

Examples:
  lease --store redis://127.0.0.1:6379 run --key nightly-report --ttl 30s -- ./report.sh
  lease --store postgres://app@db/app run --key cron-0400 --min-hold 5m --wait forever -- ./job.sh
  lease --store postgres://app@db/app run --key nightly --once-per \"$(date +%F)\" --wait 10m -- ./nightly.sh";

#[derive(Subcommand)]
enum Command {
    /// Acquire KEY, run CMD while renewing the lease, stop CMD if the lease is lost.
    #[command(after_help = RUN_HELP)]
    Run {
        /// The key to lease.
        #[arg(long)]
        key: String,
        /// The lease TTL (30s, 1m, ...). Default: the configuration's default_ttl.
        #[arg(long, value_parser = duration)]
        ttl: Option<Duration>,
        /// How long to wait for the key if it is held ("forever" waits forever). Default: do not wait.
        #[arg(long, value_parser = wait_duration, default_value = "0s")]
        wait: Duration,
        /// Wait in the store's queue of waiters: runs waiting for KEY get it
        /// in the order they arrived, each woken only by the one ahead
        /// (memory, Redis, PostgreSQL, etcd, ZooKeeper; other stores refuse it).
        #[arg(long)]
        fair: bool,
        /// Keep the key held at least this long after acquiring it, even if CMD ends sooner.
        #[arg(long, value_parser = duration, default_value = "0s")]
        min_hold: Duration,
        /// After SIGTERM, how long CMD gets before SIGKILL.
        #[arg(long, value_parser = duration, default_value = "10s")]
        grace: Duration,
        /// Run CMD at most once per SLOT of KEY (PostgreSQL only), such as the
        /// cron slot `2026-12-04T02:00`: once the lease is held, the slot is
        /// claimed in the database, and only the one `lease run` that claims
        /// it runs CMD; every other exits 75, whenever it comes. A claimed
        /// slot stays claimed if CMD fails.
        #[arg(long, value_name = "SLOT")]
        once_per: Option<String>,
        /// With --once-per: keep the slot's claim this long, counted from the
        /// claim (then the slot can run again; make it longer than CMD can
        /// take); default: forever.
        #[arg(long, value_parser = duration, requires = "once_per")]
        keep_claim: Option<Duration>,
        /// The command and its arguments, after `--`.
        #[arg(required = true, last = true)]
        cmd: Vec<String>,
    },
    /// Show who holds KEY: token and remaining TTL, or free. Exit 0 held, 3 free.
    Status {
        /// The key.
        #[arg(long)]
        key: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Chaos-test the configured store: worker processes compete for one key
    /// while faults are injected (by default pauses, kill -9 and partitions,
    /// all on the client side: no control of the servers needed), then the
    /// history is checked against what the store declares (unsafe windows,
    /// stale writes a fenced sink admitted, token regressions, recovery time).
    /// Exit 0 held, 1 violated, 64 a cell that cannot run.
    Chaos {
        #[command(flatten)]
        options: lease_chaos::ChaosOptions,
    },
    /// Internal: one chaos worker process.
    #[command(hide = true)]
    ChaosWorker(lease_chaos::WorkerArgs),
    /// Run the conformance suite against the configured store, in namespaces
    /// under --namespace. Exit 0 all passed, 1 a case failed, 69 store unreachable.
    Conformance {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Acquire KEY and print the lease for a script: shell assignments of
    /// LEASE_KEY, LEASE_TOKEN, LEASE_OWNER, LEASE_HANDLE (for `eval`), or JSON.
    /// Nobody renews it: extend it before its TTL ends, release it when done.
    /// Exit 0 acquired, 75 not acquired.
    Acquire {
        /// The key to lease.
        #[arg(long)]
        key: String,
        /// The lease TTL. Default: the configuration's default_ttl.
        #[arg(long, value_parser = duration)]
        ttl: Option<Duration>,
        /// How long to wait for the key if it is held ("forever" waits forever).
        #[arg(long, value_parser = wait_duration, default_value = "0s")]
        wait: Duration,
        /// Print JSON instead of shell assignments.
        #[arg(long)]
        json: bool,
    },
    /// Extend a lease printed by `acquire` (read from LEASE_* variables or
    /// flags) to store-now + TTL. Exit 0 extended, 79 no longer held.
    Extend {
        #[command(flatten)]
        lease: HeldLease,
        /// The new TTL. Default: the configuration's default_ttl.
        #[arg(long, value_parser = duration)]
        ttl: Option<Duration>,
    },
    /// Release a lease printed by `acquire`. Exit 0 released, 79 not held.
    Release {
        #[command(flatten)]
        lease: HeldLease,
    },
    /// Exit 0 only while TOKEN is the current holder's token of KEY, 79 otherwise.
    /// A pre-commit check for scripts; not a substitute for fencing the write
    /// itself with the token, since the lease can end right after the check.
    Check {
        /// The key.
        #[arg(long, env = "LEASE_KEY")]
        key: String,
        /// The token that should hold it.
        #[arg(long, env = "LEASE_TOKEN")]
        token: u64,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Internal: the supervisor `lease run` starts between itself and the command.
    #[command(hide = true)]
    Supervise {
        #[arg(long)]
        fd: i32,
        #[arg(long)]
        grace_ms: u64,
        /// The grace when the holder dies; default: --grace-ms.
        #[arg(long)]
        gone_grace_ms: Option<u64>,
        #[arg(long)]
        valid_until_ns: u128,
        #[arg(required = true, last = true)]
        cmd: Vec<String>,
    },
}

/// A lease printed by `lease acquire`, from flags or its LEASE_* variables.
#[derive(clap::Args)]
struct HeldLease {
    /// The key.
    #[arg(long, env = "LEASE_KEY")]
    key: String,
    /// The fencing token.
    #[arg(long, env = "LEASE_TOKEN")]
    token: u64,
    /// The owner id (32 hex digits).
    #[arg(long, env = "LEASE_OWNER")]
    owner: String,
    /// The backend's handle as `acquire` printed it (`none`, `etcd:<id>`, `zk:<version>`).
    #[arg(long, env = "LEASE_HANDLE", default_value = "none")]
    handle: leases::backend::LeaseHandle,
}

impl HeldLease {
    fn lease(&self, ttl: Duration) -> Result<leases::Lease, LeaseError> {
        let owner = leases::backend::OwnerId::from_hex(&self.owner).ok_or_else(|| {
            LeaseError::Config(format!("owner {:?} is not 32 hex digits", self.owner))
        })?;
        Ok(leases::Lease::new(
            LeaseKey::new(self.key.as_str())?,
            leases::FencingToken(self.token),
            owner,
            ttl,
            tokio::time::Instant::now(),
        )
        .with_handle(self.handle))
    }
}

/// Single-quotes `s` for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// A provider whose leases outlive this process: a lease printed by `acquire`
/// must still be there for `extend` and `release` in another process.
fn detachable_store(config: &StoreConfig) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
    let provider = shared_store(config)?;
    if provider.capabilities().holder_session.is_some() {
        return Err(LeaseError::Config(format!(
            "{} leases end with the session of the process that took them, so a lease cannot outlive \
             `lease acquire`; use `lease run`",
            provider.capabilities().backend
        )));
    }
    Ok(provider)
}

fn wait_duration(s: &str) -> Result<Duration, String> {
    if s.trim().eq_ignore_ascii_case("forever") {
        return Ok(Duration::MAX);
    }
    duration(s)
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
        LeaseError::Denied { .. } => EXIT_DENIED,
        _ => EXIT_USAGE,
    }
}

/// Finds the program `lease run` would start, before any lease is taken:
/// 127 when it is not found, 126 when it is not an executable file.
fn check_runnable(program: &str) -> Result<(), (u8, String)> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let candidates: Vec<std::path::PathBuf> = if program.contains('/') {
        vec![program.into()]
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join(program)).collect())
            .unwrap_or_default()
    };
    if candidates.iter().any(|c| executable(c)) {
        return Ok(());
    }
    if candidates.iter().any(|c| c.exists()) {
        return Err((EXIT_NOT_EXECUTABLE, format!("{program}: not executable")));
    }
    Err((EXIT_NOT_FOUND, format!("{program}: command not found")))
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
        None => {
            let store = match cli.store.clone() {
                Some(store) => store,
                None => default_store()?,
            };
            // LEASE_DEFAULT_TTL and the timeouts come from the environment;
            // a garbage value is an error naming the variable.
            StoreConfig::from_lookup(|name| match name {
                "LEASE_STORE" => Some(store.clone()),
                other => std::env::var(other).ok(),
            })?
        }
    };
    if cli.config.is_some()
        && let Some(store) = &cli.store
    {
        config.store = store.clone();
    }
    if let Some(ns) = &cli.namespace {
        config.namespace = ns.clone();
    }
    // Shown as parsed, passwords redacted; a URL that does not parse is
    // reported (without echoing it) when it is used.
    if cli.verbose > 0
        && let Ok(store) = config.parsed()
    {
        eprintln!("lease: store {store}, namespace {}", config.namespace);
    }
    Ok(config)
}

/// The store when none is given: a SQLite file every process of this user on
/// this host shares, in the XDG state directory (`~/.local/state/lease`), or
/// `/var/lib/lease` for root. It works with no server, across processes, and
/// with fencing tokens; for more than one host, give a networked store.
fn default_store() -> Result<String, LeaseError> {
    let dir = if nix::unistd::geteuid().is_root() {
        std::path::PathBuf::from("/var/lib/lease")
    } else {
        let state = std::env::var_os("XDG_STATE_HOME")
            .map(std::path::PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| {
                std::env::var_os("HOME")
                    .map(std::path::PathBuf::from)
                    .filter(|p| p.is_absolute())
                    .map(|h| h.join(".local").join("state"))
            })
            .ok_or_else(|| {
                LeaseError::Config(format!(
                    "no store given, and neither XDG_STATE_HOME nor HOME says where to keep the default SQLite database; use --store URL, LEASE_STORE, or --config FILE ({})",
                    leases::URL_FORMS
                ))
            })?;
        state.join("lease")
    };
    std::fs::create_dir_all(&dir).map_err(|e| {
        LeaseError::Config(format!(
            "no store given, and the default SQLite database's directory {} cannot be created ({e}); use --store URL or LEASE_STORE",
            dir.display()
        ))
    })?;
    let path = dir.join("leases.db");
    let path = path.to_str().ok_or_else(|| {
        LeaseError::Config(format!(
            "the default SQLite path {} is not UTF-8; use --store sqlite:///path",
            path.display()
        ))
    })?;
    Ok(format!("sqlite://{path}"))
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
            key,
            ttl,
            wait,
            fair,
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
            run(&config, &key, options, min_hold, grace, once, &cmd).await
        }
        Command::Status { key, json } => status(&config, &key, json).await,
        Command::Conformance { json } => conformance(&config, json).await,
        Command::Chaos { options } => chaos(&config, options).await,
        Command::Acquire {
            key,
            ttl,
            wait,
            json,
        } => script_acquire(&config, &key, ttl.unwrap_or(config.default_ttl), wait, json).await,
        Command::Extend { lease, ttl } => {
            script_extend(&config, &lease, ttl.unwrap_or(config.default_ttl)).await
        }
        Command::Release { lease } => script_release(&config, &lease).await,
        Command::Check { key, token } => script_check(&config, &key, token).await,
        Command::Completions { .. } | Command::Supervise { .. } | Command::ChaosWorker(_) => {
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// A provider for commands that coordinate separate processes: `memory://`
/// is one process's store, so two `lease run`s would never see each other.
fn shared_store(config: &StoreConfig) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
    if config.parsed()? == Store::Memory {
        return Err(LeaseError::Config(
            "memory:// lives inside one process, so it cannot coordinate separate `lease` commands; \
             use a shared store (redis://, postgres://, etcd://, zk://)"
                .into(),
        ));
    }
    config.build()
}

/// The once-per-slot claims of the configured PostgreSQL store, in its
/// namespace (and in the lease table's schema).
fn once_claims(config: &StoreConfig) -> Result<leases::lease_postgres::OnceClaims, LeaseError> {
    let Store::Postgres {
        url, schema, table, ..
    } = config.parsed()?
    else {
        return Err(LeaseError::Config(format!(
            "--once-per claims slots in PostgreSQL; the store is {}",
            config.parsed()?.kind()
        )));
    };
    let provider = leases::lease_postgres::PostgresProvider::new(
        leases::lease_postgres::PostgresConfig::new(url)
            .namespace(&config.namespace)
            .table(&schema, table)
            .timeouts(config.connect_timeout, config.request_timeout),
    )?;
    leases::lease_postgres::OnceClaims::in_table(
        &provider,
        &schema,
        leases::lease_postgres::CLAIMS_TABLE,
    )
}

/// Claims `slot` of `key` once the lease is held: `Err` with the exit code
/// and message when another run has it (or the claim failed).
async fn claim_slot(
    claims: &leases::lease_postgres::OnceClaims,
    key: &LeaseKey,
    slot: &str,
    keep: Option<Duration>,
) -> Result<leases::lease_postgres::OnceClaim, (u8, String)> {
    match claims.claim_once(key.as_str(), slot, keep).await {
        Ok(Some(claim)) => Ok(claim),
        Ok(None) => {
            let by = match claims.holder(key.as_str(), slot).await {
                Ok(Some(h)) => format!(
                    " by {} (token {}, {} ago)",
                    h.holder.as_deref().unwrap_or("another run"),
                    h.token,
                    humantime::format_duration(Duration::from_secs(h.age.as_secs()))
                ),
                _ => String::new(),
            };
            Err((
                EXIT_NOT_ACQUIRED,
                format!("slot {slot:?} of {key} was claimed already{by}; not running"),
            ))
        }
        Err(e) => Err((error_code(&e), describe(&e))),
    }
}

#[allow(clippy::too_many_arguments)]
async fn run(
    config: &StoreConfig,
    key: &str,
    options: AcquireOptions,
    min_hold: Duration,
    grace: Duration,
    once: Option<(String, Option<Duration>)>,
    cmd: &[String],
) -> ExitCode {
    if let Err((code, msg)) = check_runnable(&cmd[0]) {
        return fail(code, msg);
    }
    let claims = match once.as_ref().map(|_| once_claims(config)).transpose() {
        Ok(c) => c,
        Err(e) => return fail(EXIT_USAGE, describe(&e)),
    };
    let (provider, key) = match shared_store(config).and_then(|p| Ok((p, LeaseKey::new(key)?))) {
        Ok(v) => v,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    let ttl = options.ttl;
    if let Err(e) = provider.capabilities().grant_ttl(ttl) {
        return fail(EXIT_USAGE, describe(&e));
    }
    let acquired = acquire(&provider, &key, options).await;
    if !matches!(acquired, Ok(Some(_))) {
        // An attempt that timed out may have left a cancel in flight.
        provider.flush(FLUSH_LIMIT).await;
    }
    let lease = match acquired {
        Ok(Some(lease)) => lease,
        Ok(None) => {
            return fail(
                EXIT_NOT_ACQUIRED,
                format!("{}; not acquired", held_by(&*provider, &key).await),
            );
        }
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    // The slot is claimed under the lease, so a run still going from an
    // earlier slot is never overlapped, and a run that finds the key held
    // leaves the slot to the one that holds it.
    let mut claimed = None;
    if let (Some(claims), Some((slot, keep))) = (&claims, &once) {
        match claim_slot(claims, &key, slot, *keep).await {
            Ok(claim) => claimed = Some((claims, slot, claim)),
            Err((code, msg)) => {
                let _ = provider.release(&lease).await;
                return fail(code, msg);
            }
        }
    }
    let acquired_at = lease.sent_at();
    let token = lease.token();
    let guard = LeaseGuard::with_config(Arc::clone(&provider), lease, GuardConfig::default());
    let env = [
        ("LEASE_KEY", key.as_str().to_owned()),
        ("LEASE_TOKEN", token.to_string()),
        ("LEASE_HOLDER", guard.lease().holder().to_owned()),
    ];
    // Where the key is free the moment this process's session ends
    // (PostgreSQL's advisory mode), the supervisor gives the command no
    // grace when this process dies: SIGKILL at once, not at validity.
    let grace_if_gone = if provider.capabilities().holder_session == Some(Duration::ZERO) {
        Duration::ZERO
    } else {
        grace
    };
    let mut supervisor = match supervise::Supervisor::spawn(
        cmd,
        &env,
        grace,
        grace_if_gone,
        guard.lease().valid_until(),
    ) {
        Ok(s) => s,
        Err(e) => {
            // Nothing ran: the slot is not used up.
            if let Some((claims, slot, claim)) = &claimed {
                let _ = claims.unclaim(key.as_str(), slot, claim).await;
            }
            let _ = guard.release().await;
            return fail(EXIT_USAGE, format!("cannot start {:?}: {e}", cmd[0]));
        }
    };
    // Tell the supervisor until when the lease is surely held, soon after each
    // renewal: within a tenth of the validity window.
    let window = guard.lease().valid_until() - guard.lease().sent_at();
    let mut tick = tokio::time::interval(
        (window / 10).clamp(Duration::from_millis(2), Duration::from_millis(100)),
    );
    let mut told = guard.lease().valid_until();
    let mut forward = move |supervisor: &mut supervise::Supervisor, guard: &LeaseGuard| {
        let until = guard.lease().valid_until();
        if until != told {
            told = until;
            supervisor.valid_until(until);
        }
    };
    // The command's process group, known before anything can kill the supervisor.
    let mut group = None;
    for _ in 0..200 {
        group = supervisor.command_group();
        if group.is_some() || supervisor.exited() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut signals = Signals::new();
    let mut stopping: Option<(u8, String)> = None;
    let exit = loop {
        tokio::select! {
            exit = supervisor.wait() => break exit,
            reason = guard.lost(), if stopping.is_none() => {
                stopping = Some((EXIT_LOST, format!("lease on {key} (token {token}) lost: {reason}; stopping the command")));
            }
            signal = signals.recv(), if stopping.is_none() => {
                stopping = Some((128 + signal.1, format!("got {}; stopping the command and releasing {key}", signal.0)));
            }
            _ = tick.tick() => {
                // Keep the renewals flowing, also while the command is stopping.
                forward(&mut supervisor, &guard);
                group = group.or_else(|| supervisor.command_group());
                continue;
            }
        }
        if let Some((_, msg)) = &stopping {
            eprintln!("lease: {msg}");
            supervisor.stop(grace);
        }
    };
    let code = match exit {
        Ok(supervise::SupervisorExit::Code(c)) => c,
        Ok(supervise::SupervisorExit::Killed(sig)) => {
            // The supervisor was killed outright: its command may still run.
            // Stop it before the lease is given up.
            let stopped = match group.or_else(|| supervisor.command_group()) {
                Some(g) => supervise::kill_group_and_wait(g, KILL_WAIT).await,
                None => true,
            };
            if !stopped {
                // Something of the command still runs: leave the lease to
                // expire on the store rather than hand the key to another.
                let _ = guard.detach().await;
                return fail(
                    EXIT_SUPERVISOR,
                    format!(
                        "the supervisor of the command was killed by signal {sig}; the command's group did not die within {}, so {key} is left to expire",
                        humantime::format_duration(KILL_WAIT)
                    ),
                );
            }
            if !guard.is_lost() {
                let _ = guard.release().await;
            }
            return fail(
                EXIT_SUPERVISOR,
                format!(
                    "the supervisor of the command was killed by signal {sig}; the command's group was killed"
                ),
            );
        }
        Err(e) => {
            eprintln!("lease: waiting for the command failed: {e}");
            1
        }
    };
    if let Some((exit, _)) = stopping {
        if exit != EXIT_LOST {
            let _ = guard.release().await;
        }
        return ExitCode::from(exit);
    }
    // Lost, or past local validity with the guard not yet told (lease was frozen).
    if guard.is_lost() || tokio::time::Instant::now() >= guard.lease().valid_until() {
        let reason = guard
            .lost_reason()
            .map_or_else(|| "local validity ran out".to_string(), |r| r.to_string());
        return fail(
            EXIT_LOST,
            format!(
                "lease on {key} (token {token}) was lost ({reason}) as the command finished with code {code}; its last writes may overlap another holder's"
            ),
        );
    }
    end_after_min_hold(&provider, guard, acquired_at, min_hold).await;
    provider.flush(FLUSH_LIMIT).await;
    ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1))
}

/// "KEY is held by HOLDER (token T, D left)", as far as the store says.
async fn held_by(provider: &dyn LeaseProvider, key: &LeaseKey) -> String {
    match provider.inspect(key).await {
        Ok(Some(i)) => format!(
            "{key} is held by {} (token {}, {} left)",
            i.holder.as_deref().unwrap_or("someone else"),
            i.token,
            humantime::format_duration(round_ms(i.remaining))
        ),
        _ => format!("{key} is held by someone else"),
    }
}

fn print_lease(lease: &leases::Lease, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::json!({
                "key": lease.key().as_str(),
                "token": lease.token().get(),
                "owner": lease.owner().to_hex(),
                "handle": lease.handle().to_string(),
                "holder": lease.holder(),
                "ttl_ms": u64::try_from(lease.ttl().as_millis()).unwrap_or(u64::MAX),
                "valid_for_ms": u64::try_from(lease.remaining().as_millis()).unwrap_or(u64::MAX),
            })
        );
    } else {
        println!("LEASE_KEY={}", shell_quote(lease.key().as_str()));
        println!("LEASE_TOKEN={}", lease.token());
        println!("LEASE_OWNER={}", lease.owner().to_hex());
        println!("LEASE_HANDLE={}", lease.handle());
        // Shown, not exported: a later `lease` in the same shell records its
        // own holder label unless told otherwise.
        println!("LEASE_HOLDER={}", shell_quote(lease.holder()));
        println!("export LEASE_KEY LEASE_TOKEN LEASE_OWNER LEASE_HANDLE");
    }
}

async fn script_acquire(
    config: &StoreConfig,
    key: &str,
    ttl: Duration,
    wait: Duration,
    json: bool,
) -> ExitCode {
    let (provider, key) = match detachable_store(config).and_then(|p| Ok((p, LeaseKey::new(key)?)))
    {
        Ok(v) => v,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    let acquired = acquire(&provider, &key, AcquireOptions::ttl(ttl).wait(wait)).await;
    provider.flush(FLUSH_LIMIT).await;
    match acquired {
        Ok(Some(lease)) => {
            print_lease(&lease, json);
            ExitCode::SUCCESS
        }
        Ok(None) => fail(
            EXIT_NOT_ACQUIRED,
            format!("{}; not acquired", held_by(&*provider, &key).await),
        ),
        Err(e) => fail(error_code(&e), describe(&e)),
    }
}

fn lease_code(e: &LeaseError) -> u8 {
    if e.is_not_held() {
        EXIT_LOST
    } else {
        error_code(e)
    }
}

async fn script_extend(config: &StoreConfig, held: &HeldLease, ttl: Duration) -> ExitCode {
    let (provider, lease) = match detachable_store(config).and_then(|p| Ok((p, held.lease(ttl)?))) {
        Ok(v) => v,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    match provider.extend(&lease, ttl).await {
        Ok(lease) => {
            print_lease(&lease, false);
            ExitCode::SUCCESS
        }
        Err(e) => fail(lease_code(&e), describe(&e)),
    }
}

async fn script_release(config: &StoreConfig, held: &HeldLease) -> ExitCode {
    let (provider, lease) =
        match detachable_store(config).and_then(|p| Ok((p, held.lease(config.default_ttl)?))) {
            Ok(v) => v,
            Err(e) => return fail(error_code(&e), describe(&e)),
        };
    match provider.release(&lease).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(lease_code(&e), describe(&e)),
    }
}

async fn script_check(config: &StoreConfig, key: &str, token: u64) -> ExitCode {
    let (provider, key) = match shared_store(config).and_then(|p| Ok((p, LeaseKey::new(key)?))) {
        Ok(v) => v,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    match provider.inspect(&key).await {
        Ok(Some(i)) if i.token.get() == token => ExitCode::SUCCESS,
        Ok(Some(i)) => fail(
            EXIT_LOST,
            format!("{key} is held under token {}, not {token}", i.token),
        ),
        Ok(None) => fail(
            EXIT_LOST,
            format!("{key} is free; token {token} does not hold it"),
        ),
        Err(e) => fail(error_code(&e), describe(&e)),
    }
}

/// SIGTERM, SIGINT and SIGHUP, registered once for the whole run.
struct Signals(
    Option<(
        tokio::signal::unix::Signal,
        tokio::signal::unix::Signal,
        tokio::signal::unix::Signal,
    )>,
);

impl Signals {
    fn new() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        Signals(
            match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
                signal(SignalKind::hangup()),
            ) {
                (Ok(t), Ok(i), Ok(h)) => Some((t, i, h)),
                _ => None,
            },
        )
    }

    /// The next signal: its name and number.
    async fn recv(&mut self) -> (&'static str, u8) {
        match self.0.as_mut() {
            Some((term, int, hup)) => tokio::select! {
                _ = term.recv() => ("SIGTERM", 15),
                _ = int.recv() => ("SIGINT", 2),
                _ = hup.recv() => ("SIGHUP", 1),
            },
            // Without signal handling we simply never report a signal.
            None => std::future::pending().await,
        }
    }
}

async fn status(config: &StoreConfig, key: &str, json: bool) -> ExitCode {
    let (provider, key) = match shared_store(config).and_then(|p| Ok((p, LeaseKey::new(key)?))) {
        Ok(v) => v,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    let info = match provider.inspect(&key).await {
        Ok(i) => i,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    let held = info.is_some();
    if json {
        let value = match &info {
            Some(i) => serde_json::json!({
                "key": key.as_str(),
                "held": true,
                "token": i.token.get(),
                "remaining_ms": u64::try_from(i.remaining.as_millis()).unwrap_or(u64::MAX),
                "owner": i.owner.map(|o| o.to_hex()),
                "holder": i.holder,
            }),
            None => serde_json::json!({ "key": key.as_str(), "held": false }),
        };
        println!("{value}");
    } else {
        match info {
            Some(i) => println!(
                "{key}: held by {}, token {}, {} remaining",
                i.holder.as_deref().unwrap_or("an unnamed holder"),
                i.token,
                humantime::format_duration(round_ms(i.remaining))
            ),
            None => println!("{key}: free"),
        }
    }
    if held {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FREE)
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

struct ConfiguredFactory {
    store: Store,
    config: StoreConfig,
    memory: leases::MemoryStore,
    /// This run's own segment: every case namespace is `<ns>.<run>.<case ns>`,
    /// so one purge of `<ns>.<run>.` at the end removes all of it, and
    /// concurrent runs in one namespace never touch each other's records.
    run: String,
}

impl ConfiguredFactory {
    /// Removes every record this run left: one purge per run, not per case
    /// (on Redis a purge is a SCAN of the whole keyspace).
    async fn purge_run(&self) -> Result<u64, LeaseError> {
        let prefix = format!("{}.{}.", self.config.namespace, self.run);
        if self.store == Store::Memory {
            return self.memory.purge_namespaces(&prefix);
        }
        self.store
            .purge_namespaces(
                &prefix,
                self.config.connect_timeout,
                self.config.request_timeout,
            )
            .await
    }
}

#[async_trait::async_trait]
impl ProviderFactory for ConfiguredFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        // Every case namespace lives under the configured one (--namespace).
        let namespace = format!("{}.{}.{namespace}", self.config.namespace, self.run);
        if self.store == Store::Memory {
            return Ok(Arc::new(self.memory.provider(&namespace)?));
        }
        self.store.build(
            &namespace,
            self.config.connect_timeout,
            self.config.request_timeout,
        )
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        if self.store == Store::Memory {
            let down = leases::MemoryStore::new();
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

fn capabilities_json(c: &leases::Capabilities) -> serde_json::Value {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    serde_json::json!({
        "backend": c.backend,
        "min_ttl_ms": ms(c.min_ttl),
        "max_ttl_ms": ms(c.max_ttl),
        "ttl_granularity_ms": ms(c.ttl_granularity),
        "expiry_slack_ms": ms(c.expiry_slack),
        "durable_tokens": format!("{:?}", c.durable_tokens),
        "notifications": format!("{:?}", c.notifications),
        "expiry_clock": format!("{:?}", c.expiry_clock),
        "holder_session_ms": c.holder_session.map(ms),
        "failover_extension": c.failover_extension.map(|f| format!("{} x TTL + {:?}", f.ttl_multiple, f.fixed)),
        "failover": c.failover.as_ref().map(|f| serde_json::json!({
            "tokens": format!("{:?}", f.tokens),
            "lease_survives": f.lease_survives,
            "recovery_ms": ms(f.recovery),
        })),
    })
}

async fn conformance(config: &StoreConfig, json: bool) -> ExitCode {
    let store = match config.parsed() {
        Ok(s) => s,
        Err(e) => return fail(EXIT_USAGE, describe(&e)),
    };
    let factory = Arc::new(ConfiguredFactory {
        store: store.clone(),
        config: config.clone(),
        memory: leases::MemoryStore::new(),
        run: format!("run-{}", &leases::backend::OwnerId::random().to_hex()[..12]),
    });
    // A store that cannot be reached fails at once, not as 36 failed cases.
    let probe = match factory.provider("probe").await {
        Ok(p) => p,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    let reachable = match LeaseKey::new("lease-conformance-probe") {
        Ok(k) => probe.inspect(&k).await.map(|_| ()),
        Err(e) => Err(e),
    };
    if let Err(e) = reachable {
        return fail(error_code(&e), describe(&e));
    }
    let caps = probe.capabilities().clone();
    if !json {
        println!(
            "conformance suite against {} (namespace {})",
            store.kind(),
            config.namespace
        );
        println!("declared capabilities: {}", capabilities_json(&caps));
    }
    let started = std::time::Instant::now();
    let report = lease_conformance::run_all(Arc::clone(&factory) as Arc<dyn ProviderFactory>).await;
    // Everything the cases and the reachability probe left, in one purge.
    if let Err(e) = factory.purge_run().await {
        eprintln!(
            "lease: could not remove this run's records: {}",
            describe(&e)
        );
    }
    let passed = report.cases.len() - report.failures();
    if json {
        let cases: Vec<_> = report
            .cases
            .iter()
            .map(|c| {
                serde_json::json!({
                    "name": c.name,
                    "clause": c.clause,
                    "passed": c.failure.is_none(),
                    "failure": c.failure,
                    "seconds": c.elapsed.as_secs_f64(),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "store": store.kind(),
                "namespace": config.namespace,
                "capabilities": capabilities_json(&caps),
                "passed": passed,
                "failed": report.failures(),
                "cases": cases,
            })
        );
    } else {
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
        println!(
            "\nconformance: {passed} passed, {} failed in {:.1}s",
            report.failures(),
            started.elapsed().as_secs_f64()
        );
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `lease chaos`: one chaos cell against the configured store; the workers
/// are this program again, started with the hidden `chaos-worker` command.
async fn chaos(config: &StoreConfig, options: lease_chaos::ChaosOptions) -> ExitCode {
    let args = lease_chaos::RunArgs {
        store: config.store.clone(),
        namespace: config.namespace.clone(),
        options,
    };
    match lease_chaos::run_and_print(args).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => fail(EXIT_USAGE, e),
    }
}

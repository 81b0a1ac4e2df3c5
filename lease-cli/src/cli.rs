//! The command line: clap's definitions of `lease`, its subcommands and their help.

use std::time::Duration;

use clap::{Parser, Subcommand};
use leases::parse_duration;

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
pub(crate) struct Cli {
    /// The store URL. Default: the per-user SQLite database (see below).
    #[arg(long, env = "LEASE_STORE", global = true)]
    pub(crate) store: Option<String>,
    /// A TOML configuration file (store, namespace, default_ttl, timeouts); --store wins over it.
    #[arg(long, env = "LEASE_CONFIG", global = true)]
    pub(crate) config: Option<std::path::PathBuf>,
    /// The namespace.
    #[arg(long, env = "LEASE_NAMESPACE", global = true)]
    pub(crate) namespace: Option<String>,
    /// Who takes the lease, as `status` and a refused `run` show it to others.
    /// Default: user@host:pid.
    #[arg(long, env = "LEASE_HOLDER", global = true)]
    pub(crate) holder: Option<String>,
    /// Log more (-v: info, -vv: debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub(crate) verbose: u8,
    #[command(subcommand)]
    pub(crate) command: Command,
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
pub(crate) enum Command {
    /// Acquire KEY, run CMD while renewing the lease, stop CMD if the lease is lost.
    #[command(after_help = RUN_HELP)]
    Run {
        /// The key to lease. Give --key several times to hold every key or
        /// none (the command runs only once all are held; they are renewed
        /// together, and losing one stops the command).
        #[arg(long = "key", value_name = "KEY", required = true)]
        keys: Vec<String>,
        /// The lease TTL (30s, 1m, ...). Default: the configuration's default_ttl.
        #[arg(long, value_parser = duration)]
        ttl: Option<Duration>,
        /// How long to wait for the key if it is held ("forever" waits forever). Default: do not wait.
        #[arg(long, value_parser = wait_duration, default_value = "0s")]
        wait: Duration,
        /// Wait in the store's queue of waiters: runs waiting for KEY get it
        /// in the order they arrived, each woken only by the one ahead
        /// (memory, Redis, PostgreSQL, etcd, ZooKeeper; other stores refuse it).
        /// With --shared or --writer, readers and writers in arrival order
        /// instead of writer preference.
        #[arg(long)]
        fair: bool,
        /// Hold KEY's read/write lease as one of its readers: any number of
        /// --shared runs hold the key together, and a --writer run waits for
        /// them (a waiting writer keeps new readers out). The command also
        /// gets LEASE_WRITER_EPOCH, the last writer's token.
        #[arg(long, conflicts_with_all = ["writer", "once_per"])]
        shared: bool,
        /// Hold KEY's read/write lease as its writer: alone, with no
        /// --shared run. (Plain runs of KEY are another lease.)
        #[arg(long, conflicts_with_all = ["once_per"])]
        writer: bool,
        /// Keep the key held at least this long after acquiring it, even if CMD ends sooner.
        #[arg(long, value_parser = duration, default_value = "0s")]
        min_hold: Duration,
        /// After SIGTERM, how long CMD gets before SIGKILL.
        #[arg(long, value_parser = duration, default_value = "10s")]
        grace: Duration,
        /// Run CMD at most once per SLOT of KEY (PostgreSQL or MySQL), such as the
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
pub(crate) struct HeldLease {
    /// The key.
    #[arg(long, env = "LEASE_KEY")]
    pub(crate) key: String,
    /// The fencing token.
    #[arg(long, env = "LEASE_TOKEN")]
    pub(crate) token: u64,
    /// The owner id (32 hex digits).
    #[arg(long, env = "LEASE_OWNER")]
    pub(crate) owner: String,
    /// The backend's handle as `acquire` printed it (`none`, `etcd:<id>`, `zk:<version>`).
    #[arg(long, env = "LEASE_HANDLE", default_value = "none")]
    pub(crate) handle: leases::backend::LeaseHandle,
}

/// Parses `--wait`: a duration, or `forever`.
pub(crate) fn wait_duration(s: &str) -> Result<Duration, String> {
    if s.trim().eq_ignore_ascii_case("forever") {
        return Ok(Duration::MAX);
    }
    duration(s)
}

/// Parses a duration flag (30s, 1m, ...).
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    parse_duration("duration", s).map_err(|e| e.to_string())
}

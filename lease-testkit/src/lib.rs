//! Test support for the `lease` adapters.
//!
//! - [`store_url`]: the address of a shared store started by `scripts/stores up`,
//!   read from a `LEASE_TEST_*` variable. An unset variable FAILS the test with a
//!   message that says how to start the stores; it never skips.
//! - [`OwnedProcess`]: a private store process on a free loopback port that a test
//!   may stop, restart and kill without touching other tests' servers.
//!
//! ```
//! let port = lease_testkit::free_port();
//! assert!(port > 0);
//! ```

pub mod cluster;
mod ready;

pub use ready::Readiness;

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a process may take to answer its readiness request.
const READY_LIMIT: Duration = Duration::from_secs(60);

/// How to start the shared stores, for failure messages.
pub const HOW_TO_START: &str = "start the stores with `scripts/stores up && eval \"$(scripts/stores env)\"`, \
or run the whole suite with `scripts/test`";

/// The value of `var` (e.g. `LEASE_TEST_REDIS_URL`).
///
/// # Panics
/// When `var` is unset: a test that needs a store must fail loudly, not skip.
pub fn store_url(var: &str) -> String {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!("{var} is not set: this test needs a real store; {HOW_TO_START}"),
    }
}

/// A free TCP port on 127.0.0.1 for a server, claimed for this process.
///
/// Ports come from below the kernel's ephemeral range
/// (`ip_local_port_range`), never from it: a port picked from the ephemeral
/// range is free only until some process's outgoing connection takes it as
/// its local port, and a store member restarted on its port (or a quorum
/// port bound only once its peers are up) then cannot bind it. A claim file
/// per port (in the temporary directory, naming this process) keeps test
/// processes running side by side from picking the same port; claims of
/// processes that are gone are taken over.
///
/// # Panics
/// If no port can be claimed and bound.
pub fn free_port() -> u16 {
    free_port_and(0)
}

/// Like [`free_port`], for a server that also binds `port + gap` (a Redis
/// Cluster node's bus port is its port + 10000): both are claimed, and both
/// lie below the ephemeral range.
///
/// # Panics
/// If no such pair can be claimed and bound.
pub fn free_port_and(gap: u16) -> u16 {
    let (low, high) = server_port_range();
    let high = high.saturating_sub(gap);
    assert!(
        high > low,
        "no room for ports {gap} apart below the ephemeral range"
    );
    let dir = std::env::temp_dir().join("lease-testkit-ports");
    let _ = std::fs::create_dir_all(&dir);
    let span = u32::from(high - low);
    let usable = |port: u16| {
        claim_port(&dir.join(port.to_string())) && TcpListener::bind(("127.0.0.1", port)).is_ok()
    };
    for _ in 0..10_000 {
        let offset = uuid::Uuid::new_v4().as_u128() % u128::from(span);
        let port = low + u16::try_from(offset).unwrap_or(0);
        if usable(port) && (gap == 0 || usable(port + gap)) {
            return port;
        }
    }
    panic!("no free port could be claimed in {low}..{high}");
}

/// The ports servers of the tests use: below the ephemeral range, above the
/// well-known ports (and above the fixed ports of `scripts/stores`).
fn server_port_range() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    (20000.min(ephemeral_low.saturating_sub(2000)), ephemeral_low)
}

/// Claims a port for this process: creates `file` holding its pid, or takes
/// over the file of a process that is gone.
fn claim_port(file: &Path) -> bool {
    use std::io::Write as _;
    let me = std::process::id();
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(file)
        {
            Ok(mut f) => return write!(f, "{me}").is_ok(),
            Err(_) => {
                let owner = std::fs::read_to_string(file)
                    .ok()
                    .and_then(|s| s.trim().parse::<i32>().ok());
                let gone = owner.is_some_and(|pid| {
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                        == Err(nix::errno::Errno::ESRCH)
                });
                if !gone {
                    return false;
                }
                let _ = std::fs::remove_file(file);
            }
        }
    }
    false
}

/// A fresh temporary directory (`tempfile`'s), removed when the owner drops it.
#[derive(Debug)]
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    /// Creates it, its name starting with `prefix`.
    ///
    /// # Panics
    /// If the directory cannot be created.
    pub fn new(prefix: &str) -> Self {
        TempDir(
            tempfile::Builder::new()
                .prefix(&format!("{prefix}-"))
                .tempdir()
                .expect("create temp dir"),
        )
    }

    /// Creates one inside `parent`, its name starting with `prefix`.
    ///
    /// # Panics
    /// If the directory cannot be created.
    pub fn new_in(parent: &Path, prefix: &str) -> Self {
        TempDir(
            tempfile::Builder::new()
                .prefix(&format!("{prefix}-"))
                .tempdir_in(parent)
                .expect("create temp dir"),
        )
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// A store process owned by one test: started by [`OwnedProcess::start`], stopped
/// on drop. `stop` and `start_again` let a test take the store down and bring it
/// back on the same port with the same data.
#[derive(Debug)]
pub struct OwnedProcess {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    port: u16,
    log: PathBuf,
    child: Option<Child>,
    run_as: Option<(u32, u32)>,
    stop_signal: &'static str,
    readiness: Readiness,
    /// Kept alive for the process's data.
    pub dir: TempDir,
}

impl OwnedProcess {
    /// Starts `program args...` (which must listen on `port`) and waits until
    /// it answers `readiness`'s request.
    ///
    /// # Panics
    /// If the program cannot be started or is not ready in 60 s: the message
    /// names it, the check and its last answer, and shows the end of its log.
    pub fn start(
        name: &str,
        program: impl Into<PathBuf>,
        args: Vec<String>,
        port: u16,
        dir: TempDir,
        readiness: Readiness,
    ) -> Self {
        let mut p = Self::spawn(name, program, args, port, dir);
        p.readiness = readiness;
        p.wait_ready(READY_LIMIT);
        p
    }

    /// Starts `program args...` without waiting for it: for members of a
    /// cluster, which serve only once their peers are up. Its readiness is
    /// [`Readiness::Listening`]; the topology's health is the real check.
    ///
    /// # Panics
    /// If the program cannot be started.
    pub fn spawn(
        name: &str,
        program: impl Into<PathBuf>,
        args: Vec<String>,
        port: u16,
        dir: TempDir,
    ) -> Self {
        let log = dir.path().join(format!("{name}.log"));
        let mut p = OwnedProcess {
            name: name.into(),
            program: program.into(),
            args,
            port,
            log,
            child: None,
            run_as: None,
            stop_signal: "TERM",
            readiness: Readiness::Listening,
            dir,
        };
        p.launch();
        p
    }

    /// Its name (as given to [`start`](Self::start)).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True while it runs (started and not stopped or killed; a frozen one runs).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn configured(mut self, run_as: Option<(u32, u32)>, stop_signal: &'static str) -> Self {
        self.run_as = run_as;
        self.stop_signal = stop_signal;
        self
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its PID, which leads its own process group (0 while stopped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, std::process::Child::id)
    }

    /// Starts the process again after [`stop`](Self::stop) (same port, same data).
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_again(&mut self) {
        self.launch();
        self.wait_ready(READY_LIMIT);
    }

    /// Spawns the program (through [`spawn_lasting`], so it dies with the
    /// test process) without waiting.
    fn launch(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open log");
        let mut cmd = Command::new(&self.program);
        // zkServer.sh forks java instead of exec'ing it when this is set:
        // then signals (and the parent-death signal) reach only the shell.
        cmd.args(&self.args)
            .process_group(0)
            .env_remove("ZOO_NOEXEC");
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log);
        let child = spawn_lasting(cmd).unwrap_or_else(|e| {
            panic!(
                "cannot start {} ({:?}): {e}; {HOW_TO_START}",
                self.name, self.program
            )
        });
        self.child = Some(child);
    }

    /// Waits until it answers its [`Readiness`] request.
    ///
    /// # Panics
    /// When it exits meanwhile or is not ready within `limit`; the message
    /// names the process, the check and what it last answered, and shows the
    /// end of its log.
    pub fn wait_ready(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let last = match self.readiness.check(self.port, self.dir.path()) {
                Ok(()) => return,
                Err(answer) => answer,
            };
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!(
                    "{} exited with {status} during start-up:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} on port {} not ready within {limit:?}: check \"{}\" last answered: {last}\nend of its log:\n{}",
                self.name,
                self.port,
                self.readiness.describe(),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines of the process's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Stops the process cleanly (SIGTERM; SIGINT for PostgreSQL's fast
    /// shutdown) and waits for it.
    pub fn stop(&mut self) {
        self.signal(self.stop_signal);
    }

    /// Kills the process with SIGKILL (a crash) and waits for it.
    pub fn kill(&mut self) {
        self.signal("KILL");
    }

    /// Freezes the process (SIGSTOP): connections stay open and requests queue
    /// up unanswered, the way a store stalled by a long pause looks.
    /// Returns once every thread of the process is stopped: SIGSTOP takes
    /// effect asynchronously, and a thread still running could answer a
    /// request sent right after this returns.
    pub fn freeze(&self) {
        self.send("STOP");
        if let Some(child) = self.child.as_ref() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !all_threads_stopped(child.id()) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Thaws a frozen process (SIGCONT): it runs whatever queued up meanwhile.
    pub fn thaw(&self) {
        self.send("CONT");
    }

    fn send(&self, sig: &str) {
        if let Some(child) = self.child.as_ref() {
            signal_pid(child.id(), sig);
        }
    }

    fn signal(&mut self, sig: &str) {
        if let Some(mut child) = self.child.take() {
            signal_pid(child.id(), sig);
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends `sig` (`TERM`, `INT`, `KILL`, `STOP`, `CONT`) to `pid`.
///
/// # Panics
/// For another name, or when the signal cannot be sent to a process that
/// still exists (a test must not go on believing a store was frozen).
/// Whether every thread of `pid` is in the stopped state (`T` in
/// `/proc/<pid>/task/<tid>/stat`); true for a process that is gone.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat")).map_or(true, |stat| {
            // The state follows the command name, which is in parentheses.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_none_or(|state| matches!(state, "T" | "t" | "Z" | "X"))
        })
    })
}

fn signal_pid(pid: u32, sig: &str) {
    use nix::sys::signal::Signal;
    let signal = match sig {
        "TERM" => Signal::SIGTERM,
        "INT" => Signal::SIGINT,
        "KILL" => Signal::SIGKILL,
        "STOP" => Signal::SIGSTOP,
        "CONT" => Signal::SIGCONT,
        other => panic!("unknown signal {other}"),
    };
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("a pid fits in i32"));
    match nix::sys::signal::kill(pid, signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => panic!("cannot send SIG{sig} to {pid}: {e}"),
    }
}

impl Drop for OwnedProcess {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal("KILL");
        }
    }
}

/// Spawns `cmd` so that the child dies with this process, also when a test
/// binary is killed or leaves a store in a `static`: the child gets SIGKILL
/// when its parent thread ends (`PR_SET_PDEATHSIG`), and the parent thread is
/// one that lives as long as the process, not the test's own thread (which
/// ends with the test while a shared cluster must stay up).
///
/// # Errors
/// When the program cannot be started.
pub fn spawn_lasting(mut cmd: Command) -> std::io::Result<Child> {
    type Job = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: std::sync::OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    let parent = nix::unistd::Pid::this();
    // SAFETY: the closure runs in the forked child before exec and calls only
    // prctl(2) and getppid(2), which are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)?;
            // The parent may have ended before prctl (the child was then
            // reparented, to init or a subreaper): do not outlive it.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other("the test process is gone"));
            }
            Ok(())
        });
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("lease-testkit-spawner".into())
            .spawn(move || {
                for (mut cmd, answer) in rx {
                    let _ = answer.send(cmd.spawn());
                }
            })
            .expect("start the spawner thread");
        std::sync::Mutex::new(tx)
    });
    let (tx, rx) = std::sync::mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send((cmd, tx))
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?
}

/// A private `redis-server` on a free port. `durable` turns on AOF with
/// `appendfsync always`; otherwise persistence is off.
pub fn owned_redis(durable: bool) -> OwnedProcess {
    owned_redis_with(durable, &[])
}

/// Like [`owned_redis`], with extra `redis-server` arguments (for example
/// `["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"]`).
pub fn owned_redis_with(durable: bool, extra: &[&str]) -> OwnedProcess {
    redis_in(TempDir::new("lease-redis"), durable, extra)
}

/// A `redis-server` on a free port with its data in `dir`.
pub(crate) fn redis_in(dir: TempDir, durable: bool, extra: &[&str]) -> OwnedProcess {
    // A cluster node also listens on its bus port, port + 10000.
    let port = if extra.contains(&"--cluster-enabled") {
        free_port_and(10000)
    } else {
        free_port()
    };
    let mut args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--dir",
        &dir.path().display().to_string(),
        "--save",
        "",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if durable {
        args.extend(["--appendonly", "yes", "--appendfsync", "always"].map(String::from));
    } else {
        args.extend(["--appendonly", "no"].map(String::from));
    }
    args.extend(extra.iter().map(|a| a.to_string()));
    OwnedProcess::start(
        "redis-server",
        "redis-server",
        args,
        port,
        dir,
        Readiness::RedisPing,
    )
}

/// A certificate authority made for one test with the `openssl` program: a CA,
/// a server certificate for `localhost` and `127.0.0.1`, and a client
/// certificate (CN `lease-client`), all signed by it.
pub struct TestCa {
    dir: TempDir,
}

impl TestCa {
    /// Generates the CA and the certificates.
    ///
    /// # Panics
    /// When `openssl` is missing or fails.
    pub fn new() -> Self {
        let dir = TempDir::new("lease-ca");
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .expect("run openssl (Debian package openssl)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=lease test CA",
        ]);
        std::fs::write(
            dir.path().join("server.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .expect("write ext");
        std::fs::write(
            dir.path().join("client.ext"),
            "extendedKeyUsage=clientAuth\n",
        )
        .expect("write ext");
        for (name, cn) in [("server", "localhost"), ("client", "lease-client")] {
            run(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={cn}"),
            ]);
            run(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.pem"),
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
            ]);
        }
        // Keys readable by servers that run as another user (postgres).
        for f in ["server.key", "server.pem", "ca.pem"] {
            let _ = Command::new("chmod")
                .args(["0644", f])
                .current_dir(dir.path())
                .status();
        }
        TestCa { dir }
    }

    /// The CA certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The server certificate (PEM) and its key.
    pub fn server(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("server.pem"),
            self.dir.path().join("server.key"),
        )
    }

    /// The client certificate (PEM) and its key.
    pub fn client(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("client.pem"),
            self.dir.path().join("client.key"),
        )
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

/// A private Redis that speaks only TLS, with a certificate from `ca`, plus
/// extra `redis-server` arguments (for example `--requirepass`).
pub fn owned_redis_tls(ca: &TestCa, extra: &[&str]) -> OwnedProcess {
    let port = free_port();
    let dir = TempDir::new("lease-redis");
    let (cert, key) = ca.server();
    let mut args: Vec<String> = vec![
        "--port".into(),
        "0".into(),
        "--tls-port".into(),
        port.to_string(),
        "--tls-cert-file".into(),
        cert.display().to_string(),
        "--tls-key-file".into(),
        key.display().to_string(),
        "--tls-ca-cert-file".into(),
        ca.ca().display().to_string(),
        "--tls-auth-clients".into(),
        "no".into(),
        "--bind".into(),
        "127.0.0.1".into(),
        "--dir".into(),
        dir.path().display().to_string(),
        "--save".into(),
        String::new(),
        "--appendonly".into(),
        "no".into(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    OwnedProcess::start(
        "redis-server",
        "redis-server",
        args,
        port,
        dir,
        Readiness::RedisTlsPing { ca: ca.ca() },
    )
}

/// The directory of PostgreSQL's server programs (`initdb`, `postgres`).
///
/// # Panics
/// When PostgreSQL is not installed.
pub fn pg_bindir() -> PathBuf {
    if let Ok(d) = std::env::var("LEASE_TEST_PG_BINDIR")
        && !d.is_empty()
    {
        return PathBuf::from(d);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .filter(|p| p.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
        .pop()
        .unwrap_or_else(|| panic!("PostgreSQL server programs not found; {HOW_TO_START}"))
}

/// Hands `dir` to the `postgres` user when running as root (the server
/// programs refuse to run as root) and returns that user's uid and gid to
/// run them as; `None` when not root.
fn owned_by_postgres(dir: &Path) -> Option<(u32, u32)> {
    let run_as = postgres_user();
    if let Some((uid, gid)) = run_as {
        let _ = Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{gid}"))
            .arg(dir)
            .status();
    }
    run_as
}

/// The uid and gid of the `postgres` user when running as root (initdb refuses
/// to run as root), else `None`.
fn postgres_user() -> Option<(u32, u32)> {
    let id = |args: &[&str]| -> Option<u32> {
        let out = Command::new("id").args(args).output().ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    if id(&["-u"])? != 0 {
        return None;
    }
    Some((id(&["-u", "postgres"])?, id(&["-g", "postgres"])?))
}

/// A private PostgreSQL server on a free port with `fsync` on, trust
/// authentication for user `postgres`, data in a temporary directory.
/// Its URL: `postgres://postgres@127.0.0.1:PORT/postgres`.
///
/// # Panics
/// When initdb or the server fails; the message shows the log.
pub fn owned_postgres() -> OwnedProcess {
    postgres_process(&["--auth=trust"], |_| Vec::new())
}

/// A private PostgreSQL that accepts TCP clients only over TLS (a server
/// certificate from `ca`) and only with SCRAM passwords: the superuser
/// `postgres` has `password`. Local socket connections are trusted. It also
/// listens on 127.0.0.2, which the certificate does not name.
pub fn owned_postgres_tls(ca: &TestCa, password: &str) -> OwnedProcess {
    let pwfile = TempDir::new("lease-pw");
    let pw = pwfile.path().join("pw");
    std::fs::write(&pw, format!("{password}\n")).expect("write the password file");
    let _ = Command::new("chmod")
        .args(["0755"])
        .arg(pwfile.path())
        .status();
    let _ = Command::new("chmod").args(["0644"]).arg(&pw).status();
    let (cert, key) = ca.server();
    postgres_process(
        &[
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            &format!("--pwfile={}", pw.display()),
        ],
        |data| {
            // The server wants its key private to the user it runs as.
            for (from, to) in [(&cert, "server.crt"), (&key, "server.key")] {
                std::fs::copy(from, data.join(to)).expect("copy the server certificate");
            }
            let _ = Command::new("chmod")
                .arg("0600")
                .arg(data.join("server.key"))
                .status();
            if let Some((uid, gid)) = postgres_user() {
                let _ = Command::new("chown")
                    .arg(format!("{uid}:{gid}"))
                    .arg(data.join("server.crt"))
                    .arg(data.join("server.key"))
                    .status();
            }
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\n\
                 hostssl all all 127.0.0.0/8 scram-sha-256\n\
                 hostnossl all all 127.0.0.0/8 reject\n",
            )
            .expect("write pg_hba.conf");
            [
                "ssl=on",
                "ssl_cert_file=server.crt",
                "ssl_key_file=server.key",
                // 127.0.0.2 too: an address the certificate does not name.
                "listen_addresses=127.0.0.1,127.0.0.2",
            ]
            .iter()
            .flat_map(|c| ["-c".to_owned(), (*c).to_owned()])
            .collect()
        },
    )
}

/// A private PostgreSQL primary for a streaming standby (`wal_level`
/// replica, trust authentication, replication allowed from loopback); with
/// `synchronous`, every commit waits until a standby has flushed it
/// (`synchronous_standby_names = '*'`).
pub(crate) fn postgres_primary(synchronous: bool) -> OwnedProcess {
    postgres_process(&["--auth=trust"], |_| {
        let mut settings = vec!["wal_level=replica", "max_wal_senders=4"];
        if synchronous {
            settings.push("synchronous_standby_names=*");
        }
        settings
            .iter()
            .flat_map(|c| ["-c".to_owned(), (*c).to_owned()])
            .collect()
    })
}

/// A hot standby of the PostgreSQL at `primary_port`, cloned with
/// `pg_basebackup -R` and streaming from it, on a free port.
///
/// # Panics
/// When the base backup or the server fails.
pub(crate) fn postgres_standby(primary_port: u16, dir: TempDir) -> OwnedProcess {
    let bindir = pg_bindir();
    let port = free_port();
    let run_as = owned_by_postgres(dir.path());
    let data = dir.path().join("data");
    let mut backup = Command::new(bindir.join("pg_basebackup"));
    backup
        .args(["-h", "127.0.0.1", "-p", &primary_port.to_string()])
        .args(["-U", "postgres", "-R", "-X", "stream", "-c", "fast", "-D"])
        .arg(&data);
    if let Some((uid, gid)) = run_as {
        backup.uid(uid).gid(gid);
    }
    let out = backup
        .output()
        .unwrap_or_else(|e| panic!("cannot run pg_basebackup: {e}"));
    assert!(
        out.status.success(),
        "pg_basebackup failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let args = [
        "-D",
        &data.display().to_string(),
        "-p",
        &port.to_string(),
        "-k",
        &dir.path().display().to_string(),
        "-c",
        "listen_addresses=127.0.0.1",
        "-c",
        "fsync=on",
        "-c",
        "hot_standby=on",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    postgres_server("postgres-standby", &bindir, args, port, dir, run_as)
}

/// initdb with `initdb_args`, then `configure(data dir)` (which returns extra
/// server arguments), then the server on a free port.
fn postgres_process(
    initdb_args: &[&str],
    configure: impl FnOnce(&Path) -> Vec<String>,
) -> OwnedProcess {
    let bindir = pg_bindir();
    let port = free_port();
    let dir = TempDir::new("lease-postgres");
    let run_as = owned_by_postgres(dir.path());
    let data = dir.path().join("data");
    let mut initdb = Command::new(bindir.join("initdb"));
    initdb
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "-E", "UTF8"])
        .args(initdb_args);
    if let Some((uid, gid)) = run_as {
        initdb.uid(uid).gid(gid);
    }
    let out = initdb
        .output()
        .unwrap_or_else(|e| panic!("cannot run initdb: {e}"));
    assert!(
        out.status.success(),
        "initdb failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut args = vec![
        "-D".into(),
        data.display().to_string(),
        "-p".into(),
        port.to_string(),
        "-k".into(),
        dir.path().display().to_string(),
        "-c".into(),
        "listen_addresses=127.0.0.1".into(),
        "-c".into(),
        "fsync=on".into(),
    ];
    args.extend(configure(&data));
    postgres_server("postgres", &bindir, args, port, dir, run_as)
}

/// Starts `postgres args...` (as `run_as`, stopped with SIGINT: a fast
/// shutdown) and waits until it listens on `port`.
fn postgres_server(
    name: &str,
    bindir: &Path,
    args: Vec<String>,
    port: u16,
    dir: TempDir,
    run_as: Option<(u32, u32)>,
) -> OwnedProcess {
    let mut p = OwnedProcess {
        name: name.into(),
        program: bindir.join("postgres"),
        args,
        port,
        log: dir.path().join("postgres.log"),
        child: None,
        run_as: None,
        stop_signal: "TERM",
        readiness: Readiness::Postgres,
        dir,
    }
    .configured(run_as, "INT");
    p.start_again();
    p
}

/// A private single-member etcd on free ports, data in a temporary directory.
/// Its endpoint: `http://127.0.0.1:PORT`.
pub fn owned_etcd() -> OwnedProcess {
    etcd_process(None)
}

/// A private etcd that serves clients only over TLS (a server certificate
/// from `ca`) and only with a client certificate signed by `ca`. Its endpoint:
/// `https://127.0.0.1:PORT`. Enable users with [`etcdctl_tls`].
pub fn owned_etcd_tls(ca: &TestCa) -> OwnedProcess {
    etcd_process(Some(ca))
}

/// Runs `etcdctl` against a TLS etcd from [`owned_etcd_tls`] with `ca`'s client
/// certificate, plus `args` (for example `user add root --new-user-password=pw`).
///
/// # Panics
/// When etcdctl fails.
pub fn etcdctl_tls(server: &OwnedProcess, ca: &TestCa, args: &[&str]) {
    let (cert, key) = ca.client();
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=https://127.0.0.1:{}", server.port()))
        .arg(format!("--cacert={}", ca.ca().display()))
        .arg(format!("--cert={}", cert.display()))
        .arg(format!("--key={}", key.display()))
        .args(args)
        .output()
        .expect("run etcdctl");
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn etcd_process(tls: Option<&TestCa>) -> OwnedProcess {
    let port = free_port();
    let peer = free_port();
    let dir = TempDir::new("lease-etcd");
    let scheme = if tls.is_some() { "https" } else { "http" };
    let client_url = format!("{scheme}://127.0.0.1:{port}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let args = vec![
        "--name".into(),
        "owned".into(),
        "--data-dir".into(),
        dir.path().join("data").display().to_string(),
        "--listen-client-urls".into(),
        client_url.clone(),
        "--advertise-client-urls".into(),
        client_url,
        "--listen-peer-urls".into(),
        peer_url.clone(),
        "--initial-advertise-peer-urls".into(),
        peer_url.clone(),
        "--initial-cluster".into(),
        format!("owned={peer_url}"),
        "--log-level".into(),
        "warn".into(),
    ];
    let mut args = args;
    if let Some(ca) = tls {
        let (cert, key) = ca.server();
        args.extend([
            format!("--cert-file={}", cert.display()),
            format!("--key-file={}", key.display()),
            format!("--trusted-ca-file={}", ca.ca().display()),
            "--client-cert-auth".into(),
        ]);
    }
    let readiness = Readiness::Etcd {
        tls: tls.map(|ca| {
            let (cert, key) = ca.client();
            (ca.ca(), cert, key)
        }),
    };
    OwnedProcess::start("etcd", "etcd", args, port, dir, readiness)
}

/// `zkServer.sh`, from `LEASE_TEST_ZK_SERVER` or Debian's location.
pub(crate) fn zk_server() -> PathBuf {
    match std::env::var("LEASE_TEST_ZK_SERVER") {
        Ok(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from("/usr/share/zookeeper/bin/zkServer.sh"),
    }
}

/// A private standalone ZooKeeper on a free port (tickTime 200 ms, so session
/// timeouts from 400 ms to 20 s are allowed), data in a temporary directory.
///
/// # Panics
/// When the configuration cannot be written or the server does not start.
pub fn owned_zk() -> OwnedProcess {
    owned_zk_with_max_session(Duration::from_secs(20))
}

/// Like [`owned_zk`], but the server clamps session timeouts to `max_session`
/// (its `maxSessionTimeout`), as production ensembles often do.
///
/// # Panics
/// When the configuration cannot be written or the server does not start.
pub fn owned_zk_with_max_session(max_session: Duration) -> OwnedProcess {
    let max_ms = max_session.as_millis();
    let port = free_port();
    let dir = TempDir::new("lease-zk");
    let cfg = dir.path().join("zoo.cfg");
    std::fs::write(
        &cfg,
        format!(
            "tickTime=200\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
             minSessionTimeout=400\nmaxSessionTimeout={max_ms}\nadmin.enableServer=false\n4lw.commands.whitelist=srvr,ruok\n",
            dir.path().join("data").display()
        ),
    )
    .expect("write zoo.cfg");
    OwnedProcess::start(
        "zookeeper",
        zk_server(),
        vec!["start-foreground".into(), cfg.display().to_string()],
        port,
        dir,
        Readiness::Zookeeper,
    )
}

/// A TCP proxy on loopback that a test can cut and heal, to partition one
/// client from a server without touching anyone else's connection.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    cut: tokio::sync::watch::Sender<bool>,
    hole: tokio::sync::watch::Sender<u64>,
    lose: LoseReply,
    task: tokio::task::JoinHandle<()>,
}

/// The request whose answer [`Proxy::lose_reply_to`] is to lose, shared by
/// the proxy's connections; taken by the first that forwards it.
type LoseReply = std::sync::Arc<std::sync::Mutex<Option<Vec<u8>>>>;

/// Copies `from` to `to` until either ends. A chunk that contains the armed
/// pattern of `lose` disarms it, is forwarded, and sets `swallow`.
async fn pump_requests(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    lose: &LoseReply,
    swallow: &tokio::sync::Notify,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        let hit = {
            let mut armed = lose
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let hit = armed
                .as_ref()
                .is_some_and(|p| chunk.windows(p.len().max(1)).any(|w| w == p.as_slice()));
            if hit {
                *armed = None;
            }
            hit
        };
        if to.write_all(chunk).await.is_err() {
            return;
        }
        if hit {
            swallow.notify_one();
        }
    }
}

/// Copies `from` to `to` until either ends, or, once `swallow` is notified,
/// reads the server's next answer, drops it and returns (which closes the
/// connection: the client never sees that answer).
async fn pump_replies(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    swallow: &tokio::sync::Notify,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            biased;
            () = swallow.notified() => {
                let _ = from.read(&mut buf).await;
                return;
            }
            r = from.read(&mut buf) => {
                let n = match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

impl Proxy {
    /// Starts forwarding a free loopback port to `127.0.0.1:target`.
    ///
    /// # Panics
    /// Outside a tokio runtime, or if no port can be bound.
    pub async fn start(target: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy port");
        let port = listener.local_addr().expect("proxy address").port();
        let (cut, watch) = tokio::sync::watch::channel(false);
        let (hole, holes) = tokio::sync::watch::channel(0u64);
        let lose: LoseReply = std::sync::Arc::default();
        let armed = std::sync::Arc::clone(&lose);
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                if *watch.borrow() {
                    drop(inbound); // refused while cut
                    continue;
                }
                let mut watch = watch.clone();
                let mut holes = holes.clone();
                let generation = *holes.borrow();
                let lose = std::sync::Arc::clone(&armed);
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    let (mut ri, mut wi) = inbound.into_split();
                    let (mut ro, mut wo) = outbound.into_split();
                    let swallow = tokio::sync::Notify::new();
                    let holed = tokio::select! {
                        () = pump_requests(&mut ri, &mut wo, &lose, &swallow) => false,
                        () = pump_replies(&mut ro, &mut wi, &swallow) => false,
                        _ = watch.wait_for(|cut| *cut) => false,
                        _ = holes.wait_for(|g| *g > generation) => true,
                    };
                    if holed {
                        // Black-holed: both sockets stay open, nothing moves,
                        // until a cut or the proxy goes away.
                        let _ = watch.wait_for(|cut| *cut).await;
                        drop((ri, wi, ro, wo));
                    }
                });
            }
        });
        Proxy {
            port,
            cut,
            hole,
            lose,
            task,
        }
    }

    /// Loses the answer to the next request that contains `pattern` (on
    /// any connection): the request reaches the server, which carries it
    /// out, and the connection is closed as its answer arrives, so the
    /// client sees the connection drop and never learns the outcome.
    pub fn lose_reply_to(&self, pattern: &[u8]) {
        *self
            .lose
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(pattern.to_vec());
    }

    /// Whether the request armed by [`lose_reply_to`](Self::lose_reply_to)
    /// has been seen (and its answer lost or being lost).
    pub fn reply_lost(&self) -> bool {
        self.lose
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none()
    }

    /// Black-holes every connection open now: both sides stay connected and
    /// nothing they send arrives (no FIN, no RST), as behind a dead network
    /// path. Connections made later pass normally.
    pub fn blackhole_open_connections(&self) {
        self.hole.send_modify(|g| *g += 1);
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Drops every connection and refuses new ones until [`heal`](Self::heal).
    pub fn cut(&self) {
        let _ = self.cut.send(true);
    }

    /// Accepts connections again.
    pub fn heal(&self) {
        let _ = self.cut.send(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A name no other test run uses: `prefix`, `_` and 12 random hex digits (also a
/// valid SQL identifier when `prefix` is one).
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// Retries `f` while it fails with `Unavailable` (a store coming back after a
/// restart), for up to 30 s; any other error, or no recovery, fails the test.
///
/// # Panics
/// When the store does not recover or answers with another error.
pub async fn until_ok<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, lease_api::LeaseError>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "the provider did not recover: {e}"
                );
                assert!(
                    matches!(e, lease_api::LeaseError::Unavailable { .. }),
                    "recovering gave {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Holds `key` through `holder` while `waiter` waits for it, then releases and
/// asserts the waiter got it within `within` of the release (so it was woken,
/// not timed out: the holder's TTL is far longer), with a larger token.
///
/// # Panics
/// When any step fails or the hand-off is late.
pub async fn assert_handoff_is_notified<P>(
    holder: &P,
    waiter: std::sync::Arc<P>,
    key: &lease_api::LeaseKey,
    ttl: Duration,
    within: Duration,
) where
    P: lease_api::LeaseProvider + 'static,
{
    let held = holder
        .try_acquire(key, ttl)
        .await
        .expect("acquire")
        .into_lease()
        .expect("the key is free");
    let k = key.clone();
    let waiting = tokio::spawn(async move {
        lease_api::acquire(&waiter, &k, lease_api::AcquireOptions::ttl(ttl).wait(ttl)).await
    });
    // Let the waiter register and find the key held.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the waiter did not wait");
    holder.release(&held).await.expect("release");
    let released = Instant::now();
    let got = waiting
        .await
        .expect("waiter task")
        .expect("waiter")
        .expect("the waiter got the key");
    assert!(
        released.elapsed() < within,
        "the waiter was not woken: it took {:?} after the release",
        released.elapsed()
    );
    assert!(got.token() > held.token());
    holder
        .release(&got)
        .await
        .expect("release the waiter's lease");
}

/// Asserts that `provider`'s acquire of `key` is `Denied` within `within`, not
/// transient, and that its message does not contain `secret`.
///
/// # Panics
/// Otherwise.
pub async fn assert_denied<P: lease_api::LeaseProvider>(
    what: &str,
    provider: &P,
    key: &lease_api::LeaseKey,
    secret: &str,
    within: Duration,
) {
    let started = Instant::now();
    let err = provider
        .try_acquire(key, Duration::from_secs(30))
        .await
        .expect_err(what);
    assert!(
        matches!(err, lease_api::LeaseError::Denied { .. }),
        "{what}: {err:?}"
    );
    assert!(!err.is_transient(), "{what}");
    assert!(!err.to_string().contains(secret), "{what}: {err}");
    assert!(
        started.elapsed() < within,
        "{what}: {:?}",
        started.elapsed()
    );
}

/// Asserts that nothing stays in `key`'s queue of waiters: within `within`
/// (a winner leaves the queue in the background) a new ticket is first.
///
/// # Panics
/// When a ticket stays ahead for `within`, or the store fails.
pub async fn assert_line_empty<P: lease_api::LeaseProvider + ?Sized>(
    p: &P,
    key: &lease_api::LeaseKey,
    within: Duration,
) {
    let queue = p.wait_queue().expect("a provider with a queue of waiters");
    let give_up = Instant::now() + within;
    loop {
        let probe = queue
            .join(
                key,
                Duration::from_secs(10),
                lease_api::backend::Ticket::random_mark(),
            )
            .await
            .expect("join");
        let place = queue.place(&probe).await.expect("place");
        queue.leave(&probe).await.expect("leave");
        if place == lease_api::backend::Place::First {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "a ticket stayed in line for {within:?}: {place:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The answer to a fair waiter's join is lost: `proxy` (between `p` and its
/// store) forwards the first request that contains `pattern(key)` (the
/// join's, for a fresh key) and drops the connection as the answer arrives.
/// The store made the ticket; the waiter, told only that the connection
/// broke, joins again. It must get the free key within 2 s, far below a
/// ticket's TTL, and leave nothing in line: a retried join finds its own
/// ticket, or the lost one is removed.
///
/// # Panics
/// When the answer was never lost, the acquire took 2 s or more or failed,
/// or a ticket stayed in line.
pub async fn assert_a_lost_join_answer_costs_no_wait(
    p: std::sync::Arc<dyn lease_api::LeaseProvider>,
    proxy: &Proxy,
    pattern: impl Fn(&lease_api::LeaseKey) -> Vec<u8>,
) {
    use lease_api::{AcquireOptions, LeaseKey, acquire};
    let ttl = Duration::from_secs(30);
    let fair = |wait| AcquireOptions::ttl(ttl).wait(wait).fair();
    // The key's queue used once first (scripts loaded, statements prepared,
    // the key's nodes made) and left, so the answer lost is the join's.
    let key = LeaseKey::new(unique("lost-join")).expect("key");
    let lease = until_ok(|| acquire(&p, &key, fair(Duration::from_secs(5))))
        .await
        .expect("a free key");
    p.release(&lease).await.expect("release");
    assert_line_empty(&*p, &key, Duration::from_secs(5)).await;
    proxy.lose_reply_to(&pattern(&key));
    let started = Instant::now();
    let lease = acquire(&p, &key, fair(Duration::from_secs(20)))
        .await
        .expect("the fair acquire")
        .expect("the free key");
    let took = started.elapsed();
    assert!(proxy.reply_lost(), "the join's answer was never lost");
    assert!(
        took < Duration::from_secs(2),
        "the fair acquire took {took:?}: it waited behind the ticket of its lost join"
    );
    assert_line_empty(&*p, &key, Duration::from_secs(2)).await;
    p.release(&lease).await.expect("release");
}

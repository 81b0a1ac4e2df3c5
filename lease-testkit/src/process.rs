//! `OwnedProcess`: a store process owned by one test, which it may stop,
//! restart, freeze and kill; signals; children that die with the test process.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{HOW_TO_START, Readiness, TempDir};

/// How long a process may take to answer its readiness request.
const READY_LIMIT: Duration = Duration::from_secs(60);

/// A store process owned by one test: started by [`OwnedProcess::start`], stopped
/// on drop. `stop` and `start_again` let a test take the store down and bring it
/// back on the same port with the same data.
#[derive(Debug)]
pub struct OwnedProcess {
    pub(crate) name: String,
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) port: u16,
    pub(crate) log: PathBuf,
    pub(crate) child: Option<Child>,
    pub(crate) run_as: Option<(u32, u32)>,
    pub(crate) stop_signal: &'static str,
    pub(crate) readiness: Readiness,
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
        Self::start_as(name, program, args, port, dir, readiness, None)
    }

    /// As [`start`](Self::start), as `run_as` (uid, gid) when given.
    pub(crate) fn start_as(
        name: &str,
        program: impl Into<PathBuf>,
        args: Vec<String>,
        port: u16,
        dir: TempDir,
        readiness: Readiness,
        run_as: Option<(u32, u32)>,
    ) -> Self {
        let mut p = Self::spawn_as(name, program, args, port, dir, run_as);
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
        Self::spawn_as(name, program, args, port, dir, None)
    }

    /// As [`spawn`](Self::spawn), as `run_as` (uid, gid) when given.
    pub(crate) fn spawn_as(
        name: &str,
        program: impl Into<PathBuf>,
        args: Vec<String>,
        port: u16,
        dir: TempDir,
        run_as: Option<(u32, u32)>,
    ) -> Self {
        let log = dir.path().join(format!("{name}.log"));
        let mut p = OwnedProcess {
            name: name.into(),
            program: program.into(),
            args,
            port,
            log,
            child: None,
            run_as,
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

    pub(crate) fn configured(
        mut self,
        run_as: Option<(u32, u32)>,
        stop_signal: &'static str,
    ) -> Self {
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

//! The supervisor between `lease run` and the command.
//!
//! `lease run` (the holder) starts `lease supervise` (the supervisor) in a
//! process group of its own, and the supervisor starts the command in another
//! new group, so that one `killpg` reaches every process the command started.
//! The holder tells the supervisor, over a pipe, until when the lease is surely
//! held (its local validity, on CLOCK_MONOTONIC, which every process of the
//! machine shares) and when to stop the command. The supervisor acts on its own
//! when the holder goes away:
//!
//! - the pipe reaches end-of-file (the holder died, even by `kill -9`): SIGTERM
//!   to the command's group at once, SIGKILL at the earlier of `grace` later and
//!   the lease's local validity;
//! - the last validity it was told passes without a newer one (the holder is
//!   frozen or stuck): SIGKILL to the group;
//! - the command exits: whatever it left running in its group is killed, since
//!   the lease ends with the command; the supervisor exits with the command's code.
//!
//! So no process of the command's tree runs past the lease's local validity,
//! whatever happens to the holder.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitCode};
use std::sync::mpsc;
use std::time::Duration;

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
use nix::sys::signal::{Signal, killpg};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::{Pid, pipe2};

/// CLOCK_MONOTONIC now, in nanoseconds: the same clock in every process.
pub fn monotonic_ns() -> u128 {
    clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        u128::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u128::try_from(t.tv_nsec()).unwrap_or(0)
    })
}

/// A monotonic deadline `d` from now, in CLOCK_MONOTONIC nanoseconds.
pub fn deadline_ns(d: Duration) -> u128 {
    monotonic_ns().saturating_add(d.as_nanos())
}

/// The holder's side: the supervisor process and the pipe to it.
pub struct Supervisor {
    child: tokio::process::Child,
    pipe: Option<std::fs::File>,
}

impl Supervisor {
    /// Starts `lease supervise` for `cmd` with `env`, in a process group of
    /// its own; `valid_for` is how long the lease is surely held from now.
    pub fn spawn(
        cmd: &[String],
        env: &[(&str, String)],
        grace: Duration,
        valid_for: Duration,
    ) -> std::io::Result<Self> {
        // The read end is inherited by the supervisor; the write end stays
        // here only (close-on-exec), so it closes when this process dies.
        let (read, write) = pipe2(OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
        fcntl(&read, FcntlArg::F_SETFD(FdFlag::empty())).map_err(std::io::Error::from)?;
        let exe = std::env::current_exe()?;
        let mut command = tokio::process::Command::new(exe);
        command
            .arg("supervise")
            .arg("--fd")
            .arg(read.as_raw_fd().to_string())
            .arg("--grace-ms")
            .arg(grace.as_millis().to_string())
            .arg("--valid-until-ns")
            .arg(deadline_ns(valid_for).to_string())
            .arg("--")
            .args(cmd)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .process_group(0)
            .kill_on_drop(false);
        let child = command.spawn()?;
        drop(read);
        Ok(Supervisor {
            child,
            pipe: Some(std::fs::File::from(write)),
        })
    }

    fn send(&mut self, line: &str) {
        if let Some(p) = self.pipe.as_mut()
            && p.write_all(line.as_bytes()).is_err()
        {
            self.pipe = None;
        }
    }

    /// The lease is surely held for `valid_for` from now.
    pub fn valid_for(&mut self, valid_for: Duration) {
        self.send(&format!("valid {}\n", deadline_ns(valid_for)));
    }

    /// Stop the command: SIGTERM to its group now, SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        self.send(&format!("stop {}\n", grace.as_millis()));
    }

    /// Waits for the supervisor, which exits with the command's code.
    pub async fn wait(&mut self) -> std::io::Result<i32> {
        let status = self.child.wait().await?;
        Ok(status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
    }
}

enum Event {
    Valid(u128),
    Stop(Duration),
    HolderGone,
    Exited(i32),
}

/// The supervisor's side (`lease supervise`): runs `cmd` in a new process
/// group and enforces what the holder said, or the holder's disappearance.
pub fn supervise(fd: i32, grace: Duration, valid_until_ns: u128, cmd: &[String]) -> ExitCode {
    // The inherited read end, opened again through /proc (no unsafe fd
    // adoption); the inherited descriptor itself is a read end and harmless.
    let pipe = match std::fs::File::open(format!("/proc/self/fd/{fd}")) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("lease supervise: cannot open the holder's pipe: {e}");
            return ExitCode::from(70);
        }
    };
    let Some((program, args)) = cmd.split_first() else {
        return ExitCode::from(64);
    };
    let mut child = match Command::new(program).args(args).process_group(0).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lease: cannot start {program:?}: {e}");
            return ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let group = Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
    let (tx, rx) = mpsc::channel();
    let from_pipe = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            let event = match line.split_once(' ') {
                Some(("valid", ns)) => ns.parse().ok().map(Event::Valid),
                Some(("stop", ms)) => ms
                    .parse()
                    .ok()
                    .map(|ms| Event::Stop(Duration::from_millis(ms))),
                _ => None,
            };
            if let Some(e) = event
                && from_pipe.send(e).is_err()
            {
                return;
            }
        }
        let _ = from_pipe.send(Event::HolderGone);
    });
    std::thread::spawn(move || {
        let code = match child.wait() {
            Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
            Err(_) => 1,
        };
        let _ = tx.send(Event::Exited(code));
    });

    let signal = |sig: Signal| {
        let _ = killpg(group, sig);
    };
    let mut valid_until = valid_until_ns;
    // Once stopping: when SIGKILL follows the SIGTERM already sent.
    let mut kill_at: Option<u128> = None;
    loop {
        let now = monotonic_ns();
        let next = kill_at.unwrap_or(valid_until);
        if now >= next {
            signal(Signal::SIGKILL);
            kill_at = Some(u128::MAX);
        }
        let wait = Duration::from_nanos(
            u64::try_from(kill_at.unwrap_or(valid_until).saturating_sub(now)).unwrap_or(u64::MAX),
        )
        .min(Duration::from_secs(1));
        match rx.recv_timeout(wait) {
            Ok(Event::Valid(ns)) => valid_until = ns,
            Ok(Event::Stop(g)) => {
                signal(Signal::SIGTERM);
                kill_at.get_or_insert(deadline_ns(g));
            }
            Ok(Event::HolderGone) => {
                signal(Signal::SIGTERM);
                kill_at.get_or_insert(deadline_ns(grace).min(valid_until));
            }
            Ok(Event::Exited(code)) => {
                // The lease ends with the command: nothing it left behind may
                // keep running without it.
                signal(Signal::SIGKILL);
                return ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return ExitCode::from(1),
        }
    }
}

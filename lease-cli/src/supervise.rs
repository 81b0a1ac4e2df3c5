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
//! - the pipe reaches end-of-file (the holder died, even by `kill -9`), the
//!   holder says stop, or the supervisor itself gets SIGTERM, SIGINT or SIGHUP:
//!   SIGTERM to the command's group at once, SIGKILL at the earlier of `grace`
//!   later and the lease's local validity;
//! - the last validity it was told passes without a newer one (the holder is
//!   frozen or stuck): SIGKILL to the group;
//! - the command exits: whatever it left running in its group is killed, since
//!   the lease ends with the command; the supervisor exits with the command's code.
//!
//! If the supervisor itself is killed outright (SIGKILL), the holder kills the
//! command's group before it releases the lease. The holder is a child
//! subreaper as well, so the command's tree is re-parented to it when the
//! supervisor dies, and it is reached even if the holder had not yet learned
//! the command's group. When standard input is a
//! terminal, the command's group is made the terminal's foreground group, so an
//! interactive command can read it (and gets the terminal's Ctrl-C), and the
//! previous foreground group is restored when it exits.
//!
//! Processes that leave the command's process group (`setsid`, shells with job
//! control, daemons that double-fork) are reached as well: the supervisor is a
//! child subreaper (`PR_SET_CHILD_SUBREAPER`), so orphans of the command's tree
//! are re-parented to it instead of to init, and every signal to the group also
//! goes to each descendant found by walking `/proc/<pid>/task/*/children` from
//! the supervisor. Before it exits, the supervisor kills and reaps descendants
//! until none is left. Only a process that escapes the tree entirely (asks
//! another service, such as systemd or a container runtime, to start it) is out
//! of reach.
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
use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, sigprocmask};
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

/// `until` (a tokio instant) as a CLOCK_MONOTONIC deadline. The clock is read
/// before the instant's distance, so a preemption in between can only make the
/// deadline earlier, never later.
pub fn deadline_of(until: tokio::time::Instant) -> u128 {
    let now = monotonic_ns();
    now.saturating_add(
        until
            .saturating_duration_since(tokio::time::Instant::now())
            .as_nanos(),
    )
}

/// The holder's side: the supervisor process and the pipe to it.
pub struct Supervisor {
    child: tokio::process::Child,
    pipe: Option<std::fs::File>,
    adopts: bool,
}

impl Supervisor {
    /// Starts `lease supervise` for `cmd` with `env`, in a process group of
    /// its own; `valid_for` is how long the lease is surely held from now.
    /// `gone_grace` is the grace when the holder dies (zero where the lease
    /// ends with the holder's process).
    pub fn spawn(
        cmd: &[String],
        env: &[(&str, String)],
        grace: Duration,
        gone_grace: Duration,
        valid_until: tokio::time::Instant,
    ) -> std::io::Result<Self> {
        // The read end is inherited by the supervisor; the write end stays
        // here only (close-on-exec), so it closes when this process dies.
        let (read, write) = pipe2(OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
        fcntl(&read, FcntlArg::F_SETFD(FdFlag::empty())).map_err(std::io::Error::from)?;
        let adopts = match adopt_orphans() {
            Ok(()) => true,
            Err(e) => {
                eprintln!(
                    "lease: cannot become a child subreaper ({e}); if the supervisor is killed before the command's group is known, the lease is left to expire"
                );
                false
            }
        };
        let exe = std::env::current_exe()?;
        let mut command = tokio::process::Command::new(exe);
        command
            .arg("supervise")
            .arg("--fd")
            .arg(read.as_raw_fd().to_string())
            .arg("--grace-ms")
            .arg(grace.as_millis().to_string())
            .arg("--gone-grace-ms")
            .arg(gone_grace.as_millis().to_string())
            .arg("--valid-until-ns")
            .arg(deadline_of(valid_until).to_string())
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
            adopts,
        })
    }

    fn send(&mut self, line: &str) {
        if let Some(p) = self.pipe.as_mut()
            && p.write_all(line.as_bytes()).is_err()
        {
            self.pipe = None;
        }
    }

    /// The lease is surely held until `until`.
    pub fn valid_until(&mut self, until: tokio::time::Instant) {
        self.send(&format!("valid {}\n", deadline_of(until)));
    }

    /// Stop the command: SIGTERM to its group now, SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        self.send(&format!("stop {}\n", grace.as_millis()));
    }

    /// The command's process group (its pid), once the supervisor started it.
    pub fn command_group(&self) -> Option<Pid> {
        let pid = self.child.id()?;
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
        children
            .split_whitespace()
            .next()
            .and_then(|c| c.parse().ok())
            .map(Pid::from_raw)
    }

    /// True when this process is a child subreaper ([`adopt_orphans`]), so
    /// the command comes to it if the supervisor is killed.
    pub fn adopts_orphans(&self) -> bool {
        self.adopts
    }

    /// True once the supervisor has exited (its status is kept for [`wait`](Self::wait)).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits for the supervisor, which exits with the command's code.
    pub async fn wait(&mut self) -> std::io::Result<SupervisorExit> {
        let status = self.child.wait().await?;
        Ok(match (status.code(), status.signal()) {
            (Some(code), _) => SupervisorExit::Code(code),
            (None, Some(sig)) => SupervisorExit::Killed(sig),
            (None, None) => SupervisorExit::Code(1),
        })
    }
}

/// How the supervisor ended.
pub enum SupervisorExit {
    /// With the command's exit code (128 + N when the command died by signal N).
    Code(i32),
    /// Killed by signal N itself: the command may still be running.
    Killed(i32),
}

/// Kills a process group outright.
pub fn kill_group(group: Pid) {
    let _ = killpg(group, Signal::SIGKILL);
}

/// Makes this process (the holder) a child subreaper, so that if the
/// supervisor is killed outright, the command and whatever it started are
/// re-parented to the holder instead of to init, and stay within its reach
/// even when the holder never learned the command's group.
pub fn adopt_orphans() -> std::io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)
}

/// After the supervisor was killed outright: kills `group` (when known) and
/// every descendant of this process (the supervisor's orphans are this
/// process's children now, see [`adopt_orphans`]), reaps them, and waits up
/// to `limit` until no process of the group runs and no descendant is left.
/// SIGKILL is only pending until its target next leaves the kernel (a process
/// in the middle of a write finishes it first), so the lease must not be given
/// up the moment the signal is sent. False when something still runs at
/// `limit` (stuck in uninterruptible sleep, for one).
pub async fn kill_orphans_and_wait(group: Option<Pid>, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    let mut group = group;
    loop {
        // Once the group has no running member it is never signalled again:
        // after its zombies are reaped, its id may name someone else's group.
        if let Some(g) = group {
            if group_runs(g) {
                kill_group(g);
            } else {
                group = None;
            }
        }
        let left = kill_descendants();
        for &pid in &left {
            // Only direct children can be reaped here; the others come to
            // this process once their parent is reaped.
            let _ = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        }
        if left.is_empty() && group.is_none_or(|g| !group_runs(g)) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// True when this process has any child left (running or a zombie).
pub fn has_descendants() -> bool {
    !children_of(i32::try_from(std::process::id()).unwrap_or(0)).is_empty()
}

/// Kills every descendant of this process and returns them. Each is killed
/// before its own children are read: a process with SIGKILL pending cannot
/// fork any more, so every child it made is in the list read after the kill,
/// and a tree that keeps forking cannot outrun the walk.
fn kill_descendants() -> Vec<Pid> {
    walk_descendants(|pid| {
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    })
}

/// Every descendant of this process, each passed to `visit` as it is found,
/// before its own children are read.
fn walk_descendants(mut visit: impl FnMut(Pid)) -> Vec<Pid> {
    let mut found: Vec<i32> = Vec::new();
    let mut stack = vec![i32::try_from(std::process::id()).unwrap_or(0)];
    while let Some(pid) = stack.pop() {
        for child in children_of(pid) {
            if !found.contains(&child) {
                visit(Pid::from_raw(child));
                found.push(child);
                stack.push(child);
            }
        }
    }
    found.into_iter().map(Pid::from_raw).collect()
}

/// The children of `pid`, from the kernel's children lists of each of its
/// threads (zombies included).
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut children = Vec::new();
    for task in tasks.flatten() {
        let Ok(list) = std::fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        children.extend(
            list.split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok()),
        );
    }
    children
}

/// True while some process of `group` is neither gone nor a zombie.
fn group_runs(group: Pid) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|entry| {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            return false;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        // After the parenthesised command name: state, ppid, pgrp.
        let mut fields = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace())
            .into_iter()
            .flatten();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|g| g.parse::<i32>().ok());
        pgrp == Some(group.as_raw()) && !matches!(state, Some("Z" | "X") | None)
    })
}

enum Event {
    Valid(u128),
    Stop(Duration),
    HolderGone,
    Signal,
    Exited(i32),
}

/// Forwards SIGTERM, SIGINT and SIGHUP to the supervisor's loop (a handler,
/// not an ignored disposition, so the command does not inherit it).
fn forward_signals(tx: mpsc::Sender<Event>) {
    std::thread::spawn(move || {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
                signal(SignalKind::hangup()),
            ) else {
                return;
            };
            loop {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                    _ = hup.recv() => {}
                }
                if tx.send(Event::Signal).is_err() {
                    return;
                }
            }
        });
    });
}

/// When standard input is a terminal: makes `group` its foreground process
/// group (so the command can read it) and returns the group to restore after.
fn take_terminal(group: Pid) -> Option<Pid> {
    let stdin = std::io::stdin();
    if !nix::unistd::isatty(&stdin).unwrap_or(false) {
        return None;
    }
    // A background group changing the terminal's foreground gets SIGTTOU
    // unless it blocks it; the command was started before this, so it does
    // not inherit the mask.
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let _ = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&ttou), None);
    let previous = nix::unistd::tcgetpgrp(&stdin).ok()?;
    nix::unistd::tcsetpgrp(&stdin, group).ok()?;
    // It may have stopped on SIGTTIN before it had the terminal.
    let _ = killpg(group, Signal::SIGCONT);
    Some(previous)
}

/// Every live (or not yet reaped) descendant of this process, found by
/// walking the kernel's children lists of each of its threads.
fn descendants() -> Vec<Pid> {
    walk_descendants(|_| {})
}

/// Sends `sig` to the command's group and to every descendant, also those
/// that left the group.
fn signal_tree(group: Pid, sig: Signal) {
    let _ = killpg(group, sig);
    for pid in descendants() {
        let _ = nix::sys::signal::kill(pid, sig);
    }
}

/// After the command exited (and was reaped): kills whatever of its tree is
/// left and reaps it, until no descendant remains or `limit` passed.
fn sweep(group: Pid, limit: Duration) {
    let until = deadline_ns(limit);
    loop {
        signal_tree(group, Signal::SIGKILL);
        // Reap what died; our own direct child is already reaped.
        while let Ok(status) =
            nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG))
        {
            if status == nix::sys::wait::WaitStatus::StillAlive {
                break;
            }
        }
        if descendants().is_empty() || monotonic_ns() >= until {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The supervisor's side (`lease supervise`): runs `cmd` in a new process
/// group and enforces what the holder said, or the holder's disappearance.
pub fn supervise(
    fd: i32,
    grace: Duration,
    gone_grace: Duration,
    valid_until_ns: u128,
    cmd: &[String],
) -> ExitCode {
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
    // Orphans of the command's tree come to us, not to init: a daemon that
    // double-forks stays within reach.
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!(
            "lease supervise: cannot become a child subreaper ({e}); processes that leave the command's group may outlive it"
        );
    }
    let (tx, rx) = mpsc::channel();
    forward_signals(tx.clone());
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
    let terminal = take_terminal(group);
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

    let signal = |sig: Signal| signal_tree(group, sig);
    let mut valid_until = valid_until_ns;
    // Once stopping: the end of the grace period after the SIGTERM.
    let mut grace_until: Option<u128> = None;
    let mut killed = false;
    let stop = |grace_until: &mut Option<u128>, g: Duration| {
        if grace_until.is_none() {
            signal(Signal::SIGTERM);
            *grace_until = Some(deadline_ns(g));
        }
    };
    loop {
        // SIGKILL at local validity, or at the end of the grace, whichever is first.
        let kill_at = grace_until.map_or(valid_until, |g| g.min(valid_until));
        let now = monotonic_ns();
        if now >= kill_at && !killed {
            signal(Signal::SIGKILL);
            killed = true;
        }
        let wait = if killed {
            Duration::from_secs(1)
        } else {
            Duration::from_nanos(u64::try_from(kill_at.saturating_sub(now)).unwrap_or(u64::MAX))
                .min(Duration::from_secs(1))
        };
        match rx.recv_timeout(wait) {
            Ok(Event::Valid(ns)) => valid_until = ns,
            Ok(Event::Stop(g)) => stop(&mut grace_until, g),
            Ok(Event::HolderGone) => stop(&mut grace_until, gone_grace),
            Ok(Event::Signal) => stop(&mut grace_until, grace),
            Ok(Event::Exited(code)) => {
                // The lease ends with the command: nothing it left behind may
                // keep running without it, in its group or out of it.
                sweep(group, Duration::from_secs(5));
                if let Some(previous) = terminal {
                    let _ = nix::unistd::tcsetpgrp(std::io::stdin(), previous);
                }
                return ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return ExitCode::from(70),
        }
    }
}

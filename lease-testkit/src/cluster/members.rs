//! What the topologies share: their members' data directories, and the
//! command-line probes (`redis-cli`, `psql`) they ask members with.

use std::process::Command;

use crate::{OwnedProcess, TempDir};

/// A directory for one member's data, in the test kit's per-process
/// directory (swept by later processes, since a suite keeps its cluster in a
/// `static` that is never dropped).
pub(super) fn member_dir(prefix: &str) -> TempDir {
    TempDir::new(prefix)
}

/// `127.0.0.1:P1,127.0.0.1:P2,...`: the ports of `processes` on loopback.
pub(super) fn loopback_hosts(processes: &[OwnedProcess]) -> String {
    processes
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs a command, returning its standard output when it succeeds.
pub(super) fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs one command on the Redis (or Sentinel) at `port` with `redis-cli
/// --raw`, returning its output lines.
pub(super) fn redis_cli(port: u16, args: &[&str]) -> Option<Vec<String>> {
    // redis-cli has no timeout of its own: a frozen server would hang it.
    let out = output(
        Command::new("timeout")
            .args([
                "2",
                "redis-cli",
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "--raw",
            ])
            .args(args)
            .stdin(std::process::Stdio::null()),
    )?;
    Some(out.lines().map(str::to_owned).collect())
}

/// Runs one SQL statement on the PostgreSQL at `port` with `psql`, returning
/// its unaligned output (bounded: a frozen server would hang psql).
pub(super) fn psql(port: u16, sql: &str) -> Option<String> {
    output(
        Command::new("timeout")
            .args(["5", "psql", "-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-tAX", "-c", sql])
            .env("PGCONNECT_TIMEOUT", "2")
            .stdin(std::process::Stdio::null()),
    )
    .map(|o| o.trim().to_owned())
}

//! Readiness: a store process is used only once it answers a real request of
//! its protocol, never merely once its port accepts a connection (a
//! PostgreSQL that listens may still answer "the database system is starting
//! up"; a Redis loading its AOF answers `-LOADING`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The request that proves a process serves, checked by
/// [`OwnedProcess::wait_ready`](crate::OwnedProcess::wait_ready).
#[derive(Debug, Clone)]
pub enum Readiness {
    /// The port accepts a connection, and nothing more: for members of a
    /// replicated store, which serve only once their peers are up (their
    /// topology's [`healthy`](crate::cluster::Topology::healthy) is the check).
    Listening,
    /// Redis or Sentinel: `PING` answers `PONG` (or `NOAUTH`: the server
    /// runs commands and wants a password), not `LOADING`.
    RedisPing,
    /// A TLS-only Redis: `redis-cli --tls` `PING`, with the CA certificate.
    RedisTlsPing {
        /// The CA certificate that signed the server's.
        ca: PathBuf,
    },
    /// PostgreSQL: `pg_isready`, then `SELECT 1` over its socket directory
    /// (trusted locally on every test server).
    Postgres,
    /// etcd: a linearizable read, which needs the raft leader and a quorum.
    Etcd {
        /// CA, client certificate and key for a TLS etcd.
        tls: Option<(PathBuf, PathBuf, PathBuf)>,
    },
    /// ZooKeeper: `srvr` shows the server's mode (standalone, leader or
    /// follower), which it does only once it serves clients.
    Zookeeper,
    /// MariaDB: `SELECT 1` as `root` over TCP answers 1.
    Mysql,
}

impl Readiness {
    /// What the check does, for a timeout's message.
    pub fn describe(&self) -> &'static str {
        match self {
            Readiness::Listening => "accepts a TCP connection",
            Readiness::RedisPing | Readiness::RedisTlsPing { .. } => "PING answers PONG",
            Readiness::Postgres => "pg_isready, then SELECT 1",
            Readiness::Etcd { .. } => "a linearizable read (etcdctl get --consistency=l)",
            Readiness::Zookeeper => "srvr shows a Mode",
            Readiness::Mysql => "SELECT 1 as root",
        }
    }

    /// Runs the check once against the process on `port` whose data (and
    /// PostgreSQL's socket) is in `dir`: `Ok` when it serves, else what it
    /// answered.
    pub fn check(&self, port: u16, dir: &Path) -> Result<(), String> {
        match self {
            Readiness::Listening => TcpStream::connect(("127.0.0.1", port))
                .map(drop)
                .map_err(|e| e.to_string()),
            Readiness::RedisPing => {
                let answer = tcp_exchange(port, b"PING\r\n")?;
                redis_answer(answer.lines().next().unwrap_or_default())
            }
            Readiness::RedisTlsPing { ca } => {
                let out = run(Command::new("timeout").args(["2", "redis-cli"]).args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "--tls",
                    "--cacert",
                    &ca.display().to_string(),
                    "--raw",
                    "PING",
                ]))?;
                redis_answer(out.trim())
            }
            Readiness::Postgres => {
                let host = dir.display().to_string();
                let port = port.to_string();
                run(Command::new(crate::pg_bindir().join("pg_isready"))
                    .args(["-h", &host, "-p", &port, "-t", "2"]))?;
                let one = run(Command::new("timeout")
                    .args(["5", "psql", "-h", &host, "-p", &port])
                    .args(["-U", "postgres", "-d", "postgres", "-tAXc", "SELECT 1"]))?;
                if one.trim() == "1" {
                    Ok(())
                } else {
                    Err(format!("SELECT 1 answered {one:?}"))
                }
            }
            Readiness::Etcd { tls } => {
                let scheme = if tls.is_some() { "https" } else { "http" };
                let mut cmd = Command::new("etcdctl");
                cmd.env("ETCDCTL_API", "3")
                    .arg(format!("--endpoints={scheme}://127.0.0.1:{port}"))
                    .arg("--command-timeout=2s");
                if let Some((ca, cert, key)) = tls {
                    cmd.arg(format!("--cacert={}", ca.display()))
                        .arg(format!("--cert={}", cert.display()))
                        .arg(format!("--key={}", key.display()));
                }
                cmd.args(["get", "--consistency=l", "lease-testkit-ready"]);
                run(&mut cmd).map(drop)
            }
            Readiness::Mysql => {
                let one = run(Command::new("timeout").args(["5", "mariadb"]).args([
                    "-h",
                    "127.0.0.1",
                    "-P",
                    &port.to_string(),
                    "-u",
                    "root",
                    "-N",
                    "-e",
                    "SELECT 1",
                ]))?;
                if one.trim() == "1" {
                    Ok(())
                } else {
                    Err(format!("SELECT 1 answered {one:?}"))
                }
            }
            Readiness::Zookeeper => {
                let answer = tcp_exchange(port, b"srvr")?;
                match answer.lines().find_map(|l| l.strip_prefix("Mode: ")) {
                    Some(_) => Ok(()),
                    None => Err(answer.trim().to_owned()),
                }
            }
        }
    }
}

/// `PONG`, or `NOAUTH` (the server runs commands but wants a password), is
/// ready; anything else (`LOADING`, `BUSY`, nothing) is what it answered.
fn redis_answer(line: &str) -> Result<(), String> {
    let line = line.trim().trim_start_matches(['+', '-']);
    if line == "PONG" || line.starts_with("NOAUTH") {
        Ok(())
    } else {
        Err(format!("PING answered {line:?}"))
    }
}

/// Sends `request` to `127.0.0.1:port` on a fresh connection and reads what
/// comes back within two seconds (until the server closes, or, for a
/// request ending in CRLF, the first chunk that does).
///
/// # Errors
/// When it cannot connect or send, or nothing comes back.
pub fn tcp_exchange(port: u16, request: &[u8]) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )
    .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    s.write_all(request).map_err(|e| format!("send: {e}"))?;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                // A Redis reply is one line; ZooKeeper closes after `srvr`.
                if request.ends_with(b"\r\n") && out.ends_with(b"\r\n") {
                    break;
                }
            }
            Err(e) if out.is_empty() => return Err(format!("read: {e}")),
            Err(_) => break,
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Runs `cmd` (stdin closed): its standard output when it succeeds, else its
/// status and output.
fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{:?} exited with {}: {}{}",
            cmd.get_program(),
            out.status,
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

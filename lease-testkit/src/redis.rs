//! Private Redis servers: plain, durable, with extra arguments, over TLS.

use crate::{OwnedProcess, Readiness, TempDir, TestCa, free_port, free_port_and};

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
    redis_on(port, dir, durable, extra, None)
}

/// A `redis-server` on `port` with its data in `dir`, as `run_as` (uid,
/// gid; `dir` must be theirs) when given.
pub(crate) fn redis_on(
    port: u16,
    dir: TempDir,
    durable: bool,
    extra: &[&str],
    run_as: Option<(u32, u32)>,
) -> OwnedProcess {
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
    OwnedProcess::start_as(
        "redis-server",
        "redis-server",
        args,
        port,
        dir,
        Readiness::RedisPing,
        run_as,
    )
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

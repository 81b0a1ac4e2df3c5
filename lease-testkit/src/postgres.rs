//! Private PostgreSQL servers: plain, over TLS, a primary and its streaming
//! standby.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use crate::{OwnedProcess, Readiness, TempDir, TestCa, free_port, pg_bindir};

/// Hands `dir` to the `postgres` user when running as root (the server
/// programs refuse to run as root) and returns that user's uid and gid to
/// run them as; `None` when not root.
pub(crate) fn owned_by_postgres(dir: &Path) -> Option<(u32, u32)> {
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

//! Private MariaDB servers, for tests that stop, kill or freeze one.

use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::{OwnedProcess, Readiness, TempDir, free_port};

/// The uid and gid of the `mysql` user when running as root (the server
/// runs as it), else `None`.
pub(crate) fn mysql_user() -> Option<(u32, u32)> {
    let id = |args: &[&str]| -> Option<u32> {
        let out = Command::new("id").args(args).output().ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    if id(&["-u"])? != 0 {
        return None;
    }
    Some((id(&["-u", "mysql"])?, id(&["-g", "mysql"])?))
}

/// `mariadb-install-db` into `data`, as `run_as`: system tables and a
/// `root` login without a password on loopback. Returns the server option
/// `--tmpdir=…` for a temporary directory of its own beside `data`.
///
/// The bootstrap server keeps its internal temporary tables in that
/// directory, not in the shared system one: a CI run once lost a bootstrap
/// to "Error on delete of '/tmp/#sql-temptable-….MAI'" while other servers
/// started beside it. A failed bootstrap is tried once more on an emptied
/// data directory, and the second failure's output is the panic message.
///
/// # Panics
/// When it fails twice; the message shows its output.
pub(crate) fn install_db(data: &std::path::Path, run_as: Option<(u32, u32)>) -> String {
    let tmp = data.with_file_name("tmp");
    std::fs::create_dir_all(&tmp).expect("create the server's tmpdir");
    if let Some((uid, gid)) = run_as {
        let _ = std::os::unix::fs::chown(&tmp, Some(uid), Some(gid));
    }
    let tmpdir = format!("--tmpdir={}", tmp.display());
    let mut failure = String::new();
    for _ in 0..2 {
        let _ = std::fs::remove_dir_all(data);
        let mut install = Command::new("mariadb-install-db");
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(&tmpdir)
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
        if let Some((uid, gid)) = run_as {
            install.uid(uid).gid(gid);
        }
        let out = install
            .output()
            .unwrap_or_else(|e| panic!("cannot run mariadb-install-db: {e}"));
        if out.status.success() {
            return tmpdir;
        }
        failure = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    panic!("mariadb-install-db failed twice:\n{failure}");
}

/// Runs one statement as `root` on the MariaDB at `port` with the `mariadb`
/// client (bounded: a frozen server would hang it); its tab-separated
/// output.
pub(crate) fn mariadb(port: u16, sql: &str) -> Option<String> {
    let out = Command::new("timeout")
        .args(["5", "mariadb", "-h", "127.0.0.1", "-P", &port.to_string()])
        .args(["-u", "root", "-N", "-e", sql])
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A private MariaDB that takes TCP clients only over TLS
/// (`require_secure_transport`, a server certificate from `ca` naming
/// `localhost` and `127.0.0.1`), with a login `tls` whose password is
/// `password`. It also listens on 127.0.0.2, which the certificate does not
/// name. Readiness is only that it listens: the readiness check's client
/// does not speak TLS by default.
///
/// # Panics
/// As [`owned_mysql`].
pub fn owned_mysql_tls(ca: &crate::TestCa, password: &str) -> OwnedProcess {
    let (cert, key) = ca.server();
    let ca_file = ca.ca();
    let password = password.to_owned();
    owned_mysql_with(
        move |dir| {
            let mut files = Vec::new();
            for (from, to) in [
                (ca_file, "ca.pem"),
                (cert, "server.pem"),
                (key, "server.key"),
            ] {
                let path = dir.join(to);
                std::fs::copy(&from, &path).expect("copy the TLS files");
                files.push(path);
            }
            let init = dir.join("users.sql");
            std::fs::write(
                &init,
                format!(
                    "CREATE DATABASE IF NOT EXISTS lease;\n\
                     CREATE USER IF NOT EXISTS 'tls'@'%' IDENTIFIED BY '{password}' REQUIRE SSL;\n\
                     GRANT ALL ON lease.* TO 'tls'@'%';\n"
                ),
            )
            .expect("write users.sql");
            vec![
                format!("--ssl-ca={}", files[0].display()),
                format!("--ssl-cert={}", files[1].display()),
                format!("--ssl-key={}", files[2].display()),
                "--require-secure-transport=ON".into(),
                "--bind-address=127.0.0.1,127.0.0.2".into(),
                format!("--init-file={}", init.display()),
            ]
        },
        Readiness::Listening,
    )
}

/// A private MariaDB server on a free port, data in a temporary directory,
/// every commit flushed (`innodb_flush_log_at_trx_commit` 1), a database
/// `lease` and a `root` login without a password on loopback. Its URL:
/// `mysql://root@127.0.0.1:PORT/lease`. `extra` are more server options.
///
/// # Panics
/// When mariadb-install-db or the server fails; the message shows the log.
pub fn owned_mysql(extra: &[&str]) -> OwnedProcess {
    let extra: Vec<String> = extra.iter().map(|a| (*a).to_owned()).collect();
    owned_mysql_with(move |_| extra, Readiness::Mysql)
}

/// A private MariaDB; `configure(its directory)` writes any files it needs
/// there and returns more server options (an `--init-file` among them
/// replaces the default one).
fn owned_mysql_with(
    configure: impl FnOnce(&std::path::Path) -> Vec<String>,
    readiness: Readiness,
) -> OwnedProcess {
    let port = free_port();
    let dir = TempDir::new("lease-mysql");
    let extra = configure(dir.path());
    let run_as = mysql_user();
    if let Some((uid, gid)) = run_as {
        let _ = Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{gid}"))
            .arg(dir.path())
            .status();
    }
    let data = dir.path().join("data");
    let tmpdir = install_db(&data, run_as);
    let init = dir.path().join("init.sql");
    std::fs::write(&init, "CREATE DATABASE IF NOT EXISTS lease;\n").expect("write init.sql");
    let mut args: Vec<String> = vec![
        "--no-defaults".into(),
        format!("--datadir={}", data.display()),
        format!("--port={port}"),
        "--bind-address=127.0.0.1".into(),
        format!("--socket={}", dir.path().join("sock").display()),
        format!("--pid-file={}", dir.path().join("pid").display()),
        "--skip-name-resolve".into(),
        "--skip-log-bin".into(),
        "--innodb-buffer-pool-size=32M".into(),
        "--innodb-flush-log-at-trx-commit=1".into(),
        tmpdir,
    ];
    // An --init-file among `extra` replaces the default one.
    if !extra.iter().any(|a| a.starts_with("--init-file=")) {
        args.push(format!("--init-file={}", init.display()));
    }
    args.extend(extra);
    let mut p = OwnedProcess {
        name: "mysql".into(),
        program: "mariadbd".into(),
        args,
        port,
        log: dir.path().join("mysql.log"),
        child: None,
        run_as: None,
        stop_signal: "TERM",
        readiness,
        dir,
    }
    .configured(run_as, "TERM");
    p.start_again();
    p
}

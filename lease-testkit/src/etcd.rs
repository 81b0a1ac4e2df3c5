//! Private single-member etcd servers, plain and over TLS, and `etcdctl`
//! against them.

use std::process::Command;

use crate::{OwnedProcess, Readiness, TempDir, TestCa, free_port};

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

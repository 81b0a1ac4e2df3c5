//! `TestCa`: a certificate authority made for one test, and the server and
//! client certificates it signs.

use std::path::PathBuf;
use std::process::Command;

use crate::TempDir;

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

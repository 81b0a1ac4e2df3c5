//! `EtcdConfig` and `EtcdTls`: how to reach etcd.

use std::time::Duration;

use lease_api::backend::DEFAULT_NAMESPACE;

/// TLS settings for `https://` endpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdTls {
    /// The CA that signed the servers' certificates (PEM); the system's roots
    /// when `None`.
    pub ca: Option<std::path::PathBuf>,
    /// A client certificate and its key (PEM), for servers started with
    /// `--client-cert-auth`.
    pub identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl EtcdTls {
    /// Trusts the CA in `ca` (PEM) instead of the system's roots.
    pub fn ca(mut self, ca: impl Into<std::path::PathBuf>) -> Self {
        self.ca = Some(ca.into());
        self
    }

    /// Presents the client certificate `cert` with its key `key` (both PEM).
    pub fn identity(
        mut self,
        cert: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.identity = Some((cert.into(), key.into()));
        self
    }
}

/// How to reach etcd. `Debug` never shows the password.
#[derive(Clone)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// One or more endpoints, `http://host:port` or `https://host:port`.
    pub endpoints: Vec<String>,
    /// An etcd user and password (etcd's `auth enable`), if any.
    pub credentials: Option<(String, String)>,
    /// TLS settings for `https://` endpoints.
    pub tls: EtcdTls,
    /// The namespace; providers in different namespaces never see each other.
    pub namespace: String,
    /// How long to wait for a connection.
    pub connect_timeout: Duration,
    /// How long to wait for one request.
    pub request_timeout: Duration,
}

impl EtcdConfig {
    /// A configuration for `endpoints` with the default namespace and timeouts.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            credentials: None,
            tls: EtcdTls::default(),
            namespace: DEFAULT_NAMESPACE.into(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(3),
        }
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets both timeouts.
    pub fn timeouts(mut self, connect: Duration, request: Duration) -> Self {
        self.connect_timeout = connect;
        self.request_timeout = request;
        self
    }

    /// Authenticates as an etcd user.
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some((user.into(), password.into()));
        self
    }

    /// Sets the TLS settings (used with `https://` endpoints).
    pub fn tls(mut self, tls: EtcdTls) -> Self {
        self.tls = tls;
        self
    }
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("user", &self.credentials.as_ref().map(|(u, _)| u))
            .field("tls", &self.tls)
            .field("namespace", &self.namespace)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

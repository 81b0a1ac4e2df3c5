//! `ZkConfig`: how to reach ZooKeeper, and the ACLs of the nodes a provider makes.

use std::time::Duration;

use lease_api::backend::DEFAULT_NAMESPACE;
use zookeeper_client::{Acl, Permission};

/// How to reach ZooKeeper.
#[derive(Clone)]
#[non_exhaustive]
pub struct ZkConfig {
    /// Comma-separated `host:port` list, e.g. `zk1:2181,zk2:2181,zk3:2181`.
    pub hosts: String,
    /// An optional chroot (`/apps/billing`) under which every node lives.
    pub chroot: Option<String>,
    /// The namespace; providers in different namespaces never see each other.
    pub namespace: String,
    /// The session timeout. Leases on a session end when it expires, so local
    /// validity never extends past it (see [`Capabilities::holder_session`](lease_api::Capabilities::holder_session)).
    pub session_timeout: Duration,
    /// How long to wait for a connection.
    pub connect_timeout: Duration,
    /// How long to wait for one request.
    pub request_timeout: Duration,
    /// A `digest` identity (user, password). With one, every node the provider
    /// creates carries an ACL that gives this identity all rights and everyone
    /// else only reading; without, nodes are open to anyone.
    pub digest: Option<(String, String)>,
}

impl std::fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkConfig")
            .field("hosts", &self.hosts)
            .field("chroot", &self.chroot)
            .field("namespace", &self.namespace)
            .field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("digest_user", &self.digest.as_ref().map(|(u, _)| u))
            .finish()
    }
}

/// Nodes of a provider with a digest identity: all rights to that identity
/// (`auth`), reading to anyone.
pub(crate) static SECURED: [Acl; 2] = [
    Acl::new_const(Permission::ALL, "auth", ""),
    Acl::new_const(Permission::READ, "world", "anyone"),
];

/// Shared parents (the chroot and `/lease`) of a provider with a digest
/// identity: other identities may read and create their own namespaces under
/// them, but not delete or rewrite anything.
pub(crate) static SHARED_PARENT: std::sync::LazyLock<[Acl; 2]> = std::sync::LazyLock::new(|| {
    [
        Acl::new_const(Permission::ALL, "auth", ""),
        Acl::new(
            Permission::READ | Permission::CREATE,
            zookeeper_client::AuthId::anyone(),
        ),
    ]
});

impl ZkConfig {
    /// A configuration for `hosts` with defaults for everything else.
    pub fn new(hosts: impl Into<String>) -> Self {
        ZkConfig {
            hosts: hosts.into(),
            chroot: None,
            namespace: DEFAULT_NAMESPACE.into(),
            session_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(3),
            digest: None,
        }
    }

    /// Authenticates with ZooKeeper's `digest` scheme as `user` (see [`ZkConfig::digest`]).
    pub fn digest(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.digest = Some((user.into(), password.into()));
        self
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets the chroot.
    pub fn chroot(mut self, chroot: impl Into<String>) -> Self {
        self.chroot = Some(chroot.into());
        self
    }

    /// Sets the session timeout.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Sets connect and request timeouts.
    pub fn timeouts(mut self, connect: Duration, request: Duration) -> Self {
        self.connect_timeout = connect;
        self.request_timeout = request;
        self
    }
}

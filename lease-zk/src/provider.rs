//! `ZkProvider`.

use crate::issued::Issued;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::{
    DEFAULT_MAX_TTL, DEFAULT_NAMESPACE, KeyWatch, LeaseHandle, OwnerId, Place, SessionStore,
    Ticket, WaitQueue, validate_namespace,
};
use lease_api::backend::{bounded, drift_margin};
use lease_api::{
    Capabilities, ExpiryClock, Failover, FailoverTokens, FencingToken, Lease, LeaseError,
    LeaseInfo, LeaseKey, LeaseProvider, Notifications, Result, TokenDurability, TryAcquire,
};
use tokio::time::Instant;
use zookeeper_client::{
    Acl, Acls, Client, CreateMode, Error as ZkError, EventType, MultiReadResult, MultiWriteError,
    MultiWriteResult, OneshotWatcher, Permission, SessionState, Stat,
};

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
    /// validity never extends past it (see [`Capabilities::holder_session`]).
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
static SECURED: [Acl; 2] = [
    Acl::new_const(Permission::ALL, "auth", ""),
    Acl::new_const(Permission::READ, "world", "anyone"),
];

/// Shared parents (the chroot and `/lease`) of a provider with a digest
/// identity: other identities may read and create their own namespaces under
/// them, but not delete or rewrite anything.
static SHARED_PARENT: std::sync::LazyLock<[Acl; 2]> = std::sync::LazyLock::new(|| {
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

/// Encodes a namespace or key into ONE path segment: every byte but ASCII
/// letters, digits, `-` and `_` is percent-encoded, so no `/`, `.` or `..`
/// can appear and the mapping is injective.
pub(crate) fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

struct Inner {
    config: ZkConfig,
    client: tokio::sync::Mutex<Option<Client>>,
    ns_path: String,
    /// Declared before the first session, with the timeout asked for.
    asked_caps: Capabilities,
    /// Declared once a session exists, with the timeout the server granted.
    granted_caps: std::sync::OnceLock<Capabilities>,
    /// Clean-ups of timed-out acquires still running (see `flush`).
    cleanups: tokio_util::task::TaskTracker,
    /// The last server-clock sample, shared by every caller (see `shared_now`).
    clock: tokio::sync::Mutex<Option<ClockSample>>,
    /// The leases this provider acquired and still holds, for one-round-trip
    /// extend and release (see `Issued`).
    issued: Issued,
}

/// A reading of the server's clock: a probe write's mtime, and when its answer
/// arrived. The mtime was set before the answer left the server, so
/// `mtime + elapsed since arrival` never runs ahead of the server's clock.
#[derive(Clone, Copy)]
pub(crate) struct ClockSample {
    mtime: i64,
    received: Instant,
}

/// How long one clock sample serves every caller of a provider: inspect, the
/// expiry judgement of try_acquire and waiter wake-ups make at most one probe
/// write per interval.
const CLOCK_SAMPLE_REUSE: Duration = Duration::from_secs(1);

/// Leases on ZooKeeper: ephemeral holder nodes, czxid tokens, expiry judged on
/// the server's clock, watches for waiting. See the crate docs.
#[derive(Clone)]
pub struct ZkProvider {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ZkProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkProvider")
            .field("hosts", &self.inner.config.hosts)
            .field("namespace", &self.inner.config.namespace)
            .finish_non_exhaustive()
    }
}

/// The state a takeover was judged on: read together in one multi-read.
#[derive(Clone, Copy)]
struct Judged {
    epoch: i32,
    holder_version: i32,
}

/// The paths of one lease.
struct Paths {
    /// Persistent; its version is the acquisition epoch.
    key: String,
    /// Ephemeral; data `owner:ttl_ms:holder label`; czxid is the token.
    holder: String,
}

fn holder_data(owner: OwnerId, ttl: Duration, label: &str) -> Vec<u8> {
    format!("{}:{}:{label}", owner.to_hex(), ttl.as_millis()).into_bytes()
}

/// Owner, TTL and (when recorded) holder label of a holder node's data; nodes
/// written before labels existed end after the TTL.
pub(crate) fn parse_holder(data: &[u8]) -> Option<(OwnerId, Duration, Option<String>)> {
    let s = std::str::from_utf8(data).ok()?;
    let (owner, rest) = s.split_once(':')?;
    let (ttl, label) = match rest.split_once(':') {
        Some((t, l)) => (t, Some(l.to_owned())),
        None => (rest, None),
    };
    Some((
        OwnerId::from_hex(owner)?,
        Duration::from_millis(ttl.parse().ok()?),
        label,
    ))
}

fn unavailable(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::ConnectionLoss
            | ZkError::Timeout
            | ZkError::NoHosts
            | ZkError::ClientClosed
            | ZkError::SessionExpired
            | ZkError::SessionMoved
            | ZkError::Throttled
            // The client's own "no response from connection" and the like.
            | ZkError::Custom(_)
    )
}

fn multi_err(e: MultiWriteError) -> ZkError {
    e.into()
}

/// What an ensemble's failover does, for a session timeout of `session`: a
/// czxid carries the leader epoch in its high bits and is returned only after
/// a quorum logged the write, so tokens keep growing. The holder node is
/// ephemeral and the session moves to another server, but a lease's local
/// validity is two thirds of the session timeout after its last renewal
/// (`bounded_validity`), and renewals come every third of that: a lease
/// survives when the ensemble elects a leader and the client reconnects
/// within a third of the session timeout, which is the recovery bound
/// declared. With ZooKeeper's default tickTime of 2 s an election takes
/// seconds: give sessions 15 s or more where leases must survive a failover.
fn failover(session: Duration) -> Failover {
    Failover::new(
        FailoverTokens::Increasing(
            "czxids carry the leader epoch and are returned after a quorum logged the write".into(),
        ),
        true,
        session / 3,
    )
}

impl ZkProvider {
    /// Sets up a provider; the session is opened on first use.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for an empty host list, a chroot that is not an
    /// absolute path, or a bad namespace.
    pub fn new(config: ZkConfig) -> Result<Self> {
        validate_namespace(&config.namespace)?;
        if config.hosts.trim().is_empty() || config.hosts.contains('/') {
            return Err(LeaseError::Config(format!(
                "ZooKeeper hosts {:?} must be host:port[,host:port...]; give a chroot separately",
                config.hosts
            )));
        }
        if let Some(c) = &config.chroot
            && (!c.starts_with('/') || c.ends_with('/') || c.contains("//"))
        {
            return Err(LeaseError::Config(format!(
                "ZooKeeper chroot {c:?} must be an absolute path like /apps/lease"
            )));
        }
        let caps = Capabilities::new(
            "zookeeper",
            ExpiryClock::ServerWallClock,
            Notifications::Native("ZooKeeper watch"),
        )
        .with_fair_waiting(true)
        .with_ttl_limits(Duration::from_millis(100), DEFAULT_MAX_TTL)
        // Expiry is judged against a probe write's mtime: millisecond
        // timestamps of the leader's clock.
        .with_expiry_slack(Duration::from_millis(50))
        .with_durable_tokens(TokenDurability::Durable(
            "tokens are czxids: global transaction ids that include the leader epoch, persisted by every quorum write".into(),
        ))
        .with_holder_session(Some(config.session_timeout))
        .with_failover(Some(failover(config.session_timeout)));
        Ok(ZkProvider {
            inner: Arc::new(Inner {
                ns_path: format!("/lease/{}", segment(&config.namespace)),
                config,
                client: tokio::sync::Mutex::new(None),
                asked_caps: caps,
                granted_caps: std::sync::OnceLock::new(),
                clock: tokio::sync::Mutex::new(None),
                cleanups: tokio_util::task::TaskTracker::new(),
                issued: Issued::default(),
            }),
        })
    }

    /// The holder node of `key`.
    pub(crate) fn holder_path(&self, key: &LeaseKey) -> String {
        self.paths(key).holder
    }

    /// A provider with the same configuration and a ZooKeeper session of
    /// its own (opened on first use).
    pub(crate) fn fresh(&self) -> Result<Self> {
        ZkProvider::new(self.inner.config.clone())
    }

    /// Closes this provider's ZooKeeper session, which deletes its
    /// ephemeral holder nodes; a later call opens a new one.
    pub(crate) async fn close_session(&self) {
        self.inner.client.lock().await.take();
    }

    fn paths(&self, key: &LeaseKey) -> Paths {
        let key = format!("{}/{}", self.inner.ns_path, segment(key.as_str()));
        Paths {
            holder: format!("{key}/holder"),
            key,
        }
    }

    /// The ACL of the shared parents (chroot, `/lease`).
    fn parent_acls(&self) -> Acls<'static> {
        if self.inner.config.digest.is_some() {
            Acls::new(&*SHARED_PARENT)
        } else {
            Acls::anyone_all()
        }
    }

    /// The ACL of every node this provider creates below `/lease`.
    fn acls(&self) -> Acls<'static> {
        if self.inner.config.digest.is_some() {
            Acls::new(&SECURED)
        } else {
            Acls::anyone_all()
        }
    }

    pub(crate) fn map_err(&self, e: ZkError) -> LeaseError {
        if matches!(
            e,
            ZkError::NoAuth | ZkError::AuthFailed | ZkError::InvalidAcl
        ) {
            return LeaseError::denied(
                format!(
                    "ZooKeeper at {} refused our identity or its ACLs",
                    self.inner.config.hosts
                ),
                e,
            );
        }
        if unavailable(&e) {
            LeaseError::unavailable(
                format!("ZooKeeper at {} is unreachable", self.inner.config.hosts),
                e,
            )
        } else {
            LeaseError::backend(
                format!(
                    "ZooKeeper at {} answered with an error",
                    self.inner.config.hosts
                ),
                e,
            )
        }
    }

    /// The session's client; a new session when there is none or it ended.
    pub(crate) async fn client(&self) -> Result<Client> {
        let mut slot = self.inner.client.lock().await;
        if let Some(c) = slot.as_ref() {
            match c.state() {
                SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {}
                // The client would queue requests until it reconnects and then
                // send them, long after we gave up on them: an acquire could come
                // back to life as a lease nobody knows about. Refuse instead.
                SessionState::Disconnected => {
                    return Err(LeaseError::Unavailable {
                        message: format!(
                            "the connection to ZooKeeper at {} is down; the client is reconnecting",
                            self.inner.config.hosts
                        ),
                        source: None,
                    });
                }
                _ => return Ok(c.clone()),
            }
        }
        let c = &self.inner.config;
        let connect = Client::connector()
            .with_session_timeout(c.session_timeout)
            .with_connection_timeout(c.connect_timeout)
            .with_fail_eagerly()
            .connect(&c.hosts);
        let mut client = bounded(
            "connecting",
            c.connect_timeout + c.request_timeout,
            connect,
            |e| self.map_err(e),
        )
        .await?;
        // The identity, before any node is touched; the client sends it again
        // after every reconnect.
        if let Some((user, password)) = &c.digest {
            let auth = format!("{user}:{password}");
            let authed = client.auth("digest", auth.as_bytes());
            bounded("authenticating", c.request_timeout, authed, |e| {
                self.map_err(e)
            })
            .await?;
        }
        // The chroot is created if missing, then every path is relative to it.
        if let Some(chroot) = &c.chroot {
            let persistent = CreateMode::Persistent.with_acls(self.parent_acls());
            let made = client.mkdir(chroot, &persistent);
            match self.bounded("creating the chroot", made).await? {
                Ok(()) | Err(ZkError::NodeExists) => {}
                Err(e) => return Err(self.map_err(e)),
            }
            client = client.chroot(chroot.as_str()).map_err(|_| {
                LeaseError::Config(format!("ZooKeeper chroot {chroot:?} is not a valid path"))
            })?;
        }
        // The namespace node: the parent of every lease, and the clock probe.
        for (path, acls) in [
            ("/lease", self.parent_acls()),
            (self.inner.ns_path.as_str(), self.acls()),
        ] {
            let created = client.create(path, b"", &CreateMode::Persistent.with_acls(acls));
            match self.bounded("creating the namespace node", created).await? {
                Ok(_) | Err(ZkError::NodeExists) => {}
                Err(e) => return Err(self.map_err(e)),
            }
        }
        // The server clamps the session timeout to its [min, max]SessionTimeout:
        // what counts is the timeout it granted, never the one we asked for.
        let granted = client.session_timeout();
        if granted != c.session_timeout {
            tracing::info!(
                asked = ?c.session_timeout,
                granted = ?granted,
                "ZooKeeper granted a different session timeout; leases follow the granted one"
            );
        }
        let _ = self.inner.granted_caps.set(
            self.inner
                .asked_caps
                .clone()
                .with_holder_session(Some(granted))
                .with_failover(Some(failover(granted))),
        );
        // A new session may be served by another server: take a new clock sample.
        *self.inner.clock.lock().await = None;
        *slot = Some(client.clone());
        Ok(client)
    }

    fn caps(&self) -> &Capabilities {
        self.inner
            .granted_caps
            .get()
            .unwrap_or(&self.inner.asked_caps)
    }

    /// One request bounded by the request timeout. An error of reachability
    /// becomes the `LeaseError`; any other ZooKeeper answer is the caller's to read.
    pub(crate) async fn bounded<T>(
        &self,
        what: &'static str,
        f: impl std::future::Future<Output = Result<T, ZkError>>,
    ) -> Result<Result<T, ZkError>> {
        let answer = async {
            match f.await {
                Err(e) if unavailable(&e) => Err(e),
                r => Ok(r),
            }
        };
        bounded(what, self.inner.config.request_timeout, answer, |e| {
            self.map_err(e)
        })
        .await
    }

    /// Deletes the znodes of every namespace whose name starts with `prefix`
    /// (key nodes, holder nodes, the namespace node), whoever holds them, and
    /// returns how many went. A holder's session then sees its lease gone at
    /// its next extend. Only for namespaces nobody uses any more, such as a
    /// finished `lease conformance` run's.
    ///
    /// # Errors
    /// `Config` for an empty prefix; `Unavailable` when ZooKeeper is unreachable;
    /// `Backend` when a node gained children while it was being deleted.
    pub async fn purge_namespaces(&self, prefix: &str) -> Result<u64> {
        lease_api::backend::validate_purge_prefix(prefix)?;
        let client = self.client().await?;
        let wanted = segment(prefix);
        let namespaces = match self.bounded("list", client.list_children("/lease")).await? {
            Ok(c) => c,
            Err(ZkError::NoNode) => return Ok(0),
            Err(e) => return Err(self.map_err(e)),
        };
        // Every node below the matching namespaces, parents before children.
        let mut nodes: Vec<String> = namespaces
            .into_iter()
            .filter(|n| n.starts_with(&wanted))
            .map(|n| format!("/lease/{n}"))
            .collect();
        let mut i = 0;
        while i < nodes.len() {
            match self
                .bounded("list", client.list_children(&nodes[i]))
                .await?
            {
                Ok(children) => {
                    let parent = nodes[i].clone();
                    nodes.extend(children.into_iter().map(|c| format!("{parent}/{c}")));
                }
                Err(ZkError::NoNode) => {}
                Err(e) => return Err(self.map_err(e)),
            }
            i += 1;
        }
        let mut deleted = 0;
        for node in nodes.iter().rev() {
            match self.bounded("delete", client.delete(node, None)).await? {
                Ok(()) => deleted += 1,
                Err(ZkError::NoNode) => {}
                Err(e) => return Err(self.map_err(e)),
            }
        }
        Ok(deleted)
    }

    /// One probe write to the namespace node: its mtime is the server's clock.
    pub(crate) async fn probe_clock(&self, client: &Client) -> Result<ClockSample> {
        let stat = self
            .bounded(
                "the clock probe",
                client.set_data(&self.inner.ns_path, b"", None),
            )
            .await?
            .map_err(|e| self.map_err(e))?;
        Ok(ClockSample {
            mtime: stat.mtime,
            received: Instant::now(),
        })
    }

    /// The server's clock now, in ms, from a fresh probe (kept as the shared sample).
    async fn server_now(&self, client: &Client) -> Result<i64> {
        let sample = self.probe_clock(client).await?;
        *self.inner.clock.lock().await = Some(sample);
        Ok(sample.mtime)
    }

    /// A lower bound of the server's clock, from a sample at most
    /// [`CLOCK_SAMPLE_REUSE`] old advanced by our monotonic clock; one probe
    /// write serves every concurrent caller. Being a lower bound, it never
    /// judges a lease expired early: a takeover may come one round trip late,
    /// and `inspect` may overstate the remaining TTL by as much.
    /// Reads `path` as another client left it, with the shared clock. A
    /// follower answers reads from what it has applied, which may lag a
    /// release or an acquire another client already saw acknowledged, so a
    /// `sync` goes first. Requests are sent in call order and a session's
    /// requests are answered in order, so the read waits for the sync at no
    /// round trip of its own.
    async fn read_synced(
        &self,
        client: &Client,
        path: &str,
    ) -> Result<(std::result::Result<(Vec<u8>, Stat), ZkError>, Result<i64>)> {
        let synced = client.sync(path);
        let read = client.get_data(path);
        let (synced, current, now) = tokio::join!(
            self.bounded("sync", synced),
            self.bounded("get", read),
            self.shared_now(client)
        );
        synced?.map_err(|e| self.map_err(e))?;
        Ok((current?, now))
    }

    async fn shared_now(&self, client: &Client) -> Result<i64> {
        let mut slot = self.inner.clock.lock().await;
        if let Some(sample) = *slot {
            let age = sample.received.elapsed();
            if age < CLOCK_SAMPLE_REUSE {
                return Ok(sample.mtime + i64::try_from(age.as_millis()).unwrap_or(0));
            }
        }
        let sample = self.probe_clock(client).await?;
        *slot = Some(sample);
        Ok(sample.mtime)
    }

    async fn ensure_key_node(&self, client: &Client, paths: &Paths) -> Result<()> {
        let created = client.create(
            &paths.key,
            b"",
            &CreateMode::Persistent.with_acls(self.acls()),
        );
        match self.bounded("creating the key node", created).await? {
            Ok(_) | Err(ZkError::NodeExists) => Ok(()),
            Err(e) => Err(self.map_err(e)),
        }
    }

    /// Create the holder node and bump the key node's version (the epoch), in
    /// one multi; `take_over` deletes an expired holder first, at the holder
    /// version and the epoch that were judged expired.
    async fn claim(
        &self,
        client: &Client,
        paths: &Paths,
        data: &[u8],
        take_over: Option<Judged>,
    ) -> Result<Result<(i64, i32), ZkError>> {
        let mut w = client.new_multi_writer();
        let ephemeral = CreateMode::Ephemeral.with_acls(self.acls());
        let built = (|| {
            if let Some(judged) = take_over {
                // The epoch check makes concurrent takeovers exclusive: a fresh
                // holder node starts at version 0 again, so the holder version
                // alone would let a second contender delete the first one's node.
                w.add_check_version(&paths.key, judged.epoch)?;
                w.add_delete(&paths.holder, Some(judged.holder_version))?;
            }
            w.add_create(&paths.holder, data, &ephemeral)?;
            w.add_set_data(&paths.key, b"", None)
        })();
        if let Err(e) = built {
            return Err(self.map_err(e));
        }
        let results = match self
            .bounded("acquire", async { w.commit().await.map_err(multi_err) })
            .await
        {
            Ok(r) => r,
            Err(e) => {
                // The multi may still commit: requests of one session run in
                // order, so an owner-guarded delete sent now runs after it.
                self.remove_if_ours_in_background(
                    client.clone(),
                    paths.holder.clone(),
                    data.to_vec(),
                );
                return Err(e);
            }
        };
        // ZooKeeper does not return the created node's stat from a multi, but
        // every op of a multi commits in one transaction: the key node's new
        // mzxid IS the holder node's czxid.
        Ok(results.and_then(|results| {
            results
                .into_iter()
                .find_map(|r| match r {
                    MultiWriteResult::SetData { stat } => Some((stat.mzxid, stat.version)),
                    _ => None,
                })
                .ok_or_else(|| ZkError::UnexpectedError("multi returned no set-data result".into()))
        }))
    }

    /// Deletes the holder node if it carries `data` (our owner), after a claim
    /// whose outcome is unknown; in the background, on the same session.
    fn remove_if_ours_in_background(&self, client: Client, holder: String, data: Vec<u8>) {
        // The claim may also run when the connection was dropped and the
        // session resumes: look again until the session could have expired.
        let until = Instant::now() + self.inner.config.session_timeout;
        self.inner.cleanups.spawn(async move {
            while Instant::now() < until {
                let look =
                    tokio::time::timeout(Duration::from_secs(1), client.get_data(&holder)).await;
                if let Ok(Ok((current, stat))) = look
                    && current == data
                    && let Ok(Ok(())) = tokio::time::timeout(
                        Duration::from_secs(1),
                        client.delete(&holder, Some(stat.version)),
                    )
                    .await
                {
                    tracing::info!(node = %holder, "removed the holder node of an acquire that had timed out");
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    /// The holder node's data and stat and the key node's version (the epoch),
    /// read atomically; `None` when either node is gone.
    async fn read_holder_and_epoch(
        &self,
        client: &Client,
        paths: &Paths,
    ) -> Result<Option<(Vec<u8>, zookeeper_client::Stat, i32)>> {
        let mut r = client.new_multi_reader();
        if let Err(e) = r
            .add_get_data(&paths.key)
            .and_then(|()| r.add_get_data(&paths.holder))
        {
            return Err(self.map_err(e));
        }
        let results = self
            .bounded("get", r.commit())
            .await?
            .map_err(|e| self.map_err(e))?;
        let mut results = results.into_iter();
        match (results.next(), results.next()) {
            (
                Some(MultiReadResult::Data { stat: key, .. }),
                Some(MultiReadResult::Data { data, stat }),
            ) => Ok(Some((data, stat, key.version))),
            (Some(MultiReadResult::Error { err }), _)
            | (_, Some(MultiReadResult::Error { err }))
                if matches!(err, ZkError::NoNode) =>
            {
                Ok(None)
            }
            (Some(MultiReadResult::Error { err }), _)
            | (_, Some(MultiReadResult::Error { err })) => Err(self.map_err(err)),
            other => Err(LeaseError::protocol(format!(
                "unexpected multi-read answer from ZooKeeper: {other:?}"
            ))),
        }
    }

    fn lease_from(
        &self,
        key: &LeaseKey,
        owner: OwnerId,
        ttl: Duration,
        sent_at: Instant,
        (zxid, epoch, session, session_id): (i64, i32, Duration, i64),
    ) -> Result<Lease> {
        let token = u64::try_from(zxid).ok().filter(|t| *t > 0).ok_or_else(|| {
            LeaseError::protocol(format!("ZooKeeper returned zxid {zxid} for an acquire"))
        })?;
        let lease = bounded_validity(
            Lease::new(key.clone(), FencingToken(token), owner, ttl, sent_at)
                .with_handle(LeaseHandle::ZkKeyVersion(epoch)),
            session,
        );
        self.inner.issued.record(&lease, epoch, session_id);
        Ok(lease)
    }
}

/// Local validity never outlasts the session the lease lives on: the server
/// may expire it `session` (the timeout it granted) after it last heard from
/// us, and the ephemeral holder node goes with it.
pub(crate) fn bounded_validity(lease: Lease, session: Duration) -> Lease {
    // Like ZooKeeper's own clients, count a session as in doubt after two
    // thirds of its timeout without an answer: the server expires it at the
    // earliest a full timeout after it last heard from us.
    let session = session * 2 / 3;
    let limit = lease_api::backend::deadline_after(
        lease.sent_at(),
        session.saturating_sub(drift_margin(session)),
    );
    lease.with_valid_until(limit)
}

impl ZkProvider {
    /// Extend, without the bookkeeping of `issued`.
    async fn extend_once(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let ttl = self.caps().grant_ttl(ttl)?;
        let lost = || LeaseError::lost(lease);
        let client = self.client().await?;
        let paths = self.paths(lease.key());
        let Some(epoch) = key_version(lease) else {
            return Err(lost());
        };
        let sent_at = Instant::now();
        // The holder's new data, and the holder version it must still have.
        let (data, holder_version) =
            if self
                .inner
                .issued
                .fast_path(lease, epoch, client.session_id().0)
            {
                // One of ours, on this session, valid: the epoch check alone
                // proves nobody acquired since (see `issued`).
                (holder_data(lease.owner(), ttl, lease.holder()), None)
            } else {
                let (current, now) = tokio::join!(
                    self.bounded("get", client.get_data(&paths.holder)),
                    self.server_now(&client)
                );
                let (data, stat) = match current? {
                    Ok(v) => v,
                    Err(ZkError::NoNode) => return Err(lost()),
                    Err(e) => return Err(self.map_err(e)),
                };
                let now = now?;
                let Some((owner, old_ttl, label)) = parse_holder(&data) else {
                    return Err(lost());
                };
                let expires = stat.mtime + i64::try_from(old_ttl.as_millis()).unwrap_or(i64::MAX);
                // The node must live on the session we renew through: a node left on
                // an older session of ours dies with that session, whatever we extend.
                if owner != lease.owner()
                    || u64::try_from(stat.czxid).ok() != Some(lease.token().get())
                    || stat.ephemeral_owner != client.session_id().0
                    || now >= expires
                {
                    return Err(lost());
                }
                // Keep the label the acquire recorded.
                let label = label.as_deref().unwrap_or(lease.holder());
                (holder_data(owner, ttl, label), Some(stat.version))
            };
        let mut w = client.new_multi_writer();
        if let Err(e) = w
            .add_check_version(&paths.key, epoch)
            .and_then(|()| w.add_set_data(&paths.holder, &data, holder_version))
        {
            return Err(self.map_err(e));
        }
        match self
            .bounded("extend", async { w.commit().await.map_err(multi_err) })
            .await?
        {
            Ok(_) => Ok(bounded_validity(
                lease.renewed(ttl, sent_at),
                client.session_timeout(),
            )),
            Err(ZkError::BadVersion | ZkError::NoNode) => Err(lost()),
            Err(e) => Err(self.map_err(e)),
        }
    }

    /// Release, without the bookkeeping of `issued`.
    async fn release_once(&self, lease: &Lease) -> Result<()> {
        let not_held = || LeaseError::not_held(lease);
        let client = self.client().await?;
        let paths = self.paths(lease.key());
        let Some(epoch) = key_version(lease) else {
            return Err(not_held());
        };
        // The holder version the node must still have, and whether the lease
        // already ran out (then the node still goes, so waiters wake now, but
        // the answer is NotHeld, C7).
        let (holder_version, expired) =
            if self
                .inner
                .issued
                .fast_path(lease, epoch, client.session_id().0)
            {
                // One of ours, on this session, valid: the epoch check alone
                // proves nobody acquired since (see `issued`).
                (None, false)
            } else {
                // Key node versions repeat across keys and namespaces: check that the
                // holder node is this lease's (owner and czxid) before deleting it.
                let (current, now) = self.read_synced(&client, &paths.holder).await?;
                let (data, stat) = match current {
                    Ok(v) => v,
                    Err(ZkError::NoNode) => return Err(not_held()),
                    Err(e) => return Err(self.map_err(e)),
                };
                let now = now?;
                let Some((owner, ttl, _)) = parse_holder(&data) else {
                    return Err(not_held());
                };
                if owner != lease.owner()
                    || u64::try_from(stat.czxid).ok() != Some(lease.token().get())
                {
                    return Err(not_held());
                }
                let expired =
                    now >= stat.mtime + i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
                (Some(stat.version), expired)
            };
        let mut w = client.new_multi_writer();
        if let Err(e) = w
            .add_check_version(&paths.key, epoch)
            .and_then(|()| w.add_delete(&paths.holder, holder_version))
        {
            return Err(self.map_err(e));
        }
        match self
            .bounded("release", async { w.commit().await.map_err(multi_err) })
            .await?
        {
            Ok(_) if expired => Err(not_held()),
            Ok(_) => Ok(()),
            Err(ZkError::BadVersion | ZkError::NoNode) => Err(not_held()),
            Err(e) => Err(self.map_err(e)),
        }
    }
}

impl ZkProvider {
    /// Acquire with `ttl` as the lease's, and `recorded` as the TTL written
    /// in the holder node, by which others judge expiry: the same, or
    /// `SESSION_BOUND_TTL` for a lease that ends only with the session.
    pub(crate) async fn try_acquire_recording(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        recorded: Duration,
    ) -> Result<TryAcquire> {
        let client = self.client().await?;
        let paths = self.paths(key);
        let owner = OwnerId::random();
        let label = lease_api::holder();
        let data = holder_data(owner, recorded, &label);
        for _ in 0..4 {
            let sent_at = Instant::now();
            match self.claim(&client, &paths, &data, None).await? {
                Ok((zxid, epoch)) => {
                    let granted = (zxid, epoch, client.session_timeout(), client.session_id().0);
                    return Ok(TryAcquire::Acquired(
                        self.lease_from(key, owner, ttl, sent_at, granted)?
                            .with_holder(Arc::clone(&label)),
                    ));
                }
                Err(ZkError::NoNode) => {
                    self.ensure_key_node(&client, &paths).await?;
                    continue;
                }
                Err(ZkError::NodeExists) => {}
                Err(e) => return Err(self.map_err(e)),
            }
            // Held: judge expiry on the server's clock, on the holder node and
            // the epoch read together (one consistent snapshot).
            let (data_now, stat, epoch) = match self.read_holder_and_epoch(&client, &paths).await? {
                Some(v) => v,
                None => continue,
            };
            let now = self.shared_now(&client).await?;
            let holder_ttl = parse_holder(&data_now).map_or(Duration::ZERO, |(_, t, _)| t);
            let expires = stat.mtime + i64::try_from(holder_ttl.as_millis()).unwrap_or(i64::MAX);
            if now < expires {
                let remaining = Duration::from_millis(u64::try_from(expires - now).unwrap_or(0))
                    .min(holder_ttl);
                return Ok(TryAcquire::Held {
                    remaining: Some(remaining),
                });
            }
            let sent_at = Instant::now();
            let judged = Judged {
                epoch,
                holder_version: stat.version,
            };
            match self.claim(&client, &paths, &data, Some(judged)).await? {
                Ok((zxid, epoch)) => {
                    let granted = (zxid, epoch, client.session_timeout(), client.session_id().0);
                    return Ok(TryAcquire::Acquired(
                        self.lease_from(key, owner, ttl, sent_at, granted)?
                            .with_holder(Arc::clone(&label)),
                    ));
                }
                // Someone else acted first; look again.
                Err(ZkError::BadVersion | ZkError::NoNode | ZkError::NodeExists) => continue,
                Err(e) => return Err(self.map_err(e)),
            }
        }
        Ok(TryAcquire::Held { remaining: None })
    }
}

#[async_trait]
impl LeaseProvider for ZkProvider {
    fn capabilities(&self) -> &Capabilities {
        self.caps()
    }

    fn namespace(&self) -> &str {
        &self.inner.config.namespace
    }

    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        let ttl = self.caps().grant_ttl(ttl)?;
        self.try_acquire_recording(key, ttl, ttl).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let extended = self.extend_once(lease, ttl).await;
        match &extended {
            Ok(renewed) => self.inner.issued.renewed(renewed),
            Err(LeaseError::Lost { .. }) => self.inner.issued.forget(lease),
            Err(_) => {}
        }
        extended
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let released = self.release_once(lease).await;
        // After a transient error the lease may still be held: a retry keeps
        // its fast path.
        if matches!(released, Ok(()) | Err(LeaseError::NotHeld { .. })) {
            self.inner.issued.forget(lease);
        }
        released
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        let client = self.client().await?;
        let paths = self.paths(key);
        let (current, now) = self.read_synced(&client, &paths.holder).await?;
        let (data, stat) = match current {
            Ok(v) => v,
            Err(ZkError::NoNode) => return Ok(None),
            Err(e) => return Err(self.map_err(e)),
        };
        let now = now?;
        let Some((owner, ttl, holder)) = parse_holder(&data) else {
            return Ok(None);
        };
        let expires = stat.mtime + i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        if now >= expires {
            return Ok(None);
        }
        Ok(Some(LeaseInfo::new(
            FencingToken(u64::try_from(stat.czxid).unwrap_or(0)),
            // The clock sample is a lower bound; never report more than the TTL.
            Duration::from_millis(u64::try_from(expires - now).unwrap_or(0)).min(ttl),
            Some(owner),
            holder,
        )))
    }

    async fn session_store(&self, ttl: Duration) -> Result<Option<Arc<dyn SessionStore>>> {
        let _ = ttl;
        crate::session::open(self).map(Some)
    }

    async fn flush(&self, limit: Duration) {
        let tracker = &self.inner.cleanups;
        tracker.close();
        let _ = tokio::time::timeout(limit, tracker.wait()).await;
        tracker.reopen();
    }

    /// The exists watch reports whether the holder node is there as it
    /// registers: a release before it is seen, so `acquire` tries first.
    fn watch_reports_state(&self) -> bool {
        true
    }

    fn wait_queue(&self) -> Option<&dyn WaitQueue> {
        Some(self)
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        let client = self.client().await?;
        let paths = self.paths(key);
        let (stat, watcher) = self
            .bounded("watch", client.check_and_watch_stat(&paths.holder))
            .await?
            .map_err(|e| self.map_err(e))?;
        Ok(Box::new(ZkWatch {
            // No holder node: nothing to wait for, the next try may win at once.
            watcher: stat.map(|_| watcher),
        }))
    }
}

struct ZkWatch {
    watcher: Option<OneshotWatcher>,
}

#[async_trait]
impl KeyWatch for ZkWatch {
    async fn changed(&mut self, max: Duration) {
        let Some(watcher) = self.watcher.take() else {
            return;
        };
        // Any event (deletion, data change, session event) ends the wait;
        // the caller looks at the key again.
        let _ = tokio::time::timeout(max, async {
            let event = watcher.changed().await;
            event.event_type == EventType::NodeDeleted
        })
        .await;
    }
}

/// The key node version a lease of ours was created under; `None` for a
/// lease of another backend (or a negative version, which no acquire hands
/// out): such a lease holds nothing here. Never pass -1 on: to ZooKeeper it
/// means "any version".
fn key_version(lease: &Lease) -> Option<i32> {
    match lease.handle() {
        LeaseHandle::ZkKeyVersion(v) if v >= 0 => Some(v),
        _ => None,
    }
}

impl ZkProvider {
    /// The parent of `key`'s waiters: a child of the key node, beside the
    /// holder node.
    fn waiters_path(&self, key: &LeaseKey) -> String {
        format!("{}/waiters", self.paths(key).key)
    }

    /// A waiter's node: `w-`, its join's mark, and its sequence number as
    /// ZooKeeper names sequential nodes.
    fn ticket_path(&self, ticket: &Ticket) -> String {
        format!(
            "{}/{}{}",
            self.waiters_path(ticket.key()),
            ticket_prefix(ticket.mark()),
            sequence_suffix(ticket.seq())
        )
    }
}

impl ZkProvider {
    /// Deletes the waiter node carrying `mark` under `waiters`, after a join
    /// whose outcome is unknown; in the background, on the same session,
    /// until the session could have expired.
    fn remove_marked_in_background(&self, client: Client, waiters: String, mark: String) {
        let until = Instant::now() + self.inner.config.session_timeout;
        self.inner.cleanups.spawn(async move {
            while Instant::now() < until {
                let step = Duration::from_secs(1);
                if let Ok(Ok(children)) =
                    tokio::time::timeout(step, client.list_children(&waiters)).await
                {
                    for child in children {
                        let path = format!("{waiters}/{child}");
                        if let Ok(Ok((data, _))) =
                            tokio::time::timeout(step, client.get_data(&path)).await
                            && data == mark.as_bytes()
                        {
                            let _ = tokio::time::timeout(step, client.delete(&path, None)).await;
                            tracing::info!(node = %path, "removed the waiter node of a join that had failed");
                            return;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }
}

/// The name of a waiter node before ZooKeeper's sequence suffix: `w-`, the
/// join's mark in 16 hex digits, `-`. The mark makes the node this join's
/// even if the waiters node were made again and its numbers given twice.
fn ticket_prefix(mark: u64) -> String {
    format!("w-{mark:016x}-")
}

/// The (sequence number, mark) of a waiter node's name.
fn parse_ticket(name: &str) -> Option<(u64, u64)> {
    let (mark, seq) = name.strip_prefix("w-")?.split_once('-')?;
    Some((seq.parse().ok()?, u64::from_str_radix(mark, 16).ok()?))
}

/// ZooKeeper's suffix of sequence number `seq`: ten digits, nineteen past
/// `i32::MAX`.
fn sequence_suffix(seq: u64) -> String {
    if seq <= u64::from(i32::MAX.unsigned_abs()) {
        format!("{seq:010}")
    } else {
        format!("{seq:019}")
    }
}

/// Fair waiting as Curator's fair lock queues: each waiter creates an
/// ephemeral sequential node under the key's `waiters` node and watches the
/// node just ahead of it. A dead waiter's node goes with its session.
#[async_trait]
impl WaitQueue for ZkProvider {
    async fn join(&self, key: &LeaseKey, ttl: Duration, mark: u64) -> Result<Ticket> {
        self.caps().grant_ttl(ttl)?;
        let client = self.client().await?;
        let paths = self.paths(key);
        let waiters = self.waiters_path(key);
        let mode = CreateMode::EphemeralSequential.with_acls(self.acls());
        let node = format!("{waiters}/{}", ticket_prefix(mark));
        // The node's data names this create, so one whose answer was lost
        // can be found and removed (on ZooKeeper a ticket lives as long as
        // the session, not a TTL), and never the node of a retry.
        let attempt = OwnerId::random().to_hex();
        for _ in 0..3 {
            let created = match self
                .bounded(
                    "joining the queue",
                    client.create(&node, attempt.as_bytes(), &mode),
                )
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    self.remove_marked_in_background(client.clone(), waiters.clone(), attempt);
                    return Err(e);
                }
            };
            match created {
                Ok((_, seq)) => {
                    let seq = u64::try_from(seq.into_i64()).map_err(|_| {
                        LeaseError::protocol("ZooKeeper gave a negative sequence number")
                    })?;
                    return Ok(Ticket::new(key.clone(), seq, mark));
                }
                // The key node or its waiters node does not exist yet.
                Err(ZkError::NoNode) => {
                    self.ensure_key_node(&client, &paths).await?;
                    let made = client.create(
                        &waiters,
                        b"",
                        &CreateMode::Persistent.with_acls(self.acls()),
                    );
                    match self.bounded("creating the waiters node", made).await? {
                        Ok(_) | Err(ZkError::NodeExists) => {}
                        Err(e) => return Err(self.map_err(e)),
                    }
                }
                Err(e @ ZkError::ConnectionLoss) => {
                    self.remove_marked_in_background(client.clone(), waiters.clone(), attempt);
                    return Err(self.map_err(e));
                }
                Err(e) => return Err(self.map_err(e)),
            }
        }
        Err(LeaseError::protocol(
            "ZooKeeper kept answering that the waiters node is missing",
        ))
    }

    async fn place(&self, ticket: &Ticket) -> Result<Place> {
        let client = self.client().await?;
        let children = match self
            .bounded(
                "list",
                client.list_children(&self.waiters_path(ticket.key())),
            )
            .await?
        {
            Ok(c) => c,
            Err(ZkError::NoNode) => return Ok(Place::Gone),
            Err(e) => return Err(self.map_err(e)),
        };
        let mut own = false;
        let mut ahead: Option<(u64, u64)> = None;
        for child in &children {
            let Some((seq, mark)) = parse_ticket(child) else {
                continue;
            };
            if seq == ticket.seq() {
                own = mark == ticket.mark();
            } else if seq < ticket.seq() && ahead.is_none_or(|(a, _)| seq > a) {
                ahead = Some((seq, mark));
            }
        }
        Ok(match (own, ahead) {
            (false, _) => Place::Gone,
            (true, None) => Place::First,
            (true, Some((seq, mark))) => Place::Behind {
                ahead: Ticket::new(ticket.key().clone(), seq, mark),
                // It goes with its waiter's session.
                remaining: None,
            },
        })
    }

    async fn watch_ticket(&self, ahead: &Ticket) -> Result<Box<dyn KeyWatch>> {
        let client = self.client().await?;
        let (stat, watcher) = self
            .bounded(
                "watch",
                client.check_and_watch_stat(&self.ticket_path(ahead)),
            )
            .await?
            .map_err(|e| self.map_err(e))?;
        // A node that is gone already wakes the waiter at once.
        Ok(Box::new(ZkWatch {
            watcher: stat.map(|_| watcher),
        }))
    }

    async fn refresh(&self, ticket: &Ticket, _ttl: Duration) -> Result<bool> {
        // The node lives as long as the session: it is refreshed by the
        // session's heartbeats, and only a new session has lost it.
        let client = self.client().await?;
        let stat = self
            .bounded("exists", client.check_stat(&self.ticket_path(ticket)))
            .await?
            .map_err(|e| self.map_err(e))?;
        Ok(stat.is_some())
    }

    async fn leave(&self, ticket: &Ticket) -> Result<()> {
        let client = self.client().await?;
        match self
            .bounded(
                "leaving the queue",
                client.delete(&self.ticket_path(ticket), None),
            )
            .await?
        {
            Ok(()) | Err(ZkError::NoNode) => Ok(()),
            Err(e) => Err(self.map_err(e)),
        }
    }
}

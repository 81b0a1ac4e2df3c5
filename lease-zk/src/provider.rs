//! `ZkProvider`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_api::{
    Capabilities, DEFAULT_MAX_TTL, DEFAULT_NAMESPACE, ExpiryClock, FencingToken, KeyWatch, Lease,
    LeaseError, LeaseInfo, LeaseKey, LeaseProvider, Notifications, OwnerId, Result,
    TokenDurability, TryAcquire, drift_margin, validate_namespace,
};
use tokio::time::Instant;
use zookeeper_client::{
    Acls, Client, CreateMode, Error as ZkError, EventType, MultiWriteError, MultiWriteResult,
    OneshotWatcher, SessionState,
};

/// How to reach ZooKeeper.
#[derive(Clone, Debug)]
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
}

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
        }
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
    caps: Capabilities,
}

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

/// The paths of one lease.
struct Paths {
    /// Persistent; its version is the acquisition epoch.
    key: String,
    /// Ephemeral; data `owner:ttl_ms`; czxid is the token.
    holder: String,
}

fn holder_data(owner: OwnerId, ttl: Duration) -> Vec<u8> {
    format!("{}:{}", owner.to_hex(), ttl.as_millis()).into_bytes()
}

fn parse_holder(data: &[u8]) -> Option<(OwnerId, Duration)> {
    let s = std::str::from_utf8(data).ok()?;
    let (owner, ttl) = s.split_once(':')?;
    Some((
        OwnerId::from_hex(owner)?,
        Duration::from_millis(ttl.parse().ok()?),
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
    )
}

fn multi_err(e: MultiWriteError) -> ZkError {
    e.into()
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
        let caps = Capabilities {
            backend: "zookeeper",
            min_ttl: Duration::from_millis(100),
            max_ttl: DEFAULT_MAX_TTL,
            ttl_granularity: Duration::from_millis(1),
            // Expiry is judged against a probe write's mtime: millisecond
            // timestamps of the leader's clock.
            expiry_slack: Duration::from_millis(50),
            durable_tokens: TokenDurability::Durable(
                "tokens are czxids: global transaction ids that include the leader epoch, persisted by every quorum write".into(),
            ),
            notifications: Notifications::Native("ZooKeeper watch"),
            expiry_clock: ExpiryClock::ServerWallClock,
            holder_session: Some(config.session_timeout),
        };
        Ok(ZkProvider {
            inner: Arc::new(Inner {
                ns_path: format!("/lease/{}", segment(&config.namespace)),
                config,
                client: tokio::sync::Mutex::new(None),
                caps,
            }),
        })
    }

    fn paths(&self, key: &LeaseKey) -> Paths {
        let key = format!("{}/{}", self.inner.ns_path, segment(key.as_str()));
        Paths {
            holder: format!("{key}/holder"),
            key,
        }
    }

    fn map_err(&self, e: ZkError) -> LeaseError {
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

    fn timeout_error(&self, what: &str) -> LeaseError {
        LeaseError::Unavailable {
            message: format!(
                "ZooKeeper at {} did not answer {what} within {:?}",
                self.inner.config.hosts, self.inner.config.request_timeout
            ),
            source: None,
        }
    }

    /// The session's client; a new session when there is none or it ended.
    async fn client(&self) -> Result<Client> {
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
        let mut client =
            match tokio::time::timeout(c.connect_timeout + c.request_timeout, connect).await {
                Ok(r) => r.map_err(|e| self.map_err(e))?,
                Err(_) => return Err(self.timeout_error("the connection")),
            };
        // The chroot is created if missing, then every path is relative to it.
        if let Some(chroot) = &c.chroot {
            let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
            let made = client.mkdir(chroot, &persistent);
            match tokio::time::timeout(c.request_timeout, made).await {
                Ok(Ok(())) | Ok(Err(ZkError::NodeExists)) => {}
                Ok(Err(e)) => return Err(self.map_err(e)),
                Err(_) => return Err(self.timeout_error("creating the chroot")),
            }
            client = client.chroot(chroot.as_str()).map_err(|_| {
                LeaseError::Config(format!("ZooKeeper chroot {chroot:?} is not a valid path"))
            })?;
        }
        // The namespace node: the parent of every lease, and the clock probe.
        for path in ["/lease", self.inner.ns_path.as_str()] {
            let created = client.create(
                path,
                b"",
                &CreateMode::Persistent.with_acls(Acls::anyone_all()),
            );
            match tokio::time::timeout(c.request_timeout, created).await {
                Ok(Ok(_)) | Ok(Err(ZkError::NodeExists)) => {}
                Ok(Err(e)) => return Err(self.map_err(e)),
                Err(_) => return Err(self.timeout_error("creating the namespace node")),
            }
        }
        *slot = Some(client.clone());
        Ok(client)
    }

    async fn bounded<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T, ZkError>>,
    ) -> Result<Result<T, ZkError>> {
        match tokio::time::timeout(self.inner.config.request_timeout, f).await {
            Ok(Err(e)) if unavailable(&e) => Err(self.map_err(e)),
            Ok(r) => Ok(r),
            Err(_) => Err(self.timeout_error(what)),
        }
    }

    /// The server's clock now, in ms: the mtime of a write to the namespace node.
    async fn server_now(&self, client: &Client) -> Result<i64> {
        let stat = self
            .bounded(
                "the clock probe",
                client.set_data(&self.inner.ns_path, b"", None),
            )
            .await?
            .map_err(|e| self.map_err(e))?;
        Ok(stat.mtime)
    }

    async fn ensure_key_node(&self, client: &Client, paths: &Paths) -> Result<()> {
        let created = client.create(
            &paths.key,
            b"",
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        );
        match self.bounded("creating the key node", created).await? {
            Ok(_) | Err(ZkError::NodeExists) => Ok(()),
            Err(e) => Err(self.map_err(e)),
        }
    }

    /// Create the holder node and bump the key node's version (the epoch), in
    /// one multi; `take_over` deletes an expired holder at its version first.
    async fn claim(
        &self,
        client: &Client,
        paths: &Paths,
        data: &[u8],
        take_over: Option<i32>,
    ) -> Result<Result<(i64, i32), ZkError>> {
        let mut w = client.new_multi_writer();
        let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
        let built = (|| {
            if let Some(version) = take_over {
                w.add_delete(&paths.holder, Some(version))?;
            }
            w.add_create(&paths.holder, data, &ephemeral)?;
            w.add_set_data(&paths.key, b"", None)
        })();
        if let Err(e) = built {
            return Err(self.map_err(e));
        }
        let results = self
            .bounded("acquire", async { w.commit().await.map_err(multi_err) })
            .await?;
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

    fn lease_from(
        &self,
        key: &LeaseKey,
        owner: OwnerId,
        ttl: Duration,
        sent_at: Instant,
        zxid: i64,
        epoch: i32,
    ) -> Result<Lease> {
        let token = u64::try_from(zxid).ok().filter(|t| *t > 0).ok_or_else(|| {
            LeaseError::protocol(format!("ZooKeeper returned zxid {zxid} for an acquire"))
        })?;
        Ok(self.bounded_validity(
            Lease::new(key.clone(), FencingToken(token), owner, ttl, sent_at)
                .with_handle(u64::from(epoch.unsigned_abs())),
        ))
    }

    /// Local validity never outlasts the session: the server may expire it
    /// `session_timeout` after it last heard from us, and the ephemeral holder
    /// node goes with it.
    fn bounded_validity(&self, lease: Lease) -> Lease {
        // Like ZooKeeper's own clients, count a session as in doubt after two
        // thirds of its timeout without an answer: the server expires it at the
        // earliest a full timeout after it last heard from us.
        let session = self.inner.config.session_timeout * 2 / 3;
        let limit = lease.sent_at() + session.saturating_sub(drift_margin(session));
        lease.with_valid_until(limit)
    }
}

#[async_trait]
impl LeaseProvider for ZkProvider {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    fn namespace(&self) -> &str {
        &self.inner.config.namespace
    }

    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        let ttl = self.inner.caps.grant_ttl(ttl)?;
        let client = self.client().await?;
        let paths = self.paths(key);
        let owner = OwnerId::random();
        let data = holder_data(owner, ttl);
        for _ in 0..4 {
            let sent_at = Instant::now();
            match self.claim(&client, &paths, &data, None).await? {
                Ok((zxid, epoch)) => {
                    return Ok(TryAcquire::Acquired(
                        self.lease_from(key, owner, ttl, sent_at, zxid, epoch)?,
                    ));
                }
                Err(ZkError::NoNode) => {
                    self.ensure_key_node(&client, &paths).await?;
                    continue;
                }
                Err(ZkError::NodeExists) => {}
                Err(e) => return Err(self.map_err(e)),
            }
            // Held: judge expiry on the server's clock.
            let (data_now, stat) = match self.bounded("get", client.get_data(&paths.holder)).await?
            {
                Ok(v) => v,
                Err(ZkError::NoNode) => continue,
                Err(e) => return Err(self.map_err(e)),
            };
            let now = self.server_now(&client).await?;
            let holder_ttl = parse_holder(&data_now).map_or(Duration::ZERO, |(_, t)| t);
            let expires = stat.mtime + i64::try_from(holder_ttl.as_millis()).unwrap_or(i64::MAX);
            if now < expires {
                let remaining = Duration::from_millis(u64::try_from(expires - now).unwrap_or(0));
                return Ok(TryAcquire::Held {
                    remaining: Some(remaining),
                });
            }
            let sent_at = Instant::now();
            match self
                .claim(&client, &paths, &data, Some(stat.version))
                .await?
            {
                Ok((zxid, epoch)) => {
                    return Ok(TryAcquire::Acquired(
                        self.lease_from(key, owner, ttl, sent_at, zxid, epoch)?,
                    ));
                }
                // Someone else acted first; look again.
                Err(ZkError::BadVersion | ZkError::NoNode | ZkError::NodeExists) => continue,
                Err(e) => return Err(self.map_err(e)),
            }
        }
        Ok(TryAcquire::Held { remaining: None })
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let ttl = self.inner.caps.grant_ttl(ttl)?;
        let lost = || LeaseError::Lost {
            key: lease.key().clone(),
            token: lease.token(),
        };
        let client = self.client().await?;
        let paths = self.paths(lease.key());
        let sent_at = Instant::now();
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
        let Some((owner, old_ttl)) = parse_holder(&data) else {
            return Err(lost());
        };
        let expires = stat.mtime + i64::try_from(old_ttl.as_millis()).unwrap_or(i64::MAX);
        if owner != lease.owner()
            || u64::try_from(stat.czxid).ok() != Some(lease.token().get())
            || now >= expires
        {
            return Err(lost());
        }
        let epoch = i32::try_from(lease.handle()).unwrap_or(-1);
        let mut w = client.new_multi_writer();
        if let Err(e) = w.add_check_version(&paths.key, epoch).and_then(|()| {
            w.add_set_data(&paths.holder, &holder_data(owner, ttl), Some(stat.version))
        }) {
            return Err(self.map_err(e));
        }
        match self
            .bounded("extend", async { w.commit().await.map_err(multi_err) })
            .await?
        {
            Ok(_) => Ok(self.bounded_validity(
                Lease::new(
                    lease.key().clone(),
                    lease.token(),
                    lease.owner(),
                    ttl,
                    sent_at,
                )
                .with_handle(lease.handle()),
            )),
            Err(ZkError::BadVersion | ZkError::NoNode) => Err(lost()),
            Err(e) => Err(self.map_err(e)),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let not_held = || LeaseError::NotHeld {
            key: lease.key().clone(),
            token: lease.token(),
        };
        let client = self.client().await?;
        let paths = self.paths(lease.key());
        // Key node versions repeat across keys and namespaces: check that the
        // holder node is this lease's (owner and czxid) before deleting it.
        let (data, stat) = match self.bounded("get", client.get_data(&paths.holder)).await? {
            Ok(v) => v,
            Err(ZkError::NoNode) => return Err(not_held()),
            Err(e) => return Err(self.map_err(e)),
        };
        let ours = parse_holder(&data).is_some_and(|(owner, _)| owner == lease.owner())
            && u64::try_from(stat.czxid).ok() == Some(lease.token().get());
        if !ours {
            return Err(not_held());
        }
        let epoch = i32::try_from(lease.handle()).unwrap_or(-1);
        let mut w = client.new_multi_writer();
        if let Err(e) = w
            .add_check_version(&paths.key, epoch)
            .and_then(|()| w.add_delete(&paths.holder, Some(stat.version)))
        {
            return Err(self.map_err(e));
        }
        match self
            .bounded("release", async { w.commit().await.map_err(multi_err) })
            .await?
        {
            Ok(_) => Ok(()),
            Err(ZkError::BadVersion | ZkError::NoNode) => Err(not_held()),
            Err(e) => Err(self.map_err(e)),
        }
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        let client = self.client().await?;
        let paths = self.paths(key);
        let (current, now) = tokio::join!(
            self.bounded("get", client.get_data(&paths.holder)),
            self.server_now(&client)
        );
        let (data, stat) = match current? {
            Ok(v) => v,
            Err(ZkError::NoNode) => return Ok(None),
            Err(e) => return Err(self.map_err(e)),
        };
        let now = now?;
        let Some((owner, ttl)) = parse_holder(&data) else {
            return Ok(None);
        };
        let expires = stat.mtime + i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        if now >= expires {
            return Ok(None);
        }
        Ok(Some(LeaseInfo {
            token: FencingToken(u64::try_from(stat.czxid).unwrap_or(0)),
            remaining: Duration::from_millis(u64::try_from(expires - now).unwrap_or(0)),
            owner: Some(owner),
        }))
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

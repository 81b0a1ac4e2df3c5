//! `ZkProvider`.

use crate::config::{SECURED, SHARED_PARENT, ZkConfig};
use crate::issued::Issued;
use std::sync::Arc;
use std::time::Duration;

use lease_api::backend::{DEFAULT_MAX_TTL, LeaseHandle, OwnerId, validate_namespace};
use lease_api::backend::{bounded, drift_margin};
use lease_api::{
    Capabilities, ExpiryClock, Failover, FailoverTokens, FencingToken, Lease, LeaseError, LeaseKey,
    Notifications, Result, TokenDurability,
};
use tokio::time::Instant;
use zookeeper_client::{
    Acls, Client, CreateMode, Error as ZkError, MultiReadResult, MultiWriteError, MultiWriteResult,
    SessionState, Stat,
};

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

pub(crate) struct Inner {
    pub(crate) config: ZkConfig,
    pub(crate) client: tokio::sync::Mutex<Option<Client>>,
    pub(crate) ns_path: String,
    /// Declared before the first session, with the timeout asked for.
    pub(crate) asked_caps: Capabilities,
    /// Declared once a session exists, with the timeout the server granted.
    pub(crate) granted_caps: std::sync::OnceLock<Capabilities>,
    /// Clean-ups of timed-out acquires still running (see `flush`).
    pub(crate) cleanups: tokio_util::task::TaskTracker,
    /// The last server-clock sample, shared by every caller (see `shared_now`).
    pub(crate) clock: tokio::sync::Mutex<Option<ClockSample>>,
    /// The leases this provider acquired and still holds, for one-round-trip
    /// extend and release (see `Issued`).
    pub(crate) issued: Issued,
}

/// A reading of the server's clock: a probe write's mtime, and when its answer
/// arrived. The mtime was set before the answer left the server, so
/// `mtime + elapsed since arrival` never runs ahead of the server's clock.
#[derive(Clone, Copy)]
pub(crate) struct ClockSample {
    pub(crate) mtime: i64,
    pub(crate) received: Instant,
}

/// How long one clock sample serves every caller of a provider: inspect, the
/// expiry judgement of try_acquire and waiter wake-ups make at most one probe
/// write per interval.
pub(crate) const CLOCK_SAMPLE_REUSE: Duration = Duration::from_secs(1);

/// Leases on ZooKeeper: ephemeral holder nodes, czxid tokens, expiry judged on
/// the server's clock, watches for waiting. See the crate docs.
#[derive(Clone)]
pub struct ZkProvider {
    pub(crate) inner: Arc<Inner>,
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
pub(crate) struct Judged {
    pub(crate) epoch: i32,
    pub(crate) holder_version: i32,
    /// The owner the judged holder node named, when its marker was there in
    /// the same snapshot: the takeover then checks the marker is still
    /// there (a purge deletes it; an owner that lost its lease may have
    /// dropped it already, and then the takeover goes without the check).
    pub(crate) owner: Option<OwnerId>,
}

/// A holder node read with the epoch: its data and stat, the epoch, and
/// its owner when that owner's marker was there too.
pub(crate) struct HolderRead {
    pub(crate) data: Vec<u8>,
    pub(crate) stat: zookeeper_client::Stat,
    pub(crate) epoch: i32,
    pub(crate) owner: Option<OwnerId>,
}

impl Judged {
    pub(crate) fn plan(&self) -> crate::plan::Judged {
        crate::plan::Judged {
            epoch: self.epoch,
            holder_version: self.holder_version,
            owner_known: self.owner.is_some(),
        }
    }
}

/// The paths of one lease.
#[derive(Clone)]
pub(crate) struct Paths {
    /// Persistent; its version is the acquisition epoch.
    pub(crate) key: String,
    /// Ephemeral; data `owner:ttl_ms:holder label`; czxid is the token.
    pub(crate) holder: String,
}

impl Paths {
    /// The owner's marker: an empty ephemeral node beside the holder node,
    /// made in the acquire's multi and removed with the holder. A one-multi
    /// extend or release checks it: the epoch alone repeats after a purge
    /// deleted the key node (see `issued`).
    pub(crate) fn marker(&self, owner: OwnerId) -> String {
        format!("{}/{}", self.key, Self::marker_name(owner))
    }

    /// The marker's name among the key node's children.
    pub(crate) fn marker_name(owner: OwnerId) -> String {
        format!("o-{}", owner.to_hex())
    }

    /// What a multi's steps name for this lease: its owner's `marker`, the
    /// judged holder's marker for a takeover, and the holder node's `data`.
    pub(crate) fn target<'a>(
        &'a self,
        marker: &'a str,
        judged_marker: Option<&'a str>,
        data: &'a [u8],
        ephemeral: &'a zookeeper_client::CreateOptions<'a>,
    ) -> crate::plan::Target<'a> {
        crate::plan::Target {
            key: &self.key,
            holder: &self.holder,
            marker,
            judged_marker,
            data,
            ephemeral,
        }
    }
}

pub(crate) fn holder_data(owner: OwnerId, ttl: Duration, label: &str) -> Vec<u8> {
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

pub(crate) fn unavailable(e: &ZkError) -> bool {
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

pub(crate) fn multi_err(e: MultiWriteError) -> ZkError {
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
pub(crate) fn failover(session: Duration) -> Failover {
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
        .with_multi_key(lease_api::backend::MultiKey::atomic(lease_api::backend::DEFAULT_MAX_KEYS))
        .with_shared_leases(true)
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

    pub(crate) fn paths(&self, key: &LeaseKey) -> Paths {
        let key = format!("{}/{}", self.inner.ns_path, segment(key.as_str()));
        Paths {
            holder: format!("{key}/holder"),
            key,
        }
    }

    /// The ACL of the shared parents (chroot, `/lease`).
    pub(crate) fn parent_acls(&self) -> Acls<'static> {
        if self.inner.config.digest.is_some() {
            Acls::new(&*SHARED_PARENT)
        } else {
            Acls::anyone_all()
        }
    }

    /// The ACL of every node this provider creates below `/lease`.
    pub(crate) fn acls(&self) -> Acls<'static> {
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

    pub(crate) fn caps(&self) -> &Capabilities {
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
                Ok(mut children) => {
                    // Deleted in reverse: a key's holder node goes before
                    // its markers, so no holder is ever without its marker
                    // (a takeover judged meanwhile deletes the marker, and
                    // fails once the purge took it). An old holder's
                    // one-multi extend or release fails on the missing
                    // holder node, or on the epoch a new acquire bumped,
                    // or, once the key node was made again, on its marker.
                    children.sort_by_key(|c| c == "holder");
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
    pub(crate) async fn server_now(&self, client: &Client) -> Result<i64> {
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
    pub(crate) async fn read_synced(
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

    pub(crate) async fn shared_now(&self, client: &Client) -> Result<i64> {
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

    pub(crate) async fn ensure_key_node(&self, client: &Client, paths: &Paths) -> Result<()> {
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
    pub(crate) async fn claim(
        &self,
        client: &Client,
        paths: &Paths,
        (owner, data): (OwnerId, &[u8]),
        take_over: Option<Judged>,
    ) -> Result<Result<(i64, i32), ZkError>> {
        let mut w = client.new_multi_writer();
        let ephemeral = CreateMode::Ephemeral.with_acls(self.acls());
        let marker = paths.marker(owner);
        let judged_marker = take_over.and_then(|j| j.owner).map(|o| paths.marker(o));
        let target = paths.target(&marker, judged_marker.as_deref(), data, &ephemeral);
        let steps = crate::plan::claim(take_over.map(|j| j.plan()));
        let built = crate::plan::write(&mut w, &steps, &target);
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
                self.remove_holder_if_ours_in_background(
                    client.clone(),
                    (paths.clone(), owner),
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

    /// The holder node, its stat and the epoch, read in one consistent
    /// snapshot with the key node's children, from which the holder's owner
    /// is kept only when its marker was there too (see [`Judged::owner`]);
    /// `None` when the key or holder node is gone.
    pub(crate) async fn read_holder_and_epoch(
        &self,
        client: &Client,
        paths: &Paths,
    ) -> Result<Option<HolderRead>> {
        let mut r = client.new_multi_reader();
        if let Err(e) = r
            .add_get_data(&paths.key)
            .and_then(|()| r.add_get_data(&paths.holder))
            .and_then(|()| r.add_get_children(&paths.key))
        {
            return Err(self.map_err(e));
        }
        let results = self
            .bounded("get", r.commit())
            .await?
            .map_err(|e| self.map_err(e))?;
        let mut results = results.into_iter();
        match (results.next(), results.next(), results.next()) {
            (
                Some(MultiReadResult::Data { stat: key, .. }),
                Some(MultiReadResult::Data { data, stat }),
                Some(MultiReadResult::Children { children }),
            ) => {
                let owner = parse_holder(&data).map(|(o, _, _)| o).filter(|o| {
                    let name = Paths::marker_name(*o);
                    children.contains(&name)
                });
                Ok(Some(HolderRead {
                    data,
                    stat,
                    epoch: key.version,
                    owner,
                }))
            }
            (Some(MultiReadResult::Error { err }), _, _)
            | (_, Some(MultiReadResult::Error { err }), _)
            | (_, _, Some(MultiReadResult::Error { err }))
                if matches!(err, ZkError::NoNode) =>
            {
                Ok(None)
            }
            (Some(MultiReadResult::Error { err }), _, _)
            | (_, Some(MultiReadResult::Error { err }), _)
            | (_, _, Some(MultiReadResult::Error { err })) => Err(self.map_err(err)),
            other => Err(LeaseError::protocol(format!(
                "unexpected multi-read answer from ZooKeeper: {other:?}"
            ))),
        }
    }

    pub(crate) fn lease_from(
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

//! `EtcdProvider`.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::config::EtcdConfig;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, TxnResponse,
};
use lease_api::backend::{
    DEFAULT_MAX_KEYS, DEFAULT_MAX_TTL, LeaseHandle, MultiKey, OwnerId, validate_namespace,
};
use lease_api::{
    Capabilities, ExpiryClock, Failover, FailoverExtension, FailoverTokens, Lease, LeaseError,
    LeaseKey, Notifications, Result, TokenDurability,
};
use tokio::sync::OnceCell;
use tokio::time::Instant;

pub(crate) struct Inner {
    pub(crate) config: EtcdConfig,
    /// One client per endpoint, connected on first use. etcd-client's own
    /// balancing over several endpoints keeps choosing a member that died:
    /// its requests fail at once, so it looks the least loaded (measured:
    /// one run in three never recovered from a killed leader in 16 s).
    pub(crate) clients: Vec<OnceCell<Client>>,
    /// The endpoint requests go to; a request that fails as unavailable
    /// moves it to the next one.
    pub(crate) current: std::sync::atomic::AtomicUsize,
    pub(crate) prefix: String,
    pub(crate) caps: Capabilities,
    pub(crate) display: String,
    /// Keys this provider saw held, until when at least and at which
    /// revision; cleared by a watch that sees the key deleted. A try on such
    /// a key reads before it grants, and a watch of it starts at the revision
    /// after the one it was seen held at.
    pub(crate) seen_held: Arc<std::sync::Mutex<HashMap<String, SeenHeld>>>,
    /// Spare etcd leases, by etcd key: one granted for a try that found the
    /// key held, kept for the next try on it (see [`Spare`]).
    pub(crate) spares: std::sync::Mutex<HashMap<String, Spare>>,
    /// The etcd leases of the leases this provider handed out (see
    /// [`Issued`]).
    pub(crate) issued: std::sync::Mutex<Issued>,
    /// Test hook: runs between a session's keep-alive and its read of the
    /// keys on it.
    pub(crate) after_keep_alive: std::sync::Mutex<Option<SessionHook>>,
}

/// The etcd leases this provider put its own leases' keys on, by id, with
/// what etcd granted and when each was last renewed (see `issued.rs`). Entries of leases never released (lost,
/// abandoned) are dropped once their etcd lease has run out, whenever the
/// register has doubled since it was last pruned.
#[derive(Debug, Default)]
pub(crate) struct Issued {
    pub(crate) by_id: HashMap<i64, Spare>,
    prune_at: usize,
}

/// The register is pruned no sooner than at this many entries.
const PRUNE_FLOOR: usize = 1024;

impl Issued {
    pub(crate) fn record(&mut self, spare: Spare) {
        if self.by_id.len() >= self.prune_at.max(PRUNE_FLOOR) {
            let now = Instant::now();
            self.by_id.retain(|_, s| s.lives_until() > now);
            self.prune_at = self.by_id.len() * 2;
        }
        self.by_id.insert(spare.id, spare);
    }
}

/// What a provider knows of a key it saw held.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SeenHeld {
    /// Until when the holder's etcd lease lasts at least, as etcd said then
    /// (or [`MAX_BLIND_WAIT`](lease_api::backend::MAX_BLIND_WAIT) from then).
    pub(crate) until: Instant,
    /// The etcd revision of the answer that showed the key held: a watch from
    /// the next revision is sent every deletion since.
    pub(crate) revision: i64,
}

/// An etcd lease granted for a try that found its key held, kept for the next
/// try on that key (the one a wake-up makes): that try needs no grant first,
/// since its transaction and a keep-alive of the spare go out together.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spare {
    pub(crate) id: i64,
    /// The TTL the try asked for: a spare serves only a try asking the same.
    pub(crate) asked: Duration,
    /// What etcd granted (or last renewed), and when that request was sent:
    /// the etcd lease lives at least until `sent_at + granted`.
    pub(crate) granted: Duration,
    pub(crate) sent_at: Instant,
}

/// What [`EtcdProvider::claim`] does with its own etcd lease when the key
/// was held.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Unused {
    /// Keep it as the key's [`Spare`] for tries asking this TTL.
    Spare(Duration),
    /// Nothing: the caller owns it (a try on a spare, which must not make
    /// the spare takeable again before the try is over).
    Leave,
}

impl Spare {
    pub(crate) fn lives_until(&self) -> Instant {
        self.sent_at + self.granted
    }
}

/// True when etcd refused a put because its lease does not exist.
pub(crate) fn source_says_lease_not_found(e: &LeaseError) -> bool {
    if e.to_string().contains("lease not found") {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.to_string().contains("lease not found") {
            return true;
        }
        source = s.source();
    }
    false
}

/// A hook of [`EtcdProvider::set_after_keep_alive`].
pub type SessionHook = Arc<dyn Fn() -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>;

/// Leases on etcd: etcd leases for expiry, create revisions for tokens, watches
/// for waiting. See the crate docs.
#[derive(Clone)]
pub struct EtcdProvider {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for EtcdProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdProvider")
            .field("endpoints", &self.inner.display)
            .field("namespace", &self.inner.config.namespace)
            .finish_non_exhaustive()
    }
}

pub(crate) fn encode_namespace(ns: &str) -> String {
    ns.replace('%', "%25").replace('/', "%2F")
}

/// gRPC status codes (stable across gRPC implementations) that mean the
/// cluster could not serve the request: CANCELLED, UNKNOWN, DEADLINE_EXCEEDED,
/// ABORTED, UNAVAILABLE.
/// etcd's default election timeout is 1 s; leave room for a slow election.
pub(crate) const ELECTION_TIMEOUT_BOUND: Duration = Duration::from_secs(3);

/// How long a background revoke is retried while etcd is unreachable: the
/// longest a fair waiter's ticket lives unrefreshed, after which its lease
/// has run out anyway.
pub(crate) const REVOKE_RETRIES_FOR: Duration = lease_api::backend::MAX_TICKET_TTL;

pub(crate) fn status_unavailable(code: i32) -> bool {
    matches!(code, 1 | 2 | 4 | 10 | 14)
}

impl EtcdProvider {
    /// Sets up a provider; connecting happens on first use.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for no endpoints, an endpoint that is not an
    /// `http://` or `https://` URL, or a bad namespace.
    pub fn new(config: EtcdConfig) -> Result<Self> {
        validate_namespace(&config.namespace)?;
        if config.endpoints.is_empty() {
            return Err(LeaseError::Config(
                "etcd needs at least one endpoint".into(),
            ));
        }
        for e in &config.endpoints {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(LeaseError::Config(format!(
                    "etcd endpoint {e:?} must be an http:// or https:// URL, e.g. http://127.0.0.1:2379"
                )));
            }
        }
        let caps = Capabilities::new(
            "etcd",
            ExpiryClock::ConsensusLeader,
            Notifications::Native("etcd watch"),
        )
        .with_fair_waiting(true)
        .with_multi_key(MultiKey::atomic(DEFAULT_MAX_KEYS))
        .with_shared_leases(true)
        .with_ttl_limits(Duration::from_secs(2), DEFAULT_MAX_TTL)
        .with_ttl_granularity(Duration::from_secs(1))
        // The lessor checks for expired leases every 500 ms and revokes
        // them through raft.
        .with_expiry_slack(Duration::from_millis(1000))
        .with_durable_tokens(TokenDurability::Durable(
            "tokens are etcd create revisions: global, raft-replicated and persisted".into(),
        ))
        // A new leader restarts every lease at its full TTL once elected
        // (etcd's lessor promotion), so a failover can hold a crashed
        // holder's key for another TTL plus the election timeout.
        .with_failover_extension(Some(FailoverExtension::new(1, ELECTION_TIMEOUT_BOUND)))
        // A token is the key's create revision, returned only once raft has
        // committed the write on a majority: a new leader has it in its log.
        // The etcd lease is replicated state too, and keep-alives resume at
        // the new leader. Serving again takes an election plus one failed
        // request (connect and request timeouts) before the client moves to
        // another endpoint.
        .with_failover(Some(Failover::new(
            FailoverTokens::Increasing(
                "create revisions are committed on a majority before they are returned".into(),
            ),
            true,
            ELECTION_TIMEOUT_BOUND + config.connect_timeout + config.request_timeout,
        )));
        Ok(EtcdProvider {
            inner: Arc::new(Inner {
                prefix: format!("lease/{}/", encode_namespace(&config.namespace)),
                display: config.endpoints.join(","),
                clients: config.endpoints.iter().map(|_| OnceCell::new()).collect(),
                current: std::sync::atomic::AtomicUsize::new(0),
                config,
                caps,
                seen_held: Arc::default(),
                spares: std::sync::Mutex::default(),
                issued: std::sync::Mutex::default(),
                after_keep_alive: std::sync::Mutex::default(),
            }),
        })
    }

    /// For tests: `hook` runs after etcd answered the keep-alive of an
    /// extend or of a session renewal and before the read of which keys
    /// are still on the etcd lease, so a test can delete a key exactly there.
    #[doc(hidden)]
    pub fn set_after_keep_alive(&self, hook: SessionHook) {
        *self
            .inner
            .after_keep_alive
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(hook);
    }

    /// Runs the hook of [`set_after_keep_alive`](Self::set_after_keep_alive), if any.
    pub(crate) async fn after_keep_alive(&self) {
        let hook = self
            .inner
            .after_keep_alive
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(hook) = hook {
            hook().await;
        }
    }

    pub(crate) fn seen_held(&self) -> std::sync::MutexGuard<'_, HashMap<String, SeenHeld>> {
        self.inner
            .seen_held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// For a key this provider saw held and not yet saw deleted: whether it
    /// is still there, by one read, so a waiter does not grant (and revoke)
    /// an etcd lease on every look at a held key.
    pub(crate) async fn still_held(&self, k: &str) -> Result<Option<Duration>> {
        let now = Instant::now();
        let until = {
            let mut seen = self.seen_held();
            seen.retain(|_, s| s.until > now);
            seen.get(k).map(|s| s.until)
        };
        let Some(until) = until else { return Ok(None) };
        let key = k.to_owned();
        let resp = self
            .call("get", |mut c| async move {
                c.get(key, Some(GetOptions::new().with_count_only())).await
            })
            .await?;
        if resp.count() > 0 {
            let revision = resp.header().map_or(0, |h| h.revision());
            if let Some(seen) = self.seen_held().get_mut(k) {
                seen.revision = seen.revision.max(revision);
            }
            return Ok(Some(until - now));
        }
        self.seen_held().remove(k);
        Ok(None)
    }

    /// Deletes the keys of every namespace whose name starts with `prefix`,
    /// whoever holds them (their etcd leases then run out by their TTL), and
    /// returns how many went. Only for namespaces nobody uses any more, such
    /// as a finished `lease conformance` run's.
    ///
    /// # Errors
    /// `Config` for an empty prefix; `Unavailable` when etcd is unreachable.
    pub async fn purge_namespaces(&self, prefix: &str) -> Result<u64> {
        lease_api::backend::validate_purge_prefix(prefix)?;
        let range = format!("lease/{}", encode_namespace(prefix));
        let resp = self
            .call("purge", |mut c| async move {
                c.delete(range, Some(etcd_client::DeleteOptions::new().with_prefix()))
                    .await
            })
            .await?;
        Ok(u64::try_from(resp.deleted()).unwrap_or(0))
    }

    pub(crate) fn etcd_key(&self, key: &LeaseKey) -> String {
        format!("{}{}", self.inner.prefix, key.as_str())
    }

    pub(crate) fn map_err(&self, e: etcd_client::Error) -> LeaseError {
        // 3 (a refused user or password), 7 permission denied, 16 unauthenticated.
        let refused = match &e {
            etcd_client::Error::GRpcStatus(s) => {
                matches!(i32::from(s.code()), 7 | 16)
                    || s.message().contains("authentication failed")
                    || s.message().contains("user name is empty")
                    || s.message().contains("permission denied")
            }
            _ => false,
        };
        if refused || lease_api::backend::is_tls_refusal(&e) {
            return LeaseError::denied(
                format!(
                    "etcd at {} refused our credentials, certificate or permissions",
                    self.inner.display
                ),
                e,
            );
        }
        let unavailable = match &e {
            etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
            etcd_client::Error::GRpcStatus(s) => status_unavailable(i32::from(s.code())),
            _ => false,
        };
        if unavailable {
            LeaseError::unavailable(format!("etcd at {} is unreachable", self.inner.display), e)
        } else {
            LeaseError::backend(
                format!("etcd at {} answered with an error", self.inner.display),
                e,
            )
        }
    }

    pub(crate) fn tls_options(&self) -> Result<etcd_client::TlsOptions> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let read = |what: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| {
                LeaseError::Config(format!(
                    "cannot read the etcd {what} {}: {e}",
                    path.display()
                ))
            })
        };
        let t = &self.inner.config.tls;
        let mut tls = etcd_client::TlsOptions::new();
        if let Some(ca) = &t.ca {
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(read("CA", ca)?));
        }
        if let Some((cert, key)) = &t.identity {
            tls = tls.identity(etcd_client::Identity::from_pem(
                read("client certificate", cert)?,
                read("client key", key)?,
            ));
        }
        Ok(tls)
    }

    /// The client of endpoint `i`.
    pub(crate) async fn client(&self, i: usize) -> Result<Client> {
        let c = &self.inner.config;
        let cell = self
            .inner
            .clients
            .get(i)
            .ok_or_else(|| LeaseError::protocol(format!("no etcd endpoint {i}")))?;
        let endpoint = [c.endpoints.get(i).cloned().unwrap_or_default()];
        let client = cell
            .get_or_try_init(|| async {
                let mut options = ConnectOptions::new()
                    .with_connect_timeout(c.connect_timeout)
                    .with_timeout(c.request_timeout)
                    .with_keep_alive(Duration::from_secs(5), c.request_timeout);
                if let Some((user, password)) = &c.credentials {
                    options = options.with_user(user.as_str(), password.as_str());
                }
                if c.endpoints.iter().any(|e| e.starts_with("https://")) {
                    options = options.with_tls(self.tls_options()?);
                }
                lease_api::backend::bounded(
                    "connecting",
                    c.connect_timeout + c.request_timeout,
                    Client::connect(endpoint, Some(options)),
                    |e| self.map_err(e),
                )
                .await
            })
            .await?;
        Ok(client.clone())
    }

    /// Runs one request on a fresh handle of the shared client, bounded by the
    /// request timeout.
    pub(crate) async fn call<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T>
    where
        F: FnOnce(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        use std::sync::atomic::Ordering;
        let i = self.inner.current.load(Ordering::Relaxed);
        let limit = self.inner.config.request_timeout + self.inner.config.connect_timeout;
        let answer = match self.client(i).await {
            Ok(client) => {
                lease_api::backend::bounded(what, limit, f(client), |e| self.map_err(e)).await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = &answer
            && e.is_transient()
        {
            // The next call goes to the next member (not this one: a
            // request that timed out may still have been applied).
            let n = self.inner.clients.len();
            let _ = self.inner.current.compare_exchange(
                i,
                (i + 1) % n.max(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        answer
    }

    /// Revokes `lease_id` in the background (with what is attached to it),
    /// retrying while etcd is unreachable: after a call whose answer was
    /// lost the connection is often down for a moment, and a ticket left
    /// on the lease would hold its line up until the lease ran out.
    pub(crate) fn revoke_in_background(&self, lease_id: i64) {
        let this = self.clone();
        tokio::spawn(async move {
            let give_up = Instant::now() + REVOKE_RETRIES_FOR;
            let mut pause = Duration::from_millis(50);
            loop {
                match this
                    .call(
                        "revoke",
                        |mut c| async move { c.lease_revoke(lease_id).await },
                    )
                    .await
                {
                    Ok(_) => return,
                    Err(e) if e.is_transient() && Instant::now() + pause < give_up => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(1));
                    }
                    Err(e) => {
                        tracing::debug!(lease_id, error = %e, "revoking an unused etcd lease failed; it runs out by its TTL");
                        return;
                    }
                }
            }
        });
    }

    pub(crate) async fn grant(&self, ttl: Duration) -> Result<(i64, Duration)> {
        let secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        let resp = self
            .call("lease grant", |mut c| async move {
                c.lease_grant(secs, None).await
            })
            .await?;
        let granted = Duration::from_secs(u64::try_from(resp.ttl()).unwrap_or(0));
        Ok((resp.id(), granted))
    }

    /// The comparisons that hold exactly while `lease` is held: the key's create
    /// revision is the lease's token and its value starts with the lease's
    /// owner and `:` (two byte-order comparisons: `owner < value < owner;`,
    /// since `;` follows `:`). Add them to your own etcd transactions to fence
    /// writes inside etcd.
    pub fn held_compares(&self, lease: &Lease) -> Vec<Compare> {
        let key = self.etcd_key(lease.key());
        let owner = lease.owner().to_hex();
        vec![
            Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                i64::try_from(lease.token().get()).unwrap_or(-1),
            ),
            Compare::value(key.clone(), CompareOp::Greater, owner.clone()),
            Compare::value(key, CompareOp::Less, format!("{owner};")),
        ]
    }

    /// Runs `then` in one etcd transaction that succeeds only while `lease` is
    /// held (see [`held_compares`](Self::held_compares)).
    ///
    /// # Errors
    /// `Lost` (and nothing is applied) when the lease is no longer held.
    pub async fn txn_if_held(&self, lease: &Lease, then: Vec<TxnOp>) -> Result<TxnResponse> {
        let txn = Txn::new().when(self.held_compares(lease)).and_then(then);
        let resp = self
            .call("txn", |mut c| async move { c.txn(txn).await })
            .await?;
        if resp.succeeded() {
            Ok(resp)
        } else {
            Err(LeaseError::lost(lease))
        }
    }

    /// Whether `lease`'s key (its token and owner) is now attached to etcd
    /// lease `id`, by one read.
    pub(crate) async fn key_is_on(&self, lease: &Lease, id: i64) -> Result<bool> {
        let k = self.etcd_key(lease.key());
        let current = self
            .call("get", |mut c| async move { c.get(k, None).await })
            .await?;
        Ok(current.kvs().first().is_some_and(|kv| {
            u64::try_from(kv.create_revision()).ok() == Some(lease.token().get())
                && parse_value(kv.value()).0 == Some(lease.owner())
                && kv.lease() == id
        }))
    }

    /// The key's mod revision while `lease` holds it (token and owner), by
    /// one read; `None` when it does not.
    pub(crate) async fn held_revision(&self, lease: &Lease) -> Result<Option<i64>> {
        let k = self.etcd_key(lease.key());
        let current = self
            .call("get", |mut c| async move { c.get(k, None).await })
            .await?;
        Ok(current
            .kvs()
            .first()
            .filter(|kv| {
                u64::try_from(kv.create_revision()).ok() == Some(lease.token().get())
                    && parse_value(kv.value()).0 == Some(lease.owner())
            })
            .map(etcd_client::KeyValue::mod_revision))
    }

    /// After a move of `lease`'s key to etcd lease `new_id`, guarded on mod
    /// revision `seen`, whose answer was lost: makes sure it can no longer
    /// land. A no-op put guarded the same way (it keeps the value and the
    /// etcd lease) moves the revision on; if the guard fails instead, the
    /// transaction's else-branch read tells whether the move did land.
    pub(crate) async fn fence_move(&self, lease: &Lease, seen: i64, new_id: i64) -> Fence {
        let key = self.etcd_key(lease.key());
        for attempt in 0..3u32 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100) * attempt).await;
            }
            let txn = Txn::new()
                .when(vec![
                    Compare::create_revision(
                        key.clone(),
                        CompareOp::Equal,
                        i64::try_from(lease.token().get()).unwrap_or(-1),
                    ),
                    Compare::mod_revision(key.clone(), CompareOp::Equal, seen),
                ])
                .and_then(vec![TxnOp::put(
                    key.clone(),
                    "",
                    Some(PutOptions::new().with_ignore_value().with_ignore_lease()),
                )])
                .or_else(vec![TxnOp::get(key.clone(), None)]);
            let Ok(resp) = self
                .call("extend fence", |mut c| async move { c.txn(txn).await })
                .await
            else {
                continue;
            };
            if resp.succeeded() {
                return Fence::NotMoved;
            }
            let moved = resp.op_responses().into_iter().any(|r| match r {
                etcd_client::TxnOpResponse::Get(get) => get.kvs().first().is_some_and(|kv| {
                    u64::try_from(kv.create_revision()).ok() == Some(lease.token().get())
                        && parse_value(kv.value()).0 == Some(lease.owner())
                        && kv.lease() == new_id
                }),
                _ => false,
            });
            // Either the move landed, or the key changed otherwise: the
            // move's guard can never hold again.
            return if moved { Fence::Moved } else { Fence::NotMoved };
        }
        Fence::Unknown
    }

    /// Keeps etcd lease `id` alive once: true when etcd renewed it (to its
    /// full TTL, as granted, from when the request arrived), false when etcd
    /// no longer has it. One round trip: opening etcd-client's keep-alive
    /// stream already sends a keep-alive and waits for its answer.
    pub(crate) async fn keep_alive_once(&self, id: i64) -> Result<bool> {
        let alive = self
            .call("keep-alive", |mut c| async move {
                c.lease_keep_alive(id).await.map(|_| ())
            })
            .await;
        let Err(e) = alive else { return Ok(true) };
        let cause = match &e {
            LeaseError::Backend {
                source: Some(src), ..
            } => src.downcast_ref::<etcd_client::Error>(),
            _ => None,
        };
        match cause {
            // etcd-client reports an unknown lease id (TTL 0 in etcd's
            // answer) as a keep-alive error.
            Some(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
            // And a stream that ended before any answer as a watch error:
            // nothing is known, try again (elsewhere).
            Some(etcd_client::Error::WatchError(_)) => Err(LeaseError::Unavailable {
                message: format!(
                    "etcd at {} closed the keep-alive stream without an answer",
                    self.inner.display
                ),
                source: None,
            }),
            _ => Err(e),
        }
    }

    /// Every key of this provider's namespace attached to etcd lease `id`,
    /// with its create revision: a keys-only range read in pages of
    /// [`SCAN_PAGE`] keys.
    pub(crate) async fn keys_on(&self, id: i64) -> Result<HashMap<Vec<u8>, i64>> {
        let mut found = HashMap::new();
        let end = prefix_end(self.inner.prefix.as_bytes());
        let mut from = self.inner.prefix.as_bytes().to_vec();
        loop {
            let (start, stop) = (from.clone(), end.clone());
            let page = self
                .call("range", |mut c| async move {
                    c.get(
                        start,
                        Some(
                            GetOptions::new()
                                .with_range(stop)
                                .with_keys_only()
                                .with_limit(SCAN_PAGE),
                        ),
                    )
                    .await
                })
                .await?;
            for kv in page.kvs() {
                if kv.lease() == id {
                    found.insert(kv.key().to_vec(), kv.create_revision());
                }
            }
            match page.kvs().last() {
                Some(last) if page.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(found),
            }
        }
    }

    /// Deletes `key` if its value starts with `owner`: undoes an acquire
    /// whose answer was lost, in the background.
    pub(crate) fn delete_if_owner_in_background(&self, key: &str, owner: OwnerId) {
        let this = self.clone();
        let key = key.to_owned();
        let owner = owner.to_hex();
        tokio::spawn(async move {
            let txn = Txn::new()
                .when(vec![
                    Compare::value(key.clone(), CompareOp::Greater, owner.clone()),
                    Compare::value(key.clone(), CompareOp::Less, format!("{owner};")),
                ])
                .and_then(vec![TxnOp::delete(key, None)]);
            if let Err(e) = this
                .call("undo txn", |mut c| async move { c.txn(txn).await })
                .await
            {
                tracing::debug!(error = %e, "undoing an acquire whose answer was lost failed; the key goes with the session");
            }
        });
    }

    /// Grants a new etcd lease of `ttl`.
    pub(crate) async fn grant_lease(&self, ttl: Duration) -> Result<(i64, Duration)> {
        self.grant(ttl).await
    }

    /// Revokes etcd lease `id` now, deleting every key attached to it.
    pub(crate) async fn revoke(&self, id: i64) -> Result<()> {
        self.call("revoke", |mut c| async move { c.lease_revoke(id).await })
            .await
            .map(|_| ())
    }

    /// The etcd key of a lease key.
    pub(crate) fn store_key(&self, key: &LeaseKey) -> String {
        self.etcd_key(key)
    }

    /// The remaining TTL of etcd lease `id`, if it still exists.
    pub(crate) async fn time_to_live(&self, id: i64) -> Result<Option<Duration>> {
        if id == 0 {
            return Ok(None);
        }
        let resp = self
            .call("lease time-to-live", |mut c| async move {
                c.lease_time_to_live(id, None).await
            })
            .await?;
        // etcd reports whole seconds, rounded down: 0 means "under a second",
        // and -1 an expired lease whose key the lessor is about to delete.
        // Report an upper bound, so a waiter sleeps until the end of that
        // second (or the deletion's watch event) instead of retrying at once.
        Ok(Some(Duration::from_secs(
            u64::try_from(resp.ttl()).map_or(1, |s| s.saturating_add(1)),
        )))
    }
}

/// The key's value: `<owner hex>:<holder label>`.
pub(crate) fn value(owner: OwnerId, holder: &str) -> String {
    format!("{}:{holder}", owner.to_hex())
}

/// Owner and holder label of a value; values written before labels existed
/// are the owner alone.
pub(crate) fn parse_value(v: &[u8]) -> (Option<OwnerId>, Option<String>) {
    let Ok(s) = std::str::from_utf8(v) else {
        return (None, None);
    };
    match s.split_once(':') {
        Some((o, h)) => (OwnerId::from_hex(o), Some(h.to_owned())),
        None => (OwnerId::from_hex(s), None),
    }
}

/// The etcd lease a lease of ours is attached to; 0 (no lease, which no key of
/// ours carries) for a lease from another backend, so every compare fails.
/// Keys per page of a session's range read.
pub(crate) const SCAN_PAGE: i64 = 10_000;

/// The first key after every key that starts with `prefix`.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // A prefix of only 0xff bytes: to the end of the key space.
    vec![0]
}

pub(crate) fn lease_id(lease: &Lease) -> i64 {
    match lease.handle() {
        LeaseHandle::EtcdLease(id) | LeaseHandle::EtcdSession(id) => id,
        _ => 0,
    }
}

/// What [`EtcdProvider::fence_move`] found out about a move whose answer
/// was lost.
pub(crate) enum Fence {
    /// It landed: the key is on the new etcd lease.
    Moved,
    /// It did not, and now never will.
    NotMoved,
    /// etcd did not answer: it may still land.
    Unknown,
}

/// Revokes the etcd lease of `lease` after its key went, unless a session
/// owns it (the session's other keys live on it).
pub(crate) fn revoke_if_own(provider: &EtcdProvider, lease: &Lease) {
    if let LeaseHandle::EtcdLease(id) = lease.handle() {
        provider.revoke_in_background(id);
    }
}

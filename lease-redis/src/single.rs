//! `RedisProvider`: leases on one Redis server.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::ProbedCapabilities;
use lease_api::backend::{
    DEFAULT_MAX_TTL, DEFAULT_NAMESPACE, KeyWatch, OwnerId, Place, Ticket, WaitQueue,
    validate_namespace,
};
use lease_api::{
    Capabilities, ExpiryClock, Failover, FailoverTokens, FencingToken, Lease, LeaseError,
    LeaseInfo, LeaseKey, LeaseProvider, Notifications, Result, TokenDurability, TryAcquire,
};
use redis::Value;
use tokio::time::Instant;

use crate::keys::{
    QueueKeys, cancel_key, encode, member_mark, queue_keys, redis_keys, release_channel,
    ticket_member, ticket_message,
};
use crate::node::Node;
use crate::scripts::{
    ACQUIRE, EXTEND, EXTEND_BATCH, EXTEND_MANY, INSPECT, QUEUE_JOIN, QUEUE_LEAVE, QUEUE_LIVE,
    QUEUE_PLACE, QUEUE_REFRESH, RELEASE, held_by,
};
pub(crate) use crate::time::{Timeouts, millis};

/// The default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The default response timeout.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// How to reach one Redis server.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RedisConfig {
    /// `redis://[user:password@]host[:port][/db]` (or `rediss://` with the
    /// redis crate's TLS features enabled).
    pub url: String,
    /// The namespace; providers in different namespaces never see each other.
    pub namespace: String,
    /// How long to wait for a TCP connection.
    pub connect_timeout: Duration,
    /// How long to wait for an answer.
    pub response_timeout: Duration,
    /// Accept a server whose `maxmemory-policy` may evict keys. By default
    /// such a server is refused: eviction can drop a live lease (two holders)
    /// or a fence counter (tokens go back). With this set, the provider works
    /// and declares tokens volatile.
    pub allow_eviction: bool,
}

impl RedisConfig {
    /// A configuration for `url` with the default namespace and timeouts.
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            namespace: DEFAULT_NAMESPACE.into(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            allow_eviction: false,
        }
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets both timeouts.
    pub fn timeouts(mut self, connect: Duration, response: Duration) -> Self {
        self.connect_timeout = connect;
        self.response_timeout = response;
        self
    }

    /// Accepts (or refuses, the default) a server that may evict keys; see
    /// [`RedisConfig::allow_eviction`].
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }
}

/// The server's `maxmemory-policy`: `Ok(None)` when `CONFIG GET` is not allowed.
/// Reads the RESP2 array and the RESP3 map form of the answer alike.
pub(crate) async fn eviction_policy(node: &Node) -> Result<Option<String>> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let text = |v: &Value| redis::from_redis_value_ref::<String>(v).ok();
    match node.query::<Value>(&cmd).await {
        Ok(Value::Array(items)) => Ok(items.get(1).and_then(text)),
        Ok(Value::Map(pairs)) => Ok(pairs.first().and_then(|(_, v)| text(v))),
        Ok(_) => Ok(None),
        Err(e) if e.is_transient() => Err(e),
        Err(_) => Ok(None),
    }
}

/// Refuses a node whose `maxmemory-policy` may evict keys, unless `allow`.
pub(crate) async fn check_eviction(node: &Node, allow: bool) -> Result<()> {
    match eviction_policy(node).await? {
        Some(p) if p == "noeviction" => Ok(()),
        Some(p) if allow => {
            tracing::warn!(server = %node.display, policy = %p, "Redis may evict keys (allowed by configuration): leases and fence counters are not safe under memory pressure");
            Ok(())
        }
        Some(p) => Err(LeaseError::Config(format!(
            "Redis at {} has maxmemory-policy {p}: it may evict live leases (two holders) and fence counters \
             (tokens go back). Set maxmemory-policy noeviction, or accept it with allow_eviction",
            node.display
        ))),
        None => {
            tracing::warn!(server = %node.display, "cannot read maxmemory-policy (CONFIG GET refused); make sure it is noeviction");
            Ok(())
        }
    }
}

pub(crate) fn base_capabilities(backend: &'static str, clock: ExpiryClock) -> Capabilities {
    Capabilities::new(backend, clock, Notifications::Native("Redis pub/sub"))
        .with_ttl_limits(Duration::from_millis(10), DEFAULT_MAX_TTL)
        // Redis expires keys lazily on access (exactly at the deadline) and
        // actively every 100 ms; a script sees a key as gone once its PTTL ran out.
        .with_expiry_slack(Duration::from_millis(5))
        .with_durable_tokens(TokenDurability::Unknown(
            "not yet probed: tokens survive restarts only with AOF and appendfsync always".into(),
        ))
}

/// Redis Cluster's own default `cluster-node-timeout`, used until a node
/// answered.
const CLUSTER_DEFAULT_NODE_TIMEOUT: Duration = Duration::from_secs(15);

/// The base capabilities of a replicated Redis (under Sentinel, or a
/// Cluster), with the failover declaration of [`replica_failover`] for
/// replicas not yet counted.
fn replicated_capabilities(
    backend: &'static str,
    wait_replicas: u32,
    detection: Duration,
    call: Duration,
) -> Capabilities {
    base_capabilities(backend, ExpiryClock::StoreServer).with_failover(replica_failover(
        wait_replicas,
        None,
        // Failure detection, the vote and the promotion, then one failed
        // call before the provider looks for the new primary and one to
        // find it.
        detection + crate::sentinel::ELECTION_AND_PROMOTION + call * 2,
    ))
}

/// What a failover keeps when each acquire and extend waits for `wait`
/// replicas and the primary (every shard's, in a Cluster) has at least
/// `replicas` (`None`: not counted yet).
///
/// Tokens keep growing for sure only when every replica has acknowledged
/// them: Sentinel ranks replicas by `replica-priority` before replication
/// offset, a Cluster elects by a vote whose rank delay favours, but does not
/// guarantee, the most up-to-date replica, and in a planned failover or a
/// partition a replica that acknowledged writes on the old primary drops them
/// in a full resync. A lease survives when the promoted replica still has
/// `wait` replicas of its own to acknowledge the renewals.
fn replica_failover(wait: u32, replicas: Option<u32>, recovery: Duration) -> Option<Failover> {
    let tokens = match replicas {
        _ if wait == 0 => FailoverTokens::MayRepeat(
            "wait=0: replication is asynchronous, so a promoted replica may lack the last counter \
             increments and leases"
                .into(),
        ),
        Some(r) if wait >= r => FailoverTokens::Increasing(format!(
            "each token is acknowledged by every replica ({r}, WAIT) before it is returned, so whichever \
             replica is promoted has it"
        )),
        Some(r) => FailoverTokens::MayRepeat(format!(
            "each token waits for {wait} of {r} replicas: a replica that did not acknowledge it can be \
             promoted (a lower replica-priority, a lost election race, or a failover while the old primary \
             still runs); wait={r} closes this at the price of refusing writes until a lost replica returns"
        )),
        None => FailoverTokens::MayRepeat("the replicas have not been counted yet".into()),
    };
    let survives = wait > 0 && replicas.is_some_and(|r| r > wait);
    Some(Failover::new(tokens, survives, recovery))
}

/// Reads `appendonly` and `appendfsync` to say whether fence counters survive
/// a restart.
pub(crate) async fn probe_durability(node: &Node) -> TokenDurability {
    let get = |name: &'static str| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(name);
        cmd
    };
    if let Ok(Some(policy)) = eviction_policy(node).await
        && policy != "noeviction"
    {
        return TokenDurability::Volatile(format!(
            "{}: maxmemory-policy {policy} may evict keys under memory pressure: fence counters (tokens go back) \
             and, with volatile-* and allkeys-* policies, live leases (two holders); set noeviction",
            node.display
        ));
    }
    let aof: Result<Vec<String>> = node.query(&get("appendonly")).await;
    let fsync: Result<Vec<String>> = node.query(&get("appendfsync")).await;
    match (aof, fsync) {
        (Ok(a), Ok(f)) if a.get(1).map(String::as_str) == Some("yes") => {
            if f.get(1).map(String::as_str) == Some("always") {
                TokenDurability::Durable(format!(
                    "{}: AOF with appendfsync always writes every counter increment to disk before replying",
                    node.display
                ))
            } else {
                TokenDurability::Volatile(format!(
                    "{}: AOF with appendfsync {}: a clean restart keeps tokens, a crash can lose the last increments and reissue tokens",
                    node.display,
                    f.get(1).map_or("?", String::as_str)
                ))
            }
        }
        (Ok(_), Ok(_)) => TokenDurability::Volatile(format!(
            "{}: AOF is off; a restart loses the fence counters and tokens start again",
            node.display
        )),
        _ => TokenDurability::Unknown(format!(
            "{}: CONFIG GET is not allowed; tokens survive restarts only with AOF and appendfsync always",
            node.display
        )),
    }
}

struct Inner {
    node: Node,
    /// Under Sentinel: how many replicas must acknowledge each acquire and
    /// extend before it counts (0: none, a single server).
    wait_replicas: u32,
    allow_eviction: bool,
    /// Under Sentinel or on a Cluster, the first call waits for the probe:
    /// the failover declaration depends on the live settings.
    sentinel_probed: tokio::sync::OnceCell<()>,
    /// The eviction check, made once before the first acquire.
    eviction_checked: tokio::sync::OnceCell<()>,
    /// Cancels of timed-out acquires still running (see `flush`).
    cleanups: tokio_util::task::TaskTracker,
    namespace: String,
    ns_encoded: String,
    channel: String,
    hub: Arc<lease_api::backend::WatchHub>,
    caps: ProbedCapabilities,
}

/// Leases on one Redis server.
///
/// Acquire, extend, release and inspect are each one Lua script (one round trip,
/// EVALSHA after the first call). All clones share one multiplexed connection that
/// reconnects by itself, and one pub/sub connection for waiters (opened on the
/// first wait). See the crate docs for the key layout and guarantees.
#[derive(Clone)]
pub struct RedisProvider {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisProvider")
            .field("server", &self.inner.node.display)
            .field("namespace", &self.inner.namespace)
            .finish_non_exhaustive()
    }
}

impl RedisProvider {
    /// Sets up a provider. Connecting happens on first use, so this does not
    /// fail when the server is down; operations then return `Unavailable`.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for a malformed URL or namespace.
    pub fn new(config: RedisConfig) -> Result<Self> {
        validate_namespace(&config.namespace)?;
        let node = Node::new(
            &config.url,
            Timeouts {
                connect: config.connect_timeout,
                response: config.response_timeout,
            },
        )?;
        let ns_encoded = encode(&config.namespace);
        let wait_replicas = node.wait_replicas();
        let call = config.connect_timeout + config.response_timeout;
        let base = if node.sentinel().is_some() {
            replicated_capabilities(
                "redis-sentinel",
                wait_replicas,
                crate::sentinel::DEFAULT_DOWN_AFTER,
                call,
            )
        } else if node.is_cluster() {
            replicated_capabilities(
                "redis-cluster",
                wait_replicas,
                CLUSTER_DEFAULT_NODE_TIMEOUT * 2,
                call,
            )
        } else {
            base_capabilities("redis", ExpiryClock::StoreServer)
        };
        Ok(RedisProvider {
            inner: Arc::new(Inner {
                node,
                wait_replicas,
                sentinel_probed: tokio::sync::OnceCell::new(),
                allow_eviction: config.allow_eviction,
                eviction_checked: tokio::sync::OnceCell::new(),
                cleanups: tokio_util::task::TaskTracker::new(),
                channel: release_channel(&ns_encoded),
                ns_encoded,
                namespace: config.namespace,
                hub: Arc::default(),
                caps: ProbedCapabilities::new(base.with_fair_waiting(true)),
            }),
        })
    }

    /// A provider for `url` with the default namespace and timeouts.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for a malformed URL.
    pub fn from_url(url: &str) -> Result<Self> {
        Self::new(RedisConfig::new(url))
    }

    /// Asks the server whether tokens survive restarts and returns the
    /// capabilities with that answer (also what [`capabilities`](LeaseProvider::capabilities)
    /// reports from then on). Happens by itself in the background on first use.
    ///
    /// # Errors
    /// `Unavailable` when the server cannot be reached.
    pub async fn probe(&self) -> Result<Capabilities> {
        let _: String = self.inner.node.query(&redis::cmd("PING")).await?;
        let durable_tokens = probe_durability(&self.inner.node).await;
        let timeouts = self.inner.node.timeouts();
        let call = timeouts.connect + timeouts.response;
        let failover = if let Some(sentinel) = self.inner.node.sentinel() {
            // Under Sentinel the failover bound follows from the live
            // down-after-milliseconds of the monitored master.
            let down_after = sentinel
                .down_after(timeouts)
                .await
                .unwrap_or(crate::sentinel::DEFAULT_DOWN_AFTER);
            let replicas = self.connected_replicas().await;
            replica_failover(
                self.inner.wait_replicas,
                replicas,
                down_after + crate::sentinel::ELECTION_AND_PROMOTION + call * 2,
            )
        } else if self.inner.node.is_cluster() {
            // A replica is elected once the primary has been unreachable for
            // cluster-node-timeout and the other primaries agreed, which
            // takes up to about another node timeout of gossip.
            let mut cmd = redis::cmd("CONFIG");
            cmd.arg("GET").arg("cluster-node-timeout");
            let node_timeout = match self.inner.node.query::<Value>(&cmd).await {
                Ok(Value::Array(items)) => items
                    .get(1)
                    .and_then(|v| redis::from_redis_value_ref::<String>(v).ok()),
                Ok(Value::Map(pairs)) => pairs
                    .first()
                    .and_then(|(_, v)| redis::from_redis_value_ref::<String>(v).ok()),
                _ => None,
            }
            .and_then(|ms| ms.parse::<u64>().ok())
            .map_or(CLUSTER_DEFAULT_NODE_TIMEOUT, Duration::from_millis);
            let replicas = self.shard_replicas().await;
            replica_failover(
                self.inner.wait_replicas,
                replicas,
                node_timeout * 2 + crate::sentinel::ELECTION_AND_PROMOTION + call * 2,
            )
        } else {
            return Ok(self.inner.caps.record(durable_tokens));
        };
        Ok(self.inner.caps.record_with(|c| {
            c.with_durable_tokens(durable_tokens)
                .with_failover(failover)
        }))
    }

    /// Under Sentinel: probes before the first call answers, so the
    /// capabilities a caller reads after it carry the live failover bound.
    /// A probe that fails is tried again by the next call.
    async fn ready(&self) {
        if self.inner.node.wait_replicas() > 0
            || self.inner.node.sentinel().is_some()
            || self.inner.node.is_cluster()
        {
            let _ = self
                .inner
                .sentinel_probed
                .get_or_try_init(|| async { self.probe().await.map(|_| ()) })
                .await;
        }
    }

    fn start_probe(&self) {
        if self.inner.caps.begin() {
            let this = self.clone();
            tokio::spawn(async move {
                if this.probe().await.is_err() {
                    this.inner.caps.failed();
                }
            });
        }
    }

    fn keys(&self, key: &LeaseKey) -> (String, String) {
        redis_keys(&self.inner.ns_encoded, key.as_str())
    }

    /// Deletes every lease, fence counter and tombstone of every namespace
    /// whose name starts with `prefix`, whoever holds them, and returns how
    /// many Redis keys went. Tokens of those keys start again afterwards: only
    /// for namespaces nobody uses any more, such as a finished
    /// `lease conformance` run's.
    ///
    /// # Errors
    /// `Config` for an empty prefix; `Unavailable` when the server is down.
    pub async fn purge_namespaces(&self, prefix: &str) -> Result<u64> {
        lease_api::backend::validate_purge_prefix(prefix)?;
        self.inner
            .node
            .delete_matching(&crate::keys::namespace_pattern(prefix))
            .await
    }

    /// Refuses a server that may evict keys, unless allowed: checked once,
    /// before the first acquire (one extra round trip per provider).
    async fn check_eviction(&self) -> Result<()> {
        self.inner
            .eviction_checked
            .get_or_try_init(|| check_eviction(&self.inner.node, self.inner.allow_eviction))
            .await
            .map(|_| ())
    }

    /// How many replicas the primary has now (`INFO replication`).
    async fn connected_replicas(&self) -> Option<u32> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("replication");
        let text: String = self.inner.node.query(&cmd).await.ok()?;
        text.lines()
            .find_map(|l| l.trim().strip_prefix("connected_slaves:"))
            .and_then(|n| n.parse().ok())
    }

    /// The fewest replicas any primary of a Cluster has (`CLUSTER NODES`,
    /// failed nodes left out); `None` when the answer cannot be read.
    async fn shard_replicas(&self) -> Option<u32> {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("NODES");
        let text: String = self.inner.node.query(&cmd).await.ok()?;
        let mut primaries: Vec<(String, u32)> = Vec::new();
        let mut replica_of = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(id), Some(flags), Some(master)) = (f.first(), f.get(2), f.get(3)) else {
                continue;
            };
            if flags.contains("fail") {
                continue;
            }
            if flags.contains("master") {
                primaries.push(((*id).to_owned(), 0));
            } else if flags.contains("slave") {
                replica_of.push((*master).to_owned());
            }
        }
        for m in replica_of {
            if let Some(p) = primaries.iter_mut().find(|(id, _)| *id == m) {
                p.1 += 1;
            }
        }
        primaries.iter().map(|(_, n)| *n).min()
    }

    /// An acquire or extend that fewer replicas acknowledged than required.
    fn unreplicated(&self, acked: u32) -> LeaseError {
        // A primary without its replicas may be one that was demoted while
        // frozen and thawed since: the next call looks for the primary again.
        self.inner.node.forget_connection();
        LeaseError::unavailable(
            format!(
                "Redis at {}: {acked} of the {} replica(s) required acknowledged the write within {:?}",
                self.inner.node.display,
                self.inner.wait_replicas,
                self.inner.node.timeouts().response / 2
            ),
            std::io::Error::other("too few replicas"),
        )
    }

    /// After an acquire whose outcome is unknown (it timed out, maybe queued
    /// in a stalled server), make sure it leaves no lease behind.
    fn cancel_in_background(
        &self,
        lease_key: String,
        owner: OwnerId,
        ttl: Duration,
        key: &LeaseKey,
    ) {
        let this = self.clone();
        let key = key.as_str().to_owned();
        self.inner.cleanups.spawn(async move {
            this.inner
                .node
                .cancel_until_done(&lease_key, &owner.to_hex(), ttl, &this.inner.channel, &key)
                .await;
        });
    }
}

/// The arguments of one [`EXTEND_MANY`] call: only leases with a valid TTL
/// go to the server (C3); the others are answered with their TTL error.
pub(crate) struct ExtendBatch {
    keys: Vec<String>,
    args: Vec<String>,
    ttls: Vec<Result<Duration>>,
}

impl ExtendBatch {
    pub(crate) fn new(
        caps: &Capabilities,
        leases: &[Lease],
        redis_key: impl Fn(&LeaseKey) -> String,
    ) -> Self {
        let ttls: Vec<Result<Duration>> = leases.iter().map(|l| caps.grant_ttl(l.ttl())).collect();
        let mut keys = Vec::with_capacity(leases.len());
        let mut args = Vec::with_capacity(leases.len() * 2);
        for (lease, ttl) in leases.iter().zip(&ttls) {
            if let Ok(ttl) = ttl {
                keys.push(redis_key(lease.key()));
                args.push(held_by(lease));
                args.push(millis(*ttl).to_string());
            }
        }
        ExtendBatch { keys, args, ttls }
    }

    /// How many leases go to the server.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The longest TTL sent.
    pub(crate) fn longest_ttl(&self) -> Duration {
        self.ttls
            .iter()
            .filter_map(|t| t.as_ref().ok())
            .copied()
            .max()
            .unwrap_or_default()
    }

    pub(crate) fn refs(&self) -> (Vec<&str>, Vec<&str>) {
        (
            self.keys.iter().map(String::as_str).collect(),
            self.args.iter().map(String::as_str).collect(),
        )
    }

    /// One answer per lease: `sent` is called, in order, for each lease that
    /// went to the server, with its granted TTL.
    pub(crate) fn answer(
        self,
        leases: &[Lease],
        mut sent: impl FnMut(&Lease, Duration) -> Result<Lease>,
    ) -> Vec<Result<Lease>> {
        leases
            .iter()
            .zip(self.ttls)
            .map(|(lease, ttl)| sent(lease, ttl?))
            .collect()
    }
}

/// A stored lease value: owner, token and, when recorded, the holder label.
pub(crate) fn parse_value(v: &str) -> Option<(OwnerId, FencingToken, Option<String>)> {
    let (owner, rest) = v.split_once(':')?;
    let (token, holder) = match rest.split_once(':') {
        Some((t, h)) => (t, Some(h.to_owned())),
        None => (rest, None),
    };
    Some((
        OwnerId::from_hex(owner)?,
        FencingToken(token.parse().ok()?),
        holder,
    ))
}

pub(crate) fn unexpected(what: &str, v: &Value) -> LeaseError {
    LeaseError::protocol(format!("unexpected answer to {what}: {v:?}"))
}

#[async_trait]
impl LeaseProvider for RedisProvider {
    fn capabilities(&self) -> &Capabilities {
        self.inner.caps.get()
    }

    fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.ready().await;
        let ttl = self.capabilities().grant_ttl(ttl)?;
        self.check_eviction().await?;
        self.start_probe();
        let (lease_key, fence_key) = self.keys(key);
        let owner = OwnerId::random();
        let owner_hex = owner.to_hex();
        let cancel_key = cancel_key(&lease_key, &owner_hex);
        let holder = lease_api::holder();
        let sent_at = Instant::now();
        let keys = [lease_key.as_str(), fence_key.as_str(), cancel_key.as_str()];
        let ttl_ms = millis(ttl).to_string();
        let args = [owner_hex.as_str(), ttl_ms.as_str(), &holder];
        let wait = self.inner.wait_replicas;
        let answer = if wait == 0 {
            self.inner
                .node
                .eval::<(i64, i64, String)>(&ACQUIRE, &keys, &args)
                .await
                .map(|v| (v, wait))
        } else {
            self.inner
                .node
                .eval_replicated::<(i64, i64, String)>(&ACQUIRE, &keys, &args, wait)
                .await
        };
        let ((won, n, _holder), acked) = match answer {
            Ok(v) => v,
            Err(e) => {
                // The script may still run (a frozen server runs what queued up
                // when it thaws), or may have run before the connection dropped:
                // cancel it so no lease nobody knows of is left.
                if e.is_transient() {
                    self.cancel_in_background(lease_key, owner, ttl, key);
                }
                return Err(e);
            }
        };
        if won == 1 {
            let token = u64::try_from(n)
                .map_err(|_| LeaseError::protocol(format!("negative token {n}")))?;
            let lease = Lease::new(key.clone(), FencingToken(token), owner, ttl, sent_at)
                .with_holder(holder);
            if acked < wait {
                // A failover now could promote a replica without this lease
                // or its token: give it back rather than hand it out.
                if let Err(e) = self.release(&lease).await {
                    tracing::warn!(key = %key, error = %e, "could not give back a lease no replica acknowledged; it runs out by its TTL");
                }
                return Err(self.unreplicated(acked));
            }
            Ok(TryAcquire::Acquired(lease))
        } else {
            let remaining = u64::try_from(n).ok().map(Duration::from_millis);
            Ok(TryAcquire::Held { remaining })
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        let (lease_key, _) = self.keys(lease.key());
        let sent_at = Instant::now();
        let owner = held_by(lease);
        let ttl_ms = millis(ttl).to_string();
        let wait = self.inner.wait_replicas;
        let done: i64 = if wait == 0 {
            self.inner
                .node
                .eval(&EXTEND, &[&lease_key], &[&owner, &ttl_ms])
                .await?
        } else {
            let (done, acked) = self
                .inner
                .node
                .eval_replicated(&EXTEND, &[&lease_key], &[&owner, &ttl_ms], wait)
                .await?;
            // An expiry only the primary has would end earlier after a
            // failover than the holder believes: not an extension yet.
            if done == 1 && acked < wait {
                return Err(self.unreplicated(acked));
            }
            done
        };
        if done == 1 {
            Ok(lease.renewed(ttl, sent_at))
        } else {
            Err(LeaseError::lost(lease))
        }
    }

    /// One script call for the whole batch, compare-owner per key; on a
    /// Cluster one per lease, all at once, since a script touches one slot.
    async fn extend_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        if self.inner.node.is_cluster() {
            // One script may touch one slot only: each lease on its own,
            // all at once (the cluster pipelines them per node).
            // Each answered on its own, as a batch of one would be.
            return Ok(futures_util::future::join_all(
                leases.iter().map(|l| self.extend(l, l.ttl())),
            )
            .await);
        }
        let batch = ExtendBatch::new(self.capabilities(), leases, |k| self.keys(k).0);
        let sent_at = Instant::now();
        // How many replicas acknowledged, when too few.
        let mut short = None;
        let done: Vec<i64> = if batch.is_empty() {
            Vec::new()
        } else {
            let (keys, args) = batch.refs();
            let wait = self.inner.wait_replicas;
            if wait == 0 {
                self.inner.node.eval(&EXTEND_MANY, &keys, &args).await?
            } else {
                let (done, acked): (Vec<i64>, u32) = self
                    .inner
                    .node
                    .eval_replicated(&EXTEND_MANY, &keys, &args, wait)
                    .await?;
                if acked < wait {
                    short = Some(acked);
                }
                done
            }
        };
        if done.len() != batch.len() {
            return Err(LeaseError::protocol(format!(
                "a batched extend of {} leases answered {} times",
                batch.len(),
                done.len()
            )));
        }
        let mut done = done.into_iter();
        // Each lease answered on its own: a lost one is lost, and an
        // extension too few replicas acknowledged is not one yet.
        Ok(
            batch.answer(leases, |lease, ttl| match (done.next(), short) {
                (Some(1), None) => Ok(lease.renewed(ttl, sent_at)),
                (Some(1), Some(acked)) => Err(self.unreplicated(acked)),
                _ => Err(LeaseError::lost(lease)),
            }),
        )
    }

    fn batch_limit(&self) -> usize {
        EXTEND_BATCH
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let (lease_key, _) = self.keys(lease.key());
        let done: i64 = self
            .inner
            .node
            .eval(
                &RELEASE,
                &[&lease_key],
                &[&held_by(lease), &self.inner.channel, lease.key().as_str()],
            )
            .await?;
        if done == 1 {
            Ok(())
        } else {
            Err(LeaseError::not_held(lease))
        }
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        self.ready().await;
        let (lease_key, _) = self.keys(key);
        let v: Value = self.inner.node.eval(&INSPECT, &[&lease_key], &[]).await?;
        match v {
            Value::Nil => Ok(None),
            Value::Array(items) => match items.as_slice() {
                [value, Value::Int(pttl)] => {
                    let value: String = redis::from_redis_value_ref(value)
                        .map_err(|_| unexpected("inspect", value))?;
                    let (owner, token, holder) = parse_value(&value).ok_or_else(|| {
                        LeaseError::protocol(format!("malformed lease value {value:?}"))
                    })?;
                    Ok(Some(LeaseInfo::new(
                        token,
                        Duration::from_millis(u64::try_from(*pttl).unwrap_or(0)),
                        Some(owner),
                        holder,
                    )))
                }
                _ => Err(LeaseError::protocol(format!(
                    "unexpected answer to inspect: {items:?}"
                ))),
            },
            other => Err(unexpected("inspect", &other)),
        }
    }

    async fn flush(&self, limit: Duration) {
        let tracker = &self.inner.cleanups;
        tracker.close();
        let _ = tokio::time::timeout(limit, tracker.wait()).await;
        tracker.reopen();
    }

    fn wait_queue(&self) -> Option<&dyn WaitQueue> {
        Some(self)
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        // Registered first: a subscriber that dies while we check it wakes
        // this watch too, instead of nobody.
        let watch = self.inner.hub.watch(key.as_str());
        self.inner
            .node
            .subscribe(&self.inner.channel, &self.inner.hub)
            .await?;
        Ok(Box::new(watch))
    }
}

impl RedisProvider {
    fn queue_keys(&self, key: &LeaseKey) -> QueueKeys {
        queue_keys(&self.keys(key).0)
    }
}

/// Fair waiting on a sorted set per key (same hash tag as the lease, so one
/// Redis Cluster slot): tickets ordered by a counter, deadlines on the
/// server's clock in a second sorted set. A waiter leaving announces it on
/// the release channel with a message only the waiter behind it listens
/// for; a dead waiter's ticket is dropped once its deadline passed.
#[async_trait]
impl WaitQueue for RedisProvider {
    async fn join(&self, key: &LeaseKey, ttl: Duration, mark: u64) -> Result<Ticket> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        let k = self.queue_keys(key);
        let ms = ttl.as_millis().to_string();
        let seq: u64 = self
            .inner
            .node
            .eval(
                &QUEUE_JOIN,
                &[&k.tickets, &k.deadlines, &k.counter, &k.marks],
                &[&format!("{mark:016x}"), &ms],
            )
            .await?;
        Ok(Ticket::new(key.clone(), seq, mark))
    }

    async fn place(&self, ticket: &Ticket) -> Result<Place> {
        let k = self.queue_keys(ticket.key());
        let (ahead, remaining, member): (i64, i64, String) = self
            .inner
            .node
            .eval(
                &QUEUE_PLACE,
                &[&k.tickets, &k.deadlines, &k.marks],
                &[&ticket_member(ticket.seq(), ticket.mark())],
            )
            .await?;
        Ok(match u64::try_from(ahead) {
            Err(_) => Place::Gone,
            Ok(0) => Place::First,
            Ok(seq) => Place::Behind {
                ahead: Ticket::new(ticket.key().clone(), seq, member_mark(&member)),
                remaining: Some(Duration::from_millis(u64::try_from(remaining).unwrap_or(0))),
            },
        })
    }

    async fn watch_ticket(&self, ahead: &Ticket) -> Result<Box<dyn KeyWatch>> {
        // Registered and subscribed first, then looked at: a leave before
        // the look shows as a missing ticket, one after it as a message.
        let member = ticket_member(ahead.seq(), ahead.mark());
        let watch = self
            .inner
            .hub
            .watch(&ticket_message(ahead.key().as_str(), &member));
        self.inner
            .node
            .subscribe(&self.inner.channel, &self.inner.hub)
            .await?;
        let k = self.queue_keys(ahead.key());
        let live: i64 = self
            .inner
            .node
            .eval(&QUEUE_LIVE, &[&k.deadlines], &[&member])
            .await?;
        if live == 1 {
            Ok(Box::new(watch))
        } else {
            Ok(Box::new(lease_api::backend::ReadyWatch))
        }
    }

    async fn refresh(&self, ticket: &Ticket, ttl: Duration) -> Result<bool> {
        let ttl = self.capabilities().grant_ttl(ttl)?;
        let k = self.queue_keys(ticket.key());
        let done: i64 = self
            .inner
            .node
            .eval(
                &QUEUE_REFRESH,
                &[&k.tickets, &k.deadlines, &k.counter, &k.marks],
                &[
                    &ticket_member(ticket.seq(), ticket.mark()),
                    &ttl.as_millis().to_string(),
                ],
            )
            .await?;
        Ok(done == 1)
    }

    async fn leave(&self, ticket: &Ticket) -> Result<()> {
        let k = self.queue_keys(ticket.key());
        let member = ticket_member(ticket.seq(), ticket.mark());
        let _: i64 = self
            .inner
            .node
            .eval(
                &QUEUE_LEAVE,
                &[&k.tickets, &k.deadlines, &k.marks],
                &[
                    &member,
                    &self.inner.channel,
                    &ticket_message(ticket.key().as_str(), &member),
                ],
            )
            .await?;
        Ok(())
    }
}

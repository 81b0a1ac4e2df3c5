//! `RedlockProvider`: leases held by a majority of independent Redis nodes.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use lease_api::backend::bounded;
use lease_api::backend::{DEFAULT_NAMESPACE, KeyWatch, OwnerId, validate_namespace};
use lease_api::{
    Capabilities, ExpiryClock, Failover, FailoverTokens, FencingToken, Lease, LeaseError,
    LeaseInfo, LeaseKey, LeaseProvider, Result, TokenDurability, TryAcquire,
};
use redis::Value;
use tokio::time::Instant;

use crate::keys::{cancel_key, encode, redis_keys, release_channel};
use crate::node::{Node, Timeouts};
use crate::scripts::{
    ACQUIRE, EXTEND, EXTEND_BATCH, EXTEND_MANY, INSPECT, RAISE, RELEASE, held_by,
};
use crate::single::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT, ExtendBatch, base_capabilities,
    check_eviction, millis, parse_value,
};

/// How to reach the independent Redis nodes of a Redlock.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RedlockConfig {
    /// One URL per node; at least 3, best an odd number. The nodes must be
    /// independent servers (not replicas of each other).
    pub urls: Vec<String>,
    /// The namespace; providers in different namespaces never see each other.
    pub namespace: String,
    /// How long to wait for a TCP connection to one node.
    pub connect_timeout: Duration,
    /// How long to wait for one node's answer. Keep it well below the TTLs you
    /// use: a slow node only delays the round until this timeout.
    pub response_timeout: Duration,
    /// Accept nodes whose `maxmemory-policy` may evict keys (see
    /// [`RedisConfig::allow_eviction`](crate::RedisConfig::allow_eviction)).
    pub allow_eviction: bool,
}

impl RedlockConfig {
    /// A configuration for `urls` with the default namespace and timeouts.
    pub fn new<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedlockConfig {
            urls: urls.into_iter().map(Into::into).collect(),
            namespace: DEFAULT_NAMESPACE.into(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            allow_eviction: false,
        }
    }

    /// Accepts (or refuses, the default) nodes that may evict keys.
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
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
}

struct Inner {
    nodes: Vec<Node>,
    allow_eviction: bool,
    /// Cancels on nodes still running (see `flush`).
    cleanups: tokio_util::task::TaskTracker,
    /// Per node: its eviction policy was checked (once it answered).
    eviction_checked: Vec<std::sync::atomic::AtomicBool>,
    response_timeout: Duration,
    quorum: usize,
    namespace: String,
    ns_encoded: String,
    channel: String,
    hub: Arc<lease_api::backend::WatchHub>,
    caps: Capabilities,
}

/// The token of a won acquire round, and whether the raise round must run.
#[derive(Debug, PartialEq, Eq)]
struct TokenStep {
    token: u64,
    raise: bool,
}

/// The token is the highest counter among the nodes that granted the lease
/// (`won`: node index and the counter its acquire script returned). The raise
/// round brings every one of them up to it; when they all returned the same
/// counter (the steady state: healthy nodes count every acquisition alike)
/// each already is there, and has the token in its stored value, so the round
/// is skipped. Either way, once the lease is granted, every node of the
/// majority has a counter >= the token, which is what makes any later
/// majority's token larger (see the crate docs; `tests::tokens_are_monotonic_*`
/// check it over every majority sequence).
fn token_step(won: &[(usize, u64)]) -> TokenStep {
    let token = won.iter().map(|(_, t)| *t).max().unwrap_or(0);
    TokenStep {
        token,
        raise: won.iter().any(|(_, t)| *t != token),
    }
}

/// Leases held by a majority of N independent Redis nodes (Redlock).
///
/// Every operation is one parallel round to all nodes. Acquire adds a second
/// round on the winning majority to raise their fence counters, only when
/// their counters disagree (see the crate docs). A minority of nodes down or
/// slow does not stop it.
#[derive(Clone)]
pub struct RedlockProvider {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedlockProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<_> = self
            .inner
            .nodes
            .iter()
            .map(|n| n.display.as_str())
            .collect();
        f.debug_struct("RedlockProvider")
            .field("nodes", &nodes)
            .field("namespace", &self.inner.namespace)
            .finish_non_exhaustive()
    }
}

/// What one node said to an acquire.
enum Reply {
    Yes(u64),
    No(i64, String),
    Down(LeaseError),
}

/// The outcome of a [`RedlockProvider::vote`].
struct Vote {
    yes: usize,
    /// Which nodes answered (yes or no) before the vote closed.
    answered: Vec<bool>,
    /// Which nodes said yes.
    said_yes: Vec<bool>,
    errors: Vec<LeaseError>,
}

/// The outcome of one acquire round.
enum Round {
    Won(Lease),
    /// Another owner holds a majority.
    Held {
        remaining: Option<Duration>,
    },
    /// Nobody holds a majority: contenders split the nodes, or stale leases sit
    /// on a minority.
    Split {
        remaining: Option<Duration>,
        /// How long the round took, to spread retries over.
        took: Duration,
    },
}

/// How often a split vote is retried inside one `try_acquire`.
const SPLIT_RETRIES: u32 = 8;

/// The shortest per-node timeout: below this, loopback scheduling noise alone
/// would drop nodes from rounds.
const MIN_NODE_TIMEOUT: Duration = Duration::from_millis(50);

impl RedlockProvider {
    /// Sets up a provider; nodes are connected on first use.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for fewer than 3 nodes, a malformed URL or namespace.
    pub fn new(config: RedlockConfig) -> Result<Self> {
        validate_namespace(&config.namespace)?;
        if config.urls.len() < 3 {
            return Err(LeaseError::Config(format!(
                "Redlock needs at least 3 independent Redis nodes, got {}",
                config.urls.len()
            )));
        }
        let timeouts = Timeouts {
            connect: config.connect_timeout,
            response: config.response_timeout,
        };
        let nodes = config
            .urls
            .iter()
            .map(|u| Node::new(u, timeouts))
            .collect::<Result<Vec<_>>>()?;
        let ns_encoded = encode(&config.namespace);
        let base = base_capabilities("redlock", ExpiryClock::QuorumOfServers);
        let max_ttl = base.max_ttl;
        let caps = base
            .with_durable_tokens(TokenDurability::Volatile(
                "Redlock tokens survive restarts only if the restarted node kept its counters (AOF with appendfsync always) \
                 or stays down longer than the longest TTL"
                    .into(),
            ))
            // A lease must outlive a round plus the drift margin; per-node
            // timeouts are a tenth of the TTL but at least MIN_NODE_TIMEOUT,
            // so below ten of those a single slow node eats the validity.
            .with_ttl_limits(MIN_NODE_TIMEOUT * 10, max_ttl)
            // Redlock has no leader: its failover is the loss of a minority
            // of nodes. Every majority shares a node with the majority that
            // raised the last token, and a token is the highest counter of
            // the winning majority plus one, so tokens keep growing while
            // the lost nodes stay down (or come back with their counters).
            // A held lease keeps its majority; a call to a dead node fails
            // within the connect or response timeout.
            .with_failover(Some(Failover::new(
                FailoverTokens::Increasing(
                    "every majority shares a node with the one that raised the last token".into(),
                ),
                true,
                config.connect_timeout + config.response_timeout,
            )));
        Ok(RedlockProvider {
            inner: Arc::new(Inner {
                allow_eviction: config.allow_eviction,
                cleanups: tokio_util::task::TaskTracker::new(),
                eviction_checked: nodes
                    .iter()
                    .map(|_| std::sync::atomic::AtomicBool::new(false))
                    .collect(),
                response_timeout: config.response_timeout,
                quorum: nodes.len() / 2 + 1,
                nodes,
                channel: release_channel(&ns_encoded),
                ns_encoded,
                namespace: config.namespace,
                hub: Arc::default(),
                caps,
            }),
        })
    }

    /// How many nodes must agree.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// Deletes every lease, fence counter and tombstone of every namespace
    /// whose name starts with `prefix` on every node (see
    /// [`RedisProvider::purge_namespaces`](crate::RedisProvider::purge_namespaces)).
    /// Returns how many Redis keys went, over all nodes.
    ///
    /// # Errors
    /// `Config` for an empty prefix; the first node's error when a node is down
    /// (the others are still purged).
    pub async fn purge_namespaces(&self, prefix: &str) -> Result<u64> {
        lease_api::backend::validate_purge_prefix(prefix)?;
        let pattern = crate::keys::namespace_pattern(prefix);
        let mut deleted = 0;
        let mut first_error = None;
        for node in &self.inner.nodes {
            match node.delete_matching(&pattern).await {
                Ok(n) => deleted += n,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(deleted),
        }
    }

    fn keys(&self, key: &LeaseKey) -> (String, String) {
        redis_keys(&self.inner.ns_encoded, key.as_str())
    }

    /// Runs one script-building closure on every node in parallel.
    async fn round<'a, T, F, Fut>(&'a self, f: F) -> Vec<Result<T>>
    where
        F: Fn(&'a Node) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        join_all(self.inner.nodes.iter().map(f)).await
    }

    /// Runs a yes/no script on every node in parallel, each bounded by
    /// `limit`, and returns as soon as the outcome is decided: a majority said
    /// yes, or a majority said no. A slow node does not hold up a decided
    /// vote; its late answer changes nothing the caller relies on.
    async fn vote<'a, F, Fut>(&'a self, limit: Duration, f: F) -> Vote
    where
        F: Fn(&'a Node) -> Fut,
        Fut: std::future::Future<Output = Result<i64>>,
    {
        let quorum = self.inner.quorum;
        let mut pending: FuturesUnordered<_> = self
            .inner
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let call = f(n);
                async move {
                    let r = bounded("a Redlock node", limit, call, |e| e).await;
                    (i, r)
                }
            })
            .collect();
        let mut vote = Vote {
            yes: 0,
            answered: vec![false; self.inner.nodes.len()],
            said_yes: vec![false; self.inner.nodes.len()],
            errors: Vec::new(),
        };
        // Close early only on a decided outcome: a majority said yes, or a
        // majority said no. Errors and silent nodes leave it open, since a
        // node that errs may still hold the lease.
        let n = self.inner.nodes.len();
        let mut no = 0;
        while vote.yes < quorum && no <= n - quorum {
            match pending.next().await {
                Some((i, Ok(answer))) => {
                    vote.answered[i] = true;
                    if answer == 1 {
                        vote.yes += 1;
                        vote.said_yes[i] = true;
                    } else {
                        no += 1;
                    }
                }
                Some((_, Err(e))) => vote.errors.push(e),
                None => break,
            }
        }
        vote
    }

    /// Refuses nodes that may evict keys (an evicted lease or counter on a
    /// majority breaks exclusion and tokens). Each node is checked once it
    /// answers; a node that is down is checked on a later acquire.
    async fn check_eviction(&self) -> Result<()> {
        use std::sync::atomic::Ordering;
        let allow = self.inner.allow_eviction;
        let unchecked: Vec<usize> = (0..self.inner.nodes.len())
            .filter(|i| !self.inner.eviction_checked[*i].load(Ordering::Relaxed))
            .collect();
        if unchecked.is_empty() {
            return Ok(());
        }
        let checks = join_all(
            unchecked
                .iter()
                .map(|i| check_eviction(&self.inner.nodes[*i], allow)),
        )
        .await;
        for (i, r) in unchecked.into_iter().zip(checks) {
            match r {
                Ok(()) => self.inner.eviction_checked[i].store(true, Ordering::Relaxed),
                Err(e @ LeaseError::Config(_)) => return Err(e),
                Err(_) => {}
            }
        }
        Ok(())
    }

    /// Cancels `owner_hex`'s acquire on node `i` in the background (see
    /// `Node::cancel_until_done`), announcing a deleted lease on `channel`
    /// (empty: no announcement).
    fn cancel_on(
        &self,
        i: usize,
        lease_key: String,
        owner_hex: String,
        ttl: Duration,
        key: &LeaseKey,
        channel: &str,
    ) {
        let inner = Arc::clone(&self.inner);
        let key = key.as_str().to_owned();
        let channel = channel.to_owned();
        self.inner.cleanups.spawn(async move {
            inner.nodes[i]
                .cancel_until_done(&lease_key, &owner_hex, ttl, &channel, &key)
                .await;
        });
    }

    /// How long one node may take to answer an acquire: a small fraction of
    /// the TTL, as the Redlock algorithm prescribes, so a slow or black-holed
    /// node costs a round little of the lease's validity.
    fn node_timeout(&self, ttl: Duration) -> Duration {
        (ttl / 10).clamp(
            MIN_NODE_TIMEOUT,
            self.inner.response_timeout.max(MIN_NODE_TIMEOUT),
        )
    }

    /// One round of Redlock's acquire on every node (plus the raise step when a
    /// majority granted it). The round closes as soon as a majority decided:
    /// a slow or frozen node does not hold it up, and what it does later is
    /// undone in the background.
    async fn acquire_round(&self, key: &LeaseKey, ttl: Duration) -> Result<Round> {
        let (lease_key, fence_key) = self.keys(key);
        let owner = OwnerId::random();
        let owner_hex = owner.to_hex();
        let cancel = cancel_key(&lease_key, &owner_hex);
        let n = self.inner.nodes.len();
        let quorum = self.inner.quorum;
        let limit = self.node_timeout(ttl);
        let holder = lease_api::holder();
        let sent_at = Instant::now();
        let (tx, mut rx) = tokio::sync::mpsc::channel(n);
        for i in 0..n {
            let (inner, tx) = (Arc::clone(&self.inner), tx.clone());
            let keys = [lease_key.clone(), fence_key.clone(), cancel.clone()];
            let args = [
                owner_hex.clone(),
                millis(ttl).to_string(),
                holder.to_string(),
            ];
            tokio::spawn(async move {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let call = inner.nodes[i].eval::<(i64, i64, String)>(&ACQUIRE, &keys, &args);
                let reply = match bounded("a Redlock node's acquire", limit, call, |e| e).await {
                    Ok((1, token, _)) => Reply::Yes(u64::try_from(token).unwrap_or(0)),
                    Ok((_, pttl, holder)) => Reply::No(pttl, holder),
                    Err(e) => Reply::Down(e),
                };
                let _ = tx.send((i, reply)).await;
            });
        }
        drop(tx);
        let mut replies: Vec<Option<Reply>> = (0..n).map(|_| None).collect();
        let (mut yes, mut refused) = (0, 0);
        while yes < quorum && refused <= n - quorum {
            let Some((i, reply)) = rx.recv().await else {
                break;
            };
            match reply {
                Reply::Yes(_) => yes += 1,
                _ => refused += 1,
            }
            replies[i] = Some(reply);
        }
        let won: Vec<(usize, u64)> = replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Some(Reply::Yes(t)) => Some((i, *t)),
                _ => None,
            })
            .collect();
        let lease = Lease::new(key.clone(), FencingToken(0), owner, ttl, sent_at);
        if won.len() >= quorum && Instant::now() < lease.valid_until() {
            let TokenStep { token, raise } = token_step(&won);
            let raised = if raise {
                // Step two: every node of the majority raises its counter to
                // the token while we hold the lease there, so any later
                // majority (which shares a node with this one) issues a larger
                // token.
                let token_arg = token.to_string();
                let keys = [lease_key.as_str(), fence_key.as_str()];
                let raise_args = [owner_hex.as_str(), token_arg.as_str(), &holder];
                join_all(won.iter().map(|(i, _)| {
                    bounded(
                        "a Redlock node's raise",
                        limit,
                        self.inner.nodes[*i].eval::<i64>(&RAISE, &keys, &raise_args),
                        |e| e,
                    )
                }))
                .await
                .into_iter()
                .filter(|r| matches!(r, Ok(1)))
                .count()
            } else {
                won.len()
            };
            let lease = Lease::new(key.clone(), FencingToken(token), owner, ttl, sent_at)
                .with_holder(Arc::clone(&holder));
            if raised >= quorum && Instant::now() < lease.valid_until() {
                return Ok(Round::Won(lease));
            }
        }
        let mut remaining: Option<Duration> = None;
        let mut holders: Vec<String> = Vec::new();
        for r in replies.iter().flatten() {
            match r {
                Reply::Down(_) => {}
                Reply::No(pttl, holder) => {
                    let pttl = *pttl;
                    if pttl >= 0 {
                        let d = Duration::from_millis(pttl.unsigned_abs());
                        remaining = Some(remaining.map_or(d, |r| r.min(d)));
                    }
                    holders.push(holder.split(':').next().unwrap_or_default().to_owned());
                }
                Reply::Yes(_) => {}
            }
        }
        let someone_has_majority = holders
            .iter()
            .any(|h| holders.iter().filter(|o| *o == h).count() >= quorum);
        // Lost the race, or too slow: undo everywhere but where a node said
        // no. Nodes that have not answered may still grant (a frozen node runs
        // its queue when it thaws), so each gets a cancel that also refuses a
        // late acquire; in the background, so the caller does not wait for them.
        // Our copies under another owner's majority free nothing: undo them
        // without an announcement, or our own subscriber would wake us to
        // lose the same round again, over and over, until that lease ends.
        // After a split or a too-slow win the undo may free the key for the
        // other contenders, so it is announced.
        let channel = if someone_has_majority {
            ""
        } else {
            self.inner.channel.as_str()
        };
        let release_args = [owner_hex.as_str(), channel, key.as_str()];
        let release_keys = [lease_key.as_str()];
        let mut undo = Vec::new();
        for (i, r) in replies.iter().enumerate() {
            match r {
                Some(Reply::No(..)) => {}
                // It answered: release there now, and cancel in the background
                // only if that fails.
                Some(Reply::Yes(_)) => undo.push(async move {
                    let released = bounded(
                        "a Redlock node's release",
                        limit,
                        self.inner.nodes[i].eval::<i64>(&RELEASE, &release_keys, &release_args),
                        |e| e,
                    )
                    .await;
                    (i, released.is_ok())
                }),
                _ => self.cancel_on(i, lease_key.clone(), owner_hex.clone(), ttl, key, channel),
            }
        }
        for (i, released) in join_all(undo).await {
            if !released {
                self.cancel_on(i, lease_key.clone(), owner_hex.clone(), ttl, key, channel);
            }
        }
        let down: Vec<LeaseError> = replies
            .into_iter()
            .flatten()
            .filter_map(|r| match r {
                Reply::Down(e) => Some(e),
                _ => None,
            })
            .collect();
        if down.len() > n - quorum {
            return Err(self.unavailable(down));
        }
        if someone_has_majority {
            Ok(Round::Held { remaining })
        } else {
            Ok(Round::Split {
                remaining,
                took: sent_at.elapsed(),
            })
        }
    }

    fn unavailable(&self, errors: Vec<LeaseError>) -> LeaseError {
        let n = self.inner.nodes.len();
        let first = errors.into_iter().next();
        LeaseError::Unavailable {
            message: format!(
                "no majority of the {n} Redlock nodes could be reached (need {})",
                self.inner.quorum
            ),
            source: first.map(|e| Box::new(e) as _),
        }
    }
}

#[async_trait]
impl LeaseProvider for RedlockProvider {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        let ttl = self.inner.caps.grant_ttl(ttl)?;
        self.check_eviction().await?;
        let started = Instant::now();
        let mut attempt = 0u32;
        loop {
            match self.acquire_round(key, ttl).await? {
                Round::Won(lease) => return Ok(TryAcquire::Acquired(lease)),
                // Contenders split the nodes so that nobody has a majority; the
                // key is not held by anyone. Back off by a random amount and
                // try again, so one of them gets ahead, as Redlock prescribes.
                // Spread retries over a few round times (not a fixed few ms),
                // so contenders woken by the same release fall out of step.
                Round::Split { took, .. }
                    if attempt < SPLIT_RETRIES && started.elapsed() < ttl / 2 =>
                {
                    attempt += 1;
                    let spread = took.max(Duration::from_millis(2)) * (2 + attempt.min(6));
                    let jitter = rand::random_range(
                        0..=u64::try_from(spread.as_micros()).unwrap_or(u64::MAX),
                    );
                    tokio::time::sleep(Duration::from_micros(jitter)).await;
                }
                // Still split: nobody holds a majority. Leases on a minority end
                // by their TTL (remaining), a contender's by its release (which
                // wakes waiters); with neither, retry after a few round times.
                Round::Split { remaining, took } => {
                    return Ok(TryAcquire::Held {
                        remaining: Some(remaining.unwrap_or(took * 4)),
                    });
                }
                Round::Held { remaining } => {
                    return Ok(TryAcquire::Held { remaining });
                }
            }
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let ttl = self.inner.caps.grant_ttl(ttl)?;
        let (lease_key, _) = self.keys(lease.key());
        let held = held_by(lease);
        let ttl_ms = millis(ttl).to_string();
        let keys = [lease_key.as_str()];
        let args = [held.as_str(), ttl_ms.as_str()];
        let sent_at = Instant::now();
        let limit = self.node_timeout(ttl);
        let Vote { yes, errors, .. } = self
            .vote(limit, |n| n.eval::<i64>(&EXTEND, &keys, &args))
            .await;
        let renewed = lease.renewed(ttl, sent_at);
        if yes >= self.inner.quorum && Instant::now() < renewed.valid_until() {
            return Ok(renewed);
        }
        if yes + errors.len() >= self.inner.quorum && !errors.is_empty() {
            // A majority may still hold it; we just cannot tell.
            return Err(self.unavailable(errors));
        }
        Err(LeaseError::lost(lease))
    }

    /// One batched script per node, all nodes at once; each lease needs its
    /// own majority, as a single extend does.
    async fn extend_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        let batch = ExtendBatch::new(&self.inner.caps, leases, |k| self.keys(k).0);
        if batch.is_empty() {
            return Ok(batch.answer(leases, |l, _| Err(LeaseError::lost(l))));
        }
        let (keys, args) = batch.refs();
        let limit = self.node_timeout(batch.longest_ttl());
        let sent_at = Instant::now();
        let answers: Vec<Result<Vec<i64>>> = self
            .round(|n| {
                let (keys, args) = (&keys, &args);
                async move {
                    bounded(
                        "a Redlock node",
                        limit,
                        n.eval::<Vec<i64>>(&EXTEND_MANY, keys, args),
                        |e| e,
                    )
                    .await
                }
            })
            .await;
        let mut errors = Vec::new();
        let mut said: Vec<Vec<i64>> = Vec::new();
        for a in answers {
            match a {
                Ok(v) if v.len() == batch.len() => said.push(v),
                Ok(v) => errors.push(LeaseError::protocol(format!(
                    "a Redlock node answered a batched extend of {} leases {} times",
                    batch.len(),
                    v.len()
                ))),
                Err(e) => errors.push(e),
            }
        }
        let quorum = self.inner.quorum;
        if said.len() < quorum {
            // No majority answered: nothing is known about any lease.
            return Err(self.unavailable(errors));
        }
        let silent = errors.len();
        let mut index = 0;
        Ok(batch.answer(leases, |lease, ttl| {
            let yes = said.iter().filter(|v| v.get(index) == Some(&1)).count();
            index += 1;
            let renewed = lease.renewed(ttl, sent_at);
            if yes >= quorum && Instant::now() < renewed.valid_until() {
                Ok(renewed)
            } else if yes + silent >= quorum && silent > 0 {
                Err(LeaseError::Unavailable {
                    message: format!(
                        "{silent} of the {} Redlock nodes did not answer; a majority may still hold the lease",
                        self.inner.nodes.len()
                    ),
                    source: None,
                })
            } else {
                Err(LeaseError::lost(lease))
            }
        }))
    }

    fn batch_limit(&self) -> usize {
        EXTEND_BATCH
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let (lease_key, _) = self.keys(lease.key());
        let owner = lease.owner().to_hex();
        let held = held_by(lease);
        let limit = self.node_timeout(lease.ttl());
        let n = self.inner.nodes.len();
        let quorum = self.inner.quorum;
        // Whether a majority released, once decided; a node task that answers
        // later reads it to decide whether its node needs a cancel.
        let (decided_tx, decided) = tokio::sync::watch::channel(None::<bool>);
        let (tx, mut rx) = tokio::sync::mpsc::channel(n);
        for i in 0..n {
            let (inner, tx, mut decided) = (Arc::clone(&self.inner), tx.clone(), decided.clone());
            let (lease_key, owner, held) = (lease_key.clone(), owner.clone(), held.clone());
            let key = lease.key().as_str().to_owned();
            let ttl = lease.ttl();
            // Tracked: `flush` waits for a late node's answer and its cancel.
            self.inner.cleanups.spawn(async move {
                let args = [held.as_str(), inner.channel.as_str(), key.as_str()];
                let keys = [lease_key.as_str()];
                let call = inner.nodes[i].eval::<i64>(&RELEASE, &keys, &args);
                let answer = bounded("a Redlock node", limit, call, |e| e).await;
                let said_yes = matches!(answer, Ok(1));
                let errored = answer.is_err();
                let _ = tx.send((i, answer)).await;
                drop(tx);
                if said_yes {
                    return;
                }
                // A node that did not answer may hold our lease later (an
                // acquire queued in a frozen node). Once a majority released
                // owner and token, the lease was ours: a node that said no may
                // still hold a copy with its own token (its acquire answered
                // after the round closed, so the raise never reached it). Both
                // are cancelled by owner instead of blocking the key to its
                // TTL. A node that answered yes needs nothing more: no second
                // script on the common path.
                let released = match decided.wait_for(Option::is_some).await {
                    Ok(v) => v.unwrap_or(true),
                    // The caller went away before deciding: be safe.
                    Err(_) => true,
                };
                if errored || released {
                    inner.nodes[i]
                        .cancel_until_done(&lease_key, &owner, ttl, &inner.channel, &key)
                        .await;
                }
            });
        }
        drop(tx);
        // Close early only on a decided outcome: a majority said yes, or a
        // majority said no. Errors and silent nodes leave it open, since a
        // node that errs may still hold the lease.
        let (mut yes, mut no) = (0, 0);
        let mut errors = Vec::new();
        while yes < quorum && no <= n - quorum {
            match rx.recv().await {
                Some((_, Ok(1))) => yes += 1,
                Some((_, Ok(_))) => no += 1,
                Some((_, Err(e))) => errors.push(e),
                None => break,
            }
        }
        let _ = decided_tx.send(Some(yes >= quorum));
        if yes >= quorum {
            return Ok(());
        }
        if yes + errors.len() >= quorum && !errors.is_empty() {
            return Err(self.unavailable(errors));
        }
        Err(LeaseError::not_held(lease))
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        let (lease_key, _) = self.keys(key);
        let keys = [lease_key.as_str()];
        let results = self.round(|n| n.eval::<Value>(&INSPECT, &keys, &[])).await;
        let mut held: Vec<(OwnerId, FencingToken, Duration, Option<String>)> = Vec::new();
        let mut errors = Vec::new();
        for r in results {
            match r {
                Ok(Value::Array(items)) => {
                    if let [Value::BulkString(v), Value::Int(pttl)] = items.as_slice()
                        && let Some((owner, token, holder)) =
                            std::str::from_utf8(v).ok().and_then(parse_value)
                    {
                        held.push((
                            owner,
                            token,
                            Duration::from_millis(u64::try_from(*pttl).unwrap_or(0)),
                            holder,
                        ));
                    }
                }
                Ok(_) => {}
                Err(e) => errors.push(e),
            }
        }
        if errors.len() > self.inner.nodes.len() - self.inner.quorum {
            return Err(self.unavailable(errors));
        }
        for (owner, _, _, _) in &held {
            let mut same: Vec<_> = held.iter().filter(|(o, _, _, _)| o == owner).collect();
            if same.len() >= self.inner.quorum {
                // The lease ends when fewer than a majority still hold it.
                same.sort_by_key(|s| std::cmp::Reverse(s.2));
                let remaining = same[self.inner.quorum - 1].2;
                // The lease's token is what its majority stores (equal
                // counters, or raised to the highest in a second step). A
                // node that answered the acquire after the round closed may
                // hold the same owner under its own, higher counter: it is
                // not the holder's token.
                let agreed = same.iter().map(|(_, t, _, _)| *t).find(|t| {
                    same.iter().filter(|(_, u, _, _)| u == t).count() >= self.inner.quorum
                });
                let token = agreed
                    .or_else(|| same.iter().map(|(_, t, _, _)| *t).max())
                    .unwrap_or(FencingToken(0));
                let holder = same.iter().find_map(|(_, _, _, h)| h.clone());
                return Ok(Some(LeaseInfo::new(token, remaining, Some(*owner), holder)));
            }
        }
        Ok(None)
    }

    async fn flush(&self, limit: Duration) {
        let tracker = &self.inner.cleanups;
        tracker.close();
        let _ = tokio::time::timeout(limit, tracker.wait()).await;
        tracker.reopen();
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        // Registered before the subscribers are checked (see RedisProvider::watch).
        let watch = self.inner.hub.watch(key.as_str());
        let subscribed = join_all(
            self.inner
                .nodes
                .iter()
                .map(|n| n.subscribe(&self.inner.channel, &self.inner.hub)),
        )
        .await;
        let (ok, errors): (Vec<_>, Vec<_>) = subscribed.into_iter().partition(Result::is_ok);
        if ok.is_empty() {
            return Err(self.unavailable(errors.into_iter().filter_map(Result::err).collect()));
        }
        Ok(Box::new(watch))
    }
}

#[cfg(test)]
mod tests {
    use super::{TokenStep, token_step};
    use std::collections::HashSet;

    /// What one acquire round can do to the nodes' fence counters, mirroring
    /// the scripts: ACQUIRE increments the counter of every node it runs on
    /// (those that granted in time, late ones and ones later undone alike);
    /// RAISE sets a counter to at least the token. The round issues its token
    /// only when `token_step` says no raise is needed and a majority granted,
    /// or when the raise succeeded on a majority.
    fn subsets(of: &[usize]) -> Vec<Vec<usize>> {
        (0..1u32 << of.len())
            .map(|m| {
                of.iter()
                    .enumerate()
                    .filter(|(b, _)| m & (1 << b) != 0)
                    .map(|(_, i)| *i)
                    .collect()
            })
            .collect()
    }

    /// Every sequence of up to `depth` rounds on `n` nodes: which nodes grant
    /// (any subset, a majority or not), which other nodes run the acquire late,
    /// on which granting nodes the raise succeeds, and whether the round ends in
    /// time. Checks that every issued token is larger than every token issued
    /// before it. States are kept relative to the last issued token, so equal
    /// situations are explored once. Returns how many states were explored.
    fn explore(n: usize, depth: usize, step: fn(&[(usize, u64)]) -> TokenStep) -> usize {
        let quorum = n / 2 + 1;
        let all: Vec<usize> = (0..n).collect();
        // Counters, and the last issued token (0: none yet).
        let mut frontier: Vec<(Vec<u64>, u64)> = vec![(vec![0; n], 0)];
        let mut seen: HashSet<Vec<i64>> = HashSet::new();
        let norm = |c: &[u64], last: u64| -> Vec<i64> {
            c.iter().map(|&x| x as i64 - last as i64).collect()
        };
        for _ in 0..depth {
            let mut next = Vec::new();
            for (counters, last) in &frontier {
                for granted in subsets(&all) {
                    let rest: Vec<usize> = all
                        .iter()
                        .copied()
                        .filter(|i| !granted.contains(i))
                        .collect();
                    for late in subsets(&rest) {
                        let mut c = counters.clone();
                        let won: Vec<(usize, u64)> = granted
                            .iter()
                            .map(|&i| {
                                c[i] += 1;
                                (i, c[i])
                            })
                            .collect();
                        for &i in &late {
                            c[i] += 1;
                        }
                        let TokenStep { token, raise } = step(&won);
                        let raise_sets = if raise {
                            subsets(&granted)
                        } else {
                            vec![Vec::new()]
                        };
                        for raised in raise_sets {
                            let mut c = c.clone();
                            for &i in &raised {
                                c[i] = c[i].max(token);
                            }
                            let granted_enough = if raise {
                                raised.len() >= quorum
                            } else {
                                granted.len() >= quorum
                            };
                            for in_time in [true, false] {
                                let mut last = *last;
                                if granted_enough && in_time {
                                    assert!(
                                        token > last,
                                        "token {token} issued after {last}: counters {counters:?}, \
                                         granted {granted:?}, late {late:?}, raised {raised:?}"
                                    );
                                    last = token;
                                }
                                if seen.insert(norm(&c, last)) {
                                    next.push((c.clone(), last));
                                }
                            }
                        }
                    }
                }
            }
            frontier = next;
        }
        seen.len()
    }

    #[test]
    fn tokens_are_monotonic_over_every_majority_sequence_on_3_nodes() {
        let states = explore(3, 8, token_step);
        assert!(states > 100, "explored only {states} states");
    }

    #[test]
    fn tokens_are_monotonic_over_every_majority_sequence_on_5_nodes() {
        let states = explore(5, 4, token_step);
        assert!(states > 100, "explored only {states} states");
    }

    /// The check has teeth: without the raise round, some sequence issues a
    /// token that is not larger than an earlier one.
    #[test]
    fn skipping_every_raise_breaks_monotonicity() {
        let never_raise = |won: &[(usize, u64)]| TokenStep {
            token: won.iter().map(|(_, t)| *t).max().unwrap_or(0),
            raise: false,
        };
        let broke = std::panic::catch_unwind(|| explore(3, 4, never_raise));
        assert!(broke.is_err(), "no sequence broke monotonicity");
    }

    #[test]
    fn agreeing_counters_skip_the_raise_and_disagreeing_ones_do_not() {
        assert_eq!(
            token_step(&[(0, 7), (2, 7)]),
            TokenStep {
                token: 7,
                raise: false
            }
        );
        assert_eq!(
            token_step(&[(0, 7), (1, 5), (2, 7)]),
            TokenStep {
                token: 7,
                raise: true
            }
        );
    }
}

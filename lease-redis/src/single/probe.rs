//! What a Redis server promises: its eviction policy, whether fence
//! counters survive a restart, what a failover keeps, and the probe that asks.

use std::time::Duration;

use lease_api::backend::DEFAULT_MAX_TTL;
use lease_api::{
    Capabilities, ExpiryClock, Failover, FailoverTokens, LeaseError, Notifications, Result,
    TokenDurability,
};
use redis::Value;

use super::RedisProvider;
use crate::node::Node;

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
pub(super) const CLUSTER_DEFAULT_NODE_TIMEOUT: Duration = Duration::from_secs(15);

/// The base capabilities of a replicated Redis (under Sentinel, or a
/// Cluster), with the failover declaration of [`replica_failover`] for
/// replicas not yet counted.
pub(super) fn replicated_capabilities(
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

impl RedisProvider {
    /// Asks the server whether tokens survive restarts and returns the
    /// capabilities with that answer (also what [`capabilities`](lease_api::LeaseProvider::capabilities)
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
    pub(super) async fn ready(&self) {
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

    pub(super) fn start_probe(&self) {
        if self.inner.caps.begin() {
            let this = self.clone();
            tokio::spawn(async move {
                if this.probe().await.is_err() {
                    this.inner.caps.failed();
                }
            });
        }
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
}

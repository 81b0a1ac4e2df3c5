//! `RedlockProvider`: leases held by a majority of independent Redis nodes.
//! The provider, its nodes and the rounds every operation runs on them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lease_api::backend::validate_namespace;
use lease_api::{
    Capabilities, ExpiryClock, Failover, FailoverTokens, LeaseError, LeaseKey, Result,
    TokenDurability,
};

use crate::keys::{encode, redis_keys, release_channel};
use crate::node::{Node, Timeouts};
use crate::single::{base_capabilities, check_eviction};

mod acquire;
mod config;
mod ops;

pub use acquire::{TokenStep, quorum, token_step};
pub use config::RedlockConfig;

/// The node calls of one round, run in the caller's task rather than one
/// spawned task each (a spawn per node and operation was most of Redlock's
/// client CPU at 256 tasks). Each call is first polled in the caller, in
/// node order, so its command is on that node's connection before the
/// caller sends the node anything else: a call left to a task that has not
/// run yet could be overtaken by the caller's next command (a release
/// overtaking the acquire it releases, leaving a copy behind to cancel and a
/// counter to raise). Not always: the first poll stops before sending while
/// the node is connecting or its script is not cached, or when the client's
/// request queue is full; the cancel of a node that said no still cleans up
/// then.
///
/// What is still running when the caller stops listening (the round
/// decided, or the caller's future was dropped) goes on in one background
/// task, tracked by the provider's cleanups, so a slow node's call still
/// runs to its end and `flush` waits for it.
struct NodeCalls {
    calls: FuturesUnordered<Pin<Box<dyn Future<Output = ()> + Send>>>,
    tracker: tokio_util::task::TaskTracker,
    /// The runtime the round started on: the rest is spawned there even
    /// when the round's future is dropped outside any runtime.
    runtime: Option<tokio::runtime::Handle>,
}

impl NodeCalls {
    fn new(inner: &Inner) -> Self {
        NodeCalls {
            calls: FuturesUnordered::new(),
            tracker: inner.cleanups.clone(),
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }

    fn push(&mut self, call: impl Future<Output = ()> + Send + 'static) {
        self.calls.push(Box::pin(call));
    }

    /// The next answer on `rx`, driving the calls meanwhile. Cancel-safe.
    async fn recv<T>(&mut self, rx: &mut tokio::sync::mpsc::Receiver<T>) -> Option<T> {
        loop {
            tokio::select! {
                biased;
                answer = rx.recv() => return answer,
                Some(()) = self.calls.next(), if !self.calls.is_empty() => {}
            }
        }
    }

    /// Hands what is still running, and `then`, to one background task
    /// (none when both are already done).
    fn finish_with(mut self, then: impl Future<Output = ()> + Send + 'static) {
        let mut calls = std::mem::take(&mut self.calls);
        let rest = async move {
            let drain = async { while calls.next().await.is_some() {} };
            futures_util::future::join(drain, then).await;
        };
        let mut rest = Box::pin(rest);
        let mut cx = Context::from_waker(Waker::noop());
        if rest.as_mut().poll(&mut cx).is_pending() {
            self.spawn(rest);
        }
    }
}

impl Drop for NodeCalls {
    fn drop(&mut self) {
        if self.calls.is_empty() {
            return;
        }
        let mut calls = std::mem::take(&mut self.calls);
        // A last look: calls whose answers already arrived need no task
        // (not while unwinding: a call that panicked now would abort).
        if !std::thread::panicking() {
            let mut cx = Context::from_waker(Waker::noop());
            while let Poll::Ready(Some(())) = calls.poll_next_unpin(&mut cx) {}
        }
        if !calls.is_empty() {
            self.spawn(async move { while calls.next().await.is_some() {} });
        }
    }
}

impl NodeCalls {
    /// Spawns `task` on the round's runtime, tracked. A round made outside
    /// any runtime has nowhere to run it: its calls could not have run
    /// either.
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        if let Some(handle) = &self.runtime {
            self.tracker.spawn_on(task, handle);
        }
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

/// The outcome of a [`RedlockProvider::vote`].
struct Vote {
    yes: usize,
    /// Which nodes answered (yes or no) before the vote closed.
    answered: Vec<bool>,
    /// Which nodes said yes.
    said_yes: Vec<bool>,
    errors: Vec<LeaseError>,
}

/// The shortest per-node timeout: below this, scheduling noise alone drops
/// nodes from rounds. At 50 ms (a 500 ms TTL) every node of a loopback
/// Redlock missed it at once on a loaded 2-core machine (a first round also
/// loads the script: three round trips), and a free key was "unavailable".
const MIN_NODE_TIMEOUT: Duration = Duration::from_millis(100);

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
                quorum: quorum(nodes.len()),
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

    /// Runs a yes/no script on every node in parallel (`f` bounds each
    /// call by the node timeout), and returns as soon as the outcome is decided: a majority said
    /// yes, or a majority said no. A slow node does not hold up a decided
    /// vote, but its call still runs to its end in the background: a renewal
    /// must reach every node it can, or the lease would live on only the
    /// fastest majority, and losing a minority of nodes could then take it.
    /// (A dropped call may never have been sent, or may stop after the
    /// server's `NOSCRIPT` before it sends the script itself.)
    async fn vote<F, Fut>(&self, f: F) -> Vote
    where
        F: Fn(Arc<Inner>, usize) -> Fut,
        Fut: std::future::Future<Output = Result<i64>> + Send + 'static,
    {
        let quorum = self.inner.quorum;
        let n = self.inner.nodes.len();
        let (tx, mut rx) = tokio::sync::mpsc::channel(n);
        let mut calls = NodeCalls::new(&self.inner);
        for i in 0..n {
            let call = f(Arc::clone(&self.inner), i);
            let tx = tx.clone();
            calls.push(async move {
                let r = call.await;
                let _ = tx.send((i, r)).await;
            });
        }
        drop(tx);
        let mut vote = Vote {
            yes: 0,
            answered: vec![false; self.inner.nodes.len()],
            said_yes: vec![false; self.inner.nodes.len()],
            errors: Vec::new(),
        };
        // Close early only on a decided outcome: a majority said yes, or a
        // majority said no. Errors and silent nodes leave it open, since a
        // node that errs may still hold the lease.
        let mut no = 0;
        while vote.yes < quorum && no <= n - quorum {
            match calls.recv(&mut rx).await {
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

    fn unavailable(&self, errors: Vec<LeaseError>) -> LeaseError {
        let n = self.inner.nodes.len();
        // Every node's error, so that an operator sees which failed how.
        let said: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let first = errors.into_iter().next();
        LeaseError::Unavailable {
            message: format!(
                "no majority of the {n} Redlock nodes could be reached (need {}; {} failed: {})",
                self.inner.quorum,
                said.len(),
                said.join("; ")
            ),
            source: first.map(|e| Box::new(e) as _),
        }
    }
}

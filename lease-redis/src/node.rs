//! One Redis server: a shared multiplexed connection with auto-reconnect, a
//! pub/sub subscriber for release announcements, and error mapping.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lease_api::backend::WatchHub;
use lease_api::{LeaseError, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, FromRedisValue, RedisError, Script, ServerErrorKind};

use crate::address::{describe, open_client};
use crate::sentinel::{ClusterTarget, SentinelTarget};
pub(crate) use crate::time::Timeouts;

struct Subscription {
    /// Stopped when the subscription is dropped (replaced, or the provider gone).
    task: tokio_util::task::AbortOnDropHandle<()>,
    /// Cleared by the task when its connection broke, before it wakes the
    /// waiters: a waiter that wakes and re-subscribes must see it gone, while
    /// the task itself has not finished yet.
    alive: Arc<std::sync::atomic::AtomicBool>,
}

/// How long a timed-out acquire is cancelled for in the background: a server
/// frozen longer than this may still run the acquire when it thaws, and that
/// lease then runs out by its TTL.
pub(crate) const CANCEL_RETRY_FOR: Duration = Duration::from_secs(600);

/// How often an idle release subscriber checks its connection with a PING:
/// the longest a waiter can miss releases after the connection silently drops.
pub(crate) const SUBSCRIBER_HEARTBEAT: Duration = Duration::from_secs(1);

/// Where a node's server is: one fixed address, the primary that the
/// Sentinels name now, or a Redis Cluster (the slot's primary, per key).
/// One per node, made once: the size difference between variants is moot.
#[allow(clippy::large_enum_variant)]
enum Target {
    Fixed(redis::Client),
    Cluster {
        target: ClusterTarget,
        client: redis::cluster::ClusterClient,
        /// One client per seed node, for the release subscriber: a plain
        /// PUBLISH reaches every node of a cluster, so any node will do.
        seeds: Vec<redis::Client>,
        /// The seed the next subscriber uses (moves on after each failure).
        next_seed: std::sync::atomic::AtomicUsize,
        /// Held while connecting, so concurrent first calls connect once.
        connecting: tokio::sync::Mutex<()>,
    },
    Sentinel {
        target: SentinelTarget,
        /// Held while the primary is looked up, so concurrent calls after a
        /// failover ask the Sentinels once.
        resolving: tokio::sync::Mutex<()>,
    },
}

/// A connection to one server, or to a cluster (which routes each command
/// by its first key's slot, and a pipeline by its first keyed command).
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The connection in use: its client (for pub/sub) and its connection.
struct Current {
    client: redis::Client,
    conn: Conn,
}

pub(crate) struct Node {
    pub(crate) display: String,
    target: Target,
    config: ConnectionManagerConfig,
    /// Made on first use: the connection manager spawns a task, so it needs
    /// the runtime that the first call runs on.
    /// Dropped after a call times out, so the next call dials again: the
    /// manager reconnects when a connection errors, never when it just goes
    /// silent (a black-holed path), and would time out every call after.
    /// Under Sentinel it is also dropped after any failure to reach the
    /// server, so the next call asks the Sentinels where the primary is.
    current: std::sync::Mutex<Option<Current>>,
    timeouts: Timeouts,
    subscription: tokio::sync::Mutex<Option<Subscription>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("server", &self.display)
            .finish_non_exhaustive()
    }
}

/// True when `e` (or what caused it) is a TLS failure: an untrusted or
/// mismatched certificate is a matter of configuration, not of reachability.
fn is_tls_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    // The redis crate keeps I/O errors behind an `Arc<dyn Error>`, which hides
    // rustls's error type from downcasts: rustls's own wording is read too.
    if lease_api::backend::is_tls_refusal(e) {
        return true;
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        cur = err.source();
    }
    false
}

impl Node {
    pub(crate) fn new(url: &str, timeouts: Timeouts) -> Result<Self> {
        let (display, target) = if ClusterTarget::is_cluster_url(url) {
            let target = ClusterTarget::parse(url)?;
            let display = crate::sentinel::describe(url);
            let seeds = target
                .seed_urls()
                .iter()
                .map(|u| open_client(u, &describe(u)))
                .collect::<Result<Vec<_>>>()?;
            let client = redis::cluster::ClusterClient::builder(
                target.seed_urls().iter().map(String::as_str),
            )
            .connection_timeout(timeouts.connect)
            .response_timeout(timeouts.response)
            .retries(2)
            .min_retry_wait(50)
            .max_retry_wait(500)
            .build()
            .map_err(|e| {
                LeaseError::Config(format!("invalid Redis Cluster URL {display:?}: {e}"))
            })?;
            (
                display,
                Target::Cluster {
                    target,
                    client,
                    seeds,
                    next_seed: std::sync::atomic::AtomicUsize::new(0),
                    connecting: tokio::sync::Mutex::new(()),
                },
            )
        } else if SentinelTarget::is_sentinel_url(url) {
            (
                crate::sentinel::describe(url),
                Target::Sentinel {
                    target: SentinelTarget::parse(url)?,
                    resolving: tokio::sync::Mutex::new(()),
                },
            )
        } else {
            let display = describe(url);
            let client = open_client(url, &display)?;
            (display, Target::Fixed(client))
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        Ok(Node {
            display,
            target,
            config,
            current: std::sync::Mutex::new(None),
            timeouts,
            subscription: tokio::sync::Mutex::new(None),
        })
    }

    /// Its timeouts.
    pub(crate) fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// The Sentinel settings, when the node is a Sentinel-monitored primary.
    pub(crate) fn sentinel(&self) -> Option<&SentinelTarget> {
        match &self.target {
            Target::Sentinel { target, .. } => Some(target),
            _ => None,
        }
    }

    /// True for a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster { .. })
    }

    /// How many replicas must acknowledge each acquire and extend: the
    /// URL's `wait` under Sentinel and on a Cluster, none on one server.
    pub(crate) fn wait_replicas(&self) -> u32 {
        match &self.target {
            Target::Sentinel { target, .. } => target.wait_replicas,
            Target::Cluster { target, .. } => target.wait_replicas,
            Target::Fixed(_) => 0,
        }
    }

    /// Whether a failure to reach the server should drop the connection so
    /// the next call finds the server again (Sentinel, Cluster).
    fn follows_failovers(&self) -> bool {
        !matches!(self.target, Target::Fixed(_))
    }

    fn cached(&self) -> Option<Conn> {
        let slot = self.current.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_ref().map(|c| c.conn.clone())
    }

    /// The connection in use, made (and, under Sentinel, the primary looked
    /// up) when there is none: without the client behind it, whose clone
    /// (its address and credentials) every call would pay for.
    async fn connection(&self) -> Result<Conn> {
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        // Boxed: connecting (a cluster's map, the Sentinels' answer) is a
        // large future that every call's future would otherwise carry.
        Ok(Box::pin(self.connection_and_client()).await?.1)
    }

    fn cached_with_client(&self) -> Option<(redis::Client, Conn)> {
        let slot = self.current.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_ref().map(|c| (c.client.clone(), c.conn.clone()))
    }

    /// The connection in use and the client that made it, both made when
    /// there is none.
    async fn connection_and_client(&self) -> Result<(redis::Client, Conn)> {
        if let Some(c) = self.cached_with_client() {
            return Ok(c);
        }
        let client = match &self.target {
            Target::Fixed(client) => client.clone(),
            Target::Cluster {
                client,
                seeds,
                next_seed,
                connecting,
                ..
            } => {
                let _one = connecting.lock().await;
                if let Some(c) = self.cached_with_client() {
                    return Ok(c);
                }
                let limit = self.timeouts.connect + self.timeouts.response;
                let conn = lease_api::backend::bounded(
                    "connecting to the cluster",
                    limit,
                    client.get_async_connection(),
                    |e| self.map_err(e),
                )
                .await?;
                let seed = next_seed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let pubsub = seeds[seed % seeds.len()].clone();
                let mut slot = self.current.lock().unwrap_or_else(|p| p.into_inner());
                let current = slot.get_or_insert(Current {
                    client: pubsub,
                    conn: Conn::Cluster(conn),
                });
                return Ok((current.client.clone(), current.conn.clone()));
            }
            Target::Sentinel { target, resolving } => {
                let _one = resolving.lock().await;
                if let Some(c) = self.cached_with_client() {
                    return Ok(c);
                }
                let url = target.resolve(self.timeouts).await?;
                tracing::debug!(sentinels = %self.display, primary = %describe(&url), "Sentinel named the primary");
                redis::Client::open(url.as_str()).map_err(|e| {
                    LeaseError::Config(format!(
                        "{}: the primary's address {} is not usable: {e}",
                        self.display,
                        describe(&url)
                    ))
                })?
            }
        };
        // Lazy: it spawns its task on the runtime of the first call.
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), self.config.clone())
            .map_err(|e| {
                LeaseError::Config(format!(
                    "cannot set up the connection to {}: {e}",
                    self.display
                ))
            })?;
        let mut slot = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let current = slot.get_or_insert(Current {
            client,
            conn: Conn::Single(manager),
        });
        Ok((current.client.clone(), current.conn.clone()))
    }

    /// After a timeout (or, under Sentinel, any failure to reach the
    /// server): the next call gets a fresh connection.
    pub(crate) fn forget_connection(&self) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Bounds `call` by connect + response timeouts (plus `extra`); a
    /// timeout (the call's own or the bound) drops the connection so the
    /// next call dials again.
    async fn bounded<T>(
        &self,
        what: &'static str,
        extra: Duration,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        let limit = self.timeouts.connect + self.timeouts.response + extra;
        self.bounded_at(what, limit, call).await
    }

    /// [`Node::bounded`] at `limit`.
    async fn bounded_at<T>(
        &self,
        what: &'static str,
        limit: Duration,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        let result = lease_api::backend::bounded(what, limit, call, |e| self.map_err(e)).await;
        self.forget_if_gone(result)
    }

    /// Drops the connection after a timeout (the bound's or the client's
    /// own), or, under Sentinel or Cluster, after the server could not be
    /// reached: the next call dials again.
    fn forget_if_gone<T>(&self, result: Result<T>) -> Result<T> {
        match &result {
            Err(LeaseError::Timeout { .. }) => self.forget_connection(),
            // A primary that is gone or was demoted (READONLY) is "unavailable":
            // under Sentinel the next call looks for the new one.
            Err(LeaseError::Unavailable { .. }) if self.follows_failovers() => {
                self.forget_connection();
            }
            _ => {}
        }
        result
    }

    pub(crate) fn map_err(&self, e: RedisError) -> LeaseError {
        if e.is_timeout() {
            return LeaseError::Timeout {
                operation: "a Redis call",
                after: self.timeouts.response,
            };
        }
        let noperm = matches!(
            e.kind(),
            ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm)
        ) || e
            .code()
            .is_some_and(|c| matches!(c, "NOAUTH" | "WRONGPASS" | "NOPERM"));
        if noperm {
            return LeaseError::denied(
                format!(
                    "Redis at {} refused our credentials or permissions",
                    self.display
                ),
                e,
            );
        }
        if is_tls_failure(&e) {
            return LeaseError::denied(
                format!(
                    "the TLS handshake with Redis at {} failed (is its certificate signed by a trusted CA, for this host?)",
                    self.display
                ),
                e,
            );
        }
        // "Loading", "try again", "cluster down", "master down", "read only"
        // (a replica after failover) and a slot that moved (a cluster whose
        // map we hold is stale; the next connection reads it again) pass with
        // time; NOPERM, WRONGTYPE, a bad
        // password or a script error do not, and stay `Backend`.
        let busy = matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            )
        );
        if busy
            || e.is_io_error()
            || e.is_connection_refusal()
            || e.is_connection_dropped()
            || e.is_unrecoverable_error()
        {
            LeaseError::unavailable(format!("Redis at {} is unreachable", self.display), e)
        } else {
            LeaseError::backend(
                format!("Redis at {} answered with an error", self.display),
                e,
            )
        }
    }

    /// Runs one script (EVALSHA; on a server that does not have it, SCRIPT
    /// LOAD and EVALSHA again), bounded by connect + response timeouts.
    ///
    /// The command is built once, and the rare load runs in its own boxed
    /// future: a call's future stays small, which matters where it is moved
    /// into a task or a set of calls (redis-rs's `invoke_async` carries both
    /// paths inline and copies its arguments twice).
    pub(crate) async fn eval<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T> {
        let own = self.timeouts.connect + self.timeouts.response;
        self.eval_within("a Redis script", own, script, keys, args)
            .await
    }

    /// [`Node::eval`], bounded by `limit` instead when that is shorter (a
    /// Redlock node's share of the TTL): one timer, not one inside another,
    /// and it covers finding the connection too (a Sentinel or cluster node
    /// still connecting). A call that runs out of its `limit` keeps the
    /// connection (a slow node is not a dead one); one that runs out of
    /// connect + response, or that the client's own response timeout ends,
    /// drops it, as every other call does.
    pub(crate) async fn eval_within<T: FromRedisValue>(
        &self,
        what: &'static str,
        limit: Duration,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T> {
        let own = self.timeouts.connect + self.timeouts.response;
        let data: usize = keys.iter().chain(args).map(|a| a.len() + 16).sum();
        let mut cmd = redis::Cmd::with_capacity(3 + keys.len() + args.len(), data + 64);
        cmd.arg("EVALSHA")
            .arg(script.get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        let run = |mut conn: Conn| {
            let cmd = &cmd;
            async move {
                match cmd.query_async(&mut conn).await {
                    Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                        Box::pin(script.load_async(&mut conn)).await?;
                        cmd.query_async(&mut conn).await
                    }
                    answer => answer,
                }
            }
        };
        if limit >= own {
            let conn = self.connection().await?;
            return self.bounded_at(what, own, run(conn)).await;
        }
        let call = async {
            let conn = self.connection().await?;
            Ok::<_, LeaseError>(run(conn).await)
        };
        let answer = match tokio::time::timeout(limit, call).await {
            Err(_) => return Err(LeaseError::timeout(what, limit)),
            Ok(Err(e)) => return Err(e),
            Ok(Ok(answer)) => answer,
        };
        // A timeout here is the client's own response timeout, not ours:
        // the connection may be dead.
        self.forget_if_gone(answer.map_err(|e| self.map_err(e)))
    }

    /// Runs one script and then `WAIT replicas`, as one pipeline on one
    /// connection, so WAIT counts the replicas that have the script's writes
    /// (a WAIT sent on a connection made afterwards would count from zero).
    /// Returns the script's answer and how many replicas acknowledged, after
    /// at most half the response timeout.
    pub(crate) async fn eval_replicated<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
        replicas: u32,
    ) -> Result<(T, u32)> {
        let mut invocation = script.prepare_invoke();
        for k in keys {
            invocation.key(*k);
        }
        for a in args {
            invocation.arg(*a);
        }
        // Half the response timeout: the connection's own response timeout
        // covers the whole pipeline, and WAIT must answer before it fires.
        let wait_ms = u64::try_from((self.timeouts.response / 2).as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut conn = self.connection().await?;
        let mut pipe = redis::pipe();
        pipe.invoke_script(&invocation)
            .cmd("WAIT")
            .arg(replicas)
            .arg(wait_ms);
        // A primary that never ran the script (new, or promoted after a
        // failover: the script cache is not replicated) loads it first.
        let call = async move {
            match pipe.query_async::<(T, u32)>(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    script.load_async(&mut conn).await?;
                    pipe.query_async::<(T, u32)>(&mut conn).await
                }
                other => other,
            }
        };
        self.bounded(
            "a replicated Redis script",
            self.timeouts.response * 2,
            call,
        )
        .await
    }

    /// Cancels `owner`'s acquire of `lease_key` whose outcome is unknown: writes
    /// its tombstone (so the acquire refuses if it runs later) and deletes the
    /// lease if it already ran. Retried in the background until the server
    /// answers or [`CANCEL_RETRY_FOR`] passed.
    pub(crate) async fn cancel_until_done(
        &self,
        lease_key: &str,
        owner_hex: &str,
        ttl: Duration,
        channel: &str,
        key: &str,
    ) {
        let tombstone = crate::keys::cancel_key(lease_key, owner_hex);
        // The tombstone only has to outlive the queued acquire it refuses,
        // which runs as soon as the server does.
        let keep = crate::time::millis(ttl.max(Duration::from_secs(60))).to_string();
        let give_up = lease_api::backend::deadline_in(CANCEL_RETRY_FOR);
        let keys = [lease_key, tombstone.as_str()];
        let args = [owner_hex, keep.as_str(), channel, key];
        let tries = lease_api::backend::retry_until(give_up, || {
            self.eval::<i64>(&crate::scripts::CANCEL, &keys, &args)
        });
        match tries.await {
            Ok(1) => {
                tracing::info!(server = %self.display, key, "removed the lease of an acquire that had timed out");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(server = %self.display, key, error = %e, "could not cancel a timed-out acquire; if it ran, its lease runs out by its TTL");
            }
        }
    }

    /// Deletes every key matching the glob `pattern` (SCAN, then UNLINK in
    /// batches). Returns how many were deleted.
    pub(crate) async fn delete_matching(&self, pattern: &str) -> Result<u64> {
        if self.is_cluster() {
            return Err(LeaseError::Config(format!(
                "{}: purging namespaces is not supported on a Redis Cluster (SCAN covers one node); \
                 purge on each primary with a redis:// URL",
                self.display
            )));
        }
        let mut cursor: u64 = 0;
        let mut deleted = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = self
                .query(
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(1000),
                )
                .await?;
            if !keys.is_empty() {
                let n: u64 = self.query(redis::cmd("UNLINK").arg(&keys)).await?;
                deleted += n;
            }
            if next == 0 {
                return Ok(deleted);
            }
            cursor = next;
        }
    }

    /// Runs one command, bounded like [`Node::eval`].
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T> {
        let mut conn = self.connection().await?;
        self.bounded(
            "a Redis command",
            Duration::ZERO,
            cmd.query_async(&mut conn),
        )
        .await
    }

    /// Makes sure this node's release announcements on `channel` reach `hub`.
    /// Returns once the subscription is confirmed by the server.
    pub(crate) async fn subscribe(&self, channel: &str, hub: &Arc<WatchHub>) -> Result<()> {
        let mut slot = self.subscription.lock().await;
        if slot.as_ref().is_some_and(|s| {
            s.alive.load(std::sync::atomic::Ordering::SeqCst) && !s.task.is_finished()
        }) {
            return Ok(());
        }
        let limit = self.timeouts.connect + self.timeouts.response;
        // On a cluster, any node: a plain PUBLISH reaches every node. Each
        // subscription starts at the next seed, and tries them all.
        let clients = match &self.target {
            Target::Cluster {
                seeds, next_seed, ..
            } => {
                let first = next_seed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                (0..seeds.len())
                    .map(|i| seeds[(first + i) % seeds.len()].clone())
                    .collect()
            }
            _ => vec![self.connection_and_client().await?.0],
        };
        let mut last = None;
        let mut subscribed = None;
        for client in clients {
            let setup = async {
                let pubsub = client.get_async_pubsub().await?;
                let (mut sink, stream) = pubsub.split();
                sink.subscribe(channel).await?;
                Ok::<_, RedisError>((sink, stream))
            };
            match lease_api::backend::bounded("subscribing", limit, setup, |e| self.map_err(e))
                .await
            {
                Ok(s) => {
                    subscribed = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let (sink, mut stream) = match (subscribed, last) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(e),
            (None, None) => {
                return Err(LeaseError::Config(format!(
                    "{}: no node to subscribe to",
                    self.display
                )));
            }
        };
        let hub = Arc::clone(hub);
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = Arc::clone(&alive);
        let task = tokio::spawn(async move {
            // The sink must live as long as the subscription. It also carries
            // a PING every HEARTBEAT: the client notices a dropped connection
            // only when it next sends something, and an idle subscriber would
            // otherwise wait out the holder's TTL after a missed release.
            let mut sink = sink;
            let mut beat = tokio::time::interval(SUBSCRIBER_HEARTBEAT);
            beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            beat.tick().await;
            loop {
                tokio::select! {
                    msg = stream.next() => match msg {
                        Some(msg) => {
                            if let Ok(key) = std::str::from_utf8(msg.get_payload_bytes()) {
                                hub.wake(key);
                            }
                        }
                        None => break,
                    },
                    _ = beat.tick() => {
                        let alive = tokio::time::timeout(limit, sink.ping::<redis::Value>()).await;
                        if !matches!(alive, Ok(Ok(_))) {
                            break;
                        }
                    }
                }
            }
            // The connection broke: announcements may be lost. Mark it gone
            // first, so the waiters woken next subscribe again, then wake them.
            flag.store(false, std::sync::atomic::Ordering::SeqCst);
            hub.wake_all();
        });
        *slot = Some(Subscription {
            task: tokio_util::task::AbortOnDropHandle::new(task),
            alive,
        });
        Ok(())
    }
}

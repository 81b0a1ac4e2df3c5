//! What the scaling section runs, each as one operation on a task's own key
//! (take it, release it) over one client that every task shares: our
//! provider, the raw floor (the store commands that give the same guarantees:
//! a fencing counter and a release notification where our provider has them)
//! and the peer crates.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use leases::{LeaseKey, LeaseProvider, Result, Store, TryAcquire};
use redis::Script;
use zookeeper_client as zk;

use crate::common::err;
use crate::raw::{PG_RAW_ACQUIRE, redis_conns, zk_client, zk_dir, zk_path};

/// A task's key: the text the raw and peer clients use, and the lease key.
pub(crate) struct TaskKey {
    pub(crate) text: String,
    pub(crate) lease: LeaseKey,
}

impl TaskKey {
    pub(crate) fn new(text: String) -> Result<TaskKey> {
        Ok(TaskKey {
            lease: LeaseKey::new(text.clone())?,
            text,
        })
    }
}

/// One thing to measure.
#[async_trait]
pub(crate) trait Target: Send + Sync {
    /// `lease`, `bare` (ours without the observability layer), `raw`,
    /// `protocol` (our protocol's store work on the raw client, where it
    /// differs from the raw floor's) or `peer`.
    fn kind(&self) -> &'static str;
    /// What it runs, for the report.
    fn what(&self) -> &'static str;
    /// Takes the key and releases it; `false` when the key was found held.
    async fn cycle(&self, key: &TaskKey) -> Result<bool>;
}

/// Our provider: `try_acquire`, then `release`. `bare`: the adapter alone,
/// without the facade's observability layer.
pub(crate) struct Ours {
    pub(crate) provider: Arc<dyn LeaseProvider>,
    pub(crate) ttl: Duration,
    pub(crate) bare: bool,
}

#[async_trait]
impl Target for Ours {
    fn kind(&self) -> &'static str {
        if self.bare { "bare" } else { "lease" }
    }
    fn what(&self) -> &'static str {
        if self.bare {
            "LeaseProvider::try_acquire + release on the adapter, without the observability layer (spans, hook)"
        } else {
            "LeaseProvider::try_acquire + release"
        }
    }
    async fn cycle(&self, key: &TaskKey) -> Result<bool> {
        match self.provider.try_acquire(&key.lease, self.ttl).await? {
            TryAcquire::Acquired(lease) => {
                self.provider.release(&lease).await?;
                Ok(true)
            }
            TryAcquire::Held { .. } => Ok(false),
        }
    }
}

/// Redis, one node or every Redlock node in parallel: a script that sets the
/// key if absent and counts the fence, and one that deletes it if still ours
/// and publishes the release, each on the node's one multiplexed connection.
struct RedisFloor {
    conns: Vec<redis::aio::ConnectionManager>,
    acquire: Script,
    release: Script,
    what: &'static str,
}

const TTL_MS: u64 = 30_000;

impl RedisFloor {
    async fn on_every_node(&self, script: &Script, key: &str) -> Result<bool> {
        let fence = format!("{{{key}}}:fence");
        let calls = self.conns.iter().map(|c| {
            let mut c = c.clone();
            let mut call = script.key(key);
            call.key(&fence).arg("owner").arg(TTL_MS);
            async move { call.invoke_async::<i64>(&mut c).await }
        });
        let mut all = true;
        for r in futures_util::future::join_all(calls).await {
            all &= r.map_err(err)? > 0;
        }
        Ok(all)
    }
}

#[async_trait]
impl Target for RedisFloor {
    fn kind(&self) -> &'static str {
        "raw"
    }
    fn what(&self) -> &'static str {
        self.what
    }
    async fn cycle(&self, key: &TaskKey) -> Result<bool> {
        if !self.on_every_node(&self.acquire, &key.text).await? {
            return Ok(false);
        }
        self.on_every_node(&self.release, &key.text).await?;
        Ok(true)
    }
}

/// Redis, one node or every Redlock node in parallel: our provider's own
/// acquire and release scripts (the cancel tombstone, the token in the
/// value, the owner-and-token compare, the release announcement) on the
/// floor's connections, waiting for every node with no timer. Against the
/// raw floor it measures what our protocol costs the server; against ours,
/// what our client adds (for Redlock: closing each round at a majority and
/// bounding every node's call).
struct RedisProtocol {
    conns: Vec<redis::aio::ConnectionManager>,
    what: &'static str,
}

#[async_trait]
impl Target for RedisProtocol {
    fn kind(&self) -> &'static str {
        "protocol"
    }
    fn what(&self) -> &'static str {
        self.what
    }
    async fn cycle(&self, key: &TaskKey) -> Result<bool> {
        let owner = uuid::Uuid::new_v4().simple().to_string();
        let (lease, fence) = (format!("{{{}}}", key.text), format!("{{{}}}:f", key.text));
        let cancel = format!("{lease}:c:{owner}");
        let acquire = self.conns.iter().map(|c| {
            let mut c = c.clone();
            let mut call = lease_redis::protocol::acquire().key(&lease);
            call.key(&fence)
                .key(&cancel)
                .arg(&owner)
                .arg(TTL_MS)
                .arg("bench@host:1");
            async move { call.invoke_async::<(i64, i64, String)>(&mut c).await }
        });
        let mut tokens = Vec::with_capacity(self.conns.len());
        for r in futures_util::future::join_all(acquire).await {
            let (won, token, _) = r.map_err(err)?;
            tokens.push((won == 1).then_some(token));
        }
        // Whatever was won is given back, all of it or not.
        let all = tokens.iter().all(Option::is_some);
        let won = self.conns.iter().zip(tokens);
        let release = won
            .filter_map(|(c, t)| t.map(|t| (c, t)))
            .map(|(c, token)| {
                let mut c = c.clone();
                let mut call = lease_redis::protocol::release().key(&lease);
                call.arg(format!("{owner}:{token}"))
                    .arg("lease-bench:released")
                    .arg(&key.text);
                async move { call.invoke_async::<i64>(&mut c).await }
            });
        for r in futures_util::future::join_all(release).await {
            r.map_err(err)?;
        }
        Ok(all)
    }
}

async fn redis_floor(urls: &[String], what: &'static str) -> Result<RedisFloor> {
    Ok(RedisFloor {
        conns: redis_conns(urls).await?,
        acquire: Script::new(
            "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
               return redis.call('INCR', KEYS[2]) end return 0",
        ),
        release: Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) \
               redis.call('PUBLISH', KEYS[1], '0') return 1 end return 0",
        ),
        what,
    })
}

/// PostgreSQL: the upsert that takes an expired or absent row, then a delete
/// that notifies, on a pool of as many connections as our provider's default
/// (sqlx's ping on every hand-out switched off: a floor pays no extra trip).
struct PgFloor {
    pool: sqlx::PgPool,
}

#[async_trait]
impl Target for PgFloor {
    fn kind(&self) -> &'static str {
        "raw"
    }
    fn what(&self) -> &'static str {
        "upsert + delete with pg_notify, sqlx pool of 10"
    }
    async fn cycle(&self, key: &TaskKey) -> Result<bool> {
        let won = sqlx::query(PG_RAW_ACQUIRE)
            .bind(&key.text)
            .bind(i64::try_from(TTL_MS).unwrap_or(i64::MAX))
            .bind("o")
            .fetch_optional(&self.pool)
            .await
            .map_err(err)?;
        if won.is_none() {
            return Ok(false);
        }
        sqlx::query(
            "WITH d AS (DELETE FROM lease_bench_raw WHERE k = $1 AND owner = 'o' RETURNING 1)
             SELECT pg_notify('lease_bench_raw', $1) FROM d",
        )
        .bind(&key.text)
        .fetch_optional(&self.pool)
        .await
        .map_err(err)?;
        Ok(true)
    }
}

/// etcd: grant a lease, put the key with it if absent (one txn); a guarded
/// delete, then revoke in the background, as our provider does.
struct EtcdFloor {
    client: etcd_client::Client,
}

#[async_trait]
impl Target for EtcdFloor {
    fn kind(&self) -> &'static str {
        "raw"
    }
    fn what(&self) -> &'static str {
        "lease grant + create-if-absent txn, guarded delete txn + revoke, one etcd-client"
    }
    async fn cycle(&self, key: &TaskKey) -> Result<bool> {
        let mut c = self.client.clone();
        let id = c.lease_grant(30, None).await.map_err(err)?.id();
        let k = key.text.as_str();
        let take = Txn::new()
            .when(vec![Compare::create_revision(k, CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(
                k,
                "o",
                Some(PutOptions::new().with_lease(id)),
            )]);
        let won = c.txn(take).await.map_err(err)?.succeeded();
        if won {
            let drop_it = Txn::new()
                .when(vec![Compare::lease(k, CompareOp::Equal, id)])
                .and_then(vec![TxnOp::delete(k, None)]);
            c.txn(drop_it).await.map_err(err)?;
        }
        tokio::spawn(async move { c.lease_revoke(id).await });
        Ok(won)
    }
}

/// ZooKeeper: create an ephemeral node, delete it, on one session.
struct ZkFloor {
    client: zk::Client,
}

const ZK_DIR: &str = "/lease-bench-raw";

#[async_trait]
impl Target for ZkFloor {
    fn kind(&self) -> &'static str {
        "raw"
    }
    fn what(&self) -> &'static str {
        "create ephemeral + delete, one zookeeper-client session"
    }
    async fn cycle(&self, key: &TaskKey) -> Result<bool> {
        let path = zk_path(ZK_DIR, &key.text);
        let opts = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
        match self.client.create(&path, b"o", &opts).await {
            Ok(_) => {}
            Err(zk::Error::NodeExists) => return Ok(false),
            Err(e) => return Err(err(e)),
        }
        self.client.delete(&path, None).await.map_err(err)?;
        Ok(true)
    }
}

/// ZooKeeper, the store work of our protocol on the raw client: a multi that
/// creates the holder node and the owner's marker and bumps the key node's
/// version (the epoch, which fences a takeover), then a multi that checks the
/// epoch and deletes both. Against the plain floor it measures what the
/// fencing epoch and the marker cost the server; against ours, what our
/// client code adds.
struct ZkProtocol {
    client: zk::Client,
}

const ZK_PROTOCOL_DIR: &str = "/lease-bench-protocol";

#[async_trait]
impl Target for ZkProtocol {
    fn kind(&self) -> &'static str {
        "protocol"
    }
    fn what(&self) -> &'static str {
        "multi(create holder + marker, bump epoch); multi(check epoch, delete both), one zookeeper-client session"
    }
    async fn cycle(&self, key: &TaskKey) -> Result<bool> {
        let key_node = zk_path(ZK_PROTOCOL_DIR, &key.text);
        let holder = format!("{key_node}/holder");
        let marker = format!("{key_node}/o-00000000000000000000000000000001");
        let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
        let mut epoch = None;
        for _ in 0..2 {
            let mut w = self.client.new_multi_writer();
            w.add_create(
                &holder,
                b"00000000000000000000000000000001:30000:bench",
                &ephemeral,
            )
            .and_then(|()| w.add_create(&marker, b"", &ephemeral))
            .and_then(|()| w.add_set_data(&key_node, b"", None))
            .map_err(err)?;
            match w.commit().await {
                Ok(results) => {
                    epoch = results.into_iter().find_map(|r| match r {
                        zk::MultiWriteResult::SetData { stat } => Some(stat.version),
                        _ => None,
                    });
                    break;
                }
                Err(zk::MultiWriteError::OperationFailed {
                    source: zk::Error::NoNode,
                    ..
                }) => {
                    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                    match self.client.create(&key_node, b"", &persistent).await {
                        Ok(_) | Err(zk::Error::NodeExists) => {}
                        Err(e) => return Err(err(e)),
                    }
                }
                Err(zk::MultiWriteError::OperationFailed {
                    source: zk::Error::NodeExists,
                    ..
                }) => return Ok(false),
                Err(e) => return Err(err(e)),
            }
        }
        let Some(epoch) = epoch else {
            return Err(err(format!("{key_node}: the key node could not be made")));
        };
        let mut w = self.client.new_multi_writer();
        w.add_check_version(&key_node, epoch)
            .and_then(|()| w.add_delete(&marker, Some(0)))
            .and_then(|()| w.add_delete(&holder, None))
            .map_err(err)?;
        w.commit().await.map_err(err)?;
        Ok(true)
    }
}

/// etcd's lock service: grant a lease, Lock, Unlock, revoke in the background.
struct EtcdLockPeer {
    client: etcd_client::Client,
}

#[async_trait]
impl Target for EtcdLockPeer {
    fn kind(&self) -> &'static str {
        "peer"
    }
    fn what(&self) -> &'static str {
        "etcd's lock service (lease grant + Lock / Unlock) through etcd-client"
    }
    async fn cycle(&self, key: &TaskKey) -> Result<bool> {
        let mut c = self.client.clone();
        let id = c.lease_grant(30, None).await.map_err(err)?.id();
        let held = c
            .lock(
                key.text.as_str(),
                Some(etcd_client::LockOptions::new().with_lease(id)),
            )
            .await
            .map_err(err)?;
        c.unlock(held.key().to_vec()).await.map_err(err)?;
        tokio::spawn(async move { c.lease_revoke(id).await });
        Ok(true)
    }
}

/// zookeeper-client's lock recipe; its node is deleted in the background when
/// the lock is dropped, and the task's next lock queues behind it.
struct ZkLockPeer {
    client: zk::Client,
}

#[async_trait]
impl Target for ZkLockPeer {
    fn kind(&self) -> &'static str {
        "peer"
    }
    fn what(&self) -> &'static str {
        "zookeeper-client's lock recipe (sequential ephemeral nodes)"
    }
    async fn cycle(&self, key: &TaskKey) -> Result<bool> {
        drop(crate::raw::zk_lock(&self.client, &key.text).await?);
        Ok(true)
    }
}

/// rslock with one try per lock (a try-acquire), on one or more nodes.
#[cfg(feature = "peers")]
struct RsLockPeer {
    manager: rslock::LockManager,
}

#[cfg(feature = "peers")]
#[async_trait]
impl Target for RsLockPeer {
    fn kind(&self) -> &'static str {
        "peer"
    }
    fn what(&self) -> &'static str {
        "rslock 0.10 (LockManager::lock with one try / unlock)"
    }
    async fn cycle(&self, key: &TaskKey) -> Result<bool> {
        match self
            .manager
            .lock(key.text.as_bytes(), Duration::from_millis(TTL_MS))
            .await
        {
            Ok(lock) => {
                self.manager.unlock(&lock).await;
                Ok(true)
            }
            Err(rslock::LockError::Unavailable) => Ok(false),
            Err(e) => Err(err(e)),
        }
    }
}

/// distributed-lock-postgres: a session advisory lock on its pooled connection.
#[cfg(feature = "peers")]
struct DistributedLockPgPeer {
    provider: distributed_lock_postgres::PostgresLockProvider,
}

#[cfg(feature = "peers")]
#[async_trait]
impl Target for DistributedLockPgPeer {
    fn kind(&self) -> &'static str {
        "peer"
    }
    fn what(&self) -> &'static str {
        "distributed-lock-postgres 0.2 (try_acquire / release: session advisory lock)"
    }
    async fn cycle(&self, key: &TaskKey) -> Result<bool> {
        use distributed_lock_core::{DistributedLock, LockHandle, LockProvider};
        match self
            .provider
            .create_lock(&key.text)
            .try_acquire()
            .await
            .map_err(err)?
        {
            Some(handle) => {
                handle.release().await.map_err(err)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// The raw floor and the peers for a store, each with its one shared client.
pub(crate) async fn others(store: &Store) -> Result<Vec<Arc<dyn Target>>> {
    let mut out: Vec<Arc<dyn Target>> = Vec::new();
    match store {
        Store::Redis(url) => {
            let urls = std::slice::from_ref(url);
            out.push(Arc::new(
                redis_floor(
                    urls,
                    "SET NX PX + INCR fence script, compare-and-DEL + PUBLISH script, one multiplexed connection",
                )
                .await?,
            ));
            out.push(Arc::new(RedisProtocol {
                conns: redis_conns(urls).await?,
                what: "our acquire and release scripts, one multiplexed connection",
            }));
            #[cfg(feature = "peers")]
            out.push(rslock_peer(urls));
        }
        Store::Redlock(urls) => {
            out.push(Arc::new(
                redis_floor(
                    urls,
                    "the Redis floor's two scripts on every node in parallel, one multiplexed connection each",
                )
                .await?,
            ));
            out.push(Arc::new(RedisProtocol {
                conns: redis_conns(urls).await?,
                what: "our acquire and release scripts on every node in parallel, waiting for all, no timer",
            }));
            #[cfg(feature = "peers")]
            out.push(rslock_peer(urls));
        }
        Store::Postgres { url, .. } => {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(10)
                .test_before_acquire(false)
                .connect(url)
                .await
                .map_err(err)?;
            sqlx::query("CREATE TABLE IF NOT EXISTS lease_bench_raw (k text PRIMARY KEY, owner text, expires timestamptz)")
                .execute(&pool)
                .await
                .map_err(err)?;
            out.push(Arc::new(PgFloor { pool }));
            #[cfg(feature = "peers")]
            out.push(Arc::new(DistributedLockPgPeer {
                provider: distributed_lock_postgres::PostgresLockProvider::new(url.as_str())
                    .await
                    .map_err(err)?,
            }));
        }
        Store::Etcd { endpoints, .. } => {
            let client = etcd_client::Client::connect(endpoints, None)
                .await
                .map_err(err)?;
            out.push(Arc::new(EtcdFloor {
                client: client.clone(),
            }));
            out.push(Arc::new(EtcdLockPeer { client }));
        }
        Store::Zk { hosts, .. } => {
            let client = zk_client(hosts).await?;
            zk_dir(&client, ZK_DIR).await?;
            zk_dir(&client, ZK_PROTOCOL_DIR).await?;
            out.push(Arc::new(ZkProtocol {
                client: client.clone(),
            }));
            out.push(Arc::new(ZkFloor {
                client: client.clone(),
            }));
            out.push(Arc::new(ZkLockPeer { client }));
        }
        _ => {}
    }
    Ok(out)
}

#[cfg(feature = "peers")]
fn rslock_peer(urls: &[String]) -> Arc<dyn Target> {
    let mut manager = rslock::LockManager::new(urls.to_vec());
    manager.set_retry(1, Duration::from_millis(1));
    Arc::new(RsLockPeer { manager })
}

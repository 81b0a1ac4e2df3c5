//! The raw floor (the same kind of store commands, issued directly with the
//! same client crate) and the peer lock implementations.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use lease::{LeaseError, Result, Store};
use tokio::time::Instant;
use zookeeper_client as zk;

fn err(e: impl std::fmt::Display) -> LeaseError {
    LeaseError::protocol(e.to_string())
}

#[async_trait]
pub trait Raw: Send {
    fn name(&self) -> &'static str;
    async fn acquire(&mut self, key: &str, ttl: Duration) -> Result<()>;
    async fn extend(&mut self, key: &str, ttl: Duration) -> Result<()>;
    async fn release(&mut self, key: &str) -> Result<()>;
}

#[async_trait]
pub trait Peer: Send {
    fn name(&self) -> &'static str;
    async fn lock(&mut self, key: &str) -> Result<()>;
    async fn unlock(&mut self, key: &str) -> Result<()>;
    /// Rounds of: hold, a second client blocks waiting, release at t0, the
    /// waiter holds at t1; returns t1 - t0 per round.
    async fn handoff(&mut self, key: &str, rounds: usize) -> Result<Vec<Duration>>;
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// ---------- Redis ----------

struct RedisRaw {
    conns: Vec<redis::aio::ConnectionManager>,
    name: &'static str,
}

async fn redis_conns(urls: &[String]) -> Result<Vec<redis::aio::ConnectionManager>> {
    let mut conns = Vec::new();
    for u in urls {
        let client = redis::Client::open(u.as_str()).map_err(err)?;
        conns.push(
            redis::aio::ConnectionManager::new(client)
                .await
                .map_err(err)?,
        );
    }
    Ok(conns)
}

impl RedisRaw {
    async fn all(&mut self, cmd: redis::Cmd) -> Result<()> {
        let futures = self.conns.iter_mut().map(|c| {
            let cmd = cmd.clone();
            async move { cmd.query_async::<redis::Value>(c).await }
        });
        for r in futures_util::future::join_all(futures).await {
            r.map_err(err)?;
        }
        Ok(())
    }
}

#[async_trait]
impl Raw for RedisRaw {
    fn name(&self) -> &'static str {
        self.name
    }
    async fn acquire(&mut self, key: &str, ttl: Duration) -> Result<()> {
        let mut c = redis::cmd("SET");
        c.arg(key).arg("owner").arg("NX").arg("PX").arg(ms(ttl));
        self.all(c).await
    }
    async fn extend(&mut self, key: &str, ttl: Duration) -> Result<()> {
        let mut c = redis::cmd("PEXPIRE");
        c.arg(key).arg(ms(ttl));
        self.all(c).await
    }
    async fn release(&mut self, key: &str) -> Result<()> {
        let mut c = redis::cmd("DEL");
        c.arg(key);
        self.all(c).await
    }
}

/// The classic recipe that Redlock-style crates use on each node: SET NX PX to
/// take, a compare-and-delete script to give back, and a retry every 50 ms to
/// wait (they have no notifications).
struct RedisClassic {
    raw: RedisRaw,
    waiter: RedisRaw,
}

const CAD: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

impl RedisClassic {
    async fn try_take(raw: &mut RedisRaw, key: &str, owner: &str) -> Result<bool> {
        let mut ok = 0;
        for c in &mut raw.conns {
            let r: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(owner)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(c)
                .await
                .map_err(err)?;
            ok += usize::from(r.is_some());
        }
        Ok(ok > raw.conns.len() / 2)
    }
    async fn give_back(raw: &mut RedisRaw, key: &str, owner: &str) -> Result<()> {
        let script = redis::Script::new(CAD);
        for c in &mut raw.conns {
            let _: i64 = script
                .key(key)
                .arg(owner)
                .invoke_async(c)
                .await
                .map_err(err)?;
        }
        Ok(())
    }
}

#[async_trait]
impl Peer for RedisClassic {
    fn name(&self) -> &'static str {
        "SET NX + compare-and-delete, retry every 50 ms (the recipe of Redlock-style crates)"
    }
    async fn lock(&mut self, key: &str) -> Result<()> {
        if Self::try_take(&mut self.raw, key, "peer").await? {
            Ok(())
        } else {
            Err(err("held"))
        }
    }
    async fn unlock(&mut self, key: &str) -> Result<()> {
        Self::give_back(&mut self.raw, key, "peer").await
    }
    async fn handoff(&mut self, key: &str, rounds: usize) -> Result<Vec<Duration>> {
        let mut out = Vec::new();
        for _ in 0..rounds {
            if !Self::try_take(&mut self.raw, key, "holder").await? {
                return Err(err("handoff key held"));
            }
            let mut waiter = RedisRaw {
                conns: self.waiter.conns.clone(),
                name: "",
            };
            let k = key.to_owned();
            let task = tokio::spawn(async move {
                loop {
                    if RedisClassic::try_take(&mut waiter, &k, "waiter").await? {
                        let t1 = Instant::now();
                        RedisClassic::give_back(&mut waiter, &k, "waiter").await?;
                        return Ok::<_, LeaseError>(t1);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
            tokio::time::sleep(Duration::from_millis(30)).await;
            let t0 = Instant::now();
            Self::give_back(&mut self.raw, key, "holder").await?;
            let t1 = task.await.map_err(err)??;
            out.push(t1 - t0);
        }
        Ok(out)
    }
}

// ---------- PostgreSQL ----------

struct PgRaw {
    pool: sqlx::PgPool,
}

async fn pg_pool(url: &str) -> Result<sqlx::PgPool> {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(url)
        .await
        .map_err(err)
}

#[async_trait]
impl Raw for PgRaw {
    fn name(&self) -> &'static str {
        "one upsert / update / delete statement each, via sqlx"
    }
    async fn acquire(&mut self, key: &str, ttl: Duration) -> Result<()> {
        sqlx::query(
            "INSERT INTO lease_bench_raw (k, owner, expires) VALUES ($1, 'o', clock_timestamp() + $2::bigint * interval '1 millisecond')
             ON CONFLICT (k) DO UPDATE SET owner = EXCLUDED.owner, expires = EXCLUDED.expires
             WHERE lease_bench_raw.expires <= clock_timestamp() RETURNING 1",
        )
        .bind(key)
        .bind(i64::try_from(ms(ttl)).unwrap_or(i64::MAX))
        .fetch_optional(&self.pool)
        .await
        .map_err(err)?;
        Ok(())
    }
    async fn extend(&mut self, key: &str, ttl: Duration) -> Result<()> {
        sqlx::query("UPDATE lease_bench_raw SET expires = clock_timestamp() + $2::bigint * interval '1 millisecond' WHERE k = $1 AND owner = 'o'")
            .bind(key)
            .bind(i64::try_from(ms(ttl)).unwrap_or(i64::MAX))
            .execute(&self.pool)
            .await
            .map_err(err)?;
        Ok(())
    }
    async fn release(&mut self, key: &str) -> Result<()> {
        sqlx::query("DELETE FROM lease_bench_raw WHERE k = $1 AND owner = 'o'")
            .bind(key)
            .execute(&self.pool)
            .await
            .map_err(err)?;
        Ok(())
    }
}

/// Session-level advisory locks: the technique of the `distributed-lock`
/// family's PostgreSQL crate.
struct PgAdvisory {
    pool: sqlx::PgPool,
    conn: sqlx::pool::PoolConnection<sqlx::Postgres>,
}

#[async_trait]
impl Peer for PgAdvisory {
    fn name(&self) -> &'static str {
        "pg_try_advisory_lock / pg_advisory_unlock on one session (the technique of the distributed-lock crates)"
    }
    async fn lock(&mut self, key: &str) -> Result<()> {
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext($1))")
            .bind(key)
            .fetch_one(&mut *self.conn)
            .await
            .map_err(err)?;
        if got { Ok(()) } else { Err(err("held")) }
    }
    async fn unlock(&mut self, key: &str) -> Result<()> {
        let _: bool = sqlx::query_scalar("SELECT pg_advisory_unlock(hashtext($1))")
            .bind(key)
            .fetch_one(&mut *self.conn)
            .await
            .map_err(err)?;
        Ok(())
    }
    async fn handoff(&mut self, key: &str, rounds: usize) -> Result<Vec<Duration>> {
        let mut out = Vec::new();
        for _ in 0..rounds {
            self.lock(key).await?;
            let mut waiter = self.pool.acquire().await.map_err(err)?;
            let k = key.to_owned();
            let task = tokio::spawn(async move {
                sqlx::query("SELECT pg_advisory_lock(hashtext($1))")
                    .bind(&k)
                    .execute(&mut *waiter)
                    .await
                    .map_err(err)?;
                let t1 = Instant::now();
                let _: bool = sqlx::query_scalar("SELECT pg_advisory_unlock(hashtext($1))")
                    .bind(&k)
                    .fetch_one(&mut *waiter)
                    .await
                    .map_err(err)?;
                Ok::<_, LeaseError>(t1)
            });
            tokio::time::sleep(Duration::from_millis(30)).await;
            let t0 = Instant::now();
            self.unlock(key).await?;
            out.push(task.await.map_err(err)?? - t0);
        }
        Ok(out)
    }
}

// ---------- etcd ----------

struct EtcdRaw {
    client: etcd_client::Client,
    leases: HashMap<String, i64>,
}

#[async_trait]
impl Raw for EtcdRaw {
    fn name(&self) -> &'static str {
        "lease grant + one guarded txn / keep-alive / guarded delete, via etcd-client"
    }
    async fn acquire(&mut self, key: &str, ttl: Duration) -> Result<()> {
        let grant = self
            .client
            .lease_grant(i64::try_from(ttl.as_secs()).unwrap_or(10), None)
            .await
            .map_err(err)?;
        let txn = Txn::new()
            .when(vec![Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(
                key,
                "o",
                Some(PutOptions::new().with_lease(grant.id())),
            )]);
        self.client.txn(txn).await.map_err(err)?;
        self.leases.insert(key.to_owned(), grant.id());
        Ok(())
    }
    async fn extend(&mut self, key: &str, _ttl: Duration) -> Result<()> {
        let id = self.leases.get(key).copied().unwrap_or(0);
        let (mut keeper, mut stream) = self.client.lease_keep_alive(id).await.map_err(err)?;
        keeper.keep_alive().await.map_err(err)?;
        stream.message().await.map_err(err)?;
        Ok(())
    }
    async fn release(&mut self, key: &str) -> Result<()> {
        let txn = Txn::new()
            .when(vec![Compare::value(key, CompareOp::Equal, "o")])
            .and_then(vec![TxnOp::delete(key, None)]);
        self.client.txn(txn).await.map_err(err)?;
        if let Some(id) = self.leases.remove(key) {
            let mut c = self.client.clone();
            tokio::spawn(async move { c.lease_revoke(id).await });
        }
        Ok(())
    }
}

/// etcd's own lock service (v3lock), through etcd-client.
struct EtcdLock {
    client: etcd_client::Client,
    held: HashMap<String, (Vec<u8>, i64)>,
}

#[async_trait]
impl Peer for EtcdLock {
    fn name(&self) -> &'static str {
        "etcd's lock service (Lock/Unlock RPCs) through etcd-client"
    }
    async fn lock(&mut self, key: &str) -> Result<()> {
        let lease = self.client.lease_grant(10, None).await.map_err(err)?.id();
        let r = self
            .client
            .lock(key, Some(etcd_client::LockOptions::new().with_lease(lease)))
            .await
            .map_err(err)?;
        self.held.insert(key.to_owned(), (r.key().to_vec(), lease));
        Ok(())
    }
    async fn unlock(&mut self, key: &str) -> Result<()> {
        if let Some((k, lease)) = self.held.remove(key) {
            self.client.unlock(k).await.map_err(err)?;
            let mut c = self.client.clone();
            tokio::spawn(async move { c.lease_revoke(lease).await });
        }
        Ok(())
    }
    async fn handoff(&mut self, key: &str, rounds: usize) -> Result<Vec<Duration>> {
        let mut out = Vec::new();
        for _ in 0..rounds {
            self.lock(key).await?;
            let mut waiter = EtcdLock {
                client: self.client.clone(),
                held: HashMap::new(),
            };
            let k = key.to_owned();
            let task = tokio::spawn(async move {
                waiter.lock(&k).await?;
                let t1 = Instant::now();
                waiter.unlock(&k).await?;
                Ok::<_, LeaseError>(t1)
            });
            tokio::time::sleep(Duration::from_millis(30)).await;
            let t0 = Instant::now();
            self.unlock(key).await?;
            out.push(task.await.map_err(err)?? - t0);
        }
        Ok(out)
    }
}

// ---------- ZooKeeper ----------

struct ZkRaw {
    client: zk::Client,
}

fn zk_path(dir: &str, key: &str) -> String {
    let enc: String = key
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!("{dir}/{enc}")
}

#[async_trait]
impl Raw for ZkRaw {
    fn name(&self) -> &'static str {
        "create ephemeral / setData / delete, via zookeeper-client"
    }
    async fn acquire(&mut self, key: &str, _ttl: Duration) -> Result<()> {
        let opts = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
        self.client
            .create(&zk_path("/lease-bench-raw", key), b"o", &opts)
            .await
            .map_err(err)?;
        Ok(())
    }
    async fn extend(&mut self, key: &str, _ttl: Duration) -> Result<()> {
        self.client
            .set_data(&zk_path("/lease-bench-raw", key), b"o", None)
            .await
            .map_err(err)?;
        Ok(())
    }
    async fn release(&mut self, key: &str) -> Result<()> {
        self.client
            .delete(&zk_path("/lease-bench-raw", key), None)
            .await
            .map_err(err)?;
        Ok(())
    }
}

/// zookeeper-client's built-in lock recipe (Curator-style sequential nodes).
struct ZkLock {
    client: zk::Client,
    held: HashMap<String, zk::OwnedLockClient>,
}

async fn zk_lock(client: &zk::Client, key: &str) -> Result<zk::OwnedLockClient> {
    let dir = zk_path("/lease-bench-peer", key);
    let prefix = zk::LockPrefix::new_curator(&dir, "lock-").map_err(err)?;
    let parent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let options = zk::LockOptions::new(zk::Acls::anyone_all())
        .with_ancestor_options(parent)
        .map_err(err)?;
    Ok(client
        .lock(prefix, b"", options)
        .await
        .map_err(err)?
        .into_owned())
}

#[async_trait]
impl Peer for ZkLock {
    fn name(&self) -> &'static str {
        "zookeeper-client's lock recipe (sequential ephemeral nodes)"
    }
    async fn lock(&mut self, key: &str) -> Result<()> {
        let l = zk_lock(&self.client, key).await?;
        self.held.insert(key.to_owned(), l);
        Ok(())
    }
    async fn unlock(&mut self, key: &str) -> Result<()> {
        if let Some(l) = self.held.remove(key) {
            let path = l.lock_path().to_owned();
            drop(l);
            // The recipe deletes its node in the background on drop; wait for it
            // so that back-to-back rounds measure whole lock/unlock cycles.
            while self.client.check_stat(&path).await.map_err(err)?.is_some() {
                tokio::task::yield_now().await;
            }
        }
        Ok(())
    }
    async fn handoff(&mut self, key: &str, rounds: usize) -> Result<Vec<Duration>> {
        let mut out = Vec::new();
        for _ in 0..rounds {
            let holder = zk_lock(&self.client, key).await?;
            let client = self.client.clone();
            let k = key.to_owned();
            let task = tokio::spawn(async move {
                let l = zk_lock(&client, &k).await?;
                let t1 = Instant::now();
                drop(l);
                Ok::<_, LeaseError>(t1)
            });
            tokio::time::sleep(Duration::from_millis(30)).await;
            let t0 = Instant::now();
            drop(holder);
            out.push(task.await.map_err(err)?? - t0);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(out)
    }
}

async fn zk_client(hosts: &str) -> Result<zk::Client> {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(hosts)
        .await
        .map_err(err)
}

async fn zk_dir(client: &zk::Client, dir: &str) -> Result<()> {
    match client
        .create(
            dir,
            b"",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
    {
        Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
        Err(e) => Err(err(e)),
    }
}

pub async fn raw_for(name: &str, store: &Store) -> Result<Option<Box<dyn Raw>>> {
    Ok(match store {
        Store::Redis(url) => Some(Box::new(RedisRaw {
            conns: redis_conns(std::slice::from_ref(url)).await?,
            name: "SET NX PX / PEXPIRE / DEL, one command each, via redis",
        })),
        Store::Redlock(urls) => Some(Box::new(RedisRaw {
            conns: redis_conns(urls).await?,
            name: "SET NX PX / PEXPIRE / DEL on every node in parallel, via redis",
        })),
        Store::Postgres { url, .. } => {
            let pool = pg_pool(url).await?;
            sqlx::query("CREATE TABLE IF NOT EXISTS lease_bench_raw (k text PRIMARY KEY, owner text, expires timestamptz)")
                .execute(&pool)
                .await
                .map_err(err)?;
            Some(Box::new(PgRaw { pool }))
        }
        Store::Etcd { endpoints: eps, .. } => Some(Box::new(EtcdRaw {
            client: etcd_client::Client::connect(eps, None).await.map_err(err)?,
            leases: HashMap::new(),
        })),
        Store::Zk { hosts, .. } => {
            let client = zk_client(hosts).await?;
            zk_dir(&client, "/lease-bench-raw").await?;
            Some(Box::new(ZkRaw { client }))
        }
        _ => {
            let _ = name;
            None
        }
    })
}

pub async fn peer_for(name: &str, store: &Store) -> Result<Option<Box<dyn Peer>>> {
    Ok(match store {
        Store::Redis(url) => Some(Box::new(RedisClassic {
            raw: RedisRaw {
                conns: redis_conns(std::slice::from_ref(url)).await?,
                name: "",
            },
            waiter: RedisRaw {
                conns: redis_conns(std::slice::from_ref(url)).await?,
                name: "",
            },
        })),
        Store::Redlock(urls) => Some(Box::new(RedisClassic {
            raw: RedisRaw {
                conns: redis_conns(urls).await?,
                name: "",
            },
            waiter: RedisRaw {
                conns: redis_conns(urls).await?,
                name: "",
            },
        })),
        Store::Postgres { url, .. } => {
            let pool = pg_pool(url).await?;
            let conn = pool.acquire().await.map_err(err)?;
            Some(Box::new(PgAdvisory { pool, conn }))
        }
        Store::Etcd { endpoints: eps, .. } => Some(Box::new(EtcdLock {
            client: etcd_client::Client::connect(eps, None).await.map_err(err)?,
            held: HashMap::new(),
        })),
        Store::Zk { hosts, .. } => Some(Box::new(ZkLock {
            client: zk_client(hosts).await?,
            held: HashMap::new(),
        })),
        _ => {
            let _ = name;
            None
        }
    })
}

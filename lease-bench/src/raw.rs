//! The raw floor (the same kind of store commands, issued directly with the
//! same client crate) and the peer lock implementations.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use leases::{LeaseError, Result, Store};
use tokio::time::Instant;
use zookeeper_client as zk;

pub(crate) use crate::common::{Peer, Raw, err, handoff_rounds, sqlite_dir};

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// ---------- Redis ----------

struct RedisRaw {
    conns: Vec<redis::aio::ConnectionManager>,
    urls: Vec<String>,
    name: &'static str,
}

pub(crate) async fn redis_conns(urls: &[String]) -> Result<Vec<redis::aio::ConnectionManager>> {
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
    /// One node: DEL and PUBLISH in one pipeline; the waiter subscribes, then
    /// tries SET NX, and tries again on each message.
    async fn handoff(&mut self, key: &str, rounds: usize) -> Result<Option<Vec<Duration>>> {
        let [url] = self.urls.as_slice() else {
            return Ok(None);
        };
        let channel = format!("{key}:released");
        let holder = self.conns[0].clone();
        let (url, k, ch) = (url.clone(), key.to_owned(), channel.clone());
        let waiter = move || {
            let (url, k, ch) = (url.clone(), k.clone(), ch.clone());
            async move {
                use futures_util::StreamExt;
                let client = redis::Client::open(url.as_str()).map_err(err)?;
                let mut conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(err)?;
                let mut sub = client.get_async_pubsub().await.map_err(err)?;
                sub.subscribe(&ch).await.map_err(err)?;
                let mut messages = sub.on_message();
                loop {
                    let got: Option<String> = redis::cmd("SET")
                        .arg(&k)
                        .arg("waiter")
                        .arg("NX")
                        .arg("PX")
                        .arg(30_000)
                        .query_async(&mut conn)
                        .await
                        .map_err(err)?;
                    if got.is_some() {
                        let t1 = Instant::now();
                        let _: i64 = redis::cmd("DEL")
                            .arg(&k)
                            .query_async(&mut conn)
                            .await
                            .map_err(err)?;
                        return Ok(t1);
                    }
                    messages
                        .next()
                        .await
                        .ok_or_else(|| err("subscription ended"))?;
                }
            }
        };
        let (mut h1, mut h2) = (holder.clone(), holder);
        let (k1, k2) = (key.to_owned(), key.to_owned());
        let out = handoff_rounds!(
            rounds,
            {
                let _: Option<String> = redis::cmd("SET")
                    .arg(&k1)
                    .arg("holder")
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(&mut h1)
                    .await
                    .map_err(err)?;
            },
            waiter,
            {
                let _: (i64, i64) = redis::pipe()
                    .cmd("DEL")
                    .arg(&k2)
                    .cmd("PUBLISH")
                    .arg(&channel)
                    .arg("1")
                    .query_async(&mut h2)
                    .await
                    .map_err(err)?;
            }
        );
        Ok(Some(out))
    }
}

// ---------- PostgreSQL ----------

/// On a plain connection, not a pool: sqlx's pool pings each connection as
/// it comes back, a second round trip the floor must not pay.
struct PgRaw {
    conn: sqlx::PgConnection,
    url: String,
}

pub(crate) const PG_RAW_ACQUIRE: &str = "INSERT INTO lease_bench_raw (k, owner, expires) VALUES ($1, $3, clock_timestamp() + $2::bigint * interval '1 millisecond')
             ON CONFLICT (k) DO UPDATE SET owner = EXCLUDED.owner, expires = EXCLUDED.expires
             WHERE lease_bench_raw.expires <= clock_timestamp() RETURNING 1";

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
        sqlx::query(PG_RAW_ACQUIRE)
            .bind(key)
            .bind(i64::try_from(ms(ttl)).unwrap_or(i64::MAX))
            .bind("o")
            .fetch_optional(&mut self.conn)
            .await
            .map_err(err)?;
        Ok(())
    }
    async fn extend(&mut self, key: &str, ttl: Duration) -> Result<()> {
        sqlx::query("UPDATE lease_bench_raw SET expires = clock_timestamp() + $2::bigint * interval '1 millisecond' WHERE k = $1 AND owner = 'o'")
            .bind(key)
            .bind(i64::try_from(ms(ttl)).unwrap_or(i64::MAX))
            .execute(&mut self.conn)
            .await
            .map_err(err)?;
        Ok(())
    }
    async fn release(&mut self, key: &str) -> Result<()> {
        sqlx::query("DELETE FROM lease_bench_raw WHERE k = $1 AND owner = 'o'")
            .bind(key)
            .execute(&mut self.conn)
            .await
            .map_err(err)?;
        Ok(())
    }
    /// Release is one statement that deletes and notifies; the waiter
    /// LISTENs, then runs the acquire upsert, and again on each notification.
    async fn handoff(&mut self, key: &str, rounds: usize) -> Result<Option<Vec<Duration>>> {
        use sqlx::Connection;
        let mut holder = sqlx::PgConnection::connect(&self.url).await.map_err(err)?;
        let mut holder2 = sqlx::PgConnection::connect(&self.url).await.map_err(err)?;
        let (url, k) = (self.url.clone(), key.to_owned());
        let waiter = move || {
            let (url, k) = (url.clone(), k.clone());
            async move {
                let mut listener = sqlx::postgres::PgListener::connect(&url)
                    .await
                    .map_err(err)?;
                listener.listen("lease_bench_raw").await.map_err(err)?;
                let mut conn = sqlx::PgConnection::connect(&url).await.map_err(err)?;
                loop {
                    let won = sqlx::query(PG_RAW_ACQUIRE)
                        .bind(&k)
                        .bind(30_000_i64)
                        .bind("waiter")
                        .fetch_optional(&mut conn)
                        .await
                        .map_err(err)?;
                    if won.is_some() {
                        let t1 = Instant::now();
                        sqlx::query("DELETE FROM lease_bench_raw WHERE k = $1")
                            .bind(&k)
                            .execute(&mut conn)
                            .await
                            .map_err(err)?;
                        return Ok(t1);
                    }
                    listener.recv().await.map_err(err)?;
                }
            }
        };
        let (k1, k2) = (key.to_owned(), key.to_owned());
        let out = handoff_rounds!(
            rounds,
            {
                sqlx::query(PG_RAW_ACQUIRE)
                    .bind(&k1)
                    .bind(30_000_i64)
                    .bind("holder")
                    .fetch_optional(&mut holder)
                    .await
                    .map_err(err)?;
            },
            waiter,
            {
                sqlx::query(
                    "WITH d AS (DELETE FROM lease_bench_raw WHERE k = $1 AND owner = 'holder' RETURNING 1)
                     SELECT pg_notify('lease_bench_raw', $1) FROM d",
                )
                .bind(&k2)
                .fetch_optional(&mut holder2)
                .await
                .map_err(err)?;
            }
        );
        Ok(Some(out))
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
    /// Release is a delete; the waiter tries a create-if-absent txn and, when
    /// it fails, watches the key from the revision after its failed try.
    async fn handoff(&mut self, key: &str, rounds: usize) -> Result<Option<Vec<Duration>>> {
        let client = self.client.clone();
        let k = key.to_owned();
        let waiter = move || {
            let (mut c, k) = (client.clone(), k.clone());
            async move {
                loop {
                    let txn = Txn::new()
                        .when(vec![Compare::create_revision(
                            k.as_str(),
                            CompareOp::Equal,
                            0,
                        )])
                        .and_then(vec![TxnOp::put(k.as_str(), "waiter", None)]);
                    let r = c.txn(txn).await.map_err(err)?;
                    if r.succeeded() {
                        let t1 = Instant::now();
                        c.delete(k.as_str(), None).await.map_err(err)?;
                        return Ok(t1);
                    }
                    let rev = r.header().map_or(0, |h| h.revision());
                    let mut stream = c
                        .watch(
                            k.as_str(),
                            Some(etcd_client::WatchOptions::new().with_start_revision(rev + 1)),
                        )
                        .await
                        .map_err(err)?;
                    'events: while let Some(msg) = stream.message().await.map_err(err)? {
                        if msg
                            .events()
                            .iter()
                            .any(|e| e.event_type() == etcd_client::EventType::Delete)
                        {
                            break 'events;
                        }
                    }
                }
            }
        };
        let mut holder = self.client.clone();
        let out = handoff_rounds!(
            rounds,
            {
                holder.put(key, "holder", None).await.map_err(err)?;
            },
            waiter,
            {
                holder.delete(key, None).await.map_err(err)?;
            }
        );
        Ok(Some(out))
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
    hosts: String,
}

pub(crate) fn zk_path(dir: &str, key: &str) -> String {
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
    /// Release is a delete; the waiter tries to create the node and, when it
    /// exists, sets an exists watch (which reports a node already gone).
    async fn handoff(&mut self, key: &str, rounds: usize) -> Result<Option<Vec<Duration>>> {
        let waiting = zk_client(&self.hosts).await?;
        let path = zk_path("/lease-bench-raw", key);
        let p = path.clone();
        let waiter = move || {
            let (c, p) = (waiting.clone(), p.clone());
            async move {
                let opts = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
                loop {
                    match c.create(&p, b"w", &opts).await {
                        Ok(_) => {
                            let t1 = Instant::now();
                            c.delete(&p, None).await.map_err(err)?;
                            return Ok(t1);
                        }
                        Err(zk::Error::NodeExists) => {
                            let (stat, watcher) = c.check_and_watch_stat(&p).await.map_err(err)?;
                            if stat.is_some() {
                                watcher.changed().await;
                            }
                        }
                        Err(e) => return Err(err(e)),
                    }
                }
            }
        };
        let opts = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
        let client = self.client.clone();
        let out = handoff_rounds!(
            rounds,
            {
                client.create(&path, b"h", &opts).await.map_err(err)?;
            },
            waiter,
            {
                client.delete(&path, None).await.map_err(err)?;
            }
        );
        Ok(Some(out))
    }
}

/// zookeeper-client's built-in lock recipe (Curator-style sequential nodes).
struct ZkLock {
    client: zk::Client,
    held: HashMap<String, zk::OwnedLockClient>,
}

pub(crate) async fn zk_lock(client: &zk::Client, key: &str) -> Result<zk::OwnedLockClient> {
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

pub(crate) async fn zk_client(hosts: &str) -> Result<zk::Client> {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(hosts)
        .await
        .map_err(err)
}

pub(crate) async fn zk_dir(client: &zk::Client, dir: &str) -> Result<()> {
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

// ---------- SQLite: flock(2), the one-host floor ----------

/// What `flock(1)` does, without its process start: an exclusive `flock(2)` on
/// a lock file per key. No TTL, no token, no lost signal: the floor a
/// one-host lease is measured against.
struct FlockRaw {
    held: HashMap<String, nix::fcntl::Flock<std::fs::File>>,
}

fn lock_file(key: &str) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(sqlite_dir().join(format!("{}.lock", key.replace('/', "_"))))
        .map_err(err)
}

#[async_trait]
impl Raw for FlockRaw {
    fn name(&self) -> &'static str {
        "flock(2) LOCK_EX|LOCK_NB / LOCK_UN on a lock file (what flock(1) runs), via nix"
    }
    async fn acquire(&mut self, key: &str, _ttl: Duration) -> Result<()> {
        let file = lock_file(key)?;
        let locked = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| err(e))?;
        self.held.insert(key.to_owned(), locked);
        Ok(())
    }
    async fn extend(&mut self, _key: &str, _ttl: Duration) -> Result<()> {
        // flock has no expiry to push.
        Ok(())
    }
    async fn release(&mut self, key: &str) -> Result<()> {
        if let Some(locked) = self.held.remove(key) {
            locked.unlock().map_err(|(_, e)| err(e))?;
        }
        Ok(())
    }
    async fn handoff(&mut self, key: &str, rounds: usize) -> Result<Option<Vec<Duration>>> {
        let k = key.to_owned();
        // The waiter blocks in flock(2) on its own open file, in a thread.
        let waiter = move || {
            let k = k.clone();
            async move {
                tokio::task::spawn_blocking(move || {
                    let file = lock_file(&k)?;
                    let locked = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
                        .map_err(|(_, e)| err(e))?;
                    let t1 = Instant::now();
                    locked.unlock().map_err(|(_, e)| err(e))?;
                    Ok::<_, LeaseError>(t1)
                })
                .await
                .map_err(err)?
            }
        };
        let mut holding: Option<nix::fcntl::Flock<std::fs::File>>;
        let out = handoff_rounds!(
            rounds,
            {
                holding = Some(
                    nix::fcntl::Flock::lock(lock_file(key)?, nix::fcntl::FlockArg::LockExclusive)
                        .map_err(|(_, e)| err(e))?,
                );
            },
            waiter,
            {
                if let Some(locked) = holding.take() {
                    locked.unlock().map_err(|(_, e)| err(e))?;
                }
            }
        );
        let _ = holding;
        Ok(Some(out))
    }
}

pub async fn raw_for(name: &str, store: &Store) -> Result<Option<Box<dyn Raw>>> {
    Ok(match store {
        Store::Redis(url) => Some(Box::new(RedisRaw {
            conns: redis_conns(std::slice::from_ref(url)).await?,
            urls: vec![url.clone()],
            name: "SET NX PX / PEXPIRE / DEL, one command each, via redis",
        })),
        Store::Redlock(urls) => Some(Box::new(RedisRaw {
            conns: redis_conns(urls).await?,
            urls: urls.clone(),
            name: "SET NX PX / PEXPIRE / DEL on every node in parallel, via redis",
        })),
        Store::Postgres { url, .. } => {
            let pool = pg_pool(url).await?;
            sqlx::query("CREATE TABLE IF NOT EXISTS lease_bench_raw (k text PRIMARY KEY, owner text, expires timestamptz)")
                .execute(&pool)
                .await
                .map_err(err)?;
            use sqlx::Connection;
            drop(pool);
            Some(Box::new(PgRaw {
                conn: sqlx::PgConnection::connect(url).await.map_err(err)?,
                url: url.clone(),
            }))
        }
        Store::Mysql { url, .. } => Some(Box::new(crate::raw_mysql::MysqlRaw::connect(url).await?)),
        Store::Etcd { endpoints: eps, .. } => Some(Box::new(EtcdRaw {
            client: etcd_client::Client::connect(eps, None).await.map_err(err)?,
            leases: HashMap::new(),
        })),
        Store::Sqlite(_) => Some(Box::new(FlockRaw {
            held: HashMap::new(),
        })),
        Store::Zk { hosts, .. } => {
            let client = zk_client(hosts).await?;
            zk_dir(&client, "/lease-bench-raw").await?;
            Some(Box::new(ZkRaw {
                client,
                hosts: hosts.clone(),
            }))
        }
        _ => {
            let _ = name;
            None
        }
    })
}

pub async fn peer_for(name: &str, store: &Store) -> Result<Option<Box<dyn Peer>>> {
    Ok(match store {
        #[cfg(feature = "peers")]
        Store::Redis(url) => Some(Box::new(crate::peers::RsLock::new(std::slice::from_ref(
            url,
        )))),
        #[cfg(feature = "peers")]
        Store::Redlock(urls) => Some(Box::new(crate::peers::RsLock::new(urls))),
        #[cfg(feature = "peers")]
        Store::Postgres { url, .. } => {
            Some(Box::new(crate::peers::DistributedLockPg::new(url).await?))
        }
        #[cfg(feature = "peers")]
        Store::Mysql { url, .. } => Some(Box::new(
            crate::peers::DistributedLockMysql::new(url).await?,
        )),
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

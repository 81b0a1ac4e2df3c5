//! The lease operations of `RedisProvider`: acquire, extend, release,
//! inspect and watch, one Lua script each.

use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::{KeyWatch, OwnerId, WaitQueue};
use lease_api::{
    Capabilities, FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseKind, LeaseProvider,
    Result, RwInfo, TryAcquire, TryAcquireAll,
};
use redis::Value;
use tokio::time::Instant;

use super::value::unexpected;
use super::{ExtendBatch, RedisProvider, parse_value};
use crate::keys::cancel_key;
use crate::scripts::{ACQUIRE, EXTEND, EXTEND_BATCH, EXTEND_MANY, INSPECT, RELEASE, held_by};
use crate::time::millis;

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

    /// One script for the whole set; on a Cluster the keys in key order.
    async fn try_acquire_all(&self, keys: &[LeaseKey], ttl: Duration) -> Result<TryAcquireAll> {
        self.acquire_set(keys, ttl).await
    }

    async fn try_acquire_read(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.read(key, ttl).await
    }

    async fn try_acquire_write(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        waiting: Option<OwnerId>,
    ) -> Result<TryAcquire> {
        self.write(key, ttl, waiting).await
    }

    async fn withdraw_writer(&self, key: &LeaseKey, waiting: OwnerId) -> Result<()> {
        self.withdraw(key, waiting).await
    }

    async fn inspect_rw(&self, key: &LeaseKey) -> Result<RwInfo> {
        self.inspect_rw_lease(key).await
    }

    async fn watch_rw(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        self.watch_rw_lease(key).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        if let Some(answer) = self.extend_rw(lease, ttl).await {
            return answer;
        }
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
        // Readers and writers live in their own hashes: each on its own.
        if self.inner.node.is_cluster() || leases.iter().any(|l| l.kind() != LeaseKind::Exclusive) {
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
        if let Some(answer) = self.release_rw(lease).await {
            return answer;
        }
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
        lease_api::backend::drain(&self.inner.cleanups, limit).await;
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

//! Read/write leases on one Redis (C19): one script per operation over the
//! key's hash of writer, readers and waiting writers (see `rw_scripts`).

use std::time::Duration;

use lease_api::backend::{KeyWatch, OwnerId};
use lease_api::{
    FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseKind, LeaseProvider, Result, RwInfo,
    TryAcquire,
};
use tokio::time::Instant;

use super::RedisProvider;
use crate::keys::cancel_key;
use crate::rw_scripts::{CANCEL, EXTEND, INSPECT, READ, RELEASE, WITHDRAW, WRITE};
use crate::time::millis;

/// The Redis names of a key's read/write lease: its hash, the fence counter
/// (shared with the plain lease: tokens grow across both) and the last
/// writer's token. One hash tag, one slot.
struct RwNames {
    hash: String,
    fence: String,
    epoch: String,
    /// The lease key's name, whose tag the owners' tombstones share.
    lease: String,
}

/// The hub name and wake message of a key's read/write lease: NUL cannot
/// occur in a key, so it never meets a plain lease's.
fn wake_name(key: &LeaseKey) -> String {
    format!("\0rw\0{}", key.as_str())
}

/// The hash field of a reader or writer lease.
fn field(lease: &Lease) -> Option<String> {
    match lease.kind() {
        LeaseKind::Write => Some("w".into()),
        LeaseKind::Read { .. } => Some(format!("r:{}", lease.owner().to_hex())),
        LeaseKind::Exclusive => None,
    }
}

impl RedisProvider {
    fn rw_names(&self, key: &LeaseKey) -> RwNames {
        let (lease, fence) = self.keys(key);
        let tag = lease.strip_suffix(":lease").unwrap_or(&lease);
        RwNames {
            hash: format!("{tag}:rw"),
            epoch: format!("{tag}:rwepoch"),
            fence,
            lease: lease.clone(),
        }
    }

    /// Runs a script that may write, with WAIT where the provider requires
    /// replicas; too few acknowledgements is an error.
    async fn rw_eval<T: redis::FromRedisValue + Send>(
        &self,
        script: &redis::Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<(T, u32)> {
        let wait = self.inner.wait_replicas;
        if wait == 0 {
            Ok((self.inner.node.eval::<T>(script, keys, args).await?, 0))
        } else {
            self.inner
                .node
                .eval_replicated::<T>(script, keys, args, wait)
                .await
        }
    }

    pub(super) async fn read(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.ready().await;
        let ttl = self.capabilities().grant_ttl(ttl)?;
        self.check_eviction().await?;
        self.start_probe();
        let n = self.rw_names(key);
        let owner = OwnerId::random();
        let holder = lease_api::holder();
        let (ttl_ms, hex) = (millis(ttl).to_string(), owner.to_hex());
        let sent_at = Instant::now();
        let tomb = cancel_key(&n.lease, &hex);
        let answer = self
            .rw_eval(
                &READ,
                &[&n.hash, &n.fence, &n.epoch, &tomb],
                &[&hex, &ttl_ms, &holder],
            )
            .await;
        let ((won, n1, epoch), acked): ((i64, i64, i64), u32) =
            self.or_cancel(answer, key, (&n, owner, ttl))?;
        if won != 1 {
            return Ok(TryAcquire::Held {
                remaining: u64::try_from(n1).ok().map(Duration::from_millis),
            });
        }
        let lease = Lease::new(key.clone(), token(n1)?, owner, ttl, sent_at)
            .with_holder(holder)
            .with_kind(LeaseKind::Read {
                writer_epoch: token(epoch)?,
            });
        self.replicated_or_given_back(lease, acked).await
    }

    pub(super) async fn write(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        waiting: Option<OwnerId>,
    ) -> Result<TryAcquire> {
        self.ready().await;
        let ttl = self.capabilities().grant_ttl(ttl)?;
        self.check_eviction().await?;
        self.start_probe();
        let n = self.rw_names(key);
        let owner = OwnerId::random();
        let holder = lease_api::holder();
        let (ttl_ms, hex) = (millis(ttl).to_string(), owner.to_hex());
        let waiting = waiting.map(OwnerId::to_hex).unwrap_or_default();
        let sent_at = Instant::now();
        let tomb = cancel_key(&n.lease, &hex);
        let answer = self
            .rw_eval(
                &WRITE,
                &[&n.hash, &n.fence, &n.epoch, &tomb],
                &[&hex, &ttl_ms, &holder, &waiting],
            )
            .await;
        let ((won, n1), acked): ((i64, i64), u32) =
            self.or_cancel(answer, key, (&n, owner, ttl))?;
        if won != 1 {
            return Ok(TryAcquire::Held {
                remaining: u64::try_from(n1).ok().map(Duration::from_millis),
            });
        }
        let lease = Lease::new(key.clone(), token(n1)?, owner, ttl, sent_at)
            .with_holder(holder)
            .with_kind(LeaseKind::Write);
        self.replicated_or_given_back(lease, acked).await
    }

    /// The answer of a read or write script; when it is unknown (the call
    /// timed out or the connection dropped: the script may still run, or
    /// ran), the owner's acquire is cancelled in the background, as a plain
    /// acquire's is, so no reader or writer nobody knows of is left.
    fn or_cancel<T>(
        &self,
        answer: Result<T>,
        key: &LeaseKey,
        (n, owner, ttl): (&RwNames, OwnerId, Duration),
    ) -> Result<T> {
        let e = match answer {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if e.is_transient() {
            let this = self.clone();
            let (hash, tomb) = (n.hash.clone(), cancel_key(&n.lease, &owner.to_hex()));
            let args = [
                owner.to_hex(),
                millis(ttl.max(Duration::from_secs(60))).to_string(),
                self.inner.channel.clone(),
                wake_name(key),
            ];
            self.inner.cleanups.spawn(async move {
                let give_up = Instant::now() + Duration::from_secs(120);
                let mut backoff = Duration::from_millis(100);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                loop {
                    match this.inner.node.eval::<i64>(&CANCEL, &[&hash, &tomb], &args).await {
                        Ok(_) => return,
                        Err(e) if Instant::now() >= give_up => {
                            tracing::warn!(error = %e, "could not cancel a timed-out read/write acquire; if it ran, its lease runs out by its TTL");
                            return;
                        }
                        Err(_) => {
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(Duration::from_secs(5));
                        }
                    }
                }
            });
        }
        Err(e)
    }

    /// A lease too few replicas acknowledged is given back, as a plain
    /// acquire's is: a failover could promote a replica without it.
    async fn replicated_or_given_back(&self, lease: Lease, acked: u32) -> Result<TryAcquire> {
        if acked < self.inner.wait_replicas {
            if let Err(e) = self.release(&lease).await {
                tracing::warn!(key = %lease.key(), error = %e, "could not give back a lease no replica acknowledged; it runs out by its TTL");
            }
            return Err(self.unreplicated(acked));
        }
        Ok(TryAcquire::Acquired(lease))
    }

    pub(super) async fn withdraw(&self, key: &LeaseKey, waiting: OwnerId) -> Result<()> {
        let n = self.rw_names(key);
        let _: i64 = self
            .inner
            .node
            .eval(
                &WITHDRAW,
                &[&n.hash],
                &[&waiting.to_hex(), &self.inner.channel, &wake_name(key)],
            )
            .await?;
        Ok(())
    }

    /// Extend of a reader or writer; `None` for a plain lease.
    pub(super) async fn extend_rw(&self, lease: &Lease, ttl: Duration) -> Option<Result<Lease>> {
        let field = field(lease)?;
        Some(
            async {
                let ttl = self.capabilities().grant_ttl(ttl)?;
                let n = self.rw_names(lease.key());
                let (owner, tok, ttl_ms) = (
                    lease.owner().to_hex(),
                    lease.token().get().to_string(),
                    millis(ttl).to_string(),
                );
                let sent_at = Instant::now();
                let (done, acked): (i64, u32) = self
                    .rw_eval(&EXTEND, &[&n.hash], &[&field, &owner, &tok, &ttl_ms])
                    .await?;
                match done {
                    1 if acked < self.inner.wait_replicas => Err(self.unreplicated(acked)),
                    1 => Ok(lease.renewed(ttl, sent_at)),
                    _ => Err(LeaseError::lost(lease)),
                }
            }
            .await,
        )
    }

    /// Release of a reader or writer; `None` for a plain lease.
    pub(super) async fn release_rw(&self, lease: &Lease) -> Option<Result<()>> {
        let field = field(lease)?;
        Some(
            async {
                let n = self.rw_names(lease.key());
                let done: i64 = self
                    .inner
                    .node
                    .eval(
                        &RELEASE,
                        &[&n.hash],
                        &[
                            &field,
                            &lease.owner().to_hex(),
                            &lease.token().get().to_string(),
                            &self.inner.channel,
                            &wake_name(lease.key()),
                        ],
                    )
                    .await?;
                if done == 1 {
                    Ok(())
                } else {
                    Err(LeaseError::not_held(lease))
                }
            }
            .await,
        )
    }

    pub(super) async fn inspect_rw_lease(&self, key: &LeaseKey) -> Result<RwInfo> {
        self.ready().await;
        let n = self.rw_names(key);
        let items: Vec<String> = self
            .inner
            .node
            .eval(&INSPECT, &[&n.hash, &n.epoch], &[])
            .await?;
        let bad =
            || LeaseError::protocol(format!("unexpected read/write inspect answer {items:?}"));
        let (epoch, now) = match items.as_slice() {
            [e, now, ..] => (
                e.parse::<u64>().map_err(|_| bad())?,
                now.parse::<u64>().map_err(|_| bad())?,
            ),
            _ => return Err(bad()),
        };
        let mut info = RwInfo::default();
        info.writer_epoch = FencingToken(epoch);
        for pair in items[2..].chunks(2) {
            let [f, v] = pair else { return Err(bad()) };
            let mut parts = v.splitn(2, ':');
            let exp: u64 = parts.next().and_then(|e| e.parse().ok()).ok_or_else(bad)?;
            let rest = parts.next().unwrap_or("");
            let remaining = Duration::from_millis(exp.saturating_sub(now));
            if f == "w" {
                let mut p = rest.splitn(3, ':');
                let owner = p.next().and_then(OwnerId::from_hex);
                let tok: u64 = p.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
                let label = p.next().map(str::to_owned);
                info.writer = Some(LeaseInfo::new(FencingToken(tok), remaining, owner, label));
            } else if let Some(owner) = f.strip_prefix("r:") {
                let mut p = rest.splitn(2, ':');
                let tok: u64 = p.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
                let label = p.next().map(str::to_owned);
                info.readers.push(LeaseInfo::new(
                    FencingToken(tok),
                    remaining,
                    OwnerId::from_hex(owner),
                    label,
                ));
            } else if f.starts_with("q:") {
                info.writers_waiting += 1;
            }
        }
        info.readers.sort_by_key(|r| r.token);
        Ok(info)
    }

    pub(super) async fn watch_rw_lease(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        let watch = self.inner.hub.watch(&wake_name(key));
        self.inner
            .node
            .subscribe(&self.inner.channel, &self.inner.hub)
            .await?;
        Ok(Box::new(watch))
    }
}

fn token(n: i64) -> Result<FencingToken> {
    u64::try_from(n)
        .map(FencingToken)
        .map_err(|_| LeaseError::protocol(format!("negative token {n}")))
}

//! Read/write leases on etcd (C19), after etcd's own rwmutex recipe: keys
//! under the key's prefix `<ns>\0rw/<key>\0/`: `w` (the writer), `r/<owner>`
//! (each reader), `q/<id>` (each waiting writer), each on an etcd lease of
//! its own, and `e`, rewritten by every writer without a lease, whose mod
//! revision is the last writer's token. Every acquire is a grant and one
//! transaction comparing the prefix's ranges (`version == 0` over a range
//! holds exactly when the range is empty); a token is the create revision.

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use lease_api::backend::{KeyWatch, LeaseHandle, OwnerId};
use lease_api::{
    FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseKind, Result, RwInfo, TryAcquire,
};
use tokio::time::Instant;

use crate::provider::{EtcdProvider, Spare, value};

fn range_empty(k: String) -> Compare {
    Compare::version(k, CompareOp::Equal, 0).with_prefix()
}

impl EtcdProvider {
    fn rw_prefix(&self, key: &LeaseKey) -> String {
        format!("{}\0rw/{}\0/", self.inner.prefix, key.as_str())
    }

    /// The etcd key a reader or writer lease lives on.
    fn rw_key(&self, lease: &Lease) -> Option<String> {
        let p = self.rw_prefix(lease.key());
        match lease.kind() {
            LeaseKind::Write => Some(format!("{p}w")),
            LeaseKind::Read { .. } => Some(format!("{p}r/{}", lease.owner().to_hex())),
            LeaseKind::Exclusive => None,
        }
    }

    /// A reader (`writer` is `None`) or the writer (`Some(waiting)`).
    pub(crate) async fn take_rw(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        writer: Option<Option<OwnerId>>,
    ) -> Result<TryAcquire> {
        let ttl = self.inner.caps.grant_ttl(ttl)?;
        let p = self.rw_prefix(key);
        let sent_at = Instant::now();
        let (id, granted) = self.grant(ttl).await?;
        let owner = OwnerId::random();
        let holder = lease_api::holder();
        let put = |k: String| {
            TxnOp::put(
                k,
                value(owner, &holder),
                Some(PutOptions::new().with_lease(id)),
            )
        };
        let waiting_key = writer.flatten().map(|w| format!("{p}q/{}", w.to_hex()));
        let txn = match writer {
            None => Txn::new()
                .when(vec![
                    Compare::version(format!("{p}w"), CompareOp::Equal, 0),
                    range_empty(format!("{p}q/")),
                ])
                .and_then(vec![
                    put(format!("{p}r/{}", owner.to_hex())),
                    TxnOp::get(format!("{p}e"), None),
                ])
                .or_else(vec![
                    TxnOp::get(format!("{p}w"), None),
                    TxnOp::get(
                        format!("{p}q/"),
                        Some(GetOptions::new().with_prefix().with_limit(1)),
                    ),
                ]),
            Some(_) => {
                let mut taken = vec![put(format!("{p}w")), TxnOp::put(format!("{p}e"), "", None)];
                let mut held = vec![
                    TxnOp::get(format!("{p}w"), None),
                    TxnOp::get(
                        format!("{p}r/"),
                        Some(GetOptions::new().with_prefix().with_limit(1)),
                    ),
                ];
                if let Some(q) = &waiting_key {
                    taken.push(TxnOp::delete(q.clone(), None));
                    held.push(put(q.clone()));
                }
                Txn::new()
                    .when(vec![
                        Compare::version(format!("{p}w"), CompareOp::Equal, 0),
                        range_empty(format!("{p}r/")),
                    ])
                    .and_then(taken)
                    .or_else(held)
            }
        };
        let resp = match self
            .call("read/write txn", |mut c| async move { c.txn(txn).await })
            .await
        {
            Ok(r) => r,
            Err(e) => {
                // The put may have happened: revoking its lease deletes it.
                self.revoke_in_background(id);
                return Err(e);
            }
        };
        if !resp.succeeded() {
            // A waiting writer's record lives on this etcd lease until the
            // next attempt moves it to its own (the old one is revoked then).
            match &waiting_key {
                Some(q) => self.keep_spare(
                    q.clone(),
                    Spare {
                        id,
                        asked: ttl,
                        granted,
                        sent_at,
                    },
                ),
                None => self.revoke_in_background(id),
            }
            let holder_lease = resp.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.lease()),
                _ => None,
            });
            let remaining = match holder_lease {
                Some(hid) => self.time_to_live(hid).await.unwrap_or(None),
                None => None,
            };
            return Ok(TryAcquire::Held { remaining });
        }
        if let Some(q) = &waiting_key
            && let Some(old) = self.take_spare(q, ttl, Instant::now())
        {
            self.revoke_in_background(old.id);
        }
        let revision = resp.header().map_or(0, |h| h.revision());
        let token = u64::try_from(revision)
            .ok()
            .filter(|t| *t > 0)
            .ok_or_else(|| {
                LeaseError::protocol(format!("no revision for a read/write acquire ({revision})"))
            })?;
        let kind = match writer {
            Some(_) => LeaseKind::Write,
            None => {
                let epoch = resp.op_responses().into_iter().find_map(|op| match op {
                    TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.mod_revision()),
                    _ => None,
                });
                LeaseKind::Read {
                    writer_epoch: FencingToken(u64::try_from(epoch.unwrap_or(0)).unwrap_or(0)),
                }
            }
        };
        Ok(TryAcquire::Acquired(
            Lease::new(key.clone(), FencingToken(token), owner, granted, sent_at)
                .with_handle(LeaseHandle::EtcdLease(id))
                .with_holder(holder)
                .with_kind(kind),
        ))
    }

    /// The comparisons that hold while `lease` holds its key `k`.
    fn rw_held(k: &str, lease: &Lease) -> Result<Vec<Compare>> {
        let token = i64::try_from(lease.token().get())
            .map_err(|_| LeaseError::protocol("a token past i64"))?;
        Ok(vec![
            Compare::create_revision(k.to_owned(), CompareOp::Equal, token),
            Compare::value(
                k.to_owned(),
                CompareOp::Equal,
                value(lease.owner(), lease.holder()),
            ),
        ])
    }

    /// Extend of a reader or writer; `None` for a plain lease.
    pub(crate) async fn extend_rw(&self, lease: &Lease, ttl: Duration) -> Option<Result<Lease>> {
        let k = self.rw_key(lease)?;
        Some(
            async {
                let ttl = self.inner.caps.grant_ttl(ttl)?;
                let LeaseHandle::EtcdLease(old) = lease.handle() else {
                    return Err(LeaseError::lost(lease));
                };
                if ttl == lease.ttl() {
                    // Renew the etcd lease, then (never beside it: a read
                    // served first could miss a delete landing before the
                    // keep-alive) check the key is still this lease's.
                    let sent_at = Instant::now();
                    if !self.keep_alive_once(old).await? {
                        return Err(LeaseError::lost(lease));
                    }
                    let read = k.clone();
                    let got = self
                        .call("get", |mut c| async move { c.get(read, None).await })
                        .await?;
                    let token = i64::try_from(lease.token().get()).unwrap_or(-1);
                    let ours = value(lease.owner(), lease.holder());
                    let held = got.kvs().first().is_some_and(|kv| {
                        kv.create_revision() == token
                            && kv.value() == ours.as_bytes()
                            && kv.lease() == old
                    });
                    return if held {
                        Ok(lease.renewed(ttl, sent_at))
                    } else {
                        Err(LeaseError::lost(lease))
                    };
                }
                // A new etcd lease of the TTL asked for, the key moved onto
                // it while it is still this lease's, the old one revoked.
                let sent_at = Instant::now();
                let (id, granted) = self.grant(ttl).await?;
                let txn = Txn::new()
                    .when(Self::rw_held(&k, lease)?)
                    .and_then(vec![TxnOp::put(
                        k.clone(),
                        value(lease.owner(), lease.holder()),
                        Some(PutOptions::new().with_lease(id)),
                    )]);
                let resp = self
                    .call("read/write extend", |mut c| async move { c.txn(txn).await })
                    .await;
                match resp {
                    Ok(r) if r.succeeded() => {
                        self.revoke_in_background(old);
                        Ok(lease
                            .renewed(granted, sent_at)
                            .with_handle(LeaseHandle::EtcdLease(id)))
                    }
                    Ok(_) => {
                        self.revoke_in_background(id);
                        Err(LeaseError::lost(lease))
                    }
                    Err(e) => {
                        // The move may have landed on the new etcd lease: the
                        // old one still runs, the caller's validity is the old.
                        Err(e)
                    }
                }
            }
            .await,
        )
    }

    /// Release of a reader or writer; `None` for a plain lease.
    pub(crate) async fn release_rw(&self, lease: &Lease) -> Option<Result<()>> {
        let k = self.rw_key(lease)?;
        Some(
            async {
                let txn = Txn::new()
                    .when(Self::rw_held(&k, lease)?)
                    .and_then(vec![TxnOp::delete(k.clone(), None)]);
                let resp = self
                    .call(
                        "read/write release",
                        |mut c| async move { c.txn(txn).await },
                    )
                    .await?;
                if !resp.succeeded() {
                    return Err(LeaseError::not_held(lease));
                }
                if let LeaseHandle::EtcdLease(id) = lease.handle() {
                    self.revoke_in_background(id);
                }
                Ok(())
            }
            .await,
        )
    }

    pub(crate) async fn withdraw(&self, key: &LeaseKey, waiting: OwnerId) -> Result<()> {
        let q = format!("{}q/{}", self.rw_prefix(key), waiting.to_hex());
        let k = q.clone();
        self.call("withdraw", |mut c| async move { c.delete(k, None).await })
            .await?;
        if let Some(old) = self.take_spare(&q, Duration::ZERO, Instant::now()) {
            self.revoke_in_background(old.id);
        }
        Ok(())
    }

    pub(crate) async fn inspect_rw_lease(&self, key: &LeaseKey) -> Result<RwInfo> {
        let p = self.rw_prefix(key);
        let range = p.clone();
        let resp = self
            .call("get", |mut c| async move {
                c.get(range, Some(GetOptions::new().with_prefix())).await
            })
            .await?;
        let mut info = RwInfo::default();
        for kv in resp.kvs() {
            let name = kv.key_str().map_err(|e| self.map_err(e))?;
            let Some(rest) = name.strip_prefix(&p) else {
                continue;
            };
            if rest == "e" {
                info.writer_epoch = FencingToken(u64::try_from(kv.mod_revision()).unwrap_or(0));
                continue;
            }
            if rest.starts_with("q/") {
                info.writers_waiting += 1;
                continue;
            }
            let v = kv.value_str().unwrap_or("");
            let (owner, label) = v.split_once(':').map_or((None, None), |(o, l)| {
                (OwnerId::from_hex(o), Some(l.to_owned()))
            });
            let remaining = self
                .time_to_live(kv.lease())
                .await?
                .unwrap_or(Duration::ZERO);
            let held = LeaseInfo::new(
                FencingToken(u64::try_from(kv.create_revision()).unwrap_or(0)),
                remaining,
                owner,
                label,
            );
            if rest == "w" {
                info.writer = Some(held);
            } else {
                info.readers.push(held);
            }
        }
        info.readers.sort_by_key(|r| r.token);
        Ok(info)
    }

    /// Any deletion under the key's prefix (a release, an expiry, a
    /// withdrawal) wakes the watch; it starts now, registered before the try.
    pub(crate) async fn watch_rw_lease(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        let p = self.rw_prefix(key);
        let watched = p.clone();
        let mut stream = self
            .call("watch", |mut c| async move {
                c.watch(watched, Some(WatchOptions::new().with_prefix()))
                    .await
            })
            .await?;
        self.confirmed(&mut stream).await?;
        Ok(Box::new(crate::watch::EtcdWatch::new(stream, p, self)))
    }
}

//! A set of keys in one transaction (C18): an etcd lease granted per key
//! (all at once), then one txn that puts every key only if none exists.
//! Each key has an etcd lease of its own, so extending, moving or releasing
//! one lease of the set touches no other.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use futures_util::future::join_all;
use lease_api::backend::{LeaseHandle, OwnerId, validate_key_set};
use lease_api::{FencingToken, Lease, LeaseError, LeaseKey, Result, TryAcquireAll};
use tokio::time::Instant;

use crate::provider::{EtcdProvider, value};

impl EtcdProvider {
    pub(crate) async fn acquire_set(
        &self,
        keys: &[LeaseKey],
        ttl: Duration,
    ) -> Result<TryAcquireAll> {
        validate_key_set(keys, self.inner.caps.multi_key.max_keys)?;
        let ttl = self.inner.caps.grant_ttl(ttl)?;
        let sent_at = Instant::now();
        let grants = join_all(keys.iter().map(|_| self.grant(ttl))).await;
        let mut ids = Vec::with_capacity(keys.len());
        let mut failed = None;
        for grant in grants {
            match grant {
                Ok(g) => ids.push(g),
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            for (id, _) in ids {
                self.revoke_in_background(id);
            }
            return Err(e);
        }
        let names: Vec<String> = keys.iter().map(|k| self.etcd_key(k)).collect();
        let owners: Vec<OwnerId> = keys.iter().map(|_| OwnerId::random()).collect();
        let holder = lease_api::holder();
        let txn = Txn::new()
            .when(
                names
                    .iter()
                    .map(|k| Compare::create_revision(k.clone(), CompareOp::Equal, 0))
                    .collect::<Vec<_>>(),
            )
            .and_then(
                names
                    .iter()
                    .zip(&owners)
                    .zip(&ids)
                    .map(|((k, owner), (id, _))| {
                        TxnOp::put(
                            k.clone(),
                            value(*owner, &holder),
                            Some(PutOptions::new().with_lease(*id)),
                        )
                    })
                    .collect::<Vec<_>>(),
            )
            .or_else(
                names
                    .iter()
                    .map(|k| TxnOp::get(k.clone(), None))
                    .collect::<Vec<_>>(),
            );
        let revoke_all = |ids: &[(i64, Duration)]| {
            for (id, _) in ids {
                self.revoke_in_background(*id);
            }
        };
        let resp = match self
            .call("acquire_all txn", |mut c| async move { c.txn(txn).await })
            .await
        {
            Ok(r) => r,
            Err(e) => {
                // The puts may have happened: revoking their etcd leases
                // deletes whatever was put on them.
                revoke_all(&ids);
                return Err(e);
            }
        };
        if !resp.succeeded() {
            revoke_all(&ids);
            let held = resp
                .op_responses()
                .into_iter()
                .zip(keys)
                .find_map(|(op, key)| match op {
                    TxnOpResponse::Get(g) => g.kvs().first().map(|kv| (key.clone(), kv.lease())),
                    _ => None,
                });
            let Some((key, holder_lease)) = held else {
                return Err(LeaseError::protocol(
                    "an etcd set transaction failed with no key of the set present",
                ));
            };
            // Best effort, for the waiter's fallback timer.
            let remaining = self.time_to_live(holder_lease).await.unwrap_or(None);
            return Ok(TryAcquireAll::Held { key, remaining });
        }
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        let token = u64::try_from(revision)
            .ok()
            .filter(|t| *t > 0)
            .ok_or_else(|| {
                LeaseError::protocol(format!(
                    "etcd returned no revision for a successful set acquire ({revision})"
                ))
            })?;
        // Every key of the set was created at the transaction's revision.
        let leases: Vec<Lease> = keys
            .iter()
            .zip(owners)
            .zip(&ids)
            .map(|((key, owner), (id, granted))| {
                Lease::new(key.clone(), FencingToken(token), owner, *granted, sent_at)
                    .with_handle(LeaseHandle::EtcdLease(*id))
                    .with_holder(std::sync::Arc::clone(&holder))
            })
            .collect();
        for lease in &leases {
            self.record_issued(lease, ttl);
        }
        Ok(TryAcquireAll::Acquired(leases))
    }
}

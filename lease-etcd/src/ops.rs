//! The lease operations of `EtcdProvider`: acquire, extend, release, inspect and watch.

use std::sync::Arc;
use std::time::Duration;

use crate::moves::MoveInFlight;
use crate::provider::Unused;
use crate::provider::{EtcdProvider, Fence, lease_id, parse_value, revoke_if_own};
use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};
use lease_api::backend::{KeyWatch, LeaseHandle, OwnerId, SessionStore, WaitQueue};
use lease_api::{
    Capabilities, FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseProvider, Result,
    RwInfo, TryAcquire, TryAcquireAll,
};
use tokio::time::Instant;

#[async_trait]
impl LeaseProvider for EtcdProvider {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    fn namespace(&self) -> &str {
        &self.inner.config.namespace
    }

    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        let ttl = self.inner.caps.grant_ttl(ttl)?;
        let k = self.etcd_key(key);
        if let Some(remaining) = self.still_held(&k).await? {
            return Ok(TryAcquire::Held {
                remaining: Some(remaining),
            });
        }
        let answer = match self.take_spare(&k, ttl, Instant::now()) {
            Some(spare) => self.claim_with_spare(key, &k, spare).await,
            None => None,
        };
        let answer = match answer {
            Some(answer) => answer,
            None => {
                let sent_at = Instant::now();
                let (id, granted) = self.grant(ttl).await?;
                self.claim(
                    key,
                    LeaseHandle::EtcdLease(id),
                    granted,
                    sent_at,
                    Unused::Spare(ttl),
                )
                .await
            }
        };
        if let Ok(TryAcquire::Acquired(lease)) = &answer {
            self.record_issued(lease, ttl);
        }
        answer
    }

    /// An etcd lease per key, granted all at once, then one transaction.
    async fn try_acquire_all(&self, keys: &[LeaseKey], ttl: Duration) -> Result<TryAcquireAll> {
        self.acquire_set(keys, ttl).await
    }

    async fn try_acquire_read(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.take_rw(key, ttl, None).await
    }

    async fn try_acquire_write(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        waiting: Option<OwnerId>,
    ) -> Result<TryAcquire> {
        self.take_rw(key, ttl, Some(waiting)).await
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
        let ttl = self.inner.caps.grant_ttl(ttl)?;
        let id = lease_id(lease);
        let lost = || LeaseError::lost(lease);
        let sent_at = Instant::now();
        if ttl == lease.ttl() {
            // The etcd lease must be alive AND still carry our key, which a
            // release by another client deletes before it revokes the etcd
            // lease (and a purge deletes without revoking it). The key is
            // read after the keep-alive answered, never beside it: a read
            // served first would miss a delete that lands before the
            // keep-alive, and call a lease renewed that the store no longer
            // has (two reads racing a write).
            if !self.keep_alive_once(id).await? {
                return Err(lost());
            }
            self.after_keep_alive().await;
            // The key must also still be on this etcd lease: an extend to
            // another TTL whose answer was lost may have moved it to an etcd
            // lease nobody keeps alive, which runs out whatever we renew here.
            // A keep-alive renews an etcd lease to the TTL etcd granted it,
            // which is not always the one the `Lease` says.
            let (ours, granted) = tokio::join!(self.key_is_on(lease, id), self.granted_ttl(id));
            let (true, Some(granted)) = (ours?, granted?) else {
                return Err(lost());
            };
            let renewed = lease.renewed(granted, sent_at);
            self.refresh_issued(&renewed);
            return Ok(renewed);
        }
        // Another TTL: a new etcd lease, attached while we still hold the key.
        // The move is guarded on the key's mod revision as well, so that a
        // move whose answer is lost can be fenced off (`fence_move`): it must
        // never land later, unseen, on a key whose holder believes otherwise.
        let Some(seen) = self.held_revision(lease).await? else {
            return Err(lost());
        };
        let (new_id, granted) = self.grant(ttl).await?;
        // From here until the extend answers, a drop leaves the move to be
        // settled in the background (see `moves.rs`).
        let in_flight = MoveInFlight::arm(self, lease, seen, new_id);
        let mut compares = self.held_compares(lease);
        compares.push(Compare::mod_revision(
            self.etcd_key(lease.key()),
            CompareOp::Equal,
            seen,
        ));
        let txn = Txn::new()
            .when(compares)
            // The value (owner and holder label) stays as the acquire wrote it.
            .and_then(vec![TxnOp::put(
                self.etcd_key(lease.key()),
                "",
                Some(PutOptions::new().with_lease(new_id).with_ignore_value()),
            )]);
        let moved = lease
            .renewed(granted, sent_at)
            .with_handle(LeaseHandle::EtcdLease(new_id));
        let answer = self
            .call("extend txn", |mut c| async move { c.txn(txn).await })
            .await;
        // Every outcome below is settled before its next await (the fence
        // settles an unknown one itself), and none revokes the old etcd
        // lease before the caller can be told.
        let answer = match answer {
            Err(e) => Err((e, self.fence_move(lease, seen, new_id).await)),
            Ok(resp) => Ok(resp),
        };
        in_flight.defuse();
        match answer {
            Ok(resp) if resp.succeeded() => {
                self.forget_issued(lease);
                revoke_if_own(self, lease);
                self.record_issued(&moved, ttl);
                Ok(moved)
            }
            Ok(_) => {
                self.revoke_in_background(new_id);
                // Lost, unless only the revision moved (another extend of
                // ours): then the caller may try again.
                match self.held_revision(lease).await {
                    Ok(Some(_)) => Err(LeaseError::Unavailable {
                        message: "the key changed during the extend; try again".into(),
                        source: None,
                    }),
                    _ => Err(lost()),
                }
            }
            Err((e, fence)) => match fence {
                Fence::Moved => {
                    self.forget_issued(lease);
                    revoke_if_own(self, lease);
                    self.record_issued(&moved, ttl);
                    Ok(moved)
                }
                Fence::NotMoved => {
                    self.revoke_in_background(new_id);
                    Err(e)
                }
                // The move may still land, on `new_id` (never revoked here):
                // harmless when the new TTL outlasts what the caller believes
                // it holds, else the lease must count as lost now.
                Fence::Unknown if sent_at + ttl >= lease.valid_until() => Err(e),
                Fence::Unknown => Err(lost()),
            },
        }
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        if let Some(answer) = self.release_rw(lease).await {
            return answer;
        }
        let k = self.etcd_key(lease.key());
        let txn = Txn::new()
            .when(self.held_compares(lease))
            .and_then(vec![TxnOp::delete(
                k.clone(),
                Some(DeleteOptions::new().with_prev_key()),
            )]);
        let resp = self
            .call("release txn", |mut c| async move { c.txn(txn).await })
            .await?;
        if resp.succeeded() {
            // The etcd lease the key was on when it was deleted.
            let deleted_from = resp.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Delete(d) => d.prev_kvs().first().map(|kv| kv.lease()),
                _ => None,
            });
            self.after_release(k, lease, deleted_from);
            Ok(())
        } else {
            Err(LeaseError::not_held(lease))
        }
    }

    async fn session_store(&self, ttl: Duration) -> Result<Option<Arc<dyn SessionStore>>> {
        Ok(Some(crate::session::open(self, ttl)))
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        let k = self.etcd_key(key);
        let resp = self
            .call("get", |mut c| async move { c.get(k, None).await })
            .await?;
        let Some(kv) = resp.kvs().first() else {
            return Ok(None);
        };
        let token = FencingToken(u64::try_from(kv.create_revision()).unwrap_or(0));
        let (owner, holder) = parse_value(kv.value());
        // The lease may have expired between the two calls: then the key is free.
        let Some(remaining) = self.time_to_live(kv.lease()).await? else {
            return Ok(None);
        };
        Ok(Some(LeaseInfo::new(token, remaining, owner, holder)))
    }

    fn wait_queue(&self) -> Option<&dyn WaitQueue> {
        Some(self)
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        let k = self.etcd_key(key);
        // A key this provider saw held is watched from the revision after
        // the answer that showed it held: etcd replays every deletion since,
        // so a release between that try and this watch wakes it at once.
        let seen = self.seen_held().get(&k).map(|s| s.revision);
        let options = seen.map(|rev| WatchOptions::new().with_start_revision(rev + 1));
        let watched = k.clone();
        let mut stream = self
            .call(
                "watch",
                |mut c| async move { c.watch(watched, options).await },
            )
            .await?;
        self.confirmed(&mut stream).await?;
        // Otherwise the watch starts now, and one read says whether the key
        // is still there: once etcd confirmed the watch, every later deletion
        // is delivered, and an earlier one shows as a missing key.
        let free = match seen {
            Some(_) => false,
            None => {
                let read = k.clone();
                let found = self
                    .call("get", |mut c| async move {
                        c.get(read, Some(GetOptions::new().with_count_only())).await
                    })
                    .await?;
                found.count() == 0
            }
        };
        Ok(Box::new(crate::watch::EtcdWatch {
            stream: Some(stream),
            free,
            key: k,
            seen_held: Arc::clone(&self.inner.seen_held),
        }))
    }

    /// The watch starts at the revision where this provider saw the key
    /// held (or looks at the key as it starts), so it reports a release
    /// that came before it: a woken waiter's next step is its try alone.
    fn watch_reports_state(&self) -> bool {
        true
    }
}

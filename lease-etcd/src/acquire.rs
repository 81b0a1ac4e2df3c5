//! Taking a key: the acquire transaction, and the spare etcd leases (the one
//! a try granted and found its key held with, kept for the next try on that
//! key) that make a woken waiter's acquire one round trip: its transaction
//! beside a keep-alive of the spare.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use lease_api::backend::{LeaseHandle, OwnerId};
use lease_api::{FencingToken, Lease, LeaseError, LeaseKey, Result, TryAcquire};
use tokio::time::Instant;

use crate::provider::{EtcdProvider, SeenHeld, Spare, Unused, source_says_lease_not_found, value};

impl EtcdProvider {
    /// The acquire transaction: puts `key` attached to the etcd lease of
    /// `handle` if the key does not exist. A session's etcd lease is kept
    /// whatever happens. One of its own is revoked when the put failed; when
    /// the key was held, `unused` says what becomes of it.
    pub(crate) async fn claim(
        &self,
        key: &LeaseKey,
        handle: LeaseHandle,
        granted: Duration,
        sent_at: Instant,
        unused: Unused,
    ) -> Result<TryAcquire> {
        let (id, own) = match handle {
            LeaseHandle::EtcdLease(id) => (id, true),
            LeaseHandle::EtcdSession(id) => (id, false),
            other => {
                return Err(LeaseError::protocol(format!(
                    "an etcd acquire on a {other} handle"
                )));
            }
        };
        let drop_unused = |id| {
            if own {
                self.revoke_in_background(id);
            }
        };
        let k = self.etcd_key(key);
        let owner = OwnerId::random();
        let holder = lease_api::holder();
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                k.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then(vec![TxnOp::put(
                k.clone(),
                value(owner, &holder),
                Some(PutOptions::new().with_lease(id)),
            )])
            .or_else(vec![TxnOp::get(k.clone(), None)]);
        let resp = match self
            .call("acquire txn", |mut c| async move { c.txn(txn).await })
            .await
        {
            Ok(r) => r,
            Err(e) => {
                if own {
                    drop_unused(id);
                } else {
                    // The put may have happened on the session's etcd lease,
                    // which lives on: delete the key if it carries our owner.
                    self.delete_if_owner_in_background(&k, owner);
                }
                return Err(e);
            }
        };
        if resp.succeeded() {
            let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            let token = u64::try_from(revision)
                .ok()
                .filter(|t| *t > 0)
                .ok_or_else(|| {
                    LeaseError::protocol(format!(
                        "etcd returned no revision for a successful acquire ({revision})"
                    ))
                })?;
            let lease = Lease::new(key.clone(), FencingToken(token), owner, granted, sent_at)
                .with_handle(handle)
                .with_holder(holder);
            return Ok(TryAcquire::Acquired(lease));
        }
        match unused {
            Unused::Spare(asked) if own => self.keep_spare(
                k.clone(),
                Spare {
                    id,
                    asked,
                    granted,
                    sent_at,
                },
            ),
            Unused::Spare(_) => drop_unused(id),
            Unused::Leave => {}
        }
        let holder_lease = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.lease()),
            _ => None,
        });
        // Best effort: how long the holder still has, for the waiter's fallback timer.
        let remaining = match holder_lease {
            Some(hid) => self.time_to_live(hid).await.unwrap_or(None),
            None => None,
        };
        self.seen_held().insert(
            k,
            SeenHeld {
                until: Instant::now() + remaining.unwrap_or(lease_api::backend::MAX_BLIND_WAIT),
                revision: resp.header().map_or(0, |h| h.revision()),
            },
        );
        Ok(TryAcquire::Held { remaining })
    }

    fn spares(&self) -> std::sync::MutexGuard<'_, HashMap<String, Spare>> {
        self.inner
            .spares
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `spare` for the next try on `k`, in place of an earlier one
    /// (revoked). Spares that ran out are dropped on the way: etcd has
    /// already let them go.
    pub(crate) fn keep_spare(&self, k: String, spare: Spare) {
        let now = Instant::now();
        let replaced = {
            let mut spares = self.spares();
            spares.retain(|_, s| s.lives_until() > now);
            spares.insert(k, spare)
        };
        if let Some(old) = replaced.filter(|old| old.id != spare.id) {
            self.revoke_in_background(old.id);
        }
    }

    /// The spare kept for `k`, if it was granted for `asked` and has at
    /// least a quarter of its TTL left, so the keep-alive sent beside the
    /// transaction most likely finds it alive (one that does not costs a
    /// wasted round trip, never safety). Any other is revoked.
    pub(crate) fn take_spare(&self, k: &str, asked: Duration, now: Instant) -> Option<Spare> {
        let spare = self.spares().remove(k)?;
        if spare.asked == asked && spare.lives_until() >= now + spare.granted / 4 {
            return Some(spare);
        }
        self.revoke_in_background(spare.id);
        None
    }

    /// A try with the key's [`Spare`]: the transaction and a keep-alive of
    /// the spare are sent together, so a woken waiter takes the key in one
    /// round trip instead of a grant and then a transaction. `None` when the
    /// spare turned out gone: the caller grants a new etcd lease.
    ///
    /// The key is surely held until `sent_at + TTL` once the keep-alive
    /// answered alive: etcd renewed the lease after `sent_at`, and a lease
    /// alive then was alive all along since its grant, so the key the
    /// transaction put on it cannot have expired in between (nobody else
    /// knows the spare's id to revoke it). Until that answer only the
    /// spare's own grant is sure, which is what the lease says when the
    /// keep-alive failed.
    ///
    /// The spare is this try's alone until it answers: taken out of the map,
    /// left alone by the transaction, and put back only when the key was
    /// held (so no other try can attach a key to it, or revoke it, while
    /// this one may be putting the key on it).
    pub(crate) async fn claim_with_spare(
        &self,
        key: &LeaseKey,
        k: &str,
        spare: Spare,
    ) -> Option<Result<TryAcquire>> {
        let sent_at = Instant::now();
        let (claimed, alive) = tokio::join!(
            self.claim(
                key,
                LeaseHandle::EtcdLease(spare.id),
                spare.granted,
                spare.sent_at,
                Unused::Leave,
            ),
            self.keep_alive_once(spare.id),
        );
        match (claimed, alive) {
            // Renewed to the TTL it was granted, from after `sent_at`.
            (Ok(TryAcquire::Acquired(lease)), Ok(true)) => Some(Ok(TryAcquire::Acquired(
                lease.renewed(spare.granted, sent_at),
            ))),
            (Ok(held @ TryAcquire::Held { .. }), Ok(true)) => {
                self.keep_spare(k.to_owned(), Spare { sent_at, ..spare });
                Some(Ok(held))
            }
            // The spare had run out: a key put on it went with it, and a
            // put after it failed. Start over with a new etcd lease.
            (Ok(TryAcquire::Held { .. }), Ok(false)) => None,
            (Ok(TryAcquire::Acquired(_)), Ok(false)) => None,
            // A spare etcd no longer has: whatever the keep-alive said.
            (Err(e), _) if source_says_lease_not_found(&e) => None,
            (Err(e), Ok(_)) => Some(Err(e)),
            // Whether the keep-alive landed is unknown: the lease keeps the
            // validity of the spare's grant; a held key's spare is dropped.
            (Ok(held @ TryAcquire::Held { .. }), Err(_)) => {
                self.revoke_in_background(spare.id);
                Some(Ok(held))
            }
            (other, Err(_)) => Some(other),
        }
    }
}

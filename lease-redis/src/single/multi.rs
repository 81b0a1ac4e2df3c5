//! A set of keys in one script (C18): every key or none, decided by the
//! server in one step. A Cluster takes the keys in key order instead, since
//! each key has a hash slot of its own.

use std::time::Duration;

use lease_api::backend::{OwnerId, acquire_in_key_order, validate_key_set};
use lease_api::{FencingToken, Lease, LeaseError, LeaseKey, LeaseProvider, Result, TryAcquireAll};
use tokio::time::Instant;

use super::RedisProvider;
use crate::keys::cancel_key;
use crate::scripts::ACQUIRE_ALL;
use crate::time::millis;

impl RedisProvider {
    pub(super) async fn acquire_set(
        &self,
        keys: &[LeaseKey],
        ttl: Duration,
    ) -> Result<TryAcquireAll> {
        if self.inner.node.is_cluster() {
            return acquire_in_key_order(self, keys, ttl).await;
        }
        validate_key_set(keys, self.capabilities().multi_key.max_keys)?;
        self.ready().await;
        let ttl = self.capabilities().grant_ttl(ttl)?;
        self.check_eviction().await?;
        self.start_probe();
        let owners: Vec<OwnerId> = keys.iter().map(|_| OwnerId::random()).collect();
        let owner_hex: Vec<String> = owners.iter().map(|o| o.to_hex()).collect();
        let mut names = Vec::with_capacity(keys.len() * 3);
        for (key, owner) in keys.iter().zip(&owner_hex) {
            let (lease_key, fence_key) = self.keys(key);
            let cancel = cancel_key(&lease_key, owner);
            names.extend([lease_key, fence_key, cancel]);
        }
        let holder = lease_api::holder();
        let ttl_ms = millis(ttl).to_string();
        let mut args: Vec<&str> = vec![&ttl_ms, &*holder];
        args.extend(owner_hex.iter().map(String::as_str));
        let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let sent_at = Instant::now();
        let wait = self.inner.wait_replicas;
        let answer = if wait == 0 {
            self.inner
                .node
                .eval::<Vec<i64>>(&ACQUIRE_ALL, &name_refs, &args)
                .await
                .map(|v| (v, wait))
        } else {
            self.inner
                .node
                .eval_replicated::<Vec<i64>>(&ACQUIRE_ALL, &name_refs, &args, wait)
                .await
        };
        let (answer, acked) = match answer {
            Ok(v) => v,
            Err(e) => {
                // The script may still run, or ran before the connection
                // dropped: cancel every key of it, as a single acquire does.
                if e.is_transient() {
                    for (i, key) in keys.iter().enumerate() {
                        self.cancel_in_background(names[3 * i].clone(), owners[i], ttl, key);
                    }
                }
                return Err(e);
            }
        };
        match answer.as_slice() {
            [1, tokens @ ..] if tokens.len() == keys.len() => {
                let mut leases = Vec::with_capacity(keys.len());
                for ((key, owner), &token) in keys.iter().zip(&owners).zip(tokens) {
                    let token = u64::try_from(token)
                        .map_err(|_| LeaseError::protocol(format!("negative token {token}")))?;
                    leases.push(
                        Lease::new(key.clone(), FencingToken(token), *owner, ttl, sent_at)
                            .with_holder(std::sync::Arc::clone(&holder)),
                    );
                }
                if acked < wait {
                    // A failover now could promote a replica without the set:
                    // give it back rather than hand it out.
                    if let Err(e) = lease_api::release_all(self, &leases).await {
                        tracing::warn!(error = %e, "could not give back a set no replica acknowledged; it runs out by its TTL");
                    }
                    return Err(self.unreplicated(acked));
                }
                Ok(TryAcquireAll::Acquired(leases))
            }
            [0, i, pttl] => {
                let key = usize::try_from(*i)
                    .ok()
                    .and_then(|i| i.checked_sub(1))
                    .and_then(|i| keys.get(i))
                    .ok_or_else(|| {
                        LeaseError::protocol(format!("held key {i} of {}", keys.len()))
                    })?;
                Ok(TryAcquireAll::Held {
                    key: key.clone(),
                    remaining: u64::try_from(*pttl).ok().map(Duration::from_millis),
                })
            }
            other => Err(LeaseError::protocol(format!(
                "unexpected answer to a set acquire of {} keys: {other:?}",
                keys.len()
            ))),
        }
    }
}

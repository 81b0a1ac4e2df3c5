//! The lease operations of `RedlockProvider`: acquire (retrying split
//! votes), extend, release, inspect and watch, each a round to every node.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use lease_api::backend::{KeyWatch, OwnerId};
use lease_api::{
    Capabilities, FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseProvider, Result,
    TryAcquire,
};
use redis::Value;
use tokio::time::Instant;

use super::acquire::Round;
use super::{NodeCalls, RedlockProvider, Vote};
use crate::scripts::{EXTEND, EXTEND_BATCH, EXTEND_MANY, INSPECT, RELEASE, held_by};
use crate::single::{ExtendBatch, millis, parse_value};

/// How often a split vote is retried inside one `try_acquire`.
const SPLIT_RETRIES: u32 = 8;

#[async_trait]
impl LeaseProvider for RedlockProvider {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        let ttl = self.inner.caps.grant_ttl(ttl)?;
        self.check_eviction().await?;
        let started = Instant::now();
        let mut attempt = 0u32;
        loop {
            match self.acquire_round(key, ttl).await? {
                Round::Won(lease) => return Ok(TryAcquire::Acquired(lease)),
                // Contenders split the nodes so that nobody has a majority; the
                // key is not held by anyone. Back off by a random amount and
                // try again, so one of them gets ahead, as Redlock prescribes.
                // Spread retries over a few round times (not a fixed few ms),
                // so contenders woken by the same release fall out of step.
                Round::Split { took, .. }
                    if attempt < SPLIT_RETRIES && started.elapsed() < ttl / 2 =>
                {
                    attempt += 1;
                    let spread = took.max(Duration::from_millis(2)) * (2 + attempt.min(6));
                    let jitter = rand::random_range(
                        0..=u64::try_from(spread.as_micros()).unwrap_or(u64::MAX),
                    );
                    tokio::time::sleep(Duration::from_micros(jitter)).await;
                }
                // Still split: nobody holds a majority. Leases on a minority end
                // by their TTL (remaining), a contender's by its release (which
                // wakes waiters); with neither, retry after a few round times.
                Round::Split { remaining, took } => {
                    return Ok(TryAcquire::Held {
                        remaining: Some(remaining.unwrap_or(took * 4)),
                    });
                }
                Round::Held { remaining } => {
                    return Ok(TryAcquire::Held { remaining });
                }
            }
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let ttl = self.inner.caps.grant_ttl(ttl)?;
        let (lease_key, _) = self.keys(lease.key());
        let held = held_by(lease);
        let ttl_ms = millis(ttl).to_string();
        let sent_at = Instant::now();
        let limit = self.node_timeout(ttl);
        let Vote { yes, errors, .. } = self
            .vote(|inner, i| {
                let (lease_key, held, ttl_ms) = (lease_key.clone(), held.clone(), ttl_ms.clone());
                async move {
                    inner.nodes[i]
                        .eval_within::<i64>(
                            "a Redlock node",
                            limit,
                            &EXTEND,
                            &[lease_key.as_str()],
                            &[held.as_str(), ttl_ms.as_str()],
                        )
                        .await
                }
            })
            .await;
        let renewed = lease.renewed(ttl, sent_at);
        if yes >= self.inner.quorum && Instant::now() < renewed.valid_until() {
            return Ok(renewed);
        }
        if yes + errors.len() >= self.inner.quorum && !errors.is_empty() {
            // A majority may still hold it; we just cannot tell.
            return Err(self.unavailable(errors));
        }
        Err(LeaseError::lost(lease))
    }

    /// One batched script per node, all nodes at once; each lease needs its
    /// own majority, as a single extend does.
    async fn extend_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        let batch = ExtendBatch::new(&self.inner.caps, leases, |k| self.keys(k).0);
        if batch.is_empty() {
            return Ok(batch.answer(leases, |l, _| Err(LeaseError::lost(l))));
        }
        let (keys, args) = batch.refs();
        let limit = self.node_timeout(batch.longest_ttl());
        let sent_at = Instant::now();
        let answers: Vec<Result<Vec<i64>>> = self
            .round(|n| {
                let (keys, args) = (&keys, &args);
                async move {
                    n.eval_within::<Vec<i64>>("a Redlock node", limit, &EXTEND_MANY, keys, args)
                        .await
                }
            })
            .await;
        let mut errors = Vec::new();
        let mut said: Vec<Vec<i64>> = Vec::new();
        for a in answers {
            match a {
                Ok(v) if v.len() == batch.len() => said.push(v),
                Ok(v) => errors.push(LeaseError::protocol(format!(
                    "a Redlock node answered a batched extend of {} leases {} times",
                    batch.len(),
                    v.len()
                ))),
                Err(e) => errors.push(e),
            }
        }
        let quorum = self.inner.quorum;
        if said.len() < quorum {
            // No majority answered: nothing is known about any lease.
            return Err(self.unavailable(errors));
        }
        let silent = errors.len();
        let mut index = 0;
        Ok(batch.answer(leases, |lease, ttl| {
            let yes = said.iter().filter(|v| v.get(index) == Some(&1)).count();
            index += 1;
            let renewed = lease.renewed(ttl, sent_at);
            if yes >= quorum && Instant::now() < renewed.valid_until() {
                Ok(renewed)
            } else if yes + silent >= quorum && silent > 0 {
                Err(LeaseError::Unavailable {
                    message: format!(
                        "{silent} of the {} Redlock nodes did not answer; a majority may still hold the lease",
                        self.inner.nodes.len()
                    ),
                    source: None,
                })
            } else {
                Err(LeaseError::lost(lease))
            }
        }))
    }

    fn batch_limit(&self) -> usize {
        EXTEND_BATCH
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let (lease_key, _) = self.keys(lease.key());
        let owner = lease.owner().to_hex();
        let held = held_by(lease);
        let limit = self.node_timeout(lease.ttl());
        let n = self.inner.nodes.len();
        let quorum = self.inner.quorum;
        // Whether a majority released, once decided; a node task that answers
        // later reads it to decide whether its node needs a cancel.
        let (decided_tx, decided) = tokio::sync::watch::channel(None::<bool>);
        let (tx, mut rx) = tokio::sync::mpsc::channel(n);
        let mut calls = NodeCalls::new(&self.inner);
        // One copy of the names for every node's call.
        let names = Arc::new((lease_key, owner, held, lease.key().as_str().to_owned()));
        let ttl = lease.ttl();
        for i in 0..n {
            let (inner, tx, mut decided) = (Arc::clone(&self.inner), tx.clone(), decided.clone());
            let names = Arc::clone(&names);
            // Tracked: `flush` waits for a late node's answer and its cancel.
            calls.push(async move {
                let (lease_key, owner, held, key) = &*names;
                let args = [held.as_str(), inner.channel.as_str(), key.as_str()];
                let keys = [lease_key.as_str()];
                let answer = inner.nodes[i]
                    .eval_within::<i64>("a Redlock node", limit, &RELEASE, &keys, &args)
                    .await;
                let said_yes = matches!(answer, Ok(1));
                let errored = answer.is_err();
                let _ = tx.send((i, answer)).await;
                drop(tx);
                if said_yes {
                    return;
                }
                // A node that did not answer may hold our lease later (an
                // acquire queued in a frozen node). Once a majority released
                // owner and token, the lease was ours: a node that said no may
                // still hold a copy with its own token (its acquire answered
                // after the round closed, so the raise never reached it). Both
                // are cancelled by owner instead of blocking the key to its
                // TTL. A node that answered yes needs nothing more: no second
                // script on the common path.
                let released = match decided.wait_for(Option::is_some).await {
                    Ok(v) => v.unwrap_or(true),
                    // The caller went away before deciding: be safe.
                    Err(_) => true,
                };
                if errored || released {
                    inner.nodes[i]
                        .cancel_until_done(lease_key, owner, ttl, &inner.channel, key)
                        .await;
                }
            });
        }
        drop(tx);
        // Close early only on a decided outcome: a majority said yes, or a
        // majority said no. Errors and silent nodes leave it open, since a
        // node that errs may still hold the lease.
        let (mut yes, mut no) = (0, 0);
        let mut errors = Vec::new();
        while yes < quorum && no <= n - quorum {
            match calls.recv(&mut rx).await {
                Some((_, Ok(1))) => yes += 1,
                Some((_, Ok(_))) => no += 1,
                Some((_, Err(e))) => errors.push(e),
                None => break,
            }
        }
        let _ = decided_tx.send(Some(yes >= quorum));
        drop(calls);
        if yes >= quorum {
            return Ok(());
        }
        if yes + errors.len() >= quorum && !errors.is_empty() {
            return Err(self.unavailable(errors));
        }
        Err(LeaseError::not_held(lease))
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        let (lease_key, _) = self.keys(key);
        let keys = [lease_key.as_str()];
        let results = self.round(|n| n.eval::<Value>(&INSPECT, &keys, &[])).await;
        let mut held: Vec<(OwnerId, FencingToken, Duration, Option<String>)> = Vec::new();
        let mut errors = Vec::new();
        for r in results {
            match r {
                Ok(Value::Array(items)) => {
                    if let [Value::BulkString(v), Value::Int(pttl)] = items.as_slice()
                        && let Some((owner, token, holder)) =
                            std::str::from_utf8(v).ok().and_then(parse_value)
                    {
                        held.push((
                            owner,
                            token,
                            Duration::from_millis(u64::try_from(*pttl).unwrap_or(0)),
                            holder,
                        ));
                    }
                }
                Ok(_) => {}
                Err(e) => errors.push(e),
            }
        }
        if errors.len() > self.inner.nodes.len() - self.inner.quorum {
            return Err(self.unavailable(errors));
        }
        for (owner, _, _, _) in &held {
            let mut same: Vec<_> = held.iter().filter(|(o, _, _, _)| o == owner).collect();
            if same.len() >= self.inner.quorum {
                // The lease ends when fewer than a majority still hold it.
                same.sort_by_key(|s| std::cmp::Reverse(s.2));
                let remaining = same[self.inner.quorum - 1].2;
                // The lease's token is what its majority stores (equal
                // counters, or raised to the highest in a second step). A
                // node that answered the acquire after the round closed may
                // hold the same owner under its own, higher counter: it is
                // not the holder's token.
                let agreed = same.iter().map(|(_, t, _, _)| *t).find(|t| {
                    same.iter().filter(|(_, u, _, _)| u == t).count() >= self.inner.quorum
                });
                let token = agreed
                    .or_else(|| same.iter().map(|(_, t, _, _)| *t).max())
                    .unwrap_or(FencingToken(0));
                let holder = same.iter().find_map(|(_, _, _, h)| h.clone());
                return Ok(Some(LeaseInfo::new(token, remaining, Some(*owner), holder)));
            }
        }
        Ok(None)
    }

    async fn flush(&self, limit: Duration) {
        lease_api::backend::drain(&self.inner.cleanups, limit).await;
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        // Registered before the subscribers are checked (see RedisProvider::watch).
        let watch = self.inner.hub.watch(key.as_str());
        let subscribed = join_all(
            self.inner
                .nodes
                .iter()
                .map(|n| n.subscribe(&self.inner.channel, &self.inner.hub)),
        )
        .await;
        let (ok, errors): (Vec<_>, Vec<_>) = subscribed.into_iter().partition(Result::is_ok);
        if ok.is_empty() {
            return Err(self.unavailable(errors.into_iter().filter_map(Result::err).collect()));
        }
        Ok(Box::new(watch))
    }
}

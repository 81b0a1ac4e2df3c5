//! Redlock's acquire round: the vote of every node, the token of the
//! winning majority (and the raise round that keeps tokens increasing), and
//! the undo of a lost round.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use lease_api::backend::OwnerId;
use lease_api::{FencingToken, Lease, LeaseError, LeaseKey, Result};
use tokio::time::Instant;

use super::{NodeCalls, RedlockProvider};
use crate::keys::cancel_key;
use crate::scripts::{ACQUIRE, RAISE, RELEASE};
use crate::single::millis;

/// The token of a won acquire round, and whether the raise round must run.
#[derive(Debug, PartialEq, Eq)]
pub struct TokenStep {
    /// The lease's token.
    pub token: u64,
    /// Whether the raise round must bring the majority's counters up to it.
    pub raise: bool,
}

/// How many of `n` nodes make a majority: any two majorities share a node.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// The token is the highest counter among the nodes that granted the lease
/// (`won`: node index and the counter its acquire script returned). The raise
/// round brings every one of them up to it; when they all returned the same
/// counter (the steady state: healthy nodes count every acquisition alike)
/// each already is there, and has the token in its stored value, so the round
/// is skipped. Either way, once the lease is granted, every node of the
/// majority has a counter >= the token, which is what makes any later
/// majority's token larger (see the crate docs; `tests::tokens_are_monotonic_*`
/// check it over every majority sequence).
pub fn token_step(won: &[(usize, u64)]) -> TokenStep {
    let token = won.iter().map(|(_, t)| *t).max().unwrap_or(0);
    TokenStep {
        token,
        raise: won.iter().any(|(_, t)| *t != token),
    }
}

/// What one node said to an acquire.
enum Reply {
    Yes(u64),
    No(i64, String),
    Down(LeaseError),
}

/// The outcome of one acquire round.
pub(super) enum Round {
    Won(Lease),
    /// Another owner holds a majority.
    Held {
        remaining: Option<Duration>,
    },
    /// Nobody holds a majority: contenders split the nodes, or stale leases sit
    /// on a minority.
    Split {
        remaining: Option<Duration>,
        /// How long the round took, to spread retries over.
        took: Duration,
    },
}

impl RedlockProvider {
    /// After a won round, the nodes that had not answered yet: each that
    /// grants later with a token of its own gets the lease's token too
    /// (RAISE, run in the background with the round's late calls),
    /// or its copy would keep its own token, which every extend refuses, and
    /// the lease would live on the first majority alone: losing a minority
    /// of the nodes could then take it.
    fn raise_late_nodes(
        &self,
        mut late: tokio::sync::mpsc::Receiver<(usize, Reply)>,
        script_args: Arc<[String; 6]>,
        token: u64,
        limit: Duration,
    ) -> impl Future<Output = ()> + Send + 'static {
        let inner = Arc::clone(&self.inner);
        async move {
            while let Some((i, reply)) = late.recv().await {
                // A copy that already carries the lease's token (counters
                // in agreement, the steady state) needs nothing.
                if !matches!(reply, Reply::Yes(t) if t != token) {
                    continue;
                }
                // The acquire's own keys and arguments: lease, fence; owner,
                // (ttl), holder.
                let [lease_key, fence_key, _, owner_hex, _, holder] = &*script_args;
                let keys = [lease_key.as_str(), fence_key.as_str()];
                let token = token.to_string();
                let args = [owner_hex.as_str(), token.as_str(), holder.as_str()];
                let raised = inner.nodes[i]
                    .eval_within::<i64>("a Redlock node's raise", limit, &RAISE, &keys, &args)
                    .await;
                if !matches!(raised, Ok(1)) {
                    tracing::debug!(
                        node = i,
                        ?raised,
                        "a late Redlock node kept its own token; the lease lives on the others"
                    );
                }
            }
        }
    }

    /// One round of Redlock's acquire on every node (plus the raise step when a
    /// majority granted it). The round closes as soon as a majority decided:
    /// a slow or frozen node does not hold it up, and what it does later is
    /// undone in the background.
    pub(super) async fn acquire_round(&self, key: &LeaseKey, ttl: Duration) -> Result<Round> {
        let (lease_key, fence_key) = self.keys(key);
        let owner = OwnerId::random();
        let owner_hex = owner.to_hex();
        let cancel = cancel_key(&lease_key, &owner_hex);
        let n = self.inner.nodes.len();
        let quorum = self.inner.quorum;
        let limit = self.node_timeout(ttl);
        let holder = lease_api::holder();
        let sent_at = Instant::now();
        let (tx, mut rx) = tokio::sync::mpsc::channel(n);
        let mut calls = NodeCalls::new(&self.inner);
        // One copy of the script's keys and arguments for every node's call.
        let script_args = Arc::new([
            lease_key.clone(),
            fence_key.clone(),
            cancel,
            owner_hex.clone(),
            millis(ttl).to_string(),
            holder.to_string(),
        ]);
        for i in 0..n {
            let (inner, tx) = (Arc::clone(&self.inner), tx.clone());
            let script_args = Arc::clone(&script_args);
            calls.push(async move {
                let [k0, k1, k2, a0, a1, a2] = &*script_args;
                let keys = [k0.as_str(), k1.as_str(), k2.as_str()];
                let args = [a0.as_str(), a1.as_str(), a2.as_str()];
                let call = inner.nodes[i].eval_within::<(i64, i64, String)>(
                    "a Redlock node's acquire",
                    limit,
                    &ACQUIRE,
                    &keys,
                    &args,
                );
                let reply = match call.await {
                    Ok((1, token, _)) => Reply::Yes(u64::try_from(token).unwrap_or(0)),
                    Ok((_, pttl, holder)) => Reply::No(pttl, holder),
                    Err(e) => Reply::Down(e),
                };
                let _ = tx.send((i, reply)).await;
            });
        }
        drop(tx);
        let mut replies: Vec<Option<Reply>> = (0..n).map(|_| None).collect();
        let (mut yes, mut refused) = (0, 0);
        while yes < quorum && refused <= n - quorum {
            let Some((i, reply)) = calls.recv(&mut rx).await else {
                break;
            };
            match reply {
                Reply::Yes(_) => yes += 1,
                _ => refused += 1,
            }
            replies[i] = Some(reply);
        }
        // Whatever else happens, the late calls go on in the background.
        let mut calls = Some(calls);
        let won: Vec<(usize, u64)> = replies
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Some(Reply::Yes(t)) => Some((i, *t)),
                _ => None,
            })
            .collect();
        let lease = Lease::new(key.clone(), FencingToken(0), owner, ttl, sent_at);
        if won.len() >= quorum && Instant::now() < lease.valid_until() {
            let TokenStep { token, raise } = token_step(&won);
            let raised = if raise {
                drop(calls.take());
                // Step two: every node of the majority raises its counter to
                // the token while we hold the lease there, so any later
                // majority (which shares a node with this one) issues a larger
                // token.
                let token_arg = token.to_string();
                let keys = [lease_key.as_str(), fence_key.as_str()];
                let raise_args = [owner_hex.as_str(), token_arg.as_str(), &holder];
                join_all(won.iter().map(|(i, _)| {
                    self.inner.nodes[*i].eval_within::<i64>(
                        "a Redlock node's raise",
                        limit,
                        &RAISE,
                        &keys,
                        &raise_args,
                    )
                }))
                .await
                .into_iter()
                .filter(|r| matches!(r, Ok(1)))
                .count()
            } else {
                won.len()
            };
            let lease = Lease::new(key.clone(), FencingToken(token), owner, ttl, sent_at)
                .with_holder(Arc::clone(&holder));
            if raised >= quorum && Instant::now() < lease.valid_until() {
                let late = self.raise_late_nodes(rx, script_args, token, limit);
                // One background task for the late calls and their raises
                // (none when every node already answered in agreement).
                calls
                    .take()
                    .unwrap_or_else(|| NodeCalls::new(&self.inner))
                    .finish_with(late);
                return Ok(Round::Won(lease));
            }
        }
        drop(calls);
        let mut remaining: Option<Duration> = None;
        let mut holders: Vec<String> = Vec::new();
        for r in replies.iter().flatten() {
            match r {
                Reply::Down(_) => {}
                Reply::No(pttl, holder) => {
                    let pttl = *pttl;
                    if pttl >= 0 {
                        let d = Duration::from_millis(pttl.unsigned_abs());
                        remaining = Some(remaining.map_or(d, |r| r.min(d)));
                    }
                    holders.push(holder.split(':').next().unwrap_or_default().to_owned());
                }
                Reply::Yes(_) => {}
            }
        }
        let someone_has_majority = holders
            .iter()
            .any(|h| holders.iter().filter(|o| *o == h).count() >= quorum);
        // Lost the race, or too slow: undo everywhere but where a node said
        // no. Nodes that have not answered may still grant (a frozen node runs
        // its queue when it thaws), so each gets a cancel that also refuses a
        // late acquire; in the background, so the caller does not wait for them.
        // Our copies under another owner's majority free nothing: undo them
        // without an announcement, or our own subscriber would wake us to
        // lose the same round again, over and over, until that lease ends.
        // After a split or a too-slow win the undo may free the key for the
        // other contenders, so it is announced.
        let channel = if someone_has_majority {
            ""
        } else {
            self.inner.channel.as_str()
        };
        let release_args = [owner_hex.as_str(), channel, key.as_str()];
        let release_keys = [lease_key.as_str()];
        let mut undo = Vec::new();
        for (i, r) in replies.iter().enumerate() {
            match r {
                Some(Reply::No(..)) => {}
                // It answered: release there now, and cancel in the background
                // only if that fails.
                Some(Reply::Yes(_)) => undo.push(async move {
                    let released = self.inner.nodes[i]
                        .eval_within::<i64>(
                            "a Redlock node's release",
                            limit,
                            &RELEASE,
                            &release_keys,
                            &release_args,
                        )
                        .await;
                    (i, released.is_ok())
                }),
                _ => self.cancel_on(i, lease_key.clone(), owner_hex.clone(), ttl, key, channel),
            }
        }
        for (i, released) in join_all(undo).await {
            if !released {
                self.cancel_on(i, lease_key.clone(), owner_hex.clone(), ttl, key, channel);
            }
        }
        let down: Vec<LeaseError> = replies
            .into_iter()
            .flatten()
            .filter_map(|r| match r {
                Reply::Down(e) => Some(e),
                _ => None,
            })
            .collect();
        if down.len() > n - quorum {
            return Err(self.unavailable(down));
        }
        if someone_has_majority {
            Ok(Round::Held { remaining })
        } else {
            Ok(Round::Split {
                remaining,
                took: sent_at.elapsed(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{TokenStep, quorum, token_step};
    use std::collections::HashSet;

    /// What one acquire round can do to the nodes' fence counters, mirroring
    /// the scripts: ACQUIRE increments the counter of every node it runs on
    /// (those that granted in time, late ones and ones later undone alike);
    /// RAISE sets a counter to at least the token. The round issues its token
    /// only when `token_step` says no raise is needed and a majority granted,
    /// or when the raise succeeded on a majority.
    fn subsets(of: &[usize]) -> Vec<Vec<usize>> {
        (0..1u32 << of.len())
            .map(|m| {
                of.iter()
                    .enumerate()
                    .filter(|(b, _)| m & (1 << b) != 0)
                    .map(|(_, i)| *i)
                    .collect()
            })
            .collect()
    }

    /// Every sequence of up to `depth` rounds on `n` nodes: which nodes grant
    /// (any subset, a majority or not), which other nodes run the acquire late,
    /// on which granting nodes the raise succeeds, and whether the round ends in
    /// time. Checks that every issued token is larger than every token issued
    /// before it. States are kept relative to the last issued token, so equal
    /// situations are explored once. Returns how many states were explored.
    fn explore(n: usize, depth: usize, step: fn(&[(usize, u64)]) -> TokenStep) -> usize {
        let quorum = quorum(n);
        let all: Vec<usize> = (0..n).collect();
        // Counters, and the last issued token (0: none yet).
        let mut frontier: Vec<(Vec<u64>, u64)> = vec![(vec![0; n], 0)];
        let mut seen: HashSet<Vec<i64>> = HashSet::new();
        let norm = |c: &[u64], last: u64| -> Vec<i64> {
            c.iter().map(|&x| x as i64 - last as i64).collect()
        };
        for _ in 0..depth {
            let mut next = Vec::new();
            for (counters, last) in &frontier {
                for granted in subsets(&all) {
                    let rest: Vec<usize> = all
                        .iter()
                        .copied()
                        .filter(|i| !granted.contains(i))
                        .collect();
                    for late in subsets(&rest) {
                        let mut c = counters.clone();
                        let won: Vec<(usize, u64)> = granted
                            .iter()
                            .map(|&i| {
                                c[i] += 1;
                                (i, c[i])
                            })
                            .collect();
                        for &i in &late {
                            c[i] += 1;
                        }
                        let TokenStep { token, raise } = step(&won);
                        let raise_sets = if raise {
                            subsets(&granted)
                        } else {
                            vec![Vec::new()]
                        };
                        for raised in raise_sets {
                            let mut c = c.clone();
                            for &i in &raised {
                                c[i] = c[i].max(token);
                            }
                            let granted_enough = if raise {
                                raised.len() >= quorum
                            } else {
                                granted.len() >= quorum
                            };
                            for in_time in [true, false] {
                                let mut last = *last;
                                if granted_enough && in_time {
                                    assert!(
                                        token > last,
                                        "token {token} issued after {last}: counters {counters:?}, \
                                         granted {granted:?}, late {late:?}, raised {raised:?}"
                                    );
                                    last = token;
                                }
                                if seen.insert(norm(&c, last)) {
                                    next.push((c.clone(), last));
                                }
                            }
                        }
                    }
                }
            }
            frontier = next;
        }
        seen.len()
    }

    #[test]
    fn tokens_are_monotonic_over_every_majority_sequence_on_3_nodes() {
        let states = explore(3, 8, token_step);
        assert!(states > 100, "explored only {states} states");
    }

    #[test]
    fn tokens_are_monotonic_over_every_majority_sequence_on_5_nodes() {
        let states = explore(5, 4, token_step);
        assert!(states > 100, "explored only {states} states");
    }

    /// The check has teeth: without the raise round, some sequence issues a
    /// token that is not larger than an earlier one.
    #[test]
    fn skipping_every_raise_breaks_monotonicity() {
        let never_raise = |won: &[(usize, u64)]| TokenStep {
            token: won.iter().map(|(_, t)| *t).max().unwrap_or(0),
            raise: false,
        };
        let broke = std::panic::catch_unwind(|| explore(3, 4, never_raise));
        assert!(broke.is_err(), "no sequence broke monotonicity");
    }

    #[test]
    fn agreeing_counters_skip_the_raise_and_disagreeing_ones_do_not() {
        assert_eq!(
            token_step(&[(0, 7), (2, 7)]),
            TokenStep {
                token: 7,
                raise: false
            }
        );
        assert_eq!(
            token_step(&[(0, 7), (1, 5), (2, 7)]),
            TokenStep {
                token: 7,
                raise: true
            }
        );
    }
}

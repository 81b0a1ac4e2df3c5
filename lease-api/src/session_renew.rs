//! The renewal loop of a lease session: batched renewals, lost signals by
//! local validity, and abandoning a store-side session.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use tokio::time::{Instant, sleep_until};

use crate::held::{Shared, lock};
use crate::session_config::Timing;
use crate::session_state::Inner;
use crate::time::deadline_after;
use crate::{Lease, LostReason, Result, SessionConfig};

/// Fires every lease of the session when the renewal loop ends for a reason
/// other than being stopped (a panic, a runtime shutting down).
pub(crate) struct FireUnlessStopped(Arc<Inner>);

impl Drop for FireUnlessStopped {
    fn drop(&mut self) {
        if !self.0.stop.is_cancelled() {
            for (_, shared) in lock(&self.0.leases).drain() {
                shared.fire(LostReason::Expired(
                    "the session's renewal task ended without being stopped".into(),
                ));
            }
        }
    }
}

pub(crate) async fn renew_loop(inner: Arc<Inner>, config: SessionConfig) {
    let _fire = FireUnlessStopped(Arc::clone(&inner));
    // Derived from the shortest validity window of any lease added so far
    // (a ZooKeeper session or a slow Redlock acquire shortens it).
    let mut timing: Option<Timing> = None;
    let backend = inner.provider.capabilities().backend;
    let limit = inner.store.batch_limit().max(1);
    // With no lease held, sleep until one is added.
    let mut next_round: Option<Instant> = None;
    loop {
        let wake = async {
            match next_round {
                Some(at) => sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = inner.stop.cancelled() => return,
            _ = inner.added.notified() => {
                let Some(added) = lock(&inner.pending).take() else {
                    continue;
                };
                let t = match timing {
                    Some(t) if t.window <= added.window => t,
                    _ => Timing::new(added.window, &config),
                };
                timing = Some(t);
                // Renew the new leases within a period, and never after
                // their own fire time (at once if it already passed).
                let due = (Instant::now() + t.renew_every).min(t.fire_at_of(added.earliest_valid_until));
                next_round = Some(next_round.map_or(due, |n| n.min(due)));
                continue;
            }
            () = wake => {}
        }
        let Some(t) = timing else {
            next_round = None;
            continue;
        };
        inner.rounds.fetch_add(1, Ordering::Relaxed);
        let round_started = Instant::now();
        let held: Vec<(u64, Arc<Shared>)> = lock(&inner.leases)
            .iter()
            .map(|(id, s)| (*id, Arc::clone(s)))
            .collect();
        // The round may not outlast the earliest fire time: a store that
        // hangs must not hold a lost signal back (C11).
        let round_deadline = held
            .iter()
            .map(|(_, s)| t.fire_at(&lock(&s.lease)))
            .min()
            .unwrap_or(round_started);
        let failed = Mutex::new(false);
        let round = futures_util::stream::iter(held.chunks(limit)).for_each_concurrent(
            inner.parallel,
            |chunk| {
                let inner = &inner;
                let failed = &failed;
                async move {
                    let leases: Vec<Lease> =
                        chunk.iter().map(|(_, s)| lock(&s.lease).clone()).collect();
                    inner.renew_calls.fetch_add(1, Ordering::Relaxed);
                    apply_renewal(
                        inner,
                        backend,
                        chunk,
                        inner.store.renew(&leases).await,
                        failed,
                    );
                }
            },
        );
        if tokio::time::timeout_at(round_deadline, round)
            .await
            .is_err()
        {
            tracing::warn!(
                leases = held.len(),
                "a session renewal round ran into the first lease's fire time; firing by validity"
            );
            *lock(&failed) = true;
        }
        drop(held);
        // Fire every lease whose validity runs out, and find when the next
        // round must run: the period after this round, sooner after a failure,
        // and never after a lease's fire time.
        let now = Instant::now();
        let failed = *lock(&failed);
        let mut next = if failed {
            deadline_after(now, t.retry_every)
        } else {
            deadline_after(round_started, t.renew_every)
        };
        let mut any = false;
        let mut expired = 0usize;
        lock(&inner.leases).retain(|_, shared| {
            let fire_at = t.fire_at(&lock(&shared.lease));
            if now >= fire_at {
                let last = lock(&shared.last_error).take();
                crate::record::record_lost(backend, "expired");
                inner.lost.fetch_add(1, Ordering::Relaxed);
                shared.fire(LostReason::Expired(last.unwrap_or_else(|| {
                    "the store did not answer before local validity ended".to_string()
                })));
                expired += 1;
                return false;
            }
            if shared.lost.is_cancelled() {
                return false;
            }
            next = next.min(fire_at);
            any = true;
            true
        });
        if expired > 0 && inner.store.tied_to_session() {
            abandon(&inner, backend).await;
            any = false;
        }
        next_round = any.then_some(next);
    }
}

/// Applies one batch's answers: renewed leases take their new validity, a
/// lease the store says is gone fires alone, errors are kept for the reason.
fn apply_renewal(
    inner: &Inner,
    backend: &'static str,
    chunk: &[(u64, Arc<Shared>)],
    answer: Result<Vec<Result<Lease>>>,
    failed: &Mutex<bool>,
) {
    match answer {
        Ok(results) if results.len() == chunk.len() => {
            for ((id, shared), result) in chunk.iter().zip(results) {
                match result {
                    Ok(renewed) => {
                        crate::record::record_renewal(backend, true);
                        *lock(&shared.lease) = renewed;
                    }
                    // Not for a lease released meanwhile, which left the
                    // table first.
                    Err(e) if e.is_not_held() => {
                        if lock(&inner.leases).remove(id).is_some() {
                            crate::record::record_lost(backend, "revoked");
                            inner.lost.fetch_add(1, Ordering::Relaxed);
                            shared.fire(LostReason::Revoked);
                        }
                    }
                    Err(e) => {
                        crate::record::record_renewal(backend, false);
                        *lock(failed) = true;
                        lock(&shared.last_error).replace(e.to_string());
                    }
                }
            }
        }
        Ok(results) => {
            *lock(failed) = true;
            tracing::warn!(
                sent = chunk.len(),
                answers = results.len(),
                "a session renewal answered for the wrong number of leases"
            );
        }
        Err(e) => {
            crate::record::record_renewal(backend, false);
            tracing::warn!(leases = chunk.len(), error = %e, "session renewal failed; retrying until local validity ends");
            *lock(failed) = true;
            let text = e.to_string();
            for (_, shared) in chunk {
                lock(&shared.last_error).replace(text.clone());
            }
        }
    }
}

/// A lease of a store-side session (an etcd lease, a ZooKeeper session) ran
/// out of local validity: the whole store session is in doubt, and its keys
/// must not outlive the leases that were told they are lost. Every lease of
/// the session fires, and the store ends its session (an etcd revoke, a
/// ZooKeeper session close); later acquires start a new one.
async fn abandon(inner: &Inner, backend: &'static str) {
    let rest: Vec<Arc<Shared>> = lock(&inner.leases).drain().map(|(_, s)| s).collect();
    for shared in rest {
        crate::record::record_lost(backend, "expired");
        inner.lost.fetch_add(1, Ordering::Relaxed);
        shared.fire(LostReason::Expired(
            "the store session was abandoned after another of its leases ran out of validity"
                .into(),
        ));
    }
    inner.store.abandon().await;
}

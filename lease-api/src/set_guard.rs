//! `LeaseSetGuard`: keeps a set of leases alive together and loses them
//! together (C18 with C11).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::held::{LostReason, lock};
use crate::time::deadline_after;
use crate::{FencingToken, Lease, LeaseError, LeaseProvider, Result};

/// What the renewal task and the guard share.
#[derive(Debug)]
struct SetState {
    leases: Mutex<Vec<Lease>>,
    reason: Mutex<Option<LostReason>>,
    lost: CancellationToken,
}

impl SetState {
    fn fire(&self, reason: LostReason) {
        lock(&self.reason).get_or_insert(reason);
        self.lost.cancel();
    }
}

/// Holds a set of leases from [`acquire_all`](crate::acquire_all): renews
/// them together in one [`LeaseProvider::extend_many`] call (one store round
/// trip on batching backends) and loses them together (C18).
///
/// When the store says any lease of the set is no longer held, the lost
/// signal fires for the whole set and the other leases are given back: a job
/// that needs every key stops as soon as one is gone. When renewals fail,
/// the signal fires before the earliest local validity of the set, by the
/// same margin as a [`LeaseGuard`](crate::LeaseGuard). Dropping the guard
/// releases the set.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use lease_api::{acquire_all, AcquireOptions, LeaseKey, LeaseProvider, LeaseSetGuard, MemoryProvider};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lease_api::Result<()> {
/// let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
/// let keys = [LeaseKey::new("file/a")?, LeaseKey::new("file/b")?];
/// let options = AcquireOptions::ttl(Duration::from_secs(10));
/// let leases = acquire_all(&provider, &keys, options).await?.expect("both free");
/// let guard = LeaseSetGuard::new(Arc::clone(&provider), leases);
/// tokio::select! {
///     reason = guard.lost() => eprintln!("a key of the set was lost ({reason}); stop"),
///     _ = async { /* work with guard.tokens() */ } => {}
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LeaseSetGuard {
    provider: Arc<dyn LeaseProvider>,
    state: Arc<SetState>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    released: bool,
}

impl LeaseSetGuard {
    /// Starts renewing `leases` together: every third of the shortest TTL,
    /// with retries every tenth of it, until [`release`](Self::release) or
    /// the drop.
    pub fn new(provider: Arc<dyn LeaseProvider>, leases: Vec<Lease>) -> Self {
        let window = leases
            .iter()
            .map(|l| l.valid_until().saturating_duration_since(l.sent_at()))
            .min()
            .unwrap_or(Duration::ZERO);
        let lost_margin = (window / 10).min(Duration::from_secs(1)).min(window / 2);
        let timing = Timing {
            renew_every: (window / 3)
                .min(window.saturating_sub(lost_margin) / 2)
                .max(Duration::from_millis(1)),
            retry_every: (window / 10).clamp(Duration::from_millis(10), Duration::from_secs(1)),
            lost_margin,
        };
        let state = Arc::new(SetState {
            leases: Mutex::new(leases),
            reason: Mutex::new(None),
            lost: CancellationToken::new(),
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn(renew_set(
            Arc::clone(&provider),
            Arc::clone(&state),
            stop.clone(),
            timing,
        ));
        LeaseSetGuard {
            provider,
            state,
            stop,
            task: Some(task),
            released: false,
        }
    }

    /// The leases as last renewed, in the order they were acquired.
    pub fn leases(&self) -> Vec<Lease> {
        lock(&self.state.leases).clone()
    }

    /// Each key's fencing token, in the order of [`leases`](Self::leases).
    pub fn tokens(&self) -> Vec<FencingToken> {
        lock(&self.state.leases).iter().map(Lease::token).collect()
    }

    /// Until when every lease of the set is surely held: the earliest local
    /// validity of the set, as last renewed.
    pub fn valid_until(&self) -> Instant {
        lock(&self.state.leases)
            .iter()
            .map(Lease::valid_until)
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// Resolves when the set is lost: one of its leases was lost, or renewal
    /// failed until local validity was about to end.
    pub async fn lost(&self) -> LostReason {
        self.state.lost.cancelled().await;
        self.lost_reason()
            .unwrap_or_else(|| LostReason::Expired("unknown".into()))
    }

    /// The lost signal as a token to select on or hand to a job.
    pub fn lost_token(&self) -> CancellationToken {
        self.state.lost.clone()
    }

    /// Whether the set is lost.
    pub fn is_lost(&self) -> bool {
        self.state.lost.is_cancelled()
    }

    /// Why the set was lost, once it is.
    pub fn lost_reason(&self) -> Option<LostReason> {
        lock(&self.state.reason).clone()
    }

    /// Stops renewing and gives every lease back.
    ///
    /// # Errors
    /// The first lease's release error; every lease is released regardless.
    pub async fn release(mut self) -> Result<()> {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.released = true;
        let leases = self.leases();
        crate::release_all(&*self.provider, &leases).await
    }
}

impl LeaseSetGuard {
    /// Stops renewing without releasing: the leases run out by their TTL
    /// (for a job whose processes may outlive the guard). Returns them as
    /// last renewed.
    pub async fn detach(mut self) -> Vec<Lease> {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.released = true;
        self.leases()
    }
}

impl Drop for LeaseSetGuard {
    fn drop(&mut self) {
        self.stop.cancel();
        // A lost set was given back by the renewal task, or ran out.
        if self.released || self.is_lost() {
            return;
        }
        let leases = self.leases();
        let provider = Arc::clone(&self.provider);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(e) = crate::release_all(&*provider, &leases).await {
                        tracing::debug!(error = %e, "best-effort release of a lease set on drop failed");
                    }
                });
            }
            Err(_) => tracing::warn!(
                keys = leases.len(),
                "lease set guard dropped outside a tokio runtime; its leases run out by their TTL"
            ),
        }
    }
}

#[derive(Clone, Copy)]
struct Timing {
    renew_every: Duration,
    retry_every: Duration,
    lost_margin: Duration,
}

/// Fires the signal if the renewal task ends (a panic, a runtime going
/// away) without being stopped.
struct FireUnlessStopped {
    state: Arc<SetState>,
    stop: CancellationToken,
}

impl Drop for FireUnlessStopped {
    fn drop(&mut self) {
        if !self.stop.is_cancelled() {
            self.state.fire(LostReason::Expired(
                "the renewal task ended without being stopped".into(),
            ));
        }
    }
}

/// Gives back what is left of a lost set: the leases whose renewals still
/// went through would otherwise keep their keys for up to another TTL after
/// the job stopped. Each release compares owner and token, so a key taken
/// over meanwhile is left alone.
async fn give_back(provider: &dyn LeaseProvider, leases: &[Lease]) {
    if let Err(e) = crate::release_all(provider, leases).await {
        tracing::debug!(error = %e, "could not give back the rest of a lost lease set");
    }
}

async fn renew_set(
    provider: Arc<dyn LeaseProvider>,
    state: Arc<SetState>,
    stop: CancellationToken,
    timing: Timing,
) {
    let _fire = FireUnlessStopped {
        state: Arc::clone(&state),
        stop: stop.clone(),
    };
    let backend = provider.capabilities().backend;
    // The set is as good as its weakest lease.
    let fire_at = |leases: &[Lease]| {
        leases
            .iter()
            .map(|l| {
                l.valid_until()
                    .checked_sub(timing.lost_margin)
                    .unwrap_or_else(|| l.valid_until())
            })
            .min()
            .unwrap_or_else(Instant::now)
    };
    let sent_at = |leases: &[Lease]| leases.iter().map(Lease::sent_at).min();
    let fire = |reason: LostReason| {
        let label = match &reason {
            LostReason::Revoked => "revoked",
            _ => "expired",
        };
        crate::record::record_lost(backend, label);
        state.fire(reason);
    };
    loop {
        let (first_sent, deadline) = {
            let l = lock(&state.leases);
            (sent_at(&l).unwrap_or_else(Instant::now), fire_at(&l))
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = sleep_until(deadline_after(first_sent, timing.renew_every).min(deadline)) => {}
        }
        let mut last_error: Option<LeaseError> = None;
        loop {
            let current = lock(&state.leases).clone();
            let deadline = fire_at(&current);
            let expired = |e: Option<LeaseError>| {
                LostReason::Expired(e.map_or_else(
                    || "the store did not answer before local validity ended".to_string(),
                    |e| e.to_string(),
                ))
            };
            if Instant::now() >= deadline {
                fire(expired(last_error));
                give_back(&*provider, &current).await;
                return;
            }
            let answers = tokio::select! {
                _ = stop.cancelled() => return,
                _ = sleep_until(deadline) => {
                    fire(expired(last_error));
                    give_back(&*provider, &current).await;
                    return;
                }
                answers = provider.extend_many(&current) => answers,
            };
            let mut renewed = current.clone();
            let mut all_renewed = true;
            match answers {
                Ok(answers) if answers.len() == current.len() => {
                    let mut lost = vec![false; current.len()];
                    for (i, answer) in answers.into_iter().enumerate() {
                        match answer {
                            Ok(lease) => renewed[i] = lease,
                            Err(e) if e.is_not_held() => lost[i] = true,
                            Err(e) => {
                                all_renewed = false;
                                last_error = Some(e);
                            }
                        }
                    }
                    if lost.iter().any(|&l| l) {
                        *lock(&state.leases) = renewed.clone();
                        fire(LostReason::Revoked);
                        // The rest of the set is no use without the lost key.
                        let rest: Vec<Lease> = renewed
                            .into_iter()
                            .zip(lost)
                            .filter(|(_, lost)| !lost)
                            .map(|(lease, _)| lease)
                            .collect();
                        give_back(&*provider, &rest).await;
                        return;
                    }
                }
                Ok(answers) => {
                    all_renewed = false;
                    last_error = Some(LeaseError::protocol(format!(
                        "extend_many answered {} of {} leases",
                        answers.len(),
                        current.len()
                    )));
                }
                Err(e) => {
                    all_renewed = false;
                    last_error = Some(e);
                }
            }
            *lock(&state.leases) = renewed;
            crate::record::record_renewal(backend, all_renewed);
            if all_renewed {
                break;
            }
            if let Some(e) = &last_error {
                tracing::warn!(error = %e, "lease set renewal failed; retrying until local validity ends");
            }
            let retry_at = deadline_after(Instant::now(), timing.retry_every).min(deadline);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = sleep_until(retry_at) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use async_trait::async_trait;

    use super::*;
    use crate::{Capabilities, LeaseInfo, LeaseKey, MemoryProvider, TryAcquire, TryAcquireAll};

    /// Memory, except that the extends of key "b" fail (the store did not
    /// answer for it) once `failing` is set; extend_many runs per lease.
    #[derive(Debug, Default)]
    struct PartlyFailing {
        memory: MemoryProvider,
        failing: AtomicBool,
    }

    #[async_trait]
    impl LeaseProvider for PartlyFailing {
        fn capabilities(&self) -> &Capabilities {
            self.memory.capabilities()
        }
        fn namespace(&self) -> &str {
            self.memory.namespace()
        }
        async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
            self.memory.try_acquire(key, ttl).await
        }
        async fn try_acquire_all(&self, keys: &[LeaseKey], ttl: Duration) -> Result<TryAcquireAll> {
            self.memory.try_acquire_all(keys, ttl).await
        }
        async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
            if self.failing.load(Ordering::SeqCst) && lease.key().as_str() == "b" {
                return Err(LeaseError::timeout("extend", ttl));
            }
            self.memory.extend(lease, ttl).await
        }
        async fn release(&self, lease: &Lease) -> Result<()> {
            self.memory.release(lease).await
        }
        async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
            self.memory.inspect(key).await
        }
    }

    /// One key's renewals fail while the other's go through: the set is lost
    /// before the failing key's validity ends, and the key that was still
    /// being renewed is given back then, not a TTL later.
    #[tokio::test(start_paused = true)]
    async fn a_set_lost_by_failing_renewals_gives_back_the_keys_still_renewed() {
        let p = Arc::new(PartlyFailing::default());
        let keys = [LeaseKey::new("a").unwrap(), LeaseKey::new("b").unwrap()];
        let ttl = Duration::from_secs(3);
        let leases = p
            .try_acquire_all(&keys, ttl)
            .await
            .unwrap()
            .into_leases()
            .unwrap();
        let b_valid = leases[1].valid_until();
        let guard = LeaseSetGuard::new(Arc::clone(&p) as Arc<dyn LeaseProvider>, leases);
        p.failing.store(true, Ordering::SeqCst);
        let reason = guard.lost().await;
        assert!(matches!(reason, LostReason::Expired(_)), "{reason:?}");
        assert!(Instant::now() < b_valid, "fired at or after b's validity");
        // "a" was renewed moments ago; it must be free at once, long before its TTL.
        let given_back_by = Instant::now() + Duration::from_millis(100);
        while p.inspect(&keys[0]).await.unwrap().is_some() {
            assert!(
                Instant::now() < given_back_by,
                "the renewed key was kept after the set was lost"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(guard);
    }
}

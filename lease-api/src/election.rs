//! Leader election over any provider: campaign, observe, resign.

use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;

use crate::wait::watch_or_fallback;
use crate::{
    AcquireOptions, FencingToken, LeaseGuard, LeaseKey, LeaseProvider, LostReason, Result, acquire,
};

/// Who leads, as the store says: the leader's label and fencing token.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's holder label (`user@host:pid` unless set with
    /// [`set_holder`](crate::set_holder)), where the store recorded one.
    pub holder: Option<String>,
    /// The leadership's fencing token: each new term's is greater.
    pub token: FencingToken,
}

/// Leader election on one key of any [`LeaseProvider`], after etcd's
/// `concurrency.Election` and client-go's `leaderelection`: the leader is the
/// holder of the election's lease.
///
/// - [`campaign`](Self::campaign) waits until this process leads and returns
///   a [`Leadership`]: a renewed lease with its fencing token and lost
///   signal.
/// - [`observe`](Self::observe) is a stream of leader changes for followers.
/// - [`Leadership::resign`] hands leadership on at once: the release wakes
///   the waiting campaigners by the store's notification.
/// - [`run`](Self::run) is the callback form: started, stopped, new leader.
///
/// A leader that is paused past its TTL loses leadership without knowing;
/// the next leader's token is greater, so a resource that checks tokens
/// ([`FenceGate`](crate::FenceGate)) refuses the old leader's late writes.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lease_api::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use lease_api::MemoryProvider;
/// use lease_api::recipes::Election;
///
/// let provider = Arc::new(MemoryProvider::new());
/// let election = Election::new(provider, "scheduler", Duration::from_secs(10))?;
/// let leadership = election.campaign().await?;
/// let leader = election.leader().await?.expect("someone leads");
/// assert_eq!(leader.token, leadership.token());
/// leadership.resign().await?;
/// assert!(election.leader().await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Election {
    provider: Arc<dyn LeaseProvider>,
    key: LeaseKey,
    ttl: Duration,
}

/// What tells two terms apart in [`Election::observe`]: the token, and
/// the owner id and label where the store keeps them. The token alone is not
/// enough: a store that lost its token counter (a Redis restarted without
/// persistence) can hand a new leader a token an observer has already seen.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Term {
    token: FencingToken,
    owner: Option<crate::backend::OwnerId>,
    holder: Option<String>,
}

impl Term {
    fn of(info: &crate::LeaseInfo) -> Self {
        Term {
            token: info.token,
            owner: info.owner,
            holder: info.holder.clone(),
        }
    }
}

/// This process's term as leader: a lease renewed in the background.
#[derive(Debug)]
pub struct Leadership {
    guard: LeaseGuard,
}

impl Leadership {
    /// The term's fencing token: pass it with every write the leader makes.
    pub fn token(&self) -> FencingToken {
        self.guard.token()
    }

    /// Resolves when leadership is lost (the lease expired or was taken
    /// over); select on it while leading.
    pub async fn lost(&self) -> LostReason {
        self.guard.lost().await
    }

    /// True once leadership is lost.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// The lease behind the term, with its guard.
    pub fn guard(&self) -> &LeaseGuard {
        &self.guard
    }

    /// Steps down at once: releases the lease, which wakes the followers
    /// campaigning for it.
    ///
    /// # Errors
    /// As [`LeaseGuard::release`]: `NotHeld` when leadership was lost.
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }
}

/// What [`Election::run`] calls.
#[allow(clippy::type_complexity)]
pub struct Callbacks {
    /// Called with the new term when this process becomes leader; the
    /// future runs while it leads and is dropped when leadership is lost.
    /// When it returns, the process resigns.
    pub on_started_leading: Box<
        dyn FnMut(FencingToken) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
            + Send,
    >,
    /// Called when a term of this process ends while [`Election::run`] runs
    /// (lost, finished, or stopped); not when `run`'s future is dropped.
    pub on_stopped_leading: Box<dyn FnMut() + Send>,
    /// Called with every leader change this process observes (itself
    /// included); `None` while nobody leads.
    pub on_new_leader: Box<dyn FnMut(Option<Leader>) + Send>,
}

impl Election {
    /// An election named `name` (the lease's key) in `provider`'s namespace,
    /// whose terms are leases of `ttl`, renewed while leading.
    ///
    /// # Errors
    /// `InvalidKey` for a name that is not a valid key; `InvalidTtl` for a
    /// TTL the provider refuses.
    pub fn new(provider: Arc<dyn LeaseProvider>, name: &str, ttl: Duration) -> Result<Self> {
        let key = LeaseKey::new(name)?;
        provider.capabilities().grant_ttl(ttl)?;
        Ok(Election { provider, key, ttl })
    }

    /// The election's key.
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }

    /// Waits until this process leads. Dropping the future leaks no term.
    ///
    /// # Errors
    /// A store error a retry cannot fix (see [`acquire`]).
    pub async fn campaign(&self) -> Result<Leadership> {
        loop {
            if let Some(l) = self.campaign_for(Duration::MAX).await? {
                return Ok(l);
            }
        }
    }

    /// Campaigns for up to `wait`; `None` when someone else still leads then.
    ///
    /// # Errors
    /// As [`campaign`](Self::campaign), and a store unavailable past `wait`.
    pub async fn campaign_for(&self, wait: Duration) -> Result<Option<Leadership>> {
        let got = acquire(
            &self.provider,
            &self.key,
            AcquireOptions::ttl(self.ttl).wait(wait),
        )
        .await?;
        Ok(got.map(|lease| Leadership {
            guard: LeaseGuard::new(Arc::clone(&self.provider), lease),
        }))
    }

    /// The current leader, if any.
    ///
    /// # Errors
    /// As [`LeaseProvider::inspect`].
    pub async fn leader(&self) -> Result<Option<Leader>> {
        Ok(self.provider.inspect(&self.key).await?.map(|i| Leader {
            holder: i.holder,
            token: i.token,
        }))
    }

    /// A stream of leader changes: the current leader first, then each
    /// change (`None` while nobody leads). A release or expiry wakes it by
    /// the store's notification; a new term after a vacancy is seen within
    /// a tenth of the TTL, at most 100 ms (stores announce releases, not
    /// acquisitions, so a vacancy is polled). Where the provider's watch is
    /// lazy ([`LeaseProvider::watch_is_lazy`]: it waits for the key to be
    /// free, from when it starts waiting: PostgreSQL's advisory mode), a
    /// handover from one leader to the next just before that is no release
    /// it can see: there the stream also looks again every tenth of the TTL,
    /// between 1 s and 5 s, so a new term is reported while it lasts. (On
    /// PostgreSQL each such look ends a lock wait by `lock_timeout`, which
    /// the server logs as an error at default log settings.)
    /// Terms that start and end between two looks are skipped; the tokens
    /// show it. On Redlock a look reads every node, not one atomic state:
    /// under contention it may report an acquisition still in flight (one
    /// that then gives up), so there the stream is neither complete nor
    /// ordered; use a single-store backend for followers that must see each
    /// term. A store error is yielded and the stream goes on.
    pub fn observe(&self) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
        let this = self.clone();
        let vacancy_poll =
            (self.ttl / 10).clamp(Duration::from_millis(5), Duration::from_millis(100));
        // A lazy watch (PostgreSQL's lock queue) starts waiting for the key
        // to be free after the look: a handover in between leaves it waiting
        // for the new leader's end. Look again this often there.
        let relook = self
            .provider
            .watch_is_lazy()
            .then(|| (self.ttl / 10).clamp(Duration::from_secs(1), Duration::from_secs(5)));
        futures_util::stream::unfold(
            (this, None::<Option<Term>>, Duration::from_millis(100)),
            move |(this, last, mut watch_retry)| async move {
                loop {
                    // While a leader was last seen: watch first, then look,
                    // so a release in between is not missed. A vacancy is
                    // polled instead (stores announce no acquisitions).
                    let mut watch = match last {
                        Some(Some(_)) => Some(
                            watch_or_fallback(&this.provider, &this.key, &mut watch_retry).await,
                        ),
                        _ => None,
                    };
                    let info = match this.provider.inspect(&this.key).await {
                        Ok(i) => i,
                        Err(e) => {
                            tokio::time::sleep(vacancy_poll).await;
                            return Some((Err(e), (this, last, watch_retry)));
                        }
                    };
                    let now = info.as_ref().map(Term::of);
                    if last.as_ref() != Some(&now) {
                        let leader = info.map(|i| Leader {
                            holder: i.holder,
                            token: i.token,
                        });
                        return Some((Ok(leader), (this, Some(now), watch_retry)));
                    }
                    match (info, watch.as_mut()) {
                        (Some(i), Some(w)) => {
                            let until_expiry = i.remaining.saturating_add(Duration::from_millis(1));
                            w.changed(relook.map_or(until_expiry, |r| r.min(until_expiry)))
                                .await
                        }
                        _ => tokio::time::sleep(vacancy_poll).await,
                    }
                }
            },
        )
    }

    /// Runs for leadership until `stop` is cancelled, in client-go's style:
    /// campaigns, calls `on_started_leading` and keeps leading while its
    /// future runs, calls `on_stopped_leading` when the term ends (lost,
    /// finished, or stopped; a stopped term resigns), and campaigns again.
    /// `on_new_leader` hears every change the whole time.
    ///
    /// # Errors
    /// A store error a retry cannot fix.
    pub async fn run(
        &self,
        stop: tokio_util::sync::CancellationToken,
        mut callbacks: Callbacks,
    ) -> Result<()> {
        use futures_util::StreamExt;
        let mut on_new_leader = std::mem::replace(&mut callbacks.on_new_leader, Box::new(|_| {}));
        let observer = {
            let stream = self.observe();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        next = stream.next() => match next {
                            Some(Ok(leader)) => on_new_leader(leader),
                            Some(Err(_)) => {}
                            None => return,
                        },
                    }
                }
            })
        };
        let _observer = tokio_util::task::AbortOnDropHandle::new(observer);
        loop {
            let leadership = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                l = self.campaign() => l?,
            };
            if stop.is_cancelled() {
                // Stopped while the campaign won: hand the term on unused.
                let _ = leadership.resign().await;
                return Ok(());
            }
            let work = (callbacks.on_started_leading)(leadership.token());
            tokio::select! {
                _ = work => {}
                _ = leadership.lost() => {}
                _ = stop.cancelled() => {}
            }
            (callbacks.on_stopped_leading)();
            // Also after a lost term: renewals may have failed while the
            // store still holds the lease, and the store compares owner and
            // token, so at worst this is NotHeld.
            let lease = leadership.guard().lease();
            if let Err(e) = self.provider.release(&lease).await
                && !e.is_not_held()
            {
                tracing::debug!(key = %self.key, error = %e, "could not release the term");
            }
            drop(leadership);
            if stop.is_cancelled() {
                return Ok(());
            }
        }
    }
}

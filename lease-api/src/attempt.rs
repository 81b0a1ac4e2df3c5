//! One acquire attempt in a task of its own: when the caller stops
//! listening (its future was dropped), whatever the attempt won is given
//! back instead of leaking until its TTL. Shared by every waiting helper.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::provider::LeaseProvider;
use crate::{Lease, LeaseError, Result, TryAcquire, TryAcquireAll};

/// What an attempt may have won: the leases to give back when nobody takes
/// the answer.
pub(crate) trait Won: Send + 'static {
    fn won(&self) -> Vec<Lease>;
}

impl Won for TryAcquire {
    fn won(&self) -> Vec<Lease> {
        match self {
            TryAcquire::Acquired(l) => vec![l.clone()],
            TryAcquire::Held { .. } => Vec::new(),
        }
    }
}

impl Won for TryAcquireAll {
    fn won(&self) -> Vec<Lease> {
        match self {
            TryAcquireAll::Acquired(l) => l.clone(),
            TryAcquireAll::Held { .. } => Vec::new(),
        }
    }
}

/// More to undo when nobody listened, after the give-back (a waiting
/// writer's record).
pub(crate) type Unheard<P> =
    Box<dyn FnOnce(Arc<P>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

async fn give_back<P: LeaseProvider + ?Sized>(provider: &P, leases: &[Lease]) {
    for lease in leases {
        if let Err(e) = provider.release(lease).await {
            tracing::warn!(key = %lease.key(), error = %e, "could not release the lease of a dropped acquire");
        }
    }
}

/// Runs `attempt` in its own task and returns its answer. If this future is
/// dropped first, the task gives back what the attempt won (then runs
/// `unheard`); an answer that arrived but was not taken is given back too.
pub(crate) async fn in_own_task<P, T, F>(
    provider: &Arc<P>,
    attempt: F,
    unheard: Option<Unheard<P>>,
) -> Result<T>
where
    P: LeaseProvider + ?Sized + 'static,
    T: Won,
    F: Future<Output = Result<T>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let p = Arc::clone(provider);
    tokio::spawn(async move {
        let outcome = attempt.await;
        if let Err(outcome) = tx.send(outcome) {
            if let Ok(t) = &outcome {
                give_back(&*p, &t.won()).await;
            }
            if let Some(undo) = unheard {
                undo(p).await;
            }
        }
    });
    let mut pending = Pending {
        rx: Some(rx),
        provider: Arc::clone(provider),
    };
    let answer = match pending.rx.as_mut() {
        Some(rx) => rx.await,
        None => return Err(LeaseError::protocol("no acquire in flight")),
    };
    pending.rx = None;
    answer.unwrap_or_else(|_| {
        Err(LeaseError::protocol(
            "the acquire task ended without an answer (the runtime is shutting down)",
        ))
    })
}

/// The answer of an attempt not yet taken. Dropped with the caller's
/// future, it closes the channel (so a later answer is given back by the
/// task) and gives back an answer that arrived already: between the task's
/// send and the caller's next poll, a won lease would otherwise sit in the
/// channel, unreleased and unrenewed, until its TTL.
struct Pending<P: LeaseProvider + ?Sized + 'static, T: Won> {
    rx: Option<tokio::sync::oneshot::Receiver<Result<T>>>,
    provider: Arc<P>,
}

impl<P: LeaseProvider + ?Sized + 'static, T: Won> Drop for Pending<P, T> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        rx.close();
        if let Ok(Ok(t)) = rx.try_recv()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let (p, won) = (Arc::clone(&self.provider), t.won());
            runtime.spawn(async move { give_back(&*p, &won).await });
        }
    }
}

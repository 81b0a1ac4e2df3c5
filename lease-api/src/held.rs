//! `HeldLease`: what a held, renewed lease shows its job (the lease as last
//! renewed, its key and token, its lost signal), shared by
//! [`LeaseGuard`](crate::LeaseGuard) and [`SessionLease`](crate::SessionLease).

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{FencingToken, Lease, LeaseKey};

/// Why a held lease (a guard's or a session's) was lost.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The store said this owner no longer holds the key (it expired or was
    /// taken over).
    Revoked,
    /// Renewals kept failing until the lease's local validity ran out; it must be
    /// assumed gone. The text is the last renewal error.
    Expired(String),
    /// The [`LeaseSession`](crate::LeaseSession) holding the lease was closed
    /// or dropped; its leases are released (on close) or run out by their TTL.
    Closed,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LostReason::Revoked => {
                f.write_str("the store says another holder has it or it expired")
            }
            LostReason::Expired(e) => {
                write!(
                    f,
                    "renewal failed until local validity ran out (last error: {e})"
                )
            }
            LostReason::Closed => f.write_str("the lease session was closed"),
        }
    }
}

/// One held lease and its lost signal, as a guard or a session keeps it.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) lease: Mutex<Lease>,
    pub(crate) reason: Mutex<Option<LostReason>>,
    pub(crate) lost: CancellationToken,
    /// When the lost signal fired (the first time).
    pub(crate) lost_at: OnceLock<Instant>,
    /// The last renewal error, for the reason if validity runs out (sessions).
    pub(crate) last_error: Mutex<Option<String>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked while holding it; the
    // data (a lease, a reason) is still consistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub(crate) fn new(lease: Lease) -> Self {
        Shared {
            lease: Mutex::new(lease),
            reason: Mutex::new(None),
            lost: CancellationToken::new(),
            lost_at: OnceLock::new(),
            last_error: Mutex::new(None),
        }
    }

    pub(crate) fn fire(&self, reason: LostReason) {
        lock(&self.reason).get_or_insert(reason);
        self.lost_at.get_or_init(Instant::now);
        self.lost.cancel();
    }

    pub(crate) fn lease(&self) -> Lease {
        lock(&self.lease).clone()
    }

    pub(crate) fn key(&self) -> LeaseKey {
        lock(&self.lease).key().clone()
    }

    pub(crate) fn token(&self) -> FencingToken {
        lock(&self.lease).token()
    }

    pub(crate) async fn lost(&self) -> LostReason {
        self.lost.cancelled().await;
        self.lost_reason()
            .unwrap_or_else(|| LostReason::Expired("unknown".into()))
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        lock(&self.reason).clone()
    }
}

/// A held lease as its renewer keeps it up to date: the lease as last
/// renewed, its key and fencing token, and its lost signal.
///
/// [`LeaseGuard`](crate::LeaseGuard) and [`SessionLease`](crate::SessionLease)
/// both dereference to one, so `guard.token()` and `lease.lost()` read the
/// same way on either; clone it to hand the job a view of the lease that
/// does not own (or release) it.
///
/// ```
/// # async fn demo() -> lease_api::Result<()> {
/// use std::{sync::Arc, time::Duration};
/// use lease_api::{HeldLease, LeaseGuard, LeaseKey, LeaseProvider, MemoryProvider};
///
/// let provider: Arc<dyn LeaseProvider> = Arc::new(MemoryProvider::new());
/// let key = LeaseKey::new("report")?;
/// let lease = provider.try_acquire(&key, Duration::from_secs(10)).await?.into_lease().expect("free");
/// let guard = LeaseGuard::new(provider, lease);
/// let view: HeldLease = (*guard).clone();
/// assert_eq!(view.token(), guard.token());
/// assert!(!view.is_lost());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct HeldLease {
    pub(crate) shared: Arc<Shared>,
}

impl HeldLease {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        HeldLease { shared }
    }

    /// The lease as last renewed.
    pub fn lease(&self) -> Lease {
        self.shared.lease()
    }

    /// The leased key.
    pub fn key(&self) -> LeaseKey {
        self.shared.key()
    }

    /// The fencing token (renewal keeps it).
    pub fn token(&self) -> FencingToken {
        self.shared.token()
    }

    /// Resolves when the lease is lost, with the reason. Select on it next to
    /// the job; it never resolves while the lease is held.
    pub async fn lost(&self) -> LostReason {
        self.shared.lost().await
    }

    /// A token cancelled when the lease is lost, to hand to the job.
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.lost.clone()
    }

    /// True once the lost signal has fired.
    pub fn is_lost(&self) -> bool {
        self.shared.lost.is_cancelled()
    }

    /// Why the lease was lost, once it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason()
    }

    /// When the lost signal fired, once it did. A lease lost by its validity
    /// fires before [`Lease::valid_until`] (C10); a job that was busy sees the
    /// signal later than this, and can log by how much.
    pub fn lost_at(&self) -> Option<Instant> {
        self.shared.lost_at.get().copied()
    }
}

//! What a wrapper of a provider is: a [`Hook`] that
//! [`Layered`](crate::backend::Layered) calls around each store operation
//! ([`Op`]), with what the operation answered ([`Answer`], [`Outcome`]).

use std::future::Future;
use std::time::Duration;

use tracing::Span;

use crate::lease::OwnerId;
use crate::queue::{Place, Ticket};
use crate::{Lease, LeaseError, LeaseInfo, LeaseKey, Result, RwInfo, TryAcquire, TryAcquireAll};

/// One store operation on its way through a [`Layered`](crate::backend::Layered) provider, as its
/// [`Hook`] sees it: which method, with its arguments.
///
/// Besides the provider's own operations, the operations of what the
/// provider hands out go through the hook too: the [`SessionStore`](crate::backend::SessionStore) from
/// [`session_store`](crate::LeaseProvider::session_store) (`Session*`) and the
/// [`WaitQueue`](crate::backend::WaitQueue) from [`wait_queue`](crate::LeaseProvider::wait_queue) (`Queue*`).
/// Methods that only read the provider's settings (`capabilities`,
/// `namespace`, `batch_limit`, ...) are forwarded without a hook call.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Op<'a> {
    /// [`LeaseProvider::try_acquire`](crate::LeaseProvider::try_acquire).
    TryAcquire {
        /// The key to take.
        key: &'a LeaseKey,
        /// The TTL asked for.
        ttl: Duration,
    },
    /// [`LeaseProvider::try_acquire_all`](crate::LeaseProvider::try_acquire_all).
    TryAcquireAll {
        /// The keys to take, all or none.
        keys: &'a [LeaseKey],
        /// The TTL asked for.
        ttl: Duration,
    },
    /// [`LeaseProvider::try_acquire_read`](crate::LeaseProvider::try_acquire_read).
    TryAcquireRead {
        /// The key to read.
        key: &'a LeaseKey,
        /// The TTL asked for.
        ttl: Duration,
    },
    /// [`LeaseProvider::try_acquire_write`](crate::LeaseProvider::try_acquire_write).
    TryAcquireWrite {
        /// The key to write.
        key: &'a LeaseKey,
        /// The TTL asked for.
        ttl: Duration,
        /// The waiting writer's id, if it waits.
        waiting: Option<OwnerId>,
    },
    /// [`LeaseProvider::withdraw_writer`](crate::LeaseProvider::withdraw_writer).
    WithdrawWriter {
        /// The key waited for.
        key: &'a LeaseKey,
        /// The writer that gave up.
        waiting: OwnerId,
    },
    /// [`LeaseProvider::inspect_rw`](crate::LeaseProvider::inspect_rw).
    InspectRw {
        /// The key looked at.
        key: &'a LeaseKey,
    },
    /// [`LeaseProvider::watch_rw`](crate::LeaseProvider::watch_rw).
    WatchRw {
        /// The key to watch.
        key: &'a LeaseKey,
    },
    /// [`LeaseProvider::extend`](crate::LeaseProvider::extend).
    Extend {
        /// The lease to extend.
        lease: &'a Lease,
        /// The TTL asked for.
        ttl: Duration,
    },
    /// [`LeaseProvider::release`](crate::LeaseProvider::release).
    Release {
        /// The lease to release.
        lease: &'a Lease,
    },
    /// [`LeaseProvider::inspect`](crate::LeaseProvider::inspect).
    Inspect {
        /// The key looked at.
        key: &'a LeaseKey,
    },
    /// [`LeaseProvider::watch`](crate::LeaseProvider::watch).
    Watch {
        /// The key to watch.
        key: &'a LeaseKey,
    },
    /// [`LeaseProvider::extend_many`](crate::LeaseProvider::extend_many).
    ExtendMany {
        /// The leases to extend, each by its own TTL.
        leases: &'a [Lease],
    },
    /// [`LeaseProvider::session_store`](crate::LeaseProvider::session_store).
    SessionStore {
        /// The session's TTL.
        ttl: Duration,
    },
    /// [`LeaseProvider::flush`](crate::LeaseProvider::flush). It cannot fail, so it is never offered to
    /// [`Hook::before`]; [`Hook::after`] sees it.
    Flush {
        /// How long to wait at most.
        limit: Duration,
    },
    /// [`SessionStore::try_acquire`](crate::backend::SessionStore::try_acquire) of a session store the provider handed out.
    SessionTryAcquire {
        /// The key to take.
        key: &'a LeaseKey,
        /// The TTL asked for.
        ttl: Duration,
    },
    /// [`SessionStore::renew`](crate::backend::SessionStore::renew).
    SessionRenew {
        /// The session's leases to renew.
        leases: &'a [Lease],
    },
    /// [`SessionStore::release`](crate::backend::SessionStore::release).
    SessionRelease {
        /// The lease to release.
        lease: &'a Lease,
    },
    /// [`SessionStore::close`](crate::backend::SessionStore::close). It cannot fail, so it is never offered to
    /// [`Hook::before`]; [`Hook::after`] sees it.
    SessionClose,
    /// [`SessionStore::abandon`](crate::backend::SessionStore::abandon). It cannot fail, so it is never offered to
    /// [`Hook::before`]; [`Hook::after`] sees it.
    SessionAbandon,
    /// [`WaitQueue::join`](crate::backend::WaitQueue::join) of the queue of waiters the provider handed out.
    QueueJoin {
        /// The key to queue for.
        key: &'a LeaseKey,
        /// The ticket's TTL.
        ttl: Duration,
        /// The join's mark.
        mark: u64,
    },
    /// [`WaitQueue::place`](crate::backend::WaitQueue::place).
    QueuePlace {
        /// The ticket looked at.
        ticket: &'a Ticket,
    },
    /// [`WaitQueue::watch_ticket`](crate::backend::WaitQueue::watch_ticket).
    QueueWatchTicket {
        /// The ticket ahead, to watch.
        ahead: &'a Ticket,
    },
    /// [`WaitQueue::refresh`](crate::backend::WaitQueue::refresh).
    QueueRefresh {
        /// The ticket to refresh.
        ticket: &'a Ticket,
        /// Its new TTL.
        ttl: Duration,
    },
    /// [`WaitQueue::leave`](crate::backend::WaitQueue::leave).
    QueueLeave {
        /// The ticket to remove.
        ticket: &'a Ticket,
    },
}

impl Op<'_> {
    /// The operation's method, as `try_acquire`, `session.renew` or
    /// `queue.join`.
    pub fn name(&self) -> &'static str {
        match self {
            Op::TryAcquire { .. } => "try_acquire",
            Op::TryAcquireAll { .. } => "try_acquire_all",
            Op::TryAcquireRead { .. } => "try_acquire_read",
            Op::TryAcquireWrite { .. } => "try_acquire_write",
            Op::WithdrawWriter { .. } => "withdraw_writer",
            Op::InspectRw { .. } => "inspect_rw",
            Op::WatchRw { .. } => "watch_rw",
            Op::Extend { .. } => "extend",
            Op::Release { .. } => "release",
            Op::Inspect { .. } => "inspect",
            Op::Watch { .. } => "watch",
            Op::ExtendMany { .. } => "extend_many",
            Op::SessionStore { .. } => "session_store",
            Op::Flush { .. } => "flush",
            Op::SessionTryAcquire { .. } => "session.try_acquire",
            Op::SessionRenew { .. } => "session.renew",
            Op::SessionRelease { .. } => "session.release",
            Op::SessionClose => "session.close",
            Op::SessionAbandon => "session.abandon",
            Op::QueueJoin { .. } => "queue.join",
            Op::QueuePlace { .. } => "queue.place",
            Op::QueueWatchTicket { .. } => "queue.watch_ticket",
            Op::QueueRefresh { .. } => "queue.refresh",
            Op::QueueLeave { .. } => "queue.leave",
        }
    }
}

/// What an operation that succeeded answered, as [`Hook::after`] sees it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Answer<'a> {
    /// The answer of a `try_acquire` (the provider's or a session store's).
    TryAcquire(&'a TryAcquire),
    /// The answer of a `try_acquire_all`.
    TryAcquireAll(&'a TryAcquireAll),
    /// The answer of an `inspect_rw`.
    RwHolders(&'a RwInfo),
    /// The lease an `extend` returned.
    Extended(&'a Lease),
    /// One answer per lease, in order: `extend_many` or a session's `renew`.
    PerLease(&'a [Result<Lease>]),
    /// The holder an `inspect` found, `None` for a free key.
    Holder(Option<&'a LeaseInfo>),
    /// Whether `session_store` returned a session store.
    SessionStore(bool),
    /// The ticket a queue's `join` made.
    Ticket(&'a Ticket),
    /// Where a queue's `place` found the ticket.
    Place(&'a Place),
    /// Whether a queue's `refresh` found the ticket still there.
    Refreshed(bool),
    /// Nothing to look at: `release`, `watch`, `flush`, a session's
    /// `release`, `close` and `abandon`, a queue's `watch_ticket` and `leave`.
    Done,
}

/// How an operation ended, as [`Hook::after`] sees it: its answer, or its
/// error.
pub type Outcome<'a> = std::result::Result<Answer<'a>, &'a LeaseError>;

/// What a [`Layered`](crate::backend::Layered) provider does around each store operation.
///
/// Every method has a default that does nothing, so a hook implements only
/// what it cares about and forwards the rest unchanged. For each operation,
/// in order: [`before`](Self::before) may refuse it, [`span`](Self::span)
/// names the tracing span the inner call runs in, the inner provider runs it,
/// and [`after`](Self::after) sees its outcome and how long it took. An
/// operation `before` refused never reaches the inner provider, and `after`
/// does not see it.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::time::Duration;
/// use lease_api::backend::{Hook, Layered, Op, Outcome};
/// use lease_api::{LeaseKey, LeaseProvider, MemoryProvider};
///
/// /// Counts the tries that reached the store.
/// #[derive(Default)]
/// struct Tries(AtomicU64);
///
/// impl Hook for Tries {
///     fn after(&self, op: &Op<'_>, _: Outcome<'_>, _: Duration, _: &tracing::Span) {
///         if let Op::TryAcquire { .. } = op {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lease_api::Result<()> {
/// let counted = Arc::new(Layered::with_hook(Arc::new(MemoryProvider::new()), Tries::default()));
/// let provider: Arc<dyn LeaseProvider> = counted.clone();
/// provider.try_acquire(&LeaseKey::new("k")?, Duration::from_secs(5)).await?;
/// assert_eq!(counted.hook().0.load(Ordering::Relaxed), 1);
/// # Ok(()) }
/// ```
pub trait Hook: Send + Sync + 'static {
    /// Called before `op` reaches the inner provider: an error is the
    /// operation's answer, and the inner provider is not called. Operations
    /// that cannot fail ([`Op::Flush`], [`Op::SessionClose`],
    /// [`Op::SessionAbandon`]) are not offered. Default: let it through.
    ///
    /// Implement it as an `async fn before(&self, op: &Op<'_>) -> Result<()>`;
    /// it may wait, to play a slow or frozen link.
    ///
    /// # Errors
    /// The error to answer `op` with instead of calling the store.
    fn before(&self, op: &Op<'_>) -> impl Future<Output = Result<()>> + Send {
        let _ = op;
        std::future::ready(Ok(()))
    }

    /// The tracing span the inner call of `op` runs in; it is handed to
    /// [`after`](Self::after) too. Default: [`Span::none`], the caller's
    /// span stays current.
    fn span(&self, op: &Op<'_>) -> Span {
        let _ = op;
        Span::none()
    }

    /// Called once the inner provider answered `op`, with the outcome, the
    /// time the inner call took, and the span from [`span`](Self::span).
    /// Default: nothing.
    fn after(&self, op: &Op<'_>, outcome: Outcome<'_>, elapsed: Duration, span: &Span) {
        let _ = (op, outcome, elapsed, span);
    }
}

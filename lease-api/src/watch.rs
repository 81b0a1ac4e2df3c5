//! Watches: how a waiter hears that a key (or the ticket ahead) may have
//! changed. A leaf module: the provider trait, the waiting loops and the
//! queue of waiters all build on it.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

/// A registered interest in one key, returned by [`LeaseProvider::watch`](crate::LeaseProvider::watch).
#[async_trait]
pub trait KeyWatch: Send {
    /// Resolves when the key may have changed, or when `max` has passed, which
    /// ever is first. Spurious wake-ups are allowed: callers retry `try_acquire`.
    async fn changed(&mut self, max: Duration);
}

/// The default watch: no notifications, sleeps for the whole allowance.
#[derive(Debug)]
pub struct SleepWatch;

#[async_trait]
impl KeyWatch for SleepWatch {
    async fn changed(&mut self, max: Duration) {
        tokio::time::sleep(max).await;
    }
}
/// A watch woken by a [`Notify`]: backends keep one `Notify` per watched key and
/// call `notify_waiters` when a notification for that key arrives (or when their
/// notification channel breaks, so waiters retry instead of missing a release).
///
/// The watch registers itself at construction, so a `notify_waiters` between
/// [`NotifyWatch::new`] and [`KeyWatch::changed`] is not lost.
pub struct NotifyWatch {
    notify: Arc<Notify>,
    pending: Pin<Box<OwnedNotified>>,
}

impl fmt::Debug for NotifyWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NotifyWatch").finish_non_exhaustive()
    }
}

impl NotifyWatch {
    /// Registers interest in `notify` now.
    pub fn new(notify: Arc<Notify>) -> Self {
        let mut pending = Box::pin(Arc::clone(&notify).notified_owned());
        pending.as_mut().enable();
        NotifyWatch { notify, pending }
    }
}

#[async_trait]
impl KeyWatch for NotifyWatch {
    async fn changed(&mut self, max: Duration) {
        if tokio::time::timeout(max, self.pending.as_mut())
            .await
            .is_ok()
        {
            let mut next = Box::pin(Arc::clone(&self.notify).notified_owned());
            next.as_mut().enable();
            self.pending = next;
        }
    }
}

/// The longest a waiter sleeps between attempts when the store did not say how
/// long the holder's lease runs: a safety net for a lost notification, not a poll.
pub const MAX_BLIND_WAIT: Duration = Duration::from_secs(5);

/// A watch that wakes at once: what [`WaitQueue::watch_ticket`](crate::queue::WaitQueue::watch_ticket)
/// returns for a ticket that is gone already.
#[derive(Debug)]
pub struct ReadyWatch;

#[async_trait]
impl KeyWatch for ReadyWatch {
    async fn changed(&mut self, _max: Duration) {}
}

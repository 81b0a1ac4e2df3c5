//! `WatchHub`: the waiters of a provider, by key, for backends with notifications.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::Notify;

use crate::watch::NotifyWatch;

/// The waiters of one provider, by key.
///
/// A backend with store notifications keeps one hub: [`watch`](Self::watch)
/// registers a waiter, and the task that receives the store's notifications calls
/// [`wake`](Self::wake) with the key named in each, or [`wake_all`](Self::wake_all)
/// when its notification channel broke and some may have been missed. Waiters of
/// one key share one [`Notify`]; entries of keys nobody waits for are dropped.
#[derive(Debug, Default)]
pub struct WatchHub {
    waiters: Mutex<HashMap<String, Weak<Notify>>>,
}

impl WatchHub {
    /// An empty hub.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Weak<Notify>>> {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A watch on `key`, registered now (a wake after this call is not missed).
    pub fn watch(&self, key: &str) -> NotifyWatch {
        NotifyWatch::new(self.notify_for(key))
    }

    fn notify_for(&self, key: &str) -> Arc<Notify> {
        let mut map = self.lock();
        if let Some(n) = map.get(key).and_then(Weak::upgrade) {
            return n;
        }
        if map.len() >= 64 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let n = Arc::new(Notify::new());
        map.insert(key.to_owned(), Arc::downgrade(&n));
        n
    }

    /// Wakes the waiters of `key`.
    pub fn wake(&self, key: &str) {
        let n = self.lock().get(key).and_then(Weak::upgrade);
        if let Some(n) = n {
            n.notify_waiters();
        }
    }

    /// Wakes every waiter, so they try again.
    pub fn wake_all(&self) {
        let all: Vec<_> = self.lock().values().filter_map(Weak::upgrade).collect();
        for n in all {
            n.notify_waiters();
        }
    }

    /// How many keys have live waiters (for tests and metrics).
    pub fn len(&self) -> usize {
        self.lock()
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    /// True if nobody waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::watch::KeyWatch;

    #[tokio::test(start_paused = true)]
    async fn wakes_only_the_named_key_and_forgets_dropped_waiters() {
        let hub = WatchHub::new();
        let mut a = hub.watch("a");
        let mut b = hub.watch("b");
        hub.wake("a");
        let started = tokio::time::Instant::now();
        a.changed(Duration::from_secs(10)).await;
        assert!(started.elapsed() < Duration::from_millis(1));
        b.changed(Duration::from_secs(10)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        drop((a, b));
        assert!(hub.is_empty());
    }
}
